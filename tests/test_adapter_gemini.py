"""The Gemini adapter: parsing real-shaped chunks, building requests, classifying Google errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamrecover.engine.blocks import Accumulator, BlockStatus
from streamrecover.engine.contract import (
    CONTINUE_INSTRUCTION,
    HTTPRequest,
    ModelRequest,
    ProviderConfig,
    Strategy,
    ToolSpec,
)
from streamrecover.engine.errors import ErrorClass, ParseError
from streamrecover.engine.events import (
    AnswerMetadata,
    ProviderErrorEvent,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    UsageUpdate,
)
from streamrecover.engine.sse import SSEDecoder
from streamrecover.providers.gemini import GeminiAdapter, GeminiStreamParser
from streamrecover.providers.registry import get_adapter

MODEL = "gemini-2.5-flash"


def _chunk(parts: list[dict[str, Any]] | None, finish: str | None = None, usage: dict[str, Any] | None = None) -> str:
    candidate: dict[str, Any] = {}
    if parts is not None:
        candidate["content"] = {"parts": parts, "role": "model"}
    if finish:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    payload = {
        "candidates": [candidate],
        "usageMetadata": usage or {"promptTokenCount": 8, "totalTokenCount": 8},
        "modelVersion": MODEL,
        "responseId": "resp-1",
    }
    return "data: " + json.dumps(payload, separators=(",", ": ")) + "\r\n\r\n"


def parse(raw: str) -> tuple[list[StreamEvent], Accumulator]:
    decoder = SSEDecoder()
    parser = GeminiStreamParser()
    events = [e for sse in decoder.feed(raw.encode()) + decoder.close() for e in parser.feed(sse)]
    acc = Accumulator()
    for event in events:
        acc.apply(event)
    return events, acc


def adapter(**kw: Any) -> GeminiAdapter:
    return GeminiAdapter(
        ProviderConfig(name="gemini", base_url="https://generativelanguage.googleapis.com", api_key="AIza-secret", **kw)
    )


def test_text_chunks_then_stop_end_the_stream_with_usage() -> None:
    raw = _chunk([{"text": "Hello, "}]) + _chunk(
        [{"text": "wörld 🚀"}], "STOP", {"promptTokenCount": 8, "candidatesTokenCount": 5, "thoughtsTokenCount": 7}
    )
    events, acc = parse(raw)
    assert [b.to_content() for b in acc.blocks] == [{"type": "text", "text": "Hello, wörld 🚀"}]
    assert acc.stop_reason == "end_turn"
    assert acc.ended
    assert isinstance(events[-1], StreamEnd)
    final = [e for e in events if isinstance(e, UsageUpdate)][-1]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (8, 12)  # thoughts are billed as output
    assert final.usage.reasoning_tokens == 7  # and shown apart


def test_a_chunks_usage_comes_before_its_parts() -> None:
    """What a chunk's parts stream is counted in the usage the engine holds when it passes them on."""
    events, _ = parse(_chunk([{"text": "Hello"}], usage={"promptTokenCount": 8, "candidatesTokenCount": 2}))
    kinds = [type(e) for e in events if isinstance(e, UsageUpdate | TextDelta)]
    assert kinds == [UsageUpdate, TextDelta]


def test_the_candidates_metadata_is_passed_on_as_it_came() -> None:
    grounding = {
        "groundingChunks": [{"web": {"uri": "https://example.com/a", "title": "A"}}],
        "groundingSupports": [{"segment": {"endIndex": 5, "text": "Hello"}, "groundingChunkIndices": [0]}],
        "webSearchQueries": ["hello"],
    }
    ratings = [{"category": "HARM_CATEGORY_HARASSMENT", "probability": "NEGLIGIBLE"}]
    chunk = json.loads(_chunk([{"text": "Hello"}], "STOP")[6:])
    chunk["candidates"][0].update(
        finishMessage="Done.",
        safetyRatings=ratings,
        citationMetadata={"citationSources": [{"endIndex": 5, "uri": "https://example.com/b"}]},
        groundingMetadata=grounding,
    )
    events, _ = parse("data: " + json.dumps(chunk) + "\r\n\r\n")
    metadata = [e.values for e in events if isinstance(e, AnswerMetadata)]
    assert metadata == [
        {
            "finishMessage": "Done.",
            "safetyRatings": ratings,
            "citationMetadata": {"citationSources": [{"endIndex": 5, "uri": "https://example.com/b"}]},
            "groundingMetadata": grounding,
        }
    ]
    # a field of the wrong JSON type is left out, and a candidate with none sends nothing
    chunk["candidates"][0].update(finishMessage=7, groundingMetadata=["not", "an", "object"])
    events, _ = parse("data: " + json.dumps(chunk) + "\r\n\r\n")
    assert [set(e.values) for e in events if isinstance(e, AnswerMetadata)] == [{"safetyRatings", "citationMetadata"}]
    events, _ = parse(_chunk([{"text": "Hello"}], "STOP"))
    assert not [e for e in events if isinstance(e, AnswerMetadata)]


def test_a_stream_without_a_finish_reason_never_ends() -> None:
    events, acc = parse(_chunk([{"text": "Half an answ"}]))
    assert not acc.ended
    assert not any(isinstance(e, StreamEnd) for e in events)
    assert acc.blocks[0].status() is BlockStatus.PARTIAL


def test_function_calls_arrive_whole_with_their_signature() -> None:
    raw = _chunk([{"text": "Checking."}]) + _chunk(
        [
            {"functionCall": {"name": "get_weather", "args": {"city": "Zürich"}}, "thoughtSignature": "c2ln"},
            {"functionCall": {"name": "get_weather", "args": {"city": "Zürich"}}},
        ],
        "STOP",
    )
    _, acc = parse(raw)
    blocks = [b.to_content() for b in acc.blocks]
    assert blocks[0] == {"type": "text", "text": "Checking."}
    first, second = blocks[1], blocks[2]
    assert first["input"] == {"city": "Zürich"}
    assert first["signature"] == "c2ln"
    assert "signature" not in second
    assert first["id"] != second["id"]
    assert acc.stop_reason == "tool_use"
    # the same call gets the same id in another response (a continuation): stored == uninterrupted
    _, again = parse(_chunk([{"functionCall": {"name": "get_weather", "args": {"city": "Zürich"}}}], "STOP"))
    assert again.blocks[0].id == acc.blocks[1].id


def test_thought_parts_make_a_thinking_block_signed_when_the_signature_arrives() -> None:
    raw = (
        _chunk([{"text": "Let me think", "thought": True}])
        + _chunk([{"text": " hard.", "thought": True, "thoughtSignature": "U0lH"}])
        + _chunk([{"text": "Answer."}], "STOP")
    )
    _, acc = parse(raw)
    assert [b.to_content() for b in acc.blocks] == [
        {"type": "thinking", "thinking": "Let me think hard.", "signature": "U0lH"},
        {"type": "text", "text": "Answer."},
    ]
    # cut before the signature: the thought run is unsigned, so recovery drops it
    _, cut = parse(_chunk([{"text": "Let me think", "thought": True}]) + _chunk([{"text": "Ans"}]))
    assert cut.blocks[0].status() is BlockStatus.PARTIAL


@pytest.mark.parametrize("reason", ["SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII"])
def test_content_stops_are_content_filter_and_never_continued(reason: str) -> None:
    from streamrecover.engine.continuation import NEVER_CONTINUE_STOPS

    events, acc = parse(_chunk([{"text": "Partial"}]) + _chunk(None, reason))
    stop = next(e for e in events if isinstance(e, StopReason))
    assert stop == StopReason("content_filter", reason)
    assert acc.stop_reason in NEVER_CONTINUE_STOPS


def test_max_tokens_and_a_blocked_prompt() -> None:
    _, acc = parse(_chunk([{"text": "cut"}], "MAX_TOKENS"))
    assert acc.stop_reason == "max_tokens"
    blocked = 'data: {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 3}}\r\n\r\n'
    events, _ = parse(blocked)
    error = next(e for e in events if isinstance(e, ProviderErrorEvent))
    classified = adapter().classify_stream_error(error)
    assert classified.error_class is ErrorClass.PERMANENT
    assert "SAFETY" in classified.message


def test_bad_data_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse("data: {not json\r\n\r\n")
    with pytest.raises(ParseError):
        parse('data: {"candidates": [{"content": {"parts": [{"text": 5}]}}]}\r\n\r\n')


def test_request_shape_roles_tools_thinking_and_signatures() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Hmm.", "signature": "S1"},
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "gemini_call_abc",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                    "signature": "S1",
                },
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "gemini_call_abc", "content": "rainy"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "It is rai"}]},
        {"role": "user", "content": [{"type": "text", "text": CONTINUE_INSTRUCTION}]},
    ]
    tool = ToolSpec("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    request = adapter().build_request(
        ModelRequest(
            model=MODEL, messages=messages, max_tokens=500, system="Be brief.", tools=(tool,), thinking_budget=1024
        )
    )
    assert (
        request.url == f"https://generativelanguage.googleapis.com/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    )
    assert request.headers["x-goog-api-key"] == "AIza-secret"
    assert request.redacted()["headers"]["x-goog-api-key"] == "[redacted]"
    body = request.json
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert body["generationConfig"] == {
        "maxOutputTokens": 500,
        "thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": True},
    }
    assert body["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user", "model", "user"]
    model_parts = body["contents"][1]["parts"]
    assert model_parts[0] == {"text": "Hmm.", "thought": True}  # its signature goes once, on the call
    assert model_parts[2] == {
        "functionCall": {"name": "get_weather", "args": {"city": "Oslo"}},
        "thoughtSignature": "S1",
    }
    assert body["contents"][2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"result": "rainy"}}}
    ]
    assert body["contents"][4]["parts"] == [{"text": CONTINUE_INSTRUCTION}]


def test_continue_message_is_the_strategy_unless_overridden() -> None:
    assert adapter().continuation_strategy(MODEL, thinking=False) is Strategy.CONTINUE_MESSAGE
    assert (
        adapter(strategy_overrides={"gemini-*": "prefill"}).continuation_strategy(MODEL, thinking=False)
        is Strategy.PREFILL
    )
    assert isinstance(get_adapter(ProviderConfig(name="gemini", base_url="http://x")), GeminiAdapter)


def _google(code: int, status: str, message: str, details: list[dict[str, Any]] | None = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details is not None:
        error["details"] = details
    return json.dumps({"error": error}, indent=2).encode()


@pytest.mark.parametrize(
    ("status", "name", "message", "kind", "error_class"),
    [
        (429, "RESOURCE_EXHAUSTED", "You exceeded your current quota.", "rate_limited", ErrorClass.RETRYABLE),
        (503, "UNAVAILABLE", "The model is overloaded. Please try again later.", "overloaded", ErrorClass.RETRYABLE),
        (500, "INTERNAL", "An internal error has occurred.", "server_error", ErrorClass.RETRYABLE),
        (
            400,
            "INVALID_ARGUMENT",
            "API key not valid. Please pass a valid API key.",
            "invalid_request",
            ErrorClass.PERMANENT,
        ),
        (
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials.",
            "unauthorized",
            ErrorClass.PERMANENT,
        ),
        (
            403,
            "PERMISSION_DENIED",
            "Method doesn't allow unregistered callers.",
            "permission_denied",
            ErrorClass.PERMANENT,
        ),
        (
            404,
            "NOT_FOUND",
            "models/gemini-9 is not found for API version v1beta.",
            "model_not_found",
            ErrorClass.PERMANENT,
        ),
        (
            400,
            "INVALID_ARGUMENT",
            "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
            "context_overflow",
            ErrorClass.PERMANENT,
        ),
    ],
)
def test_google_errors_are_classified(status: int, name: str, message: str, kind: str, error_class: ErrorClass) -> None:
    error = adapter().classify_http_error(status, {}, _google(status, name, message))
    assert (error.kind, error.error_class) == (kind, error_class)
    assert name in error.message


def test_retry_info_is_honoured_and_a_daily_quota_is_permanent() -> None:
    retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}
    error = adapter().classify_http_error(429, {}, _google(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", [retry]))
    assert error.retry_after_s == 37.0
    assert error.error_class is ErrorClass.RETRYABLE
    daily = {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}],
    }
    error = adapter().classify_http_error(429, {}, _google(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", [daily]))
    assert error.error_class is ErrorClass.PERMANENT


# What Google sends for the free tier's limits: the same message for a minute's and a day's,
# which asks to "check your plan and billing details" either way; QuotaFailure says which.
_EXCEEDED = (
    "You exceeded your current quota, please check your plan and billing details. For more information on "
    "this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. To monitor your current usage, "
    "head to: https://ai.dev/rate-limit. \n* Quota exceeded for metric: "
    "generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: {limit}, "
    "model: gemini-2.5-flash\nPlease retry in 10.715548027s."
)


def _quota_429(quota_id: str, limit: int) -> bytes:
    details = [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [
                {
                    "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                    "quotaId": quota_id,
                }
            ],
        },
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "10s"},
    ]
    return _google(429, "RESOURCE_EXHAUSTED", _EXCEEDED.format(limit=limit), details)


@pytest.mark.parametrize(
    ("quota_id", "limit", "kind", "error_class"),
    [
        ("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", 5, "rate_limited", ErrorClass.RETRYABLE),
        ("GenerateRequestsPerDayPerProjectPerModel-FreeTier", 250, "spend_limit", ErrorClass.PERMANENT),
        ("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", 0, "spend_limit", ErrorClass.PERMANENT),
    ],
)
def test_a_per_minute_quota_429_is_retried_after_its_delay_a_daily_or_absent_one_is_not(
    quota_id: str, limit: int, kind: str, error_class: ErrorClass
) -> None:
    error = adapter().classify_http_error(429, {}, _quota_429(quota_id, limit))
    assert (error.kind, error.error_class) == (kind, error_class)
    assert error.retry_after_s == 10.0


def test_mid_stream_google_errors() -> None:
    events, _ = parse('data: {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}\r\n\r\n')
    error = next(e for e in events if isinstance(e, ProviderErrorEvent))
    assert adapter().classify_stream_error(error).error_class is ErrorClass.RETRYABLE
    bad = adapter().classify_stream_error(ProviderErrorEvent("INVALID_ARGUMENT", "no"))
    assert bad.error_class is ErrorClass.PERMANENT


def test_request_is_json_serialisable() -> None:
    request: HTTPRequest = adapter().build_request(
        ModelRequest(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    )
    json.dumps(request.json)
