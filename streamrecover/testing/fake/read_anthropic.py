"""Reads an Anthropic Messages request the way the real API does, rules and 400s included.

The rules enforced are the ones a recovery path can break: prefill
without trailing whitespace, no prefill with thinking, no prefill on models that refuse
it, thinking blocks sent back unmodified, a tool loop under manual thinking going on from
an assistant message that starts with its thinking, tool_use/tool_result pairing, a server
tool call answered by its result in the same message, no empty blocks. A request whose last
message is an assistant message ending with a server tool block is a paused turn sent back
(``pause_turn``), not a prefill: the model goes on with that turn, on any model and with
thinking too. Only a request's last message may hold a server tool call without its result
(paused before it ran).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from ...providers.anthropic import NO_PREFILL_MODELS
from .interpret import (
    Interpretation,
    Mode,
    RequestRejected,
    is_continue_instruction,
    merge_turns,
    name_tool_results,
    peel_continuation,
)
from .model import Conversation, ToolCall, ToolOffer, ToolResult, Turn, signature_valid
from .read_openai import content_text

# A family-first Claude id and its version, wherever it sits in the name (Bedrock's
# ``anthropic.claude-opus-4-6-v1:0``, Vertex's ``claude-opus-4-6@20260101``). The minor
# version is one or two digits, so a snapshot date (``claude-sonnet-4-20250514``) is not one.
_CLAUDE_VERSION = re.compile(r"claude-[a-z]+-(?P<major>\d+)(?:-(?P<minor>\d{1,2}))?(?![0-9])")
_FIRST_WITHOUT_PREFILL = (4, 6)  # "Starting with Claude 4.6 models ... prefilled responses ... no longer supported"
PREFILL_REFUSED = (
    "This model does not support assistant message prefill. The conversation must end with a user message."
)
TRAILING_WHITESPACE = "final assistant content cannot end with trailing whitespace"
_THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"


def interpret(body: Any, *, counting: bool = False) -> Interpretation:
    """The request's meaning, or ``RequestRejected`` with the real API's message. ``counting``:
    a ``count_tokens`` request, which has no ``max_tokens`` (nothing is generated)."""
    if not isinstance(body, dict):
        raise RequestRejected("Input should be a valid dictionary")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestRejected("model: Field required")
    messages = body.get("messages")
    if messages is None:
        raise RequestRejected("messages: Field required")
    if not isinstance(messages, list):
        raise RequestRejected("messages: Input should be a valid list")
    if not messages:
        raise RequestRejected("messages: at least one message is required")
    max_tokens = None if counting else body.get("max_tokens")
    if max_tokens is None and not counting:
        raise RequestRejected("max_tokens: Field required")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise RequestRejected("max_tokens: Input should be greater than or equal to 1")
    thinking = _thinking_enabled(body.get("thinking"), max_tokens)
    tools = _tools(body.get("tools"))

    turns = tuple(_turn(i, m, thinking, final=i == len(messages) - 1) for i, m in enumerate(messages))
    _check_tool_pairing(messages)
    _check_server_tool_results(messages)
    if isinstance(body.get("thinking"), Mapping) and body["thinking"].get("type") == "enabled":
        _check_thinking_leads_tool_loop(messages)
    final = messages[-1] if messages[-1].get("role") == "assistant" else {}
    paused = bool(final) and _ends_with_server_tool_block(final)
    if paused:
        _check_paused_turn(len(messages) - 1, messages[-1], thinking)
    elif messages[-1].get("role") == "assistant":
        _check_prefill(len(messages) - 1, messages[-1], model, thinking)
    base, mode, prefix_text, prefix_calls, instructions = peel_continuation(
        merge_turns(name_tool_results(turns)), Mode.PREFILL
    )
    system = content_text(body.get("system"))
    carried = _answer_so_far(messages, turns)
    return Interpretation(
        model=model,
        stream=body.get("stream") is True,
        mode=Mode.PAUSED_TURN if paused else mode,
        conversation=Conversation(base, tools, thinking, system, web_search=_offers_web_search(body.get("tools"))),
        prefix_text=prefix_text,
        prefix_calls=prefix_calls,
        instructions=instructions,
        max_tokens=max_tokens,
        sent_back=_sent_back(carried),
    )


def _thinking_enabled(thinking: Any, max_tokens: int | None) -> bool:
    if thinking is None:
        return False
    if not isinstance(thinking, Mapping) or thinking.get("type") not in ("enabled", "disabled", "adaptive"):
        raise RequestRejected("thinking: Input tag does not match any of the expected tags: 'enabled', 'disabled'")
    if thinking["type"] == "disabled":
        return False
    if thinking["type"] == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            raise RequestRejected("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
        if max_tokens is not None and max_tokens <= budget:
            raise RequestRejected(
                f"`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
                f"{_THINKING_DOCS}#max-tokens-and-context-window-size"
            )
    return True


def _tools(tools: Any) -> tuple[ToolOffer, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise RequestRejected("tools: Input should be a valid list")
    offers = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            raise RequestRejected(f"tools.{i}.name: Field required")
        if "input_schema" in tool or "type" not in tool:  # custom tools; server tools ("type") are not called
            schema = tool.get("input_schema")
            offers.append(ToolOffer(tool["name"], schema if isinstance(schema, Mapping) else {}))
    return tuple(offers)


def _offers_web_search(tools: Any) -> bool:
    """The request offers the web_search server tool (``web_search_20250305`` and later versions)."""
    return isinstance(tools, list) and any(
        isinstance(t, Mapping) and str(t.get("type", "")).startswith("web_search_") for t in tools
    )


# The server tools' blocks (the API runs the call and sends its result in the same message)
SERVER_TOOL_USE = "server_tool_use"


def _holds_server_tool_block(message: Mapping[str, Any]) -> bool:
    return any(b.get("type") == SERVER_TOOL_USE or _is_server_tool_result(b) for b in _blocks(message))


def _answer_so_far(messages: Sequence[Mapping[str, Any]], turns: Sequence[Turn]) -> list[Mapping[str, Any]]:
    """The assistant messages that carry the answer so far, in order: the trailing one (sent back
    paused, or a prefill), and before it the one of each continue-message round, however many
    (the model goes on from the whole assistant content so far)."""
    carried: list[Mapping[str, Any]] = []
    index = len(messages) - 1
    while True:
        while index >= 0 and turns[index].role == "assistant":
            carried.insert(0, messages[index])
            index -= 1
        if index < 1 or not is_continue_instruction(turns[index]) or turns[index - 1].role != "assistant":
            return carried
        index -= 1


def _sent_back(carried: Sequence[Mapping[str, Any]]) -> tuple[tuple[Mapping[str, Any], ...], ...]:
    """The blocks of each assistant message that carries the answer so far, when they hold server
    tool blocks (a web search answer): the answer goes on after them (``wire_anthropic.rest_after``)."""
    if not any(_holds_server_tool_block(m) for m in carried):
        return ()
    return tuple(tuple(_blocks(m)) for m in carried)


def _ends_with_server_tool_block(message: Mapping[str, Any]) -> bool:
    """A paused answer sent back: the API pauses a turn between its server tool steps, so the
    answer ends with a server tool call or result. (A prefill after a break ends with text.)"""
    blocks = _blocks(message)
    return bool(blocks) and (blocks[-1].get("type") == SERVER_TOOL_USE or _is_server_tool_result(blocks[-1]))


def _is_server_tool_result(block: Mapping[str, Any]) -> bool:
    kind = str(block.get("type", ""))
    return kind != "tool_result" and kind.endswith("_tool_result")


def _check_server_tool_results(messages: list[Any]) -> None:
    """A server tool call is followed by its result in the same assistant message, except in the
    request's last message (a turn the API paused before the call ran, sent back to go on). The
    fake reads each message as sent: a paused answer and its continuation stored as two
    assistant messages are refused, whatever the API merges (no kinder than the real API)."""
    for i, message in enumerate(messages[:-1]):
        if message.get("role") != "assistant":
            continue
        blocks = _blocks(message)
        answered = {b.get("tool_use_id") for b in blocks if _is_server_tool_result(b)}
        for block in blocks:
            if block.get("type") == SERVER_TOOL_USE and block.get("id") not in answered:
                name = block.get("name")
                raise RequestRejected(
                    f"messages.{i}: `{name}` tool use with id `{block.get('id')}` was found without a "
                    f"corresponding `{name}_tool_result` block"
                )


def _check_paused_turn(index: int, message: Mapping[str, Any], thinking: bool) -> None:
    """The rules of a paused turn sent back: the model's answer so far, so with thinking it starts
    with its thinking block, and, as any final assistant content, no trailing whitespace."""
    blocks = _blocks(message)
    if thinking and blocks[0].get("type") not in ("thinking", "redacted_thinking"):
        raise RequestRejected(f"{_thinking_first(index, str(blocks[0].get('type')))}. {_THINKING_FIRST_ADVICE}")
    last = blocks[-1]
    if last.get("type") == "text" and isinstance(last.get("text"), str) and last["text"] != last["text"].rstrip():
        raise RequestRejected(TRAILING_WHITESPACE)


# The content block types the Messages API takes in a request; another (a block of another
# provider's format sent on after a failover) is refused with a 400, as the API refuses it.
CONTENT_TYPES = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
        "compaction",
    }
)


def _turn(index: int, message: Any, thinking: bool, *, final: bool) -> Turn:
    where = f"messages.{index}"
    if not isinstance(message, Mapping):
        raise RequestRejected(f"{where}: Input should be a valid dictionary")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise RequestRejected(f"{where}.role: Input should be 'user' or 'assistant'")
    content = message.get("content")
    if isinstance(content, str):
        if not content and not (final and role == "assistant"):
            raise RequestRejected(
                f"{where}: all messages must have non-empty content except for the optional final assistant message"
            )
        return Turn(role, content)
    if not isinstance(content, list):
        raise RequestRejected(f"{where}.content: Input should be a valid string or a valid list")
    if not content and not (final and role == "assistant"):
        raise RequestRejected(
            f"{where}: all messages must have non-empty content except for the optional final assistant message"
        )
    texts: list[str] = []
    calls: list[ToolCall] = []
    results: list[ToolResult] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        at = f"{where}.content.{j}"
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str) or not text:
                raise RequestRejected(f"{at}: text content blocks must be non-empty")
            if not text.strip():
                raise RequestRejected(f"{at}: text content blocks must contain non-whitespace text")
            texts.append(text)
        elif kind == "thinking" and role == "assistant":
            _check_thinking_block(at, block, thinking, final=final)
        elif kind == "redacted_thinking" and role == "assistant":
            if final and not thinking:
                raise RequestRejected(_thinking_disabled_message(at))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_call(at, block))
        elif kind == "tool_result" and role == "user":
            results.append(ToolResult(str(block.get("tool_use_id", "")), "", _result_text(block.get("content"))))
        elif kind is None:
            raise RequestRejected(f"{at}.type: Field required")
        elif kind not in CONTENT_TYPES:
            raise RequestRejected(
                f"{at}: Input tag {kind!r} found using 'type' does not match any of the expected tags: "
                + ", ".join(repr(t) for t in sorted(CONTENT_TYPES))
            )
    joiner = "\n" if role == "user" else ""
    return Turn(role, joiner.join(texts), tuple(calls), tuple(results))


def _check_thinking_block(at: str, block: Mapping[str, Any], thinking: bool, *, final: bool) -> None:
    if final and not thinking:
        raise RequestRejected(_thinking_disabled_message(at))
    text, signature = block.get("thinking"), block.get("signature")
    if not isinstance(text, str) or not isinstance(signature, str) or not signature_valid(text, signature):
        raise RequestRejected(
            f"{at}: `thinking` or `redacted_thinking` blocks in the latest assistant message cannot be modified. "
            "These blocks must remain as they were in the original response."
        )


def _thinking_disabled_message(at: str) -> str:
    return (
        f"{at}: When thinking is disabled, an `assistant` message in the final position cannot contain "
        "`thinking`. To use thinking blocks, enable `thinking` in your request."
    )


def _tool_call(at: str, block: Mapping[str, Any]) -> ToolCall:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, Mapping):
        raise RequestRejected(f"{at}: tool_use blocks need `id`, `name` and an object `input`")
    return ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False))


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b["text"] for b in content if isinstance(b, Mapping) and isinstance(b.get("text"), str))
    return ""


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def _check_tool_pairing(messages: list[Any]) -> None:
    """Every tool_use is answered in the next message, and every tool_result answers one."""
    for i, message in enumerate(messages):
        if message.get("role") == "assistant" and i < len(messages) - 1:
            ids = [b.get("id") for b in _blocks(message) if b.get("type") == "tool_use"]
            following = messages[i + 1] if messages[i + 1].get("role") == "user" else {}
            answered = {b.get("tool_use_id") for b in _blocks(following) if b.get("type") == "tool_result"}
            missing = [str(x) for x in ids if x not in answered]
            if missing:
                raise RequestRejected(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                    "in the next message."
                )
        if message.get("role") == "user":
            previous = messages[i - 1] if i and messages[i - 1].get("role") == "assistant" else {}
            offered = {b.get("id") for b in _blocks(previous) if b.get("type") == "tool_use"}
            for j, block in enumerate(_blocks(message)):
                if block.get("type") == "tool_result" and block.get("tool_use_id") not in offered:
                    raise RequestRejected(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )


def _thinking_first(index: int, found: str) -> str:
    """The real API's 400 when an assistant message that must start with thinking does not."""
    return (
        f"messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. "
        "When `thinking` is enabled, a final `assistant` message must start with a thinking block"
    )


_THINKING_FIRST_ADVICE = (
    "We recommend you include thinking blocks from previous turns. To avoid this requirement, "
    f"disable `thinking`. Please consult our documentation at {_THINKING_DOCS}"
)


def _check_thinking_leads_tool_loop(messages: list[Any]) -> None:
    """With manual thinking, a tool loop in progress (the last user message holds tool_results)
    goes on from an assistant message that starts with its thinking: the API refuses one whose
    thinking was left out or moved. Adaptive thinking relaxes this; earlier loops may omit it."""
    last_user = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), None)
    if not last_user or not any(b.get("type") == "tool_result" for b in _blocks(messages[last_user])):
        return
    assistant = messages[last_user - 1]
    if assistant.get("role") != "assistant":
        return
    blocks = _blocks(assistant)
    first = str(blocks[0].get("type")) if blocks else "text"
    if first not in ("thinking", "redacted_thinking"):
        raise RequestRejected(
            f"{_thinking_first(last_user - 1, first)} (preceeding the lastmost set of `tool_use` and `tool_result` "
            f"blocks). {_THINKING_FIRST_ADVICE}"
        )


def refuses_prefill(model: str) -> bool:
    """True for the models the real API answers a prefill with a 400: every model the
    product knows refuses it (its own list, so the two cannot drift apart) and, as the API
    does, every Claude from 4.6 on, including ones newer than that list (``claude-opus-5``,
    ``claude-haiku-5``), so the product's fallback for an unlisted model gets exercised."""
    if any(fnmatchcase(model, pattern) for pattern in NO_PREFILL_MODELS):
        return True
    match = _CLAUDE_VERSION.search(model)
    if match is None:
        return False
    return (int(match["major"]), int(match["minor"] or 0)) >= _FIRST_WITHOUT_PREFILL


def _check_prefill(index: int, message: Mapping[str, Any], model: str, thinking: bool) -> None:
    """The rules of a request that ends with an assistant message (a prefill)."""
    if refuses_prefill(model):
        raise RequestRejected(PREFILL_REFUSED)
    content = message.get("content")
    blocks = _blocks(message)
    if thinking:
        first = blocks[0].get("type") if blocks else "text"
        if first not in ("thinking", "redacted_thinking"):
            raise RequestRejected(f"{_thinking_first(index, str(first))}. {_THINKING_FIRST_ADVICE}")
        raise RequestRejected(f"messages.{index}: Prefilling the assistant response is not supported with thinking.")
    last_text = content if isinstance(content, str) else blocks[-1].get("text") if blocks else None
    if isinstance(last_text, str) and last_text and last_text != last_text.rstrip():
        raise RequestRejected(TRAILING_WHITESPACE)
