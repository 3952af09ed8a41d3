"""The app's Celery tasks, a few lines each: the work is in ``starter`` and ``runs``.

None stores a result: what a run did is in the database, and with the threads pool Celery's
result backend is per thread, so storing one cost a Redis connection per worker thread."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_process_shutdown, worker_shutdown
from django.db import close_old_connections

from . import starter
from .analytics import rollup
from .conf import app_settings
from .engine.agent import RunResult
from .runs import lifecycle
from .runs.holder import holder
from .runs.loop import run_on_shared_loop

RUNNING = "running"  # what the task returns for a run it handed over, still streaming


@shared_task(
    bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True, name="streamrecover.execute_run"
)
def execute_run_task(self, run_id: str) -> str | None:
    """Execute (or resume) one run. A message for a finished run is acknowledged and dropped.

    In a worker the run is handed to the process's shared event loop (``runs.holder``) with
    every other run it holds, and the task returns once the run is claimed ("running"): the
    run holds no pool slot, and a worker holds up to ``WORKER_MAX_RUNS`` runs whatever its
    pool. Called directly or eagerly, the task waits for the run's end and returns its status."""
    close_old_connections()
    try:
        if self.request.called_directly or self.request.is_eager:
            return _status(run_on_shared_loop(starter.execute_here(run_id)))
        handover = holder.hand_over(
            lambda claimed: starter.execute_here(run_id, on_claimed=claimed), app_settings.WORKER_MAX_RUNS
        )
    finally:
        close_old_connections()
    return _status(handover.result) if handover.ended else RUNNING


def _status(result: object) -> str | None:
    return result.status if isinstance(result, RunResult) else None


@worker_shutdown.connect(dispatch_uid="streamrecover.drain_runs")
@worker_process_shutdown.connect(dispatch_uid="streamrecover.drain_runs_of_child")
def drain_runs(**_: Any) -> None:
    """A warm shutdown lets the runs this process holds end before it exits, as Celery lets a
    running task end (a cold shutdown, or a kill, leaves them to the sweep and their checkpoints)."""
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
