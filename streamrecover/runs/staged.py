"""Writes staged by a loop's runs and sent in batches by one flusher task, each caller told its own outcome.

The checkpoint puts, the attempt rows and the claims of a worker's shared loop all work this
way: a caller stages its item and awaits it; one flusher task per batcher sends what has gathered
since its last trip, at most ``max_batch`` items at a time, in the order they were staged. A
caller cancelled before its item left has it dropped, never sent late; a failed send hands its
error to every caller of that batch, and the flusher goes on with the next one.
"""

from __future__ import annotations

import abc
import asyncio
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Self, TypeVar

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

# Each loop's batchers, one per class (``StagedBatches.of_running_loop``)
_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[type[Any], Any]] = weakref.WeakKeyDictionary()


@dataclass(slots=True)
class _Staged(Generic[ItemT, ResultT]):
    item: ItemT
    outcome: asyncio.Future[ResultT]


class StagedBatches(abc.ABC, Generic[ItemT, ResultT]):
    """One per event loop and destination: ``_stage`` an item, get its own outcome back."""

    max_batch: ClassVar[int]
    # Hand the callers back one per turn of the loop: callers that resume into work of their own
    # (a run that starts streaming, or ends and settles) would otherwise all run in one turn, and
    # every frame published meanwhile would wait behind them.
    one_per_turn: ClassVar[bool] = False

    def __init__(self) -> None:
        self._pending: list[_Staged[ItemT, ResultT]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0  # sends that succeeded

    @classmethod
    def of_running_loop(cls) -> Self:
        """The running loop's batcher of this class, made on first use (for batchers that take no
        arguments: one per loop serves all its runs)."""
        batchers = _per_loop.setdefault(asyncio.get_running_loop(), {})
        batcher = batchers.get(cls)
        if batcher is None:
            batcher = batchers[cls] = cls()
        return batcher

    @abc.abstractmethod
    async def _send(self, items: Sequence[ItemT]) -> Sequence[ResultT | BaseException]:
        """Send ``items`` in one trip; per item, in order, its result or the error its caller gets."""

    async def _stage(self, item: ItemT) -> ResultT:
        outcome: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        self._pending.append(_Staged(item, outcome))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_all())
        return await outcome  # a cancelled caller cancels ``outcome``: not sent yet, it is skipped

    async def barrier(self) -> None:
        """Return once every item staged so far has been sent (or has failed)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _flush_all(self) -> None:
        while self._pending:
            staged = [s for s in self._pending[: self.max_batch] if not s.outcome.done()]
            del self._pending[: self.max_batch]
            if not staged:
                continue
            try:
                results = await self._send([s.item for s in staged])
                if len(results) != len(staged):
                    raise RuntimeError(f"{type(self).__name__}: {len(results)} results for {len(staged)} items")
            except asyncio.CancelledError:  # the loop is closing: nothing staged waits forever
                for s in [*staged, *self._pending]:
                    s.outcome.cancel()
                raise
            except Exception as exc:  # each caller logs its own failure and carries on
                for s in staged:
                    if not s.outcome.done():
                        s.outcome.set_exception(exc)
                continue
            self.batches += 1
            await self._hand_back(staged, results)

    async def _hand_back(
        self, staged: Sequence[_Staged[ItemT, ResultT]], results: Sequence[ResultT | BaseException]
    ) -> None:
        told = 0
        try:
            for s, result in zip(staged, results, strict=True):
                _tell(s.outcome, result)
                told += 1
                if self.one_per_turn:
                    await asyncio.sleep(0)
        except asyncio.CancelledError:  # the loop is closing: the rest were sent, say so
            for s, result in zip(staged[told:], results[told:], strict=True):
                _tell(s.outcome, result)
            raise


def _tell(outcome: asyncio.Future[ResultT], result: ResultT | BaseException) -> None:
    if outcome.done():  # its caller was cancelled meanwhile
        return
    if isinstance(result, BaseException):
        outcome.set_exception(result)
    else:
        outcome.set_result(result)
