"""The worker process's one event loop: every run the process executes shares it.

A thread and an event loop per run (``asyncio.run`` in each Celery task) made a hundred
runs a hundred threads fighting for the GIL, each loop with its own Redis and HTTP
connections, every frame its own round trips. Instead the process starts one loop in a
daemon thread on first use; a task hands its run's coroutine to it (``runs.holder``) and
returns once the run is claimed, so a run holds no thread of its own. The loop
interleaves the runs, and per-loop machinery (the live outbox, the Redis clients, the
heartbeat and cancel watcher) is shared by all of them. Each run still opens its own HTTP
client to the provider, so a broken connection (or an HTTP/2 GOAWAY) is one run's break, not
every run's on a shared connection. A forked child (Celery's prefork pool) starts its own
loop: a loop never crosses a fork.

Starting the loop also tunes the process's cyclic garbage collector (``gctuning``,
``GC_THRESHOLD``): what is alive when the first run starts (Django, Celery, the app) is frozen
out of the collector's full passes, which had stopped every run of a worker for up to 659 ms.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..gctuning import tune_collector

T = TypeVar("T")

THREAD_NAME = "streamrecover-loop"  # not starter.THREAD_PREFIX: no run thread of its own


class RunLoop:
    """A lazily started event loop in a daemon thread, per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or self._loop.is_closed():
                tune_collector()  # the process has loaded what its runs need (..gctuning)
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                threading.Thread(target=serve, name=THREAD_NAME, daemon=True).start()
                ready.wait()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the shared loop; its future, which no thread need wait for."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the shared loop; block this thread until it returns (or raises)."""
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # this thread was interrupted (a shutdown): stop the run too
            raise

    def is_current(self) -> bool:
        """Whether the running loop is the shared one."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return running is self._loop and self._pid == os.getpid()


_shared = RunLoop()


def run_on_shared_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Execute ``coro`` on this process's shared run loop, blocking until it ends."""
    return _shared.run(coro)


def shared_loop() -> asyncio.AbstractEventLoop:
    """This process's shared run loop, started if it was not."""
    return _shared.loop()


def on_shared_loop() -> bool:
    """Whether the caller runs on this process's shared run loop."""
    return _shared.is_current()
