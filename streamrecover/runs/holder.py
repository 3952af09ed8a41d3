"""The runs a worker process holds on its shared loop, each without a thread: admission, hand-over, drain.

A Celery task used to block its thread (its pool slot) until its run ended, so a worker held as
many runs as it had slots, and each held a thread's stack and Celery's request for the whole
stream. Now the task waits only for a place (``WORKER_MAX_RUNS`` runs per process) and for
the run's claim, then returns: its message is acknowledged once the run is claimed, and from
then on a dead worker's run is the sweep's to hand back (its heartbeat stops), as it always
was. A warm shutdown waits for the runs the process holds (``drain``) before the process exits.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from .loop import submit_to_shared_loop

log = structlog.get_logger("streamrecover")

T = TypeVar("T")

# How often a thread waiting for a place or a drain looks again: the waits are woken when a run
# ends; the period only keeps them responsive to a signal (a second Ctrl-C is a cold shutdown).
_WAKE_SECONDS = 1.0


@dataclass(frozen=True)
class Handover:
    """What became of a run handed to the loop, when the hand-over returned."""

    ended: bool  # the run's coroutine had already returned (``result`` is what it returned)
    result: object = None


class RunHolder:
    """Counts the runs this process holds on its loop and bounds them (one per process)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held = 0

    @property
    def held(self) -> int:
        """The runs this process holds now."""
        return self._held

    def hand_over(self, start: Callable[[Callable[[], None]], Coroutine[Any, Any, T]], limit: int) -> Handover:
        """Start ``start(claimed)`` on the loop once fewer than ``limit`` runs are held, and return
        when it calls ``claimed()`` (it holds its run now) or returns (it ends, or claimed nothing).

        An exception the coroutine raises before the hand-over returns is raised here; one it
        raises later is logged (nothing waits for it any more)."""
        with self._changed:
            while self._held >= max(1, limit):  # a full process: this task's thread waits, the broker keeps the rest
                self._changed.wait(_WAKE_SECONDS)
            self._held += 1
        claimed = threading.Event()
        handed = threading.Event()
        try:
            future = submit_to_shared_loop(start(claimed.set))
        except BaseException:
            self._release()
            raise

        def ended(done: concurrent.futures.Future[T]) -> None:
            self._release()
            claimed.set()
            if handed.is_set() and not done.cancelled() and done.exception() is not None:
                log.error("run_crashed", exc_info=done.exception())

        future.add_done_callback(ended)
        try:
            claimed.wait()
        except BaseException:
            future.cancel()  # this thread was interrupted (a cold shutdown): stop the run too
            raise
        handed.set()
        if not future.done():
            return Handover(ended=False)
        return Handover(ended=True, result=future.result())  # raises the coroutine's exception

    def _release(self) -> None:
        with self._changed:
            self._held -= 1
            self._changed.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until this process holds no run (or ``timeout`` passed); whether none is left."""
        with self._changed:
            if self._held:
                log.info("worker_draining_runs", runs=self._held)
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._held:
                left = _WAKE_SECONDS if deadline is None else min(_WAKE_SECONDS, deadline - time.monotonic())
                if left <= 0:
                    break
                self._changed.wait(left)
            return self._held == 0


holder = RunHolder()
