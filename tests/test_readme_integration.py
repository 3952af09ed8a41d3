"""The README's integration section, followed literally: a wheel built from this checkout, a fresh
virtual environment, ``django-admin startproject mysite``, the README's marked blocks written into
it as they stand, then ``check --deploy``, ``migrate``, ``collectstatic``, a run against the built-in
fake provider with ``streamrecover_run --json`` and a WebSocket subscription that receives the
run's frames (and is refused from another origin): once in each mode.

The blocks are found by their marker comments (``<!-- readme-block: TARGET mode=MODE [append|create] -->``
before a fenced block), so the README cannot drift from what is tested. One venv serves both
modes: the one-process install first (and Celery must then be absent), then the distributed extra.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(
    r"<!-- readme-block: (?P<target>\S+) mode=(?P<mode>[\w-]+)(?: (?P<how>append|create))? -->\n"
    r"```\w*\n(?P<body>.*?)```",
    re.DOTALL,
)
MODES = ("one-process", "distributed")


@dataclass(frozen=True)
class Block:
    target: str
    mode: str
    how: str | None
    body: str


def readme_blocks(mode: str) -> list[Block]:
    blocks = [Block(m["target"], m["mode"], m["how"], m["body"]) for m in MARKER.finditer(README.read_text())]
    return [b for b in blocks if b.mode in (mode, "both")]


def test_the_readme_has_every_block_for_each_mode() -> None:
    for mode in MODES:
        targets = {(b.target, b.how) for b in readme_blocks(mode)}
        expected = {
            ("install", None),
            ("commands", None),
            ("mysite/settings.py", "append"),
            ("mysite/asgi.py", "create"),
            ("mysite/urls.py", "create"),
        }
        if mode == "distributed":
            expected |= {("mysite/celery.py", "create"), ("mysite/__init__.py", "create")}
        assert expected <= targets, mode
        (install,) = [b for b in readme_blocks(mode) if b.target == "install"]
        assert "/path/to/streamrecover" in install.body


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    kw.setdefault("timeout", 300)
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{shlex.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


class Venv:
    """A fresh virtual environment with the wheel installed as the README says, per mode."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.dist = where / "dist"
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(self.dist), str(ROOT)])
        (self.wheel,) = self.dist.glob("django_streamrecover-*.whl")
        _run([sys.executable, "-m", "venv", str(where / "venv")])
        self.bin = where / "venv" / "bin"
        self.modes: list[str] = []

    def install(self, mode: str) -> None:
        if mode in self.modes:
            return
        (block,) = [b for b in readme_blocks(mode) if b.target == "install"]
        (line,) = [ln for ln in block.body.splitlines() if ln.startswith("pip install")]
        # the README's requirement (a checkout, with its extra), installed from the wheel just built
        requirement = shlex.split(line)[2]
        named = re.fullmatch(r"/path/to/streamrecover(\[[\w,-]+\])?", requirement)
        assert named, f"the README installs {requirement!r}, not a checkout of this repository"
        requirement = f"django-streamrecover{named[1] or ''} @ {self.wheel.as_uri()}"
        _run([str(self.bin / "python"), "-m", "pip", "install", "-q", requirement])
        self.modes.append(mode)

    def has(self, module: str) -> bool:
        probe = subprocess.run([str(self.bin / "python"), "-c", f"import {module}"], capture_output=True)
        return probe.returncode == 0


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    return Venv(tmp_path_factory.mktemp("readme_venv"))


def host_env(venv: Venv, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV"}}
    env["PATH"] = f"{venv.bin}{os.pathsep}{env.get('PATH', '')}"
    env.pop("ANTHROPIC_API_KEY", None)
    return {**env, **extra}


def start_project(venv: Venv, where: Path, mode: str, env: dict[str, str]) -> Path:
    where.mkdir()
    _run([str(venv.bin / "django-admin"), "startproject", "mysite", str(where)], env=env)
    for block in readme_blocks(mode):
        if block.how is None:
            continue
        target = where / block.target
        if block.how == "create":
            target.write_text(block.body)
        else:
            target.write_text(target.read_text() + "\n\n" + block.body)
    (where / "ws_check.py").write_text(WS_CHECK)
    return where


WS_CHECK = '''
"""Subscribe to a run over the project's ASGI application, then start it; print what arrived."""
import asyncio
import json
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
from mysite.asgi import application  # sets Django up

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from streamrecover import dispatch
from streamrecover.runs import lifecycle

TERMINAL = {"completed", "failed", "exhausted", "cancelled"}


def setup():
    user, _ = get_user_model().objects.get_or_create(username="reader")
    client = Client()
    client.force_login(user)
    run = lifecycle.create_run(prompt="A tale [[words=60]]", provider="fake", owner=user, faults=["cut:bytes=900"])
    return run, client.cookies["sessionid"].value


async def main():
    run, session = await sync_to_async(setup)()
    path = f"/ws/streamrecover/runs/{run.pk}/"
    cookie = (b"cookie", f"sessionid={session}".encode())
    evil = WebsocketCommunicator(application, path, headers=[(b"origin", b"https://evil.example"), cookie])
    evil_connected, _ = await evil.connect()
    await evil.disconnect()
    ws = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://localhost"), cookie])
    connected, _ = await ws.connect()
    frames = [await ws.receive_json_from(timeout=20)]
    await sync_to_async(dispatch.enqueue_run)(run)
    while not (frames[-1]["type"] == "run_status" and frames[-1]["status"] in TERMINAL):
        frames.append(await ws.receive_json_from(timeout=90))
    await ws.disconnect()
    print(json.dumps({"evil_connected": evil_connected, "connected": connected, "frames": frames}))


asyncio.run(main())
'''


def follow_the_readme(venv: Venv, project: Path, env: dict[str, str], run_args: list[str]) -> None:
    python = str(venv.bin / "python")
    check = _run([python, "manage.py", "check", "--deploy"], cwd=project, env=env)
    assert "streamrecover." not in check.stdout + check.stderr
    _run([python, "manage.py", "migrate", "-v", "0"], cwd=project, env=env)
    _run([python, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=project, env=env)
    assert (project / "staticfiles" / "streamrecover" / "client.js").is_file()

    done = _run(
        [python, "manage.py", "streamrecover_run", "--provider", "fake", "--prompt", "A tale [[words=60]]",
         "--fault", "cut:bytes=900", "--json", *run_args],
        cwd=project, env=env, timeout=180,
    )  # fmt: skip
    doc = json.loads(done.stdout)  # the object alone on stdout; the log lines went to stderr
    assert doc["status"] == "completed", doc
    assert "llm_stream_interrupted" in [e["event"] for e in doc["events"]]
    assert [a["kind"] for a in doc["attempts"]] == ["initial", "continuation"]
    if "--enqueue" not in run_args:  # (enqueued, the worker logs the run)
        assert "llm_stream_interrupted" in done.stderr

    ws = _run([python, "ws_check.py"], cwd=project, env=env, timeout=180)
    seen = json.loads(ws.stdout.strip().splitlines()[-1])
    assert seen["evil_connected"] is False  # another origin never gets a socket
    assert seen["connected"] is True
    kinds = [f["type"] for f in seen["frames"]]
    assert kinds[0] == "snapshot"
    assert {"text_delta", "recovery", "message_committed"} <= set(kinds)
    assert seen["frames"][-1]["status"] == "completed"


def test_one_process_mode_from_the_readme(venv: Venv, tmp_path: Path) -> None:
    venv.install("one-process")
    if venv.modes == ["one-process"]:  # what the one-process mode installs, and no more
        assert [m for m in ("celery", "redis", "channels_redis", "django_structlog") if venv.has(m)] == []
    env = host_env(venv)
    project = start_project(venv, tmp_path / "mysite", "one-process", env)
    follow_the_readme(venv, project, env, [])


@pytest.fixture
def readme_database() -> str:
    """A fresh PostgreSQL database beside the test's own, named by the libpq variables the README uses."""
    import psycopg

    url = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"))
    name = f"{url.path.lstrip('/') or 'test'}_readme"
    params = {"host": url.hostname or "127.0.0.1", "port": url.port or 5432, "user": url.username or "postgres"}
    with psycopg.connect(dbname="postgres", autocommit=True, password=url.password, **params) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


@pytest.mark.services
def test_distributed_mode_from_the_readme(venv: Venv, tmp_path: Path, readme_database: str) -> None:
    from django.conf import settings

    venv.install("distributed")
    url = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"))
    env = host_env(
        venv,
        PGHOST=url.hostname or "127.0.0.1",
        PGPORT=str(url.port or 5432),
        PGUSER=url.username or "postgres",
        PGDATABASE=readme_database,
        REDIS_URL=settings.REDIS_URL,
        **({"PGPASSWORD": url.password} if url.password else {}),
    )
    project = start_project(venv, tmp_path / "mysite", "distributed", env)
    # the README's worker line, as it stands (without the shell's "&")
    (commands,) = [b for b in readme_blocks("distributed") if b.target == "commands"]
    (worker_line,) = [ln for ln in commands.body.splitlines() if ln.startswith("celery -A mysite worker")]
    worker_cmd = [*shlex.split(worker_line.split("&")[0]), "-n", f"readme-{os.getpid()}@%h"]
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [str(venv.bin / worker_cmd[0]), *worker_cmd[1:]], cwd=project, env=env, stdout=log, stderr=log
        )
    try:
        follow_the_readme(venv, project, env, ["--enqueue", "--timeout", "120"])
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    lines = log_path.read_text().splitlines()
    started = [ln for ln in lines if "run_started" in ln]
    assert started, "\n".join(lines[-40:])
    for line in started:
        # logged by the worker at its own level through the project's LOGGING, not re-logged from stdout
        record = json.loads(line)
        assert (record["event"], record["level"], record["logger"]) == ("run_started", "info", "streamrecover")
    assert not [ln for ln in lines if "celery.redirected" in ln or "WARNING/" in ln], "\n".join(lines[-40:])
