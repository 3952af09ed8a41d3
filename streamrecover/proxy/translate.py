"""A client's pass-through fields in another wire format, for a failover to a provider that speaks it.

The client's fields (``ProxyRequest.extra``) are written for the provider of its own format. A
fallback of another format (Anthropic Messages, OpenAI Chat, OpenAI Responses) gets the fields
that have a counterpart there, translated: function tool definitions, ``tool_choice`` (and
parallel tool calls), stop sequences, ``top_p``, structured output between the two OpenAI
formats, reasoning effort and token logprobs between them, the end user's id. What has none is
dropped and named (``dropped``); a request whose answer would change in kind without it
(structured output to Anthropic) does not fail over at all (``refused``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

from ..conf import proxy_wire_format
from ..providers.openai_responses import LOGPROBS_INCLUDE
from .inbound import ANTHROPIC, OPENAI, RESPONSES, Format

# fields both OpenAI formats take as they are
_OPENAI_SHARED = frozenset(
    {"parallel_tool_calls", "metadata", "service_tier", "store", "user", "prompt_cache_key", "safety_identifier"}
)
# fields every format takes as they are
_SHARED = frozenset({"top_p"})
# fields carried otherwise: an Anthropic system prompt's blocks (their text is the run's system prompt)
_CARRIED = frozenset({"system"})
# fields translated below (never copied as they are across formats)
_TRANSLATED = frozenset(
    {"tools", "tool_choice", "stop", "stop_sequences", "response_format", "text", "reasoning", "reasoning_effort"}
    | {"user", "metadata", "parallel_tool_calls"}
    | {"logprobs", "top_logprobs", "include"}
)

# what cannot fail over to each format: the client's field -> why
REFUSED_TO: Final[Mapping[Format, Mapping[str, str]]] = {
    ANTHROPIC: {
        "response_format": "structured output (response_format) has no counterpart in Anthropic Messages",
        "text": "structured output (text.format) has no counterpart in Anthropic Messages",
    },
}


def wire_format(provider: Mapping[str, Any], model: str) -> Format | None:
    """The wire format a ``PROVIDERS`` entry speaks for ``model``, or None for one whose fields this
    module cannot write (Gemini, a custom adapter)."""
    return cast(Format | None, proxy_wire_format(provider, model))


@dataclass(slots=True)
class Translated:
    extra: dict[str, Any] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)  # the client's fields (or tools) left out
    refused: str | None = None  # why this request cannot fail over at all
    fmt: Format = ANTHROPIC  # the format ``extra`` is written in


@dataclass(slots=True)
class _Function:
    name: str
    description: str | None
    schema: Any
    strict: bool | None


def translate(extra: Mapping[str, Any], source: Format, target: Format) -> Translated:
    """``extra`` (the client's fields, in ``source``'s format) for a provider of ``target``'s."""
    if source == target:
        return Translated(dict(extra), fmt=target)
    out = Translated(fmt=target)
    for name, value in extra.items():
        if name in _SHARED or (name in _OPENAI_SHARED and ANTHROPIC not in (source, target)):
            out.extra[name] = value
        elif name not in _TRANSLATED and name not in _CARRIED:
            out.dropped.append(name)
    reason = _refusal(extra, target)
    if reason:
        out.refused = reason
        return out
    _tools(extra, source, target, out)
    _tool_choice(extra, source, target, out)
    _stop(extra, source, target, out)
    _structured(extra, source, target, out)
    _reasoning(extra, source, target, out)
    _logprobs(extra, source, target, out)
    _user(extra, source, target, out)
    return out


def _refusal(extra: Mapping[str, Any], target: Format) -> str | None:
    for name, why in REFUSED_TO.get(target, {}).items():
        value = extra.get(name)
        if name == "text":
            value = value.get("format") if isinstance(value, Mapping) else None
        if isinstance(value, Mapping) and value.get("type") not in (None, "text"):
            return why
    return None


# ---- tools ---------------------------------------------------------------------------------


def _functions(tools: Any, source: Format, out: Translated) -> list[_Function]:
    found: list[_Function] = []
    for position, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool, Mapping):
            continue
        if source == ANTHROPIC and tool.get("type") in (None, "custom") and "input_schema" in tool:
            found.append(_Function(tool["name"], tool.get("description"), tool["input_schema"], tool.get("strict")))
        elif source == OPENAI and tool.get("type") == "function" and isinstance(tool.get("function"), Mapping):
            f = tool["function"]
            found.append(_Function(f.get("name", ""), f.get("description"), f.get("parameters"), f.get("strict")))
        elif source == RESPONSES and tool.get("type") == "function":
            found.append(
                _Function(tool.get("name", ""), tool.get("description"), tool.get("parameters"), tool.get("strict"))
            )
        else:  # server tools (web search, code execution...) are each provider's own
            out.dropped.append(f"tools[{position}] ({tool.get('type') or tool.get('name')})")
    return found


def _tools(extra: Mapping[str, Any], source: Format, target: Format, out: Translated) -> None:
    if "tools" not in extra:
        return
    written: list[dict[str, Any]] = []
    for f in _functions(extra["tools"], source, out):
        schema = f.schema if isinstance(f.schema, Mapping) else {"type": "object", "properties": {}}
        if target == ANTHROPIC:
            tool: dict[str, Any] = {"name": f.name, "input_schema": schema}
            if f.description:
                tool["description"] = f.description
        elif target == OPENAI:
            function: dict[str, Any] = {"name": f.name, "parameters": schema}
            if f.description:
                function["description"] = f.description
            if f.strict is not None:
                function["strict"] = f.strict
            tool = {"type": "function", "function": function}
        else:
            tool = {"type": "function", "name": f.name, "parameters": schema}
            if f.description:
                tool["description"] = f.description
            if f.strict is not None:
                tool["strict"] = f.strict
        written.append(tool)
    if written:
        out.extra["tools"] = written


def _tool_choice(extra: Mapping[str, Any], source: Format, target: Format, out: Translated) -> None:
    """``tool_choice`` read as (mode, function name) and written again; Anthropic's
    ``disable_parallel_tool_use`` and OpenAI's ``parallel_tool_calls`` are one setting."""
    choice = extra.get("tool_choice")
    mode: str | None = None
    name: str | None = None
    parallel: bool | None = extra.get("parallel_tool_calls") if source != ANTHROPIC else None
    if source == ANTHROPIC and isinstance(choice, Mapping):
        mode = {"auto": "auto", "any": "required", "none": "none", "tool": "function"}.get(str(choice.get("type")))
        name = choice.get("name")
        if choice.get("disable_parallel_tool_use") is not None:
            parallel = not choice["disable_parallel_tool_use"]
    elif isinstance(choice, str):
        mode = choice if choice in ("auto", "none", "required") else None
    elif isinstance(choice, Mapping) and choice.get("type") == "function":
        mode = "function"
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
    if choice is not None and mode is None:
        out.dropped.append("tool_choice")
    if target == ANTHROPIC:
        if mode is not None:
            written: dict[str, Any] = {
                "type": {"auto": "auto", "required": "any", "none": "none", "function": "tool"}[mode]
            }
            if mode == "function":
                written["name"] = name
            if parallel is False and mode != "none":
                written["disable_parallel_tool_use"] = True
            out.extra["tool_choice"] = written
        elif parallel is False and "tools" in out.extra:
            out.extra["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
        return
    if mode == "function":
        out.extra["tool_choice"] = (
            {"type": "function", "function": {"name": name}} if target == OPENAI else {"type": "function", "name": name}
        )
    elif mode is not None:
        out.extra["tool_choice"] = mode
    if parallel is not None and "tools" in out.extra:
        out.extra["parallel_tool_calls"] = parallel


def _stop(extra: Mapping[str, Any], source: Format, target: Format, out: Translated) -> None:
    stops = extra.get("stop_sequences" if source == ANTHROPIC else "stop")
    if stops is None:
        return
    listed = [stops] if isinstance(stops, str) else list(stops)
    if target == ANTHROPIC:
        out.extra["stop_sequences"] = listed
    elif target == OPENAI:
        out.extra["stop"] = listed
    else:  # Responses takes no stop sequences
        out.dropped.append("stop_sequences" if source == ANTHROPIC else "stop")


def _structured(extra: Mapping[str, Any], source: Format, target: Format, out: Translated) -> None:
    """Structured output between the two OpenAI formats (to Anthropic it is refused)."""
    if source == OPENAI and target == RESPONSES and isinstance(extra.get("response_format"), Mapping):
        fmt = dict(extra["response_format"])
        schema = fmt.pop("json_schema", None)
        out.extra["text"] = {"format": {**fmt, **(schema if isinstance(schema, Mapping) else {})}}
    elif source == RESPONSES and target == OPENAI and isinstance(extra.get("text"), Mapping):
        fmt = extra["text"].get("format")
        if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
            schema = {k: v for k, v in fmt.items() if k != "type"}
            out.extra["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif isinstance(fmt, Mapping) and fmt.get("type") == "json_object":
            out.extra["response_format"] = {"type": "json_object"}
        if set(extra["text"]) - {"format"}:
            out.dropped.append("text.verbosity")


def _reasoning(extra: Mapping[str, Any], source: Format, target: Format, out: Translated) -> None:
    """Reasoning effort between the OpenAI formats; Anthropic's thinking is the run's own setting."""
    effort = extra.get("reasoning_effort") if source == OPENAI else None
    if source == RESPONSES and isinstance(extra.get("reasoning"), Mapping):
        effort = extra["reasoning"].get("effort")
    if effort is None:
        if "reasoning" in extra or "reasoning_effort" in extra:
            out.dropped.append("reasoning" if "reasoning" in extra else "reasoning_effort")
        return
    if target == OPENAI:
        out.extra["reasoning_effort"] = effort
    elif target == RESPONSES:
        out.extra["reasoning"] = {"effort": effort}
    else:
        out.dropped.append("reasoning" if source == RESPONSES else "reasoning_effort")


def _logprobs(extra: Mapping[str, Any], source: Format, target: Format, out: Translated) -> None:
    """Token logprobs between the OpenAI formats: Chat's ``logprobs: true`` is Responses'
    ``include: ["message.output_text.logprobs"]``, ``top_logprobs`` the same in both. What else
    a Responses ``include`` names has no counterpart (a Chat provider sends no reasoning)."""
    include = extra.get("include")
    included = list(include) if isinstance(include, list) else []
    asked = extra.get("logprobs") is True if source == OPENAI else LOGPROBS_INCLUDE in included
    carried = asked and target != ANTHROPIC
    out.dropped.extend(name for name in ("logprobs", "top_logprobs") if name in extra and not carried)
    out.dropped.extend(f"include ({name})" for name in included if name != LOGPROBS_INCLUDE or not carried)
    if not carried:
        return
    if target == RESPONSES:
        out.extra["include"] = [LOGPROBS_INCLUDE]
    else:
        out.extra["logprobs"] = True
    if "top_logprobs" in extra:
        out.extra["top_logprobs"] = extra["top_logprobs"]


def _user(extra: Mapping[str, Any], source: Format, target: Format, out: Translated) -> None:
    """The end user's id: Anthropic's ``metadata.user_id``, OpenAI's ``user``."""
    if source == ANTHROPIC:
        metadata = extra.get("metadata")
        user = metadata.get("user_id") if isinstance(metadata, Mapping) else None
        if user is not None:
            out.extra["user"] = user
        return
    if target == ANTHROPIC:
        if extra.get("user") is not None:
            out.extra["metadata"] = {"user_id": extra["user"]}
        if extra.get("metadata"):
            out.dropped.append("metadata")
        if extra.get("parallel_tool_calls") is not None and "tools" not in out.extra:
            out.dropped.append("parallel_tool_calls")
