"""The processes of the stack under test: each a process group with its log, always ended.

``Stack`` starts them (its own Redis on a free port, the fake provider, Daphne, Celery
workers, Celery beat as the sweeper) and is a context manager that ends every one of them,
whatever happened. ``Database`` creates and drops the harness's own PostgreSQL database.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

REPO = Path(__file__).resolve().parents[2]


class StackError(RuntimeError):
    """A process of the stack did not start (its log's tail is in the message)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Process:
    """One subprocess in its own process group (a SIGKILL takes its children too)."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.kills = 0
        self.log_offset = 0  # where this start's output begins in the log

    def start(self) -> Process:
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def output_since_start(self) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self.log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _signal_group(self, sig: int) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group, no goodbye."""
        if self.process is None:
            return
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self.kills += 1

    def stop(self, timeout: float = 8.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; the group's leftovers are killed either way."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def wait_for_log(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.output_since_start():
            if not self.alive():
                raise StackError(f"{self.name} exited with {self.process and self.process.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise StackError(f"{self.name} did not print {needle!r} within {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.1)

    def wait_for_http(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise StackError(f"{self.name} exited with {self.process and self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except urllib.error.HTTPError as exc:
                if exc.code < 500:  # an answer (a 403 without a login) is a server that is up
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise StackError(f"{self.name} did not answer {url} within {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.2)


class Database:
    """A database of its own on the PostgreSQL server ``server_url`` names, dropped at the end."""

    def __init__(self, server_url: str, name: str) -> None:
        parts = urlsplit(server_url)
        self.name = name
        self.url = urlunsplit((parts.scheme, parts.netloc, f"/{name}", "", ""))
        self._admin_url = urlunsplit((parts.scheme, parts.netloc, "/postgres", "", ""))

    def _admin(self) -> psycopg.Connection:
        return psycopg.connect(self._admin_url, autocommit=True, connect_timeout=5)

    def create(self) -> None:
        with self._admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))

    def drop(self) -> None:
        with self._admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))

    def terminate_others(self, keep_application: str) -> int:
        """``pg_terminate_backend`` on every backend of this database but the harness's own; how many."""
        with self._admin() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid() AND application_name <> %s",
                (self.name, keep_application),
            ).fetchall()
        return sum(1 for (done,) in rows if done)


class Stack(contextlib.AbstractContextManager["Stack"]):
    """The stack's processes; leaving the ``with`` ends every one of them."""

    def __init__(self, workdir: Path, database_url: str, event_delay: float, tool_block: float) -> None:
        self.workdir = workdir
        self.redis_port = free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.fake_port = free_port()
        self.fake_url = f"http://127.0.0.1:{self.fake_port}"
        self.web_port = free_port()
        self.web_url = f"http://127.0.0.1:{self.web_port}"
        self.tool_log = workdir / "tool-executions.jsonl"
        self.event_delay = event_delay
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")},
            "DJANGO_SETTINGS_MODULE": "project.chaos.settings",
            "DATABASE_URL": database_url,
            "REDIS_URL": self.redis_url,
            "CHAOS_FAKE_URL": self.fake_url,
            "CHAOS_TOOL_LOG": str(self.tool_log),
            "CHAOS_TOOL_BLOCK": str(tool_block),
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_DEBUG": "0",
            "LOG_FORMAT": "json",
            "LOG_LEVEL": "INFO",
        }
        self.processes: list[Process] = []
        self.redis: Process | None = None
        self.workers: list[Process] = []

    def _process(self, name: str, argv: Sequence[str], role: str) -> Process:
        process = Process(name, argv, {**self.env, "CHAOS_ROLE": role}, self.workdir / f"{name}.log")
        self.processes.append(process)
        return process

    # ---- the services --------------------------------------------------------------------

    def start_redis(self) -> None:
        """Redis with an append-only file synced on every write: a restart loses nothing written."""
        if self.redis is None:
            argv = [
                "redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no",
                "--daemonize", "no", "--loglevel", "warning",
            ]  # fmt: skip
            self.redis = self._process("redis", argv, "redis")
        self.redis.start()
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.redis_port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            if not self.redis.alive() or time.monotonic() > deadline:
                raise StackError(f"redis did not start:\n{self.redis.tail()}")
            time.sleep(0.1)

    def restart_redis(self, down_seconds: float) -> None:
        """SIGTERM (Redis flushes its append-only file), ``down_seconds`` of outage, start again."""
        assert self.redis is not None
        self.redis.stop(timeout=10)
        time.sleep(down_seconds)
        self.start_redis()

    def start_fake(self) -> None:
        argv = [
            sys.executable, "manage.py", "streamrecover_fake_provider", "--port", str(self.fake_port),
            "--event-delay", str(self.event_delay),
        ]  # fmt: skip
        self._process("fake-provider", argv, "fake").start().wait_for_log("listening on", 60)

    def start_web(self) -> None:
        argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port), "project.asgi:application"]
        process = self._process("daphne", argv, "daphne").start()
        process.wait_for_http(f"{self.web_url}/streamrecover/api/threads/", 60)

    def start_worker(self, index: int, concurrency: int) -> Process:
        argv = [
            sys.executable, "-m", "celery", "-A", "project", "worker", "--pool=prefork",
            f"--concurrency={concurrency}", "--loglevel=INFO", "--without-gossip", "--without-mingle",
            "--without-heartbeat", "-n", f"chaos{index}@%h",
        ]  # fmt: skip
        worker = self._process(f"worker{index}", argv, f"worker{index}").start()
        self.workers.append(worker)
        return worker

    def restart_worker(self, worker: Process) -> None:
        worker.kill()
        worker.start()

    def ready_workers(self) -> list[Process]:
        """Workers that said "ready." since their last start (a SIGKILLed one boots again first)."""
        return [w for w in self.workers if w.alive() and " ready." in w.output_since_start()]

    def start_beat(self) -> None:
        argv = [
            sys.executable, "-m", "celery", "-A", "project", "beat", "--loglevel=WARNING",
            "-s", str(self.workdir / "beat-schedule"),
        ]  # fmt: skip
        self._process("beat", argv, "beat").start()

    def dead(self) -> list[Process]:
        """Processes that exited on their own (a kill is followed by a start, so they are alive)."""
        return [p for p in self.processes if p.process is not None and not p.alive()]

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(Exception):
                process.stop(timeout=5)
