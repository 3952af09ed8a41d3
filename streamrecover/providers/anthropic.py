"""Anthropic Messages API adapter (``POST /v1/messages`` with ``"stream": true``).

The parser sits on the hot path of every token,
so it parses each event's JSON once, dispatches on its ``type`` through a dict, and creates
no objects beyond the events it returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from fnmatch import fnmatchcase
from typing import Any, TypedDict, cast

from ..engine.contract import HTTPRequest, ModelRequest, ProviderConfig, Strategy, ThinkingRule
from ..engine.errors import ErrorClass, ParseError, ProviderError
from ..engine.events import (
    AnswerMetadata,
    BlockStart,
    BlockStop,
    CitationDelta,
    FieldDelta,
    MessageStart,
    ProviderErrorEvent,
    SignatureDelta,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolArgsDelta,
    Usage,
    UsageUpdate,
)
from ..engine.retry import header_value, parse_retry_after
from ..engine.sse import SSEEvent
from .common import (
    SplitPairs,
    as_int,
    excerpt,
    optional_strings,
    read_error_body,
    status_policy,
    strategy_override,
    with_should_retry,
)
from .openai_responses import ANNOTATION_TYPES, WEB_SEARCH_CALL

__all__ = [
    "NO_PREFILL_MODELS",
    "STOP_REASONS",
    "AnthropicAdapter",
    "AnthropicStop",
    "AnthropicStreamParser",
]

# Models that answer a trailing assistant message (a prefill) with a 400, so a
# continuation must be a user "continue" message instead (prefill was removed from
# Claude 4.6 on, and from Claude Mythos Preview). Globs match the bare model name and
# vendor-prefixed ids (Bedrock ``anthropic.claude-…``, Vertex ``claude-…@date``), hence the
# leading ``*``. "noprefill" lets test and fake models opt out by name. The runner still
# falls back when a model not listed here refuses a prefill (ErrorClass.PREFILL_REFUSED).
NO_PREFILL_MODELS: tuple[str, ...] = (
    "*claude-opus-4-6*",
    "*claude-opus-4-7*",
    "*claude-opus-4-8*",
    "*claude-sonnet-4-6*",
    "*claude-sonnet-5*",
    "*claude-mythos*",
    "*noprefill*",
)

# Provider stop_reason -> normalized reason (StopReason docstring). Unknown values pass
# through unchanged so new reasons are visible rather than guessed at.
STOP_REASONS: dict[str, str] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "pause_turn": "pause_turn",
    "refusal": "refusal",
    "model_context_window_exceeded": "context_overflow",
}


class StopDetails(TypedDict, total=False):
    """A ``message_delta``'s ``stop_details`` (the SDK's ``RefusalStopDetails``): ``type``
    ``"refusal"``, the policy ``category`` and its ``explanation``, each ``null`` where the API has
    none. Kept whole as the API sent it, any newer field too."""

    type: str
    category: str | None
    explanation: str | None


class AnthropicStop(TypedDict, total=False):
    """The answer metadata of an Anthropic attempt (``AnswerMetadata``): its ``message_delta``'s
    ``stop_reason`` as the API wrote it, and its ``stop_details`` (a refusal's policy category and
    explanation, ``null`` for other stops) when the API sent the field, as sent: the healing
    endpoint writes both back to an Anthropic client."""

    stop_reason: str
    stop_details: StopDetails | None


# HTTP status -> (kind, class): the status policy, before the body rules.
_STATUS_POLICY: dict[int, tuple[str, ErrorClass]] = {
    400: ("invalid_request", ErrorClass.PERMANENT),
    401: ("unauthorized", ErrorClass.PERMANENT),
    402: ("billing", ErrorClass.PERMANENT),
    403: ("permission_denied", ErrorClass.PERMANENT),
    404: ("model_not_found", ErrorClass.PERMANENT),
    408: ("timeout", ErrorClass.RETRYABLE),
    409: ("conflict", ErrorClass.RETRYABLE),
    413: ("request_too_large", ErrorClass.PERMANENT),
    429: ("rate_limited", ErrorClass.RETRYABLE),
    500: ("server_error", ErrorClass.RETRYABLE),
    502: ("server_error", ErrorClass.RETRYABLE),
    503: ("server_error", ErrorClass.RETRYABLE),
    504: ("timeout", ErrorClass.RETRYABLE),
    529: ("overloaded", ErrorClass.RETRYABLE),
}

# A mid-stream error type -> the HTTP status it names, whose retry policy it then gets.
_ERROR_TYPE_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "conflict_error": 409,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

_CONTEXT_MARKERS = ("prompt is too long", "context limit", "context window", "context length")
_PREFILL_MARKERS = ("does not support assistant message prefill", "must end with a user message")
_SPEND_LIMIT_MARKERS = ("specified api usage limits",)
_SPEND_LIMIT_CODE = "enforced_spend_limit_reached"


def _usage(raw: Any, cached: Usage) -> Usage:
    """Anthropic usage (cumulative values) -> Usage; absent fields stay None.

    Anthropic's ``input_tokens`` leaves out the tokens read from and written to the prompt cache;
    ``Usage.input_tokens`` counts them, so they are added: this event's, or where it leaves them
    out, the last ones reported (``cached``; a ``message_delta`` may carry ``input_tokens`` alone).
    """
    if not raw:
        return Usage()
    uncached = as_int(raw.get("input_tokens"))
    creation = as_int(raw.get("cache_creation_input_tokens"))
    read = as_int(raw.get("cache_read_input_tokens"))
    total = None
    if uncached is not None:
        total = uncached + (creation if creation is not None else cached.cache_creation_input_tokens or 0)
        total += read if read is not None else cached.cache_read_input_tokens or 0
    # newer responses show apart the thinking part of ``output_tokens`` (which includes it)
    details = raw.get("output_tokens_details")
    return Usage(
        input_tokens=total,
        output_tokens=as_int(raw.get("output_tokens")),
        cache_creation_input_tokens=creation,
        cache_read_input_tokens=read,
        reasoning_tokens=as_int(details.get("thinking_tokens")) if isinstance(details, dict) else None,
    )


class _ShapeError(Exception):
    """Internal: a field is missing or of the wrong type; ``feed`` turns it into ParseError."""


_STREAM_END = StreamEnd()


class AnthropicStreamParser:
    """One response's SSE events -> normalized stream events.

    Decides by the JSON ``type`` (the SSE event name is only a fallback when the JSON has
    none); unknown event, block and delta types are tolerated because the API adds them
    over time. Bad data raises ``ParseError``.
    """

    __slots__ = ("_pairs", "message_id", "model", "usage")

    def __init__(self) -> None:
        self.message_id: str | None = None
        self.model: str | None = None
        self.usage = Usage()  # the usage so far: the cache counts a later input count adds to
        self._pairs = SplitPairs()

    def _read_usage(self, raw: Any) -> Usage:
        usage = _usage(raw, self.usage)
        self.usage = self.usage.merged(usage)
        return usage

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        data = event.data
        obj = self._pairs.event_object(data, f"anthropic {event.event!r} event")
        etype = obj.get("type")
        if type(etype) is not str:
            if etype is not None or event.event == "message":  # unnamed: nothing to fall back on
                raise ParseError(f"anthropic {event.event!r} event: no string 'type': {excerpt(data)}")
            etype = event.event
        handler = _HANDLERS.get(etype)
        if handler is None:
            return self._pairs.settle([])  # ping, and event types added after this was written
        try:
            return self._pairs.settle(handler(self, obj))
        except (_ShapeError, KeyError, TypeError, AttributeError) as exc:
            raise ParseError(f"anthropic {etype!r} event has the wrong shape ({exc!r}): {excerpt(data)}") from None

    # -- handlers: each takes the decoded object, returns the events ------------------

    def _message_start(self, obj: dict[str, Any]) -> list[StreamEvent]:
        message = obj["message"]
        self.message_id = message.get("id")
        self.model = message.get("model")
        usage = self._read_usage(message.get("usage"))
        return [MessageStart(message_id=self.message_id, model=self.model, usage=usage)]

    def _block_start(self, obj: dict[str, Any]) -> list[StreamEvent]:
        index = obj["index"]
        if type(index) is not int:
            raise _ShapeError("index is not an integer")
        block = obj["content_block"]
        kind = block["type"]
        if kind == "text":
            # a cited span opens with "citations": the engine must not join it to plain text
            out_text: list[StreamEvent] = [
                BlockStart(index, "text", data={"citations": []} if "citations" in block else None)
            ]
            text = block.get("text")
            if text:  # the start normally carries "", but keep any initial text
                out_text.append(TextDelta(index, text))
            cited = block.get("citations")  # normally [] (filled by citations_delta) or absent
            if cited:
                if type(cited) is not list or any(type(c) is not dict for c in cited):
                    raise _ShapeError("citations is not a list of objects")
                out_text.extend(CitationDelta(index, c) for c in cited)
            return out_text
        if kind == "tool_use":
            # The start's "input": {} is a placeholder; the input arrives as input_json_delta.
            call_id, name = block["id"], block["name"]
            if type(name) is not str or not optional_strings(call_id):
                # the engine stores, shows and sends back both as strings
                raise _ShapeError("tool_use name or id is not a string")
            return [BlockStart(index, "tool_use", id=call_id, name=name)]
        if kind == "thinking":
            out: list[StreamEvent] = [BlockStart(index, "thinking")]
            if block.get("thinking"):
                out.append(ThinkingDelta(index, block["thinking"]))
            if block.get("signature"):
                out.append(SignatureDelta(index, block["signature"]))
            return out
        if type(kind) is not str:
            raise _ShapeError("content_block.type is not a string")
        # redacted_thinking (arrives whole) and every other type, kept opaquely as sent.
        # server_tool_use streams its input like a tool_use but keeps its own kind: the API
        # runs it, so it must never look like a tool call to run locally.
        block_id, name = block.get("id"), block.get("name")
        if not optional_strings(block_id, name):
            raise _ShapeError(f"{kind} id or name is not a string")
        return [BlockStart(index, kind, id=block_id, name=name, data=block)]

    def _block_delta(self, obj: dict[str, Any]) -> list[StreamEvent]:
        index = obj["index"]
        if type(index) is not int:
            raise _ShapeError("index is not an integer")
        delta = obj["delta"]
        dtype = delta["type"]
        if dtype == "text_delta":  # the common case first
            text = delta["text"]
            if type(text) is not str:
                raise _ShapeError("text is not a string")
            return [TextDelta(index, text)]
        if dtype == "citations_delta":
            citation = delta["citation"]
            if type(citation) is not dict:
                raise _ShapeError("citation is not an object")
            return [CitationDelta(index, citation)]
        if dtype == "compaction_delta":
            content = delta["content"]
            if type(content) is not str:
                raise _ShapeError("content is not a string")
            return [FieldDelta(index, "content", content)]
        make = _DELTAS.get(dtype)
        if make is None:
            return []  # future delta types: ignored, never guessed at
        field, cls = make
        value = delta[field]
        if type(value) is not str:
            raise _ShapeError(f"{field} is not a string")
        return [cls(index, value)]

    def _block_stop(self, obj: dict[str, Any]) -> list[StreamEvent]:
        index = obj["index"]
        if type(index) is not int:
            raise _ShapeError("index is not an integer")
        return [BlockStop(index)]

    def _message_delta(self, obj: dict[str, Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        delta = obj.get("delta")
        if delta:
            raw = delta.get("stop_reason")
            if raw is not None:
                if type(raw) is not str:
                    raise _ShapeError("stop_reason is not a string")
                sequence = delta.get("stop_sequence")
                if sequence is not None and type(sequence) is not str:
                    raise _ShapeError("stop_sequence is not a string")
                out.append(StopReason(STOP_REASONS.get(raw, raw), raw, sequence))
                stop = AnthropicStop(stop_reason=raw)
                if "stop_details" in delta:
                    details = delta["stop_details"]
                    if details is not None and type(details) is not dict:
                        raise _ShapeError("stop_details is not an object")
                    stop["stop_details"] = cast("StopDetails | None", details)
                out.append(AnswerMetadata(stop))
        usage = obj.get("usage")
        if usage:
            out.append(UsageUpdate(self._read_usage(usage)))  # cumulative: the engine replaces, never sums
        return out

    def _message_stop(self, obj: dict[str, Any]) -> list[StreamEvent]:
        return [_STREAM_END]

    def _error(self, obj: dict[str, Any]) -> list[StreamEvent]:
        error = obj.get("error")
        if not isinstance(error, dict):
            error = {"message": str(error) if error is not None else ""}
        return [
            ProviderErrorEvent(
                error_type=str(error.get("type") or "api_error"),
                message=str(error.get("message") or ""),
                request_id=obj.get("request_id"),
            )
        ]


_Handler = Callable[[AnthropicStreamParser, dict[str, Any]], list[StreamEvent]]

_HANDLERS: dict[str, _Handler] = {
    "content_block_delta": AnthropicStreamParser._block_delta,
    "content_block_start": AnthropicStreamParser._block_start,
    "content_block_stop": AnthropicStreamParser._block_stop,
    "message_start": AnthropicStreamParser._message_start,
    "message_delta": AnthropicStreamParser._message_delta,
    "message_stop": AnthropicStreamParser._message_stop,
    "error": AnthropicStreamParser._error,
}

_DELTAS: dict[str, tuple[str, type[ToolArgsDelta] | type[ThinkingDelta] | type[SignatureDelta]]] = {
    "input_json_delta": ("partial_json", ToolArgsDelta),
    "thinking_delta": ("thinking", ThinkingDelta),
    "signature_delta": ("signature", SignatureDelta),
}


# -- requests -------------------------------------------------------------------------


def _content_block(block: dict[str, Any]) -> dict[str, Any]:
    """A canonical content block -> the API's block (nearly the same shape)."""
    btype = block.get("type")
    out: dict[str, Any]
    if btype == "text":
        out = {"type": "text", "text": block["text"]}
        # sent back as received (web search answers need them); another API's annotations are not Anthropic's
        cited = [c for c in block.get("citations") or () if c.get("type") not in ANNOTATION_TYPES]
        if cited:
            out["citations"] = cited
    elif btype == "tool_use":
        out = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": block.get("input") or {}}
    elif btype == "tool_result":
        out = {"type": "tool_result", "tool_use_id": block["tool_use_id"]}
        content = block.get("content")
        if content is not None:
            out["content"] = content if isinstance(content, str) else [_content_block(b) for b in content]
        if block.get("is_error"):
            out["is_error"] = True
    elif btype == "thinking":
        # Must round-trip byte-exact with its signature.
        out = {"type": "thinking", "thinking": block["thinking"], "signature": block["signature"]}
    elif btype == "redacted_thinking":
        out = {"type": "redacted_thinking", "data": block["data"]}
    else:
        return dict(block)  # images, server tool blocks, future types: as they are
    if "cache_control" in block:
        out["cache_control"] = block["cache_control"]
    return out


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """A canonical message -> an API message. ``prefix`` is dropped: for Anthropic a
    prefill is simply a trailing assistant message."""
    content = message["content"]
    if not isinstance(content, str):
        content = [_content_block(b) for b in content if not _blank_assistant_text(message, b) and not _foreign(b)]
    return {"role": message["role"], "content": content}


def _foreign(block: dict[str, Any]) -> bool:
    """A Responses provider's web search call, kept in history before a failover: Anthropic knows a
    search only as its own server tool call and result, and refuses a block of an unknown type."""
    return block.get("type") == WEB_SEARCH_CALL


def _blank_assistant_text(message: dict[str, Any], block: dict[str, Any]) -> bool:
    """A whitespace-only text block of an assistant message: kept in the committed message
    (a web search answer sends " " and "\n\n" between its cited spans) but never sent
    back, since the API refuses it ("text content blocks must contain non-whitespace text")."""
    return message["role"] == "assistant" and block.get("type") == "text" and not str(block.get("text", "")).strip()


# -- errors ---------------------------------------------------------------------------


def _refine(status: int, kind: str, error_class: ErrorClass, message: str, code: str) -> tuple[str, ErrorClass]:
    """Body rules on top of the status policy."""
    text = message.lower()
    if code == _SPEND_LIMIT_CODE or _SPEND_LIMIT_CODE in text or any(m in text for m in _SPEND_LIMIT_MARKERS):
        return "spend_limit", ErrorClass.PERMANENT
    if status == 400:
        if any(m in text for m in _PREFILL_MARKERS):
            return "prefill_refused", ErrorClass.PREFILL_REFUSED
        if any(m in text for m in _CONTEXT_MARKERS):
            return "context_overflow", ErrorClass.PERMANENT
    return kind, error_class


def _add_betas(headers: dict[str, str], betas: tuple[str, ...]) -> None:
    """The request's beta flags after those of the provider's settings (``EXTRA_HEADERS``), each
    once, in the one comma-separated ``anthropic-beta`` header."""
    if not betas:
        return
    name = next((k for k in headers if k.lower() == "anthropic-beta"), "anthropic-beta")
    flags = [f.strip() for f in headers.get(name, "").split(",") if f.strip()]
    flags.extend(f for f in dict.fromkeys(betas) if f not in flags)
    headers[name] = ",".join(flags)


# Extended thinking: ``budget_tokens`` is at least 1024 and below ``max_tokens``, or the request is
# refused; a budget that cannot be both is left out of a continuation (it then does not think).
THINKING_RULE = ThinkingRule(minimum=1024, send_minimum=False)

# the Messages request fields the token-count endpoint takes (no max_tokens, no stream)
_COUNTED_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers"})


class AnthropicAdapter:
    """Translates between the canonical conversation and the Anthropic Messages API."""

    name = "anthropic"

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    # -- request ----------------------------------------------------------------------

    def build_request(self, request: ModelRequest) -> HTTPRequest:
        config = self.config
        headers = {
            "x-api-key": config.api_key,
            "anthropic-version": config.anthropic_version,
            "content-type": "application/json",
            "accept": "text/event-stream",
        }
        headers.update(config.extra_headers)
        _add_betas(headers, request.betas)
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": [_message(m) for m in request.messages],
            "stream": True,
        }
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in request.tools
            ]
        if request.thinking_budget:
            body["thinking"] = {"type": "enabled", "budget_tokens": request.thinking_budget}
        if request.temperature is not None:
            body["temperature"] = request.temperature
        body.update(request.extra)
        own = request.extra.get("thinking")
        if isinstance(own, Mapping) and own.get("type") == "enabled":
            # a proxied client's own extended thinking: its fields as sent (``display``...), its
            # budget this call's, lowered on a continuation as a run's is; where none fits what
            # is left (``thinking_rule``), the call goes without thinking, as a run's does
            if request.thinking_budget:
                body["thinking"] = {**own, "budget_tokens": request.thinking_budget}
            else:
                del body["thinking"]
        return HTTPRequest("POST", f"{config.base_url.rstrip('/')}/v1/messages", headers, body)

    def new_parser(self) -> AnthropicStreamParser:
        return AnthropicStreamParser()

    # -- errors -----------------------------------------------------------------------

    def classify_http_error(self, status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
        """Classify a non-2xx response by status, refined by the body, overridden by
        ``x-should-retry`` (except a prefill refusal, which is a fallback signal)."""
        document, error, message = read_error_body(status, body)
        request_id = header_value(headers, "request-id") or document.get("request_id")
        code = ""
        if isinstance(error, dict) and isinstance(error.get("details"), dict):
            code = str(error["details"].get("error_code") or "")
        kind, error_class = _refine(status, *status_policy(status, _STATUS_POLICY), message, code)
        error_class = with_should_retry(headers, error_class)
        return ProviderError(
            error_class=error_class,
            kind=kind,
            message=message,
            status=status,
            retry_after_s=parse_retry_after(headers),
            request_id=request_id,
        )

    def classify_stream_error(self, event: ProviderErrorEvent) -> ProviderError:
        """A mid-stream ``error`` event, classified as the HTTP status its type names.
        Unknown types count as ``api_error``: new types are more likely transient than
        not, and the continuation budget bounds the cost of being wrong."""
        status = _ERROR_TYPE_STATUS.get(event.error_type, 500)
        kind, error_class = _refine(status, *status_policy(status, _STATUS_POLICY), event.message, "")
        return ProviderError(
            error_class=error_class,
            kind=kind,
            message=f"{event.error_type}: {event.message}",
            request_id=event.request_id,
        )

    # -- continuation -----------------------------------------------------------------

    def continuation_strategy(self, model: str, *, thinking: bool) -> Strategy:
        """Settings overrides first, then: no prefill with extended thinking or on models
        that reject it (``NO_PREFILL_MODELS``); otherwise prefill."""
        override = strategy_override(self.config.strategy_overrides, model)
        if override is not None:
            return override
        if thinking or any(fnmatchcase(model, pattern) for pattern in NO_PREFILL_MODELS):
            return Strategy.CONTINUE_MESSAGE
        return Strategy.PREFILL

    @property
    def echoes_prefix(self) -> bool:
        """A prefill continuation never repeats the prefill."""
        return False

    @property
    def text_delta_is_token(self) -> bool:
        """A text delta carries any number of tokens."""
        return False

    @property
    def min_max_tokens(self) -> int:
        return 1

    def thinking_rule(self, model: str) -> ThinkingRule:
        return THINKING_RULE

    def count_request(self, request: ModelRequest) -> HTTPRequest | None:
        """``POST /v1/messages/count_tokens``: the request's input tokens, free of charge."""
        built = self.build_request(request)
        body = {k: v for k, v in built.json.items() if k in _COUNTED_FIELDS}
        headers = {**built.headers, "accept": "application/json"}
        return HTTPRequest("POST", built.url + "/count_tokens", headers, body)

    def read_count(self, body: bytes) -> int | None:
        try:
            count = json.loads(body).get("input_tokens")
        except (ValueError, AttributeError):
            return None
        return count if isinstance(count, int) and not isinstance(count, bool) else None
