"""The runs package and the code that starts work above it: the lifecycle changes state and
starts nothing, ``dispatch`` starts what it is told to, ``execute_run`` opens the live channel
it is handed only for a claimed run. That ``runs/`` imports nothing above it is checked with every
other layer in ``tests/test_architecture.py``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from streamrecover import dispatch, tasks
from streamrecover.engine.sink import CollectingSink
from streamrecover.models import Attempt, Message, Run
from streamrecover.runs import execution, lifecycle

from .factories import make_attempt, make_message, make_run, make_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def started(monkeypatch) -> list[str]:
    """Run ids the in-process starter was asked to start (nothing really starts)."""
    calls: list[str] = []
    monkeypatch.setattr(dispatch, "start_in_thread", lambda run_id: calls.append(run_id))
    return calls


def _stale_run() -> Run:
    long_ago = timezone.now() - timedelta(minutes=10)
    return make_run(status=Run.Status.RUNNING, worker="gone:1", heartbeat_at=long_ago, started_at=long_ago)


def test_lifecycle_requeue_changes_state_and_starts_nothing(started, django_capture_on_commit_callbacks):
    run = make_run(status=Run.Status.FAILED, claims=3, error_kind="boom", finished_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert lifecycle.requeue_run(run.pk)
    assert callbacks == []
    assert started == []
    run.refresh_from_db()
    assert (run.status, run.claims, run.error_kind, run.finished_at) == (Run.Status.QUEUED, 0, "", None)
    assert not lifecycle.requeue_run(run.pk)  # already queued: nothing changes


def test_lifecycle_sweep_returns_what_it_requeued_and_starts_nothing(started, django_capture_on_commit_callbacks):
    stale, alive = _stale_run(), make_run(status=Run.Status.RUNNING, worker="here:1", heartbeat_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert lifecycle.sweep_stale_runs() == [str(stale.pk)]
    assert callbacks == []
    assert started == []
    assert Run.objects.get(pk=stale.pk).status == Run.Status.QUEUED
    assert Run.objects.get(pk=alive.pk).status == Run.Status.RUNNING


def test_dispatch_requeue_and_sweep_start_what_the_lifecycle_put_back(started):
    failed = make_run(status=Run.Status.EXHAUSTED, finished_at=timezone.now())
    completed = make_run(status=Run.Status.COMPLETED, finished_at=timezone.now())
    stale = _stale_run()
    assert dispatch.requeue_run(failed.pk)
    assert not dispatch.requeue_run(completed.pk)
    assert dispatch.sweep_stale_runs() == [str(stale.pk)]
    assert started == [str(failed.pk), str(stale.pk)]


def test_enqueue_run_hands_the_run_to_celery_after_commit(settings, monkeypatch):
    delayed: list[str] = []
    monkeypatch.setattr(tasks.execute_run_task, "delay", lambda run_id: delayed.append(run_id))
    run = make_run()
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "EXECUTION": "celery"}), transaction.atomic():
        dispatch.enqueue_run(run)
        assert delayed == []  # not before the commit
    assert delayed == [str(run.pk)]


def test_enqueue_run_starts_a_thread_in_process(started):
    run = make_run()
    dispatch.enqueue_run(run.pk)  # autocommit: at once
    assert started == [str(run.pk)]


def test_one_active_run_per_thread_is_the_lifecycles_rule():
    first = lifecycle.create_run(prompt="Hello")
    with pytest.raises(lifecycle.ThreadBusy):
        lifecycle.create_run(prompt="Again", thread=first.thread)
    assert Run.objects.filter(thread=first.thread).count() == 1
    assert Message.objects.filter(thread=first.thread).count() == 1
    lifecycle.request_cancel(first.pk)  # queued: cancelled at once, the thread is free again
    second = lifecycle.create_run(prompt="Again", thread=first.thread)
    assert Message.objects.of_thread(first.thread_id).canonical()[-1]["content"][-1]["text"] == "Again"
    assert second.status == Run.Status.QUEUED


class RecordingLive:
    """A live sink whose opener records when it was opened and closed, and what it saw."""

    def __init__(self, last_seq: int = 0) -> None:
        self.last_seq = last_seq
        self.frames: list[dict[str, Any]] = []
        self.log: list[str] = []

    @contextlib.asynccontextmanager
    async def open(self, run_id: str) -> AsyncIterator[RecordingLive]:
        status = await Run.objects.filter(pk=run_id).values_list("status", flat=True).aget()
        self.log.append(f"open:{status}")
        yield self
        status = await Run.objects.filter(pk=run_id).values_list("status", flat=True).aget()
        self.log.append(f"close:{status}")

    async def on_event(self, event: Any) -> None:
        return None

    async def on_attempt(self, attempt: Any) -> None:
        return None

    async def on_frame(self, frame: dict[str, Any]) -> None:
        self.frames.append(frame)

    async def on_message(self, message: dict[str, Any], position: int) -> None:
        return None


def test_execute_run_opens_the_live_channel_of_a_claimed_run_and_numbers_on_from_it():
    live = RecordingLive(last_seq=100)
    collected = CollectingSink()
    run = lifecycle.create_run(prompt="Tell me a story [[words=40]]", faults=["cut:bytes=400"])
    result = asyncio.run(execution.execute_run(str(run.pk), live=live.open, extra_sinks=[collected]))
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    # closed after the end is stored (with the answer, in one transaction): the client is told
    # "completed" only once it is so in the database
    assert live.log == ["open:running", "close:completed"]
    assert live.frames == collected.frames
    # numbered on from the channel's last frame, one seq left out: a run taken over from another
    # worker shows its clients a gap, so each takes a snapshot of what that worker committed
    assert live.frames[0]["seq"] == 102
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
    assert Attempt.objects.of_run(run.pk).count() == 2

    again = RecordingLive()
    assert asyncio.run(execution.execute_run(str(run.pk), live=again.open)) is None  # terminal: not claimed
    assert again.log == []


def test_a_reclaimed_run_leaves_a_seq_out_even_when_redis_kept_nothing_of_it():
    """A run taken over from a worker that died, on a Redis that lost its data (restarted):
    no checkpoint, no frame kept, the channel's last seq 0. Its first frame still leaves one seq
    out, so a client that watched since before (a snapshot at seq 0, then nothing: the earlier
    claim's frames were lost with Redis) sees a gap and takes a snapshot of what that claim
    committed, instead of taking these frames as the next ones."""
    run = lifecycle.create_run(prompt="Tell me a story [[words=20]]")
    Run.objects.filter(pk=run.pk).update(claim_epoch=1)  # claimed once before, then put back
    live = RecordingLive()
    result = asyncio.run(execution.execute_run(str(run.pk), live=live.open))
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    assert Run.objects.get(pk=run.pk).claim_epoch == 2
    assert live.frames[0]["seq"] == 2
    first = lifecycle.create_run(prompt="Tell me a story [[words=20]]")
    fresh = RecordingLive()
    asyncio.run(execution.execute_run(str(first.pk), live=fresh.open))
    assert fresh.frames[0]["seq"] == 1  # a first claim: nothing was streamed before, no gap


def test_execute_run_without_a_live_channel_still_records_the_run():
    run = lifecycle.create_run(prompt="Hi [[words=10]]")
    result = asyncio.run(execution.execute_run(str(run.pk)))
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    assert [m["role"] for m in Message.objects.of_thread(run.thread_id).canonical()] == ["user", "assistant"]


def test_message_and_attempt_queries():
    thread = make_thread()
    second = make_message(thread, position=1, role="assistant", content=[{"type": "text", "text": "b"}])
    first = make_message(thread, position=0, content=[{"type": "text", "text": "a"}])
    assert list(Message.objects.of_thread(thread.pk)) == [first, second]
    assert Message.objects.of_thread(thread.pk).canonical() == [first.as_canonical(), second.as_canonical()]
    run = make_run()
    later, earlier = make_attempt(run, index=1), make_attempt(run, index=0)
    assert list(Attempt.objects.of_run(run.pk)) == [earlier, later]
