"""How the fake provider understood a request: fresh, or a continuation of which kind.

Shared by both wire formats. Each reader turns its request JSON into ``Turn``s; this
module peels the continuation off the end of the conversation, because that is where
the strategies (prefill, prefix flag, continue message) differ and where recovery bugs
show up.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...engine.contract import CONTINUE_INSTRUCTION
from .model import Conversation, ToolCall, Turn


class Mode(enum.StrEnum):
    FRESH = "fresh"
    PREFILL = "prefill"
    PREFIX_FLAG = "prefix_flag"
    CONTINUE_MESSAGE = "continue_message"
    NEW_TURN_AFTER_ASSISTANT = "new_turn_after_assistant"
    PAUSED_TURN = "paused_turn"  # Anthropic: a paused answer sent back as it is, for the model to go on


class RequestRejected(Exception):
    """The request breaks a provider rule; the server answers with this error body."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class Interpretation:
    """``conversation`` ends with the user turn the answer responds to; the prefix (if any)
    is what the request says the assistant already wrote of that answer."""

    model: str
    stream: bool
    mode: Mode
    conversation: Conversation
    prefix_text: str = ""
    prefix_calls: tuple[ToolCall, ...] = ()
    include_usage: bool = False
    max_tokens: int | None = None  # the request's output limit (the answer stops there: max_tokens)
    instructions: int = 0  # continue-instruction messages peeled off (each costs input tokens)
    # the answer so far when it holds server tool blocks, the blocks of each assistant message
    # that carries it, in order (a paused turn sent back, a web search answer's prefill, the
    # assistant message of each continue-message round): the answer goes on after them
    sent_back: tuple[tuple[Mapping[str, Any], ...], ...] = ()

    @property
    def continues(self) -> bool:
        return self.mode in (Mode.PREFILL, Mode.PREFIX_FLAG, Mode.CONTINUE_MESSAGE, Mode.PAUSED_TURN)


def merge_turns(turns: Iterable[Turn]) -> tuple[Turn, ...]:
    """Consecutive turns of one role are one turn, as both APIs combine them."""
    merged: list[Turn] = []
    for turn in turns:
        if merged and merged[-1].role == turn.role:
            last = merged[-1]
            joiner = "\n" if turn.role == "user" and last.text and turn.text else ""
            merged[-1] = replace(
                last,
                text=last.text + joiner + turn.text,
                tool_calls=last.tool_calls + turn.tool_calls,
                tool_results=last.tool_results + turn.tool_results,
            )
        else:
            merged.append(turn)
    return tuple(merged)


def name_tool_results(turns: Iterable[Turn]) -> tuple[Turn, ...]:
    """Give each tool result the name of the call it answers (the wire formats carry only ids)."""
    names: dict[str, str] = {}
    named: list[Turn] = []
    for turn in turns:
        names.update((call.id, call.name) for call in turn.tool_calls)
        results = tuple(replace(r, name=names.get(r.tool_use_id, r.name)) for r in turn.tool_results)
        named.append(replace(turn, tool_results=results))
    return tuple(named)


def is_continue_instruction(turn: Turn) -> bool:
    return turn.role == "user" and not turn.tool_results and turn.text.strip() == CONTINUE_INSTRUCTION


def peel_continuation(
    turns: tuple[Turn, ...], trailing_assistant: Mode
) -> tuple[tuple[Turn, ...], Mode, str, tuple[ToolCall, ...], int]:
    """Split merged turns into (base conversation, mode, prefix text, prefix tool calls, the
    number of continue instructions peeled).

    A trailing assistant turn is read as ``trailing_assistant`` (prefill, prefix flag, or a
    finished turn after which a new answer starts). Trailing (assistant, continue
    instruction) pairs are peeled too; nested ones add up to one prefix.
    """
    mode = Mode.FRESH
    instructions = 0
    prefix_text = ""
    prefix_calls: tuple[ToolCall, ...] = ()
    if turns and turns[-1].role == "assistant":
        if trailing_assistant is Mode.NEW_TURN_AFTER_ASSISTANT:
            return turns[:-1], trailing_assistant, "", (), 0
        mode, prefix_text, prefix_calls = trailing_assistant, turns[-1].text, turns[-1].tool_calls
        turns = turns[:-1]
    while len(turns) >= 2 and is_continue_instruction(turns[-1]) and turns[-2].role == "assistant":
        if mode is Mode.FRESH:
            mode = Mode.CONTINUE_MESSAGE
        prefix_text = turns[-2].text + prefix_text
        prefix_calls = turns[-2].tool_calls + prefix_calls
        turns = turns[:-2]
        instructions += 1
    if not turns or turns[-1].role != "user":
        raise RequestRejected("messages: the conversation must contain a user message before the assistant's answer")
    return turns, mode, prefix_text, prefix_calls, instructions
