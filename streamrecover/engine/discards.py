"""Discards: the blocks a turn drops (tool calls, thinking), told to the events, the client and its result."""

from __future__ import annotations

from . import sink as ev
from .blocks import TOOL_USE, Accumulator, Block, BlockStatus, Snapshot
from .context import RunContext
from .notices import ToolNotice, tool_notice
from .plan import PlanKind, RecoveryPlan, cut_short
from .protocol import FrameKind
from .turnevents import TurnEvents


class Discards:
    """Reports what the turn drops. ``tools`` are the tool calls it lost (the turn result's
    ``discarded_tools``: the model may be told); ``unsent`` the tool calls native plans dropped
    while their arguments arrived, that no re-attached stream has sent again: lost (``tools``)
    once the turn goes on another way."""

    def __init__(self, ctx: RunContext, events: TurnEvents) -> None:
        self.ctx = ctx
        self.events = events
        self.tools: list[ToolNotice] = []
        self.unsent: list[Block] = []

    def note_unsent(self, snapshot: Snapshot, recovery: RecoveryPlan) -> None:
        """At a break: a native plan's dropped tool calls wait to be sent again (a call the
        response sent again, whole or not, is the snapshot's, as the plan says); any other
        plan leaves the response, and those still waiting are lost."""
        sent = {_tool_key(b) for b in snapshot.blocks if b.kind == TOOL_USE}
        self.unsent = [b for b in self.unsent if _tool_key(b) not in sent]
        if recovery.kind is PlanKind.NATIVE_RESUME:
            self.unsent.extend(recovery.discarded_tools)
        else:
            self.lose_unsent()

    def lose_unsent(self) -> None:
        """The turn no longer re-attaches: the tool calls still waiting to be sent again are
        discarded (the client dropped them at their break, and the event was emitted then), so
        the model may be told they were not executed. Once each: the list is emptied."""
        recorded: set[str | None] = {d["id"] for d in self.tools if d["id"] is not None}
        for block in self.unsent:
            if block.id is None or block.id not in recorded:
                self.tools.append(tool_notice(block.id, block.name, discard_reason(block)))
                recorded.add(block.id)
        self.unsent = []

    async def publish(self, recovery: RecoveryPlan, acc: Accumulator) -> None:
        """What a plan drops: its events, then the frames that make the client (which was shown
        ``acc``'s blocks) drop the same blocks, or start over on a whole restart."""
        for block in recovery.discarded_tools:
            # a native resume receives the call again, whole: not a tool call the turn lost
            await self.tool_discarded(block, discard_reason(block), lost=recovery.kind is not PlanKind.NATIVE_RESUME)
        for block in recovery.discarded_thinking:
            reason = "restart" if block.status() is BlockStatus.COMPLETE else "unsigned_partial_thinking"
            await self.events.emit(
                ev.DISCARDED_THINKING,
                kind=block.kind,
                partial_bytes=len(block.text.encode()),
                reason=reason,
            )
        if recovery.kind is PlanKind.WHOLE_RESTART:
            if acc.blocks:
                await self.ctx.frame(FrameKind.STREAM_RESET, reason="whole_restart")
            return
        await self.send_drops(
            [(block, "partial") for block in recovery.discarded_tools],
            [*recovery.discarded_thinking, *recovery.discarded_other],
        )

    async def cut_short(self, shown: list[Block]) -> list[Block]:
        """The content a turn ending before its answer did commits (``plan.cut_short``): the text
        the client was ``shown``, as it was shown. What else it shows is dropped first, with the
        frames a break sends, so the client rebuilds exactly the committed message."""
        cut = cut_short(shown)
        tools: list[tuple[Block, str]] = []
        for block in cut.discarded_tools:
            complete = block.status() is BlockStatus.COMPLETE
            # a call cut off is lost as at a break; a whole one was simply never run
            await self.tool_discarded(block, "not_executed" if complete else discard_reason(block), lost=not complete)
            tools.append((block, "not_executed" if complete else "partial"))
        for block in cut.discarded_thinking:
            await self.events.emit(
                ev.DISCARDED_THINKING, kind=block.kind, partial_bytes=len(block.text.encode()), reason="cut_short"
            )
        await self.send_drops(tools, [*cut.discarded_thinking, *cut.discarded_other])
        return cut.keep

    async def send_drops(self, tools: list[tuple[Block, str]], others: list[Block]) -> None:
        """The frames that tell the client to drop blocks it was shown and that will not be
        stored: each tool call (with why) first, then the other blocks."""
        for block, reason in tools:
            await self.ctx.frame(
                FrameKind.TOOL_CALL_CANCEL, block=block.index, id=block.id, name=block.name, reason=reason
            )
        for block in others:
            await self.ctx.frame(FrameKind.BLOCK_CANCEL, block=block.index, kind=block.kind, reason="partial")

    async def tool_discarded(self, block: Block, reason: str, *, lost: bool = True) -> None:
        """Record a tool call that is never run nor committed: the event, and, when the turn
        loses it (``lost``), the turn result's ``discarded_tools`` (the model may be told)."""
        if lost:
            self.tools.append(tool_notice(block.id, block.name, reason))
        await self.events.emit(
            ev.DISCARDED_PARTIAL_TOOL_USE,
            tool_name=block.name,
            tool_call_id=block.id,
            partial_input_bytes=len(block.arguments.encode()),
            reason=reason,
        )

    async def tool_dropped(self, block: Block, reason: str) -> None:
        """A tool call a completed answer ends with, unusable: recorded as at a break, and the
        client, which saw it stream, drops it, so it shows what is committed."""
        await self.tool_discarded(block, reason)
        await self.send_drops([(block, "partial")], [])

    async def unsigned_thinking_dropped(self, block: Block) -> None:
        """Reasoning that ended without a signature (DeepSeek's ``reasoning_content``, a Gemini
        thought run never signed): the provider takes none of it back, so it is not committed;
        the client, which saw it stream, is told, as for any dropped thinking."""
        await self.events.emit(
            ev.DISCARDED_THINKING, kind=block.kind, partial_bytes=len(block.text.encode()), reason="unsigned_thinking"
        )
        await self.ctx.frame(FrameKind.BLOCK_CANCEL, block=block.index, kind=block.kind, reason="unsigned_thinking")

    async def thinking_dropped(self, block: Block) -> None:
        """A continuation's thinking block closed after the prefix's text: not kept (see ``translate``)."""
        await self.events.emit(
            ev.DISCARDED_THINKING,
            kind=block.kind,
            partial_bytes=len(block.text.encode()),
            reason="thinking_after_text",
        )


def discard_reason(block: Block) -> str:
    """Why a tool call is dropped: its arguments were still arriving, or its block closed
    with arguments that are not a JSON object."""
    return "incomplete_arguments" if not block.closed else "invalid_arguments_json"


def _tool_key(block: Block) -> str:
    """What tells a tool call sent again from another: its id (its position when it has none)."""
    return block.id if block.id is not None else f"#{block.index}"
