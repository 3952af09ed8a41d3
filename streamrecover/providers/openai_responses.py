"""OpenAI Responses API adapter (``POST {base_url}/responses``, ``"stream": true``), with native resume.

Responses has no assistant prefill: a broken answer is continued with the partial output
as an assistant ``message`` input item and an explicit continue instruction. Where the
provider's ``NATIVE_RESUME`` setting is on, requests are made with ``background: true``
(and ``store: true``, which background mode requires), and a broken stream is first
re-attached with ``GET {base_url}/responses/{id}?stream=true&starting_after=N``: the same
response goes on from the event after N, nothing generated again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from ..engine.blocks import REASONING
from ..engine.contract import HTTPRequest, ModelRequest, ProviderConfig, ResumePoint, ThinkingRule
from ..engine.errors import ErrorClass, ParseError, ProviderError
from ..engine.events import (
    BlockStart,
    BlockStop,
    CitationDelta,
    MessageStart,
    ProviderErrorEvent,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ToolArgsDelta,
    Usage,
    UsageUpdate,
)
from ..engine.sse import SSEEvent
from .azure import azure_headers, azure_url, deployment
from .common import UNSENT_THINKING, ContinueMessageOnly, SplitPairs, as_int, excerpt, optional_strings, text_of
from .openai_chat import OpenAIChatAdapter, logprob_entries

__all__ = [
    "ANNOTATION_TYPES",
    "INCOMPLETE_REASONS",
    "REASONING",
    "WEB_SEARCH_CALL",
    "OpenAIResponsesAdapter",
    "ResponsesStreamParser",
    "ResumePoint",
]

WEB_SEARCH_CALL = "web_search_call"  # the hosted web search tool's output item
# the annotations of an output text part: they arrive as its text block's citations
ANNOTATION_TYPES = frozenset({"url_citation", "file_citation", "container_file_citation", "file_path"})
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # ``include``: the output text's token logprobs
ENCRYPTED_REASONING = "reasoning.encrypted_content"  # ``include``: a stateless request's reasoning, passed back
MIN_OUTPUT_TOKENS = 16  # the smallest ``max_output_tokens`` the API takes

# incomplete_details.reason -> normalized stop reason
INCOMPLETE_REASONS: dict[str, str] = {"max_output_tokens": "max_tokens", "content_filter": "content_filter"}
# The name of an error event that names no error (the flat form's nullable ``code`` is null).
UNNAMED_ERROR = "error"


def _usage(raw: Any) -> Usage:
    """``input_tokens`` includes the cached ones, as in Chat Completions; ``output_tokens`` the
    reasoning ones, which ``output_tokens_details`` shows apart."""
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get("input_tokens_details")
    cached = as_int(details.get("cached_tokens")) if isinstance(details, dict) else None
    output = raw.get("output_tokens_details")
    return Usage(
        input_tokens=as_int(raw.get("input_tokens")),
        output_tokens=as_int(raw.get("output_tokens")),
        cache_read_input_tokens=cached,
        reasoning_tokens=as_int(output.get("reasoning_tokens")) if isinstance(output, dict) else None,
    )


class ResponsesStreamParser:
    """One response's named events -> normalized stream events.

    Output text parts, refusal parts (a text block marked ``refusal``) and function calls are
    blocks, numbered in order of arrival; a text part's annotations are its citations. A
    reasoning item becomes one opaque block when its ``output_item.done`` arrives (its final
    ``encrypted_content`` is only there), and so does a web search call (its action and outcome
    are only there): a break inside either leaves nothing to discard.
    Events about parts or items this parser never saw open (a native resume starts after
    them) are read as going on in them: a text delta opens a text block.

    The parser follows the ``sequence_number`` cursor: ``resume_point()`` is the last event
    after which no function call was half received, so a resume from there re-sends a cut
    call whole and the kept blocks are exactly the state at that event.
    """

    __slots__ = (
        "_blocks", "_calls_open", "_clean_seq", "_last_seq", "_next", "_open", "_pairs", "_refused", "_response_id",
    )  # fmt: skip

    def __init__(self) -> None:
        self._pairs = SplitPairs()
        self._blocks: dict[tuple[str, int], int] = {}  # (item id, content index) -> block index
        self._open: set[int] = set()
        self._next = 0
        self._response_id: str | None = None
        self._last_seq: int | None = None
        self._clean_seq: int | None = None
        self._calls_open: set[str] = set()  # function-call item ids whose arguments are still arriving
        self._refused = False

    def resume_point(self, response_id: str | None = None) -> ResumePoint | None:
        """Where to re-attach; ``response_id`` names the response when this stream did not
        (a resumed stream may start after every event that carries it)."""
        response_id = self._response_id or response_id
        if response_id is None or self._clean_seq is None:
            return None
        return ResumePoint(response_id, self._clean_seq)

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        data = event.data
        payload = self._pairs.event_object(data, f"responses {event.event!r} event")
        try:
            out = self._pairs.settle(self._event(payload))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ParseError(f"responses event has the wrong shape ({exc!r}): {excerpt(data)}") from None
        seq = payload.get("sequence_number")
        if type(seq) is int:
            self._last_seq = seq
            # not while events are held back (half a character): a resume re-sends them
            if not self._calls_open and not self._pairs.holding:
                self._clean_seq = seq
        return out

    def _event(self, payload: dict[str, Any]) -> list[StreamEvent]:
        kind = payload.get("type")
        if kind == "response.output_text.delta" or kind == "response.refusal.delta":
            return self._text(payload, kind == "response.refusal.delta")
        if kind == "response.function_call_arguments.delta":
            block = self._blocks.get((payload["item_id"], -1))
            if block is None:
                raise KeyError(f"arguments for function call {payload['item_id']!r} that never started")
            delta = payload["delta"]
            if type(delta) is not str:
                raise TypeError("delta is not a string")
            return [ToolArgsDelta(block, delta)] if delta else []
        if kind == "response.output_text.annotation.added":
            return self._annotation(payload)
        if kind == "response.content_part.added":
            part = payload["part"]
            if part.get("type") in ("output_text", "refusal"):
                return self._open_text(payload["item_id"], payload["content_index"], part.get("type") == "refusal")
            return []
        if kind == "response.content_part.done":
            return self._close(payload["item_id"], payload["content_index"])
        if kind == "response.output_item.added":
            return self._item_added(payload["item"])
        if kind == "response.output_item.done":
            return self._item_done(payload["item"])
        if kind == "response.created":
            response = payload["response"]
            self._response_id = response.get("id") or None
            return [MessageStart(message_id=self._response_id, model=response.get("model") or None)]
        if kind in ("response.queued", "response.in_progress"):
            if self._response_id is None:  # a resumed stream starts after response.created
                self._response_id = payload["response"].get("id") or None
            return []
        if kind == "response.completed":
            return self._end(payload["response"], None)
        if kind == "response.incomplete":
            response = payload["response"]
            details = response.get("incomplete_details") or {}
            raw = details.get("reason") if isinstance(details, dict) else None
            return self._end(response, str(raw) if raw else "incomplete")
        if kind == "response.failed":
            error = payload["response"].get("error") or {}
            return [_error_event(error if isinstance(error, dict) else {"message": str(error)})]
        if kind == "error":
            nested = payload.get("error")
            return [_error_event(nested if isinstance(nested, dict) else payload)]
        # reasoning summaries, text.done, arguments.done, a web search's progress events: what
        # they carry arrives whole in the events handled above
        return []

    def _text(self, payload: dict[str, Any], refusal: bool) -> list[StreamEvent]:
        delta = payload["delta"]
        if type(delta) is not str:
            raise TypeError("delta is not a string")
        key = (payload["item_id"], payload["content_index"])
        out: list[StreamEvent] = []
        if key not in self._blocks:
            out.extend(self._open_text(*key, refusal))
        if delta:
            # a refusal's deltas have no logprobs; an output text's has them when the request's
            # ``include`` asked for them
            logprobs = () if refusal else tuple(logprob_entries(payload.get("logprobs")))
            out.append(TextDelta(self._blocks[key], delta, logprobs))
        return out

    def _annotation(self, payload: dict[str, Any]) -> list[StreamEvent]:
        """An annotation of an output text part (a ``url_citation``: its ``start_index`` and
        ``end_index`` count characters of that part's text) is a citation of its text block.
        Only these events are read: the done events and ``response.completed`` repeat them."""
        annotation = payload["annotation"]
        if type(annotation) is not dict:
            raise TypeError("annotation is not an object")
        key = (payload["item_id"], payload["content_index"])
        out: list[StreamEvent] = [] if key in self._blocks else self._open_text(*key, False)
        out.append(CitationDelta(self._blocks[key], annotation))
        return out

    def _open_text(self, item_id: str, content_index: int, refusal: bool) -> list[StreamEvent]:
        """A text block for an output text or a refusal part (marked as one, so that a client's
        wire format can put it where its API puts a refusal)."""
        out: list[StreamEvent] = []
        if refusal and not self._refused:
            self._refused = True
            out.append(StopReason("refusal", "refusal"))
        key = (item_id, content_index)
        if key in self._blocks:
            return out
        block = self._blocks[key] = self._new_block()
        out.append(BlockStart(block, "text", refusal=refusal))
        return out

    def _new_block(self) -> int:
        block = self._next
        self._next += 1
        self._open.add(block)
        return block

    def _close(self, item_id: str, content_index: int) -> list[StreamEvent]:
        block = self._blocks.get((item_id, content_index))
        if block is None or block not in self._open:
            return []
        self._open.discard(block)
        return [BlockStop(block)]

    def _item_added(self, item: dict[str, Any]) -> list[StreamEvent]:
        if item.get("type") != "function_call":
            return []
        item_id = item["id"]
        call_id, name = item.get("call_id"), item.get("name")
        if not optional_strings(name, call_id):
            raise TypeError("a function call's name or call_id is not a string")
        self._calls_open.add(item_id)
        block = self._blocks[(item_id, -1)] = self._new_block()
        out: list[StreamEvent] = [BlockStart(block, "tool_use", id=call_id, name=name)]
        if item.get("arguments"):
            out.append(ToolArgsDelta(block, item["arguments"]))
        return out

    def _item_done(self, item: dict[str, Any]) -> list[StreamEvent]:
        kind = item.get("type")
        if kind == "function_call":
            self._calls_open.discard(item["id"])
            return self._close(item["id"], -1)
        if kind == "message":
            out: list[StreamEvent] = []
            for index in range(len(item.get("content") or ())):
                out.extend(self._close(item["id"], index))
            return out
        if kind in (REASONING, WEB_SEARCH_CALL):
            block = self._next
            self._next += 1
            # a web search's status says how it ended (completed, failed): kept
            data = {k: v for k, v in item.items() if k != "status" or kind == WEB_SEARCH_CALL}
            return [BlockStart(block, REASONING, data=data), BlockStop(block)]
        return []

    def _end(self, response: dict[str, Any], incomplete: str | None) -> list[StreamEvent]:
        out: list[StreamEvent] = [BlockStop(b) for b in sorted(self._open)]
        self._open.clear()
        usage = response.get("usage")
        if usage:
            out.append(UsageUpdate(_usage(usage)))
        if self._refused:
            out.append(StopReason("refusal", incomplete or "completed"))
        elif incomplete is not None:
            out.append(StopReason(INCOMPLETE_REASONS.get(incomplete, incomplete), incomplete))
        else:
            calls = any(isinstance(i, dict) and i.get("type") == "function_call" for i in response.get("output") or ())
            out.append(StopReason("tool_use" if calls else "end_turn", "completed"))
        out.append(StreamEnd())
        return out


def _error_event(error: dict[str, Any]) -> ProviderErrorEvent:
    """``error`` (flat or nested) and ``response.failed``'s ``response.error``: the code is
    the most specific name the provider gives. The flat form's ``type`` is the event's own
    (``"error"``), so a flat error whose nullable ``code`` is null is named ``UNNAMED_ERROR``."""
    error_type = error.get("code") or error.get("type") or UNNAMED_ERROR
    return ProviderErrorEvent(error_type=str(error_type), message=str(error.get("message") or ""))


# -- requests -------------------------------------------------------------------------


def _user_part(block: dict[str, Any]) -> dict[str, Any]:
    btype = block.get("type")
    if btype == "text":
        return {"type": "input_text", "text": block["text"]}
    source = block.get("source")
    if btype == "image" and isinstance(source, dict) and source.get("type") == "base64":
        return {"type": "input_image", "image_url": f"data:{source['media_type']};base64,{source['data']}"}
    return dict(block)


def _user_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Tool results become ``function_call_output`` items (first: they answer the calls of
    the turn before); the rest is one user message."""
    content = message["content"]
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content:
        if block.get("type") == "tool_result":
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": block["tool_use_id"],
                    "output": text_of(block.get("content")),
                }
            )
        else:
            parts.append(_user_part(block))
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Text blocks -> an assistant ``message`` item of ``output_text`` parts; tool_use ->
    ``function_call`` items; reasoning items as they came (with ``encrypted_content``);
    other providers' thinking is dropped (Responses cannot take it)."""
    content = message["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] | None = None
    for block in content:
        btype = block.get("type")
        if btype == "text":
            if parts is None:
                parts = []
                out.append({"type": "message", "role": "assistant", "content": parts})
            parts.append({"type": "output_text", "text": block["text"]})
            continue
        parts = None
        if btype == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            out.append({"type": "function_call", "call_id": block["id"], "name": block["name"], "arguments": arguments})
        elif btype == REASONING:
            out.append({k: v for k, v in block.items() if k in ("type", "id", "summary", "encrypted_content")})
    return out


def _included(asked: Any) -> list[Any]:
    """``include``: what the client asked for (``message.output_text.logprobs``...) and the
    reasoning's encrypted content, which a stateless continuation needs to pass back."""
    listed = list(asked) if isinstance(asked, list) else []
    return listed if ENCRYPTED_REASONING in listed else [*listed, ENCRYPTED_REASONING]


def _input(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in request.messages:
        role = message["role"]
        if role == "user":
            out.extend(_user_items(message))
        elif role == "assistant":
            out.extend(_assistant_items(message))
        else:  # system/developer messages placed in the conversation
            out.append({"role": role, "content": text_of(message["content"])})
    return out


class OpenAIResponsesAdapter(ContinueMessageOnly):
    """Translates between the canonical conversation and the Responses API."""

    name = "openai-responses"

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self._chat = OpenAIChatAdapter(config)  # the same error vocabulary

    @property
    def native_resume(self) -> bool:
        return self.config.native_resume

    def _headers(self, *, json_body: bool) -> dict[str, str]:
        config = self.config
        headers = azure_headers(config) if config.azure else {"Authorization": f"Bearer {config.api_key}"}
        if json_body:
            headers["content-type"] = "application/json"
        headers["accept"] = "text/event-stream"
        headers.update(config.extra_headers)
        return headers

    def _url(self, path: str) -> str:
        config = self.config
        if config.azure:
            return azure_url(config, path)
        return f"{config.base_url.rstrip('/')}{path}"

    def _model(self, model: str) -> str:
        return deployment(self.config, model) if self.config.azure else model

    def build_request(self, request: ModelRequest) -> HTTPRequest:
        """Without native resume the response is not stored (``store: false``), so reasoning
        items come back with their ``encrypted_content`` to be sent back in full."""
        body: dict[str, Any] = {
            "model": self._model(request.model),
            "input": _input(request),
            "stream": True,
            "max_output_tokens": request.max_tokens,
        }
        if request.system:
            body["instructions"] = request.system
        if self.native_resume:
            body["background"] = True
            body["store"] = True
        else:
            body["store"] = False
        if request.tools:
            body["tools"] = [
                {"type": "function", "name": t.name, "description": t.description, "parameters": t.input_schema}
                for t in request.tools
            ]
        if request.temperature is not None:
            body["temperature"] = request.temperature
        body.update(request.extra)
        if not self.native_resume:
            body["include"] = _included(request.extra.get("include"))
        return HTTPRequest("POST", self._url("/responses"), self._headers(json_body=True), body)

    def resume_request(self, point: ResumePoint) -> HTTPRequest:
        """Re-attach to a background response after event ``point.after``."""
        path = f"/responses/{quote(point.response_id, safe='')}"
        url = self._url(path)
        url += ("&" if "?" in url else "?") + f"stream=true&starting_after={point.after}"
        return HTTPRequest("GET", url, self._headers(json_body=False), {})

    def cancel_request(self, response_id: str) -> HTTPRequest:
        """Stop a background response (a cancelled run): it would otherwise go on generating."""
        return HTTPRequest(
            "POST", self._url(f"/responses/{quote(response_id, safe='')}/cancel"), self._headers(json_body=True), {}
        )

    def new_parser(self) -> ResponsesStreamParser:
        return ResponsesStreamParser()

    def classify_http_error(self, status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
        """As Chat Completions (quota 429s and context overflows are permanent); a 404 is
        ``not_found``: on a re-attach, the response is gone."""
        error = self._chat.classify_http_error(status, headers, body)
        return replace(error, kind="not_found") if status == 404 else error

    def classify_stream_error(self, event: ProviderErrorEvent) -> ProviderError:
        """As Chat Completions: server trouble and rate limits are worth another try, the rest is
        permanent. An error that names nothing (``code: null``) is judged by its message, else
        retried: it is more likely server trouble than not, and the continuation budget bounds
        the cost of being wrong (as for Anthropic's unknown error types)."""
        error = self._chat.classify_stream_error(event)
        if event.error_type == UNNAMED_ERROR and error.kind == "provider_error":
            return replace(error, error_class=ErrorClass.RETRYABLE, kind="server_error")
        return error

    @property
    def text_delta_is_token(self) -> bool:
        """One ``output_text.delta`` per sampled token, as in Chat Completions; not on Azure,
        whose content filter buffers many tokens into a delta."""
        return not self.config.azure

    @property
    def min_max_tokens(self) -> int:
        """``max_output_tokens`` below 16 is a 400 ("integer_below_min_value")."""
        return MIN_OUTPUT_TOKENS

    def thinking_rule(self, model: str) -> ThinkingRule:
        """Responses takes no thinking budget: none is sent."""
        return UNSENT_THINKING
