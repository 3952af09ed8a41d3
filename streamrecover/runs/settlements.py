"""On a worker's shared loop, the ends of runs that finish together stored in one transaction.

A run's settlement (its end and its final answer, ``lifecycle.finish``) was a transaction of its
own: the claim's locking read, the answer's lookup and insert in a savepoint, the run's update.
Runs of one bench start together and so end together, and their settlements were about a quarter
of the time of the thread that does every ORM call of the loop's runs, while the frames of the
runs still streaming waited behind them. Here a settlement is staged (``staged``); what gathered
since the flusher's last trip goes in one transaction (``lifecycle.finish_many``), and each run
learns its own outcome: stored, or ``ClaimLost`` when a newer claim holds it (nothing of that
run is written; the others are).
"""

from __future__ import annotations

from collections.abc import Sequence

from asgiref.sync import sync_to_async

from . import lifecycle
from .fence import Fence, again_on_a_fresh_connection
from .staged import StagedBatches

# Settlements per transaction: each run told resumes into closing its live channel, and runs that
# end together resume together. At 8 (as for the attempt rows and the claims) the end phase's tail
# was worse than with one at a time; at 4 it was better than at 8 in three pairs of three, at
# the same CPU (docs/delivery.md, twelfth pass).
MAX_BATCH = 4


class RunSettlements(StagedBatches["tuple[Fence, lifecycle.RunEnd]", None]):
    """One per event loop: ``settle`` stages a run's end and waits for its own outcome."""

    max_batch = MAX_BATCH
    one_per_turn = True

    async def settle(self, fence: Fence, end: lifecycle.RunEnd) -> None:
        """Store ``end`` (with ``fence``'s epoch) while the claim is current; ``ClaimLost`` otherwise."""
        fence.check()
        await self._stage((fence, end))

    async def _send(self, items: Sequence[tuple[Fence, lifecycle.RunEnd]]) -> list[BaseException | None]:
        ends = [end for _, end in items]
        # a connection terminated under it: once more on a fresh one (one transaction, and storing
        # an answer twice stores it once)
        lost = await sync_to_async(again_on_a_fresh_connection)(lambda: lifecycle.finish_many(ends))
        return [fence.lose() if end.run_id in lost else None for fence, end in items]
