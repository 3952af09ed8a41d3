"""A planned answer as OpenAI Chat Completions sends it, byte for byte.

Mimics the recorded Chat Completions streams: unnamed
``data:`` chunks with the same id/created on each, a first chunk carrying the role,
tool calls by ``index`` with id and name only on their first fragment, an empty-delta
``finish_reason`` chunk, the optional usage chunk with ``choices: []``, then
``data: [DONE]``. A mid-stream error is a ``data: {"error": ...}`` chunk.

As the 2025-26 recordings do, every chunk carries ``service_tier`` and a random-length
``obfuscation`` string (unless the request sets ``stream_options.include_obfuscation``
false), and with ``include_usage`` every chunk before the usage chunk has ``"usage":null``.
With ``logprobs: true`` the first chunk and each text chunk carry ``logprobs`` as the recordings
do (deterministic values, ``top_logprobs`` as many as asked); without it, ``null``.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from .model import BlockKind, Plan, PlannedBlock, stable_token
from .wire import ErrorSpec, ResponseContext, WireEvent, compact, spaced, sse

DONE = sse("[DONE]")
BAD_JSON = ErrorSpec(
    400,
    "invalid_request_error",
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP "
    "library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have "
    "trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)",
)
BAD_CONTENT_TYPE = BAD_JSON
_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "refusal": "stop", "max_tokens": "length"}
_STATUS_ERRORS = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided: sk-fake***."),
    403: (
        "invalid_request_error",
        "unsupported_country_region_territory",
        "Country, region, or territory not supported.",
    ),
    404: ("invalid_request_error", "model_not_found", "The model does not exist or you do not have access to it."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests. Please try again later."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later"),
}
_QUOTA = (
    "insufficient_quota",
    "insufficient_quota",
    "You exceeded your current quota, please check your plan and billing details. For more information on this "
    "error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
)
_SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"


def completion_id(ctx: ResponseContext) -> str:
    return "chatcmpl-" + stable_token("completion", ctx.seed, length=29)


def stream_events(plan: Plan, ctx: ResponseContext) -> list[WireEvent]:
    """Every chunk of the answer, through ``data: [DONE]``."""
    head = {
        "id": completion_id(ctx),
        "object": "chat.completion.chunk",
        "created": _created(ctx),
        "model": ctx.model,
        "service_tier": "default",
        "system_fingerprint": _fingerprint(ctx),
    }
    tail = _Tail(ctx)
    logprobs = Logprobs.asked(ctx)

    def chunk(
        delta: Mapping[str, Any],
        finish: str | None = None,
        *,
        tokens: int = 0,
        text: str = "",
        scored: dict[str, Any] | None = None,
    ) -> WireEvent:
        choice = {"index": 0, "delta": delta, "logprobs": scored, "finish_reason": finish}
        usage = {"usage": None} if ctx.include_usage else {}
        return sse(compact({**head, "choices": [choice], **usage, **tail.next()}), tokens=tokens, text=text)

    blocks = [b for b in plan.blocks if b.kind is not BlockKind.THINKING]
    calls = [b for b in blocks if b.kind is BlockKind.TOOL_USE]
    events: list[WireEvent] = []
    reasoning = [b for b in plan.blocks if b.kind is BlockKind.THINKING]
    if reasoning:  # DeepSeek's reasoner: reasoning_content deltas first, then the answer
        events.append(chunk({"role": "assistant", "content": None, "reasoning_content": ""}))
        events.extend(
            chunk({"content": None, "reasoning_content": p}, tokens=1) for b in reasoning for p in b.pieces if p
        )
    if plan.stop_reason == "refusal":
        events.append(chunk({"role": "assistant", "content": None, "refusal": ""}, scored=logprobs.of("refusal")))
        pieces = [p for b in blocks for p in b.pieces]
        events.extend(chunk({"refusal": p}, tokens=1, text=p, scored=logprobs.of("refusal", [p])) for p in pieces)
    else:
        if blocks and blocks[0].kind is BlockKind.TOOL_USE:
            first = {"role": "assistant", "content": None, "tool_calls": [_call_start(0, calls[0])], "refusal": None}
            events.append(chunk(first))
        else:
            events.append(chunk({"role": "assistant", "content": "", "refusal": None}, scored=logprobs.of("content")))
        for block in blocks:
            if block.kind is BlockKind.TEXT:
                events.extend(
                    chunk({"content": p}, tokens=1, text=p, scored=logprobs.of("content", [p])) for p in block.pieces
                )
                continue
            index = calls.index(block)
            if index or blocks[0].kind is not BlockKind.TOOL_USE:
                events.append(chunk({"tool_calls": [_call_start(index, block)]}))
            for piece in block.pieces:
                events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, tokens=1))
    events.append(chunk({}, _FINISH.get(plan.stop_reason, "stop")))
    if ctx.include_usage:
        usage = _usage(ctx.input_tokens, plan)
        events.append(sse(compact({**head, "choices": [], "usage": usage, **tail.next()})))
    events.append(DONE)
    return events


# Tokens the fake offers as the likelier alternatives to the one it wrote (``top_logprobs``).
_ALTERNATIVES = (" the", ",", " and", ".", " of", " a", " to", " in", "\n", " is", " it", " that")


class Logprobs:
    """``choices[0].logprobs`` as the API sends it when the request set ``logprobs: true``: on the
    first chunk and on each text chunk, ``{"content": [...], "refusal": null}`` (a refusal's under
    ``refusal``, ``content`` null), one entry per text chunk (each is one token), its
    ``top_logprobs`` as many as asked; None otherwise. Values are derived from the request and the
    token's position, so the same request always gets the same ones."""

    def __init__(self, seed: str, top: int | None) -> None:
        self.seed = seed
        self.top = top  # None: not asked for
        self.position = 0

    @classmethod
    def asked(cls, ctx: ResponseContext) -> Logprobs:
        top = ctx.options.get("top_logprobs")
        on = ctx.options.get("logprobs") is True
        return cls(ctx.seed, (top if isinstance(top, int) else 0) if on else None)

    def of(self, kind: str, tokens: Sequence[str] = ()) -> dict[str, Any] | None:
        """The object for a chunk (or a whole answer) of ``kind`` (content or refusal) with ``tokens``."""
        if self.top is None:
            return None
        entries = [self.entry(token, self.top) for token in tokens]
        return {"content": None, "refusal": entries} if kind == "refusal" else {"content": entries, "refusal": None}

    def entry(self, token: str, top_count: int) -> dict[str, Any]:
        """The next token's entry in Chat's shape (the Responses dialect reshapes it)."""
        self.position += 1
        chosen = -(1 + zlib.crc32(f"{self.seed}\x00logprob\x00{self.position}".encode()) % 300_000) / 100_000
        alternatives = [t for t in _ALTERNATIVES if t != token][: max(0, top_count - 1)]
        top = [{"token": token, "logprob": chosen, "bytes": list(token.encode())}] if top_count else []
        top.extend(
            {"token": t, "logprob": round(chosen - 1.5 * (k + 1), 5), "bytes": list(t.encode())}
            for k, t in enumerate(alternatives)
        )
        return {"token": token, "logprob": chosen, "bytes": list(token.encode()), "top_logprobs": top}


class _Tail:
    """The ``obfuscation`` field that ends each chunk: a base62 string of 1 to 15 characters
    (the recordings' range), the same for the same request; nothing when the request turned
    it off."""

    def __init__(self, ctx: ResponseContext) -> None:
        options = ctx.options.get("stream_options")
        self.on = not (isinstance(options, Mapping) and options.get("include_obfuscation") is False)
        self.seed = ctx.seed
        self.count = 0

    def next(self) -> dict[str, str]:
        if not self.on:
            return {}
        self.count += 1
        length = 1 + zlib.crc32(f"{self.seed}\x00{self.count}".encode()) % 15
        return {"obfuscation": stable_token("obfuscation", self.seed, str(self.count), length=length)}


def response_json(plan: Plan, ctx: ResponseContext) -> dict[str, Any]:
    """The non-streaming response body."""
    blocks = [b for b in plan.blocks if b.kind is not BlockKind.THINKING]
    text = "".join(b.content for b in blocks if b.kind is BlockKind.TEXT)
    refused = plan.stop_reason == "refusal"
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if refused else text,
        "refusal": text if refused else None,
    }
    calls = [b for b in blocks if b.kind is BlockKind.TOOL_USE]
    if calls:
        message["tool_calls"] = [
            {"id": b.call_id, "type": "function", "function": {"name": b.name, "arguments": b.content}} for b in calls
        ]
    pieces = [p for b in blocks if b.kind is BlockKind.TEXT for p in b.pieces]
    scored = Logprobs.asked(ctx).of("refusal" if refused else "content", pieces)
    return {
        "id": completion_id(ctx),
        "object": "chat.completion",
        "created": _created(ctx),
        "model": ctx.model,
        "choices": [
            {"index": 0, "message": message, "logprobs": scored, "finish_reason": _FINISH.get(plan.stop_reason, "stop")}
        ],
        "usage": _usage(ctx.input_tokens, plan),
        "system_fingerprint": _fingerprint(ctx),
    }


def error_body(spec: ErrorSpec, request_id: str) -> bytes:
    error = {"message": spec.message, "type": spec.error_type, "param": spec.param, "code": spec.code}
    return compact({"error": error}).encode()


def error_event(error_type: str | None, message: str | None, *, after: WireEvent | None = None) -> WireEvent:
    """A mid-stream error chunk (HTTP status stays 200)."""
    error = {"message": message or _SERVER_ERROR, "type": error_type or "server_error", "param": None, "code": None}
    return sse(spaced({"error": error}))


def status_error(status: int, error_type: str | None, message: str | None, *, quota: bool) -> ErrorSpec:
    """An HTTP error; ``quota`` gives the ``insufficient_quota`` 429 that must not be retried."""
    kind, code, default = _QUOTA if quota else _STATUS_ERRORS.get(status, ("server_error", None, _SERVER_ERROR))
    return ErrorSpec(status, error_type or kind, message or default, code=code)


def authenticate(headers: Mapping[str, str]) -> ErrorSpec | None:
    """Any non-empty bearer token passes; a missing one gets the real 401."""
    if headers.get("authorization", "").removeprefix("Bearer ").strip():
        return None
    return ErrorSpec(
        401,
        "invalid_request_error",
        "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer "
        "auth (i.e. Authorization: Bearer YOUR_KEY).",
    )


def authenticate_azure(headers: Mapping[str, str]) -> ErrorSpec | None:
    """Azure OpenAI takes the key in an ``api-key`` header; a missing one gets its 401."""
    if headers.get("api-key", "").strip():
        return None
    return ErrorSpec(
        401,
        "invalid_request_error",
        "Access denied due to missing subscription key. Make sure to include subscription key when making "
        "requests to an API.",
        code="401",
    )


# Azure's prompt content-filter verdict, as its first chunk carries it: nothing filtered.
_SAFE = {"filtered": False, "severity": "safe"}
_PROMPT_FILTER_RESULTS = [
    {
        "prompt_index": 0,
        "content_filter_results": {"hate": _SAFE, "self_harm": _SAFE, "sexual": _SAFE, "violence": _SAFE},
    }
]


def stream_events_azure(plan: Plan, ctx: ResponseContext) -> list[WireEvent]:
    """Azure OpenAI's Chat stream: first a chunk with no choices and empty fields that carries
    the prompt's content-filter results, then the answer's chunks as OpenAI sends them."""
    opening = {"choices": [], "created": 0, "id": "", "model": "", "object": ""}
    return [sse(compact({**opening, "prompt_filter_results": _PROMPT_FILTER_RESULTS})), *stream_events(plan, ctx)]


def check_headers(headers: Mapping[str, str]) -> ErrorSpec | None:
    return None


def response_headers(request_id: str) -> list[tuple[str, str]]:
    return [("x-request-id", request_id), ("openai-processing-ms", "1"), ("openai-version", "2020-10-01")]


def _created(ctx: ResponseContext) -> int:
    return 1_727_000_000 + zlib.crc32(ctx.seed.encode()) % 10_000_000


def _fingerprint(ctx: ResponseContext) -> str:
    return "fp_" + stable_token("fingerprint", ctx.seed, length=10).lower()


def _usage(prompt_tokens: int, plan: Plan) -> dict[str, Any]:
    """The reasoning deltas are part of ``completion_tokens`` and counted apart too, as a reasoning
    model's usage shows them."""
    reasoning = sum(1 for b in plan.blocks if b.kind is BlockKind.THINKING for p in b.pieces if p)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": plan.output_tokens,
        "total_tokens": prompt_tokens + plan.output_tokens,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def _call_start(index: int, block: PlannedBlock) -> dict[str, Any]:
    return {"index": index, "id": block.call_id, "type": "function", "function": {"name": block.name, "arguments": ""}}
