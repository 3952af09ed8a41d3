"""Runs executed by real Celery worker processes on the real Redis and PostgreSQL: a run
completes through injected cuts, a killed worker's run is finished by another worker from
its checkpoint, cancel reaches a running worker, a poison run ends as failed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from django.test import override_settings

from streamrecover import dispatch
from streamrecover.conf import app_settings
from streamrecover.models import Attempt, Message, RecoveryEvent, Run
from streamrecover.runs import lifecycle
from streamrecover.runs.checkpoints import RedisCheckpointStore
from streamrecover.testing.fake import FakeProviderServer

from .harness import run as run_engine

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[1]
LONG = "Tell me a long story about a lighthouse [[words=450]]"


@pytest.fixture(scope="module")
def slow_fake() -> Iterator[FakeProviderServer]:
    """A fake provider that streams visibly slowly, so a worker can be killed mid-stream."""
    server = FakeProviderServer(event_delay=0.01)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def celery_settings(slow_fake, settings):
    from project.celery import app

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()  # no stale messages
    slow_fake.reset()
    with override_settings(
        STREAMRECOVER={
            **settings.STREAMRECOVER,
            "PROVIDERS": {
                "fake": {"ADAPTER": "anthropic", "BASE_URL": slow_fake.base_url, "API_KEY": "sk-fake-worker-key"},
                "fake-responses": {
                    "ADAPTER": "openai-responses",
                    "BASE_URL": f"{slow_fake.base_url}/v1",
                    "API_KEY": "sk-fake-worker-key",
                    "NATIVE_RESUME": True,
                },
            },
            "EXECUTION": "celery",
            "CHECKPOINT_STORE": "redis",
            "HEARTBEAT_SECONDS": 0.5,
            "STALE_AFTER_SECONDS": 2,
        }
    ):
        yield app


class Worker:
    """A real ``celery worker`` process on the test database."""

    def __init__(
        self, name: str, fake_url: str, log_dir: Path, max_runs: int = 100, full_wait: float | None = 3.0
    ) -> None:
        self.log_path = log_dir / f"{name}.log"
        env = {
            **os.environ,
            "STREAMRECOVER_WORKER_MAX_RUNS": str(max_runs),
            "STREAMRECOVER_WORKER_FULL_WAIT_SECONDS": "none" if full_wait is None else str(full_wait),
            "DJANGO_SETTINGS_MODULE": "tests.settings_worker",
            "STREAMRECOVER_TEST_DB_NAME": connection.settings_dict["NAME"],
            "STREAMRECOVER_FAKE_URL": fake_url,
            "PYTHONPATH": str(ROOT),
        }
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "project", "worker", "--pool=solo", "-n", f"{name}@%h",
             "--without-mingle", "--without-gossip", "-l", "INFO"],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while b"ready." not in self.log_path.read_bytes():
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, "worker did not start:\n" + self.log()
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


@pytest.fixture
def workers(slow_fake, tmp_path) -> Iterator[list[Worker]]:
    started: list[Worker] = []

    def start(name: str, max_runs: int = 100, full_wait: float | None = 3.0) -> Worker:
        worker = Worker(name, slow_fake.base_url, tmp_path, max_runs, full_wait)
        started.append(worker)
        return worker

    yield start  # type: ignore[misc]
    for worker in started:
        worker.stop()


def wait_for(predicate, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def status_of(run_id) -> str:
    return Run.objects.get(pk=run_id).status


def reference_text(fake: FakeProviderServer, prompt: str) -> str:
    outcome = asyncio.run(run_engine(fake, prompt, model="fake-claude", max_tokens=1024))
    return outcome.assistant[0]["content"][0]["text"]


def assistant_text(run: Run) -> str:
    message = Message.objects.get(thread=run.thread, role="assistant")
    return "".join(b["text"] for b in message.content if b["type"] == "text")


def test_worker_completes_a_run_through_injected_cuts(celery_settings, workers, slow_fake):
    worker = workers("w1")
    prompt = "A short tale [[words=60]]"
    slow_fake.set_faults("default", ["cut:bytes=900", "error:events=12"])  # the worker's requests
    run = lifecycle.create_run(prompt=prompt, provider="fake", model="fake-claude")
    dispatch.enqueue_run(run)
    wait_for(lambda: status_of(run.pk) in Run.TERMINAL_STATUSES, what="the run to finish")
    run.refresh_from_db()
    assert run.status == "completed", worker.log()
    assert run.worker.endswith(str(worker.process.pid))
    assert assistant_text(run) == reference_text(slow_fake, prompt)
    kinds = list(Attempt.objects.filter(run=run).order_by("index").values_list("kind", flat=True))
    assert kinds == ["initial", "continuation", "continuation"]
    names = set(RecoveryEvent.objects.filter(run=run).values_list("name", flat=True))
    assert {"llm_stream_interrupted", "llm_stream_continuation_started", "llm_stream_continuation_completed"} <= names
    assert Attempt.objects.filter(run=run, outcome="completed").get().output_tokens > 0
    # the worker's API key reached neither its log nor any stored request
    assert "sk-fake-worker-key" not in worker.log()
    assert all("sk-fake-worker-key" not in str(a.request) for a in Attempt.objects.filter(run=run))
    # the run's outcome lives in the database: nothing in the result backend (no connection per
    # worker thread for it, no key per run left behind)
    wait_for(lambda: "streamrecover.execute_run" in worker.log() and "succeeded" in worker.log(), what="the ack")
    assert redis.Redis.from_url(django_settings.CELERY_RESULT_BACKEND).keys("celery-task-meta-*") == []


def _stream_side_by_side(workers: Any, fake: FakeProviderServer, count: int, max_runs: int) -> tuple[Worker, int]:
    """``count`` runs enqueued at once to one ``--pool=solo`` worker holding at most ``max_runs``:
    the worker, and the most runs it streamed at once (sampled until every run ended)."""
    worker = workers("w1", max_runs=max_runs)
    prompts = [f"Tale {n} of a lighthouse keeper [[words=220]]" for n in range(count)]
    runs = [lifecycle.create_run(prompt=prompt, provider="fake", model="fake-claude") for prompt in prompts]
    for run in runs:
        dispatch.enqueue_run(run)
    ids = [run.pk for run in runs]
    most = 0
    deadline = time.monotonic() + 120
    while Run.objects.filter(pk__in=ids).exclude(status__in=Run.TERMINAL_STATUSES).exists():
        assert time.monotonic() < deadline, "the runs did not finish:\n" + worker.log()
        most = max(most, Run.objects.filter(pk__in=ids, status="running").count())
        time.sleep(0.05)
    for run, prompt in zip(runs, prompts, strict=True):
        run.refresh_from_db()
        assert run.status == "completed", worker.log()
        assert run.worker.endswith(str(worker.process.pid))
        assert run.claims == 1
        assert assistant_text(run) == reference_text(fake, prompt)
    return worker, most


def test_one_solo_worker_streams_several_runs_at_once(celery_settings, workers, slow_fake):
    """A run holds no pool slot: one ``--pool=solo`` worker streams three runs side by side
    (its task returns once the run is claimed), and each answer is the uninterrupted one."""
    worker, most = _stream_side_by_side(workers, slow_fake, count=3, max_runs=100)
    assert most == 3
    # each task was acknowledged while its run streamed
    broker = redis.Redis.from_url(celery_settings.conf.broker_url)
    assert broker.llen("celery") == 0
    assert broker.hlen("unacked") == 0
    handed_over = re.findall(r"execute_run\[[^\]]+\] succeeded in [\d.]+s: 'running'", worker.log())
    assert len(handed_over) == 3


def test_a_worker_holds_at_most_worker_max_runs(celery_settings, workers, slow_fake):
    """``WORKER_MAX_RUNS`` bounds what one process streams: the third run waits for a place."""
    _worker, most = _stream_side_by_side(workers, slow_fake, count=3, max_runs=2)
    assert most == 2


def _received(worker: Worker) -> int:
    """How many messages of the run task ``worker`` received (its log's lines)."""
    return len(re.findall(r"execute_run\[[^\]]+\] received", worker.log()))


def _held_in_backoff(fake: FakeProviderServer, seconds: float) -> Run:
    """A run its worker holds for ``seconds`` without streaming: cut, then waiting out its backoff."""
    fake.set_faults("default", ["cut:bytes=900"])  # the first request only
    run = lifecycle.create_run(
        prompt="Short [[words=80]]",
        provider="fake",
        model="fake-claude",
        engine={"backoff_schedule": [seconds], "backoff_scale": 1.0},
    )
    dispatch.enqueue_run(run)
    wait_for(lambda: status_of(run.pk) == "recovering", what="the first run's backoff")
    return run


def test_a_full_worker_hands_a_run_it_cannot_start_to_a_worker_with_room(celery_settings, workers, slow_fake):
    """A worker holding ``WORKER_MAX_RUNS`` runs takes the next run's message (nothing else takes
    it), then a worker with room starts: the run starts there within seconds instead of waiting
    for the full worker's run to end, once, with its uninterrupted answer."""
    full = workers("w1", max_runs=1)
    busy = _held_in_backoff(slow_fake, seconds=300)
    prompt = "A short tale [[words=40]]"
    waiting = lifecycle.create_run(prompt=prompt, provider="fake", model="fake-claude")
    dispatch.enqueue_run(waiting)
    wait_for(lambda: _received(full) >= 2, what="the full worker to take the second message")
    roomy = workers("w2")
    ready = time.monotonic()
    try:
        wait_for(lambda: status_of(waiting.pk) in Run.TERMINAL_STATUSES, timeout=30, what="the second run to end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{full.log()}\n{roomy.log()}") from exc
    assert time.monotonic() - ready < 30
    waiting.refresh_from_db()
    assert waiting.status == "completed", roomy.log()
    assert waiting.worker.endswith(str(roomy.process.pid))
    assert waiting.claims == 1
    assert assistant_text(waiting) == reference_text(slow_fake, prompt)
    busy.refresh_from_db()
    assert (busy.status, busy.claims) == ("recovering", 1)  # the full worker's run went on, untouched
    assert busy.worker.endswith(str(full.process.pid))
    assert lifecycle.request_cancel(busy.pk)
    wait_for(lambda: status_of(busy.pk) == "cancelled", timeout=30, what="the first run's cancel")


def test_a_lone_full_worker_starts_the_run_it_handed_back_once_it_has_room(celery_settings, workers, slow_fake):
    """With no other worker, the run a full worker handed back comes back to it, paced by the
    wait (not a spin), and starts once the held run ends: never lost, claimed once."""
    worker = workers("w1", max_runs=1)
    busy = _held_in_backoff(slow_fake, seconds=10)
    began = time.monotonic()
    prompt = "A short tale [[words=40]]"
    waiting = lifecycle.create_run(prompt=prompt, provider="fake", model="fake-claude")
    dispatch.enqueue_run(waiting)
    wait_for(lambda: status_of(waiting.pk) in Run.TERMINAL_STATUSES, timeout=120, what="the second run to end")
    elapsed = time.monotonic() - began
    busy.refresh_from_db()
    waiting.refresh_from_db()
    assert (busy.status, waiting.status) == ("completed", "completed"), worker.log()
    assert (busy.claims, waiting.claims) == (1, 1)
    assert assistant_text(waiting) == reference_text(slow_fake, prompt)
    handed_back = re.findall(r"execute_run\[[^\]]+\] succeeded in [\d.]+s: 'handed_back'", worker.log())
    assert 1 <= len(handed_back) <= elapsed / 3.0 + 1  # one per wait (WORKER_FULL_WAIT_SECONDS, 3 s) at most


def test_a_warm_shutdown_lets_the_runs_it_holds_end(celery_settings, workers, slow_fake):
    """SIGTERM (Celery's warm shutdown) while a run streams: the process exits only after the
    run ended, complete, on its one claim; nothing is left to resume."""
    worker = workers("w1")
    run = lifecycle.create_run(prompt=LONG, provider="fake", model="fake-claude")
    dispatch.enqueue_run(run)
    wait_for(lambda: Attempt.objects.filter(run=run).exists(), what="the run's first request")
    worker.process.terminate()
    assert worker.process.wait(timeout=90) == 0, worker.log()
    run.refresh_from_db()
    assert run.status == "completed", worker.log()
    assert run.claims == 1
    assert assistant_text(run) == reference_text(slow_fake, LONG)
    assert "worker_draining_runs" in worker.log()


@pytest.mark.parametrize("full_wait", [3.0, None], ids=["default-wait", "wait-forever"])
def test_a_warm_shutdown_hands_a_waiting_run_back_at_once_and_starts_none(
    celery_settings, workers, slow_fake, full_wait
):
    """SIGTERM to a full worker while a run's task waits there for a place: the task sends the run
    back to the queue at once (not after ``WORKER_FULL_WAIT_SECONDS``, nor, waiting for ever, take
    the place the held run frees and start it in a process shutting down). The worker exits once
    its held run ended, and another worker executes the waiting run, once."""
    full = workers("w1", max_runs=1, full_wait=full_wait)
    busy = _held_in_backoff(slow_fake, seconds=6)
    prompt = "A short tale [[words=40]]"
    waiting = lifecycle.create_run(prompt=prompt, provider="fake", model="fake-claude")
    dispatch.enqueue_run(waiting)
    wait_for(lambda: _received(full) >= 2, what="the full worker to take the second message")
    full.process.terminate()
    roomy = workers("w2")
    assert full.process.wait(timeout=90) == 0, full.log()
    busy.refresh_from_db()
    assert (busy.status, busy.claims) == ("completed", 1), full.log()  # the held run ended first
    assert busy.worker.endswith(str(full.process.pid))
    # the waiting task returned within moments of the signal, its message queued again
    handed_back = re.findall(r"execute_run\[[^\]]+\] succeeded in ([\d.]+)s: 'handed_back'", full.log())
    assert handed_back, full.log()
    assert all(float(seconds) < 2.0 for seconds in handed_back), handed_back
    try:
        wait_for(lambda: status_of(waiting.pk) in Run.TERMINAL_STATUSES, timeout=60, what="the waiting run to end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{full.log()}\n{roomy.log()}") from exc
    waiting.refresh_from_db()
    assert waiting.status == "completed", roomy.log()
    assert waiting.worker.endswith(str(roomy.process.pid)), full.log()  # not started by the worker shutting down
    assert waiting.claims == 1
    assert assistant_text(waiting) == reference_text(slow_fake, prompt)


def _kill_worker_mid_stream(workers: Any, owner: Any = None) -> tuple[Run, RedisCheckpointStore, str]:
    """A long run started on worker ``w1``, which is killed (-9) once its checkpoint holds text:
    the run, the checkpoint store and the text the last checkpoint kept."""
    first = workers("w1")
    run = lifecycle.create_run(prompt=LONG, provider="fake", model="fake-claude", owner=owner)
    dispatch.enqueue_run(run)
    store = RedisCheckpointStore(app_settings.REDIS_URL, ttl_s=3600)

    def checkpoint_text() -> str:
        checkpoint = asyncio.run(store.get(str(run.pk)))
        return checkpoint.blocks[0]["text"] if checkpoint and checkpoint.blocks else ""

    try:
        wait_for(lambda: len(checkpoint_text()) > 300, timeout=120, what="a checkpoint with text")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{first.log()}") from exc
    first.kill()  # kill -9 in the middle of the stream
    return run, store, checkpoint_text()


def test_killed_worker_run_is_resumed_from_its_checkpoint_by_another_worker(celery_settings, workers, slow_fake):
    run, store, saved = _kill_worker_mid_stream(workers)
    assert status_of(run.pk) == "running"

    second = workers("w2")
    time.sleep(2.2)  # the heartbeat goes stale
    assert dispatch.sweep_stale_runs() == [str(run.pk)]
    wait_for(lambda: status_of(run.pk) in Run.TERMINAL_STATUSES, timeout=90, what="the resumed run to finish")
    run.refresh_from_db()
    assert run.status == "completed", second.log()
    assert run.worker.endswith(str(second.process.pid))
    assert run.claims == 2
    # the committed answer equals the uninterrupted one
    assert assistant_text(run) == reference_text(slow_fake, LONG)
    # the second worker's request continued the prefix (prefill) instead of regenerating it
    requests = slow_fake.log_for("default")  # the workers' calls (the reference used its own scenario)
    assert [e.understood_as for e in requests] == ["fresh", "prefill"]
    resumed = requests[-1]
    assert resumed.understood_as == "prefill"
    assert resumed.prefix_matched is True
    assert resumed.prefix_chars >= len(saved.rstrip()) > 0
    # the resume spent no continuation budget
    kinds = list(Attempt.objects.filter(run=run).order_by("index").values_list("kind", flat=True))
    assert kinds == ["initial", "resume"]
    assert RecoveryEvent.objects.filter(run=run, name="llm_run_resumed").count() == 1
    assert not RecoveryEvent.objects.filter(run=run, name="llm_stream_continuation_started").exists()
    assert asyncio.run(store.get(str(run.pk))) is None


def test_killed_worker_background_response_is_reattached_by_another_worker(celery_settings, workers, slow_fake):
    """Native resume across a killed worker: the second worker re-attaches to the same
    Responses background response with ``starting_after`` = the checkpoint's cursor, the
    answer is byte for byte the uninterrupted one, and one generation was billed."""
    first = workers("w1")
    prompt = "Tell me a long story about a harbour [[words=300]]"
    run = lifecycle.create_run(prompt=prompt, provider="fake-responses", model="gpt-4o")
    dispatch.enqueue_run(run)
    store = RedisCheckpointStore(app_settings.REDIS_URL, ttl_s=3600)

    def checkpoint():
        found = asyncio.run(store.get(str(run.pk)))
        text = found.blocks[0]["text"] if found and found.blocks else ""
        return found if found is not None and found.native and len(text) > 200 else None

    try:
        wait_for(checkpoint, timeout=120, what="a checkpoint with text and a resume point")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{first.log()}") from exc
    first.kill()  # kill -9 in the middle of the stream
    assert status_of(run.pk) == "running"

    second = workers("w2")
    time.sleep(2.2)  # the heartbeat goes stale
    saved = asyncio.run(store.get(str(run.pk)))  # the last checkpoint the first worker wrote
    assert saved is not None
    assert saved.native is not None
    assert dispatch.sweep_stale_runs() == [str(run.pk)]
    wait_for(lambda: status_of(run.pk) in Run.TERMINAL_STATUSES, timeout=90, what="the resumed run to finish")
    run.refresh_from_db()
    assert run.status == "completed", second.log()
    assert run.worker.endswith(str(second.process.pid))
    reference = asyncio.run(run_engine(slow_fake, prompt, wire="openai-responses", model="gpt-4o", max_tokens=1024))
    assert assistant_text(run) == reference.assistant[0]["content"][0]["text"]
    requests = slow_fake.log_for("default")  # the workers' calls
    assert [(e.method, e.understood_as) for e in requests] == [("POST", "fresh"), ("GET", "resume")]
    response_id = saved.native["response_id"]
    assert requests[1].path == f"/v1/responses/{response_id}"
    attempts = list(Attempt.objects.filter(run=run).order_by("index"))
    assert [a.kind for a in attempts] == ["initial", "native_resume"]
    assert attempts[1].request["url"].endswith(f"?stream=true&starting_after={saved.native['after']}")
    assert attempts[1].request["method"] == "GET"
    # one generation billed, and the attempts' usage adds up to one answer
    assert sum(e.billed_output_tokens for e in requests) == requests[0].output_tokens > 0
    assert sum(a.output_tokens or 0 for a in attempts) == requests[0].output_tokens
    assert RecoveryEvent.objects.filter(run=run, name="llm_run_resumed").get().payload["plan"] == "native_resume"
    assert "sk-fake-worker-key" not in second.log()


def test_cancel_reaches_a_streaming_worker(celery_settings, workers, slow_fake):
    worker = workers("w1")
    slow_fake.set_faults("default", ["stall:events=30,seconds=30"])
    run = lifecycle.create_run(prompt=LONG, provider="fake", model="fake-claude")
    dispatch.enqueue_run(run)
    wait_for(lambda: Attempt.objects.filter(run=run).exists(), what="the first provider call")
    time.sleep(0.5)
    started = time.monotonic()
    assert lifecycle.request_cancel(run.pk, "user pressed stop")
    wait_for(lambda: status_of(run.pk) == "cancelled", timeout=10, what="the cancel")
    assert time.monotonic() - started < 5, worker.log()
    assert Attempt.objects.filter(run=run).count() == 1
    assert not RecoveryEvent.objects.filter(run=run, name="llm_stream_continuation_started").exists()


def test_cancel_during_backoff_beats_the_continuation(celery_settings, workers, slow_fake):
    workers("w1")
    slow_fake.set_faults("default", ["cut:bytes=900"])
    run = lifecycle.create_run(
        prompt="Short [[words=80]]",
        provider="fake",
        model="fake-claude",
        engine={"backoff_schedule": [30], "backoff_scale": 1.0},
    )
    dispatch.enqueue_run(run)
    wait_for(lambda: status_of(run.pk) == "recovering", what="the interruption")
    assert lifecycle.request_cancel(run.pk)
    wait_for(lambda: status_of(run.pk) == "cancelled", timeout=10, what="the cancel during backoff")
    assert Attempt.objects.filter(run=run).count() == 1  # the continuation never went out


def test_a_run_claimed_too_often_fails_and_its_message_is_acknowledged(celery_settings, workers):
    worker = workers("w1")
    run = lifecycle.create_run(prompt="Poison [[words=10]]", provider="fake", model="fake-claude")
    Run.objects.filter(pk=run.pk).update(claims=app_settings.MAX_CLAIMS)
    dispatch.enqueue_run(run)
    wait_for(lambda: status_of(run.pk) == "failed", what="the poison run to fail")
    run.refresh_from_db()
    assert run.error_kind == "too_many_claims"
    assert not Attempt.objects.filter(run=run).exists()
    # acknowledged: nothing left in the queue or unacked, and the worker takes the next run
    broker = redis.Redis.from_url(celery_settings.conf.broker_url)
    wait_for(lambda: broker.llen("celery") == 0 and broker.hlen("unacked") == 0, timeout=10, what="the ack")
    healthy = lifecycle.create_run(prompt="Fine [[words=10]]", provider="fake", model="fake-claude")
    dispatch.enqueue_run(healthy)
    wait_for(lambda: status_of(healthy.pk) == "completed", what="the next run"), worker.log()


def test_command_line_enqueue_hands_the_run_to_a_worker(celery_settings, workers, slow_fake):
    import io
    import json

    from django.core.management import call_command

    worker = workers("w1")
    slow_fake.set_faults("default", ["cut:bytes=900"])
    out = io.StringIO()
    call_command(
        "streamrecover_run", "--provider", "fake", "--model", "fake-claude", "--prompt", "Hi [[words=40]]",
        "--enqueue", "--json", stdout=out,
    )  # fmt: skip
    doc = json.loads(out.getvalue())
    assert doc["status"] == "completed", worker.log()
    run = Run.objects.get(pk=doc["run_id"])
    assert run.worker.endswith(str(worker.process.pid))
    assert [a["kind"] for a in doc["attempts"]] == ["initial", "continuation"]
    assert doc["messages"][-1]["role"] == "assistant"
    assert "llm_stream_interrupted" in [e["event"] for e in doc["events"]]


def test_cancel_command_cancels_a_queued_run(celery_settings):
    import io

    from django.core.management import call_command

    run = lifecycle.create_run(prompt="never started", provider="fake", model="fake-claude")
    call_command("streamrecover_cancel", str(run.pk), stdout=io.StringIO())
    assert status_of(run.pk) == "cancelled"


def test_a_run_cancelled_in_the_queue_after_its_worker_died_ends_cancelled_at_once(celery_settings, workers, slow_fake):
    """Its worker is killed mid-answer, the sweep puts it back in the queue, and its user presses
    stop before any worker is free to claim it. The cancel left it ``queued`` (its snapshot and its
    clients said so) until some worker took its message. Now the cancelling process ends it there
    and then: ``cancelled``, with the text its client was shown committed, and told to a client
    watching it; the worker that takes its message later runs nothing."""
    from asgiref.sync import sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.test import Client

    from project.asgi import application
    from streamrecover.testing.client import ClientView

    from .factories import make_user

    owner = make_user()
    run, _, saved = _kill_worker_mid_stream(workers, owner=owner)  # no worker is left
    time.sleep(2.2)  # the heartbeat goes stale
    assert dispatch.sweep_stale_runs() == [str(run.pk)]
    assert status_of(run.pk) == "queued"
    calls = len(slow_fake.log_for("default"))
    browser = Client()
    browser.force_login(owner)
    cookie = f"sessionid={browser.cookies['sessionid'].value}".encode()

    async def watch_the_cancel() -> list[dict]:
        headers = [(b"origin", b"http://testserver"), (b"cookie", cookie)]
        ws = WebsocketCommunicator(application, f"/ws/streamrecover/runs/{run.pk}/", headers=headers)
        assert (await ws.connect(timeout=10))[0]
        frames = [await ws.receive_json_from(timeout=10)]  # the snapshot
        assert await sync_to_async(lifecycle.request_cancel)(run.pk, "user pressed stop")
        try:
            while not (frames[-1]["type"] in ("run_status", "snapshot") and frames[-1]["status"] == "cancelled"):
                frames.append(await ws.receive_json_from(timeout=10))
        finally:
            await ws.disconnect()
        return frames

    frames = asyncio.run(watch_the_cancel())
    assert frames[0]["type"] == "snapshot"
    wait_for(lambda: status_of(run.pk) == "cancelled", timeout=10, what="the cancel")
    view = ClientView().apply_all(frames)
    assert (view.status, view.error) == ("cancelled", {"kind": "cancel", "message": "user pressed stop"})
    assert [m["role"] for m in view.messages] == ["user", "assistant"]
    shown = view.messages[1]["content"]
    assert [b["type"] for b in shown] == ["text"]
    assert shown[0]["text"].startswith(saved.rstrip()[:300])  # what its client was shown, kept
    assert Message.objects.get(thread=run.thread, role="assistant").content == shown
    assert view.turns == [(shown, shown)]  # it rebuilt exactly what was committed
    assert len(slow_fake.log_for("default")) == calls  # nothing asked of the provider
    run.refresh_from_db()
    claims = run.claims

    second = workers("w2")  # takes the messages that queued it: it runs nothing
    wait_for(lambda: "streamrecover.execute_run" in second.log() and "succeeded" in second.log(), what="the message")
    run.refresh_from_db()
    assert (run.status, run.claims) == ("cancelled", claims)
    assert len(slow_fake.log_for("default")) == calls
    assert Message.objects.filter(thread=run.thread).count() == 2
