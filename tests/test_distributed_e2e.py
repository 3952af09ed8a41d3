"""The distributed mode end to end: Daphne and a separate Celery worker, both real
processes on the test PostgreSQL and the real Redis (broker, channels_redis pub/sub, the
replay buffer, checkpoints). A browser sends an R1 prompt; the worker streams it; the page
ends showing exactly the committed message."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.conf import settings
from django.db import connection

from streamrecover.live.buffer import RedisFrameBuffer
from streamrecover.models import Run

from .e2e_helpers import ChatPage, Service, base_env, chromium, daphne, free_port, manage

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

E2E_REDIS_DB = 14  # its own database, and below its own queue: two suites on one machine never
# take each other's runs (a worker of one would consume the other's task and fail to find its row)


def _database_url() -> str:
    """pytest-django's test database (``test_<name>``), as the subprocesses must reach it."""
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def _redis_url() -> str:
    parts = urlsplit(settings.REDIS_URL)
    return urlunsplit((parts.scheme, parts.netloc, f"/{E2E_REDIS_DB}", "", ""))


@pytest.fixture
def distributed_site(transactional_db: Any, tmp_path: Path) -> Iterator[tuple[str, Service]]:
    """Daphne + a Celery worker on the demo project's distributed settings; both stopped
    before the test database is flushed."""
    env = base_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        DATABASE_URL=_database_url(),
        REDIS_URL=_redis_url(),
        STREAMRECOVER_FAKE_EVENT_DELAY="0.005",
        CELERY_QUEUE=f"e2e-{uuid.uuid4().hex}",
    )
    manage("streamrecover_demo_user", env=env)  # hashed by the project's password hashers
    worker = Service(
        "celery worker",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "project",
            "worker",
            "--pool=solo",
            "--loglevel=WARNING",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"e2e-{uuid.uuid4().hex[:8]}@%h",
        ],
        env,
        tmp_path / "worker.log",
    )
    server = None
    try:
        port = free_port()
        server = daphne(port, env, tmp_path / "daphne.log")
        yield f"http://127.0.0.1:{port}", worker
    finally:
        if server is not None:
            server.stop()
        worker.stop()


def test_an_r1_run_on_a_celery_worker_reaches_the_browser_intact(distributed_site: tuple[str, Service]) -> None:
    base_url, worker = distributed_site
    with chromium() as browser:
        chat = ChatPage(browser.new_page(), base_url)
        chat.login()
        run_id = chat.send("Tell me about harbours at night. [[words=150]]", "r1")
        status = chat.wait_until_finished(timeout_ms=60_000)
        assert status == "completed", worker.log()
        shown = chat.shown_assistant_texts()
        committed = chat.committed_assistant_texts(run_id)
        state = chat.state()
        assert chat.errors == []
    assert committed
    assert shown == committed
    assert state["stats"]["mismatches"] == 0
    assert state["stats"]["checked"] == 1
    assert [r["plan"] for r in state["recoveries"]] == ["continue_text", "continue_text"]
    run = Run.objects.get(pk=run_id)
    assert run.worker.endswith(f":{worker.process.pid}"), "the worker process executed the run"
    assert worker.alive(), worker.log()
    # the frames went through the Redis replay buffer
    client = redis.Redis.from_url(_redis_url())
    try:
        _, frames_key = RedisFrameBuffer(_redis_url()).keys(run_id)
        assert client.xlen(frames_key) > 0
        client.delete(*RedisFrameBuffer(_redis_url()).keys(run_id))
    finally:
        client.close()
