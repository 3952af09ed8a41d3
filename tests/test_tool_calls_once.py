"""A tool call is executed at most once per committed call (issue 10).

Its result is stored before the run goes on; a run claimed again after the worker died reuses
a stored result instead of calling the tool a second time. When the worker dies during the
call, nothing is stored and the call is made again: the tool gets the same idempotency key
both times, to recognise it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from streamrecover.engine.agent import Tool, ToolRegistry
from streamrecover.engine.toolresults import ToolCallContext
from streamrecover.models import Message, Run, ToolCallResult
from streamrecover.runs import execution, lifecycle
from streamrecover.runs.toolresults import DjangoToolResultStore
from streamrecover.testing.tools import WEATHER_SCHEMA, get_weather

from .factories import tool_results

pytestmark = pytest.mark.django_db(transaction=True)

MODELS = {"openai": "gpt-4o", "anthropic": "claude-3-7-sonnet"}
WEATHER = "Weather in Lisbon? [[words=20]] [[tool=get_weather]]"


class WorkerDied(BaseException):
    """Where the test kills the worker: nothing after it runs (a BaseException, like a kill)."""


def _release_orm_thread() -> None:
    asyncio.run(sync_to_async(connections.close_all)())


def _dead_worker_left(run: Run) -> None:
    """What the sweeper does with the run of a worker that died: back in the queue."""
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.QUEUED, worker="", heartbeat_at=timezone.now() - timedelta(minutes=10)
    )


class _Booking:
    """A tool with a side effect (a booking per call), told the call's idempotency key."""

    def __init__(self, die_during_first_call: bool = False) -> None:
        self.keys: list[str] = []
        self.bookings = 0
        self.die_during_first_call = die_during_first_call

    def __call__(self, args: dict[str, Any], context: ToolCallContext) -> dict[str, Any]:
        self.keys.append(context.idempotency_key)
        if self.die_during_first_call and len(self.keys) == 1:
            raise WorkerDied("the worker died during the call")
        self.bookings += 1
        return get_weather(args)

    def registry(self) -> ToolRegistry:
        return ToolRegistry([Tool("get_weather", "Get the current weather for a city.", WEATHER_SCHEMA, self)])


@pytest.mark.parametrize("wire", sorted(MODELS))
def test_a_worker_dying_after_the_tool_ran_leaves_its_result_to_the_next_one(wire, monkeypatch):
    class DiesOnceStored(DjangoToolResultStore):
        async def put(self, run_id: str, position: int, tool_call_id: str, result: dict[str, Any]) -> None:
            await super().put(run_id, position, tool_call_id, result)
            raise WorkerDied("the worker died after storing the result")

    tool = _Booking()
    run = lifecycle.create_run(prompt=WEATHER, model=MODELS[wire])
    monkeypatch.setattr(execution, "DjangoToolResultStore", DiesOnceStored)
    with pytest.raises(WorkerDied):
        asyncio.run(execution.execute_run(str(run.pk), worker="first:1", tools=tool.registry()))
    _release_orm_thread()
    assert tool.bookings == 1
    assert tool_results(run) == []  # the results message was never committed
    stored = list(ToolCallResult.objects.filter(run=run).values_list("result", flat=True))
    assert len(stored) == 1
    monkeypatch.setattr(execution, "DjangoToolResultStore", DjangoToolResultStore)
    _dead_worker_left(run)

    result = asyncio.run(execution.execute_run(str(run.pk), worker="second:2", tools=tool.registry()))
    _release_orm_thread()

    assert result is not None
    assert result.status == Run.Status.COMPLETED
    assert tool.bookings == 1  # booked once, not twice
    assert len(tool.keys) == 1
    assert tool_results(run) == stored  # the stored result, committed as it was
    assert [m["role"] for m in Message.objects.of_thread(run.thread_id).canonical()] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]


@pytest.mark.parametrize("wire", sorted(MODELS))
def test_a_call_cut_off_by_the_workers_death_is_made_again_with_the_same_idempotency_key(wire):
    tool = _Booking(die_during_first_call=True)
    run = lifecycle.create_run(prompt=WEATHER, model=MODELS[wire])
    with pytest.raises(WorkerDied):
        asyncio.run(execution.execute_run(str(run.pk), worker="first:1", tools=tool.registry()))
    _release_orm_thread()
    assert not ToolCallResult.objects.filter(run=run).exists()
    _dead_worker_left(run)

    result = asyncio.run(execution.execute_run(str(run.pk), worker="second:2", tools=tool.registry()))
    _release_orm_thread()

    assert result is not None
    assert result.status == Run.Status.COMPLETED
    assert tool.bookings == 1
    assert len(tool.keys) == 2
    assert tool.keys[0] == tool.keys[1]
    call_id = tool_results(run)[0]["tool_use_id"]
    assert tool.keys[0] == f"{run.pk}:1:{call_id}"  # run, the calling message's position, the call


def test_a_worker_whose_run_was_taken_before_it_called_the_tool_never_calls_it(settings, monkeypatch):
    """The first worker's loop stops after it found no stored result and before it called the
    tool (a GC pause, a starved process) for longer than the stale window; the run is swept and
    a second worker makes the call and finishes it. When the first one's loop comes back it
    must not make the call again: the booking happens once."""
    stale_s = 2.0
    settings.STREAMRECOVER = {**settings.STREAMRECOVER, "STALE_AFTER_SECONDS": stale_s, "HEARTBEAT_SECONDS": 0.2}
    frozen, release = threading.Event(), threading.Event()

    class FreezesAfterItsFirstGet(DjangoToolResultStore):
        async def get(self, run_id: str, position: int, tool_call_id: str) -> dict[str, Any] | None:
            found = await super().get(run_id, position, tool_call_id)
            if self.fence.epoch == 1:
                frozen.set()
                release.wait(30)  # blocks the first worker's loop: no heartbeat, nothing
            return found

    monkeypatch.setattr(execution, "DjangoToolResultStore", FreezesAfterItsFirstGet)
    tool = _Booking()
    run = lifecycle.create_run(prompt=WEATHER, model=MODELS["anthropic"])
    first: dict[str, Any] = {}

    def first_worker() -> None:
        try:
            first["result"] = asyncio.run(execution.execute_run(str(run.pk), worker="first:1", tools=tool.registry()))
        except BaseException as exc:  # the test reports it below
            first["error"] = exc
        finally:
            _release_orm_thread()

    thread = threading.Thread(target=first_worker, name="first-worker")
    thread.start()
    try:
        assert frozen.wait(20), "the first worker never reached its tool call"
        time.sleep(stale_s + 0.3)  # its heartbeat goes stale
        assert lifecycle.sweep_stale_runs() == [str(run.pk)]
        second = asyncio.run(execution.execute_run(str(run.pk), worker="second:2", tools=tool.registry()))
        _release_orm_thread()
        assert second is not None
        assert second.status == Run.Status.COMPLETED
        assert tool.bookings == 1
    finally:
        release.set()
        thread.join(30)
    assert not thread.is_alive(), "the first worker did not stop"

    assert "error" not in first, first.get("error")
    assert first["result"] is None  # fenced out
    assert tool.bookings == 1  # the first worker never made the call
    assert len(tool_results(run)) == 1
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
