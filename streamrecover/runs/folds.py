"""A worker's settled runs go into the analytics rollup after their clients have the end, many per fold.

Folding a run is a few milliseconds of ORM work (mostly building queries), the same for one
run as for a hundred. A worker's runs share one thread for their ORM calls, so folding each
run as its settlement commits put that work between the commit and the run's last frames,
and when many runs ended together every later settlement (and every run's end on its
clients' screens) waited behind all the folds before it: seconds at a few hundred streams.
Inside ``execute_run`` the fold is noted instead (``deferring``), done once the run's live
channel is closed (``fold``), and the runs of one event loop that are waiting for a fold at
the same time are folded in one call. Elsewhere (a cancel from a view, the admin) a settled
run is folded at once, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import weakref
from collections.abc import Iterator
from typing import Any

from asgiref.sync import sync_to_async

from ..analytics import rollup

# The runs settled in this context whose fold waits for ``fold`` (a list: asgiref runs ORM
# calls in a copy of the context, so the list is shared, not the variable's value).
_deferred: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("streamrecover_deferred", default=None)


@contextlib.contextmanager
def deferring() -> Iterator[list[Any]]:
    """Within it, a run that settles is noted in the list it yields instead of folded."""
    settled: list[Any] = []
    token = _deferred.set(settled)
    try:
        yield settled
    finally:
        _deferred.reset(token)


def defer(run_id: Any) -> bool:
    """Note ``run_id`` for a later ``fold`` when inside ``deferring``; False elsewhere."""
    settled = _deferred.get()
    if settled is None:
        return False
    settled.append(run_id)
    return True


class _Folder:
    """One event loop's pending folds: whoever finds none under way starts one, which folds
    everything that came in while the one before it was queued or running."""

    def __init__(self) -> None:
        self.pending: list[Any] = []
        self.waiters: list[asyncio.Future[None]] = []
        self.draining: asyncio.Task[None] | None = None

    async def fold(self, run_ids: list[Any]) -> None:
        done = asyncio.get_running_loop().create_future()
        self.pending.extend(run_ids)
        self.waiters.append(done)
        if self.draining is None or self.draining.done():
            # a context of its own: not the first waiting run's (its log fields, its deferral)
            loop = asyncio.get_running_loop()
            self.draining = loop.create_task(self._drain(), context=contextvars.Context())
        await asyncio.shield(done)  # a cancelled run leaves the others' fold alone

    async def _drain(self) -> None:
        while self.pending:
            run_ids, waiters = self.pending, self.waiters
            self.pending, self.waiters = [], []
            try:
                await sync_to_async(rollup.fold_settled, thread_sensitive=True)(run_ids)
            finally:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)


_folders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Folder] = weakref.WeakKeyDictionary()


async def fold(run_ids: list[Any]) -> None:
    """Fold ``run_ids`` (settled runs), with whatever else this loop is folding; returns once
    they are folded (or the fold failed: logged, and the periodic fold takes them later)."""
    if not run_ids:
        return
    loop = asyncio.get_running_loop()
    folder = _folders.get(loop)
    if folder is None:
        folder = _folders[loop] = _Folder()
    await folder.fold(run_ids)
