"""Many runs' attempt rows in one transaction per trip to the ORM thread.

Every attempt is written twice: a row when it starts (so an attempt a dead worker left open is
known) and the same row, completed, when it ends, with the run's token totals recomputed. Run by
run, each write was a transaction of its own: the fence's locking read, the upsert and, at the
end, an aggregate and an update. On a worker's shared loop every run's ORM calls go through one
thread, and at 500 streams the attempt rows were about 30% of that thread's time, most of it
Django building the same statements again and again, with the GIL held while the run loop waited
for it. Here a write is staged and awaited; one flusher per loop sends what has gathered since
its last trip in one transaction: one locking read of the runs' rows (in primary-key order, so
two such transactions never deadlock), one upsert of every row, and the totals of the
runs whose attempt ended. Each writer learns its own outcome: written, or ``ClaimLost`` when a
newer claim holds its run (the other runs' rows are written all the same). Used on a worker's
shared loop only; elsewhere (a thread and a loop per run) a run's writes are one transaction each.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Count, Q, Sum

from ..engine.sink import AttemptRecord
from ..models import Attempt, Run
from .fence import Fence, again_on_a_fresh_connection
from .rows import upsert_attempts

# Writes per transaction. Small on purpose: the runs of one batch resume together, and 40 of them
# (what gathered at 500 streams with no bound) resumed as one burst of loop work that the frames
# published meanwhile waited behind; 8 keeps most of the saving (one upsert for 8 rows costs
# about what 2 cost one by one) without the burst.
MAX_BATCH = 8


@dataclass(slots=True)
class _Staged:
    fence: Fence
    attempt: AttemptRecord
    outcome: asyncio.Future[None]


class AttemptWrites:
    """One per event loop: ``write`` stages an attempt's row and waits for its own outcome."""

    def __init__(self) -> None:
        self._pending: list[_Staged] = []
        self._flusher: asyncio.Task[None] | None = None
        self.transactions = 0  # batches sent

    async def write(self, fence: Fence, attempt: AttemptRecord) -> None:
        """Upsert ``attempt``'s row (and, once it has ended, its run's totals) while ``fence``'s
        claim is current; ``ClaimLost`` otherwise. The caller must not change ``attempt`` until
        this returns (the row is built from it in the ORM thread)."""
        fence.check()
        outcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Staged(fence, attempt, outcome))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_all())
        await outcome  # a cancelled caller cancels ``outcome``: not sent yet, the write is skipped

    async def _flush_all(self) -> None:
        while self._pending:
            staged = [s for s in self._pending[:MAX_BATCH] if not s.outcome.done()]
            del self._pending[:MAX_BATCH]
            if not staged:
                continue
            writes = [(s.fence.run_id, s.fence.epoch, s.attempt) for s in staged]
            try:
                lost = await sync_to_async(write_attempts)(writes)
                self.transactions += 1
            except asyncio.CancelledError:  # the loop is closing: nothing staged waits forever
                for s in [*staged, *self._pending]:
                    s.outcome.cancel()
                raise
            except Exception as exc:  # each writer's sink logs its own failure and carries on
                for s in staged:
                    if not s.outcome.done():
                        s.outcome.set_exception(exc)
                continue
            for index, s in enumerate(staged):
                _tell(s, lost)
                try:
                    # One writer back per turn of the loop: otherwise the runs of a batch resume
                    # in one turn (each ending run closes its live channel and settles), and every
                    # frame published meanwhile waits for the outbox until they are all through.
                    await asyncio.sleep(0)
                except asyncio.CancelledError:  # the loop is closing: the rest are written, say so
                    for rest in staged[index + 1 :]:
                        _tell(rest, lost)
                    raise


def _tell(staged: _Staged, lost: set[str]) -> None:
    """The writer's outcome: written, or ``ClaimLost`` when its run's claim is not current."""
    if staged.outcome.done():
        return
    if staged.fence.run_id in lost:
        staged.outcome.set_exception(staged.fence.lose())
    else:
        staged.outcome.set_result(None)


def write_attempts(writes: Sequence[tuple[str, int, AttemptRecord]]) -> set[str]:
    """Upsert the attempts of ``writes`` (run id, claim epoch, attempt) in one transaction,
    only those whose claim is still their run's; returns the run ids whose claim is not."""
    return again_on_a_fresh_connection(lambda: _write_once(writes))


def _write_once(writes: Sequence[tuple[str, int, AttemptRecord]]) -> set[str]:
    with transaction.atomic():
        run_ids = sorted({run_id for run_id, _, _ in writes})
        current = Run.objects.select_for_update().filter(pk__in=run_ids).order_by("pk").values_list("pk", "claim_epoch")
        epochs = {str(pk): epoch for pk, epoch in current}
        lost = {run_id for run_id, epoch, _ in writes if epochs.get(run_id) != epoch}
        latest: dict[tuple[str, int], AttemptRecord] = {}
        ended: set[str] = set()
        for run_id, _, attempt in writes:
            if run_id in lost:
                continue
            # A start and the end of one attempt in one batch: the end (written later) is the row.
            latest[(run_id, attempt.index)] = attempt
            if attempt.ended_at is not None:
                ended.add(run_id)
        upsert_attempts((run_id, attempt) for (run_id, _), attempt in latest.items())
        refresh_totals(ended)
    return lost


def refresh_totals(run_ids: Iterable[str]) -> None:
    """The runs' totals from their attempt rows: recomputed, so a repeated call changes nothing."""
    ids = sorted(set(run_ids))
    if not ids:
        return
    totals = (
        Attempt.objects.filter(run_id__in=ids)
        .values("run_id")
        .annotate(
            input_tokens=Sum("input_tokens", default=0),
            output_tokens=Sum("output_tokens", default=0),
            attempt_count=Count("id"),
            continuation_count=Count("id", filter=Q(kind=Attempt.Kind.CONTINUATION)),
        )
        .order_by()
    )
    for row in totals:
        Run.objects.filter(pk=row.pop("run_id")).update(**row)


_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AttemptWrites] = weakref.WeakKeyDictionary()


def attempt_writes() -> AttemptWrites:
    """The running loop's batcher."""
    return _batchers.setdefault(asyncio.get_running_loop(), AttemptWrites())
