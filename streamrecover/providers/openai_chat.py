"""OpenAI Chat Completions adapter (``POST {base_url}/chat/completions``, ``"stream": true``).

Also serves OpenAI-compatible endpoints: DeepSeek and Mistral continue from an assistant
message flagged ``"prefix": true`` (``ProviderConfig.prefix_flag``); Mistral's answer then
repeats the prefix (``ProviderConfig.echoes_prefix``). vLLM, SGLang and llama.cpp's server
continue inside a trailing assistant message when asked with ``continue_final_message: true``
and ``add_generation_prompt: false`` (``ProviderConfig.continue_final_message``): a true prefill.
DeepSeek's (and other servers') ``delta.reasoning_content`` is reasoning: a thinking block of
its own, never part of the answer's text, and never sent back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..engine.contract import HTTPRequest, ModelRequest, ProviderConfig, Strategy, ThinkingRule
from ..engine.errors import ErrorClass, InterruptCause, ParseError, ProviderError, StreamInterrupted
from ..engine.events import (
    BlockStart,
    BlockStop,
    MessageStart,
    ProviderErrorEvent,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    TokenLogprob,
    ToolArgsDelta,
    TopLogprob,
    Usage,
    UsageUpdate,
)
from ..engine.retry import header_value, parse_retry_after
from ..engine.sse import SSEEvent
from .azure import CHAT_PATH, azure_headers, azure_url, deployment
from .common import (
    UNSENT_THINKING,
    SplitPairs,
    as_int,
    excerpt,
    optional_strings,
    read_error_body,
    status_policy,
    strategy_override,
    text_of,
    with_should_retry,
)

__all__ = ["FINISH_REASONS", "MAX_TOKENS_FIELDS", "OpenAIChatAdapter", "OpenAIChatStreamParser", "max_tokens_field"]
# The names of the output limit: OpenAI's o-series and gpt-5 take only the newer one, compatible
# servers (vLLM, llama.cpp, Ollama) and Azure's older API versions only the older one.
MAX_TOKENS_FIELDS = ("max_completion_tokens", "max_tokens")
OPENAI_HOST = "api.openai.com"
TEXT_INDEX = 0  # the message's text (content or refusal) is block 0; tool call i is block 1 + i
REASONING_INDEX = -1  # ``reasoning_content``: before the text, as it streams first

# finish_reason -> normalized stop reason; unknown values pass through unchanged.
FINISH_REASONS: dict[str, str] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "content_filter",
    "function_call": "tool_use",
}

_STATUS_POLICY: dict[int, tuple[str, ErrorClass]] = {
    400: ("invalid_request", ErrorClass.PERMANENT),
    401: ("unauthorized", ErrorClass.PERMANENT),
    402: ("billing", ErrorClass.PERMANENT),  # DeepSeek: insufficient balance
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
}

# Look-alikes of a rate limit that retrying cannot fix: the money ran out. Specific phrases,
# never a bare "quota": Azure's ordinary rate-limit 429 links https://aka.ms/oai/quotaincrease.
_QUOTA_MARKERS = (
    "insufficient_quota",
    "exceeded your current quota",
    "spend limit",
    "spending limit",
    "billing_hard_limit",
)
_CONTEXT_MARKERS = ("context_length_exceeded", "maximum context length", "context window")
# A 400 from a server that does not take the prefill form: fall back to a continue message.
_CONTINUE_FINAL_MARKERS = ("continue_final_message", "add_generation_prompt")
# Mid-stream error types/codes worth a continuation (server trouble, rate limits).
_RETRYABLE_STREAM_MARKERS = ("server_error", "overload", "rate_limit", "timeout", "unavailable", "api_error")


def _usage(raw: dict[str, Any]) -> Usage:
    """Chat usage -> Usage. ``prompt_tokens`` includes cached tokens (OpenAI's meaning);
    DeepSeek reports cache hits as ``prompt_cache_hit_tokens``. ``completion_tokens`` includes
    the reasoning tokens, which ``completion_tokens_details`` shows apart."""
    details = raw.get("prompt_tokens_details")
    cached = as_int(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is None:
        cached = as_int(raw.get("prompt_cache_hit_tokens"))
    completion = raw.get("completion_tokens_details")
    return Usage(
        input_tokens=as_int(raw.get("prompt_tokens")),
        output_tokens=as_int(raw.get("completion_tokens")),
        cache_read_input_tokens=cached,
        reasoning_tokens=as_int(completion.get("reasoning_tokens")) if isinstance(completion, dict) else None,
    )


_STREAM_END = StreamEnd()


class OpenAIChatStreamParser:
    """One response's chunks -> normalized stream events.

    Chunks are unnamed SSE events; ``choices`` may be empty (the final usage chunk, Azure's
    first chunk), so nothing indexes it blindly. Only choice 0 is followed: a continuation
    runner asks for one answer. ``delta.reasoning_content`` (DeepSeek and other compatible
    servers) is a thinking block of its own (unsigned: the engine shows it and drops it from
    history, as any unsigned thinking), closed when the answer starts.

    The terminator is a ``finish_reason`` chunk and then ``[DONE]``: a ``[DONE]`` with no
    ``finish_reason`` before it is a stream that broke (a proxy that ends the stream when its
    upstream fails writes one), not a complete answer.
    """

    __slots__ = (
        "_finished",
        "_open_tools",
        "_pairs",
        "_reasoning_open",
        "_refused",
        "_started",
        "_text_open",
        "_unplaced_logprobs",
    )

    def __init__(self) -> None:
        self._pairs = SplitPairs()
        self._text_open = False
        self._reasoning_open = False
        self._open_tools: dict[int, int] = {}  # provider tool index -> block index
        self._refused = False
        self._started = False
        self._finished = False  # choice 0's finish_reason arrived
        # entries of a chunk that carried no text: they go with the text that follows
        self._unplaced_logprobs: list[TokenLogprob] = []

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        data = event.data
        if data[:6] == "[DONE]":  # the SDK's test: startswith("[DONE]")
            if not self._finished:
                raise StreamInterrupted(
                    InterruptCause.CONNECTION_RESET,
                    "the stream sent [DONE] without a finish_reason: it ended without its terminator",
                )
            return self._pairs.settle([_STREAM_END])
        chunk = self._pairs.event_object(data, f"openai {event.event!r} event")
        try:
            return self._pairs.settle(self._chunk(chunk))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ParseError(f"openai chunk has the wrong shape ({exc!r}): {excerpt(data)}") from None

    def _chunk(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        error = chunk.get("error")
        if error:
            return [_error_event(error)]
        out: list[StreamEvent] = []
        if not self._started and chunk.get("id"):  # Azure's first chunk has id ""
            self._started = True
            out.append(MessageStart(message_id=chunk["id"], model=chunk.get("model") or None))
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta:
                self._delta(delta, choice.get("logprobs"), out)
            finish = choice.get("finish_reason")
            if finish is not None:
                self._finish(finish, out)
        usage = chunk.get("usage")
        if usage:
            out.append(UsageUpdate(_usage(usage)))
        return out

    def _delta(self, delta: dict[str, Any], logprobs: Any, out: list[StreamEvent]) -> None:
        reasoning = delta.get("reasoning_content")
        if reasoning:
            if type(reasoning) is not str:
                raise TypeError("reasoning_content is not a string")
            if not self._reasoning_open:
                self._reasoning_open = True
                out.append(BlockStart(REASONING_INDEX, "thinking"))
            out.append(ThinkingDelta(REASONING_INDEX, reasoning))
        elif self._reasoning_open and (delta.get("content") or delta.get("tool_calls") or delta.get("refusal")):
            self._close_reasoning(out)
        content = delta.get("content")
        if logprobs is not None:  # ``null`` on every chunk of a request that did not ask
            self._unplaced_logprobs.extend(token_logprobs(logprobs, "content"))
        if content:
            self._text(content, out)
        refusal = delta.get("refusal")
        if logprobs is not None:
            self._unplaced_logprobs.extend(token_logprobs(logprobs, "refusal"))
        if refusal:
            if not self._refused:
                # A refusal is known from its first delta: the answer is one, wherever the
                # stream is cut, so the stop reason is set now (the finish_reason stays "stop").
                self._refused = True
                out.append(StopReason("refusal", None))
            self._text(refusal, out, refusal=True)
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            for position, call in enumerate(tool_calls):
                index = call.get("index", position)
                if type(index) is not int or index < 0:
                    # a negative index would land on the text block (block 1 + index)
                    raise TypeError("tool_calls[].index is not a non-negative integer")
                self._tool(index, call.get("id"), call.get("function") or {}, out)
        function_call = delta.get("function_call")  # deprecated single-call form
        if function_call:
            self._tool(0, None, function_call, out)

    def _text(self, text: str, out: list[StreamEvent], *, refusal: bool = False) -> None:
        """Text of the message's one text block; a block opened by ``delta.refusal`` is a refusal
        (the API never streams both in one message: a refusal after content goes on in its block)."""
        if type(text) is not str:
            raise TypeError("content is not a string")
        if not self._text_open:
            self._text_open = True
            out.append(BlockStart(TEXT_INDEX, "text", refusal=refusal))
        if self._unplaced_logprobs:
            out.append(TextDelta(TEXT_INDEX, text, tuple(self._unplaced_logprobs)))
            self._unplaced_logprobs.clear()
        else:
            out.append(TextDelta(TEXT_INDEX, text))

    def _tool(self, index: int, call_id: str | None, function: dict[str, Any], out: list[StreamEvent]) -> None:
        block = self._open_tools.get(index)
        if block is None:  # id and name come only on a call's first chunk
            name = function.get("name")
            if not optional_strings(name, call_id):
                raise TypeError("a tool call's name or id is not a string")
            block = self._open_tools[index] = 1 + index
            out.append(BlockStart(block, "tool_use", id=call_id, name=name))
        arguments = function.get("arguments")
        if arguments:
            if type(arguments) is not str:
                raise TypeError("function.arguments is not a string")
            out.append(ToolArgsDelta(block, arguments))

    def _close_reasoning(self, out: list[StreamEvent]) -> None:
        self._reasoning_open = False
        out.append(BlockStop(REASONING_INDEX))

    def _finish(self, finish: str, out: list[StreamEvent]) -> None:
        if type(finish) is not str:
            raise TypeError("finish_reason is not a string")
        self._finished = True
        if self._reasoning_open:
            self._close_reasoning(out)
        if self._text_open:
            self._text_open = False
            out.append(BlockStop(TEXT_INDEX))
        for block in sorted(self._open_tools.values()):
            out.append(BlockStop(block))
        self._open_tools.clear()
        reason = "refusal" if self._refused else FINISH_REASONS.get(finish, finish)
        out.append(StopReason(reason, finish))


def token_logprobs(logprobs: Any, kind: str) -> list[TokenLogprob]:
    """A chunk's ``logprobs.content`` or ``logprobs.refusal`` entries, rebuilt in the API's field
    order. They describe the answer, they are not part of it: a list of the wrong shape is left
    out whole (never half of it), and the stream goes on."""
    return logprob_entries(logprobs.get(kind) if isinstance(logprobs, dict) else None)


def logprob_entries(entries: Any) -> list[TokenLogprob]:
    """A list of token logprob entries (Chat's, or a Responses ``output_text.delta``'s, which have
    no ``bytes``: None then), checked; none at all where one has the wrong shape."""
    if not isinstance(entries, list):
        return []
    out: list[TokenLogprob] = []
    for entry in entries:
        token = _top_logprob(entry)
        tops = (entry.get("top_logprobs") or []) if token is not None else None
        alternatives = [_top_logprob(t) for t in tops] if isinstance(tops, list) else [None]
        if token is None or any(t is None for t in alternatives):
            return []
        out.append(
            TokenLogprob(
                token=token["token"],
                logprob=token["logprob"],
                bytes=token["bytes"],
                top_logprobs=[t for t in alternatives if t is not None],
            )
        )
    return out


def _top_logprob(entry: Any) -> TopLogprob | None:
    """``{"token", "logprob", "bytes"}`` checked, or None where a field has the wrong type."""
    if not isinstance(entry, dict):
        return None
    token, logprob, raw = entry.get("token"), entry.get("logprob"), entry.get("bytes")
    byte_list = raw is None or (isinstance(raw, list) and all(type(b) is int and 0 <= b < 256 for b in raw))
    if type(token) is not str or not isinstance(logprob, int | float) or isinstance(logprob, bool) or not byte_list:
        return None
    return TopLogprob(token=token, logprob=logprob, bytes=None if raw is None else list(raw))


def _error_event(error: Any) -> ProviderErrorEvent:
    """``data: {"error": {...}}`` inside a 200 stream. The code is more specific than the
    type when both are set (``rate_limit_exceeded`` vs ``requests``), so it wins."""
    if not isinstance(error, dict):
        return ProviderErrorEvent(error_type="error", message=str(error))
    error_type = error.get("code") or error.get("type") or "error"
    return ProviderErrorEvent(error_type=str(error_type), message=str(error.get("message") or ""))


# -- requests -------------------------------------------------------------------------


def _user_part(block: dict[str, Any]) -> dict[str, Any]:
    """A canonical user block -> a content part. Anthropic-style base64 images become data
    URLs; anything else is assumed to be an OpenAI part already."""
    btype = block.get("type")
    if btype == "text":
        return {"type": "text", "text": block["text"]}
    source = block.get("source")
    if btype == "image" and isinstance(source, dict) and source.get("type") == "base64":
        url = f"data:{source['media_type']};base64,{source['data']}"
        return {"type": "image_url", "image_url": {"url": url}}
    return dict(block)


def _user_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A canonical user message -> tool messages (first: they must follow the assistant's
    tool calls) and then the user's own content, if any. ``is_error`` has no OpenAI field;
    the result's text carries the error."""
    content = message["content"]
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content:
        if block.get("type") == "tool_result":
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text_of(block.get("content"))})
        else:
            parts.append(_user_part(block))
    if len(parts) == 1 and parts[0]["type"] == "text":
        out.append({"role": "user", "content": parts[0]["text"]})
    elif parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant_message(message: dict[str, Any], prefix_flag: bool) -> dict[str, Any]:
    """Text blocks join into ``content``; tool_use blocks become ``tool_calls``; thinking,
    redacted thinking and other provider blocks are dropped (OpenAI cannot take them)."""
    content = message["content"]
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    if isinstance(content, str):
        text.append(content)
    else:
        for block in content:
            btype = block.get("type")
            if btype == "text":
                text.append(block["text"])
            elif btype == "tool_use":
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
                calls.append(
                    {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
                )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        out["tool_calls"] = calls
    if prefix_flag and message.get("prefix"):
        out["prefix"] = True
    return out


def _messages(request: ModelRequest, prefix_flag: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for message in request.messages:
        role = message["role"]
        if role == "user":
            out.extend(_user_messages(message))
        elif role == "assistant":
            out.append(_assistant_message(message, prefix_flag))
        else:  # system/developer messages placed in the conversation
            out.append({"role": role, "content": text_of(message["content"])})
    return out


def max_tokens_field(config: ProviderConfig, request: ModelRequest) -> str:
    """The name the output limit goes under: the request's (a proxied client's own), else the one
    ``extra`` names (a caller's choice of name; its value is the budget's), else the provider's."""
    if request.max_tokens_field is not None:
        return request.max_tokens_field
    for name in MAX_TOKENS_FIELDS:
        if name in request.extra:
            return name
    if config.max_tokens_field is not None:
        return config.max_tokens_field
    official = not config.azure and urlsplit(config.base_url).hostname == OPENAI_HOST
    return "max_completion_tokens" if official else "max_tokens"


# -- errors ---------------------------------------------------------------------------


class OpenAIChatAdapter:
    """Translates between the canonical conversation and Chat Completions."""

    name = "openai"

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    def build_request(self, request: ModelRequest) -> HTTPRequest:
        """``request.max_tokens`` (a continuation's: what is left of the turn's) is sent under the
        name the upstream wants (``max_tokens_field``), after ``extra``, which never overrides it."""
        config = self.config
        headers = azure_headers(config) if config.azure else {"Authorization": f"Bearer {config.api_key}"}
        headers.update({"content-type": "application/json", "accept": "text/event-stream"})
        headers.update(config.extra_headers)
        body: dict[str, Any] = {
            "model": deployment(config, request.model) if config.azure else request.model,
            "messages": _messages(request, config.prefix_flag),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        last = request.messages[-1] if request.messages else None
        if (
            config.continue_final_message
            and last is not None
            and last["role"] == "assistant"
            and not last.get("prefix")
        ):
            # a prefill: the server renders the assistant message open-ended and writes on inside it
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
                }
                for t in request.tools
            ]
        if request.temperature is not None:
            body["temperature"] = request.temperature
        body.update(request.extra)
        for name in MAX_TOKENS_FIELDS:
            body.pop(name, None)
        body[max_tokens_field(config, request)] = request.max_tokens
        if config.azure:
            url = azure_url(config, CHAT_PATH, model=request.model)
        else:
            url = f"{config.base_url.rstrip('/')}{CHAT_PATH}"
        return HTTPRequest("POST", url, headers, body)

    def new_parser(self) -> OpenAIChatStreamParser:
        return OpenAIChatStreamParser()

    def classify_http_error(self, status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
        """Status policy, refined by the body's ``code``/``type``/message (quota 429s and
        context overflows are permanent), overridden by ``x-should-retry``."""
        _, error, message = read_error_body(status, body)
        markers = f"{error.get('code') or ''} {error.get('type') or ''}" if isinstance(error, dict) else ""
        kind, error_class = status_policy(status, _STATUS_POLICY)
        haystack = f"{markers} {message}".lower()
        if status == 429 and any(m in haystack for m in _QUOTA_MARKERS):
            kind, error_class = "spend_limit", ErrorClass.PERMANENT
        elif (
            status in (400, 422)
            and self.config.continue_final_message
            and any(m in haystack for m in _CONTINUE_FINAL_MARKERS)
        ):
            kind, error_class = "prefill_refused", ErrorClass.PREFILL_REFUSED
        elif status == 400 and any(m in haystack for m in _CONTEXT_MARKERS):
            kind = "context_overflow"
        error_class = with_should_retry(headers, error_class)
        return ProviderError(
            error_class=error_class,
            kind=kind,
            message=message,
            status=status,
            retry_after_s=parse_retry_after(headers),
            request_id=header_value(headers, "x-request-id"),
        )

    def classify_stream_error(self, event: ProviderErrorEvent) -> ProviderError:
        """Server trouble and rate limits are worth a continuation; anything else in a 200
        stream (quota, invalid request, context overflow) is permanent."""
        error_type = event.error_type.lower()
        haystack = f"{error_type} {event.message.lower()}"
        if any(m in haystack for m in _QUOTA_MARKERS):
            kind, error_class = "spend_limit", ErrorClass.PERMANENT
        elif any(m in haystack for m in _CONTEXT_MARKERS):
            kind, error_class = "context_overflow", ErrorClass.PERMANENT
        elif "rate_limit" in error_type or error_type == "429" or "rate limit" in haystack:
            # Azure names its rate limit by the status: ``"code": "429"``, "exceeded token rate limit"
            kind, error_class = "rate_limited", ErrorClass.RETRYABLE
        elif "overload" in haystack:
            kind, error_class = "overloaded", ErrorClass.RETRYABLE
        elif any(m in error_type for m in _RETRYABLE_STREAM_MARKERS):
            kind, error_class = "server_error", ErrorClass.RETRYABLE
        elif error_type == "invalid_request_error":
            kind, error_class = "invalid_request", ErrorClass.PERMANENT
        else:
            kind, error_class = "provider_error", ErrorClass.PERMANENT
        return ProviderError(
            error_class=error_class,
            kind=kind,
            message=f"{event.error_type}: {event.message}",
            request_id=event.request_id,
        )

    def continuation_strategy(self, model: str, *, thinking: bool) -> Strategy:
        """Settings overrides first; the prefix flag where the endpoint takes it; a prefill
        where the server continues a final assistant message (vLLM, SGLang, llama.cpp);
        otherwise a user "continue" message, since OpenAI has no prefill."""
        override = strategy_override(self.config.strategy_overrides, model)
        if override is not None:
            return override
        if self.config.prefix_flag:
            return Strategy.PREFIX_FLAG
        return Strategy.PREFILL if self.config.continue_final_message else Strategy.CONTINUE_MESSAGE

    @property
    def echoes_prefix(self) -> bool:
        """Mistral repeats the prefix in its answer; DeepSeek does not."""
        return self.config.echoes_prefix

    @property
    def text_delta_is_token(self) -> bool:
        """OpenAI streams a chunk per sampled token of text (a character split across tokens
        waits to be whole: the engine bounds such a chunk by its bytes). Azure's content filter
        buffers many tokens into a chunk by default, so there a chunk says nothing: its bytes
        bound its tokens, as on providers whose deltas are not tokens."""
        return not self.config.azure

    @property
    def min_max_tokens(self) -> int:
        return 1

    def thinking_rule(self, model: str) -> ThinkingRule:
        """Chat Completions takes no thinking budget: none is sent."""
        return UNSENT_THINKING

    def count_request(self, request: ModelRequest) -> HTTPRequest | None:
        """Chat Completions has no token-count endpoint."""
        return None

    def read_count(self, body: bytes) -> int | None:
        return None
