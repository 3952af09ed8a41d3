"""A worker loop's attempt rows are written together, and each writer still gets its own outcome."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from streamrecover.engine.errors import ClaimLost
from streamrecover.engine.events import Usage
from streamrecover.engine.sink import AttemptRecord
from streamrecover.models import Attempt, Run
from streamrecover.runs import lifecycle
from streamrecover.runs.attempt_writes import MAX_BATCH, AttemptWrites
from streamrecover.runs.fence import Fence

from .factories import make_run
from .orm_loop import gather_on_one_loop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]


def _claimed(count: int) -> list[Fence]:
    fences = []
    for _ in range(count):
        run = lifecycle.claim_run(str(make_run().pk), worker="w1")
        assert run is not None
        fences.append(Fence(str(run.pk), run.claim_epoch, 15.0))
    return fences


def _attempt(fence: Fence, index: int = 0, **fields: Any) -> AttemptRecord:
    return AttemptRecord(
        run_id=fence.run_id,
        turn=0,
        index=index,
        kind=fields.pop("kind", "initial"),
        continuation=0,
        strategy=None,
        request={"url": "https://api.example/v1/messages", "body": {"model": "m"}},
        started_at=time.time(),
        **fields,
    )


def _ended(attempt: AttemptRecord, output_tokens: int) -> AttemptRecord:
    attempt.ended_at = time.time()
    attempt.outcome = "completed"
    attempt.usage = Usage(input_tokens=10, output_tokens=output_tokens)
    return attempt


def test_many_runs_attempts_go_in_one_transaction_and_only_the_stale_claim_is_refused() -> None:
    fences = _claimed(30)
    stale = fences[11]
    Run.objects.filter(pk=stale.run_id).update(claim_epoch=stale.epoch + 1)  # another worker took it
    batcher = AttemptWrites()
    outcomes = asyncio.run(
        gather_on_one_loop(*(batcher.write(f, _ended(_attempt(f), output_tokens=i)) for i, f in enumerate(fences)))
    )

    assert isinstance(outcomes[11], ClaimLost)
    assert [o for i, o in enumerate(outcomes) if i != 11] == [None] * 29
    assert stale.lost  # later writes of that claim are refused without asking the database
    assert batcher.batches == -(-30 // MAX_BATCH)  # thirty writes, a transaction per MAX_BATCH of them
    assert not Attempt.objects.filter(run_id=stale.run_id).exists()
    for i, fence in enumerate(fences):
        if fence is stale:
            continue
        (row,) = Attempt.objects.filter(run_id=fence.run_id)
        assert (row.index, row.outcome, row.output_tokens) == (0, "completed", i)
        assert row.request == {"url": "https://api.example/v1/messages", "body": {"model": "m"}}
        run = Run.objects.get(pk=fence.run_id)  # the totals follow the rows
        assert (run.input_tokens, run.output_tokens, run.attempt_count, run.continuation_count) == (10, i, 1, 0)


def test_an_attempts_start_and_end_in_one_batch_leave_the_ended_row() -> None:
    (fence,) = _claimed(1)
    batcher = AttemptWrites()
    started = _attempt(fence, index=1, kind="continuation")
    outcomes = asyncio.run(
        gather_on_one_loop(  # staged before the flusher runs: one transaction
            batcher.write(fence, started),
            batcher.write(fence, _ended(_attempt(fence, index=0), 7)),
            batcher.write(fence, _ended(_attempt(fence, index=1, kind="continuation"), 5)),
        )
    )
    assert outcomes == [None, None, None]
    assert batcher.batches == 1
    rows = {row.index: row for row in Attempt.objects.filter(run_id=fence.run_id)}
    assert {i: (r.outcome, r.kind, r.output_tokens) for i, r in rows.items()} == {
        0: ("completed", "initial", 7),
        1: ("completed", "continuation", 5),
    }
    run = Run.objects.get(pk=fence.run_id)
    assert (run.output_tokens, run.attempt_count, run.continuation_count) == (12, 2, 1)


def test_a_write_cancelled_before_it_left_is_never_written() -> None:
    (fence,) = _claimed(1)
    batcher = AttemptWrites()

    async def cancel_then_write() -> None:
        writing = asyncio.ensure_future(batcher.write(fence, _attempt(fence, index=0)))
        await asyncio.sleep(0)  # staged: the flusher has not taken it yet
        writing.cancel()
        assert (await gather_on_one_loop(writing))[0].__class__ is asyncio.CancelledError
        await gather_on_one_loop(batcher.write(fence, _attempt(fence, index=1)))

    asyncio.run(cancel_then_write())
    assert list(Attempt.objects.filter(run_id=fence.run_id).values_list("index", flat=True)) == [1]


def test_every_writer_of_a_failed_transaction_gets_the_error_and_nothing_is_half_written() -> None:
    fences = _claimed(3)
    batcher = AttemptWrites()
    too_long = _attempt(fences[1], kind="k" * 500)  # longer than the column: the statement fails
    outcomes = asyncio.run(
        gather_on_one_loop(
            batcher.write(fences[0], _attempt(fences[0])),
            batcher.write(fences[1], too_long),
            batcher.write(fences[2], _attempt(fences[2])),
        )
    )
    assert [type(o).__name__ for o in outcomes] == ["DataError"] * 3
    assert not any(f.lost for f in fences)  # a failure is not a lost claim
    assert not Attempt.objects.filter(run_id__in=[f.run_id for f in fences]).exists()
