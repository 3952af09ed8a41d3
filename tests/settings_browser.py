"""The demo project in embedded mode for the browser tests' Daphne subprocess.

Exactly what ``make demo`` runs (in-memory channel layer, runs executed in threads of the
Daphne process, the fake provider) but on a throwaway SQLite file named by
``STREAMRECOVER_BROWSER_DB``, whatever ``DATABASE_URL``/``REDIS_URL`` say, and with short
backoffs so a recovery takes a fraction of a second (``STREAMRECOVER_BROWSER_BACKOFF_SCALE`` makes
them long, for a test that acts during one).
"""

from __future__ import annotations

import os

from project.settings import *  # noqa: F403

DEBUG = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["STREAMRECOVER_BROWSER_DB"],
        # as the demo's own: a run's writes and a request's (the demo's session keeps the chosen
        # fault scenario) wait for each other instead of failing with "database is locked"
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    }
}
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
STREAMRECOVER = {
    "EXECUTION": "inprocess",
    "CHECKPOINT_STORE": "orm",
    "BACKOFF_SCALE": float(os.environ.get("STREAMRECOVER_BROWSER_BACKOFF_SCALE", "0.25")),
    "IDLE_TIMEOUT": 10,
}
CELERY_BROKER_URL = "memory://"
CELERY_RESULT_BACKEND = "cache+memory://"
