"""TurnEndings: how a turn ends (completed, at its budget, cut short) and the TurnResult it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import sink as ev
from .blocks import TEXT, THINKING, TOOL_USE, Block, BlockStatus
from .discards import Discards, discard_reason
from .nativeresume import NativeResume
from .notices import ToolNotice
from .plan import RecoveryPlan
from .protocol import RunStatus
from .turncheckpoints import TurnCheckpoints
from .turnevents import TurnEvents
from .turnstate import TurnState


@dataclass(slots=True)
class TurnResult:
    status: str  # completed, failed, exhausted, cancelled
    blocks: list[dict[str, Any]] = field(default_factory=list)  # canonical content of the assistant message
    stop_reason: str | None = None
    error: dict[str, str] | None = None
    continuations: int = 0
    recovered: bool = False
    discarded_tools: list[ToolNotice] = field(default_factory=list)
    # the answer's blocks as the client numbers them: a paused answer goes on after them (``run_agent``)
    numbered: list[Block] = field(default_factory=list)


class TurnEndings:
    """Ends the turn: its final checkpoint (kept until the caller has committed the result:
    ``TurnRunner.settled``) and its ``TurnResult``."""

    def __init__(
        self,
        state: TurnState,
        checkpoints: TurnCheckpoints,
        discards: Discards,
        native: NativeResume,
        events: TurnEvents,
    ) -> None:
        self.state = state
        self.checkpoints = checkpoints
        self.discards = discards
        self.native = native
        self.events = events

    async def completed(self) -> TurnResult:
        """The answer ended: every block closed, anything unusable dropped."""
        state = self.state
        snapshot = state.acc.snapshot()
        stop = snapshot.stop_reason or "end_turn"
        keep: list[Block] = []
        for block in snapshot.blocks:
            # A clean end closes every block; anything unusable still never reaches history,
            # and the client, which saw it stream, is told it is gone.
            reason = discard_reason(block)  # read before the block is closed here
            block.closed = True
            if block.kind == TEXT and not block.text:
                continue
            if block.status() is BlockStatus.COMPLETE:
                keep.append(block)
            elif block.kind == THINKING:
                await self.discards.unsigned_thinking_dropped(block)
            elif block.kind == TOOL_USE:
                # arguments that do not parse (max_tokens hit inside them): dropped as at a break
                await self.discards.tool_dropped(block, reason)
        result = await self.finish_with(keep, stop)
        if state.continuation > 0:
            await self.events.emit(
                ev.LLM_STREAM_CONTINUATION_COMPLETED,
                continuation_attempt=state.continuation,
                completion_reason=stop,
                join=state.joins[-1]["kind"] if state.joins else None,
                joins=list(state.joins),
            )
            result.recovered = True
        return result

    async def finish_with(self, blocks: list[Block], stop_reason: str | None) -> TurnResult:
        # The checkpoint now holds the whole answer and stays until the caller has committed it
        # (``TurnRunner.settled``): a worker dying in between leaves it for the next one, paid for once.
        await self.checkpoints.write(force=True, blocks=blocks, stop_reason=stop_reason or "end_turn")
        return TurnResult(
            RunStatus.COMPLETED,
            blocks=[b.to_content() for b in blocks],
            stop_reason=stop_reason,
            continuations=self.state.continuation,
            discarded_tools=list(self.discards.tools),
            numbered=[b.copy() for b in blocks],
        )

    async def out_of_budget(self, recovery: RecoveryPlan) -> TurnResult:
        """End the turn at its budget with what it keeps, as an uninterrupted answer at its
        limit would (a whole restart keeps nothing: the answer is empty)."""
        keep = recovery.keep if recovery.continues else []
        result = await self.finish_with(keep, "max_tokens")
        result.recovered = self.state.continuation > 0
        return result

    async def fail(self, kind: str, message: str) -> TurnResult:
        return await self.end_short(RunStatus.FAILED, {"kind": kind, "message": message})

    async def end_short(self, status: str, error: dict[str, str]) -> TurnResult:
        """End the turn before its answer did (cancelled, failed, exhausted) with what its client
        was shown (``Discards.cut_short``). Like a completed answer, that is checkpointed with how
        the turn ended and the checkpoint stays until the caller has committed it
        (``TurnRunner.settled``): a worker dying in between leaves it to the next one, which ends
        the turn the same way."""
        state = self.state
        shown = state.held if state.held is not None else list(state.acc.snapshot().blocks)
        state.held = None
        keep = await self.discards.cut_short(shown)
        self.native.abandon_unread(status)
        await self.checkpoints.write(force=True, blocks=keep, ending={"status": status, "error": error})
        return TurnResult(status, blocks=[b.to_content() for b in keep], error=error, continuations=state.continuation)
