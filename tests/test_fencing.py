"""Two workers never run one run at once (issue 10, "two workers can run the same run").

The first worker's event loop stops (as a tool on the loop, a long GC pause or a starved
process stop it) in the middle of a stream; its heartbeat goes stale, the sweeper hands the run
back, a second worker claims it and finishes it. When the first worker's loop comes back it
must stop at once and write nothing: no frame, no event, no attempt, no message, no status, no
checkpoint. And a tool that blocks longer than the stale window must not get its run taken
away at all: tools run off the event loop, so the heartbeat goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from streamrecover.engine.agent import Tool, ToolRegistry
from streamrecover.engine.errors import ClaimLost
from streamrecover.engine.protocol import FrameKind
from streamrecover.engine.sink import BaseSink, CollectingSink
from streamrecover.live.buffer import writer_buffer
from streamrecover.models import Attempt, Message, RecoveryEvent, Run, StreamCheckpoint, ToolCallResult
from streamrecover.runs import execution, lifecycle
from streamrecover.runs.checkpoints import FencedCheckpointStore, checkpoint_store_from_settings
from streamrecover.starter import live_publisher
from streamrecover.testing.client import ClientView
from streamrecover.testing.fake.local import local_fake_server
from streamrecover.testing.tools import WEATHER_SCHEMA, get_weather

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

STALE_S = 2.0  # short, yet long enough for a loaded machine to beat within it
STORY = "Tell me a story about two lighthouse keepers [[words=40]]"
MODEL = "claude-3-7-sonnet"


@pytest.fixture
def short_stale_window(settings: Any) -> None:
    """A stale window of two seconds (a heartbeat every 0.2 s): a stale worker is found quickly."""
    settings.STREAMRECOVER = {**settings.STREAMRECOVER, "STALE_AFTER_SECONDS": STALE_S, "HEARTBEAT_SECONDS": 0.2}


def _release_orm_thread() -> None:
    asyncio.run(sync_to_async(connections.close_all)())


class _FreezesTheLoop(BaseSink):
    """Blocks its event loop (the whole worker) on the run's fifth text delta until released."""

    def __init__(self) -> None:
        self.frozen = threading.Event()
        self.release = threading.Event()
        self.deltas = 0
        self.frames_after_release = 0

    async def on_frame(self, frame: Any) -> None:
        if self.release.is_set():
            self.frames_after_release += 1
            return
        if frame["type"] == FrameKind.TEXT_DELTA:
            self.deltas += 1
            if self.deltas == 5:
                self.frozen.set()
                self.release.wait(30)  # blocks the loop: no heartbeat, no watcher, nothing


def _state(run: Run) -> dict[str, Any]:
    """Everything a worker writes for the run, as stored."""
    row = Run.objects.values().get(pk=run.pk)
    frames = asyncio.run(_buffered_frames(str(run.pk)))
    return {
        "run": row,
        "messages": list(Message.objects.filter(thread_id=run.thread_id).values().order_by("position")),
        "attempts": list(Attempt.objects.filter(run=run).values().order_by("index")),
        "events": list(RecoveryEvent.objects.filter(run=run).values().order_by("id")),
        "checkpoints": list(StreamCheckpoint.objects.filter(run=run).values()),
        "tool_results": list(ToolCallResult.objects.filter(run=run).values()),
        "frames": frames,
    }


async def _buffered_frames(run_id: str) -> list[dict[str, Any]] | None:
    buffer = writer_buffer()
    try:
        return await buffer.frames_after(run_id, 0)
    finally:
        await buffer.aclose()


def _uninterrupted_answer(prompt: str) -> list[dict[str, Any]]:
    run = lifecycle.create_run(prompt=prompt, model=MODEL)
    result = asyncio.run(execution.execute_run(str(run.pk)))
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    return result.new_messages[-1]["content"]


@pytest.mark.parametrize("store", ["orm", "redis"])
def test_a_worker_whose_run_was_taken_over_stops_without_writing(store, settings, short_stale_window):
    settings.STREAMRECOVER = {**settings.STREAMRECOVER, "CHECKPOINT_STORE": store, "CHECKPOINT_EVERY_DELTAS": 3}
    expected = _uninterrupted_answer(STORY)
    run = lifecycle.create_run(prompt=STORY, model=MODEL)
    freezer = _FreezesTheLoop()
    first: dict[str, Any] = {}

    def first_worker() -> None:
        try:
            first["result"] = asyncio.run(
                execution.execute_run(str(run.pk), worker="first:1", live=live_publisher, extra_sinks=[freezer])
            )
        except BaseException as exc:  # the test reports it below
            first["error"] = exc

    thread = threading.Thread(target=first_worker, name="first-worker")
    thread.start()
    try:
        assert freezer.frozen.wait(20), "the first worker never streamed"
        time.sleep(STALE_S + 0.3)  # its heartbeat goes stale
        swept_at = timezone.now()
        assert lifecycle.sweep_stale_runs() == [str(run.pk)]

        second = CollectingSink()
        result = asyncio.run(
            execution.execute_run(str(run.pk), worker="second:2", live=live_publisher, extra_sinks=[second])
        )
        assert result is not None
        assert result.status == Run.Status.COMPLETED
        taken_over = _state(run)
        provider_calls = len(local_fake_server().log)
    finally:
        freezer.release.set()
        thread.join(20)
    assert not thread.is_alive(), "the first worker did not stop"
    _release_orm_thread()

    assert "error" not in first, first.get("error")
    assert first["result"] is None  # fenced out: it did not execute the run to an end
    assert freezer.frames_after_release == 0
    assert _state(run) == taken_over  # nothing the first worker did afterwards changed anything
    assert len(local_fake_server().log) == provider_calls  # nor did it ask the provider anything

    # the stored answer is the second worker's, what its client rebuilt, and the uninterrupted one
    stored = Message.objects.of_thread(run.thread_id).canonical()
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["content"] == expected
    client = ClientView(stored[:1]).apply_all(second.frames)
    assert client.turns
    assert client.turns[-1][0] == client.turns[-1][1] == expected
    final = Run.objects.get(pk=run.pk)
    assert (final.status, final.claim_epoch, final.worker) == (Run.Status.COMPLETED, 3, "second:2")
    # one attempt streaming at a time: the first worker's ended when the second claimed the run
    attempts = list(Attempt.objects.of_run(run.pk).order_by("started_at"))
    assert [a.started_at < swept_at for a in attempts].count(True) >= 1
    for earlier, later in itertools.pairwise(attempts):
        assert earlier.ended_at is not None
        assert earlier.ended_at <= later.started_at
    assert asyncio.run(checkpoint_store_from_settings().get(str(run.pk))) is None
    _release_orm_thread()


def test_a_stale_claim_can_write_nothing(short_stale_window):
    """Each guarded write of a fenced-out claim raises ClaimLost and changes nothing."""
    from streamrecover.engine.checkpoint import Checkpoint
    from streamrecover.engine.errors import ClaimLost
    from streamrecover.runs.fence import Fence
    from streamrecover.runs.recorder import RecorderSink

    run = lifecycle.create_run(prompt=STORY, model=MODEL)
    claimed = lifecycle.claim_run(str(run.pk), "first:1")
    assert claimed is not None
    assert claimed.claim_epoch == 1
    old = Fence(str(run.pk), claimed.claim_epoch, lease_s=0.0)
    Run.objects.filter(pk=run.pk).update(heartbeat_at=claimed.heartbeat_at.replace(year=2000))
    assert lifecycle.sweep_stale_runs() == [str(run.pk)]
    assert lifecycle.claim_run(str(run.pk), "second:2").claim_epoch == 3
    before = _state(run)

    recorder = RecorderSink.for_run(run, old)
    with pytest.raises(ClaimLost):
        asyncio.run(recorder.on_message({"role": "assistant", "content": [{"type": "text", "text": "x"}]}, 1))
    assert old.lost
    fresh = Fence(str(run.pk), 1, lease_s=0.0)  # a second handle on the same stale claim
    with pytest.raises(ClaimLost):
        asyncio.run(fresh.beat())
    stale_store = FencedCheckpointStore(checkpoint_store_from_settings(), Fence(str(run.pk), 1, 0.0))
    with pytest.raises(ClaimLost):
        asyncio.run(stale_store.put(Checkpoint(run_id=str(run.pk), turn=0, history_len=1, blocks=[])))
    with pytest.raises(ClaimLost):
        lifecycle.finish(str(run.pk), Run.Status.COMPLETED, fence=Fence(str(run.pk), 1, 0.0))
    _release_orm_thread()
    assert _state(run) == before


def _slow_registry(calls: list[float], seconds: float) -> ToolRegistry:
    def slow_weather(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(time.monotonic())
        time.sleep(seconds)  # a blocking call: an HTTP request without a timeout, a slow query
        return get_weather(args)

    return ToolRegistry([Tool("get_weather", "Get the current weather for a city.", WEATHER_SCHEMA, slow_weather)])


def test_a_tool_blocking_longer_than_the_stale_window_keeps_its_run(short_stale_window):
    run = lifecycle.create_run(prompt="Weather in Oslo? [[words=20]] [[tool=get_weather]]", model=MODEL)
    calls: list[float] = []
    tools = _slow_registry(calls, seconds=STALE_S * 1.5)
    stop = threading.Event()
    swept: list[str] = []

    def sweeper() -> None:
        """The sweeper, and a second worker ready to take whatever it hands back."""
        try:
            while not stop.is_set():
                for run_id in lifecycle.sweep_stale_runs():
                    swept.append(run_id)
                    asyncio.run(execution.execute_run(run_id, worker="second:2", tools=tools))
                stop.wait(0.2)
        finally:
            connections.close_all()

    thread = threading.Thread(target=sweeper, name="sweeper")
    thread.start()
    try:
        result = asyncio.run(execution.execute_run(str(run.pk), worker="first:1", tools=tools))
    finally:
        stop.set()
        thread.join(30)
    _release_orm_thread()

    assert result is not None
    assert result.status == Run.Status.COMPLETED
    assert swept == []  # its heartbeat never went stale
    assert len(calls) == 1
    final = Run.objects.get(pk=run.pk)
    assert (final.status, final.claims, final.claim_epoch) == (Run.Status.COMPLETED, 1, 1)


def _gated_registry(entered: list[threading.Event], gates: list[threading.Event]) -> ToolRegistry:
    """The n-th call announces itself (``entered[n]``) and returns once ``gates[n]`` is set."""
    made = itertools.count()

    def gated_weather(args: dict[str, Any]) -> dict[str, Any]:
        n = next(made)
        entered[n].set()
        gates[n].wait(30)
        return get_weather(args)

    return ToolRegistry([Tool("get_weather", "Get the current weather for a city.", WEATHER_SCHEMA, gated_weather)])


def test_a_cancel_reaches_the_workers_new_claim_of_its_own_stale_run(settings):
    """A worker claims its own stale run again while the old claim is still in a tool call; the
    old claim then unwinds. The new claim must still be watched: the user's cancel stops it."""
    # the watcher beats at its first tick and then not for an hour: the old claim has not yet
    # noticed that its run was taken when it unwinds (up to HEARTBEAT_SECONDS in production)
    settings.STREAMRECOVER = {**settings.STREAMRECOVER, "STALE_AFTER_SECONDS": 30, "HEARTBEAT_SECONDS": 3600}
    run = lifecycle.create_run(prompt="Weather in Oslo? [[words=20]] [[tool=get_weather]]", model=MODEL)
    run_id = str(run.pk)
    entered, gates = [threading.Event(), threading.Event()], [threading.Event(), threading.Event()]
    tools = _gated_registry(entered, gates)

    def swept() -> list[str]:
        Run.objects.filter(pk=run_id).update(heartbeat_at=Run.objects.get(pk=run_id).heartbeat_at.replace(year=2000))
        return lifecycle.sweep_stale_runs()

    async def one_worker() -> tuple[Any, Any]:
        try:
            old = asyncio.ensure_future(execution.execute_run(run_id, worker="w:1", tools=tools))
            await asyncio.to_thread(entered[0].wait, 30)  # the old claim is in its tool call
            assert await sync_to_async(swept)() == [run_id]
            new = asyncio.ensure_future(execution.execute_run(run_id, worker="w:1", tools=tools))
            await asyncio.to_thread(entered[1].wait, 30)  # the new claim is in its tool call
            gates[0].set()  # the old call returns, its result is refused: the old claim unwinds
            old_result = await old
            await sync_to_async(lifecycle.request_cancel)(run_id)
            await asyncio.sleep(1.0)  # a few polls of the watcher
            gates[1].set()
            return old_result, await new
        finally:
            for gate in gates:
                gate.set()
            await sync_to_async(connections.close_all)()

    old_result, new_result = asyncio.run(one_worker())
    assert old_result is None  # fenced out
    assert new_result is not None
    assert new_result.status == Run.Status.CANCELLED
    assert Run.objects.get(pk=run_id).status == Run.Status.CANCELLED


class _ClaimTakenOnAbandon(BaseSink):
    """A newer claim took the run as the cancel of a response left behind records its event:
    that write is refused (``ClaimLost``), as the fenced recorder refuses it."""

    async def on_event(self, event: Any) -> None:
        if event.name == "llm_response_abandoned":
            raise ClaimLost(f"run {event.fields['run_id']}: a newer claim holds the run")


def test_a_claim_lost_recording_an_abandoned_response_stops_the_run(fake_server) -> None:
    """The refused re-attach's response is cancelled beside the continuation; recording that
    finds the claim lost. The worker stops as on any lost claim (``execute_run`` returns None):
    it neither stores the answer nor runs its tool call, nor asks the provider for a next turn."""
    from streamrecover.testing.tools import demo_registry

    from .harness import provider

    scenario = uuid.uuid4().hex
    fake_server.set_faults(scenario, ["cut:events=22", "status:400"])
    config = provider(fake_server, scenario, "openai-responses", native_resume=True)
    prompt = "Weather? [[words=8]] [[tool=get_weather]]"
    run = lifecycle.create_run(prompt=prompt, model="gpt-4o", demo_tools=True)
    result = asyncio.run(
        execution.execute_run(
            str(run.pk), tools=demo_registry(), provider_override=config, extra_sinks=[_ClaimTakenOnAbandon()]
        )
    )
    _release_orm_thread()
    assert result is None
    # the cancel runs beside the continuation; no next turn (with the tool's result) was asked for
    seen = [e.understood_as for e in fake_server.log_for(scenario)]
    assert sorted(seen, key=str) == sorted(["fresh", None, "continue_message", "cancel"], key=str)
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING  # left to the claim's holder
    assert [m["role"] for m in Message.objects.of_thread(run.thread_id).canonical()] == ["user"]
    assert not ToolCallResult.objects.filter(run=run).exists()
