"""Many runs' attempt rows in one transaction per trip to the ORM thread.

Every attempt is written twice: a row when it starts (so an attempt a dead worker left open is
known) and the same row, completed, when it ends, with the run's token totals recomputed. Run by
run, each write was a transaction of its own: the fence's locking read, the upsert and, at the
end, an aggregate and an update. On a worker's shared loop every run's ORM calls go through one
thread, and at 500 streams the attempt rows were about 30% of that thread's time, most of it
Django building the same statements again and again, with the GIL held while the run loop waited
for it. Here a write is staged and awaited (``staged``); one flusher per loop sends what has
gathered since its last trip in one transaction: one locking read of the runs' rows (in
primary-key order, so two such transactions never deadlock), one upsert of every row, and the
totals of the runs whose attempt ended. Each writer learns its own outcome: written, or
``ClaimLost`` when a newer claim holds its run (the other runs' rows are written all the same).
Used on a worker's shared loop only; elsewhere (a thread and a loop per run) a run's writes are
one transaction each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Count, Q, Sum

from ..engine.sink import AttemptRecord
from ..models import Attempt, Run
from .fence import Fence, again_on_a_fresh_connection
from .rows import upsert_attempts
from .staged import StagedBatches

# Writes per transaction. Small on purpose: the runs of one batch resume together, and 40 of them
# (what gathered at 500 streams with no bound) resumed as one burst of loop work that the frames
# published meanwhile waited behind; 8 keeps most of the saving (one upsert for 8 rows costs
# about what 2 cost one by one) without the burst.
MAX_BATCH = 8


@dataclass(frozen=True, slots=True)
class _Write:
    fence: Fence
    attempt: AttemptRecord


class AttemptWrites(StagedBatches[_Write, None]):
    """One per event loop: ``write`` stages an attempt's row and waits for its own outcome."""

    max_batch = MAX_BATCH
    # Each ending run closes its live channel and settles once told: one back per loop turn.
    one_per_turn = True

    async def write(self, fence: Fence, attempt: AttemptRecord) -> None:
        """Upsert ``attempt``'s row (and, once it has ended, its run's totals) while ``fence``'s
        claim is current; ``ClaimLost`` otherwise. The caller must not change ``attempt`` until
        this returns (the row is built from it in the ORM thread)."""
        fence.check()
        await self._stage(_Write(fence, attempt))

    async def _send(self, items: Sequence[_Write]) -> list[BaseException | None]:
        lost = await sync_to_async(write_attempts)([(w.fence.run_id, w.fence.epoch, w.attempt) for w in items])
        # A stale claim's writer gets ``ClaimLost``; the others' rows are written all the same.
        return [w.fence.lose() if w.fence.run_id in lost else None for w in items]


def write_attempts(writes: Sequence[tuple[str, int, AttemptRecord]]) -> set[str]:
    """Upsert the attempts of ``writes`` (run id, claim epoch, attempt) in one transaction,
    only those whose claim is still their run's; returns the run ids whose claim is not."""
    return again_on_a_fresh_connection(lambda: _write_once(writes))


def _write_once(writes: Sequence[tuple[str, int, AttemptRecord]]) -> set[str]:
    with transaction.atomic():
        run_ids = {run_id for run_id, _, _ in writes}
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
    ids = set(run_ids)
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
