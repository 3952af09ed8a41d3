"""The sweeper leaves nothing behind: checkpoints whose run is settled (a delete that failed
while the store was unreachable), runs left ``queued`` that no worker claimed, and in the
one-process mode runs whose thread died with the server (issue 10, "checkpoints outliving
their run" and "runs that never run")."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management import call_command
from django.db import OperationalError
from django.test import override_settings
from django.utils import timezone

from streamrecover import dispatch, tasks
from streamrecover.engine.checkpoint import CheckpointWriter, CoalescePolicy
from streamrecover.models import Run, StreamCheckpoint
from streamrecover.runs import checkpoints as checkpoint_module
from streamrecover.runs import lifecycle
from streamrecover.runs.checkpoints import DjangoCheckpointStore, RedisCheckpointStore

from .factories import make_checkpoint, make_run

pytestmark = pytest.mark.django_db(transaction=True)

DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1 (as in test_stores.py)
LONG_AGO = timedelta(hours=1)


def _running_run() -> Run:
    return make_run(status=Run.Status.RUNNING, worker="here:1", heartbeat_at=timezone.now())


def _failing_writer(store: Any) -> tuple[CheckpointWriter, list[str]]:
    reported: list[str] = []
    return CheckpointWriter(store, CoalescePolicy(), on_error=lambda name, exc: reported.append(name)), reported


# ---- checkpoints outliving their run ------------------------------------------------------


@pytest.fixture
async def redis_checkpoints(monkeypatch) -> AsyncIterator[RedisCheckpointStore]:
    """The configured store is Redis (the real one, under a prefix of the test's own); what the
    test wrote is removed after."""
    store = RedisCheckpointStore(settings.REDIS_URL, ttl_s=60, prefix=f"streamrecover:test:{uuid.uuid4().hex}:")
    monkeypatch.setattr(checkpoint_module, "checkpoint_store_from_settings", lambda: store)
    yield store
    client = store._redis()
    async for key in client.scan_iter(match=f"{store.prefix}*"):
        await client.delete(key)
    await store.aclose()


async def test_a_redis_checkpoint_whose_delete_failed_is_deleted_by_the_sweep(redis_checkpoints) -> None:
    live = redis_checkpoints
    ended, going = await sync_to_async(_running_run)(), await sync_to_async(_running_run)()
    await live.put(make_checkpoint(str(ended.pk)))
    await live.put(make_checkpoint(str(going.pk)))

    # The run ends while Redis is unreachable: the delete fails (retried, then logged).
    dead = RedisCheckpointStore(DEAD_REDIS, ttl_s=60, prefix=live.prefix)
    writer, reported = _failing_writer(dead)
    await writer.delete(str(ended.pk))
    await dead.aclose()
    assert reported == ["checkpoint_delete_failed"]
    await sync_to_async(lifecycle.finish)(str(ended.pk), Run.Status.COMPLETED)
    assert await live.get(str(ended.pk)) is not None  # left behind

    # Redis is back: the sweep deletes the settled run's checkpoint, not the running one's.
    assert await sync_to_async(lifecycle.sweep_stale_runs)() == []
    assert await live.get(str(ended.pk)) is None
    assert await live.get(str(going.pk)) is not None
    client = live._redis()
    assert {m.decode() for m in await client.smembers(live.index_key)} == {str(going.pk)}

    # The running run's own delete removes its index entry too: nothing is left at all.
    await live.delete(str(going.pk))
    assert [key async for key in client.scan_iter(match=f"{live.prefix}*")] == []


async def test_a_redis_delete_survives_an_outage_of_a_moment(redis_checkpoints, monkeypatch) -> None:
    live = redis_checkpoints
    run = await sync_to_async(_running_run)()
    await live.put(make_checkpoint(str(run.pk)))
    flaky = RedisCheckpointStore(DEAD_REDIS, ttl_s=60, prefix=live.prefix)
    real_sleep = asyncio.sleep
    waits: list[float] = []

    async def redis_comes_back(delay: float) -> None:
        waits.append(delay)
        flaky.url, flaky._client = settings.REDIS_URL, None  # reachable on the next try
        await real_sleep(0)

    monkeypatch.setattr(checkpoint_module.asyncio, "sleep", redis_comes_back)
    await flaky.delete(str(run.pk))  # does not raise: the retry went through
    await flaky.aclose()
    assert len(waits) == 1
    assert await live.get(str(run.pk)) is None


class _UnreachableDatabaseStore(DjangoCheckpointStore):
    async def delete(self, run_id: str) -> None:
        raise OperationalError("server closed the connection unexpectedly")


async def test_an_orm_checkpoint_whose_delete_failed_is_deleted_by_the_sweep() -> None:
    store = DjangoCheckpointStore(ttl_s=60)
    ended, going = await sync_to_async(_running_run)(), await sync_to_async(_running_run)()
    await store.put(make_checkpoint(str(ended.pk)))
    await store.put(make_checkpoint(str(going.pk)))
    writer, reported = _failing_writer(_UnreachableDatabaseStore(ttl_s=60))
    await writer.delete(str(ended.pk))
    assert reported == ["checkpoint_delete_failed"]
    await sync_to_async(lifecycle.finish)(str(ended.pk), Run.Status.FAILED, "boom")

    assert await sync_to_async(lifecycle.sweep_stale_runs)() == []
    rows = await sync_to_async(lambda: set(StreamCheckpoint.objects.values_list("run_id", flat=True)))()
    assert rows == {going.pk}


def test_a_sweep_with_the_store_down_still_hands_runs_back(monkeypatch) -> None:
    stale = make_run(status=Run.Status.RUNNING, worker="gone:1", heartbeat_at=timezone.now() - LONG_AGO)
    started: list[str] = []
    monkeypatch.setattr(dispatch, "start_in_thread", started.append)
    with override_settings(
        STREAMRECOVER={**settings.STREAMRECOVER, "CHECKPOINT_STORE": "redis", "REDIS_URL": DEAD_REDIS}
    ):
        assert dispatch.sweep_stale_runs() == [str(stale.pk)]
    assert started == [str(stale.pk)]


# ---- runs that never run ------------------------------------------------------------------


def _queued(age: timedelta, prompt: str = "Hello") -> Run:
    run = lifecycle.create_run(prompt=prompt, provider="fake", model="fake-claude")
    Run.objects.filter(pk=run.pk).update(created=timezone.now() - age)
    return Run.objects.get(pk=run.pk)


def test_a_run_queued_long_ago_is_handed_out_again_once_per_window(monkeypatch) -> None:
    started: list[str] = []
    monkeypatch.setattr(dispatch, "start_in_thread", started.append)
    old, fresh = _queued(LONG_AGO), _queued(timedelta(seconds=1), "Fresh")
    assert dispatch.sweep_stale_runs() == [str(old.pk)]
    assert started == [str(old.pk)]
    # Marked as queued now: the next sweeps leave it to the worker it was just handed to ...
    assert dispatch.sweep_stale_runs() == []
    # ... until it waited the whole window again (its message lost a second time).
    Run.objects.filter(pk=old.pk).update(heartbeat_at=timezone.now() - LONG_AGO)
    assert dispatch.sweep_stale_runs() == [str(old.pk)]
    assert Run.objects.get(pk=fresh.pk).status == Run.Status.QUEUED
    assert str(fresh.pk) not in started


def test_the_celery_sweep_task_hands_long_queued_runs_to_the_workers(monkeypatch) -> None:
    delayed: list[str] = []
    monkeypatch.setattr(tasks.execute_run_task, "delay", delayed.append)
    old, _fresh = _queued(LONG_AGO), _queued(timedelta(seconds=1), "Fresh")
    assert tasks.sweep_stale_runs_task() == [str(old.pk)]
    assert delayed == [str(old.pk)]


def test_a_requeued_run_is_not_taken_for_a_lost_one(monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "start_in_thread", lambda run_id: None)
    run = _queued(LONG_AGO)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED, finished_at=timezone.now())
    assert lifecycle.requeue_run(run.pk)  # queued again just now, though created long ago
    assert lifecycle.sweep_stale_runs() == []


def test_the_one_process_sweep_command_executes_the_swept_runs_to_their_end() -> None:
    """A server restart left one run ``running`` (its thread is gone) and one ``queued``; the
    command executes both in its own process and returns only when they are done."""
    assert settings.STREAMRECOVER["EXECUTION"] == "inprocess"
    died = _queued(LONG_AGO, "Died with the server")
    Run.objects.filter(pk=died.pk).update(
        status=Run.Status.RUNNING, worker="old-server:1", claims=1, heartbeat_at=timezone.now() - LONG_AGO
    )
    lost, fresh = _queued(LONG_AGO, "Never claimed"), _queued(timedelta(seconds=1), "Just queued")
    out = StringIO()
    call_command("streamrecover_sweep", stdout=out, stderr=StringIO())
    assert Run.objects.get(pk=died.pk).status == Run.Status.COMPLETED, out.getvalue()
    assert Run.objects.get(pk=lost.pk).status == Run.Status.COMPLETED, out.getvalue()
    assert Run.objects.get(pk=fresh.pk).status == Run.Status.QUEUED  # a live server's to start
    assert f"{died.pk}: completed" in out.getvalue()
    assert lifecycle.sweep_stale_runs() == []  # nothing left for a next sweep


def test_a_sweep_with_no_wait_hands_a_stale_run_out_once() -> None:
    """``streamrecover_sweep --seconds 0 --queued-seconds 0`` (``make demo`` at start): the stale run
    it had just put back in the queue was taken again as a queued one, listed and started twice."""
    died = _queued(LONG_AGO, "Died with the server")
    Run.objects.filter(pk=died.pk).update(
        status=Run.Status.RUNNING, worker="old-server:1", claims=1, heartbeat_at=timezone.now()
    )
    lost = _queued(LONG_AGO, "Never claimed")
    assert sorted(lifecycle.sweep_stale_runs(0, 0)) == sorted([str(died.pk), str(lost.pk)])
