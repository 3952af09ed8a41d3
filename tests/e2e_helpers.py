"""What the end-to-end tests share: server subprocesses, Debian's Chromium, the chat page.

A server is a real process (Daphne via ``manage.py runserver``, a Celery worker) started
on a free port and always stopped; its output goes to a log file that a failing test
prints. The browser is ``/usr/bin/chromium`` driven by Playwright, never a downloaded
build: ``scripts/ensure_chromium.sh`` installs Debian's package when it is missing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TERMINAL = ("completed", "failed", "exhausted", "cancelled")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def manage(*args: str, env: dict[str, str]) -> None:
    """``manage.py <args>`` in a subprocess; fails the test with its output."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        pytest.fail(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


class Service:
    """A subprocess with its log; ``stop`` ends it (and only it)."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(list(argv), cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()


def wait_for_http(url: str, service: Service, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            pytest.fail(f"{service.name} exited with {service.process.returncode}:\n{service.log()}")
        with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.2)
    pytest.fail(f"{service.name} did not answer {url} within {timeout:.0f}s:\n{service.log()}")


def daphne(port: int, env: dict[str, str], log_path: Path) -> Service:
    """Daphne (its ``runserver``: HTTP, WebSockets and the static files), no autoreload."""
    argv = [sys.executable, "manage.py", "runserver", "--noreload", "--insecure", f"127.0.0.1:{port}"]
    service = Service("daphne", argv, env, log_path)
    wait_for_http(f"http://127.0.0.1:{port}/streamrecover/login/", service)
    return service


@contextlib.contextmanager
def browser_site(db: Path, *setup: Sequence[str], **env_extra: str) -> Iterator[str]:
    """The demo project on the SQLite file ``db`` (``tests.settings_browser``), migrated, each of
    ``setup``'s ``manage.py`` commands run, served by Daphne on a free port: its base URL."""
    env = base_env(DJANGO_SETTINGS_MODULE="tests.settings_browser", STREAMRECOVER_BROWSER_DB=str(db), **env_extra)
    manage("migrate", "--verbosity", "0", env=env)
    for command in setup:
        manage(*command, env=env)
    port = free_port()
    server = daphne(port, env, db.parent / "daphne.log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING", DJANGO_DEBUG="1", **extra)
    return env


# ---- the browser ---------------------------------------------------------------------------------


def ensure_chromium() -> None:
    """Debian's Chromium, installed by the project's script when missing; a clear failure otherwise."""
    if os.access(CHROMIUM, os.X_OK):
        return
    done = subprocess.run(["bash", str(REPO / "scripts" / "ensure_chromium.sh")], capture_output=True, text=True)
    if done.returncode != 0 or not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing and scripts/ensure_chromium.sh could not install it:\n{done.stderr}")


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    ensure_chromium()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def admin_run_list(page: Any, site: str, username: str, password: str) -> None:
    """Sign in to the admin of ``site`` as a superuser and land on its run list."""
    page.goto(f"{site}/admin/login/?next=/admin/streamrecover/run/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/streamrecover/run/")


class ChatPage:
    """The demo chat in one browser page, logged in as the demo user."""

    def __init__(self, page: Any, base_url: str) -> None:
        self.page = page
        self.base_url = base_url
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.set_default_timeout(30_000)

    def login(self, username: str = "demo", password: str = "demo") -> None:
        self.page.goto(f"{self.base_url}/streamrecover/")
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", password)
        self.page.click("form button[type=submit]")
        self.page.wait_for_url("**/streamrecover/")

    def send(self, prompt: str, scenario: str = "none") -> str:
        """Submit the form; returns the new run's id."""
        previous = self.page.evaluate("window.__streamrecover.runId")
        self.page.fill("#sr-prompt", prompt)
        self.page.select_option("#sr-scenario", scenario)
        self.page.click("#sr-send")
        self.page.wait_for_function(
            "prev => window.__streamrecover.runId && window.__streamrecover.runId !== prev", arg=previous
        )
        return str(self.page.evaluate("window.__streamrecover.runId"))

    def wait_until_finished(self, timeout_ms: int = 40_000) -> str:
        self.page.wait_for_function(
            "terminal => terminal.includes(window.__streamrecover.status)"
            " && !document.querySelector('#sr-transcript [data-streaming=true]')",
            arg=list(TERMINAL),
            timeout=timeout_ms,
        )
        self.page.wait_for_timeout(100)  # one more animation frame for the last render
        return str(self.page.evaluate("window.__streamrecover.status"))

    def wait_for_streamed_text(self, chars: int) -> None:
        self.page.wait_for_function(
            "n => { const el = document.querySelector('#sr-transcript [data-streaming=true]'); return !!el &&"
            " Array.from(el.querySelectorAll('.sr-text')).map(d => d.textContent).join('').length >= n; }",
            arg=chars,
        )

    def shown_assistant_texts(self) -> list[str]:
        """The text of each assistant message on the page, as the reader sees it."""
        return list(
            self.page.eval_on_selector_all(
                "#sr-transcript li[data-role=assistant]",
                "items => items.map(li =>"
                " Array.from(li.querySelectorAll('.sr-text')).map(d => d.textContent).join(''))",
            )
        )

    def run_detail(self, run_id: str) -> dict[str, Any]:
        response = self.page.request.get(f"{self.base_url}/streamrecover/api/runs/{run_id}/")
        assert response.ok, response.text()
        return dict(response.json())

    def committed_assistant_texts(self, run_id: str) -> list[str]:
        """The same, from the committed thread (the JSON API)."""
        return [
            "".join(b.get("text", "") for b in m["content"] if b.get("type") == "text")
            for m in self.run_detail(run_id)["messages"]
            if m["role"] == "assistant"
        ]

    def state(self) -> dict[str, Any]:
        return dict(
            self.page.evaluate(
                "({stats: window.__streamrecover.client.stats, recoveries: window.__streamrecover.recoveries,"
                " snapshots: window.__streamrecover.snapshots, errors: window.__streamrecover.errors,"
                " status: window.__streamrecover.status})"
            )
        )
