"""The chaos harness (``python -m project.chaos``, ``make chaos``) on a small scale: it starts its
own stack (Redis, a database, the fake provider, Daphne, two Celery workers, beat), SIGKILLs a
worker mid-load, checks every promise and cleans up after itself. The 100-run figures are in
the README; this proves the command works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[1]


def _databases(server_url: str) -> set[str]:
    with psycopg.connect(server_url, autocommit=True, connect_timeout=5) as conn:
        return {name for (name,) in conn.execute("SELECT datname FROM pg_database").fetchall()}


def test_a_small_chaos_run_holds_every_promise_and_cleans_up() -> None:
    server = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    before = _databases(server)
    done = subprocess.run(
        [
            sys.executable, "-m", "project.chaos", "--runs", "8", "--kills", "1", "--kill-every", "1",
            "--event-delay", "0.02", "--redis-restarts", "0", "--pg-every", "0", "--tool-block", "0",
            "--seed", "8", "--timeout", "60",
            "--database-url", server,
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert "1 worker SIGKILLs" in report, report
    for check in (
        "every run terminal: 8/8 held",
        "client's reconstruction == committed messages",
        "no two attempts of a run streaming at once: 8/8 held",
        "no tool executed twice",
        "no text billed twice: 8/8 held",
        "no checkpoint left in Redis: 1/1 held",
    ):
        assert f"PASS  {check}" in report, report
    # other jobs may create or drop databases on the same server meanwhile (another suite's chaos
    # test among them): look only at this harness's, named after the database of its URL
    own = f"{(urlsplit(server).path.lstrip('/') or 'postgres').replace('-', '_')}_chaos_"
    left = {name for name in _databases(server) - before if name.startswith(own)}
    assert not left, f"the harness's database was not dropped: {left}"
    assert "logs kept" not in report  # all held: the working directory is gone too
