"""A Gemini ``generateContent`` request (its model and method in the URL) in the run's terms.

``contents`` become canonical messages: text, thought text and function calls as the engine's
blocks (a continuation sends them back through the Gemini adapter); every other part (inline
data, a function response, text carrying a thought signature...) is kept whole as a ``PART``
block, sent back exactly as the client sent it. ``generationConfig.maxOutputTokens`` is the
run's ``max_tokens`` (the adapter writes each call's own), a positive ``thinkingBudget`` its
``thinking_budget`` (the adapter writes each call's own into the client's ``thinkingConfig``);
every other field, the rest of ``generationConfig`` included, passes to the provider as sent.
The official client writes its top-level fields in camelCase and some nested ones in snake_case
(proto JSON takes both): the fields read here are read in either spelling.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..providers.gemini import PART, THINKING_BUDGET_NAMES, THINKING_CONFIG_NAMES, synthetic_call_id
from .inbound import GEMINI, BadRequest, ProxyRequest, _max_tokens, _object, _string, _temperature, load_body

# The top-level fields the Gemini adapter writes itself: a client's snake_case spelling is
# renamed, or the provider would get the field twice.
_ADAPTER_FIELDS = ("generationConfig", "systemInstruction")
_MAX_TOKENS = ("maxOutputTokens", "max_output_tokens")
# A function call read as a tool_use block; one with other fields is kept whole.
_CALL_FIELDS = frozenset({"id", "name", "args"})


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _get(mapping: Mapping[str, Any], name: str) -> Any:
    """``name`` (camelCase) or its snake_case spelling."""
    return mapping[name] if name in mapping else mapping.get(_snake(name))


def parse_gemini(raw: bytes, model: str, stream: bool, default_max_tokens: int) -> ProxyRequest:
    body = load_body(raw)
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise BadRequest("contents: Field required (a non-empty list)")
    extra = {k: v for k, v in body.items() if k != "contents"}
    for name in _ADAPTER_FIELDS:
        if _snake(name) in extra:
            extra[name] = extra.pop(_snake(name))
    config = extra.get("generationConfig")
    if config is not None:
        config = dict(_object(config, "generationConfig"))
        extra["generationConfig"] = config
    if stream and config and _get(config, "candidateCount") not in (None, 1):
        raise BadRequest("generationConfig.candidateCount: a stream is served with one candidate only")
    raw_max = next((config.pop(n) for n in _MAX_TOKENS if n in config), None) if config else None
    if config is not None and not config:
        del extra["generationConfig"]
    max_tokens = default_max_tokens if raw_max is None else _max_tokens(raw_max, "generationConfig.maxOutputTokens")
    return ProxyRequest(
        format=GEMINI,
        model=model,
        messages=_contents(contents),
        max_tokens=max_tokens,
        stream=stream,
        system=_system(extra.get("systemInstruction")),
        temperature=_temperature(config or {}),
        thinking_budget=_thinking_budget(config or {}),
        structured=_structured(config or {}, extra.get("toolConfig") or extra.get("tool_config")),
        max_tokens_given=raw_max is not None,
        logprobs=_get(config or {}, "responseLogprobs") is True,
        extra=extra,
        body=body,
    )


def _thinking_budget(config: Mapping[str, Any]) -> int | None:
    """The client's positive ``thinkingBudget``: the run's thinking budget, which a continuation
    lowers as a run's (the Gemini adapter writes it into the client's ``thinkingConfig``, which
    passes as sent otherwise). -1 (dynamic), 0 (off) and a ``thinkingLevel`` are not budgets
    to lower: they pass as sent."""
    thinking = next((config[n] for n in THINKING_CONFIG_NAMES if n in config), None)
    if not isinstance(thinking, Mapping):
        return None
    budget = next((thinking[n] for n in THINKING_BUDGET_NAMES if n in thinking), None)
    return budget if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0 else None


def _system(instruction: Any) -> str | None:
    """The system instruction's text (the run keeps it; the instruction itself passes as sent)."""
    if instruction is None:
        return None
    if isinstance(instruction, str):
        return instruction or None
    parts = _object(instruction, "systemInstruction").get("parts") or []
    if not isinstance(parts, list):
        raise BadRequest("systemInstruction.parts: expected a list")
    texts = [
        _string(part.get("text"), f"systemInstruction.parts[{i}].text")
        for i, part in enumerate(parts)
        if "text" in _object(part, f"systemInstruction.parts[{i}]")
    ]
    return "\n".join(texts) or None


def _structured(config: Mapping[str, Any], tool_config: Any) -> bool:
    """JSON output (a JSON MIME type or a schema), or a forced function call (mode ``ANY``)."""
    if _get(config, "responseMimeType") == "application/json":
        return True
    if _get(config, "responseSchema") is not None or _get(config, "responseJsonSchema") is not None:
        return True
    calling = _get(tool_config, "functionCallingConfig") if isinstance(tool_config, Mapping) else None
    return isinstance(calling, Mapping) and calling.get("mode") == "ANY"


def _contents(contents: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    calls: dict[tuple[str, str], int] = {}  # (name, arguments) -> ordinal: the adapter's synthetic ids
    for position, content in enumerate(contents):
        where = f"contents[{position}]"
        role = _object(content, where).get("role", "user")
        if role not in ("user", "model"):
            raise BadRequest(f"{where}.role: expected 'user' or 'model'")
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            raise BadRequest(f"{where}.parts: Field required (a non-empty list)")
        blocks = [
            (_model_block if role == "model" else _user_block)(_object(part, f"{where}.parts[{i}]"), calls)
            for i, part in enumerate(parts)
        ]
        messages.append({"role": "assistant" if role == "model" else "user", "content": blocks})
    return messages


def _user_block(part: dict[str, Any], calls: dict[tuple[str, str], int]) -> dict[str, Any]:
    if set(part) == {"text"} and isinstance(part["text"], str):
        return {"type": "text", "text": part["text"]}
    return {"type": PART, **part}


def _model_block(part: dict[str, Any], calls: dict[tuple[str, str], int]) -> dict[str, Any]:
    """Text, thought text and function calls as the engine's blocks; any other part kept whole."""
    keys = set(part)
    signature = _get(part, "thoughtSignature")
    signed = {"thoughtSignature"} if "thoughtSignature" in part else {"thought_signature"}
    if keys == {"text"} and isinstance(part["text"], str):
        return {"type": "text", "text": part["text"]}
    if part.get("thought") is True and keys <= {"text", "thought"} | signed and isinstance(signature, str | None):
        return {"type": "thinking", "thinking": _string(part.get("text", ""), "text"), "signature": signature or ""}
    call = _get(part, "functionCall")
    if isinstance(call, Mapping) and keys <= {"functionCall", "function_call"} | signed and set(call) <= _CALL_FIELDS:
        name = _string(call.get("name"), "functionCall.name")
        args = _object(call.get("args") or {}, "functionCall.args")
        call_id = call.get("id")
        if not call_id:
            arguments = json.dumps(args, ensure_ascii=False)
            ordinal = calls.get((name, arguments), 0)
            calls[(name, arguments)] = ordinal + 1
            call_id = synthetic_call_id(name, arguments, ordinal)
        block: dict[str, Any] = {"type": "tool_use", "id": _string(call_id, "functionCall.id"), "name": name}
        block["input"] = args
        if isinstance(signature, str) and signature:
            block["signature"] = signature
        return block
    return {"type": PART, **part}
