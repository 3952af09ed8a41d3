"""Signals a run's lifecycle sends, so the code above it (the analytics rollup) can follow.

``run_settled`` is sent once the transaction that made a run terminal has committed;
``run_requeued`` inside the transaction that puts a finished run back in the queue, before
its state changes; ``run_cancelled_in_queue`` once the transaction that cancelled a run no
worker held has committed (no worker will publish its end: the receiver does), with the
``error`` its end carries; ``run_cancel_awaits_worker`` once the transaction that asked a queued
run that had started to stop has committed (it must be claimed to be ended: the receiver claims it
in a thread of this process); ``run_created`` once the transaction that created a run has
committed, with its ``thread_id`` too (the thread's sockets hear of it). All
carry ``run_id``. ``streamrecover.receivers`` connects them.
"""

from __future__ import annotations

from django.dispatch import Signal

run_created = Signal()
run_settled = Signal()
run_requeued = Signal()
run_cancelled_in_queue = Signal()
run_cancel_awaits_worker = Signal()
