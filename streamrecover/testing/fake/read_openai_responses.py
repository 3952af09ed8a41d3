"""Reads an OpenAI Responses request the way the real API does.

``input`` is a string or a list of items: messages (``role`` + string or content parts),
``function_call`` and ``function_call_output`` items that must pair up, ``reasoning`` items
whose ``encrypted_content`` must be one the fake issued, unmodified. There is no prefill:
a trailing assistant message is a finished turn. Background mode needs ``store: true``.
``tools`` holds function tools and hosted ones (``web_search``, ``web_search_preview``), which
need no name; an answer told to cite (``[[cite]]``) searches with the latter. ``top_logprobs`` is an
integer from 0 to 20.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .interpret import Interpretation, Mode, RequestRejected, merge_turns, name_tool_results, peel_continuation
from .model import Conversation, ToolCall, ToolOffer, ToolResult, Turn
from .read_openai import content_text, system_text
from .wire_openai_responses import is_web_search, reasoning_valid

_ROLES = ("user", "assistant", "system", "developer")


def interpret(body: Any) -> Interpretation:
    """The request's meaning, or ``RequestRejected`` with the real API's message."""
    if not isinstance(body, dict):
        raise RequestRejected("Invalid type for request body: expected an object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestRejected("Missing required parameter: 'model'.", param="model", code="missing_required_parameter")
    if body.get("background") is True and body.get("store") is False:
        raise RequestRejected("Background mode requires `store` to be true.", param="background")
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise RequestRejected("Missing required parameter: 'input'.", param="input", code="missing_required_parameter")
    turns = [t for i, item in enumerate(raw) if (t := _turn(i, item)) is not None]
    _check_pairing(raw)
    _check_top_logprobs(body.get("top_logprobs"))
    base, mode, prefix_text, prefix_calls, instructions = peel_continuation(
        merge_turns(name_tool_results(turns)), Mode.NEW_TURN_AFTER_ASSISTANT
    )
    return Interpretation(
        model=model,
        stream=body.get("stream") is True,
        mode=mode,
        conversation=Conversation(
            base, _tools(body.get("tools")), isinstance(body.get("reasoning"), Mapping), _system(body, raw)
        ),
        prefix_text=prefix_text,
        prefix_calls=prefix_calls,
        instructions=instructions,
        include_usage=True,
        max_tokens=_max_tokens(body.get("max_output_tokens")),
    )


def _max_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 16:
        raise RequestRejected(
            "Invalid 'max_output_tokens': integer below minimum value. "
            f"Expected a value >= 16, but got {value} instead.",
            param="max_output_tokens",
            code="integer_below_min_value",
        )
    return value


def _check_top_logprobs(value: Any) -> None:
    """``top_logprobs`` is an integer from 0 to 20 (unlike Chat's, it needs no other field)."""
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestRejected(
            f"Invalid type for 'top_logprobs': expected an integer, but got {_json_type(value)} instead.",
            param="top_logprobs",
            code="invalid_type",
        )
    if value < 0:
        raise RequestRejected(
            f"Invalid 'top_logprobs': integer below minimum value. Expected a value >= 0, but got {value} instead.",
            param="top_logprobs",
            code="integer_below_min_value",
        )
    if value > 20:
        raise RequestRejected(
            f"Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got {value} instead.",
            param="top_logprobs",
            code="integer_above_max_value",
        )


def _json_type(value: Any) -> str:
    """How the API names a JSON value's type in its messages ("a string", "a decimal")."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _tools(tools: Any) -> tuple[ToolOffer, ...]:
    if not isinstance(tools, list):
        return ()
    offers = []
    for i, tool in enumerate(tools):
        if is_web_search(tool):
            continue  # the hosted tool: the fake's wire runs it (``wire_openai_responses``)
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            raise RequestRejected(
                f"Missing required parameter: 'tools[{i}].name'.",
                param=f"tools[{i}].name",
                code="missing_required_parameter",
            )
        parameters = tool.get("parameters")
        offers.append(ToolOffer(tool["name"], parameters if isinstance(parameters, Mapping) else {}))
    return tuple(offers)


def _system(body: Mapping[str, Any], items: list[Any]) -> str:
    """The ``instructions`` and the text of the system and developer messages, one to a line."""
    texts = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
    messages = system_text(items)
    return "\n".join([*texts, messages] if messages else texts)


def _turn(index: int, item: Any) -> Turn | None:
    if not isinstance(item, Mapping):
        raise RequestRejected(f"Invalid type for 'input[{index}]': expected an object.", param=f"input[{index}]")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise RequestRejected(
                f"Invalid value: '{role}'. Supported values are: 'user', 'assistant', 'system', and 'developer'.",
                param=f"input[{index}].role",
                code="invalid_value",
            )
        if role in ("user", "assistant"):
            return Turn(role, content_text(item.get("content")))
        return None
    if kind == "function_call":
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise RequestRejected(
                f"Missing required parameter: 'input[{index}].call_id'.", param=f"input[{index}].call_id"
            )
        call = ToolCall(call_id, str(item.get("name", "")), str(item.get("arguments", "")))
        return Turn("assistant", tool_calls=(call,))
    if kind == "function_call_output":
        result = ToolResult(str(item.get("call_id")), "", content_text(item.get("output")))
        return Turn("user", tool_results=(result,))
    if kind == "reasoning":
        _check_reasoning(index, item)
        return None
    raise RequestRejected(f"Invalid value: '{kind}'.", param=f"input[{index}].type", code="invalid_value")


def _check_reasoning(index: int, item: Mapping[str, Any]) -> None:
    """A reasoning item comes back as it was issued, or the request fails as the real one does."""
    token = item.get("encrypted_content")
    if not isinstance(token, str) or not reasoning_valid(token):
        raise RequestRejected(
            "The encrypted content for item could not be verified.",
            param=f"input[{index}].encrypted_content",
            code="invalid_encrypted_content",
        )


def _check_pairing(items: list[Any]) -> None:
    # (a call's call_id is a string: ``_turn`` refused the request otherwise)
    calls = {str(i.get("call_id")) for i in items if isinstance(i, Mapping) and i.get("type") == "function_call"}
    outputs = {i.get("call_id") for i in items if isinstance(i, Mapping) and i.get("type") == "function_call_output"}
    for call_id in outputs - calls:
        raise RequestRejected(f"No tool call found for function call output with call_id {call_id}.", param="input")
    for call_id in sorted(calls - outputs):
        raise RequestRejected(f"No tool output found for function call {call_id}.", param="input")
