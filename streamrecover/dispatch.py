"""Starting runs the configured way: a Celery task after commit, or a thread in this process.

``requeue_run`` and ``sweep_stale_runs`` change state through ``runs.lifecycle`` and then
start what it put back in the queue.
"""

from __future__ import annotations

import uuid

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from .conf import app_settings
from .models import Run
from .runs import lifecycle
from .starter import start_in_thread


def enqueue_run(run: Run | str | uuid.UUID) -> None:
    """Start a run the configured way: a Celery task after commit, or a thread in-process."""
    run_id = str(run.pk if isinstance(run, Run) else run)
    if app_settings.EXECUTION == "celery":
        from .tasks import execute_run_task  # Celery is the distributed extra: imported only when used

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


def sweep_stale_runs(seconds: float | None = None, queued_seconds: float | None = None) -> list[str]:
    """Start again the runs nobody executes (stale running ones, long-queued ones); their ids.

    See ``lifecycle.sweep_stale_runs``. In the one-process mode the runs start in threads of
    this process: call it from the long-lived web process, not from a short-lived one (the
    ``streamrecover_sweep`` command executes them itself instead).
    """
    swept = lifecycle.sweep_stale_runs(seconds, queued_seconds)
    for run_id in swept:
        enqueue_run(run_id)
    return swept


def check_celery_reachable(timeout_s: float = 3.0) -> None:
    """Raise ``ImproperlyConfigured`` unless a run handed to Celery can reach a broker.

    Without this a run enqueued with no Celery app loaded (Celery's fallback app has no
    broker) or with the broker down waits in ``queued`` for nobody. A missing *worker* is not
    detected here (a busy worker does not answer pings): the caller's wait times out instead.
    """
    try:
        from celery import current_app
    except ImportError as exc:
        raise ImproperlyConfigured(
            "EXECUTION is 'celery' but Celery is not installed: install the package's 'distributed' extra."
        ) from exc
    app = current_app._get_current_object()
    broker = app.conf.broker_write_url or app.conf.broker_url
    if not broker:
        raise ImproperlyConfigured(
            "EXECUTION is 'celery' but no Celery app with a broker is loaded: define one in your project's "
            "celery.py, import it in the project package's __init__.py, and set CELERY_BROKER_URL "
            "(README: 'Plugging it into an existing Django project')."
        )
    with app.connection_for_write() as conn:
        try:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout_s)
        except Exception as exc:  # whatever the transport raises: it is not reachable
            raise ImproperlyConfigured(
                f"EXECUTION is 'celery' but the Celery broker ({conn.transport_cls} at {conn.hostname}:{conn.port}) "
                f"cannot be reached: {exc}"
            ) from exc
