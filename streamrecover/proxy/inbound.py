"""A client's request in a provider's own format (Anthropic Messages, OpenAI Chat or Responses) in the run's terms.

The conversation becomes canonical messages (the engine's block shape); the fields the engine
works with (model, ``max_tokens``, system, temperature, extended thinking) are read out, and
every other field the client sent passes to the provider as it was sent (``extra``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

Format = Literal["anthropic", "openai", "responses"]
ANTHROPIC: Final = "anthropic"
OPENAI: Final = "openai"
RESPONSES: Final = "responses"
FORMATS: Final = (ANTHROPIC, OPENAI, RESPONSES)

# Fields the proxy itself decides: never passed on as the client sent them.
_OWN_FIELDS = frozenset(
    {"model", "messages", "input", "max_tokens", "max_completion_tokens", "max_output_tokens"}
    | {"stream", "stream_options"}
)
# Responses fields that name state kept at the provider: the run's conversation is the request's own
_STATEFUL = ("previous_response_id", "conversation", "background", "prompt")


class BadRequest(ValueError):
    """The request cannot be served: the client gets a 400 in its provider's error format."""


@dataclass(slots=True)
class ProxyRequest:
    """What a proxied run needs from the client's request."""

    format: Format
    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    stream: bool
    system: str | None = None
    temperature: float | None = None
    thinking_budget: int | None = None
    structured: bool = False
    include_usage: bool = False  # OpenAI: the client asked for the usage chunk
    max_tokens_given: bool = True  # False: an OpenAI request without one (the default applies)
    extra: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)  # as sent (a non-streamed request passes it on)
    betas: list[str] = field(default_factory=list)  # Anthropic: the client's ``anthropic-beta`` flags

    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                texts = [b.get("text", "") for b in message.get("content", []) if b.get("type") == "text"]
                return " ".join(t for t in texts if t)
        return ""


def parse(format: Format, raw: bytes, default_max_tokens: int) -> ProxyRequest:
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        raise BadRequest("There was an error parsing the body of your request: invalid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: Field required")
    if format == RESPONSES:
        return _responses(body, model, default_max_tokens)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: Field required (a non-empty list)")
    if format == ANTHROPIC:
        return _anthropic(body, model, messages)
    return _openai(body, model, messages, default_max_tokens)


def _max_tokens(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"{name}: must be a positive integer")
    return value


def _structured(output_format: Any, tool_choice: Any) -> bool:
    """Whether an OpenAI-format request asks for a structured answer: an output format other
    than text (Chat's ``response_format``, Responses' ``text.format``), or a forced tool call."""
    formatted = isinstance(output_format, dict) and output_format.get("type") not in (None, "text")
    return formatted or tool_choice == "required" or isinstance(tool_choice, dict)


def _temperature(body: dict[str, Any]) -> float | None:
    value = body.get("temperature")
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadRequest("temperature: must be a number")
    return float(value)


def _extra(body: dict[str, Any], *taken: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in _OWN_FIELDS and k not in taken}


# ---- Anthropic Messages ----------------------------------------------------------------


def _anthropic(body: dict[str, Any], model: str, messages: list[Any]) -> ProxyRequest:
    if "max_tokens" not in body:
        raise BadRequest("max_tokens: Field required")
    canonical = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise BadRequest("messages: each message needs a role of 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise BadRequest("messages: content must be a string or a list of blocks")
        canonical.append({"role": message["role"], "content": content})
    taken = ["temperature"]
    system = body.get("system")
    if isinstance(system, str):
        taken.append("system")
    elif isinstance(system, list):
        # blocks (cache_control...) pass to an Anthropic provider as sent; their text is the
        # run's system prompt (what a fallback of another format is given)
        system = "\n\n".join(b.get("text", "") for b in system if isinstance(b, dict) and b.get("type") == "text")
    thinking = body.get("thinking")
    budget = None
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise BadRequest("thinking.budget_tokens: must be an integer")
        taken.append("thinking")
    choice = body.get("tool_choice")
    structured = isinstance(choice, dict) and choice.get("type") in ("any", "tool")
    return ProxyRequest(
        format=ANTHROPIC,
        model=model,
        messages=canonical,
        max_tokens=_max_tokens(body.get("max_tokens"), "max_tokens"),
        stream=bool(body.get("stream")),
        system=system if isinstance(system, str) and system else None,
        temperature=_temperature(body),
        thinking_budget=budget,
        structured=structured,
        extra=_extra(body, *taken),
        body=body,
    )


def beta_flags(header: str | None) -> list[str]:
    """The flags of an ``anthropic-beta`` header (comma-separated, as the SDK sends its ``betas``):
    the fields they enable pass in ``extra``, so an Anthropic provider needs them too."""
    return [flag.strip() for flag in (header or "").split(",") if flag.strip()]


# ---- OpenAI Chat Completions -----------------------------------------------------------


def _openai(body: dict[str, Any], model: str, messages: list[Any], default_max_tokens: int) -> ProxyRequest:
    if body.get("n") not in (None, 1):
        raise BadRequest("n: only one choice is supported")
    raw_max = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = default_max_tokens if raw_max is None else _max_tokens(raw_max, "max_tokens")
    system: str | None = None
    canonical: list[dict[str, Any]] = []
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest("messages: each message must be an object")
        role = message.get("role")
        if role in ("system", "developer"):
            text = _openai_text(message.get("content"))
            if position == 0 and role == "system":
                system = text
            else:
                canonical.append({"role": "system", "content": [{"type": "text", "text": text}]})
        elif role == "user":
            canonical.append({"role": "user", "content": _openai_user(message.get("content"))})
        elif role == "assistant":
            canonical.append({"role": "assistant", "content": _openai_assistant(message)})
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
                "content": _openai_text(message.get("content")),
            }
            if canonical and canonical[-1]["role"] == "user" and canonical[-1]["content"][-1]["type"] == "tool_result":
                canonical[-1]["content"].append(result)
            else:
                canonical.append({"role": "user", "content": [result]})
        else:
            raise BadRequest(f"messages[{position}].role: unsupported role {role!r}")
    stream_options = body.get("stream_options")
    include_usage = isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
    response_format = body.get("response_format")
    structured = _structured(response_format, body.get("tool_choice"))
    return ProxyRequest(
        format=OPENAI,
        model=model,
        messages=canonical,
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        system=system,
        temperature=_temperature(body),
        structured=structured,
        include_usage=include_usage,
        max_tokens_given=raw_max is not None,
        extra=_extra(body, "temperature", "n"),
        body=body,
    )


def _openai_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise BadRequest("messages: content must be a string or a list of parts")


def _openai_user(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest("messages: content must be a string or a list of parts")
    # text parts become text blocks; other parts (images...) pass to the provider as sent
    return [
        {"type": "text", "text": p.get("text", "")} if isinstance(p, dict) and p.get("type") == "text" else p
        for p in content
    ]


def _openai_assistant(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    text = _openai_text(message.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            raise BadRequest("messages: a tool call's arguments are not valid JSON") from None
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": arguments})
    return blocks


# ---- OpenAI Responses ------------------------------------------------------------------


def _responses(body: dict[str, Any], model: str, default_max_tokens: int) -> ProxyRequest:
    for name in _STATEFUL:
        if body.get(name):
            raise BadRequest(f"{name}: not supported by this endpoint; send the whole conversation in input")
    raw_max = body.get("max_output_tokens")
    max_tokens = default_max_tokens if raw_max is None else _max_tokens(raw_max, "max_output_tokens")
    canonical = _responses_input(body.get("input"))
    if not canonical:
        raise BadRequest("input: Field required (a string or a non-empty list of items)")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("instructions: must be a string")
    text_format = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    structured = _structured(text_format, body.get("tool_choice"))
    return ProxyRequest(
        format=RESPONSES,
        model=model,
        messages=canonical,
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        system=instructions,
        temperature=_temperature(body),
        structured=structured,
        max_tokens_given=raw_max is not None,
        extra=_extra(body, "temperature", "instructions"),
        body=body,
    )


def _responses_input(raw: Any) -> list[dict[str, Any]]:
    """``input`` (a string, or items: messages, function calls, their outputs, reasoning) as
    canonical messages; an assistant's items in a row are one message, as are tool outputs."""
    if isinstance(raw, str):
        return [{"role": "user", "content": [{"type": "text", "text": raw}]}]
    if not isinstance(raw, list):
        raise BadRequest("input: must be a string or a list of items")
    canonical: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any], *, merge: bool) -> None:
        if merge and canonical and canonical[-1]["role"] == role:
            canonical[-1]["content"].append(block)
        else:
            canonical.append({"role": role, "content": [block]})

    for position, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{position}]: each item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role in ("system", "developer"):
                canonical.append({"role": "system", "content": [{"type": "text", "text": _responses_text(item)}]})
            elif role == "user":
                for part in _responses_parts(item.get("content")):
                    add("user", part, merge=True)
            elif role == "assistant":
                for part in _responses_parts(item.get("content")):
                    add("assistant", part, merge=True)
            else:
                raise BadRequest(f"input[{position}].role: unsupported role {role!r}")
        elif kind == "function_call":
            try:
                arguments = json.loads(item.get("arguments") or "{}")
            except ValueError:
                raise BadRequest(f"input[{position}].arguments: not valid JSON") from None
            call = {"type": "tool_use", "id": item.get("call_id"), "name": item.get("name"), "input": arguments}
            add("assistant", call, merge=True)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _openai_text(output)
            add("user", {"type": "tool_result", "tool_use_id": item.get("call_id"), "content": text}, merge=True)
        elif kind == "reasoning":
            if not item.get("encrypted_content"):
                continue  # reasoning shown for reading only (another provider's thinking): nothing to send back
            reasoning = {k: v for k, v in item.items() if k in ("type", "id", "summary", "encrypted_content")}
            add("assistant", reasoning, merge=True)
        else:
            raise BadRequest(f"input[{position}].type: unsupported item type {kind!r}")
    return canonical


def _responses_text(item: dict[str, Any]) -> str:
    return "".join(p["text"] for p in _responses_parts(item.get("content")) if p.get("type") == "text")


def _responses_parts(content: Any) -> list[dict[str, Any]]:
    """A message item's content: its text parts become text blocks, other parts (images, files) pass as sent."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest("input: a message's content must be a string or a list of parts")
    return [
        {"type": "text", "text": p.get("text", "")}
        if isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
        else p
        for p in content
    ]
