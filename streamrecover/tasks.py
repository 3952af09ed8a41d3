"""The app's Celery tasks, a few lines each: the work is in ``starter`` and ``runs``.

None stores a result: what a run did is in the database, and with the threads pool Celery's
result backend is per thread, so storing one cost a Redis connection per worker thread."""

from __future__ import annotations

from celery import shared_task
from django.db import close_old_connections

from . import starter
from .analytics import rollup
from .runs import lifecycle
from .runs.loop import run_on_shared_loop


@shared_task(
    bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True, name="streamrecover.execute_run"
)
def execute_run_task(self, run_id: str) -> str | None:
    """Execute (or resume) one run. A message for a finished run is acknowledged and dropped.

    The run executes on the process's shared event loop (``runs.loop``) with every other run
    of this worker; this task's thread waits for it."""
    close_old_connections()
    try:
        result = run_on_shared_loop(starter.execute_here(run_id))
    finally:
        close_old_connections()
    return result.status if result is not None else None


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
