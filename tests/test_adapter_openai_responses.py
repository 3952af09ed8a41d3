"""The OpenAI Responses adapter: recorded streams parsed, requests built, errors classified, Azure URLs."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from streamrecover.engine.blocks import Accumulator, BlockStatus
from streamrecover.engine.contract import ModelRequest, ProviderConfig, Strategy, ToolSpec
from streamrecover.engine.errors import ErrorClass, ParseError
from streamrecover.engine.events import (
    MessageStart,
    ProviderErrorEvent,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from streamrecover.engine.sse import SSEEvent
from streamrecover.providers.openai_chat import OpenAIChatAdapter
from streamrecover.providers.openai_responses import OpenAIResponsesAdapter, ResponsesStreamParser, ResumePoint
from streamrecover.providers.registry import get_adapter

from .streams import cut_points, load_text, sse_events

CONFIG = ProviderConfig(name="openai-responses", base_url="https://api.openai.com/v1", api_key="sk-test-secret")
ADAPTER = OpenAIResponsesAdapter(CONFIG)
FIXTURES = [
    "openai_responses_reasoning_tool.sse",
    "openai_responses_background_initial.sse",
]


def parse(events: list[SSEEvent], parser: ResponsesStreamParser | None = None) -> list[StreamEvent]:
    parser = parser or ResponsesStreamParser()
    return [out for event in events for out in parser.feed(event)]


def assemble(text: str, parser: ResponsesStreamParser | None = None) -> tuple[list[StreamEvent], Accumulator]:
    out = parse(sse_events(text), parser)
    acc = Accumulator()
    for event in out:
        acc.apply(event)
    return out, acc


def event(payload: dict[str, Any]) -> SSEEvent:
    return SSEEvent(payload["type"], json.dumps(payload))


def test_reasoning_and_tool_call_stream():
    parser = ResponsesStreamParser()
    out, acc = assemble(load_text("openai_responses_reasoning_tool.sse"), parser)
    assert isinstance(out[0], MessageStart)
    assert out[0].message_id == "resp_0050471a34b36ae60068c97b94a480819587a9d70cf2979b33"
    reasoning, call = acc.blocks
    assert reasoning.kind == "reasoning"
    assert reasoning.status() is BlockStatus.COMPLETE
    content = reasoning.to_content()
    assert content["id"].startswith("rs_")
    assert content["encrypted_content"].startswith("gAAAAABoyXvx")
    assert call.kind == "tool_use"
    assert call.id == "call_CWXgs68YprAjp6t0371hiPOI"
    assert call.name == "final_result"
    assert call.parsed_input() == {"result": 6666}
    assert acc.stop_reason == "tool_use"
    assert isinstance(out[-1], StreamEnd)
    # output_tokens counts the reasoning; output_tokens_details shows it apart
    assert acc.usage == Usage(input_tokens=53, output_tokens=469, cache_read_input_tokens=0, reasoning_tokens=448)
    assert parser.resume_point() == ResumePoint("resp_0050471a34b36ae60068c97b94a480819587a9d70cf2979b33", 13)


def test_background_text_stream():
    _out, acc = assemble(load_text("openai_responses_background_initial.sse"))
    (text,) = acc.blocks
    assert text.text == "2 + 2 equals 4."
    assert text.closed
    assert acc.stop_reason == "end_turn"
    assert acc.usage.output_tokens == 9


def test_resumed_stream_goes_on_in_the_parts_it_never_saw_open():
    """A resume from ``starting_after=6`` holds the text of events 5 and 6 already: the new
    parser opens the text block at the first delta it sees and the answer comes out whole."""
    initial = sse_events(load_text("openai_responses_background_initial.sse"))
    first = ResponsesStreamParser()
    _, acc = assemble("", first)
    for out in parse(initial[:7], first):
        acc.apply(out)
    point = first.resume_point()
    assert point is not None
    assert point.after == 6
    resumed = sse_events(load_text("openai_responses_background_resume_starting_after_0.sse"))
    after = [e for e in resumed if json.loads(e.data)["sequence_number"] > point.after]
    second = ResponsesStreamParser()
    rest = parse(after, second)
    tail = Accumulator()
    for out in rest:
        tail.apply(out)
    assert acc.blocks[0].text + tail.blocks[0].text == "2 + 2 equals 4."
    assert second.resume_point() is None  # nothing after sequence 6 names the response
    assert second.resume_point(point.response_id) == ResumePoint(point.response_id, 16)


def test_resume_point_stays_before_a_half_received_call():
    events = sse_events(load_text("openai_responses_reasoning_tool.sse"))
    parser = ResponsesStreamParser()
    parse(events[:7], parser)  # the call's added event is number 4 (sequence 4)
    point = parser.resume_point()
    assert point is not None
    assert point.after == 3


@pytest.mark.parametrize("name", FIXTURES)
def test_a_stream_cut_anywhere_never_ends(name: str):
    text = load_text(name)
    for cut in cut_points(text)[:-3]:
        out = parse(sse_events(text[:cut]))
        assert not any(isinstance(e, StreamEnd) for e in out), cut


def test_incomplete_and_failed_terminals():
    response = {"id": "resp_1", "output": [], "usage": {"input_tokens": 3, "output_tokens": 5}}
    incomplete = {**response, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    out = parse([event({"type": "response.incomplete", "response": incomplete, "sequence_number": 9})])
    assert StopReason("max_tokens", "max_output_tokens") in out
    assert isinstance(out[-1], StreamEnd)
    failed = {**response, "status": "failed", "error": {"code": "server_error", "message": "boom"}}
    (error,) = parse([event({"type": "response.failed", "response": failed, "sequence_number": 9})])
    assert error == ProviderErrorEvent("server_error", "boom")


def test_error_events_flat_and_nested():
    flat = {"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": None, "sequence_number": 1}
    nested = {"type": "error", "sequence_number": 2, "error": {"type": "invalid_request_error", "message": "no"}}
    assert parse([event(flat)]) == [ProviderErrorEvent("rate_limit_exceeded", "slow down")]
    assert parse([event(nested)]) == [ProviderErrorEvent("invalid_request_error", "no")]
    assert ADAPTER.classify_stream_error(ProviderErrorEvent("rate_limit_exceeded", "x")).error_class is (
        ErrorClass.RETRYABLE
    )
    assert ADAPTER.classify_stream_error(ProviderErrorEvent("server_error", "x")).error_class is ErrorClass.RETRYABLE
    assert ADAPTER.classify_stream_error(ProviderErrorEvent("invalid_prompt", "x")).error_class is (
        ErrorClass.PERMANENT
    )


SERVER_TROUBLE = (
    "An error occurred while processing your request. You can retry your request, or contact us "
    "through our help center at help.openai.com if the error persists."
)


@pytest.mark.parametrize(
    ("message", "error_class", "kind"),
    [
        (SERVER_TROUBLE, ErrorClass.RETRYABLE, "server_error"),  # names nothing: worth another try
        ("Rate limit reached for gpt-4o", ErrorClass.RETRYABLE, "rate_limited"),
        ("You exceeded your current quota, please check your plan", ErrorClass.PERMANENT, "spend_limit"),
        ("This model's maximum context length is 128000 tokens", ErrorClass.PERMANENT, "context_overflow"),
    ],
)
def test_an_error_event_with_a_null_code_is_classified_by_its_message(message, error_class, kind):
    """The flat ``error`` event's ``code`` is nullable: its ``type`` is the event's own, never
    the error's name, so an unnamed error is judged by its message, else retried."""
    flat = {"type": "error", "code": None, "message": message, "param": None, "sequence_number": 4}
    (error,) = parse([event(flat)])
    classified = ADAPTER.classify_stream_error(error)
    assert (classified.error_class, classified.kind) == (error_class, kind)


def test_refusal_parts_stop_as_a_refusal_in_a_block_marked_as_one():
    events = [
        {"type": "response.created", "response": {"id": "resp_r", "model": "gpt-4o"}, "sequence_number": 0},
        {
            "type": "response.content_part.added",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "refusal", "refusal": ""},
            "sequence_number": 1,
        },
        {
            "type": "response.refusal.delta",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "No.",
            "sequence_number": 2,
        },
    ]
    acc = Accumulator()
    for out in parse([event(e) for e in events]):
        acc.apply(out)
    assert acc.stop_reason == "refusal"
    (block,) = acc.blocks
    assert (block.text, block.refusal) == ("No.", True)  # marked, so a client's format can show it as one
    assert acc.blocks[0].text == "No."


@pytest.mark.parametrize("data", ["not json", "[1]", '{"type":"response.output_text.delta","item_id":"m"}'])
def test_bad_data_raises_parse_error(data: str):
    with pytest.raises(ParseError):
        ResponsesStreamParser().feed(SSEEvent("response.output_text.delta", data))


def conversation() -> ModelRequest:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}
    return ModelRequest(
        model="gpt-5",
        system="Be brief.",
        max_tokens=300,
        tools=(ToolSpec("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}}),),
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    reasoning,
                    {"type": "thinking", "thinking": "not for OpenAI", "signature": "x"},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ],
    )


def test_request_carries_calls_outputs_and_reasoning_as_input_items():
    request = ADAPTER.build_request(conversation())
    assert (request.method, request.url) == ("POST", "https://api.openai.com/v1/responses")
    assert request.headers["Authorization"] == "Bearer sk-test-secret"
    body = request.json
    assert body["model"] == "gpt-5"
    assert body["instructions"] == "Be brief."
    assert body["max_output_tokens"] == 300
    assert body["stream"] is True
    assert body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert "background" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    assert body["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
    ]
    assert "sk-test-secret" not in json.dumps(request.redacted())


def test_native_resume_asks_for_a_stored_background_response():
    adapter = OpenAIResponsesAdapter(
        ProviderConfig("openai-responses", "https://api.openai.com/v1", "k", native_resume=True)
    )
    body = adapter.build_request(conversation()).json
    assert body["background"] is True
    assert body["store"] is True
    assert "include" not in body
    resume = adapter.resume_request(ResumePoint("resp_abc", 41))
    assert resume.method == "GET"
    assert resume.url == "https://api.openai.com/v1/responses/resp_abc?stream=true&starting_after=41"


def test_continue_message_is_the_strategy():
    assert ADAPTER.continuation_strategy("gpt-5", thinking=True) is Strategy.CONTINUE_MESSAGE
    assert isinstance(get_adapter(CONFIG), OpenAIResponsesAdapter)


@pytest.mark.parametrize(
    ("status", "payload", "error_class", "kind"),
    [
        (429, {"error": {"type": "requests", "code": "rate_limit_exceeded"}}, "retry", "rate_limited"),
        (429, {"error": {"message": "quota", "type": "insufficient_quota"}}, "perm", "spend_limit"),
        # Azure's rate limit links https://aka.ms/oai/quotaincrease: still a rate limit
        (429, {"error": {"code": "429", "message": "exceeded token rate limit. Please retry after 6 seconds. "
                         "Please go here: https://aka.ms/oai/quotaincrease"}}, "retry", "rate_limited"),
        (404, {"error": {"message": "not found", "type": "invalid_request_error"}}, "perm", "not_found"),
        (500, {"error": {"message": "oops", "type": "server_error"}}, "retry", "server_error"),
        (400, {"error": {"message": "bad", "type": "invalid_request_error"}}, "perm", "invalid_request"),
    ],
)  # fmt: skip
def test_http_error_classification(status: int, payload: dict[str, Any], error_class: str, kind: str):
    error = ADAPTER.classify_http_error(status, {}, json.dumps(payload).encode())
    expected = ErrorClass.RETRYABLE if error_class == "retry" else ErrorClass.PERMANENT
    assert (error.error_class, error.kind) == (expected, kind)


AZURE = "https://myres.openai.azure.com"


def test_azure_v1_urls_headers_and_deployment():
    config = ProviderConfig(
        "openai-responses", AZURE, "azure-secret", azure=True, azure_deployment="prod-gpt", native_resume=True
    )
    adapter = OpenAIResponsesAdapter(config)
    request = adapter.build_request(conversation())
    assert request.url == f"{AZURE}/openai/v1/responses"
    assert request.headers["api-key"] == "azure-secret"
    assert "Authorization" not in request.headers
    assert request.json["model"] == "prod-gpt"
    assert adapter.resume_request(ResumePoint("resp_1", 3)).url == (
        f"{AZURE}/openai/v1/responses/resp_1?stream=true&starting_after=3"
    )
    stored = json.dumps(request.redacted())
    assert "azure-secret" not in stored
    assert '"api-key": "[redacted]"' in stored


def test_azure_dated_api_urls():
    config = ProviderConfig("openai", AZURE, "azure-secret", azure=True, azure_api_version="2024-10-21")
    chat = OpenAIChatAdapter(config).build_request(ModelRequest("gpt-4o-deploy", conversation().messages))
    assert chat.url == f"{AZURE}/openai/deployments/gpt-4o-deploy/chat/completions?api-version=2024-10-21"
    assert chat.headers["api-key"] == "azure-secret"
    assert "Authorization" not in chat.headers
    assert "azure-secret" not in json.dumps(chat.redacted())
    responses = OpenAIResponsesAdapter(
        ProviderConfig("openai-responses", AZURE, "k", azure=True, azure_api_version="2025-04-01-preview")
    )
    assert responses.build_request(conversation()).url == f"{AZURE}/openai/responses?api-version=2025-04-01-preview"
    assert responses.resume_request(ResumePoint("resp_1", 0)).url == (
        f"{AZURE}/openai/responses/resp_1?api-version=2025-04-01-preview&stream=true&starting_after=0"
    )


def test_a_web_search_call_is_a_whole_block_and_annotations_are_its_texts_citations() -> None:
    """The search call becomes one block when it is done (its action is only there), before the
    text; each ``annotation.added`` is a citation of its text part, as sent (the done events that
    repeat the annotations add none)."""
    search = {
        "id": "ws_1",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "q"},
    }
    cite = {"type": "url_citation", "start_index": 0, "end_index": 6, "url": "https://example.com/r", "title": "R"}
    part = {"type": "output_text", "text": "", "annotations": []}
    where = {"item_id": "msg_1", "output_index": 1, "content_index": 0}
    events = [
        {"type": "response.output_item.added", "output_index": 0, "item": {**search, "status": "in_progress"}},
        {"type": "response.web_search_call.searching", "output_index": 0, "item_id": "ws_1"},
        {"type": "response.output_item.done", "output_index": 0, "item": search},
        {"type": "response.content_part.added", **where, "part": part},
        {"type": "response.output_text.delta", **where, "delta": "Rivers flow."},
        {"type": "response.output_text.annotation.added", **where, "annotation_index": 0, "annotation": cite},
        {
            "type": "response.content_part.done",
            **where,
            "part": {**part, "text": "Rivers flow.", "annotations": [cite]},
        },
    ]
    acc = Accumulator()
    for out in parse([event(e) for e in events]):
        acc.apply(out)
    searched, text = acc.blocks
    assert searched.to_content() == search
    assert searched.status() is BlockStatus.COMPLETE
    assert text.to_content() == {"type": "text", "text": "Rivers flow.", "citations": [cite]}


def test_an_output_texts_logprobs_are_read_into_its_text_delta_without_bytes() -> None:
    """``include: ["message.output_text.logprobs"]`` adds entries to each delta (no ``bytes`` on
    them, unlike Chat's); a list of the wrong shape is left out whole and the text goes on."""
    scored = {"token": " river", "logprob": -0.25, "top_logprobs": [{"token": " lake", "logprob": -1.5}]}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    events = [
        {"type": "response.content_part.added", **where, "part": {"type": "output_text", "text": ""}},
        {"type": "response.output_text.delta", **where, "delta": " river", "logprobs": [scored]},
        {"type": "response.output_text.delta", **where, "delta": " bank", "logprobs": [{"token": 3}]},
        {"type": "response.output_text.delta", **where, "delta": "s", "logprobs": []},
    ]
    deltas = [out for out in parse([event(e) for e in events]) if isinstance(out, TextDelta)]
    assert [(d.text, d.logprobs) for d in deltas] == [
        (
            " river",
            (
                TokenLogprob(
                    token=" river",
                    logprob=-0.25,
                    bytes=None,
                    top_logprobs=[TopLogprob(token=" lake", logprob=-1.5, bytes=None)],
                ),
            ),
        ),
        (" bank", ()),
        ("s", ()),
    ]


def test_a_clients_include_is_kept_with_the_reasoning_a_continuation_needs() -> None:
    request = conversation()
    asked = replace(request, extra={"include": ["message.output_text.logprobs"], "top_logprobs": 3})
    body = ADAPTER.build_request(asked).json
    assert body["include"] == ["message.output_text.logprobs", "reasoning.encrypted_content"]
    assert body["top_logprobs"] == 3
