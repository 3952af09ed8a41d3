"""The runs a worker process holds on its shared loop, each without a thread: admission, hand-over, drain.

A Celery task used to block its thread (its pool slot) until its run ended, so a worker held as
many runs as it had slots, and each held a thread's stack and Celery's request for the whole
stream. Now the task waits only for a place (``WORKER_MAX_RUNS`` runs per process) and for
the run's claim, then returns: its message is acknowledged once the run is claimed, and from
then on a dead worker's run is the sweep's to hand back (its heartbeat stops), as it always
was. A task that finds no place within ``WORKER_FULL_WAIT_SECONDS`` starts nothing (``hand_over``
returns None): its task sends its run back to the queue, for a worker with room. A warm shutdown
starts no run (``close``: a task waiting for a place, or arriving later, gets None at once, and
sends its run back) and waits for the runs the process holds (``drain``) before the process exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from .loop import shared_loop

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
        self._closed = False

    @property
    def held(self) -> int:
        """The runs this process holds now."""
        return self._held

    @property
    def closed(self) -> bool:
        """Whether this process starts no more runs (a warm shutdown began)."""
        return self._closed

    def close(self) -> None:
        """Start no more runs: a hand-over waiting for a place, and any later one, returns None at
        once (its task sends its run back to the queue), since a place that frees up in a process
        shutting down would start a run the shutdown then waits for, or cuts short."""
        self._closed = True
        # called in Celery's signal handler: the lock is reentrant (a main thread interrupted under it
        # goes on) and other threads hold it for a few lines at most
        with self._changed:
            self._changed.notify_all()

    def hand_over(
        self,
        start: Callable[[Callable[[], None]], Coroutine[Any, Any, T]],
        limit: int,
        wait: float | None = None,
    ) -> Handover | None:
        """Start ``start(claimed)`` on the loop once fewer than ``limit`` runs are held, and return
        when it calls ``claimed()`` (it holds its run now) or returns (it ends, or claimed nothing).
        None, with nothing started, when the process is still full after ``wait`` seconds (None:
        wait as long as it takes), or at once when it is closed (``close``).

        An exception the coroutine raises before the hand-over returns is raised here; one it
        raises later is logged (nothing waits for it any more)."""
        deadline = None if wait is None else time.monotonic() + wait
        with self._changed:
            # a full process: this task's thread waits, the broker keeps the rest; a closed one starts nothing
            while self._closed or self._held >= max(1, limit):
                left = _WAKE_SECONDS if deadline is None else min(_WAKE_SECONDS, deadline - time.monotonic())
                if self._closed or left <= 0:
                    return None
                self._changed.wait(left)
            self._held += 1
        handing = _Handing(self)
        try:
            loop = shared_loop()
            coro = start(handing.wake)
            loop.call_soon_threadsafe(handing.begin, loop, coro)
        except BaseException:
            self._release()
            raise
        try:
            handing.wait()
        except BaseException:
            loop.call_soon_threadsafe(handing.cancel)  # this thread was interrupted (a cold shutdown): stop the run too
            raise
        handing.handed = True
        if not handing.ended:
            return Handover(ended=False)
        if handing.error is not None:
            raise handing.error  # the coroutine's exception
        return Handover(ended=True, result=handing.result)

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


class _Handing:
    """One hand-over, between the task's thread and the loop, kept by the run's task until it ends:
    a latch (a lock taken until the run is claimed or ends) and the outcome, in slots. It replaced
    two ``threading.Event`` and the concurrent future ``run_coroutine_threadsafe`` returns, kept
    as long: a condition, a lock and a 760-byte deque each, 4 KB per run a worker holds."""

    __slots__ = ("_holder", "_latch", "ended", "error", "handed", "result", "task")

    def __init__(self, holder: RunHolder) -> None:
        self._holder = holder
        self._latch = threading.Lock()
        self._latch.acquire()
        self.task: asyncio.Task[Any] | None = None
        self.ended = False  # the coroutine returned or raised (``result``, ``error``)
        self.result: object = None
        self.error: BaseException | None = None
        self.handed = False  # the hand-over returned: nothing waits for the outcome any more

    def wait(self) -> None:
        """In the task's thread: until the run is claimed or ends."""
        self._latch.acquire()

    def wake(self) -> None:
        """On the loop (the run's ``claimed``, and its end): let the task's thread go on."""
        if self._latch.locked():
            self._latch.release()

    def begin(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> None:
        """On the loop: the run's task."""
        try:
            self.task = loop.create_task(coro)
        except BaseException as exc:  # the loop is closing: the coroutine never ran
            coro.close()
            self._end(None, exc)
            return
        self.task.add_done_callback(self._ended)

    def cancel(self) -> None:
        """On the loop, after ``begin``: the task's thread gave up waiting."""
        if self.task is not None:
            self.task.cancel()

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self._end(None, concurrent.futures.CancelledError())
            return
        error = task.exception()
        self._end(None if error is not None else task.result(), error)

    def _end(self, result: object, error: BaseException | None) -> None:
        self._holder._release()
        self.result, self.error, self.ended = result, error, True
        self.wake()
        if self.handed and error is not None and not isinstance(error, concurrent.futures.CancelledError):
            log.error("run_crashed", exc_info=error)


holder = RunHolder()
