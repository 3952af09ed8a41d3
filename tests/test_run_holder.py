"""The worker's run holder: a hand-over returns at the claim, a full process waits for a place,
an error before the claim reaches the task, a drain waits for the runs held, and a closed holder
starts none."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from streamrecover.runs.holder import RunHolder


def test_a_hand_over_returns_at_the_claim_and_the_run_goes_on() -> None:
    holder = RunHolder()
    release = threading.Event()
    done: list[str] = []

    async def run(claimed: Callable[[], None]) -> str:
        claimed()
        await asyncio.get_running_loop().run_in_executor(None, release.wait)
        done.append("ended")
        return "completed"

    handover = holder.hand_over(run, limit=5)
    assert handover.ended is False
    assert holder.held == 1
    assert done == []
    assert holder.drain(timeout=0.2) is False  # the run still streams
    release.set()
    assert holder.drain(timeout=10) is True
    assert done == ["ended"]
    assert holder.held == 0


def test_a_run_that_claims_nothing_ends_the_hand_over_with_its_result() -> None:
    holder = RunHolder()

    async def not_claimed(claimed: Callable[[], None]) -> None:
        return None

    handover = holder.hand_over(not_claimed, limit=5)
    assert handover.ended is True
    assert handover.result is None
    assert holder.held == 0


def test_an_error_before_the_claim_reaches_the_task() -> None:
    holder = RunHolder()

    async def broken(claimed: Callable[[], None]) -> None:
        raise RuntimeError("database unreachable")

    with pytest.raises(RuntimeError, match="database unreachable"):
        holder.hand_over(broken, limit=5)
    assert holder.held == 0


def test_a_full_process_makes_the_next_hand_over_wait_for_a_place() -> None:
    holder = RunHolder()
    release = threading.Event()

    async def held(claimed: Callable[[], None]) -> str:
        claimed()
        await asyncio.get_running_loop().run_in_executor(None, release.wait)
        return "completed"

    holder.hand_over(held, limit=1)
    returned: list[float] = []
    waiting = threading.Thread(target=lambda: (holder.hand_over(held, limit=1), returned.append(time.monotonic())))
    waiting.start()
    time.sleep(0.5)
    assert returned == []
    assert holder.held == 1
    freed = time.monotonic()
    release.set()
    waiting.join(timeout=10)
    assert returned
    assert returned[0] >= freed
    assert holder.drain(timeout=10) is True


def test_a_hand_over_still_full_after_its_wait_starts_nothing() -> None:
    """A bounded wait in a full process gives up (None): its run is not started here, so its
    task can send it to a worker with room; the run held goes on, and a place left takes the next."""
    holder = RunHolder()
    release = threading.Event()
    started: list[str] = []

    async def held(claimed: Callable[[], None]) -> str:
        started.append("run")
        claimed()
        await asyncio.get_running_loop().run_in_executor(None, release.wait)
        return "completed"

    holder.hand_over(held, limit=1, wait=0.5)
    began = time.monotonic()
    assert holder.hand_over(held, limit=1, wait=0.5) is None
    assert time.monotonic() - began >= 0.45
    assert (started, holder.held) == (["run"], 1)
    release.set()
    assert holder.drain(timeout=10) is True
    handover = holder.hand_over(held, limit=1, wait=0.5)
    assert handover is not None
    assert started == ["run", "run"]
    assert holder.drain(timeout=10) is True


def test_a_closed_holder_starts_nothing_and_ends_the_waits_at_once() -> None:
    """A warm shutdown closes the holder: a hand-over waiting for a place (for ever) returns None
    at once instead of taking the place the held run frees, one with room starts nothing, and
    the run held goes on to its end."""
    holder = RunHolder()
    release = threading.Event()
    started: list[str] = []

    async def held(claimed: Callable[[], None]) -> str:
        started.append("run")
        claimed()
        await asyncio.get_running_loop().run_in_executor(None, release.wait)
        return "completed"

    holder.hand_over(held, limit=1)
    returned: list[object] = []
    waiting = threading.Thread(target=lambda: returned.append(holder.hand_over(held, limit=1, wait=None)))
    waiting.start()
    time.sleep(0.3)
    closed = time.monotonic()
    holder.close()
    waiting.join(timeout=10)
    assert returned == [None]
    assert time.monotonic() - closed < 0.5  # woken, not at its next look
    assert holder.hand_over(held, limit=5) is None  # room, but closed
    assert (started, holder.held) == (["run"], 1)
    release.set()
    assert holder.drain(timeout=10) is True
    assert started == ["run"]
