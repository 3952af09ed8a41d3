"""Executing one run: claim it, build the engine's inputs once, run the agent, store the end.

``execute_run`` is handed what it does not own: the live channel (``live``, opened and closed
by the code that starts work) and any further sinks. It adds the recorder and the status
sink, beats the heartbeat and watches for a cancel while the agent runs, and has the agent
settle the run through ``lifecycle.finish_many`` (its end and final answer in one transaction).
Everything it writes for the run goes through the claim's ``Fence``: when the heartbeat
finds the claim taken over, the run's task is cancelled and the run unwinds without another
write (``execute_run`` then returns None).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, Protocol

import structlog
from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

from ..conf import app_settings
from ..engine.agent import RunResult, ToolRegistry, run_agent
from ..engine.cancel import CancelToken
from ..engine.context import RunContext, Settlement
from ..engine.contract import ModelRequest, ProviderConfig
from ..engine.errors import ClaimLost
from ..engine.sink import (
    LLM_STREAM_CONTINUATION_COMPLETED,
    LLM_STREAM_INTERRUPTED,
    AttemptOutcome,
    AttemptRecord,
    BaseSink,
    FanOutSink,
    RunSink,
    StructuredEvent,
)
from ..models import Attempt
from ..providers.registry import get_adapter
from . import claims, deferred, lifecycle
from .cancels import cancel_message
from .checkpoints import FencedCheckpointStore, checkpoint_store_from_settings
from .fence import Fence, FencedSink, again_on_a_fresh_connection
from .loop import on_shared_loop
from .recorder import RecorderSink
from .settlements import RunSettlements
from .toolresults import DjangoToolResultStore
from .tools import TOOL_UNAVAILABLE, unavailable_tools_error
from .watch import watching

log = structlog.get_logger("streamrecover")

RECOVERY_KINDS = frozenset({Attempt.Kind.CONTINUATION, Attempt.Kind.RESTART, Attempt.Kind.RESUME})


class LiveSink(RunSink, Protocol):
    """A sink that delivers frames to watchers; ``last_seq`` is the last frame number it kept,
    so a resumed run numbers on from there."""

    last_seq: int


# Opens the live channel of a run (given its id) for the time the agent runs; the caller
# decides what opening and closing mean (e.g. ``starter.live_publisher``).
OpenLive = Callable[[str], AbstractAsyncContextManager[LiveSink | None]]


class RunStatusSink(BaseSink):
    """Keeps ``Run.status`` telling the truth while the stream is being recovered."""

    def __init__(self, run_id: str, fence: Fence | None = None) -> None:
        self.run_id = run_id
        self.fence = fence

    async def on_event(self, event: StructuredEvent) -> None:
        if event.name == LLM_STREAM_INTERRUPTED:
            await lifecycle.mark_recovering(self.run_id, self.fence)
        elif event.name == LLM_STREAM_CONTINUATION_COMPLETED:
            await lifecycle.mark_running(self.run_id, self.fence)

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        if attempt.kind in RECOVERY_KINDS and attempt.outcome == AttemptOutcome.PENDING:
            await lifecycle.mark_running(self.run_id, self.fence)


def lease_seconds() -> float:
    """How long a successful heartbeat vouches for the claim: half the stale window (nobody
    may take the run before its heartbeat is a whole window old)."""
    return float(app_settings.STALE_AFTER_SECONDS) / 2.0


@contextlib.asynccontextmanager
async def _no_live(run_id: str) -> AsyncIterator[None]:
    """No live channel: the run is recorded, nobody watches it."""
    yield None


async def execute_run(
    run_id: str,
    *,
    worker: str | None = None,
    live: OpenLive | None = None,
    extra_sinks: Sequence[RunSink] = (),
    tools: ToolRegistry | None = None,
    provider_override: ProviderConfig | None = None,
    on_claimed: Callable[[], None] | None = None,
) -> RunResult | None:
    """Claim and execute a run to its end (or to a cancel). Returns None when not claimed, or
    when the claim was lost to another worker on the way (nothing more was written then).

    ``on_claimed`` is called once the claim is held (``runs.holder``: the Celery task that
    handed the run over returns then, and its message is acknowledged).

    ``live`` opens the run's live channel once the run is claimed; it is closed (by the
    context manager it returns) when the agent stops, after the run's end is stored.
    ``provider_override`` (in-process only) replaces the configured provider; never stored.
    """
    worker = worker or lifecycle.worker_id()  # the executing process's, never the importer's
    # The ORM calls below run in asgiref's one thread, whose connection outlives a run: one that
    # broke (a database restart, a terminated backend, a run that crashed mid-query) is closed
    # before this run's first query (``claims.claim_many``), instead of failing every later run of this
    # process.
    if on_shared_loop() and provider_override is None:
        inputs = await claims.RunClaims.of_running_loop().claim(run_id, worker)  # with the other runs arriving now
    else:
        inputs = await sync_to_async(claims.claim)(run_id, worker, provider_override)
    if inputs is None:
        return None
    if on_claimed is not None:
        on_claimed()
    run = inputs.run
    fence = Fence(str(run.pk), run.claim_epoch, lease_seconds())
    running = asyncio.current_task()
    assert running is not None
    # Every log line while the run executes carries it (the project's structlog configuration
    # merges contextvars; its stdlib formatter does too, for httpx's and the engine's lines).
    # What the run's settlement leaves to do (the analytics fold) waits until its live channel
    # is closed: that ORM work (in the thread every run's ORM calls share) never stands between
    # the run's end and its clients, and runs that end together share it (``deferred``).
    with (
        structlog.contextvars.bound_contextvars(run_id=str(run.pk), provider=run.provider, model=run.model),
        deferred.deferring() as settled,
    ):
        try:
            result = await _execute_claimed(inputs, fence, running, live, extra_sinks, tools)
        except ClaimLost:
            fence.lost = True
        except asyncio.CancelledError:
            if not fence.lost:
                raise  # cancelled from outside: not ours to swallow
            running.uncancel()
        else:
            await deferred.run_deferred(settled)
            await _release_connections()
            return result
        log.warning("run_fenced_out", run_id=str(run.pk), epoch=fence.epoch)
        await _release_connections()
        return None


async def _release_connections() -> None:
    """The ORM work ran in asgiref's executor thread: release its connections there (on the
    worker's shared loop that thread serves every run: close only what is too old or broken)."""
    await sync_to_async(close_old_connections if on_shared_loop() else connections.close_all)()


async def _execute_claimed(
    inputs: claims.Inputs,
    fence: Fence,
    running: asyncio.Task[Any],
    live: OpenLive | None,
    extra_sinks: Sequence[RunSink],
    tools: ToolRegistry | None,
) -> RunResult:
    run, messages, consumed, turns = inputs.run, inputs.messages, inputs.consumed, inputs.turns
    options = run.options
    engine = app_settings.engine_config()
    if options.get("engine"):
        engine = replace(engine, **options["engine"])
    adapter = get_adapter(inputs.config)
    refusal = None
    if inputs.provider_problem:
        refusal = {"kind": claims.PROVIDER_UNAVAILABLE, "message": inputs.provider_problem}
    if tools is None:  # an explicit registry wins; else what STREAMRECOVER['TOOLS'] gave (``claims``)
        tools = inputs.tools
        if inputs.tools_problem and refusal is None:
            refusal = {"kind": TOOL_UNAVAILABLE, "message": f"STREAMRECOVER['TOOLS'] failed: {inputs.tools_problem}"}
    # A tool the run already used and this process lacks: the run fails before any provider call,
    # rather than telling the model the tool is unknown (docs/recovery.md, "Tools on resume").
    refusal = refusal or unavailable_tools_error(inputs.needs_tools, tools)
    request = ModelRequest(
        model=run.model,
        messages=messages,
        max_tokens=int(options.get("max_tokens") or 1024),
        system=options.get("system"),
        thinking_budget=options.get("thinking_budget"),
        tools=tools.specs(),
    )
    proxied = options.get("proxy")
    if proxied:
        # a proxied request (streamrecover.proxy): the client's own fields pass through, and its
        # tools are the client's to run (in ``extra``, as the client sent them)
        request = replace(
            request,
            temperature=proxied.get("temperature"),
            structured=bool(proxied.get("structured")),
            extra=dict(proxied.get("extra") or {}),
            betas=tuple(proxied.get("betas") or ()),
            max_tokens_field=proxied.get("max_tokens_field"),
        )
    shared = on_shared_loop()  # the loop's runs share one store (one Redis client)
    checkpoints = FencedCheckpointStore(checkpoint_store_from_settings(shared=shared), fence, own_store=not shared)
    existing = await checkpoints.get(str(run.pk))
    cancel = CancelToken()
    cancel.bind()
    if run.cancel_requested:  # asked while no worker held it: the run only ends (``lifecycle``)
        cancel.cancel(cancel_message(run.cancel_reason))
    try:
        async with (live or _no_live)(str(run.pk)) as channel:
            delivering: list[RunSink] = [channel] if channel is not None else []
            start_seq = max(existing.seq if existing else 0, channel.last_seq if channel is not None else 0)
            if start_seq or run.claim_epoch > 1:
                # An earlier claim streamed this run (or may have: a Redis that lost its data
                # lost the run's frames, seq and checkpoint alike, and a client watching since
                # before would take the new frames as the next ones), and what Redis never got of
                # it is invisible from here: one seq is left out, so every client sees a gap and
                # takes a snapshot, which has whatever that claim committed.
                start_seq += 1
            recorder = RecorderSink.for_run(run, fence)
            sink = FencedSink(
                FanOutSink(RunStatusSink(str(run.pk), fence), *delivering, *extra_sinks, store=recorder),
                fence,
            )
            log.info(
                "run_started", run_id=str(run.pk), provider=run.provider, model=run.model, resume=existing is not None
            )
            try:
                with watching(fence, cancel, running):  # heartbeat, cancel
                    ctx = RunContext(
                        run_id=str(run.pk),
                        adapter=adapter,
                        config=engine,
                        sink=sink,
                        checkpoints=checkpoints,
                        cancel=cancel,
                        tool_results=DjangoToolResultStore(fence),
                        seq=start_seq,
                        attempts=consumed,
                        turns=turns,
                        settle=functools.partial(_settle, fence, recorder),
                        provider_name=run.provider,
                        failover=inputs.failover,
                    )
                    result = await run_agent(
                        ctx, request, tools=tools, resume=existing is not None, one_turn=bool(proxied), refusal=refusal
                    )
            except BaseException:
                if fence.lost and channel is not None:
                    _abandon(channel)
                raise
    finally:
        with contextlib.suppress(Exception):
            await checkpoints.aclose()
    log.info("run_finished", run_id=str(run.pk), status=result.status, error_kind=(result.error or {}).get("kind"))
    return result


def _abandon(channel: LiveSink) -> None:
    """The claim is lost: the live channel sends nothing more, not even what it holds back
    (the run's frames are the new owner's now)."""
    abandon = getattr(channel, "abandon", None)
    if abandon is not None:
        abandon()


async def _settle(fence: Fence, recorder: RecorderSink, settlement: Settlement) -> None:
    """The run's end and its final answer, in one transaction (``lifecycle.finish``; on a
    worker's shared loop with the other runs ending now, ``settlements``); the recorder, told of
    the answer next as every sink is, then knows it is stored."""
    error = settlement.error or {}
    end = lifecycle.RunEnd(
        run_id=fence.run_id,
        status=settlement.status,
        error_kind=error.get("kind", ""),
        error_message=error.get("message", ""),
        notices=settlement.notices,
        epoch=fence.epoch,
        message=settlement.message,
        position=settlement.position,
    )
    if on_shared_loop():
        await RunSettlements.of_running_loop().settle(fence, end)
    else:
        # a connection terminated under the settlement: once more on a fresh one (it is one
        # transaction, and storing the answer twice stores it once)
        await sync_to_async(again_on_a_fresh_connection)(functools.partial(lifecycle.finish_end, end, fence))
    if settlement.message is not None:
        recorder.stored(settlement.position)
