"""Recovery plans R1-R4 and native resume: what to keep, what to drop, how to go on.

A pure function of the accumulator's snapshot, so every break point can be reasoned
about (and tested) without a network.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from .blocks import REDACTED_THINKING, TEXT, THINKING, TOOL_USE, Block, BlockStatus, Snapshot


class PlanKind(enum.StrEnum):
    CONTINUE_TEXT = "continue_text"  # R1
    SYNTHESIZE_TOOL_USE = "synthesize_tool_use"  # R2
    TRUNCATE_BEFORE_TOOL = "truncate_before_tool"  # R3
    WHOLE_RESTART = "whole_restart"  # R4
    NATIVE_RESUME = "native_resume"  # re-attach to the same provider-side response (no regeneration)


@dataclass(slots=True)
class RecoveryPlan:
    kind: PlanKind
    keep: list[Block] = field(default_factory=list)  # in order: what history may take
    discarded_tools: list[Block] = field(default_factory=list)
    discarded_thinking: list[Block] = field(default_factory=list)
    discarded_other: list[Block] = field(default_factory=list)

    @property
    def continues(self) -> bool:
        """True when a new provider call carries on from ``keep``."""
        return self.kind in (PlanKind.CONTINUE_TEXT, PlanKind.TRUNCATE_BEFORE_TOOL)

    @property
    def discarded(self) -> list[Block]:
        return [*self.discarded_tools, *self.discarded_thinking, *self.discarded_other]


def native_plan(snapshot: Snapshot) -> RecoveryPlan:
    """The plan of a native resume: every block as it stands is kept (partial text included:
    the re-attached stream goes on inside it) except tool calls still arriving, which the
    provider sends again whole (the resume point lies before them)."""
    result = RecoveryPlan(PlanKind.NATIVE_RESUME)
    for block in snapshot.blocks:
        if block.kind == TEXT or block.status() is BlockStatus.COMPLETE:
            result.keep.append(block)
        elif block.kind == TOOL_USE:
            result.discarded_tools.append(block)
        elif block.kind in (THINKING, REDACTED_THINKING):
            result.discarded_thinking.append(block)
        else:
            result.discarded_other.append(block)
    return result


def plan(snapshot: Snapshot) -> RecoveryPlan:
    """Sort every block into keep or discard, then pick the plan.

    Text, complete or partial, is kept; complete tool calls are kept; thinking only when it
    could be sent back (closed with its signature; redacted thinking closed); anything else
    is discarded. Complete tool calls end the turn (R2); text goes on (R1, or R3 when a tool
    call was dropped); nothing salvageable restarts the turn (R4). Text that is only
    whitespace is not enough to go on from: the API takes no blank text block back, so a
    prefix of only that would be an empty assistant message.
    """
    result = RecoveryPlan(PlanKind.WHOLE_RESTART)
    for block in snapshot.blocks:
        status = block.status()
        if block.kind == TEXT:
            if block.text:
                result.keep.append(block)
            elif block.citations:  # cut between its citations and its text: the client saw them
                result.discarded_other.append(block)
        elif block.kind == TOOL_USE:
            (result.keep if status is BlockStatus.COMPLETE else result.discarded_tools).append(block)
        elif block.kind in (THINKING, REDACTED_THINKING):
            (result.keep if status is BlockStatus.COMPLETE else result.discarded_thinking).append(block)
        else:
            (result.keep if status is BlockStatus.COMPLETE else result.discarded_other).append(block)

    if any(b.kind == TOOL_USE for b in result.keep):
        result.kind = PlanKind.SYNTHESIZE_TOOL_USE
    elif any(b.kind == TEXT and b.text.strip() for b in result.keep):
        result.kind = PlanKind.TRUNCATE_BEFORE_TOOL if result.discarded_tools else PlanKind.CONTINUE_TEXT
        # A continuation carries on from the last text block: nothing may follow it.
        last_text = max(i for i, b in enumerate(result.keep) if b.kind == TEXT)
        result.discarded_other.extend(result.keep[last_text + 1 :])
        del result.keep[last_text + 1 :]
    else:
        result.kind = PlanKind.WHOLE_RESTART
        result.discarded_other.extend(b for b in result.keep if b.kind not in (THINKING, REDACTED_THINKING))
        result.discarded_thinking.extend(b for b in result.keep if b.kind in (THINKING, REDACTED_THINKING))
        result.keep.clear()
    return result


def cut_short(blocks: Sequence[Block]) -> RecoveryPlan:
    """What a turn that ends before its answer did (exhausted, cancelled, failed) keeps: what a
    continuation would carry on from (R1/R3: text, even partial, with the signed thinking
    before it), as it stands. A complete tool call is dropped too, unlike R2: the turn ends
    without running it, and a call left in history without its result is refused by every
    provider on the next turn. With no text to keep it keeps nothing (as R4)."""
    called = {id(b) for b in blocks if b.kind == TOOL_USE and b.status() is BlockStatus.COMPLETE}
    result = plan(Snapshot(tuple(b for b in blocks if id(b) not in called)))
    dropped = [b for b in blocks if id(b) in called]
    result.discarded_tools = sorted([*dropped, *result.discarded_tools], key=lambda b: b.index)
    return result
