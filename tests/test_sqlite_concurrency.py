"""Concurrent runs on the embedded SQLite database complete: no "database is locked" (issue 10).

SQLite's default transactions (DEFERRED) begin as readers; one that then writes while another
connection writes fails at once instead of waiting for the busy timeout. The demo project's
embedded settings begin every transaction IMMEDIATE. The runs execute in a subprocess with
``tests.settings_sqlite`` (the demo's SQLite options on a file of this test's own), since the
suite's own database is PostgreSQL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENTS, TURNS = 3, 12


def test_concurrent_runs_in_one_process_on_sqlite_all_complete(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings_sqlite",
        STREAMRECOVER_SQLITE_PATH=str(tmp_path / "embedded.sqlite3"),
        LOG_FORMAT="json",
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.sqlite_concurrency", str(CLIENTS), str(TURNS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["client_errors"] == []
    assert report["escaped"] == []
    assert report["stuck"] == []
    statuses = [status for status, _ in report["runs"].values()]
    assert statuses == ["completed"] * (CLIENTS * TURNS), report["runs"]
    assert "database is locked" not in done.stderr
    assert "streamrecover.W009" not in report["checks"]  # the demo's SQLite options pass the check
