"""Starting runs the configured way: a Celery task after commit, or a thread in this process.

``requeue_run`` and ``sweep_stale_runs`` change state through ``runs.lifecycle`` and then
start what it put back in the queue.
"""

from __future__ import annotations

import uuid

from django.db import transaction

from .conf import app_settings
from .models import Run
from .runs import lifecycle
from .starter import start_in_thread
from .tasks import execute_run_task


def enqueue_run(run: Run | str | uuid.UUID) -> None:
    """Start a run the configured way: a Celery task after commit, or a thread in-process."""
    run_id = str(run.pk if isinstance(run, Run) else run)
    if app_settings.EXECUTION == "celery":
        transaction.on_commit(lambda: execute_run_task.delay(run_id))
    else:
        transaction.on_commit(lambda: start_in_thread(run_id))


def requeue_run(run_id: str | uuid.UUID) -> bool:
    """Put a failed, exhausted or stale run back in the queue and start it."""
    with transaction.atomic():
        if not lifecycle.requeue_run(run_id):
            return False
        enqueue_run(run_id)
    return True


def sweep_stale_runs(seconds: float | None = None) -> list[str]:
    """Put runs whose worker stopped beating back in the queue and start them; their ids."""
    swept = lifecycle.sweep_stale_runs(seconds)
    for run_id in swept:
        enqueue_run(run_id)
    return swept
