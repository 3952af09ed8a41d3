"""A run's state changes: create, claim, heartbeat, finish, cancel, re-queue, sweep, wait.

Nothing here starts work: ``requeue_run`` and ``sweep_stale_runs`` report what they put back
in the queue and the caller (``streamrecover.dispatch``) starts it. The rules live here, once:
one active run per thread; a claim is one ``select_for_update()`` in a transaction (the claims
of runs that arrive together may share one: ``claim_runs``) that refuses terminal runs and
counts claims; a run whose heartbeat stopped goes back to the queue and is resumed from its
checkpoint by whoever claims it next. Every claim, sweep and
re-queue raises the run's ``claim_epoch``: the writes of a worker whose claim was taken from
it are refused (``runs.fence``).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..conf import app_settings
from ..engine.agent import pending_tool_calls
from ..engine.notices import ToolNotice, notice_blocks, stored_notice
from ..engine.sink import AttemptOutcome
from ..models import Attempt, Message, Run, Thread
from ..redaction import cut_secrets
from .cancels import CANCELLED_BY_USER, cancel_error
from .checkpoints import sweep_settled_checkpoints
from .fence import Fence
from .recorder import write_messages
from .signals import run_cancel_awaits_worker, run_cancelled_in_queue, run_created, run_requeued, run_settled

log = structlog.get_logger("streamrecover")

_worker_ids: dict[int, str] = {}


def worker_id() -> str:
    """This process's worker id (``host:pid``), computed in the process that asks.

    Not a module constant: a prefork pool imports the app once and forks, and every child
    would otherwise carry the parent's pid (and claim runs under one shared id).
    """
    pid = os.getpid()
    found = _worker_ids.get(pid)
    if found is None:
        found = _worker_ids[pid] = f"{socket.gethostname()}:{pid}"
    return found


class ThreadBusy(Exception):
    """The thread already has a queued or running run: one active run per thread."""


# ---- creating -----------------------------------------------------------------------------


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
    """A queued run whose user message is committed to the thread (a new one by default).

    A follow-up in a thread that still has an active run raises ``ThreadBusy``.
    """
    provider = provider or app_settings.DEFAULT_PROVIDER
    model = model or app_settings.DEFAULT_MODEL
    if provider not in app_settings.PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; configured: {', '.join(sorted(app_settings.PROVIDERS))}")
    prompt = cut_secrets(prompt)  # as written, but never the app's own API key (docs/recovery.md)
    system = cut_secrets(system) if system is not None else None
    with transaction.atomic():
        notices: list[ToolNotice] = []
        if thread is None:
            # a label for the sidebar: the prompt's words on one line (the message keeps them as written)
            thread = Thread.objects.create(owner=owner, title=" ".join(prompt.split())[:80])
        else:
            thread = Thread.objects.select_for_update().get(pk=thread.pk)
            if Run.objects.filter(thread=thread).active().exists():
                raise ThreadBusy(f"thread {thread.pk} has a run in progress")
            notices = [stored_notice(notice) for notice in thread.pending_notices]
            thread.pending_notices = []
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
            role=Message.Role.USER,
            content=[*notice_blocks(notices), {"type": "text", "text": prompt}],
        )
        _created_on_commit(run)
    return run


# ---- claiming, beating, finishing ---------------------------------------------------------


def claim_run(run_id: str, worker: str | None = None) -> Run | None:
    """Take a run for execution, or None when it must not run here.

    Refuses terminal runs (a redelivered message for a finished run is simply dropped) and
    runs a live worker is executing (this one included: a message delivered twice never runs
    a run twice at once); counts claims, and fails a run claimed more than ``MAX_CLAIMS``
    times so a poison message ends instead of looping. Each claim raises ``claim_epoch``,
    the fencing token the returned run carries: older claims can no longer write.
    """
    (run,) = claim_runs([run_id], worker)
    return run


def run_key(run_id: str) -> uuid.UUID:
    """``run_id`` as a run's key; ``ValidationError`` when it is none."""
    key: uuid.UUID = Run._meta.pk.to_python(run_id)
    return key


def claim_runs(run_ids: Sequence[str], worker: str | None = None) -> list[Run | None]:
    """``claim_run`` for each of ``run_ids`` (valid run keys), in one transaction: per id, in
    order, the claimed run or None. The rows are locked in key order (two such transactions never
    deadlock), and an id given twice is claimed once (a message delivered twice)."""
    worker = worker or worker_id()
    now = timezone.now()
    with transaction.atomic():
        keys = [run_key(run_id) for run_id in run_ids]
        locked = Run.objects.select_for_update().filter(pk__in=set(keys)).order_by("pk")
        runs = {run.pk: run for run in locked}
        # popped: the same id again finds nothing to claim
        claimed = [_claim_locked(runs.pop(key, None), worker, now) for key in keys]
        taken = [run.pk for run in claimed if run is not None]
        if taken:
            # The rows are locked: what the claimed runs now hold in memory is their columns + 1.
            Run.objects.filter(pk__in=taken).update(
                claims=F("claims") + 1,
                claim_epoch=F("claim_epoch") + 1,
                status=Run.Status.RUNNING,
                worker=worker,
                heartbeat_at=now,
                started_at=Coalesce("started_at", Value(now)),
            )
        # Attempts an earlier claim left open (its worker died or was fenced out) end here: they
        # can stream nothing more into their run, and its attempts never overlap the new ones.
        # (Epoch 1 is a run's first claim: no earlier one made attempts.)
        resumed = [run.pk for run in claimed if run is not None and run.claim_epoch > 1]
        if resumed:
            Attempt.objects.filter(run_id__in=resumed, outcome=AttemptOutcome.PENDING).update(
                outcome=AttemptOutcome.INTERRUPTED, error_kind="worker_lost", ended_at=now
            )
    return claimed


def _claim_locked(run: Run | None, worker: str, now: datetime) -> Run | None:
    """One claim of a locked run, or None: not claimable, or ended here (too many claims, a
    cancel requested before it started). A claimed run's row is written by the caller, for the whole batch."""
    if run is None or run.is_terminal:
        return None
    stale_after = timedelta(seconds=app_settings.STALE_AFTER_SECONDS)
    if (
        run.status in Run.CLAIMED_STATUSES
        and run.worker
        and run.heartbeat_at is not None
        and now - run.heartbeat_at < stale_after
    ):
        return None  # alive elsewhere
    run.claims += 1
    run.claim_epoch += 1
    if run.claims > app_settings.MAX_CLAIMS:
        run.status = Run.Status.FAILED
        run.error_kind = "too_many_claims"
        run.error_message = f"claimed {run.claims} times without finishing; giving up (MAX_CLAIMS)"
        run.finished_at = now
        run.save()
        _settled_on_commit(run)
        log.error("run_claims_exceeded", run_id=str(run.pk), claims=run.claims)
        return None
    if run.cancel_requested and run.started_at is None:
        # Never streamed: cancelled here. One a worker started is claimed, cancelled from the
        # start (``execution``): its checkpoint may hold text its client was shown, which only a
        # worker can commit (``engine.turn``).
        run.status = Run.Status.CANCELLED
        _cancel_error_on(run)
        run.finished_at = now
        run.save()
        _settled_on_commit(run)
        return None
    run.status = Run.Status.RUNNING
    run.worker = worker
    run.heartbeat_at = now
    run.started_at = run.started_at or now
    return run


async def mark_recovering(run_id: str, fence: Fence | None = None) -> None:
    """A running run's stream broke: it is being recovered."""
    await _set_status(run_id, Run.Status.RUNNING, Run.Status.RECOVERING, fence)


async def mark_running(run_id: str, fence: Fence | None = None) -> None:
    """A recovering run streams again."""
    await _set_status(run_id, Run.Status.RECOVERING, Run.Status.RUNNING, fence)


async def _set_status(run_id: str, old: Any, new: Any, fence: Fence | None) -> None:
    """One conditional ``UPDATE``; with a fence, only while its claim is current."""
    if fence is None:
        await Run.objects.filter(pk=run_id, status=old).aupdate(status=new)
        return
    fence.check()
    changed = await Run.objects.filter(pk=run_id, status=old, claim_epoch=fence.epoch).aupdate(status=new)
    # nothing changed: nothing to change, or the run is not ours any more (only that is an error)
    if not changed and not await Run.objects.filter(pk=run_id, claim_epoch=fence.epoch).aexists():
        raise fence.lose()


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How a run ended, to store: ``finish``'s arguments, the claim's epoch in place of its fence."""

    run_id: str
    status: str
    error_kind: str = ""
    error_message: str = ""
    notices: Sequence[ToolNotice] = ()
    epoch: int | None = None  # the claim that may store it (None: no claim is checked)
    message: dict[str, Any] | None = None
    position: int = 0


def finish(
    run_id: str,
    status: str,
    error_kind: str = "",
    error_message: str = "",
    notices: Sequence[ToolNotice] = (),
    fence: Fence | None = None,
    message: dict[str, Any] | None = None,
    position: int = 0,
) -> None:
    """Store how the run ended, with its final answer (``message`` at ``position``) in the same
    transaction: a run is never completed without its answer, nor its answer committed while
    the run is not settled. ``notices`` wait on the thread for its next user message.

    With a fence, only while its claim is current (else ``ClaimLost``, nothing written).
    """
    epoch = fence.epoch if fence is not None else None
    finish_end(RunEnd(run_id, status, error_kind, error_message, notices, epoch, message, position), fence)


def finish_end(end: RunEnd, fence: Fence | None = None) -> None:
    """``finish`` with its arguments in a ``RunEnd`` (``fence``'s epoch in ``end.epoch``)."""
    if fence is not None:
        fence.check()
    if finish_many([end]) and fence is not None:
        raise fence.lose()


def finish_many(ends: Sequence[RunEnd]) -> set[str]:
    """``finish`` for each of ``ends`` (one per run), in one transaction: their runs' rows locked
    in key order, their answers in two statements, one update per kind of end. Returns the run
    ids whose claim is not current: nothing of theirs is written, the others' ends are."""
    now = timezone.now()
    with transaction.atomic():
        keys = [run_key(end.run_id) for end in ends]
        runs = {run.pk: run for run in Run.objects.select_for_update().filter(pk__in=set(keys)).order_by("pk")}
        lost: set[str] = set()
        kept: list[tuple[Run, RunEnd]] = []
        for key, end in zip(keys, ends, strict=True):
            run = runs.get(key)
            if run is None and end.epoch is None:
                raise Run.DoesNotExist(f"no run {end.run_id}")
            if run is None or (end.epoch is not None and run.claim_epoch != end.epoch):
                lost.add(end.run_id)
            else:
                kept.append((run, end))
        answers = [(run.thread_id, run.pk, end.message, end.position) for run, end in kept if end.message is not None]
        write_messages(answers)
        groups: dict[tuple[str, str, str], list[Any]] = {}
        for run, end in kept:
            groups.setdefault((end.status, end.error_kind, end.error_message), []).append(run.pk)
        for (status, error_kind, error_message), pks in groups.items():
            Run.objects.filter(pk__in=pks).update(
                status=status, error_kind=error_kind, error_message=error_message, finished_at=now
            )
        # Threads locked in key order too, after the runs
        for run, end in sorted(((run, end) for run, end in kept if end.notices), key=lambda pair: pair[0].thread_id):
            thread = Thread.objects.select_for_update().get(pk=run.thread_id)  # for create_run
            kept_notices = [stored_notice(notice) for notice in end.notices]
            thread.pending_notices = [*thread.pending_notices, *kept_notices]
            thread.save(update_fields=["pending_notices"])
        for run, _ in kept:
            _settled_on_commit(run)
    return lost


def _created_on_commit(run: Run) -> None:
    """Tell ``run_created``'s receivers (the thread's sockets) once the transaction commits."""
    run_id, thread_id = run.pk, run.thread_id
    transaction.on_commit(lambda: run_created.send(sender=Run, run_id=run_id, thread_id=thread_id))


def _settled_on_commit(run: Run) -> None:
    """Tell ``run_settled``'s receivers (the analytics rollup) once the transaction commits."""
    run_id = run.pk
    transaction.on_commit(lambda: run_settled.send(sender=Run, run_id=run_id))


def _cancel_error_on(run: Run) -> dict[str, str]:
    """A run cancelled without a worker ends with the error a worker's cancel stores (kind
    ``cancel``, the reason): REST and snapshots show one end for a cancel, whoever ended it."""
    error = cancel_error(run.cancel_reason)
    run.error_kind, run.error_message = error["kind"], error["message"]
    return error


def _cancel_awaits_worker_on_commit(run: Run) -> None:
    """Tell ``run_cancel_awaits_worker``'s receivers (which start the run) once the transaction commits."""
    run_id = run.pk
    transaction.on_commit(lambda: run_cancel_awaits_worker.send(sender=Run, run_id=run_id))


def _cancelled_in_queue_on_commit(run: Run, error: dict[str, str]) -> None:
    """Tell ``run_cancelled_in_queue``'s receivers (the run's sockets) once the transaction
    commits, with the error its ``run_status`` frame carries."""
    run_id = run.pk
    transaction.on_commit(lambda: run_cancelled_in_queue.send(sender=Run, run_id=run_id, error=error))


# ---- cancelling, re-queueing, sweeping ----------------------------------------------------


def request_cancel(run_id: str | uuid.UUID, reason: str = CANCELLED_BY_USER) -> bool:
    """Ask a run to stop. A queued run that never started is cancelled at once; a running one
    within a tick; a queued one that had started (its worker died) by the claim that
    ``run_cancel_awaits_worker``'s receiver makes at once, which commits the text its checkpoint kept."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.is_terminal:
            return False
        run.cancel_requested = True
        run.cancel_reason = reason[:200]
        if run.status == Run.Status.QUEUED and run.started_at is not None:
            # Its checkpoint may hold text its client was shown, which only a claim commits
            # (``engine.turn``): ended here, that text was lost. It stays queued, cancelled from
            # the start of its next claim (``_claim_locked``), which the receiver makes once this
            # commits, in this process (a worker's message for it then finds it claimed or ended).
            _cancel_awaits_worker_on_commit(run)
        elif run.status == Run.Status.QUEUED:
            # Decided under the run's lock: a claim now finds it cancelled, so no worker will
            # publish its end to the run's sockets; run_cancelled_in_queue's receiver does.
            run.status = Run.Status.CANCELLED
            run.finished_at = timezone.now()
            _settled_on_commit(run)
            _cancelled_in_queue_on_commit(run, _cancel_error_on(run))
        run.save()
    log.info("run_cancel_requested", run_id=str(run_id), reason=reason)
    return True


def requeue_run(run_id: str | uuid.UUID) -> bool:
    """Put a failed, exhausted or stale run back in the queue (claims start again).

    A run a live worker is executing (its heartbeat younger than ``STALE_AFTER_SECONDS``) is
    left alone: taking it would only fence that worker out mid-stream. So is a run whose
    answer is stored already (an exhausted or failed turn commits what its client was shown,
    cut short): executing it again would find the thread answered, ask the provider nothing
    and call the run completed. Its text goes on with the thread's next message instead. So is
    a run a follow-up in its thread came after (``_answer_stored``).
    Starts nothing: True tells the caller to start the run.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.status in (Run.Status.COMPLETED, Run.Status.CANCELLED, Run.Status.QUEUED):
            return False
        if run.status in Run.CLAIMED_STATUSES and not Run.objects.stale().filter(pk=run.pk).exists():
            return False
        if _answer_stored(run):
            return False
        run_requeued.send(sender=Run, run_id=run.pk)  # its figures are about to change
        run.status = Run.Status.QUEUED
        run.claims = 0
        run.claim_epoch += 1  # the old claim, if any, may write nothing more
        run.worker = ""
        run.heartbeat_at = timezone.now()  # queued since (the sweeper's ``stuck_queued``)
        run.error_kind = ""
        run.error_message = ""
        run.finished_at = None
        run.save()
    log.info("run_requeued", run_id=str(run_id))
    return True


def _answer_stored(run: Run) -> bool:
    """Whether the thread holds ``run``'s answer already: it ends with an assistant message of
    ``run``'s own that calls no tool (a call there waits for its result: run again, the run makes
    it and goes on, as after a sweep), or with a later run's messages (a follow-up went on from
    what this run stored; run again, it would find that follow-up's answer and ask nothing)."""
    last = run.thread.messages.order_by("-position").values_list("role", "run_id", "content").first()
    if last is None:
        return False
    role, owner, content = last
    if owner != run.pk:
        return True
    return role == Message.Role.ASSISTANT and not pending_tool_calls([{"role": role, "content": content or []}])


def sweep_stale_runs(seconds: float | None = None, queued_seconds: float | None = None) -> list[str]:
    """Hand back to the workers every run nobody is executing; returns their ids.

    - a claimed run whose worker stopped beating for ``seconds`` (``STALE_AFTER_SECONDS``)
      goes back to the queue;
    - a run ``queued`` for ``queued_seconds`` (``QUEUED_STALE_AFTER_SECONDS``) without a
      claim (its process restarted, its message was lost) is returned to be started again.

    Both are marked as queued now (``heartbeat_at``), so a run waiting in a long queue is
    handed out again at most once per ``queued_seconds``. A second start of a run is
    harmless: the claim refuses a run another live worker holds, and ``MAX_CLAIMS`` ends a
    run that keeps killing its worker. Then the checkpoints of settled runs that a failed
    delete left behind are deleted (``checkpoints.sweep_settled_checkpoints``).

    Starts nothing: the caller starts the runs returned.
    """
    swept: list[str] = []
    for run_id in Run.objects.stale(seconds=seconds).values_list("pk", flat=True):
        with transaction.atomic():
            run = Run.objects.stale(seconds=seconds).select_for_update().filter(pk=run_id).first()
            if run is None:  # finished or beat meanwhile
                continue
            run.status = Run.Status.QUEUED
            run.worker = ""
            run.claim_epoch += 1  # revoke the stale claim: its worker may write nothing more
            run.heartbeat_at = timezone.now()  # queued since
            run.save()
        swept.append(str(run_id))
        log.warning("run_swept", run_id=str(run_id))
    # not the runs just put back (queued "now"): with queued_seconds=0 they would be handed out twice
    for run_id in Run.objects.stuck_queued(seconds=queued_seconds).exclude(pk__in=swept).values_list("pk", flat=True):
        with transaction.atomic():
            run = Run.objects.stuck_queued(seconds=queued_seconds).select_for_update().filter(pk=run_id).first()
            if run is None:  # claimed or cancelled meanwhile
                continue
            run.heartbeat_at = timezone.now()
            run.save(update_fields=["heartbeat_at"])
        swept.append(str(run_id))
        log.warning("run_swept_from_queue", run_id=str(run_id))
    try:
        sweep_settled_checkpoints()
    except Exception as exc:  # the store is down: the next sweep tries again
        log.warning("checkpoint_sweep_failed", error=f"{type(exc).__name__}: {exc}")
    return swept


def wait_for_run(run_id: str, timeout_s: float = 600.0, poll_s: float = 0.2) -> Run:
    """Block until the run is terminal (a command line waiting on a worker)."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = Run.objects.get(pk=run_id)
        if run.is_terminal:
            return run
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {run.status} after {timeout_s:.0f}s")
        time.sleep(poll_s)
