"""A proxied run whose serving process dies mid-stream is completed by another worker: Daphne (a
subprocess) serves the stream and is killed while the upstream stalls; the sweep hands the run to
this process, which resumes it from its checkpoint and stores the whole answer."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from streamrecover import dispatch
from streamrecover.models import Message, Run
from streamrecover.proxy.keys import issue_key
from streamrecover.proxy.views import FAULTS_HEADER
from streamrecover.runs import lifecycle
from streamrecover.testing.host import wait_for

from .e2e_helpers import Service, base_env, daphne, free_port
from .proxy_helpers import daphne_url, proxy_settings

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Tell me about rivers [[words=40]]"


def _database_url() -> str:
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def serving(transactional_db: Any, tmp_path: Path) -> Iterator[Service]:
    env = base_env(
        DJANGO_SETTINGS_MODULE="tests.settings_proxy", DATABASE_URL=_database_url(), REDIS_URL=settings.REDIS_URL
    )
    service = daphne(free_port(), env, tmp_path / "daphne.log")
    try:
        yield service
    finally:
        service.stop()


def _text_of(content: list[dict[str, Any]]) -> str:
    return "".join(b["text"] for b in content if b["type"] == "text")


def test_a_run_whose_serving_process_died_is_completed_by_another_worker(
    serving: Service, django_user_model: Any
) -> None:
    raw = issue_key(django_user_model.objects.create_user("resumer", password="x"))[1]
    port = serving.process.args[-1].rsplit(":", 1)[1]  # type: ignore[index]
    body = {"model": "claude-x", "max_tokens": 500, "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"x-api-key": raw, "anthropic-version": "2023-06-01", FAULTS_HEADER: "stall:events=14,seconds=120"}
    shown = ""
    with httpx.stream(
        "POST", f"http://127.0.0.1:{port}/streamrecover/proxy/v1/messages", json=body, headers=headers, timeout=30
    ) as response:
        run_id = response.headers["x-streamrecover-run"]
        for line in response.iter_lines():
            if '"text_delta"' in line:
                shown += httpx.Response(200, content=line.removeprefix("data: ")).json()["delta"]["text"]
            if shown.count(" ") >= 5:
                break
        os.kill(serving.process.pid, signal.SIGKILL)  # the serving process dies mid-stream
        serving.process.wait(timeout=10)
    assert Run.objects.get(pk=run_id).status == "running"

    with override_settings(STREAMRECOVER=proxy_settings(settings.STREAMRECOVER)):
        assert dispatch.sweep_stale_runs(seconds=0) == [run_id]  # its heartbeat stopped: another worker takes it
        report = wait_for(run_id)
        assert report.status == "completed", report.error
        assert "llm_run_resumed" in report.event_names()
        assert Run.objects.get(pk=run_id).worker == lifecycle.worker_id()

        # the answer stored is the whole uninterrupted answer, and begins with what the client was shown
        stored = _text_of(Message.objects.get(run_id=run_id, role="assistant").content)
        site = daphne_url() + "/streamrecover/proxy"
        clean = httpx.post(site + "/v1/messages", json=body, headers={"x-api-key": raw}, timeout=30)
        wait_for(clean.headers["x-streamrecover-run"])
        expected = _text_of(Message.objects.get(run_id=clean.headers["x-streamrecover-run"], role="assistant").content)
    assert stored == expected
    assert shown
    assert stored.startswith(shown)
