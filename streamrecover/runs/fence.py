"""Fencing: one claim of a run (its epoch), and the writes a worker may make only while it holds it.

Every claim raises ``Run.claim_epoch``; a sweep or re-queue raises it too (it revokes the
claim). A worker writes for its run only while the epoch it claimed with is still the run's:

- database writes lock the run's row and compare the epoch in the same transaction
  (``Fence.write``); a claim takes the same lock, so a write can never land after a newer claim;
- the heartbeat is one ``UPDATE ... WHERE claim_epoch = %s``; no row means the claim is lost;
- frames are not database writes and are far too many to check one by one: they go out only
  within the *lease*, half the stale window since the last heartbeat that succeeded. Nobody
  can take the run before its heartbeat is a whole stale window old, so within the lease the
  claim is still this worker's; past it, the worker beats first (``Fence.ensure``).

A refused write raises ``ClaimLost`` and marks the fence lost: every later write is refused
at once, without asking the database. A write that failed on its connection (a restarted
server, a terminated backend) is made once more on a fresh connection: its transaction was
rolled back, and the fenced writes are idempotent (``get_or_create``) or harmless to repeat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from ..engine.errors import ClaimLost
from ..engine.protocol import Frame
from ..engine.sink import AttemptRecord, RunSink, StructuredEvent
from ..models import Run

T = TypeVar("T")


class Fence:
    """One claim of one run: ``epoch`` is the fencing token the claim got."""

    def __init__(self, run_id: str, epoch: int, lease_s: float) -> None:
        self.run_id = str(run_id)
        self.epoch = epoch
        self.lease_s = lease_s
        self.lost = False
        self._lease_until = time.monotonic() + lease_s  # the claim itself wrote the heartbeat
        self._renewing: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"Fence(run_id={self.run_id!r}, epoch={self.epoch}, lost={self.lost})"

    def check(self) -> None:
        """Raise ``ClaimLost`` once the claim is known to be lost (no database round trip)."""
        if self.lost:
            raise ClaimLost(f"run {self.run_id}: claim {self.epoch} is lost")

    def lose(self) -> ClaimLost:
        self.lost = True
        return ClaimLost(f"run {self.run_id}: claim {self.epoch} is no longer current")

    # ---- database writes ------------------------------------------------------------------

    def hold(self) -> None:
        """Inside a transaction: lock the run's row and raise ``ClaimLost`` unless this claim
        is the current one. The row stays locked until the transaction ends."""
        self.check()
        if not self._held().exists():
            raise self.lose()

    def _held(self) -> QuerySet[Run]:
        """The run's row at this claim's epoch, to be locked."""
        return Run.objects.select_for_update().filter(pk=self.run_id, claim_epoch=self.epoch)

    def write(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (database writes) in one transaction, only while this claim is current;
        once more on a fresh connection when this thread's connection was broken."""
        self.check()
        return again_on_a_fresh_connection(lambda: self._write_once(fn))

    def _write_once(self, fn: Callable[[], T]) -> T:
        with transaction.atomic():
            self.hold()
            return fn()

    async def awrite(self, fn: Callable[[], T]) -> T:
        """``write`` from the event loop."""
        self.check()
        return await sync_to_async(self.write)(fn)

    # ---- the heartbeat and the lease ------------------------------------------------------

    async def beat(self) -> None:
        """The heartbeat: renews the lease, or raises ``ClaimLost`` when the run is not ours."""
        self.check()
        sent = time.monotonic()
        # the epoch alone: every takeover raises it (a run this claim settled is still its own);
        # once more on a fresh connection when the ORM thread's was terminated: a beat that
        # failed on it would fail the frame waiting for it, and with it the provider's stream
        # (continued, its rest billed again), for a connection that only needed replacing
        updated = await sync_to_async(again_on_a_fresh_connection)(self._beat_once)
        if not updated:
            raise self.lose()
        self.renewed(sent)

    def _beat_once(self) -> int:
        return Run.objects.filter(pk=self.run_id, claim_epoch=self.epoch).update(heartbeat_at=timezone.now())

    def renewed(self, sent: float) -> None:
        """A heartbeat sent at ``sent`` (monotonic) found the claim current: the lease runs from then."""
        self._lease_until = max(self._lease_until, sent + self.lease_s)

    async def ensure(self) -> None:
        """Before a write that is not checked in the database (a frame): nothing to do within the
        lease; past it (the event loop was blocked, the database slow), beat first."""
        self.check()
        if time.monotonic() < self._lease_until:
            return
        if self._renewing is None:
            self._renewing = asyncio.Lock()
        async with self._renewing:
            if time.monotonic() >= self._lease_until:
                await self.beat()


def again_on_a_fresh_connection(fn: Callable[[], T]) -> T:
    """``fn()`` (one transaction), and once more on a fresh connection when this thread's
    connection failed under it (a restarted server, a terminated backend): the transaction was
    rolled back, so ``fn`` must be idempotent. Never inside a caller's transaction."""
    try:
        return fn()
    except (OperationalError, InterfaceError):
        if connection.in_atomic_block:
            raise  # a caller's transaction: not ours to retry
        # The connection may still look usable (psycopg reports a terminated backend's
        # connection idle): drop it whatever it says, the retry opens a fresh one.
        connection.close()
    return fn()


class FencedSink:
    """A ``RunSink`` that hands nothing on once the claim is lost or past its lease (frames
    included); the recorder under it checks its own database writes against the epoch."""

    def __init__(self, inner: RunSink, fence: Fence) -> None:
        self.inner = inner
        self.fence = fence

    async def on_event(self, event: StructuredEvent) -> None:
        await self.fence.ensure()
        await self.inner.on_event(event)

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        await self.fence.ensure()
        await self.inner.on_attempt(attempt)

    async def on_frame(self, frame: Frame) -> None:
        await self.fence.ensure()
        await self.inner.on_frame(frame)

    async def on_message(self, message: dict[str, Any], position: int) -> None:
        await self.fence.ensure()
        await self.inner.on_message(message, position)
