"""OutputBudget: the output tokens one turn has used of its ``max_tokens``, across continuations."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from .attempts import count_input_tokens
from .blocks import TEXT, TOOL_USE, Block
from .continuation import continuation_messages, continue_from
from .contract import ModelRequest, ThinkingRule
from .plan import RecoveryPlan
from .sink import AttemptRecord
from .translate import Translator
from .turnstate import TurnState


class OutputBudget:
    """Output tokens the blocks this turn builds on cost so far (an upper bound), and those of
    answers it dropped to start over (billed all the same): max_tokens is the turn's budget, for
    both together. ``received_bytes`` is every byte of output received since the answer last
    started over; ``base_input`` the provider's count of the turn's request, no prefix."""

    def __init__(self, state: TurnState, translator: Translator) -> None:
        self.state = state
        self.translator = translator
        self.output_used = 0
        self.dropped_output = 0
        self.counted: AttemptRecord | None = None  # the attempt whose output ``output_used`` holds last
        self.received_bytes = 0
        self.base_input: int | None = None

    def attempt_output(self) -> int:
        """Output tokens of the attempt that just broke: the provider's count when its final usage
        arrived, else an upper bound (the bytes received, at least one per token; where the server
        streams a token per text delta, ``delta_token_bound`` of each; the provider's running
        count when that is higher)."""
        record = self.state.attempt
        reported = record.usage.output_tokens if record is not None else None
        if self.translator.final_usage and reported is not None:
            return reported
        return max(self.translator.received_tokens(self.state.ctx.adapter.text_delta_is_token), reported or 0)

    def count_break(self) -> None:
        """The attempt that just broke: what it cost and received counts from now on."""
        self.output_used += self.attempt_output()
        self.counted = self.state.attempt
        self.received_bytes += self.translator.received_bytes

    async def measure(self, recovery: RecoveryPlan) -> None:
        """Refine ``output_used`` with the provider's own count, where it has a free one: the
        continuation's input tokens less the turn request's are the prefix it carries (an upper
        bound: the framing a continuation adds counts too); every received byte not in that
        prefix (thinking, dropped blocks, a prefill's held-back whitespace) still counts as one
        token. The lower of this and the running bound is kept: both only over-count."""
        state = self.state
        ctx = state.ctx
        adapter = ctx.adapter
        chosen = continue_from(recovery, state.model_strategy())
        if chosen.kind == "restart":
            return
        messages = continuation_messages(state.request.messages, chosen.prefix, chosen.strategy)
        prefixed = adapter.count_request(replace(state.request, messages=messages))
        if prefixed is None:
            return
        if self.base_input is None:  # the turn's first break: both counts at once, one round trip
            base = adapter.count_request(state.request)
            if base is None:
                return
            self.base_input, counted = await asyncio.gather(
                count_input_tokens(ctx, base), count_input_tokens(ctx, prefixed)
            )
        else:
            counted = await count_input_tokens(ctx, prefixed)
        if counted is None or self.base_input is None:
            return
        sent = _sent_bytes(messages[len(state.request.messages)], chosen.prefix)
        measured = max(0, counted - self.base_input) + max(0, self.received_bytes - sent)
        self.output_used = min(self.output_used, measured)

    def answer_output(self) -> tuple[int, int]:
        """``output_used`` and ``received_bytes`` with the output of the attempt streaming now,
        counted only once it breaks: what the answer cost and received so far, kept or not."""
        attempt = self.state.attempt
        if attempt is None or attempt is self.counted:
            return self.output_used, self.received_bytes
        return self.output_used + self.attempt_output(), self.received_bytes + self.translator.received_bytes

    def used(self) -> int:
        """Output tokens the turn was billed so far (an upper bound), kept or dropped."""
        return self.dropped_output + self.output_used

    def spent(self) -> bool:
        """True when what is left of the turn's ``max_tokens`` is below the smallest budget the
        provider takes in a request (OpenAI Responses: 16): no further call can be made."""
        return self.state.request.max_tokens - self.used() < self.state.ctx.adapter.min_max_tokens

    def budgeted(self, request: ModelRequest) -> ModelRequest:
        """A continuation or a restart asks for what is left of the turn's ``max_tokens``, never
        more, and its thinking budget fits that by the adapter's rule for the model
        (``fit_thinking``). The callers end the turn before too little is left (``spent``):
        asking for less than the provider takes would be refused, so that is a bug, raised."""
        used = self.used()
        if not used:
            return request
        left = request.max_tokens - used
        minimum = self.state.ctx.adapter.min_max_tokens
        if left < minimum:
            raise ValueError(f"max_tokens left ({left}) is below the provider's minimum ({minimum})")
        thinking = fit_thinking(request.thinking_budget, left, self.state.ctx.adapter.thinking_rule(request.model))
        return replace(request, max_tokens=left, thinking_budget=thinking)

    def restart(self) -> None:
        """The answer starts over, and what it dropped was billed: it still counts against the
        turn's budget (the restart asks for what is left), but not as a prefix's cost."""
        self.dropped_output += self.output_used
        self.output_used = self.received_bytes = 0


def fit_thinking(budget: int | None, left: int, rule: ThinkingRule) -> int | None:
    """``budget`` for a call that asks for ``left`` output tokens: as it is when below that (0 and
    Gemini's -1, dynamic, too), else one below ``left`` where the model takes that (``rule.minimum``
    or more), else the model's minimum or none at all, as ``rule`` says. A budget is never raised:
    the model took it in the turn's first call."""
    if budget is None or budget < left:
        return budget
    floor = budget if rule.minimum is None else min(rule.minimum, budget)
    if left - 1 >= floor:
        return left - 1
    return floor if rule.send_minimum else None


def _sent_bytes(message: dict[str, Any], prefix: list[Block]) -> int:
    """UTF-8 bytes of the prefix's text and tool arguments as ``message`` carries them (a
    prefill's last text without its trailing whitespace; a blank text block is not sent)."""
    sent = 0
    texts = [c.get("text", "") for c in message.get("content", []) if isinstance(c, dict) and c.get("type") == TEXT]
    sent += sum(len(t.encode()) for t in texts if isinstance(t, str) and t.strip())
    sent += sum(len(b.arguments.encode()) for b in prefix if b.kind == TOOL_USE)
    return sent
