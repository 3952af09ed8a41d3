"""Staged batches: items leave in order, in bounded batches, and every caller gets its own outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from streamrecover.runs.staged import StagedBatches


class Refused(Exception):
    pass


class Doubler(StagedBatches[int, int]):
    """Sends ints; a negative one is refused on its own, a zero fails the whole batch."""

    max_batch = 3

    def __init__(self, one_per_turn: bool = False) -> None:
        super().__init__()
        self.one_per_turn = one_per_turn  # type: ignore[misc]  # the class default, per test
        self.sent: list[list[int]] = []

    async def double(self, n: int) -> int:
        return await self._stage(n)

    async def _send(self, items: Sequence[int]) -> list[int | BaseException]:
        await asyncio.sleep(0)  # a trip: callers staged meanwhile wait for the next batch
        if 0 in items:
            raise ConnectionError("the destination went away")
        self.sent.append(list(items))
        return [Refused(n) if n < 0 else 2 * n for n in items]


def test_items_leave_in_order_in_bounded_batches_and_each_caller_gets_its_own_result() -> None:
    async def main() -> tuple[list[int | BaseException], Doubler]:
        doubler = Doubler()
        outcomes = await asyncio.gather(*(doubler.double(n) for n in [1, 2, -3, 4, 5, 6, 7]), return_exceptions=True)
        return outcomes, doubler

    outcomes, doubler = asyncio.run(main())
    assert outcomes[:2] == [2, 4]
    assert outcomes[3:] == [8, 10, 12, 14]
    assert isinstance(outcomes[2], Refused)  # its own refusal, the batch's others written
    assert doubler.sent == [[1, 2, -3], [4, 5, 6], [7]]
    assert doubler.batches == 3


def test_a_failed_send_fails_its_batch_only_and_the_next_batch_still_goes() -> None:
    async def main() -> tuple[list[int | BaseException], Doubler]:
        doubler = Doubler()
        outcomes = await asyncio.gather(*(doubler.double(n) for n in [1, 0, 2, 3, 4]), return_exceptions=True)
        return outcomes, doubler

    outcomes, doubler = asyncio.run(main())
    assert [type(o) for o in outcomes[:3]] == [ConnectionError] * 3
    assert outcomes[3:] == [6, 8]
    assert doubler.sent == [[3, 4]]


def test_a_caller_cancelled_before_its_item_left_has_it_dropped() -> None:
    async def main() -> tuple[Doubler, int]:
        doubler = Doubler()
        first = asyncio.ensure_future(doubler.double(1))
        second = asyncio.ensure_future(doubler.double(2))
        await asyncio.sleep(0)  # both staged, the first batch on its way
        kept = asyncio.ensure_future(doubler.double(3))
        later = asyncio.ensure_future(doubler.double(4))
        await asyncio.sleep(0)
        later.cancel()
        await doubler.barrier()
        with pytest.raises(asyncio.CancelledError):
            await later
        assert await first == 2
        assert await second == 4
        return doubler, await kept

    doubler, kept = asyncio.run(main())
    assert kept == 6
    assert doubler.sent == [[1, 2], [3]]  # 4 was never sent


def test_callers_handed_back_one_per_turn_still_all_learn_their_outcome_when_the_loop_stops() -> None:
    async def main() -> list[int | BaseException]:
        doubler = Doubler(one_per_turn=True)
        callers = [asyncio.ensure_future(doubler.double(n)) for n in (1, 2, 3)]
        while doubler.batches == 0:
            await asyncio.sleep(0)
        assert doubler._flusher is not None
        doubler._flusher.cancel()  # the loop closes while the batch is being handed back
        # (a caller never told would wait forever: fail in seconds instead)
        return await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), 10)

    assert asyncio.run(main()) == [2, 4, 6]  # sent, so told: none left waiting or cancelled


def test_a_send_that_answers_for_fewer_items_fails_their_callers_instead_of_hanging_them() -> None:
    class Short(Doubler):
        async def _send(self, items: Sequence[int]) -> list[int | BaseException]:
            return [2 * n for n in items][:-1]

    async def main() -> list[int | BaseException]:
        short = Short()
        return await asyncio.gather(short.double(1), short.double(2), return_exceptions=True)

    outcomes = asyncio.run(main())
    assert [type(o) for o in outcomes] == [RuntimeError, RuntimeError]


def test_a_loop_has_one_batcher_of_each_class_and_another_loop_its_own() -> None:
    class Tripler(Doubler):
        pass

    async def batchers() -> tuple[Doubler, Doubler, Doubler]:
        return Doubler.of_running_loop(), Doubler.of_running_loop(), Tripler.of_running_loop()

    first, again, other_class = asyncio.run(batchers())
    assert first is again  # every run of the loop stages into the same batches
    assert type(other_class) is Tripler
    assert other_class is not first
    (next_loop, _, _) = asyncio.run(batchers())
    assert next_loop is not first  # a new loop gets a batcher of its own
