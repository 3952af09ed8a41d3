"""The demo project's embedded mode (SQLite, runs in threads, ORM checkpoints) on a SQLite file
of the test's own: ``tests/sqlite_concurrency.py`` runs in a subprocess with these settings,
so the SQLite options under test are exactly ``project/settings.py``'s."""

from __future__ import annotations

import os

if os.environ.get("DATABASE_URL") or os.environ.get("REDIS_URL"):
    raise RuntimeError("tests.settings_sqlite is the embedded mode: unset DATABASE_URL and REDIS_URL")

from project.settings import *  # noqa: F403
from project.settings import DATABASES

DATABASES["default"]["NAME"] = os.environ["STREAMRECOVER_SQLITE_PATH"]
