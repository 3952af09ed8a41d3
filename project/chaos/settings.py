"""Settings of every process the chaos harness starts (Daphne, workers, beat) and of the harness itself.

The demo's distributed settings (``DATABASE_URL`` and ``REDIS_URL`` name the harness's own
database and Redis) with short timings, so a killed worker's run is swept and resumed
within seconds, and two providers that point at the fake provider's own process (both
wire formats). ``CHAOS_ROLE`` names the process in PostgreSQL's ``application_name``: the
harness terminates every backend of its database but its own.
"""

from __future__ import annotations

import faulthandler
import os
import signal

from project.settings import *  # noqa: F403
from project.settings import DATABASES, STREAMRECOVER

from .tool import install_recording_tool

ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
if os.environ.get("CHAOS_ROLE") == "daphne":
    # Django under ASGI runs each request's sync code in a thread of its own: persistent
    # connections would pile up one per request thread (Django's docs: disable them under ASGI).
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = f"chaos-{os.environ.get('CHAOS_ROLE', 'stack')}"

_FAKE_URL = os.environ.get("CHAOS_FAKE_URL", "http://127.0.0.1:9")

STREAMRECOVER = {
    **STREAMRECOVER,
    "PROVIDERS": {
        "fake": {"ADAPTER": "anthropic", "BASE_URL": _FAKE_URL, "API_KEY": "sk-chaos-not-a-real-key-0000"},
        "fake-openai": {"ADAPTER": "openai", "BASE_URL": f"{_FAKE_URL}/v1", "API_KEY": "sk-chaos-not-a-real-key-0000"},
    },
    "DEFAULT_PROVIDER": "fake",
    # The chaos load does not go through the healing endpoint; its Responses and Gemini providers
    # are the default ones.
    "PROXY_RESPONSES_PROVIDER": "openai-responses",
    "PROXY_GEMINI_PROVIDER": "gemini",
    # Short everything: the backoff (1, 2, 4... s scaled to 20, 40, 80... ms), a stall is an
    # interruption after 2 s, a worker that stops beating for 2 s is swept.
    "BACKOFF_SCALE": 0.02,
    "REQUEST_RETRY_BASE": 0.02,
    "IDLE_TIMEOUT": 2,
    "CONNECT_TIMEOUT": 3,
    "HEARTBEAT_SECONDS": 0.5,
    "STALE_AFTER_SECONDS": 2,
    "QUEUED_STALE_AFTER_SECONDS": 8,
    "CHECKPOINT_EVERY_DELTAS": 8,
    "CHECKPOINT_EVERY_SECONDS": 0.2,
    # A client whose frames a Redis restart lost is caught up within two seconds.
    "LIVE_CHECK_SECONDS": 1,
    # The runs each worker process (each prefork child) streams at once (--runs-per-process).
    "WORKER_MAX_RUNS": int(os.environ.get("CHAOS_WORKER_MAX_RUNS", "2")),
}

CELERY_BEAT_SCHEDULE = {
    "streamrecover-sweep-stale-runs": {"task": "streamrecover.sweep_stale_runs", "schedule": 1.0},
}
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 280
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# `kill -USR1 <pid>` prints every thread's stack to the process's log: what a stuck process waits on.
faulthandler.register(signal.SIGUSR1, all_threads=True)

install_recording_tool(os.environ.get("CHAOS_TOOL_LOG"), float(os.environ.get("CHAOS_TOOL_BLOCK", "0")))
