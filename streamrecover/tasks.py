"""The app's Celery tasks, a few lines each: the work is in ``starter`` and ``runs``.

None stores a result: what a run did is in the database, and with the threads pool Celery's
result backend is per thread, so storing one cost a Redis connection per worker thread."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from celery import shared_task
from celery.signals import worker_process_shutdown, worker_shutdown, worker_shutting_down
from django.db import close_old_connections

from . import starter
from .analytics import rollup
from .conf import app_settings
from .engine.agent import RunResult
from .runs import lifecycle
from .runs.holder import holder
from .runs.loop import run_on_shared_loop

RUNNING = "running"  # what the task returns for a run it handed over, still streaming
HANDED_BACK = "handed_back"  # what it returns when its process stayed full (or shuts down): its message is queued again

# How long a process shutting down waits before it offers the broker a run it refused again.
_RETRY_SECONDS = 1.0

log = structlog.get_logger("streamrecover")


@shared_task(
    bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True, name="streamrecover.execute_run"
)
def execute_run_task(self, run_id: str) -> str | None:
    """Execute (or resume) one run. A message for a finished run is acknowledged and dropped.

    In a worker the run is handed to the process's shared event loop (``runs.holder``) with
    every other run it holds, and the task returns once the run is claimed ("running"): the
    run holds no pool slot, and a worker holds up to ``WORKER_MAX_RUNS`` runs whatever its
    pool. A process still full after ``WORKER_FULL_WAIT_SECONDS`` sends the task again (same
    run, same queue) and returns "handed_back": a worker with room takes it, rather than the
    run waiting in a full worker that prefetched it. So does a process in a warm shutdown, at
    once: it starts no run. Called directly or eagerly, the task waits for the run's end and
    returns its status."""
    close_old_connections()
    try:
        if self.request.called_directly or self.request.is_eager:
            return _status(run_on_shared_loop(starter.execute_here(run_id)))

        def start(claimed: Callable[[], None]) -> Coroutine[Any, Any, RunResult | None]:
            return starter.execute_here(run_id, on_claimed=claimed)

        limit, wait = app_settings.WORKER_MAX_RUNS, app_settings.WORKER_FULL_WAIT_SECONDS
        handover = holder.hand_over(start, limit, wait)
        while handover is None:  # still full after ``wait``, or shutting down
            if _hand_back(self, run_id):
                return HANDED_BACK
            if holder.closed:  # hand_over would return at once: try the broker again in a while
                time.sleep(_RETRY_SECONDS)
            handover = holder.hand_over(start, limit, wait)  # the broker refused it: this thread keeps it
    finally:
        close_old_connections()
    return _status(handover.result) if handover.ended else RUNNING


def _hand_back(task: Any, run_id: str) -> bool:
    """Send ``task``'s message again, to the queue it came from (its id, priority and options
    kept, as Celery's ``retry`` does), for a worker with room; whether the broker took it. This
    message is acknowledged when the task returns: a crash before that leaves two, and the
    run's claim starts one (a queued run's claim is fenced like any other)."""
    try:
        task.signature_from_request().apply_async()
    except Exception:
        log.warning("run_hand_back_failed", run_id=run_id, exc_info=True)
        return False
    log.info("run_handed_back", run_id=run_id, runs=holder.held)
    return True


def _status(result: object) -> str | None:
    return result.status if isinstance(result, RunResult) else None


@worker_shutting_down.connect(dispatch_uid="streamrecover.start_no_runs")
def start_no_runs(**_: Any) -> None:
    """From the first signal of a shutdown (in the worker's main process: ``solo`` and ``threads``
    pools) the process starts no run: a task waiting for a place sends its run back to the queue
    at once, for another worker, rather than start it in a place a held run frees, where the
    shutdown would wait for it (or a cold one cut it short)."""
    holder.close()


@worker_shutdown.connect(dispatch_uid="streamrecover.drain_runs")
@worker_process_shutdown.connect(dispatch_uid="streamrecover.drain_runs_of_child")
def drain_runs(**_: Any) -> None:
    """A warm shutdown lets the runs this process holds end before it exits, as Celery lets a
    running task end (a cold shutdown, or a kill, leaves them to the sweep and their checkpoints);
    it starts none meanwhile."""
    holder.close()
    holder.drain()


@shared_task(ignore_result=True, name="streamrecover.sweep_stale_runs")
def sweep_stale_runs_task() -> list[str]:
    """Hand back to the workers runs nobody executes (a worker's heartbeat stopped, a queued run
    nobody claimed) and delete leftover checkpoints (schedule it every few seconds with beat)."""
    close_old_connections()
    swept = lifecycle.sweep_stale_runs()
    for run_id in swept:  # a worker's sweep hands the runs back to the workers
        execute_run_task.delay(run_id)
    return swept


@shared_task(ignore_result=True, name="streamrecover.fold_analytics")
def fold_analytics_task(limit: int = 50_000) -> int:
    """Fold settled runs into the analytics rollup (schedule it every minute or so with beat).

    Each run is folded after the commit that settles it (``runs.signals.run_settled``); this
    catches the rest (a fold that failed, a status set outside ``runs.lifecycle``, a history
    from before the rollup existed). Bounded by ``limit`` so one call never runs for long.
    """
    close_old_connections()
    return rollup.fold_all(limit=limit)
