"""Runs that end together on a worker's loop are settled together, and each run's end is still its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from streamrecover.engine.errors import ClaimLost
from streamrecover.models import Message, Run, Thread
from streamrecover.runs import lifecycle
from streamrecover.runs.fence import Fence
from streamrecover.runs.settlements import MAX_BATCH, RunSettlements
from streamrecover.runs.signals import run_settled

from .factories import make_message, make_run
from .orm_loop import gather_on_one_loop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]


def _claimed(count: int) -> list[Fence]:
    fences = []
    for _ in range(count):
        run = make_run()
        make_message(run.thread, content=[{"type": "text", "text": "question"}])
        claimed = lifecycle.claim_run(str(run.pk), worker="w1")
        assert claimed is not None
        fences.append(Fence(str(claimed.pk), claimed.claim_epoch, 15.0))
    return fences


def _answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def _end(fence: Fence, text: str | None, status: str = "completed", **fields: Any) -> lifecycle.RunEnd:
    message = _answer(text) if text is not None else None
    return lifecycle.RunEnd(fence.run_id, status, epoch=fence.epoch, message=message, position=1, **fields)


def test_runs_ending_together_are_settled_in_batches_each_with_its_own_end_and_answer() -> None:
    fences = _claimed(20)
    stale = fences[9]
    Run.objects.filter(pk=stale.run_id).update(claim_epoch=stale.epoch + 1)  # another worker took it
    ends = [_end(f, f"answer {i}") for i, f in enumerate(fences)]
    ends[3] = _end(fences[3], None, "failed", error_kind="overloaded", error_message="gave up after 5")
    ends[4] = _end(fences[4], "partial", "cancelled", notices=[{"id": "t1", "name": "get_weather", "reason": "cut"}])
    settled: list[str] = []

    def on_settled(run_id: Any, **_: Any) -> None:
        settled.append(str(run_id))

    run_settled.connect(on_settled, weak=False, dispatch_uid="test_settlement_batching")
    try:
        batcher = RunSettlements()
        outcomes = asyncio.run(gather_on_one_loop(*(batcher.settle(f, e) for f, e in zip(fences, ends, strict=True))))
    finally:
        run_settled.disconnect(dispatch_uid="test_settlement_batching")

    assert batcher.batches == -(-20 // MAX_BATCH)
    assert isinstance(outcomes[9], ClaimLost)
    assert stale.lost
    assert [o for i, o in enumerate(outcomes) if i != 9] == [None] * 19
    assert sorted(settled) == sorted(f.run_id for f in fences if f is not stale)  # once each, after commit
    stale_run = Run.objects.get(pk=stale.run_id)
    assert stale_run.status == Run.Status.RUNNING  # the other worker's now: nothing of ours written
    assert stale_run.finished_at is None
    assert not Message.objects.filter(run_id=stale.run_id).exists()
    for i, fence in enumerate(fences):
        if fence is stale:
            continue
        run = Run.objects.get(pk=fence.run_id)
        assert run.finished_at is not None
        answers = list(
            Message.objects.filter(thread_id=run.thread_id).order_by("position").values_list("content", flat=True)
        )
        if i == 3:
            assert (run.status, run.error_kind, run.error_message) == ("failed", "overloaded", "gave up after 5")
            assert answers == [[{"type": "text", "text": "question"}]]  # no answer to store
        elif i == 4:
            assert run.status == "cancelled"
            assert answers[1] == [{"type": "text", "text": "partial"}]
            assert Thread.objects.get(pk=run.thread_id).pending_notices == [
                {"id": "t1", "name": "get_weather", "reason": "cut"}
            ]
        else:
            assert (run.status, run.error_kind) == ("completed", "")
            assert answers[1] == [{"type": "text", "text": f"answer {i}"}]


def test_an_end_stored_twice_stores_its_answer_once() -> None:
    (fence,) = _claimed(1)
    end = _end(fence, "the answer")
    lifecycle.finish_many([end])
    lifecycle.finish_many([end])  # a retry on a fresh connection after the first committed
    run = Run.objects.get(pk=fence.run_id)
    assert list(Message.objects.filter(thread_id=run.thread_id).values_list("position", "content")) == [
        (0, [{"type": "text", "text": "question"}]),
        (1, [{"type": "text", "text": "the answer"}]),
    ]


def test_a_position_taken_by_another_message_is_left_as_it_is_and_reported() -> None:
    fences = _claimed(2)
    taken = Run.objects.get(pk=fences[0].run_id)
    make_message(taken.thread, position=1, role="user", content=[{"type": "text", "text": "typed meanwhile"}])
    with capture_logs() as lines:
        lost = lifecycle.finish_many([_end(fences[0], "mine"), _end(fences[1], "theirs")])

    assert lost == set()
    stored = Message.objects.get(thread_id=taken.thread_id, position=1)
    assert stored.content == [{"type": "text", "text": "typed meanwhile"}]  # a user's words are never rewritten
    assert [line["position"] for line in lines if line["event"] == "message_position_conflict"] == [1]
    other = Run.objects.get(pk=fences[1].run_id)
    assert Message.objects.get(thread_id=other.thread_id, position=1).content == [{"type": "text", "text": "theirs"}]
