"""Test settings: the real services (PostgreSQL and Redis), as in the distributed mode.

``DATABASE_URL`` and ``REDIS_URL`` override the local defaults; pytest-django creates
``test_<name>`` beside the configured database. ``tests/conftest.py`` fails the session
with the start command when a service is down.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL)}
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")

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
    "django_structlog.middlewares.RequestMiddleware",
]

ROOT_URLCONF = "project.urls"
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

STATIC_URL = "static/"
# The suite runs runs in-process with DEBUG = False on purpose (fast, one process per test):
# streamrecover.W007 says a deployment should not, and tests/test_checks.py pins it.
SILENCED_SYSTEM_CHECKS = ["streamrecover.W007"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast user factories

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    },
}

# Celery as the demo configures it for long streams (the checks pass on these values).
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_ALWAYS_EAGER = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_TIME_LIMIT = 1800
DJANGO_STRUCTLOG_CELERY_ENABLED = True

STREAMRECOVER = {
    "GC_THRESHOLD": None,  # the test process's collector is left as it is
    "BACKOFF_SCALE": 0.001,
    "REQUEST_RETRY_BASE": 0.001,
    "IDLE_TIMEOUT": 5,
    "CHECKPOINT_STORE": "orm",
    "EXECUTION": "inprocess",
    "REDIS_URL": REDIS_URL,
    "HEARTBEAT_SECONDS": 1,
    "STALE_AFTER_SECONDS": 5,
}
