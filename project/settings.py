"""Demo project settings: embedded with no environment, distributed when told where the services are.

- Nothing set: SQLite under ``db/``, the in-process channel layer, runs executed in-process,
  checkpoints in the database. Nothing to install but Python.
- ``DATABASE_URL``: that database (PostgreSQL for more than one machine).
- ``REDIS_URL``: Redis for the channel layer (pub/sub), Celery's broker and results, and
  checkpoints; runs execute on Celery workers. Both set: the distributed mode.
- ``CELERY_QUEUE``: the broker queue this deployment's runs go through (default ``celery``), so
  two deployments sharing one Redis database never take each other's runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url
import structlog

from streamrecover.redaction import redact_processor

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-insecure-secret-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")

INSTALLED_APPS = [
    "daphne",
    "channels",
    "django_structlog",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "streamrecover",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_structlog.middlewares.RequestMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
else:
    (BASE_DIR / "db").mkdir(exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(BASE_DIR / "db" / "streamrecover.sqlite3"),
            # Runs write from their threads while requests read and write: every transaction takes
            # the write lock when it begins (IMMEDIATE) and waits for it up to `timeout` seconds.
            # SQLite's default (DEFERRED) upgrades a read to a write mid-transaction and fails at
            # once with "database is locked" when another connection writes (streamrecover.W009).
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: channel layer, Celery, checkpoints ----------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL")
DISTRIBUTED = bool(REDIS_URL)

if DISTRIBUTED:
    CHANNEL_LAYERS = {
        "default": {
            # Pub/sub: ~5x the throughput of the core layer at sub-millisecond latency.
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery, read by project/celery.py under the CELERY_ namespace. A run's task returns once the
# run is claimed (its stream goes on on the worker's event loop, streamrecover.runs.holder), so
# it is acknowledged then and redelivered if the worker dies before the claim; a worker that
# dies later leaves its run to the sweeper below (its heartbeat stops).
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "celery")
# No result backend: the app's tasks store no result (a run's outcome is its row), and with the
# threads pool Celery builds a backend per worker thread on its first task (a few ms each, and a
# Redis connection each for a Redis backend), all of it in the burst when many runs start.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 2 * 3600}
CELERY_TASK_TIME_LIMIT = 3600
CELERY_TASK_SOFT_TIME_LIMIT = 3600 - 60
CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # logging is configured below, by structlog
# The sweeper re-queues runs whose worker died (heartbeat older than STALE_AFTER_SECONDS):
# a dead host's run resumes within seconds instead of after the visibility timeout.
CELERY_BEAT_SCHEDULE = {
    "streamrecover-sweep-stale-runs": {"task": "streamrecover.sweep_stale_runs", "schedule": 5.0},
    # Workers fold their finished runs into the analytics rollup; this folds whatever is left.
    "streamrecover-fold-analytics": {"task": "streamrecover.fold_analytics", "schedule": 60.0},
}

STREAMRECOVER: dict[str, Any] = {
    "CHECKPOINT_STORE": "redis" if DISTRIBUTED else "orm",
    "EXECUTION": "celery" if DISTRIBUTED else "inprocess",
    "REDIS_URL": REDIS_URL or "redis://127.0.0.1:6379/0",
    # the healing endpoint (/streamrecover/proxy/) answers from the built-in fake in the demo
    "PROXY_ANTHROPIC_PROVIDER": "fake",
    "PROXY_OPENAI_PROVIDER": "fake",
    "PROXY_RESPONSES_PROVIDER": "fake-responses",
    "PROXY_GEMINI_PROVIDER": "fake-gemini",
    "PROVIDERS": {
        "fake-responses": {"ADAPTER": "openai-responses", "BASE_URL": "fake://streamrecover"},
        "fake-gemini": {"ADAPTER": "gemini", "BASE_URL": "fake://streamrecover"},
    },
}

# --- Auth, i18n, static -------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "admin:login"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# --- Logging: structlog through django-structlog, secrets scrubbed before rendering ---------
DJANGO_STRUCTLOG_CELERY_ENABLED = True
LOG_FORMAT = os.environ.get("LOG_FORMAT", "console" if DEBUG else "json")
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")

_pre_chain = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.add_log_level,
    structlog.stdlib.ExtraAdder(),
    structlog.processors.TimeStamper(fmt="iso"),
]

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # redact_processor runs in the formatter, so stdlib records (httpx, Django) are scrubbed too.
        "json": {
            "()": structlog.stdlib.ProcessorFormatter,
            "processors": [
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                redact_processor,
                structlog.processors.JSONRenderer(),
            ],
            "foreign_pre_chain": _pre_chain,
        },
        # format_exc_info first here too: left to ConsoleRenderer, a traceback (and a key in its
        # exception's message) would be rendered after redaction, as it was raised.
        "console": {
            "()": structlog.stdlib.ProcessorFormatter,
            "processors": [
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                redact_processor,
                structlog.dev.ConsoleRenderer(),
            ],
            "foreign_pre_chain": _pre_chain,
        },
    },
    "handlers": {
        "default": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT},
    },
    "root": {"handlers": ["default"], "level": "WARNING"},
    "loggers": {
        # Django's own "console" handler (DEBUG only) would print django.request tracebacks raw,
        # next to the scrubbed copy: without handlers, its records reach only "default".
        "django": {"handlers": [], "level": "INFO"},
        "django_structlog": {"level": LOG_LEVEL},
        "streamrecover": {"level": LOG_LEVEL},
        "project": {"level": LOG_LEVEL},
    },
}

structlog.configure(
    processors=[
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.filter_by_level,
        structlog.processors.TimeStamper(fmt="iso"),
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.UnicodeDecoder(),
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=True,
)
