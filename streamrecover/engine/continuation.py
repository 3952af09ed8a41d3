"""Continuations: choosing how to carry on after a break, and building the request that does it.

After a recovery plan keeps some blocks, the next attempt continues from them (a
``continuation``), or starts over when nothing was kept (a ``restart``). The adapter names
the strategy its model supports: ``prefill`` (the kept blocks are the start of the
assistant message, trailing whitespace stripped, since a prefill may not end in it),
``prefix_flag`` (the same, marked with the provider's prefix flag) or ``continue_message``
(the kept blocks as a finished message plus an explicit "continue" user message).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .blocks import TEXT, THINKING, TOOL_USE, Accumulator, Block
from .contract import CONTINUE_INSTRUCTION, ModelRequest, ProviderAdapter, Strategy
from .join import ContinuationJoiner
from .plan import PlanKind, RecoveryPlan
from .sink import BlockSummary

# Stop reasons after which the answer ends as it is: continuing would only repeat the refusal.
NEVER_CONTINUE_STOPS = frozenset({"refusal", "content_filter", "context_overflow"})
# Stop reasons of an answer that had ended: a stream cut after one of them lost only its
# terminator (and perhaps the final usage), never any of the answer, so it is not continued.
# ``pause_turn`` (Anthropic paused a long server-tool turn) is one: the answer goes back to the
# caller as it is, whose next request, with it, lets the model go on; continuing it here would
# pay for a second request and drop the server tool call the paused answer ends with.
ENDED_STOPS = frozenset({"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn"})

# (provider, model) pairs that refused a prefill with a 400 in this process: later
# continuations go straight to ``continue_message`` instead of paying for a second refusal.
_PREFILL_REFUSED: set[tuple[str, str]] = set()


def remember_prefill_refused(provider: str, model: str) -> None:
    """``model`` of ``provider`` refused a prefill: no later continuation in this process sends one."""
    _PREFILL_REFUSED.add((provider, model))


def prefill_refused(provider: str, model: str) -> bool:
    return (provider, model) in _PREFILL_REFUSED


def forget_prefill_refusals() -> None:
    """Forget every refusal remembered in this process (tests start from a clean slate)."""
    _PREFILL_REFUSED.clear()


@dataclass(slots=True)
class Continuation:
    """What the next attempt of a turn starts from."""

    kind: str  # initial, continuation, restart, resume
    prefix: list[Block] = field(default_factory=list)  # kept blocks the attempt continues from
    strategy: Strategy | None = None
    acc: Accumulator = field(default_factory=Accumulator)  # the turn's blocks, the prefix restored


def strategy_for(adapter: ProviderAdapter, request: ModelRequest) -> Strategy:
    """The strategy the request's model supports."""
    return adapter.continuation_strategy(request.model, thinking=bool(request.thinking_budget))


def continue_from(recovery: RecoveryPlan, strategy: Strategy) -> Continuation:
    """A restart when the plan keeps nothing, else a continuation from its kept blocks."""
    if recovery.kind is PlanKind.WHOLE_RESTART or not recovery.keep:
        return Continuation("restart")
    prefix = [b.copy() for b in recovery.keep]
    acc = Accumulator()
    acc.restore(prefix)
    return Continuation("continuation", prefix, strategy, acc)


def as_restart(recovery: RecoveryPlan) -> RecoveryPlan:
    """The same plan as a whole restart: everything it kept is discarded too."""
    restart = RecoveryPlan(PlanKind.WHOLE_RESTART)
    restart.discarded_tools = list(recovery.discarded_tools)
    restart.discarded_thinking = list(recovery.discarded_thinking)
    restart.discarded_other = [*recovery.discarded_other, *recovery.keep]
    return restart


def continuation_messages(
    messages: list[dict[str, Any]], prefix: list[Block], strategy: Strategy | None
) -> list[dict[str, Any]]:
    """The committed thread plus what carries the prefix under ``strategy``."""
    messages = list(messages)
    if not prefix:
        return messages
    content = [b.to_content() for b in prefix]
    if strategy is Strategy.PREFILL:
        messages.append({"role": "assistant", "content": _without_trailing_whitespace(content)})
    elif strategy is Strategy.PREFIX_FLAG:
        messages.append({"role": "assistant", "content": content, "prefix": True})
    else:
        messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": [{"type": "text", "text": CONTINUE_INSTRUCTION}]})
    return messages


def paused_turn_messages(messages: list[dict[str, Any]], paused: list[Block]) -> list[dict[str, Any]]:
    """The committed thread, then the paused answer as the last assistant message, as it is
    (its server tool calls and results included): Anthropic's way to let the model go on with a
    turn it paused (``pause_turn``)."""
    return [*messages, {"role": "assistant", "content": [b.to_content() for b in paused]}]


def _without_trailing_whitespace(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A prefill's content: the API refuses one that ends in whitespace, so the blank text blocks
    at its end are left out and the text block then last loses its trailing whitespace (the kept
    blocks themselves, shown and stored, are not touched: ``held_whitespace`` is what the
    continuation is expected to write again)."""
    content = list(content)
    while content and content[-1].get("type") == TEXT and not content[-1]["text"].strip():
        content.pop()
    if content and content[-1].get("type") == TEXT:
        content[-1] = {**content[-1], "text": content[-1]["text"].rstrip()}
    return content


def held_whitespace(prefix: list[Block]) -> str:
    """The whitespace a prefill of ``prefix`` leaves out (``_without_trailing_whitespace``): the
    trailing whitespace of its last non-blank text block, then every blank text block after it."""
    held: list[str] = []
    for block in reversed(prefix):
        if block.kind != TEXT:
            break
        stripped = block.text.rstrip()
        held.append(block.text[len(stripped) :])
        if stripped:
            break
    return "".join(reversed(held))


def joiner_for(prefix: list[Block], strategy: Strategy | None, echoes_prefix: bool) -> ContinuationJoiner | None:
    """How the continued text block joins the kept one: what the provider repeats is dropped.

    A prefill continuation that starts with the whitespace the prefill had to lose has it
    dropped once, and one that starts the answer over has the repeat dropped; a prefix-flag
    continuation repeats the whole prefix where the provider echoes it; after a continue
    message the model may repeat a tail of the kept text.
    """
    if not prefix or prefix[-1].kind != TEXT:
        return None
    text = prefix[-1].text
    if strategy is Strategy.PREFILL:
        # what the prefill left out (a blank block, the whitespace before it): written again
        held = held_whitespace(prefix)
        # A server that ignores the prefill form (an OpenAI-compatible one without
        # ``continue_final_message``) starts the answer over: that is dropped, never appended.
        return ContinuationJoiner(held) if held else ContinuationJoiner(overlap_with=text, restarts_only=True)
    if not text.strip():  # a blank block is not sent (the API refuses it): the model writes it again
        return ContinuationJoiner(text)
    if strategy is Strategy.PREFIX_FLAG:
        return ContinuationJoiner(text if echoes_prefix else "")
    return ContinuationJoiner(overlap_with=text)


def summary(blocks: list[Block]) -> BlockSummary:
    """Counts of kept blocks, for the events."""
    return {
        "text_blocks": sum(1 for b in blocks if b.kind == TEXT),
        "text_chars": sum(len(b.text) for b in blocks if b.kind == TEXT),
        "tool_calls": sum(1 for b in blocks if b.kind == TOOL_USE),
        "thinking_blocks": sum(1 for b in blocks if b.kind == THINKING),
    }
