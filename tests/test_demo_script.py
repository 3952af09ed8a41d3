"""``make demo`` (scripts/demo.sh): a port something else holds, runs a stopped server left, a second demo beside it."""

from __future__ import annotations

import http.cookiejar
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from .e2e_helpers import Service, base_env, free_port, manage, wait_for_http

REPO = Path(__file__).resolve().parent.parent


def _demo_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """What ``scripts/demo.sh`` runs with here: the browser tests' settings on a SQLite file of
    ``tmp_path``, this interpreter, this checkout; ``extra`` on top (``DEMO_PORT``, ...)."""
    return {
        **base_env(
            DJANGO_SETTINGS_MODULE="tests.settings_browser", STREAMRECOVER_BROWSER_DB=str(tmp_path / "d.sqlite3")
        ),
        "DEMO_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        **extra,
    }


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
    env = _demo_env(tmp_path, DEMO_HOST="127.0.0.1")
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
    # no address to open: it was printed (the script's, then Daphne's banner) before the listen failed
    assert "http://" not in out + err, out
    assert not left, "make demo left a process running"


def test_the_demo_server_shows_no_address_for_a_port_held_by_a_listener_that_never_answers(tmp_path: Path) -> None:
    """Without the script's check in front of it (a port taken just after that check): Daphne wrote
    "Starting ... development server at http://127.0.0.1:PORT/" before it tried to listen."""
    env = base_env(
        DJANGO_SETTINGS_MODULE="tests.settings_browser", STREAMRECOVER_BROWSER_DB=str(tmp_path / "d.sqlite3")
    )
    manage("migrate", "--verbosity", "0", env=env)
    with socket.socket() as held:  # listening, never accepting: a connection would hang, not be refused
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "manage.py", "streamrecover_demo_serve", "--noreload", f"127.0.0.1:{port}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"make demo: 127.0.0.1:{port} is in use" in done.stderr
    assert "http://" not in done.stdout + done.stderr, done.stdout


def test_make_demo_shows_the_chat_address_once_the_server_listens_there(tmp_path: Path) -> None:
    """The script printed the address, then started Python and Daphne: for a second or more the
    address it invited the user to open refused connections (and never answered, had it been taken)."""
    port = free_port()
    env = _demo_env(
        tmp_path,
        DEMO_HOST="127.0.0.1",
        DEMO_PORT=str(port),
    )
    demo = subprocess.Popen(
        ["bash", "scripts/demo.sh"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    shown: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            shown.append(line)
            if "demo chat:" in line:
                # at once, as a user who opens it: the server must be listening already
                with socket.create_connection(("127.0.0.1", port), timeout=5):
                    pass
                break
        else:
            raise AssertionError(f"make demo exited {demo.wait()} without showing its address:\n{''.join(shown)}")
    finally:
        if _alive(demo.pid):
            os.killpg(demo.pid, signal.SIGKILL)
        demo.wait(timeout=10)
    assert f"demo chat:  http://127.0.0.1:{port}/streamrecover/" in shown[-1]
    assert f"development server at http://127.0.0.1:{port}/" in "".join(shown)  # Daphne's banner, listening too


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
    env = _demo_env(tmp_path, DEMO_PORT=str(port))
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


def _start_run(site: str, prompt: str) -> str:
    """A run started from the chat's JSON API as the demo user (executed by that server): its id."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    login = f"{site}/streamrecover/login/"
    opener.open(login).read()
    token = next(c.value for c in jar if c.name == "csrftoken")
    form = urllib.parse.urlencode({"username": "demo", "password": "demo", "csrfmiddlewaretoken": token})
    opener.open(urllib.request.Request(login, data=form.encode(), headers={"Referer": login})).read()
    token = next(c.value or "" for c in jar if c.name == "csrftoken")
    request = urllib.request.Request(
        f"{site}/streamrecover/api/runs/",
        data=json.dumps({"prompt": prompt}).encode(),
        headers={"Content-Type": "application/json", "X-CSRFToken": token, "Referer": site},
    )
    with opener.open(request) as response:
        run_id: str = json.loads(response.read())["run_id"]
    return run_id


def test_a_second_demo_on_the_same_database_leaves_the_first_ones_run_to_it(tmp_path: Path) -> None:
    """``DEMO_PORT=8001 make demo`` beside a ``make demo`` (the advice when 8000 is taken) shares its
    SQLite database. Its start-up sweep (``--seconds 0 --queued-seconds 0``) took every run for one
    a stopped server left, the first server's too, mid-answer: it revoked its claim (that page's
    answer stopped) and executed it again in its own process."""
    first_port, second_port = free_port(), free_port()
    env = _demo_env(
        tmp_path,
        STREAMRECOVER_FAKE_EVENT_DELAY="0.05",  # an answer that lasts while the second demo starts
    )
    first = Service("make demo", ["bash", "scripts/demo.sh"], {**env, "DEMO_PORT": str(first_port)}, tmp_path / "1.log")
    second: Service | None = None
    try:
        wait_for_http(f"http://127.0.0.1:{first_port}/streamrecover/login/", first)
        run_id = _start_run(f"http://127.0.0.1:{first_port}", "A long story [[words=3000]]")
        second = Service(
            "make demo", ["bash", "scripts/demo.sh"], {**env, "DEMO_PORT": str(second_port)}, tmp_path / "2.log"
        )
        wait_for_http(f"http://127.0.0.1:{second_port}/streamrecover/login/", second)
        with sqlite3.connect(tmp_path / "d.sqlite3") as db:
            status, worker, claims = db.execute(
                "SELECT status, worker, claims FROM streamrecover_run WHERE id = ?", (run_id.replace("-", ""),)
            ).fetchone()
    finally:
        if second is not None:
            second.stop()
        first.stop()
    assert status in ("running", "recovering"), (tmp_path / "2.log").read_text()
    assert claims == 1, (tmp_path / "2.log").read_text()  # the first server's claim, never taken from it
    assert worker.endswith(f":{first.process.pid}")  # demo.sh execs the server: its pid
    assert run_id not in (tmp_path / "2.log").read_text()


def test_a_demo_started_beside_a_demo_cli_run_leaves_that_run_to_it(tmp_path: Path) -> None:
    """``make demo-cli`` executes its run in its own process on the demo's SQLite database. A
    ``make demo`` started while it streamed swept every run at once (no demo server held the lock),
    the CLI's live run too: it took it over and executed it again before listening."""
    port = free_port()
    env = _demo_env(
        tmp_path,
        DEMO_PORT=str(port),
        STREAMRECOVER_FAKE_EVENT_DELAY="0.2",  # a run that lasts while the demo server starts
    )
    manage("migrate", "--verbosity", "0", env=env)
    cli = Service("make demo-cli", ["bash", "scripts/demo.sh", "cli"], env, tmp_path / "cli.log")
    demo: Service | None = None
    try:
        deadline = time.monotonic() + 30
        found = None
        while found is None and time.monotonic() < deadline and cli.alive():
            time.sleep(0.2)
            with sqlite3.connect(tmp_path / "d.sqlite3") as db:
                live = "SELECT id FROM streamrecover_run WHERE status IN ('running', 'recovering')"
                found = db.execute(live).fetchone()
        assert found is not None, cli.log()
        demo = Service("make demo", ["bash", "scripts/demo.sh"], env, tmp_path / "demo.log")
        wait_for_http(f"http://127.0.0.1:{port}/streamrecover/login/", demo)  # its sweep is over
        with sqlite3.connect(tmp_path / "d.sqlite3") as db:
            status, worker, claims = db.execute(
                "SELECT status, worker, claims FROM streamrecover_run WHERE id = ?", found
            ).fetchone()
        still_streaming = cli.alive()
    finally:
        if demo is not None:
            demo.stop()
        cli.stop()
    assert still_streaming, cli.log()  # else the check proves nothing: the run ended before the demo started
    assert status in ("running", "recovering"), (tmp_path / "demo.log").read_text()
    assert claims == 1, (tmp_path / "demo.log").read_text()  # the CLI's claim, never taken from it
    assert worker.endswith(f":{cli.process.pid}")  # demo.sh execs the command: its pid
    assert "executing" not in (tmp_path / "demo.log").read_text()
