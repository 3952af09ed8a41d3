"""The demo's lock on its SQLite database (``<database>.demo-lock``), held by each demo process that executes runs."""

from __future__ import annotations

import fcntl
import threading
from typing import IO

from django.conf import settings

# Open for the process's life: a lock lasts as long as its file stays open.
_HELD: list[IO[str]] = []


def _path() -> str | None:
    """The lock file of this database; None where it is not one SQLite file of this machine."""
    database = settings.DATABASES["default"]
    name = str(database.get("NAME") or "")
    if database["ENGINE"] != "django.db.backends.sqlite3" or not name or name.startswith(("file:", ":memory:")):
        return None
    return f"{name}.demo-lock"


def hold(*, alone: bool) -> bool:
    """Hold this database's demo lock until the process exits, so that a demo server starting
    meanwhile knows runs execute here. With ``alone``, exclusively when no other demo process holds
    it: True then (every run in the database is one nobody executes). Otherwise, and when that
    fails, shared (a demo server, a ``make demo-cli`` run beside others); False."""
    path = _path()
    if path is None:
        return False
    lock = open(path, "a")  # noqa: SIM115 (held open: see _HELD)
    _HELD.append(lock)
    if alone:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            pass
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        # A demo server alone holds it exclusively: shared once that server exits, so that a
        # server started after it still sees this process (this one goes on meanwhile).
        threading.Thread(target=fcntl.flock, args=(lock, fcntl.LOCK_SH), name="demo-lock", daemon=True).start()
    return False
