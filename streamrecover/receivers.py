"""The app's signal receivers, connected explicitly by ``connect()`` (called in ``apps.ready``)."""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.db.models.signals import pre_delete

from .analytics import rollup
from .conf import reload_app_settings
from .live.publisher import announce_cancelled_in_queue
from .live.threads import announce_run_started
from .models import Run
from .runs import deferred
from .runs.signals import run_cancel_awaits_worker, run_cancelled_in_queue, run_created, run_requeued, run_settled
from .starter import start_in_thread


def announce_created_run(sender: Any, run_id: Any, thread_id: int, **kwargs: Any) -> None:
    """A run just created: every page of its thread's owner open on the thread follows it."""
    announce_run_started(thread_id, str(run_id))


def fold_settled_run(sender: Any, run_id: Any, **kwargs: Any) -> None:
    """A run that just settled goes into the analytics rollup (best effort); a worker's run
    once its clients have the end, with the other runs ending then (``runs.deferred``)."""
    if not deferred.defer(rollup.fold_settled, run_id):
        rollup.fold_settled([run_id])


def unfold_requeued_run(sender: Any, run_id: Any, **kwargs: Any) -> None:
    """A run going back to the queue leaves the rollup: its figures are about to change."""
    rollup.unfold_run(run_id)


def publish_cancelled_run(sender: Any, run_id: Any, error: dict[str, str], **kwargs: Any) -> None:
    """A run cancelled before any worker claimed it: its sockets get its end now (no worker will
    send it), not at their next catch-up check."""
    announce_cancelled_in_queue(str(run_id), error)


def start_cancelled_run(sender: Any, run_id: Any, **kwargs: Any) -> None:
    """A queued run cancelled after it had started: claimed here, in a thread of the process that
    cancelled it, which commits what its checkpoint kept and ends it, asking the provider nothing.
    Not handed to the workers: the run would stay ``queued`` until one was free (none is, when its
    worker died alone), and its clients would not see the cancel. A worker that takes a message
    queued for it later finds it ended (or claimed) and runs nothing."""
    start_in_thread(str(run_id))


def unfold_deleted_run(sender: type[Run], instance: Run, **kwargs: Any) -> None:
    """A deleted run leaves the figures, as it leaves its rows (its events are still there now)."""
    rollup.unfold_run(instance.pk)  # the instance's flag may be stale: the database's counts


def connect() -> None:
    """Connect every receiver; ``dispatch_uid`` makes a second call change nothing."""
    setting_changed.connect(reload_app_settings, dispatch_uid="streamrecover.reload_app_settings")
    run_created.connect(announce_created_run, dispatch_uid="streamrecover_announce_created_run")
    run_settled.connect(fold_settled_run, dispatch_uid="streamrecover_fold_settled_run")
    run_requeued.connect(unfold_requeued_run, dispatch_uid="streamrecover_unfold_requeued_run")
    run_cancelled_in_queue.connect(publish_cancelled_run, dispatch_uid="streamrecover_publish_cancelled_run")
    run_cancel_awaits_worker.connect(start_cancelled_run, dispatch_uid="streamrecover_start_cancelled_run")
    pre_delete.connect(unfold_deleted_run, sender=Run, dispatch_uid="streamrecover_unfold_deleted_run")
