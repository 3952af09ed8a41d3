"""A client's request in a provider's own format (Anthropic Messages, OpenAI Chat or Responses) in the run's terms
(Gemini's: ``inbound_gemini``).

The conversation becomes canonical messages (the engine's block shape); the fields the engine
works with (model, ``max_tokens``, system, temperature, extended thinking) are read out, and
every other field the client sent passes to the provider as it was sent (``extra``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..providers.common import LONE_SURROGATE

Format = Literal["anthropic", "openai", "responses", "gemini"]
ANTHROPIC: Final = "anthropic"
OPENAI: Final = "openai"
RESPONSES: Final = "responses"
GEMINI: Final = "gemini"
FORMATS: Final = (ANTHROPIC, OPENAI, RESPONSES, GEMINI)

# Fields the proxy itself decides: never passed on as the client sent them.
_OWN_FIELDS = frozenset(
    {"model", "messages", "input", "max_tokens", "max_completion_tokens", "max_output_tokens"}
    | {"stream", "stream_options"}
)
# Responses fields that name state kept at the provider: the run's conversation is the request's own
_STATEFUL = ("previous_response_id", "conversation", "background", "prompt")
# No conversation or tool schema nests this deep; a body that does would only meet the
# interpreter's recursion limit further on (redaction, storage), as a 500.
MAX_DEPTH: Final = 100
# The string fields the adapters read from each kind of canonical block; other kinds (images,
# documents, server tools...) pass to the provider as sent.
_BLOCK_STRINGS: Final = {
    "text": ("text",),
    "tool_use": ("id", "name"),
    "tool_result": ("tool_use_id",),
    "thinking": ("thinking", "signature"),
    "redacted_thinking": ("data",),
}


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
    # OpenAI Chat (``logprobs``), Gemini (``responseLogprobs``): the client asked for its tokens'
    # logprobs (passed on in ``extra``)
    logprobs: bool = False
    max_tokens_given: bool = True  # False: an OpenAI request without one (the default applies)
    max_tokens_field: str | None = None  # OpenAI Chat: the name the client gave it under, the provider's too
    extra: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)  # as sent (a non-streamed request passes it on)
    betas: list[str] = field(default_factory=list)  # Anthropic: the client's ``anthropic-beta`` flags

    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                texts = [b.get("text", "") for b in message.get("content", []) if b.get("type") == "text"]
                return " ".join(t for t in texts if t)
        return ""


def load_body(raw: bytes) -> dict[str, Any]:
    """The request body: a JSON object whose values can be sent on and stored (``_check_values``)."""
    try:
        body = json.loads(raw or b"null", parse_constant=_no_constant)
    except (ValueError, RecursionError):  # RecursionError: nested too deep for the decoder
        raise BadRequest("There was an error parsing the body of your request: invalid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    _check_values(body)
    return body


def parse(format: Format, raw: bytes, default_max_tokens: int) -> ProxyRequest:
    body = load_body(raw)
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


def _no_constant(name: str) -> Any:
    """NaN and Infinity: Python's decoder takes them, JSON has no such value (nor has jsonb, nor
    the request sent on)."""
    raise ValueError(name)


# (the parent's trail, this value's key or index); the root's parent is None
Trail = tuple[Any, str | int]


def walk_json(value: Any, where: str = "") -> Iterator[tuple[Any, Trail, int]]:
    """Every value in ``value`` (itself included) with its trail and depth: iterative, so a deep
    body cannot exhaust the stack; a path is spelled out (``json_path``) only for an error."""
    stack: list[tuple[Any, Trail, int]] = [(value, (None, where), 0)]
    while stack:
        item = stack.pop()
        yield item
        value, trail, depth = item
        if isinstance(value, dict):
            stack.extend((child, (trail, key), depth + 1) for key, child in value.items())
        elif isinstance(value, list):
            stack.extend((child, (trail, index), depth + 1) for index, child in enumerate(value))


def json_path(trail: Trail | None) -> str:
    """``messages[0].content[1].text`` from a trail."""
    keys: list[str | int] = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    path = ""
    for key in reversed(keys):
        path += f"[{key}]" if isinstance(key, int) else f".{key}" if path else key
    return path


def _check_values(value: Any, where: str = "") -> None:
    """Refuse what parsed yet could be neither sent on nor stored: nesting deeper than
    ``MAX_DEPTH``, a lone surrogate escape (``"\\ud83d"`` without its pair: it has no UTF-8
    form) in any string or key."""
    for item, trail, depth in walk_json(value, where):
        if depth > MAX_DEPTH:
            raise BadRequest(f"{json_path(trail)}: nested deeper than {MAX_DEPTH} levels")
        key = trail[1]
        if depth and isinstance(key, str) and LONE_SURROGATE.search(key):
            raise BadRequest(f"{json_path(trail[0]) or 'body'}: a key is not valid Unicode (a lone surrogate escape)")
        if isinstance(item, str) and LONE_SURROGATE.search(item):
            raise BadRequest(f"{json_path(trail)}: not valid Unicode (a lone surrogate escape)")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{where}: expected an object")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where}: expected a string")
    return value


def _json_object(arguments: Any, where: str) -> dict[str, Any]:
    """A tool call's arguments: a string of JSON (as OpenAI sends them) holding an object."""
    if arguments is not None and not isinstance(arguments, str):
        raise BadRequest(f"{where}: expected a string (the arguments as JSON)")
    try:
        parsed = json.loads(arguments or "{}", parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise BadRequest(f"{where}: not valid JSON") from None
    if not isinstance(parsed, dict):
        raise BadRequest(f"{where}: expected a JSON object")
    _check_values(parsed, where)
    return parsed


def _blocks(content: Any, where: str) -> list[Any]:
    """Anthropic content (a message's, a tool result's): a string, or blocks whose fields the
    adapters read have their types."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}: expected a string or a list of blocks")
    for position, block in enumerate(content):
        _block(block, f"{where}[{position}]")
    return content


def _block(block: Any, where: str) -> None:
    kind = _string(_object(block, where).get("type"), f"{where}.type")
    for name in _BLOCK_STRINGS.get(kind, ()):
        _string(block.get(name), f"{where}.{name}")
    if kind == "tool_use" and block.get("input") is not None:
        _object(block["input"], f"{where}.input")
    if kind == "tool_result" and block.get("content") is not None:
        _blocks(block["content"], f"{where}.content")


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


def _stream(body: dict[str, Any]) -> bool:
    """Whether the client asked for a stream: a boolean, as the providers take it (``"false"``
    read as true would stream to a client that asked for one JSON answer)."""
    value = body.get("stream")
    if value is not None and not isinstance(value, bool):
        raise BadRequest("stream: must be a boolean")
    return bool(value)


def _extra(body: dict[str, Any], *taken: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in _OWN_FIELDS and k not in taken}


# ---- Anthropic Messages ----------------------------------------------------------------


def _anthropic(body: dict[str, Any], model: str, messages: list[Any]) -> ProxyRequest:
    if "max_tokens" not in body:
        raise BadRequest("max_tokens: Field required")
    canonical = []
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        if _object(message, where).get("role") not in ("user", "assistant"):
            raise BadRequest(f"{where}.role: expected 'user' or 'assistant'")
        canonical.append({"role": message["role"], "content": _blocks(message.get("content"), f"{where}.content")})
    taken = ["temperature"]
    system = body.get("system")
    if isinstance(system, str):
        taken.append("system")
    elif isinstance(system, list):
        # blocks (cache_control...) pass to an Anthropic provider as sent; their text is the
        # run's system prompt (what a fallback of another format is given)
        system = "\n\n".join(_system_text(block, f"system[{i}]") for i, block in enumerate(system))
    elif system is not None:
        raise BadRequest("system: expected a string or a list of text blocks")
    thinking = body.get("thinking")
    budget = None
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        # the run's thinking budget (a continuation lowers it); the object itself stays in
        # ``extra``, so its other fields (``display``...) reach the provider as sent
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise BadRequest("thinking.budget_tokens: must be an integer")
    choice = body.get("tool_choice")
    structured = isinstance(choice, dict) and choice.get("type") in ("any", "tool")
    return ProxyRequest(
        format=ANTHROPIC,
        model=model,
        messages=canonical,
        max_tokens=_max_tokens(body.get("max_tokens"), "max_tokens"),
        stream=_stream(body),
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


def _system_text(block: Any, where: str) -> str:
    if _object(block, where).get("type") != "text":
        raise BadRequest(f"{where}.type: expected 'text'")
    return _string(block.get("text"), f"{where}.text")


# ---- OpenAI Chat Completions -----------------------------------------------------------


def _openai(body: dict[str, Any], model: str, messages: list[Any], default_max_tokens: int) -> ProxyRequest:
    if body.get("n") not in (None, 1):
        raise BadRequest("n: only one choice is supported")
    # the name the client used is the one sent on (gpt-5 and the o-series take only the newer)
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    raw_max = body.get(field)
    max_tokens = default_max_tokens if raw_max is None else _max_tokens(raw_max, field)
    system: str | None = None
    canonical: list[dict[str, Any]] = []
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        role = _object(message, where).get("role")
        if role in ("system", "developer"):
            text = _openai_text(message.get("content"), f"{where}.content")
            if position == 0 and role == "system":
                system = text
            else:
                canonical.append({"role": "system", "content": [{"type": "text", "text": text}]})
        elif role == "user":
            canonical.append({"role": "user", "content": _openai_user(message.get("content"), f"{where}.content")})
        elif role == "assistant":
            canonical.append({"role": "assistant", "content": _openai_assistant(message, where)})
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": _string(message.get("tool_call_id"), f"{where}.tool_call_id"),
                "content": _openai_text(message.get("content"), f"{where}.content"),
            }
            previous = canonical[-1]["content"] if canonical and canonical[-1]["role"] == "user" else []
            if previous and previous[-1]["type"] == "tool_result":
                previous.append(result)
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
        stream=_stream(body),
        system=system,
        temperature=_temperature(body),
        structured=structured,
        include_usage=include_usage,
        logprobs=body.get("logprobs") is True,
        max_tokens_given=raw_max is not None,
        max_tokens_field=field if raw_max is not None else None,
        extra=_extra(body, "temperature", "n"),
        body=body,
    )


def _openai_text(content: Any, where: str) -> str:
    """A message's text: its string, or its text parts' joined (other parts are left out)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}: expected a string or a list of parts")
    return "".join(p["text"] for p in _parts(content, where, ("text",)) if p["type"] == "text")


def _parts(content: list[Any], where: str, text_types: tuple[str, ...]) -> list[dict[str, Any]]:
    """Content parts, each an object with a type; a text part's (``text_types``) text a string."""
    for position, part in enumerate(content):
        at = f"{where}[{position}]"
        if _string(_object(part, at).get("type"), f"{at}.type") in text_types:
            _string(part.get("text"), f"{at}.text")
    return content


def _openai_user(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}: expected a string or a list of parts")
    # text parts become text blocks; other parts (images...) pass to the provider as sent
    return [
        {"type": "text", "text": p["text"]} if p["type"] == "text" else p for p in _parts(content, where, ("text",))
    ]


def _openai_assistant_text(message: dict[str, Any], where: str) -> str:
    """The assistant's text: its content's, then its refusal's (the ``refusal`` field, or a
    ``refusal`` part), which the API's message holds apart; the endpoint stores a refusal as text,
    so one sent back goes on as the text it was, never as an empty message."""
    content = message.get("content")
    if not isinstance(content, list):
        text = _openai_text(content, f"{where}.content")
    else:
        pieces: list[str] = []
        for position, part in enumerate(content):
            at = f"{where}.content[{position}]"
            kind = _string(_object(part, at).get("type"), f"{at}.type")
            if kind in ("text", "refusal"):  # the part's string is under its type's name
                pieces.append(_string(part.get(kind), f"{at}.{kind}"))
        text = "".join(pieces)
    refusal = message.get("refusal")
    return text if refusal is None else text + _string(refusal, f"{where}.refusal")


def _openai_assistant(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    text = _openai_assistant_text(message, where)
    if text:
        blocks.append({"type": "text", "text": text})
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise BadRequest(f"{where}.tool_calls: expected a list")
    for position, call in enumerate(calls):
        at = f"{where}.tool_calls[{position}]"
        function = _object(_object(call, at).get("function"), f"{at}.function")
        blocks.append(
            {
                "type": "tool_use",
                "id": _string(call.get("id"), f"{at}.id"),
                "name": _string(function.get("name"), f"{at}.function.name"),
                "input": _json_object(function.get("arguments"), f"{at}.function.arguments"),
            }
        )
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
        stream=_stream(body),
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
        where = f"input[{position}]"
        kind = _object(item, where).get("type", "message")
        if kind == "message":
            role = item.get("role")
            parts = _responses_parts(item.get("content"), f"{where}.content")
            if role in ("system", "developer"):
                text = "".join(p["text"] for p in parts if p["type"] == "text")
                canonical.append({"role": "system", "content": [{"type": "text", "text": text}]})
            elif role in ("user", "assistant"):
                for part in parts:
                    add(role, part, merge=True)
            else:
                raise BadRequest(f"{where}.role: unsupported role {role!r}")
        elif kind == "function_call":
            call = {
                "type": "tool_use",
                "id": _string(item.get("call_id"), f"{where}.call_id"),
                "name": _string(item.get("name"), f"{where}.name"),
                "input": _json_object(item.get("arguments"), f"{where}.arguments"),
            }
            add("assistant", call, merge=True)
        elif kind == "function_call_output":
            call_id = _string(item.get("call_id"), f"{where}.call_id")
            text = _openai_text(item.get("output"), f"{where}.output")
            add("user", {"type": "tool_result", "tool_use_id": call_id, "content": text}, merge=True)
        elif kind == "reasoning":
            if not item.get("encrypted_content"):
                continue  # reasoning shown for reading only (another provider's thinking): nothing to send back
            reasoning = {k: v for k, v in item.items() if k in ("type", "id", "summary", "encrypted_content")}
            add("assistant", reasoning, merge=True)
        else:
            raise BadRequest(f"input[{position}].type: unsupported item type {kind!r}")
    return canonical


_RESPONSES_TEXT = ("input_text", "output_text", "text")


def _responses_parts(content: Any, where: str) -> list[dict[str, Any]]:
    """A message item's content: its text parts become text blocks, and so does a refusal part (as
    the API returns one; the endpoint stores a refusal as text, so one sent back goes on as the
    text it was, never dropped); other parts (images, files) pass as sent."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}: expected a string or a list of parts")
    blocks: list[dict[str, Any]] = []
    for position, part in enumerate(_parts(content, where, _RESPONSES_TEXT)):
        if part["type"] in _RESPONSES_TEXT:
            blocks.append({"type": "text", "text": part["text"]})
        elif part["type"] == "refusal":
            blocks.append({"type": "text", "text": _string(part.get("refusal"), f"{where}[{position}].refusal")})
        else:
            blocks.append(part)
    return blocks
