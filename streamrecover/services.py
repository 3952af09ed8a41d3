"""Runs as a Django project sees them: create, claim, execute, cancel, re-queue, sweep.

Everything a Celery task, a view, the admin or a command does with a run goes through
here, so there is one place that knows the rules: a claim is one ``select_for_update()``
in a transaction that refuses terminal runs and counts claims; the executing worker beats
a heartbeat and watches for a cancel; a run whose heartbeat stopped is re-queued by the
sweeper and resumed from its checkpoint by whoever claims it next.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import structlog
from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections, transaction
from django.utils import timezone

from .analytics import rollup
from .conf import app_settings
from .engine.agent import RunResult, ToolRegistry, notice_blocks, run_agent
from .engine.cancel import CancelToken
from .engine.sink import FanOutSink, RunSink, StructuredEvent
from .models import Message, Run, Thread
from .providers.base import ModelRequest, ProviderConfig
from .providers.registry import get_adapter
from .recorder import RecorderSink
from .stores import checkpoint_store_from_settings
from .testing import fake_provider, is_fake
from .testing.tools import demo_registry

log = structlog.get_logger("streamrecover")

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


# ---- creating and starting --------------------------------------------------------------


def create_run(
    *,
    prompt: str,
    provider: str | None = None,
    model: str | None = None,
    owner: Any = None,
    thread: Thread | None = None,
    system: str | None = None,
    max_tokens: int = 1024,
    thinking_budget: int | None = None,
    demo_tools: bool = False,
    faults: Sequence[str] = (),
    engine: dict[str, Any] | None = None,
) -> Run:
    """A queued run whose user message is committed to the thread (a new one by default)."""
    provider = provider or app_settings.DEFAULT_PROVIDER
    model = model or app_settings.DEFAULT_MODEL
    if provider not in app_settings.PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; configured: {', '.join(sorted(app_settings.PROVIDERS))}")
    with transaction.atomic():
        notices: list[dict[str, Any]] = []
        if thread is None:
            thread = Thread.objects.create(owner=owner, title=prompt[:80])
        else:
            thread = Thread.objects.select_for_update().get(pk=thread.pk)
            notices, thread.pending_notices = thread.pending_notices, []
            if notices:
                thread.save(update_fields=["pending_notices"])
        position = Message.objects.filter(thread=thread).count()
        run = Run.objects.create(
            thread=thread,
            owner=owner,
            provider=provider,
            model=model,
            options={
                "system": system,
                "max_tokens": max_tokens,
                "thinking_budget": thinking_budget,
                "demo_tools": demo_tools,
                "faults": list(faults),
                "engine": engine or {},
            },
        )
        Message.objects.create(
            thread=thread,
            run=run,
            position=position,
            role="user",
            content=[*notice_blocks(notices), {"type": "text", "text": prompt}],
        )
    return run


def enqueue_run(run: Run) -> None:
    """Start a run the configured way: a Celery task after commit, or a thread in-process."""
    if app_settings.EXECUTION == "celery":
        from .tasks import execute_run_task

        run_id = str(run.pk)
        transaction.on_commit(lambda: execute_run_task.delay(run_id))
    else:
        transaction.on_commit(lambda: start_in_thread(str(run.pk)))


def start_in_thread(run_id: str) -> threading.Thread:
    """Embedded mode: execute in a daemon thread with its own event loop."""

    def target() -> None:
        try:
            asyncio.run(execute_run(run_id))
        finally:
            close_old_connections()

    thread = threading.Thread(target=target, name=f"streamrecover-run-{run_id}", daemon=True)
    thread.start()
    return thread


# ---- claiming -----------------------------------------------------------------------------


def claim_run(run_id: str, worker: str = WORKER_ID) -> Run | None:
    """Take a run for execution, or None when it must not run here.

    Refuses terminal runs (a redelivered message for a finished run is simply dropped) and
    runs another live worker is executing; counts claims, and fails a run claimed more than
    ``MAX_CLAIMS`` times so a poison message ends instead of looping.
    """
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.is_terminal:
            return None
        stale_after = timedelta(seconds=app_settings.STALE_AFTER_SECONDS)
        if (
            run.status in (Run.Status.RUNNING, Run.Status.RECOVERING)
            and run.worker
            and run.worker != worker
            and run.heartbeat_at is not None
            and now - run.heartbeat_at < stale_after
        ):
            return None  # alive elsewhere
        run.claims += 1
        if run.claims > app_settings.MAX_CLAIMS:
            run.status = Run.Status.FAILED
            run.error_kind = "too_many_claims"
            run.error_message = f"claimed {run.claims} times without finishing; giving up (MAX_CLAIMS)"
            run.finished_at = now
            run.save()
            _fold_on_commit(run)
            log.error("run_claims_exceeded", run_id=str(run.pk), claims=run.claims)
            return None
        if run.cancel_requested:
            run.status = Run.Status.CANCELLED
            run.finished_at = now
            run.save()
            _fold_on_commit(run)
            return None
        run.status = Run.Status.RUNNING
        run.worker = worker
        run.heartbeat_at = now
        run.started_at = run.started_at or now
        run.save()
    return run


# ---- executing ----------------------------------------------------------------------------


class _StatusSink:
    """Keeps ``Run.status`` telling the truth while the stream is being recovered."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    async def on_event(self, event: StructuredEvent) -> None:
        if event.name == "llm_stream_interrupted":
            await Run.objects.filter(pk=self.run_id, status=Run.Status.RUNNING).aupdate(status=Run.Status.RECOVERING)
        elif event.name == "llm_stream_continuation_completed":
            await Run.objects.filter(pk=self.run_id, status=Run.Status.RECOVERING).aupdate(status=Run.Status.RUNNING)

    async def on_attempt(self, attempt: Any) -> None:
        if attempt.kind in ("continuation", "restart", "resume") and attempt.outcome == "pending":
            await Run.objects.filter(pk=self.run_id, status=Run.Status.RECOVERING).aupdate(status=Run.Status.RUNNING)

    async def on_frame(self, frame: dict[str, Any]) -> None:
        return None

    async def on_message(self, message: dict[str, Any], position: int) -> None:
        return None


def provider_for_run(run: Run, consumed_attempts: int, override: ProviderConfig | None = None) -> ProviderConfig:
    """The run's provider; for the built-in fake, this run's remaining fault script (each
    provider call consumes one fault, so a resumed run does not replay spent ones)."""
    config = override or app_settings.provider_config(run.provider)
    if is_fake(config):
        faults = list(run.options.get("faults") or [])[consumed_attempts:]
        config = fake_provider(config, run.model, scenario=f"run-{run.pk}", faults=faults)
    return config


def _load(run_id: str) -> tuple[Run, list[dict[str, Any]], int]:
    run = Run.objects.select_related("thread").get(pk=run_id)
    messages = [m.as_canonical() for m in Message.objects.filter(thread_id=run.thread_id).order_by("position")]
    return run, messages, run.attempts.count()


async def _watch(run_id: str, cancel: CancelToken, worker: str) -> None:
    """Beat the heartbeat and notice a cancel request, until the run ends."""
    beat_every = float(app_settings.HEARTBEAT_SECONDS)
    poll = min(0.25, beat_every)
    last_beat = 0.0
    loop = asyncio.get_running_loop()
    while True:
        now = loop.time()
        if now - last_beat >= beat_every:
            await Run.objects.filter(pk=run_id, worker=worker).aupdate(heartbeat_at=timezone.now())
            last_beat = now
        row = await Run.objects.filter(pk=run_id).values("cancel_requested", "cancel_reason").afirst()
        if row and row["cancel_requested"]:
            cancel.cancel(row["cancel_reason"] or "cancelled by user")
            return
        await asyncio.sleep(poll)


async def execute_run(
    run_id: str,
    *,
    worker: str = WORKER_ID,
    extra_sinks: Sequence[RunSink] = (),
    tools: ToolRegistry | None = None,
    provider_override: ProviderConfig | None = None,
) -> RunResult | None:
    """Claim and execute a run to its end (or to a cancel). Returns None when not claimed.

    ``provider_override`` (in-process only, e.g. a command line's ``--api-key``) replaces the
    configured provider; it is never stored.
    """
    run = await sync_to_async(claim_run)(run_id, worker)
    if run is None:
        return None
    run, messages, consumed = await sync_to_async(_load)(run_id)
    options = run.options
    engine = app_settings.engine_config()
    if options.get("engine"):
        engine = replace(engine, **options["engine"])
    config = await sync_to_async(provider_for_run)(run, consumed, provider_override)
    adapter = get_adapter(config)
    tools = tools or (demo_registry() if options.get("demo_tools") else ToolRegistry())
    request = ModelRequest(
        model=run.model,
        messages=messages,
        max_tokens=int(options.get("max_tokens") or 1024),
        system=options.get("system"),
        thinking_budget=options.get("thinking_budget"),
        tools=tools.specs(),
    )
    checkpoints = checkpoint_store_from_settings()
    existing = await checkpoints.get(str(run.pk))
    cancel = CancelToken()
    cancel.bind()
    publisher = await _publisher(str(run.pk))
    live: list[RunSink] = [publisher] if publisher is not None else []
    start_seq = max(existing.seq if existing else 0, getattr(publisher, "last_seq", 0))
    sink = FanOutSink(RecorderSink.for_run(run), _StatusSink(str(run.pk)), *live, *extra_sinks)
    watcher = asyncio.ensure_future(_watch(str(run.pk), cancel, worker))
    log.info("run_started", run_id=str(run.pk), provider=run.provider, model=run.model, resume=existing is not None)
    try:
        result = await run_agent(
            run_id=str(run.pk),
            adapter=adapter,
            request=request,
            config=engine,
            sink=sink,
            checkpoints=checkpoints,
            cancel=cancel,
            tools=tools,
            start_seq=start_seq,
            resume=existing is not None,
            provider_name=run.provider,
            first_attempt_index=consumed,
        )
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        if publisher is not None:
            with contextlib.suppress(Exception):
                await publisher.aclose()
        close = getattr(checkpoints, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
    await _finish(str(run.pk), result)
    # The ORM work ran in asgiref's executor thread: release its connections there.
    await sync_to_async(connections.close_all)()
    return result


async def _publisher(run_id: str) -> Any:
    """The live publisher (Channels) for this run, when the project has a channel layer.

    It is a ``RunSink`` with ``last_seq`` (the last frame number already published for the
    run, so a resumed run numbers on from there) and ``aclose()``.
    """
    try:
        from .live.publisher import make_publisher
    except ModuleNotFoundError as exc:  # no live package installed: engine-only use
        if not (exc.name or "").startswith("streamrecover.live"):
            raise
        return None
    return await make_publisher(run_id)


async def _finish(run_id: str, result: RunResult) -> None:
    error = result.error or {}
    await sync_to_async(_finish_sync)(
        run_id, result.status, error.get("kind", ""), error.get("message", ""), result.undelivered_notices
    )
    log.info("run_finished", run_id=run_id, status=result.status, error_kind=error.get("kind"))


def _finish_sync(
    run_id: str, status: str, error_kind: str, error_message: str, notices: Sequence[dict[str, Any]] = ()
) -> None:
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        run.status = status
        run.error_kind = error_kind
        run.error_message = error_message
        run.finished_at = timezone.now()
        run.save()
        if notices:  # for the thread's next user message (create_run)
            thread = Thread.objects.select_for_update().get(pk=run.thread_id)
            kept = [{key: notice.get(key) for key in ("id", "name", "reason")} for notice in notices]
            thread.pending_notices = [*thread.pending_notices, *kept]
            thread.save(update_fields=["pending_notices"])
        _fold_on_commit(run)


def _fold_on_commit(run: Run) -> None:
    """A run that just settled goes into the analytics rollup once its transaction commits."""
    run_id = run.pk
    transaction.on_commit(lambda: rollup.fold_settled(run_id))


# ---- cancelling, re-queueing, sweeping ----------------------------------------------------


def request_cancel(run_id: str | uuid.UUID, reason: str = "cancelled by user") -> bool:
    """Ask a run to stop. A queued run is cancelled at once; a running one within a tick."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.is_terminal:
            return False
        run.cancel_requested = True
        run.cancel_reason = reason[:200]
        if run.status == Run.Status.QUEUED:
            run.status = Run.Status.CANCELLED
            run.finished_at = timezone.now()
            _fold_on_commit(run)
        run.save()
    log.info("run_cancel_requested", run_id=str(run_id), reason=reason)
    return True


def requeue_run(run_id: str | uuid.UUID) -> bool:
    """Put a failed, exhausted or stale run back in the queue (claims start again)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.status in (Run.Status.COMPLETED, Run.Status.CANCELLED, Run.Status.QUEUED):
            return False
        rollup.unfold_run(run.pk)  # its figures are about to change: counted row by row again
        run.status = Run.Status.QUEUED
        run.claims = 0
        run.worker = ""
        run.heartbeat_at = None
        run.error_kind = ""
        run.error_message = ""
        run.finished_at = None
        run.save()
        enqueue_run(run)
    log.info("run_requeued", run_id=str(run_id))
    return True


def sweep_stale_runs(seconds: float | None = None) -> list[str]:
    """Re-queue runs whose worker stopped beating; returns their ids."""
    swept: list[str] = []
    for run_id in Run.objects.stale(seconds=seconds).values_list("pk", flat=True):
        with transaction.atomic():
            run = Run.objects.stale(seconds=seconds).select_for_update().filter(pk=run_id).first()
            if run is None:  # finished or beat meanwhile
                continue
            run.status = Run.Status.QUEUED
            run.worker = ""
            run.save()
            enqueue_run(run)
        swept.append(str(run_id))
        log.warning("run_swept", run_id=str(run_id))
    return swept


def wait_for_run(run_id: str, timeout_s: float = 600.0, poll_s: float = 0.2) -> Run:
    """Block until the run is terminal (a command line waiting on a worker)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        run = Run.objects.get(pk=run_id)
        if run.is_terminal:
            return run
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {run.status} after {timeout_s:.0f}s")
        time.sleep(poll_s)
