"""Work a run's settlement leaves for after its clients have the end, batched across a loop's runs.

A worker's runs share one thread for their ORM calls. Work that receivers of
``run_settled`` did in the settling call (the analytics fold: a few milliseconds of query
building and round trips, the same for one run as for a hundred) sat between the commit and
the run's last frames, and when many runs ended together every later run's end waited behind
all of it: seconds, at a few hundred streams. Inside ``execute_run`` (``deferring``) such a
receiver notes its work instead (``defer``); once the run's live channel is closed,
``run_deferred`` does it, and the runs of one event loop waiting for the same work at the
same time get one call with all their ids. Elsewhere (a cancel from a view, the admin)
``defer`` returns False and the receiver does its work at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from asgiref.sync import sync_to_async

Work = Callable[[list[Any]], None]  # called with run ids, in a thread where the ORM may be used

# The work noted in this context (a list: asgiref runs ORM calls in a copy of the context, so
# the list is shared, not the variable's value).
_noted: contextvars.ContextVar[list[tuple[Work, Any]] | None] = contextvars.ContextVar(
    "streamrecover_deferred", default=None
)


@contextlib.contextmanager
def deferring() -> Iterator[list[tuple[Work, Any]]]:
    """Within it, ``defer`` notes work in the list it yields (for ``run_deferred``)."""
    noted: list[tuple[Work, Any]] = []
    token = _noted.set(noted)
    try:
        yield noted
    finally:
        _noted.reset(token)


def defer(work: Work, run_id: Any) -> bool:
    """Note ``work`` for ``run_id`` when inside ``deferring``; False elsewhere (do it now)."""
    noted = _noted.get()
    if noted is None:
        return False
    noted.append((work, run_id))
    return True


class _Batch:
    """One loop's pending calls of one piece of work: whoever finds no call under way starts
    one, which takes everything that came in while the one before it was queued or running."""

    def __init__(self, work: Work) -> None:
        self.work = work
        self.pending: list[Any] = []
        self.waiters: list[asyncio.Future[None]] = []
        self.draining: asyncio.Task[None] | None = None

    async def add(self, run_ids: list[Any]) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.pending.extend(run_ids)
        self.waiters.append(done)
        if self.draining is None or self.draining.done():
            # a context of its own: not the first waiting run's (its log fields, its deferral)
            self.draining = loop.create_task(self._drain(), context=contextvars.Context())
        await asyncio.shield(done)  # a cancelled run leaves the others' call alone

    async def _drain(self) -> None:
        while self.pending:
            run_ids, waiters = self.pending, self.waiters
            self.pending, self.waiters = [], []
            try:
                await sync_to_async(self.work)(run_ids)
            finally:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)


_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Work, _Batch]] = weakref.WeakKeyDictionary()


async def run_deferred(noted: list[tuple[Work, Any]]) -> None:
    """Do the work noted (with whatever the loop's other runs noted of it meanwhile); returns
    once it is done. The work handles its own errors (a receiver's are its own)."""
    by_work: dict[Work, list[Any]] = {}
    for work, run_id in noted:
        by_work.setdefault(work, []).append(run_id)
    batches = _batches.setdefault(asyncio.get_running_loop(), {})
    for work, run_ids in by_work.items():
        batch = batches.get(work)
        if batch is None:
            batch = batches[work] = _Batch(work)
        await batch.add(run_ids)
