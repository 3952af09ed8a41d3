"""``make demo`` (scripts/demo.sh): on a port something else holds, and after a server stopped mid-answer."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

from .e2e_helpers import Service, base_env, free_port, manage, wait_for_http

REPO = Path(__file__).resolve().parent.parent


def test_make_demo_on_a_port_in_use_says_so_and_fails_instead_of_printing_the_other_servers_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "DEMO_PORT": str(port), "DEMO_HOST": "127.0.0.1"}
        done = subprocess.run(
            ["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode != 0
    assert f"127.0.0.1:{port} is in use" in done.stderr
    assert f"DEMO_PORT={port + 1} make demo" in done.stderr
    assert "demo chat:" not in done.stdout  # no address that would lead to the other server


def test_make_demo_fails_naming_the_port_when_the_server_cannot_listen_although_the_check_found_it_free(
    tmp_path: Path,
) -> None:
    """The script's check connects to the port; a port taken after it (another demo started meanwhile)
    or held without answering passes it. Daphne then logged its listen failure and exited 0: the
    command "succeeded", having served nothing after printing the demo's address."""
    env = {
        **base_env(
            DJANGO_SETTINGS_MODULE="tests.settings_browser", STREAMRECOVER_BROWSER_DB=str(tmp_path / "d.sqlite3")
        ),
        "DEMO_HOST": "127.0.0.1",
        "DEMO_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
    }
    with socket.socket() as held:  # bound, not listening: connecting is refused, binding is not allowed
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        demo = subprocess.Popen(
            ["bash", "scripts/demo.sh"],
            cwd=REPO,
            env={**env, "DEMO_PORT": str(port)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its process group: whatever it started and left behind
        )
        try:
            out, err = demo.communicate(timeout=90)
        finally:
            left = _alive(demo.pid)
            if left:
                os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(timeout=10)
    assert demo.returncode == 1, out + err
    assert f"make demo: 127.0.0.1:{port} is in use" in err
    assert f"DEMO_PORT={port + 1} make demo" in err
    assert not left, "make demo left a process running"


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


LEFT_RUNNING = """
from django.contrib.auth import get_user_model
from django.utils import timezone
from streamrecover.models import Run
from streamrecover.runs import lifecycle
demo = get_user_model().objects.get(username="demo")
run = lifecycle.create_run(prompt="Cut off by a restart [[words=40]]", owner=demo)
Run.objects.filter(pk=run.pk).update(status="running", worker="the stopped server", heartbeat_at=timezone.now())
print(run.pk)
"""


def test_make_demo_finishes_the_runs_the_last_server_left_mid_answer(tmp_path: Path) -> None:
    """Stopped mid-answer and started again, the demo showed that run "running" for ever: its thread
    died with the server and nothing else executes runs in the embedded mode."""
    port = free_port()
    env = {
        **base_env(
            DJANGO_SETTINGS_MODULE="tests.settings_browser", STREAMRECOVER_BROWSER_DB=str(tmp_path / "d.sqlite3")
        ),
        "DEMO_PORT": str(port),
        "DEMO_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
    }
    manage("migrate", "--verbosity", "0", env=env)
    manage("streamrecover_demo_user", env=env)
    made = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", LEFT_RUNNING], cwd=REPO, env=env, capture_output=True, text=True
    )
    run_id = made.stdout.strip().splitlines()[-1]
    demo = Service("make demo", ["bash", "scripts/demo.sh"], env, tmp_path / "demo.log")
    try:
        wait_for_http(f"http://127.0.0.1:{port}/streamrecover/login/", demo)  # the sweep ran before the server
    finally:
        demo.stop()
    with sqlite3.connect(tmp_path / "d.sqlite3") as db:
        (status,) = db.execute(
            "SELECT status FROM streamrecover_run WHERE id = ?", (run_id.replace("-", ""),)
        ).fetchone()
        roles = [r for (r,) in db.execute("SELECT role FROM streamrecover_message ORDER BY position")]
    assert status == "completed", (tmp_path / "demo.log").read_text()
    assert roles == ["user", "assistant"]
    assert (tmp_path / "demo.log").read_text().count(f"{run_id}: completed") == 1  # executed once
