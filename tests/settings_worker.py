"""Settings of the real Celery worker processes the execution tests start.

The same services as the test process (the pytest-django test database, whose name the
test passes in, Redis for broker, checkpoints and channel layer); the built-in provider
"fake" points at the fake server the test runs, so the test reads its billing log.
"""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, REDIS_URL, STREAMRECOVER

DATABASES["default"]["NAME"] = os.environ["STREAMRECOVER_TEST_DB_NAME"]

STREAMRECOVER = {
    **{key: value for key, value in STREAMRECOVER.items() if key != "GC_THRESHOLD"},  # a worker's default
    "PROVIDERS": {
        "fake": {
            "ADAPTER": "anthropic",
            "BASE_URL": os.environ["STREAMRECOVER_FAKE_URL"],
            "API_KEY": "sk-fake-worker-key",
        },
        # the Responses dialect with native resume (background responses re-attached)
        "fake-responses": {
            "ADAPTER": "openai-responses",
            "BASE_URL": os.environ["STREAMRECOVER_FAKE_URL"] + "/v1",
            "API_KEY": "sk-fake-worker-key",
            "NATIVE_RESUME": True,
        },
    },
    "CHECKPOINT_STORE": "redis",
    "EXECUTION": "celery",
    "REDIS_URL": REDIS_URL,
    "CHECKPOINT_EVERY_DELTAS": 8,
    "CHECKPOINT_EVERY_SECONDS": 0.2,
    "HEARTBEAT_SECONDS": 0.5,
    "STALE_AFTER_SECONDS": 2,
    "WORKER_MAX_RUNS": int(os.environ.get("STREAMRECOVER_WORKER_MAX_RUNS", "100")),
}

if "STREAMRECOVER_WORKER_FULL_WAIT_SECONDS" in os.environ:  # "none": as long as it takes
    _full_wait = os.environ["STREAMRECOVER_WORKER_FULL_WAIT_SECONDS"]
    STREAMRECOVER["WORKER_FULL_WAIT_SECONDS"] = None if _full_wait == "none" else float(_full_wait)
