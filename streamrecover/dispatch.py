"""Starting runs: the one place besides the Celery tasks that starts work.

``enqueue_run`` starts a run the configured way (a Celery task after commit, or a thread in
this process); ``requeue_run`` and ``sweep_stale_runs`` change state through
``runs.lifecycle`` and then start what it put back in the queue. ``execute_here`` executes a
run in this process with its frames published live (the Celery task and the in-process
thread both use it).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

from django.db import close_old_connections, transaction

from .conf import app_settings
from .engine.agent import RunResult
from .live.publisher import make_publisher
from .models import Run
from .runs import execution, lifecycle


@asynccontextmanager
async def live_publisher(run_id: str) -> AsyncIterator[execution.LiveSink]:
    """The run's live publisher (Channels) while the agent runs; closed (flushed) after."""
    publisher = await make_publisher(run_id)
    try:
        yield publisher
    finally:
        with suppress(Exception):
            await publisher.aclose()


async def execute_here(run_id: str, **options: Any) -> RunResult | None:
    """Claim and execute a run in this process, its frames published live.

    ``options`` are ``runs.execution.execute_run``'s (extra sinks, tools, a provider override).
    """
    return await execution.execute_run(run_id, live=live_publisher, **options)


def enqueue_run(run: Run | str | uuid.UUID) -> None:
    """Start a run the configured way: a Celery task after commit, or a thread in-process."""
    run_id = str(run.pk if isinstance(run, Run) else run)
    if app_settings.EXECUTION == "celery":
        from .tasks import execute_run_task  # tasks import this module: a real cycle

        transaction.on_commit(lambda: execute_run_task.delay(run_id))
    else:
        transaction.on_commit(lambda: start_in_thread(run_id))


def start_in_thread(run_id: str) -> threading.Thread:
    """Embedded mode: execute in a daemon thread with its own event loop."""

    def target() -> None:
        try:
            asyncio.run(execute_here(run_id))
        finally:
            close_old_connections()

    thread = threading.Thread(target=target, name=f"streamrecover-run-{run_id}", daemon=True)
    thread.start()
    return thread


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
