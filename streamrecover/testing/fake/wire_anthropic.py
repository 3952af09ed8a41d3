"""A planned answer as the Anthropic Messages API sends it, byte for byte.

Mimics the documented and recorded Messages streams:
compact JSON padded the way the API has padded it since September 2025 (up to 15 spaces
before the final ``}`` of most payloads; ``ping`` never, and spelled ``{"type": "ping"}``),
``ping`` right after the first ``content_block_start``, an empty ``input_json_delta`` opening
a tool call (a server tool call too, its result sent whole in its start), an empty
``thinking_delta`` before the signature, input usage in
``message_start``, cumulative usage in ``message_delta`` (the input and cache counts
repeated beside the output count), and the documented ``event: error`` frame.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .model import BlockKind, Plan, PlannedBlock, slice_block, stable_token
from .wire import ErrorSpec, ResponseContext, WireEvent, compact, spaced, sse

PING = sse('{"type": "ping"}', "ping")
DEFAULT_MESSAGES = {
    "invalid_request_error": "Invalid request.",
    "authentication_error": "invalid x-api-key",
    "billing_error": "Your credit balance is too low to access the Anthropic API.",
    "permission_error": "Your API key does not have permission to use the specified resource.",
    "not_found_error": "The requested resource could not be found.",
    "request_too_large": "Request exceeds the maximum allowed number of bytes.",
    "rate_limit_error": "This request would exceed the rate limit for your organization. Please try again later.",
    "api_error": "Internal server error",
    "timeout_error": "Request timed out",
    "overloaded_error": "Overloaded",
}
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_SPEND_LIMIT = (
    "You have exceeded your organization's spend limit. Please increase the limit or wait until it resets "
    "before making further requests."
)
_STOP_DETAILS_REFUSAL = {"type": "refusal", "category": None, "explanation": None}
# The padding before a payload's final "}": 1 to 15 spaces, about evenly, in the recordings;
# 0 (none) stands for the few payloads they leave unpadded.
MAX_PADDING = 15


def message_id(ctx: ResponseContext) -> str:
    return "msg_01" + stable_token("message", ctx.seed, length=22)


def stream_events(plan: Plan, ctx: ResponseContext) -> list[WireEvent]:
    """Every SSE event of the answer, from ``message_start`` to ``message_stop``."""
    encode = _padder(ctx.seed)
    start = {
        "type": "message_start",
        "message": {
            "id": message_id(ctx),
            "type": "message",
            "role": "assistant",
            "model": ctx.model,
            "stop_sequence": None,
            "usage": _start_usage(ctx.input_tokens),
            "content": [],
            "stop_reason": None,
        },
    }
    events = [sse(encode(start), "message_start")]
    for index, block in enumerate(plan.blocks):
        opening = {"type": "content_block_start", "index": index, "content_block": _opening(block)}
        events.append(sse(encode(opening), "content_block_start"))
        if index == 0:
            events.append(PING)
        events.extend(_deltas(index, block, encode))
        events.append(sse(encode({"type": "content_block_stop", "index": index}), "content_block_stop"))
    if not plan.blocks:
        events.append(PING)
    delta: dict[str, Any] = {"stop_reason": plan.stop_reason, "stop_sequence": None}
    if plan.stop_reason == "refusal":
        delta["stop_details"] = _STOP_DETAILS_REFUSAL
    usage = _usage(ctx.input_tokens, plan.output_tokens)  # cumulative: the input side repeated
    events.append(sse(encode({"type": "message_delta", "delta": delta, "usage": usage}), "message_delta"))
    events.append(sse(encode({"type": "message_stop"}), "message_stop"))
    return events


def _padder(seed: str) -> Callable[[Any], str]:
    """Compact JSON with the real API's padding before its final ``}``, the same for the same
    request (the fake is deterministic): a client must read the JSON, not match its end."""
    digest = hashlib.sha256(f"padding\x00{seed}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))

    def encode(payload: Any) -> str:
        text = compact(payload)
        return text[:-1] + " " * rng.randint(0, MAX_PADDING) + "}"

    return encode


def response_json(plan: Plan, ctx: ResponseContext) -> dict[str, Any]:
    """The non-streaming response body."""
    return {
        "id": message_id(ctx),
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": [_whole(block) for block in plan.blocks],
        "stop_reason": plan.stop_reason,
        "stop_sequence": None,
        "usage": _usage(ctx.input_tokens, plan.output_tokens),
    }


def error_body(spec: ErrorSpec, request_id: str) -> bytes:
    error: dict[str, Any] = {"type": spec.error_type, "message": spec.message}
    if spec.details is not None:
        error["details"] = dict(spec.details)
    return compact({"type": "error", "error": error, "request_id": request_id}).encode()


def error_event(error_type: str | None, message: str | None, *, after: WireEvent | None = None) -> WireEvent:
    """The documented mid-stream error frame (HTTP status stays 200)."""
    kind = error_type or "overloaded_error"
    return sse(spaced({"type": "error", "error": {"type": kind, "message": message or _message(kind)}}), "error")


def status_error(status: int, error_type: str | None, message: str | None, *, quota: bool) -> ErrorSpec:
    """An HTTP error; ``quota`` gives the spend-limit 429 that must not be retried."""
    if quota:
        details = {"error_code": "enforced_spend_limit_reached"}
        return ErrorSpec(status, error_type or "rate_limit_error", message or _SPEND_LIMIT, details=details)
    kind = error_type or _TYPE_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return ErrorSpec(status, kind, message or _message(kind))


def authenticate(headers: Mapping[str, str]) -> ErrorSpec | None:
    """Any non-empty key passes; a missing one gets the real 401 (``Authorization: Bearer`` also works)."""
    if headers.get("x-api-key", "").strip():
        return None
    if headers.get("authorization", "").removeprefix("Bearer ").strip():
        return None
    return ErrorSpec(401, "authentication_error", "x-api-key header is required")


def check_headers(headers: Mapping[str, str]) -> ErrorSpec | None:
    if not headers.get("anthropic-version", "").strip():
        return ErrorSpec(400, "invalid_request_error", "anthropic-version: header is required")
    return None


def response_headers(request_id: str) -> list[tuple[str, str]]:
    return [("request-id", request_id), ("anthropic-organization-id", "fake-org")]


BAD_JSON = ErrorSpec(400, "invalid_request_error", "There was an error parsing the body of your request: invalid JSON")
BAD_CONTENT_TYPE = ErrorSpec(400, "invalid_request_error", "Content-Type must be application/json")


def _message(kind: str) -> str:
    return DEFAULT_MESSAGES.get(kind, "Internal server error")


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
    }


def _start_usage(input_tokens: int) -> dict[str, Any]:
    """``message_start``'s usage as recorded since September 2025: the cache split by lifetime,
    a small first output count and the service tier."""
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": 1,
        "service_tier": "standard",
    }


def rest_after(plan: Plan, sent_back: Sequence[Sequence[Mapping[str, Any]]]) -> Plan | None:
    """The rest of the answer after the assistant messages that hold its beginning (``sent_back``:
    each one's blocks, in order: a paused answer sent back, or the rounds a continue message
    followed), or None when they are not the answer's beginning. The model goes on from their
    whole content: every block as the API sent it, but a text block may end cut off with its
    message and go on at the start of the next one, as often as the answer broke (after a
    continue message a piece of text carries no citations of its own)."""
    index, cut = 0, 0  # the planned block the answer has reached, and the characters of its text sent
    for blocks in sent_back:
        for position, sent in enumerate(blocks):
            planned = plan.blocks[index] if index < len(plan.blocks) else None
            if planned is not None and cut and cut == len(planned.content):
                index, cut = index + 1, 0  # a text block ended where a message did: the next one follows
                planned = plan.blocks[index] if index < len(plan.blocks) else None
            if planned is None:
                return None
            if not cut and dict(sent) == _whole(planned):
                index += 1
                continue
            text = sent.get("text")
            if planned.kind is not BlockKind.TEXT or not isinstance(text, str) or not text:
                return None
            if not planned.content.startswith(text, cut):
                return None
            if cut and cut + len(text) == len(planned.content):
                index, cut = index + 1, 0  # the text cut off in an earlier message, finished in this one
            elif position == len(blocks) - 1:
                cut += len(text)  # cut off where its message ends
            else:
                return None
    if cut:
        return Plan((slice_block(plan.blocks[index], cut), *plan.blocks[index + 1 :]), plan.stop_reason)
    return Plan(plan.blocks[index:], plan.stop_reason)


def _opening(block: PlannedBlock) -> dict[str, Any]:
    if block.kind is BlockKind.THINKING:
        return {"type": "thinking", "thinking": "", "signature": ""}
    if block.kind is BlockKind.TOOL_USE:
        return {"type": "tool_use", "id": block.call_id, "name": block.name, "input": {}}
    if block.kind is BlockKind.SERVER_TOOL_USE:
        return {"type": "server_tool_use", "id": block.call_id, "name": block.name, "input": {}}
    if block.kind is BlockKind.SEARCH_RESULT:
        return _whole(block)
    return {"type": "text", "text": "", "citations": []} if block.cited else {"type": "text", "text": ""}


def _whole(block: PlannedBlock) -> dict[str, Any]:
    if block.kind is BlockKind.THINKING:
        return {"type": "thinking", "thinking": block.content, "signature": block.signature}
    if block.kind is BlockKind.TOOL_USE:
        return {"type": "tool_use", "id": block.call_id, "name": block.name, "input": json.loads(block.content)}
    if block.kind is BlockKind.SERVER_TOOL_USE:
        return {"type": "server_tool_use", "id": block.call_id, "name": block.name, "input": json.loads(block.content)}
    if block.kind is BlockKind.SEARCH_RESULT:
        return {
            "type": "web_search_tool_result",
            "tool_use_id": block.call_id,
            "content": [dict(r) for r in block.results],
        }
    if block.cited:
        return {"type": "text", "text": block.content, "citations": [dict(c) for c in block.citations]}
    return {"type": "text", "text": block.content}


def _delta(
    index: int, delta: dict[str, Any], encode: Callable[[Any], str], *, tokens: int = 0, text: str = ""
) -> WireEvent:
    payload = {"type": "content_block_delta", "index": index, "delta": delta}
    return sse(encode(payload), "content_block_delta", tokens=tokens, text=text)


def _deltas(index: int, block: PlannedBlock, encode: Callable[[Any], str]) -> list[WireEvent]:
    if block.kind is BlockKind.THINKING:
        events = [_delta(index, {"type": "thinking_delta", "thinking": p}, encode, tokens=1) for p in block.pieces]
        events.append(_delta(index, {"type": "thinking_delta", "thinking": ""}, encode))
        events.append(_delta(index, {"type": "signature_delta", "signature": block.signature}, encode))
        return events
    if block.kind is BlockKind.SEARCH_RESULT:
        return []  # sent whole in its start
    if block.kind in (BlockKind.TOOL_USE, BlockKind.SERVER_TOOL_USE):
        events = [_delta(index, {"type": "input_json_delta", "partial_json": ""}, encode)]
        events.extend(
            _delta(index, {"type": "input_json_delta", "partial_json": p}, encode, tokens=1) for p in block.pieces
        )
        return events
    events = [_delta(index, {"type": "citations_delta", "citation": dict(c)}, encode) for c in block.citations]
    events.extend(_delta(index, {"type": "text_delta", "text": p}, encode, tokens=1, text=p) for p in block.pieces)
    return events
