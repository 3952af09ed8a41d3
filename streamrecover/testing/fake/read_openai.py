"""Reads an OpenAI Chat Completions request the way the real API does.

OpenAI has no prefill: a trailing assistant message is a finished turn and the model
starts a new answer. ``"prefix": true`` on it (DeepSeek's beta, Mistral) asks for a
continuation that does not repeat the prefix (DeepSeek style). ``continue_final_message:
true`` with ``add_generation_prompt: false`` (vLLM, SGLang, llama.cpp) continues inside it,
a prefill; a model named ``*nocontinue*`` is a server that refuses the argument (OpenAI's
own 400 for an unknown one), ``*ignorecontinue*`` one that ignores it (a new answer starts).
A model named ``o1*``, ``o3*``, ``o4*`` or ``gpt-5*`` refuses ``max_tokens`` (it takes only
``max_completion_tokens``), with the real API's 400. A model named ``*reasoner*`` reasons
first (DeepSeek's ``reasoning_content``) and, as DeepSeek does, refuses ``reasoning_content``
sent back in history. Tool calls and tool messages must pair up, with the real API's 400s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from .interpret import Interpretation, Mode, RequestRejected, merge_turns, name_tool_results, peel_continuation
from .model import Conversation, ToolCall, ToolOffer, ToolResult, Turn

_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
# Models that refuse the older ``max_tokens`` (reasoning models): only ``max_completion_tokens``
_COMPLETION_TOKENS_ONLY = ("o1", "o3", "o4", "gpt-5")


def interpret(body: Any) -> Interpretation:
    """The request's meaning, or ``RequestRejected`` with the real API's message."""
    if not isinstance(body, dict):
        raise RequestRejected("Invalid type for request body: expected an object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestRejected("you must provide a model parameter")
    messages = body.get("messages")
    if messages is None:
        raise RequestRejected(
            "Missing required parameter: 'messages'.", param="messages", code="missing_required_parameter"
        )
    if not isinstance(messages, list):
        raise RequestRejected("Invalid type for 'messages': expected an array.", param="messages", code="invalid_type")
    if not messages:
        raise RequestRejected(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            param="messages",
            code="empty_array",
        )
    turns = [t for i, m in enumerate(messages) if (t := _turn(i, m)) is not None]
    _check_tool_pairing(messages)
    _check_logprobs(body)
    reasoner = "reasoner" in model
    if reasoner and any(isinstance(m, Mapping) and "reasoning_content" in m for m in messages):
        raise RequestRejected(
            "The reasoning_content is an intermediate result for display purposes only and will not be included in "
            "the context for inference. Please remove the reasoning_content from your API request before sending it."
        )
    last = messages[-1]
    trailing = Mode.PREFIX_FLAG if last.get("role") == "assistant" and last.get("prefix") is True else None
    if trailing is None and _continues_final_message(body, model) and last.get("role") == "assistant":
        trailing = Mode.PREFILL
    base, mode, prefix_text, prefix_calls, instructions = peel_continuation(
        merge_turns(name_tool_results(turns)), trailing or Mode.NEW_TURN_AFTER_ASSISTANT
    )
    options = body.get("stream_options")
    return Interpretation(
        model=model,
        stream=body.get("stream") is True,
        mode=mode,
        conversation=Conversation(base, _tools(body.get("tools")), thinking=reasoner, system=system_text(messages)),
        prefix_text=prefix_text,
        prefix_calls=prefix_calls,
        instructions=instructions,
        include_usage=isinstance(options, Mapping) and options.get("include_usage") is True,
        max_tokens=_max_tokens(body, model),
    )


def _continues_final_message(body: Mapping[str, Any], model: str) -> bool:
    """``continue_final_message`` as vLLM reads it (with its 400s), or as a server that
    refuses or ignores it."""
    if "continue_final_message" not in body:
        return False
    if "nocontinue" in model:
        raise RequestRejected(
            "Unrecognized request argument supplied: continue_final_message", param="continue_final_message"
        )
    if body["continue_final_message"] is not True or "ignorecontinue" in model:
        return False
    if body.get("add_generation_prompt", True) is not False:
        raise RequestRejected("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    return True


def _check_logprobs(body: Mapping[str, Any]) -> None:
    """``top_logprobs`` is an integer from 0 to 20, and only with ``logprobs: true`` (the API
    reference: "logprobs must be set to true if this parameter is used")."""
    top = body.get("top_logprobs")
    if top is None:
        return
    if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20:
        raise RequestRejected(
            f"Invalid 'top_logprobs': expected an integer from 0 to 20, but got {top} instead.",
            param="top_logprobs",
            code="invalid_value",
        )
    if body.get("logprobs") is not True:
        raise RequestRejected(
            "Invalid value for 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is used.",
            param="top_logprobs",
            code="invalid_value",
        )


def _max_tokens(body: Mapping[str, Any], model: str) -> int | None:
    if "max_tokens" in body and model.startswith(_COMPLETION_TOKENS_ONLY):
        raise RequestRejected(
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            param="max_tokens",
            code="unsupported_parameter",
        )
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RequestRejected(
                    f"Invalid '{name}': integer below minimum value. Expected a value >= 1, but got {value} instead.",
                    param=name,
                    code="integer_below_min_value",
                )
            return value
    return None


def _tools(tools: Any) -> tuple[ToolOffer, ...]:
    if not isinstance(tools, list):
        return ()
    offers = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise RequestRejected(
                f"Missing required parameter: 'tools[{i}].function'.",
                param=f"tools[{i}].function",
                code="missing_required_parameter",
            )
        parameters = function.get("parameters")
        offers.append(ToolOffer(function["name"], parameters if isinstance(parameters, Mapping) else {}))
    return tuple(offers)


def content_text(content: Any) -> str:
    """A message's text: a string, or the ``text`` of its parts (Chat and Responses alike)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def system_text(messages: list[Any]) -> str:
    """The text of the system and developer messages, one to a line (Chat messages and Responses
    input items alike: the items without a role are not messages)."""
    return "\n".join(
        content_text(m.get("content"))
        for m in messages
        if isinstance(m, Mapping) and m.get("role") in ("system", "developer")
    )


def _turn(index: int, message: Any) -> Turn | None:
    if not isinstance(message, Mapping):
        raise RequestRejected(
            f"Invalid type for 'messages[{index}]': expected an object.",
            param=f"messages[{index}]",
            code="invalid_type",
        )
    role = message.get("role")
    if role not in _ROLES:
        raise RequestRejected(
            f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', "
            "and 'developer'.",
            param=f"messages[{index}].role",
            code="invalid_value",
        )
    if role == "user":
        return Turn("user", content_text(message.get("content")))
    if role == "assistant":
        return Turn("assistant", content_text(message.get("content")), _tool_calls(index, message.get("tool_calls")))
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise RequestRejected(
                f"Missing required parameter: 'messages[{index}].tool_call_id'.",
                param=f"messages[{index}].tool_call_id",
                code="missing_required_parameter",
            )
        return Turn("user", tool_results=(ToolResult(call_id, "", content_text(message.get("content"))),))
    return None  # system, developer, legacy function messages: not read by the fake model


def _tool_calls(index: int, tool_calls: Any) -> tuple[ToolCall, ...]:
    if not tool_calls:
        return ()
    if not isinstance(tool_calls, list):
        raise RequestRejected(
            f"Invalid type for 'messages[{index}].tool_calls': expected an array.",
            param=f"messages[{index}].tool_calls",
            code="invalid_type",
        )
    calls = []
    for j, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(call.get("id"), str):
            raise RequestRejected(
                f"Missing required parameter: 'messages[{index}].tool_calls[{j}].function'.",
                param=f"messages[{index}].tool_calls[{j}].function",
                code="missing_required_parameter",
            )
        calls.append(ToolCall(call["id"], str(function.get("name", "")), str(function.get("arguments", ""))))
    return tuple(calls)


def _check_tool_pairing(messages: list[Any]) -> None:
    """An assistant message with tool_calls is followed by a tool message for each call, and
    every tool message answers such a call."""
    pending: dict[str, int] = {}  # call id -> index of the assistant message that made it
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                raise RequestRejected(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with "
                    "'tool_calls'.",
                    param=f"messages.[{i}].role",
                )
            pending.pop(message["tool_call_id"])
            continue
        if pending:
            _missing_tool_responses(min(pending.values()), pending)
        if role == "assistant" and i < len(messages) - 1:
            for call in message.get("tool_calls") or []:
                pending[call["id"]] = i
    if pending:
        _missing_tool_responses(min(pending.values()), pending)


def _missing_tool_responses(index: int, pending: Mapping[str, int]) -> NoReturn:
    raise RequestRejected(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(pending)}",
        param=f"messages.[{index}].role",
    )
