"""The suite's own guards: what runs without services, what refuses to, what says it was skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEAD = {"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nothing", "REDIS_URL": "redis://127.0.0.1:1/0"}


def _pytest(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_engine_tests_run_with_no_database_and_no_redis() -> None:
    done = _pytest("tests/test_plan.py", "tests/test_engine_context.py", **DEAD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout


def test_a_database_test_stops_the_session_and_names_what_is_missing() -> None:
    done = _pytest("tests/test_models.py", **DEAD)
    assert done.returncode == 1
    assert "PostgreSQL is not reachable at 127.0.0.1:1" in done.stdout + done.stderr
    assert "pg_ctlcluster" in done.stdout + done.stderr  # how to start it
    assert " passed" not in done.stdout


def test_without_the_recorded_streams_the_tests_say_they_did_not_run(tmp_path: Path) -> None:
    done = _pytest("tests/test_sse.py", STREAMRECOVER_STREAMS_DIR=str(tmp_path / "absent"), **DEAD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tests that need the recorded provider streams did not run" in done.stdout
    assert str(tmp_path / "absent") in done.stdout
