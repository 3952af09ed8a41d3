"""Reads a Gemini ``generateContent`` / ``streamGenerateContent`` request the way the real API does.

The model and whether the answer streams come from the URL (``models/{model}:streamGenerateContent?alt=sse``),
the rest from the body: ``contents`` of ``user``/``model`` turns, ``systemInstruction``, ``tools``
(``functionDeclarations``), ``generationConfig`` (``maxOutputTokens``, ``thinkingConfig``: a thinking model
thinks, hidden, when ``includeThoughts`` is not asked for, at most its ``thinkingBudget``; a budget the
model does not take is refused). Gemini has no
prefill: a trailing ``model`` turn is a finished one and a new answer starts. A continuation is the partial
answer as a ``model`` turn followed by the continue message. Thought signatures sent back must be ones the
fake issued, unmodified; Gemini 3 models refuse a function call of the current turn sent back without its
signature, as the real API does. Function responses must answer the calls of the turn before them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .interpret import Interpretation, Mode, RequestRejected, merge_turns, name_tool_results, peel_continuation
from .model import Conversation, ToolCall, ToolOffer, ToolResult, Turn
from .read_openai import content_text
from .wire_gemini import budget_problem, signature_ok, signs_every_call, thinking_cap, thinking_off, thinks_unasked

_SIGNATURE_DOCS = "https://ai.google.dev/gemini-api/docs/thought-signatures"


def _rejected(message: str, status: int = 400) -> RequestRejected:
    return RequestRejected(message, status=status, error_type="INVALID_ARGUMENT")


# Free-form values (function arguments and responses, JSON schemas): their keys are data.
_OPAQUE = frozenset({"args", "response", "parameters", "parametersJsonSchema", "responseSchema", "responseJsonSchema"})


def _camel(value: Any) -> Any:
    """Proto JSON takes ``snake_case`` field names as well as ``lowerCamelCase`` (the official
    client sends some of each): the body with every field name in the camel form."""
    if isinstance(value, list):
        return [_camel(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        head, *rest = key.split("_")
        name = head + "".join(word[:1].upper() + word[1:] for word in rest)
        out[name] = item if name in _OPAQUE else _camel(item)
    return out


def interpret(body: Any, *, model: str, stream: bool) -> Interpretation:
    """The request's meaning, or ``RequestRejected`` with the real API's message."""
    if not isinstance(body, dict):
        raise _rejected("Invalid JSON payload received. Expected an object.")
    body = _camel(body)
    contents = body.get("contents")
    if not contents:
        raise _rejected("* GenerateContentRequest.contents: contents is not specified\n")
    if not isinstance(contents, list):
        raise _rejected('Invalid JSON payload received. Unknown name "contents": Proto field is not repeating.')
    config = body.get("generationConfig") or {}
    if not isinstance(config, Mapping):
        raise _rejected('Invalid JSON payload received. Unknown name "generationConfig": expected an object.')
    thinking_config = config.get("thinkingConfig") or {}
    if not isinstance(thinking_config, Mapping):
        thinking_config = {}
    problem = budget_problem(model, thinking_config)
    if problem is not None:
        raise _rejected(problem)
    thinking = thinking_config.get("includeThoughts") is True and not thinking_off(model, thinking_config)
    hidden_thinking = not thinking and thinks_unasked(model, thinking_config)
    turns = tuple(_turn(i, c) for i, c in enumerate(contents))
    _check_function_turns(contents)
    _check_signatures(contents, model)
    base, mode, prefix_text, prefix_calls, instructions = peel_continuation(
        merge_turns(name_tool_results(turns)), Mode.NEW_TURN_AFTER_ASSISTANT
    )
    return Interpretation(
        model=model,
        stream=stream,
        mode=mode,
        conversation=Conversation(
            base,
            _tools(body.get("tools")),
            thinking,
            _system(body.get("systemInstruction")),
            hidden_thinking=hidden_thinking,
            thinking_budget=thinking_cap(thinking_config),
        ),
        prefix_text=prefix_text,
        prefix_calls=prefix_calls,
        instructions=instructions,
        max_tokens=_max_tokens(config),
    )


def _system(instruction: Any) -> str:
    """The text of ``systemInstruction``'s parts."""
    return content_text(instruction.get("parts")) if isinstance(instruction, Mapping) else ""


def _max_tokens(config: Mapping[str, Any]) -> int | None:
    value = config.get("maxOutputTokens")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _rejected(
            f"* GenerateContentRequest.generation_config.max_output_tokens: must be positive, got {value}\n"
        )
    return value


def _tools(tools: Any) -> tuple[ToolOffer, ...]:
    if not isinstance(tools, list):
        return ()
    offers = []
    for i, tool in enumerate(tools):
        declarations = tool.get("functionDeclarations") if isinstance(tool, Mapping) else None
        for j, declaration in enumerate(declarations or ()):
            name = declaration.get("name") if isinstance(declaration, Mapping) else None
            if not isinstance(name, str) or not name:
                raise _rejected(
                    f"* GenerateContentRequest.tools[{i}].function_declarations[{j}].name: Name cannot be empty.\n"
                )
            schema = declaration.get("parametersJsonSchema") or declaration.get("parameters") or {}
            offers.append(ToolOffer(name, schema if isinstance(schema, Mapping) else {}))
    return tuple(offers)


def _parts(index: int, content: Any) -> list[Mapping[str, Any]]:
    if not isinstance(content, Mapping):
        raise _rejected(f"Invalid JSON payload received. contents[{index}]: expected an object.")
    role = content.get("role", "user")
    if role not in ("user", "model"):
        raise _rejected(f"Please use a valid role: user, model. (contents[{index}].role was {role!r})")
    parts = content.get("parts")
    if not parts or not isinstance(parts, list) or not all(isinstance(p, Mapping) for p in parts):
        raise _rejected(f"* GenerateContentRequest.contents[{index}].parts: contents.parts must not be empty.\n")
    return list(parts)


def _turn(index: int, content: Any) -> Turn:
    parts = _parts(index, content)
    role = content.get("role", "user")
    texts = [p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought")]
    if role == "model":
        calls = tuple(_call(p["functionCall"]) for p in parts if isinstance(p.get("functionCall"), Mapping))
        return Turn("assistant", "".join(texts), calls)
    results = tuple(_result(p["functionResponse"]) for p in parts if isinstance(p.get("functionResponse"), Mapping))
    return Turn("user", "\n".join(texts), tool_results=results)


def _call(call: Mapping[str, Any]) -> ToolCall:
    name = str(call.get("name", ""))
    return ToolCall(str(call.get("id") or name), name, json.dumps(call.get("args") or {}, ensure_ascii=False))


def _result(response: Mapping[str, Any]) -> ToolResult:
    name = str(response.get("name", ""))
    payload = response.get("response")
    if isinstance(payload, Mapping) and len(payload) == 1 and isinstance(next(iter(payload.values())), str):
        content = next(iter(payload.values()))
    else:
        content = json.dumps(payload, ensure_ascii=False)
    return ToolResult(str(response.get("id") or name), name, content)


def _check_function_turns(contents: list[Any]) -> None:
    """A model turn with function calls is followed by a user turn answering each of them."""
    for i, content in enumerate(contents):
        parts = content.get("parts") or []
        responses = sum(1 for p in parts if "functionResponse" in p)
        if not responses:
            continue
        previous = contents[i - 1] if i else None
        calls = sum(1 for p in (previous or {}).get("parts") or [] if "functionCall" in p)
        if previous is None or previous.get("role") != "model" or not calls:
            raise _rejected("Please ensure that function response turn comes immediately after a function call turn.")
        if calls != responses:
            raise _rejected(
                "Please ensure that the number of function response parts is equal to the number of function call "
                "parts of the function call turn."
            )


def _check_signatures(contents: list[Any], model: str) -> None:
    """Signatures come back unmodified; a Gemini 3 model's calls of the current turn (after
    the last user text) come back with theirs."""
    last_user_text = max(
        (i for i, c in enumerate(contents) if c.get("role", "user") == "user" and any("text" in p for p in c["parts"])),
        default=-1,
    )
    for i, content in enumerate(contents):
        if content.get("role") != "model":
            continue
        for position, part in enumerate(content["parts"]):
            signature = part.get("thoughtSignature")
            if signature is not None and not signature_ok(signature):
                raise _rejected(f"Thought signature is not valid. See {_SIGNATURE_DOCS}")
            call = part.get("functionCall")
            if (
                call is not None
                and signature is None
                and signs_every_call(model)
                and i > last_user_text
                and position == next(j for j, p in enumerate(content["parts"]) if "functionCall" in p)
            ):
                raise _rejected(
                    "Function call is missing a thought_signature in functionCall parts. This is required for tools "
                    f"to work correctly. Additional data, function call `default_api:{call.get('name')}` , position "
                    f"{position + 1}. Please refer to {_SIGNATURE_DOCS} for more details."
                )
