"""CheckpointResume: picking up a turn another process left in a checkpoint."""

from __future__ import annotations

from . import sink as ev
from .blocks import Block, Snapshot
from .budget import OutputBudget
from .checkpoint import Checkpoint
from .context import RunCancelled
from .continuation import summary
from .contract import ProviderAdapter, ResumePoint, resumes_natively
from .discards import Discards
from .endings import TurnEndings, TurnResult
from .nativeresume import NativeResume
from .plan import PlanKind, native_plan
from .protocol import FrameKind
from .translate import replay_block
from .turnevents import TurnEvents
from .turnstate import TurnState


class CheckpointResume:
    """Replays what a checkpoint kept to the client, then ends the turn as the checkpoint says or
    sets it up to go on (re-attaching, continuing, or starting over)."""

    def __init__(
        self,
        state: TurnState,
        budget: OutputBudget,
        native: NativeResume,
        discards: Discards,
        endings: TurnEndings,
        events: TurnEvents,
    ) -> None:
        self.state = state
        self.budget = budget
        self.native = native
        self.discards = discards
        self.endings = endings
        self.events = events

    async def resume(self, checkpoint: Checkpoint) -> TurnResult | None:
        """Pick up a turn another process left: replay what it kept, then go on from it (None)."""
        state, budget = self.state, self.budget
        ctx = state.ctx
        blocks = [Block.from_checkpoint(i, c) for i, c in enumerate(checkpoint.blocks)]
        # The client may have seen more than the checkpoint: reset it to exactly the checkpoint.
        await ctx.frame(FrameKind.STREAM_RESET, reason="resume")
        for block in blocks:
            await replay_block(ctx, block)
        native = checkpoint_point(checkpoint, ctx.adapter)
        if native is not None and blocks and (checkpoint.native or {}).get("open_text") is True:
            blocks[-1].closed = False  # the re-attached stream goes on inside it
        # as at a break: a structured answer is not continued, it starts over (``ordinary_plan``)
        snapshot = Snapshot(tuple(blocks))
        recovery = native_plan(snapshot) if native is not None else state.ordinary_plan(snapshot)
        await self.events.emit(
            ev.LLM_RUN_RESUMED,
            plan=recovery.kind.value,
            committed=summary(recovery.keep),
            checkpoint_attempt=checkpoint.attempt,
            checkpoint_continuation=checkpoint.continuation,
        )
        state.continuation = checkpoint.continuation  # a resume spends no continuation
        self.discards.tools = list(checkpoint.discarded_tools)
        budget.dropped_output = checkpoint.dropped_output  # billed: still counted against max_tokens
        if native is not None and resumes_natively(ctx.adapter):
            # generating still, for all this worker knows: a cancel before it re-attaches stops it
            self.native.unread = (ctx.adapter, native.response_id)
        ending = checkpoint.ending
        if ending is not None:
            # The turn had ended cut short (the worker died before committing it): it ends so,
            # with the text its client was shown, just replayed.
            return TurnResult(
                ending["status"],
                blocks=[b.to_content() for b in blocks],
                error=ending.get("error"),
                continuations=state.continuation,
            )
        if checkpoint.stop_reason is not None:
            # The answer was complete (the worker died before it was committed): it is the answer.
            state.acc.restore(blocks)
            result = await self.endings.finish_with(blocks, checkpoint.stop_reason)
            result.recovered = True
            return result
        if ctx.cancel.stopped:
            # Cancelled while no worker held the run: it ends with what its client was just shown,
            # neither continued nor asked for again.
            state.held = blocks
            raise RunCancelled
        if native is not None:
            # the response went on generating while no worker read it: re-attach where the
            # checkpoint's blocks end (a failure falls back to continuing from them)
            state.set_native(recovery.keep, native)
            budget.output_used, budget.received_bytes = checkpoint.output_used or 0, checkpoint.received_bytes
            return None
        if any(b.refusal for b in recovery.keep):
            # A refusal is never continued, as at a break: what arrived of it is the answer.
            state.acc.restore(recovery.keep)
            result = await self.endings.finish_with(recovery.keep, "refusal")
            result.recovered = True
            return result
        if recovery.kind is PlanKind.WHOLE_RESTART and blocks:
            # the answer starts over, as at a break: the client drops what it was just shown
            await ctx.frame(FrameKind.STREAM_RESET, reason="whole_restart")
        if checkpoint.output_used is None:
            # a checkpoint from before does not say what its blocks cost: their bytes over-count
            # it, the provider's count (where it has one) tells it
            budget.received_bytes = sum(len(b.text.encode()) + len(b.arguments.encode()) for b in blocks)
            budget.output_used = budget.received_bytes
        else:
            # What the answer cost and received, what its blocks do not hold included (thinking
            # cut off, a tool call half received: billed all the same), counted as the worker that
            # wrote it would have: ``OutputBudget.measure`` counts every received byte not in the
            # prefix. A restart drops it all (``OutputBudget.restart``).
            budget.output_used, budget.received_bytes = checkpoint.output_used, checkpoint.received_bytes
        if recovery.kind is PlanKind.SYNTHESIZE_TOOL_USE:
            state.acc.restore(recovery.keep)
            result = await self.endings.finish_with(recovery.keep, "tool_use")
            result.recovered = True
            return result
        if recovery.continues:
            await budget.measure(recovery)
        if budget.spent():
            # as at a break: the answer ends at its budget with what it keeps (a restart: nothing)
            keep = recovery.keep if recovery.continues else []
            state.acc.restore(keep)
            result = await self.endings.finish_with(keep, "max_tokens")
            result.recovered = True
            return result
        if state.set_prefix(recovery):
            budget.restart()
        if state.prefix:
            state.attempt_kind = "resume"
        return None


def checkpoint_point(checkpoint: Checkpoint, adapter: ProviderAdapter) -> ResumePoint | None:
    """Where the checkpoint's background response can be re-attached, when the adapter can."""
    native = checkpoint.native
    if not native or not resumes_natively(adapter):
        return None
    response_id, after = native.get("response_id"), native.get("after")
    if not isinstance(response_id, str) or type(after) is not int:
        return None
    return ResumePoint(response_id, after)
