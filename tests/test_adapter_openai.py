"""The OpenAI Chat Completions adapter against recorded real streams, and the adapter registry."""

from __future__ import annotations

import email.utils
import json
import re
import time
from typing import Any

import pytest

from streamrecover.engine.agent import ToolRegistry
from streamrecover.engine.blocks import Accumulator, BlockStatus
from streamrecover.engine.contract import ModelRequest, ProviderConfig, Strategy, ToolSpec
from streamrecover.engine.errors import ErrorClass, InterruptCause, ParseError, StreamInterrupted
from streamrecover.engine.events import (
    BlockStart,
    BlockStop,
    MessageStart,
    ProviderErrorEvent,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolArgsDelta,
    Usage,
    UsageUpdate,
)
from streamrecover.engine.sse import SSEEvent
from streamrecover.engine.translate import delta_token_bound
from streamrecover.providers.anthropic import AnthropicAdapter
from streamrecover.providers.openai_chat import OpenAIChatAdapter, OpenAIChatStreamParser
from streamrecover.providers.openai_responses import OpenAIResponsesAdapter
from streamrecover.providers.registry import ADAPTERS, get_adapter, register_adapter

from .harness import with_config
from .scripted import chat_chunk, chat_usage, run_scripted, sse
from .streams import cut_points, load_recorded, load_text, sse_events

CHAT_FIXTURES = ["openai_chat_tool.sse", "openai_chat_refusal.sse"]


def parse(events: list[SSEEvent], parser: OpenAIChatStreamParser | None = None) -> list[StreamEvent]:
    parser = parser or OpenAIChatStreamParser()
    return [out for event in events for out in parser.feed(event)]


def assemble(text: str) -> tuple[list[StreamEvent], Accumulator]:
    out = parse(sse_events(text))
    acc = Accumulator()
    for event in out:
        acc.apply(event)
    return out, acc


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> SSEEvent:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o", "choices": choices, **extra}
    return SSEEvent("message", json.dumps(data))


CONFIG = ProviderConfig(name="openai", base_url="https://api.openai.com/v1", api_key="sk-test")
ADAPTER = OpenAIChatAdapter(CONFIG)


# -- the real streams -----------------------------------------------------------------


def test_tool_stream_assembles_the_call_usage_and_end():
    out, acc = assemble(load_text("openai_chat_tool.sse"))
    (tool,) = acc.blocks
    assert tool.index == 1  # tool call 0 -> block 1; block 0 is the text
    assert tool.to_content() == {
        "type": "tool_use",
        "id": "call_c91SqDXlYFuETYv8mUHzz6pp",
        "name": "GetWeatherArgs",
        "input": {"city": "Edinburgh", "country": "UK", "units": "c"},
    }
    assert tool.arguments == '{"city":"Edinburgh","country":"UK","units":"c"}'
    assert tool.status() is BlockStatus.COMPLETE
    assert acc.stop_reason == "tool_use"
    assert acc.usage == Usage(input_tokens=76, output_tokens=24, reasoning_tokens=0)
    assert acc.message_id == "chatcmpl-ABfw8AOXnoa2kzy11vVTSjuQhHCQr"
    assert acc.ended
    assert out[:2] == [
        MessageStart("chatcmpl-ABfw8AOXnoa2kzy11vVTSjuQhHCQr", "gpt-4o-2024-08-06"),
        BlockStart(1, "tool_use", id="call_c91SqDXlYFuETYv8mUHzz6pp", name="GetWeatherArgs"),
    ]
    assert out[-4:] == [
        BlockStop(1),
        StopReason("tool_use", "tool_calls"),
        UsageUpdate(Usage(input_tokens=76, output_tokens=24, reasoning_tokens=0)),
        StreamEnd(),
    ]


def test_refusal_stream_ends_with_a_refusal_stop_reason():
    out, acc = assemble(load_text("openai_chat_refusal.sse"))
    (text,) = acc.blocks
    assert text.to_content() == {"type": "text", "text": "I'm sorry, I can't assist with that request."}
    assert acc.stop_reason == "refusal"
    assert StopReason("refusal", "stop") in out
    assert acc.usage == Usage(input_tokens=79, output_tokens=11, reasoning_tokens=0)
    assert acc.ended


@pytest.mark.parametrize("name", CHAT_FIXTURES)
def test_a_stream_cut_before_done_never_ends(name: str):
    text = load_text(name)
    for cut in cut_points(text):
        _, acc = assemble(text[:cut])
        assert not acc.ended, f"{name} cut at byte {cut} reported a complete stream"
    _, acc = assemble(text)
    assert acc.ended


def test_finish_reason_without_done_is_not_an_end():
    text = load_text("openai_chat_tool.sse")
    out, acc = assemble(text[: text.index("data: [DONE]")])
    assert acc.stop_reason == "tool_use"
    assert StreamEnd() not in out
    assert not acc.ended


def test_done_without_a_finish_reason_is_a_broken_stream_not_an_end():
    """A proxy that ends the stream when its upstream fails writes ``[DONE]`` after the last
    chunk it had: no ``finish_reason`` came, so the answer is not complete."""
    parser = OpenAIChatStreamParser()
    parse([chunk({"content": "Hello, this is the begin"}), chunk({"content": "ning of a long"})], parser)
    with pytest.raises(StreamInterrupted) as info:
        parser.feed(SSEEvent("message", "[DONE]"))
    assert info.value.cause is InterruptCause.CONNECTION_RESET
    assert "[DONE] without a finish_reason" in info.value.message
    # nothing at all but [DONE] is no answer either
    with pytest.raises(StreamInterrupted):
        OpenAIChatStreamParser().feed(SSEEvent("message", "[DONE]"))


async def test_a_run_whose_stream_ends_with_done_but_no_finish_reason_is_continued():
    """End to end: the engine continues the broken answer instead of committing half of it,
    and the committed answer, as the client rebuilt it, is the whole one."""
    broken = sse([chat_chunk("Hello, this is the begin"), chat_chunk("ning of a long"), None])
    rest = sse([chat_chunk(" answer."), chat_chunk(finish="stop"), chat_usage(20, 3), None])
    out = await run_scripted("openai", [(200, {}, broken), (200, {}, rest)])
    assert out.result.status == "completed", out.result.error
    assert out.answer == [{"type": "text", "text": "Hello, this is the beginning of a long answer."}]
    assert len(out.requests) == 2
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["error_kind"] == "sse_transport"
    assert [shown for shown, _ in out.view.turns] == [out.answer]  # what the client showed


def _tool_call_chunk(index: int, call_id: str, arguments: str) -> dict[str, Any]:
    chunk = chat_chunk()
    call = {"index": index, "id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}
    chunk["choices"][0]["delta"] = {"tool_calls": [call]}
    return chunk


@pytest.mark.parametrize("call_id", ["call_0", ""])
async def test_parallel_tool_calls_sharing_an_id_each_run_once_with_their_own_result(call_id: str):
    """A compatible server that gives two calls of one answer the same id (or none): each call
    is run with its own arguments and answered with its own result, under ids the client was
    shown and the provider is sent back, instead of the second call getting the first's result
    without being run."""
    calls = sse(
        [
            _tool_call_chunk(0, call_id, '{"a": 1, "b": 2}'),
            _tool_call_chunk(1, call_id, '{"a": 10, "b": 20}'),
            chat_chunk(finish="tool_calls"),
            chat_usage(5, 5),
            None,
        ]
    )
    done = sse([chat_chunk("done"), chat_chunk(finish="stop"), chat_usage(5, 1), None])
    tools = ToolRegistry()
    tools.register(lambda args: args["a"] + args["b"], name="add", input_schema={"type": "object"})
    out = await run_scripted("openai", [(200, {}, calls), (200, {}, done)], tools=tools)
    assert out.result.status == "completed", out.result.error
    assert tools.calls == [("add", {"a": 1, "b": 2}), ("add", {"a": 10, "b": 20})]
    assistant, results = out.result.messages[1:3]
    ids = [b["id"] for b in assistant["content"] if b["type"] == "tool_use"]
    assert len(set(ids)) == 2
    answered = list(zip(ids, ["3", "30"], strict=True))
    assert [(r["tool_use_id"], r["content"]) for r in results["content"]] == answered
    # the client was shown the ids that were stored
    assert out.view.turns[0][0] == out.view.turns[0][1]
    # and the provider is sent each result under its own call's id
    sent = out.requests[1]["messages"]
    (sent_calls,) = [m["tool_calls"] for m in sent if m["role"] == "assistant"]
    assert [c["id"] for c in sent_calls] == ids
    assert [(m["tool_call_id"], m["content"]) for m in sent if m["role"] == "tool"] == answered


# -- chunk shapes ---------------------------------------------------------------------


def test_text_block_opens_on_the_first_content():
    parser = OpenAIChatStreamParser()
    assert parser.feed(chunk({"role": "assistant", "content": "", "refusal": None})) == [
        MessageStart("chatcmpl-1", "gpt-4o")
    ]
    assert parser.feed(chunk({"content": "Hel"})) == [BlockStart(0, "text"), TextDelta(0, "Hel")]
    assert parser.feed(chunk({"content": "lo"})) == [TextDelta(0, "lo")]
    assert parser.feed(chunk({}, "stop")) == [BlockStop(0), StopReason("end_turn", "stop")]
    assert parser.feed(SSEEvent("message", "[DONE]")) == [StreamEnd()]


def test_text_and_parallel_tool_calls_get_their_own_blocks():
    parser = OpenAIChatStreamParser()
    events = [
        chunk({"content": "Both:"}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x":1}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}
                ]
            }
        ),
        chunk({}, "tool_calls"),
    ]
    out = parse(events, parser)
    acc = Accumulator()
    for event in out:
        acc.apply(event)
    assert [b.to_content() for b in acc.blocks] == [
        {"type": "text", "text": "Both:"},
        {"type": "tool_use", "id": "call_a", "name": "f", "input": {"x": 1}},
        {"type": "tool_use", "id": "call_b", "name": "g", "input": {}},
    ]
    assert out[-4:] == [BlockStop(0), BlockStop(1), BlockStop(2), StopReason("tool_use", "tool_calls")]
    assert ToolArgsDelta(1, '{"x":1}') in out


def test_empty_choices_never_index_blindly():
    azure_first = {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
    }
    parser = OpenAIChatStreamParser()
    assert parser.feed(SSEEvent("message", json.dumps(azure_first))) == []
    assert parser.feed(SSEEvent("message", '{"id": "c", "choices": null, "usage": null}')) == [MessageStart("c")]


@pytest.mark.parametrize(
    ("finish", "normalized"),
    [
        ("stop", "end_turn"),
        ("tool_calls", "tool_use"),
        ("length", "max_tokens"),
        ("content_filter", "content_filter"),
        ("function_call", "tool_use"),
        ("something_new", "something_new"),
    ],
)
def test_finish_reasons(finish: str, normalized: str):
    assert OpenAIChatStreamParser().feed(chunk({}, finish))[-1] == StopReason(normalized, finish)


def test_usage_shows_the_reasoning_part_of_the_completion_tokens():
    # a reasoning model's usage chunk: completion_tokens counts the reasoning, details show it apart
    usage = {"prompt_tokens": 20, "completion_tokens": 300, "completion_tokens_details": {"reasoning_tokens": 256}}
    out = OpenAIChatStreamParser().feed(chunk(None, usage=usage))
    assert out[-1] == UsageUpdate(Usage(input_tokens=20, output_tokens=300, reasoning_tokens=256))


def test_usage_maps_cached_tokens():
    usage = {"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 64}}
    out = OpenAIChatStreamParser().feed(chunk(None, usage=usage))
    assert out[-1] == UsageUpdate(Usage(input_tokens=100, output_tokens=7, cache_read_input_tokens=64))
    deepseek = {"prompt_tokens": 10, "completion_tokens": 2, "prompt_cache_hit_tokens": 8}
    out = OpenAIChatStreamParser().feed(chunk(None, usage=deepseek))
    assert out[-1] == UsageUpdate(Usage(input_tokens=10, output_tokens=2, cache_read_input_tokens=8))


def test_reasoning_content_is_a_thinking_block_closed_when_the_answer_starts():
    parser = OpenAIChatStreamParser()
    parser.feed(chunk({"role": "assistant"}))
    assert parser.feed(chunk({"reasoning_content": "Let me think"})) == [
        BlockStart(-1, "thinking"),
        ThinkingDelta(-1, "Let me think"),
    ]
    assert parser.feed(chunk({"reasoning_content": None, "content": "Hi"})) == [
        BlockStop(-1),
        BlockStart(0, "text"),
        TextDelta(0, "Hi"),
    ]


def test_deprecated_function_call_becomes_a_tool_block():
    events = [
        chunk({"function_call": {"name": "f", "arguments": '{"a"'}}),
        chunk({"function_call": {"arguments": ":1}"}}),
        chunk({}, "function_call"),
    ]
    assert parse(events)[1:] == [
        BlockStart(1, "tool_use", id=None, name="f"),
        ToolArgsDelta(1, '{"a"'),
        ToolArgsDelta(1, ":1}"),
        BlockStop(1),
        StopReason("tool_use", "function_call"),
    ]


def test_error_chunk_becomes_a_provider_error_event():
    data = {
        "error": {
            "message": "The server had an error while processing your request. Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    (event,) = OpenAIChatStreamParser().feed(SSEEvent("message", json.dumps(data)))
    assert event == ProviderErrorEvent("server_error", data["error"]["message"])
    error = ADAPTER.classify_stream_error(event)
    assert (error.error_class, error.kind) == (ErrorClass.RETRYABLE, "server_error")


def test_error_chunk_prefers_the_code_to_the_type():
    data = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
    assert OpenAIChatStreamParser().feed(SSEEvent("message", json.dumps(data))) == [
        ProviderErrorEvent("rate_limit_exceeded", "Rate limit reached")
    ]


@pytest.mark.parametrize(
    "data",
    [
        "not json",
        '{"id": "c", "choices": [{"index": 0, "delta": {"content": "a"}',
        "[1, 2]",
        "42",
        '{"id": "c", "choices": "abc"}',
        '{"id": "c", "choices": [{"index": 0, "delta": "text"}]}',
        '{"id": "c", "choices": [{"index": 0, "delta": {"content": 5}}]}',
        '{"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0"}]}}]}',
        '{"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 1}}]}}]}',
        '{"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": 3}]}',
        '{"id": "c", "choices": [], "usage": "lots"}',
    ],
)
def test_bad_data_raises_parse_error(data: str):
    with pytest.raises(ParseError, match="openai"):
        OpenAIChatStreamParser().feed(SSEEvent("message", data))


# -- requests -------------------------------------------------------------------------


def test_request_url_headers_and_body():
    config = ProviderConfig(
        name="openai", base_url="https://api.openai.com/v1/", api_key="sk-secret", extra_headers={"OpenAI-Project": "p"}
    )
    request = ModelRequest(
        model="gpt-4o",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_tokens=256,
        system="Be brief.",
        tools=(ToolSpec("get_weather", "Weather for a place", {"type": "object"}),),
        thinking_budget=1000,  # no OpenAI equivalent: not sent
        temperature=0.2,
        extra={"seed": 7},
    )
    http = OpenAIChatAdapter(config).build_request(request)
    assert (http.method, http.url) == ("POST", "https://api.openai.com/v1/chat/completions")
    assert http.headers == {
        "Authorization": "Bearer sk-secret",
        "content-type": "application/json",
        "accept": "text/event-stream",
        "OpenAI-Project": "p",
    }
    assert http.json == {
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 256,  # OpenAI's own API: the name every model takes
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather for a place",
                    "parameters": {"type": "object"},
                },
            }
        ],
        "temperature": 0.2,
        "seed": 7,
    }
    assert http.redacted()["headers"]["Authorization"] == "[redacted]"


def test_compatible_base_url_keeps_its_version_path():
    config = ProviderConfig(name="openai", base_url="https://api.deepseek.com/beta", prefix_flag=True)
    http = OpenAIChatAdapter(config).build_request(ModelRequest(model="deepseek-chat", messages=[]))
    assert http.url == "https://api.deepseek.com/beta/chat/completions"


def test_max_completion_tokens_in_extra_names_the_budget_never_replaces_it():
    # a continuation's max_tokens is what is left of the turn's: extra's value re-sent the whole
    # budget on every continuation, and the turn was billed past its max_tokens
    request = ModelRequest(model="o3", messages=[], max_tokens=99, extra={"max_completion_tokens": 500})
    body = ADAPTER.build_request(request).json
    assert "max_tokens" not in body
    assert body["max_completion_tokens"] == 99


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ProviderConfig(name="openai", base_url="https://api.openai.com/v1"), "max_completion_tokens"),
        (ProviderConfig(name="openai", base_url="http://localhost:8000/v1"), "max_tokens"),  # vLLM, llama.cpp
        (ProviderConfig(name="openai", base_url="https://api.deepseek.com/beta"), "max_tokens"),
        (ProviderConfig(name="openai", base_url="https://x.openai.azure.com", azure=True), "max_tokens"),
        (
            ProviderConfig(
                name="openai", base_url="http://localhost:8000/v1", max_tokens_field="max_completion_tokens"
            ),
            "max_completion_tokens",
        ),
    ],
)
def test_the_budget_goes_under_the_name_the_provider_takes(config, field):
    # OpenAI's o-series and gpt-5 answer max_tokens with a 400; compatible servers and Azure's
    # older API versions know only max_tokens
    body = OpenAIChatAdapter(config).build_request(ModelRequest(model="gpt-5", messages=[], max_tokens=77)).json
    assert body[field] == 77
    assert ({"max_tokens", "max_completion_tokens"} - {field}).isdisjoint(body)


CONVERSATION = [
    {"role": "user", "content": "Weather in SF and NYC?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Two calls.", "signature": "sig=="},
            {"type": "redacted_thinking", "data": "EqkE"},
            {"type": "text", "text": "Checking "},
            {"type": "text", "text": "both."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "San Francisco"}},
            {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Zürich"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "15 C"},
            {
                "type": "tool_result",
                "tool_use_id": "call_2",
                "content": [{"type": "text", "text": "boom"}],
                "is_error": True,
            },
            {"type": "text", "text": "Thanks."},
        ],
    },
    {"role": "assistant", "content": [{"type": "tool_use", "id": "call_3", "name": "noop", "input": {}}]},
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_3", "content": ""},
            {"type": "text", "text": "Look:"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
        ],
    },
    {"role": "assistant", "content": [{"type": "text", "text": "The answer is"}], "prefix": True},
]


def test_request_maps_every_canonical_block():
    sent = ADAPTER.build_request(ModelRequest(model="gpt-4o", messages=CONVERSATION)).json["messages"]
    assert sent == [
        {"role": "user", "content": "Weather in SF and NYC?"},
        {
            "role": "assistant",
            "content": "Checking both.",  # thinking and redacted thinking dropped
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "San Francisco"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "15 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "boom"},
        {"role": "user", "content": "Thanks."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_3", "type": "function", "function": {"name": "noop", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": ""},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
            ],
        },
        {"role": "assistant", "content": "The answer is"},  # no prefix flag without config.prefix_flag
    ]
    arguments = sent[1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"city": "San Francisco"}


def test_prefix_flag_is_sent_only_when_configured():
    config = ProviderConfig(name="openai", base_url="https://api.deepseek.com/beta", prefix_flag=True)
    sent = OpenAIChatAdapter(config).build_request(ModelRequest(model="deepseek-chat", messages=CONVERSATION)).json
    assert sent["messages"][-1] == {"role": "assistant", "content": "The answer is", "prefix": True}
    assert all("prefix" not in m for m in sent["messages"][:-1])
    plain = [*CONVERSATION[:-1], {"role": "assistant", "content": [{"type": "text", "text": "x"}]}]
    sent = OpenAIChatAdapter(config).build_request(ModelRequest(model="deepseek-chat", messages=plain)).json
    assert "prefix" not in sent["messages"][-1]


# -- errors ---------------------------------------------------------------------------


def body(message: str, error_type: str | None = None, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": error_type, "param": None, "code": code}}).encode()


@pytest.mark.parametrize(
    ("status", "payload", "error_class", "kind"),
    [
        (
            400,
            body(
                "This model's maximum context length is 128000 tokens.",
                "invalid_request_error",
                "context_length_exceeded",
            ),
            ErrorClass.PERMANENT,
            "context_overflow",
        ),
        (400, body("Invalid 'messages[1].role'", "invalid_request_error"), ErrorClass.PERMANENT, "invalid_request"),
        (
            401,
            body("Incorrect API key provided", "invalid_request_error", "invalid_api_key"),
            ErrorClass.PERMANENT,
            "unauthorized",
        ),
        (
            403,
            body("Country, region, or territory not supported", "request_forbidden"),
            ErrorClass.PERMANENT,
            "permission_denied",
        ),
        (
            404,
            body("The model `gpt-9` does not exist", "invalid_request_error", "model_not_found"),
            ErrorClass.PERMANENT,
            "model_not_found",
        ),
        (
            429,
            body("Rate limit reached for gpt-4o on tokens per min (TPM)", "tokens", "rate_limit_exceeded"),
            ErrorClass.RETRYABLE,
            "rate_limited",
        ),
        (
            429,
            body(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                "insufficient_quota",
            ),
            ErrorClass.PERMANENT,
            "spend_limit",
        ),
        (429, body("You exceeded your current quota."), ErrorClass.PERMANENT, "spend_limit"),
        (429, body("Monthly spend limit reached", "billing_hard_limit_reached"), ErrorClass.PERMANENT, "spend_limit"),
        (402, body("Insufficient Balance"), ErrorClass.PERMANENT, "billing"),
        (408, b"", ErrorClass.RETRYABLE, "timeout"),
        (409, body("conflict"), ErrorClass.RETRYABLE, "conflict"),
        (422, body("Invalid parameters"), ErrorClass.PERMANENT, "invalid_request"),
        (500, body("The server had an error", "server_error"), ErrorClass.RETRYABLE, "server_error"),
        (502, b"<html>Bad Gateway</html>", ErrorClass.RETRYABLE, "server_error"),
        (503, body("The engine is currently overloaded", "server_error"), ErrorClass.RETRYABLE, "server_error"),
        (504, b"", ErrorClass.RETRYABLE, "timeout"),
    ],
)
def test_http_error_classification(status: int, payload: bytes, error_class: ErrorClass, kind: str):
    error = ADAPTER.classify_http_error(status, {"x-request-id": "req_abc"}, payload)
    assert (error.error_class, error.kind, error.status, error.request_id) == (error_class, kind, status, "req_abc")
    assert error.message


# Azure OpenAI's ordinary rate limit: it links "quotaincrease", and waiting is what it asks for.
AZURE_RATE_LIMIT = (
    "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have "
    "exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 6 seconds. "
    "Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."
)
AZURE_BASE = "https://myres.openai.azure.com"
AZURE = OpenAIChatAdapter(ProviderConfig(name="openai", base_url=AZURE_BASE, api_key="k", azure=True))


def test_azures_rate_limit_429_is_retried_after_its_retry_after_and_real_quota_exhaustion_is_not():
    payload = json.dumps({"error": {"code": "429", "message": AZURE_RATE_LIMIT}}).encode()
    error = AZURE.classify_http_error(429, {"retry-after": "6", "content-type": "application/json"}, payload)
    assert (error.error_class, error.kind, error.retry_after_s) == (ErrorClass.RETRYABLE, "rate_limited", 6.0)
    for quota in (
        body("You exceeded your current quota, please check your plan and billing details.", "insufficient_quota"),
        body("Insufficient quota for this subscription", None, "insufficient_quota"),
        body("Your organization has reached its monthly spending limit."),
        body("Monthly spend limit reached", "billing_hard_limit_reached"),
    ):
        error = AZURE.classify_http_error(429, {"retry-after": "6"}, quota)
        assert (error.error_class, error.kind) == (ErrorClass.PERMANENT, "spend_limit"), quota


async def test_a_run_that_meets_azures_rate_limit_waits_and_completes():
    payload = json.dumps({"error": {"code": "429", "message": AZURE_RATE_LIMIT}}).encode()
    ok = sse([chat_chunk("Hello."), chat_chunk(finish="stop"), None])
    out = await run_scripted(
        "openai",
        [(429, {"retry-after": "6", "content-type": "application/json"}, payload), (200, {}, ok)],
        provider_kw={"azure": True},
        config=with_config(max_retry_after_s=0.01),  # the wait is capped here so the test is quick
    )
    assert out.result.status == "completed", out.result.error
    assert out.answer == [{"type": "text", "text": "Hello."}]
    (retry,) = out.events("llm_request_retry")
    assert (retry["error_kind"], retry["retry_after_s"], retry["delay_s"]) == ("rate_limited", 6.0, 0.01)


# -- the token budget after a break ----------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "bound"),
    [
        ("Hello", 1),
        (" world", 1),  # a token's leading space
        ("\n\n", 1),
        (" the quick brown fox jumps over it", 34),  # longer than a token: buffered, bounded by bytes
        ("=" * 32, 1),
        ("é", 2),  # a character may take several tokens, held back until it is whole
        ("🚀", 4),
        ("café", 5),
    ],
)
def test_a_delta_counts_one_token_only_where_it_can_be_one(delta: str, bound: int):
    assert delta_token_bound(delta, len(delta.encode())) == bound


def test_azures_chunks_are_not_tokens():
    """Azure's content filter streams buffered chunks of many tokens: its bytes bound them."""
    assert ADAPTER.text_delta_is_token is True
    assert AZURE.text_delta_is_token is False
    assert (
        OpenAIResponsesAdapter(ProviderConfig("openai-responses", AZURE_BASE, "k", azure=True)).text_delta_is_token
        is False
    )


@pytest.mark.parametrize("azure", [True, False])
async def test_a_continuation_after_chunks_of_many_tokens_stays_within_the_turns_max_tokens(azure: bool):
    """Two chunks of 100 words each (200 tokens at least: every word is one or more) and then a
    break: the continuation asks for no more than what is left of the turn's 1200 tokens, on
    Azure (its buffered chunks) and wherever a chunk is plainly several tokens."""
    words = "go " * 100
    broken = sse([chat_chunk(words), chat_chunk(words)])  # cut: no finish_reason, no [DONE]
    rest = sse([chat_chunk("The end."), chat_chunk(finish="stop"), chat_usage(30, 3), None])
    out = await run_scripted(
        "openai", [(200, {}, broken), (200, {}, rest)], max_tokens=1200, provider_kw={"azure": azure}
    )
    assert out.result.status == "completed", out.result.error
    assert out.answer == [{"type": "text", "text": words * 2 + "The end."}]
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["turn_output_tokens"] >= 200
    assert out.requests[1]["max_tokens"] <= 1200 - 200


def test_non_json_body_still_classifies_with_a_clear_message():
    error = ADAPTER.classify_http_error(503, {}, b"upstream connect error or disconnect/reset before headers")
    assert error.error_class is ErrorClass.RETRYABLE
    assert "503" in error.message
    assert "upstream connect error" in error.message


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "20"}, 20.0),
        ({"Retry-After": "0.5"}, 0.5),
        ({"retry-after-ms": "750"}, 0.75),
        ({"retry-after": "0"}, None),
        ({}, None),
    ],
)
def test_retry_after_forms(headers: dict[str, str], expected: float | None):
    assert ADAPTER.classify_http_error(429, headers, body("Rate limit reached")).retry_after_s == expected


def test_retry_after_as_an_http_date():
    date = email.utils.formatdate(time.time() + 60, usegmt=True)
    retry_after = ADAPTER.classify_http_error(503, {"Retry-After": date}, b"").retry_after_s
    assert retry_after is not None
    assert 40 < retry_after <= 61


@pytest.mark.parametrize(
    ("status", "header", "expected"),
    [
        (500, "false", ErrorClass.PERMANENT),
        (429, "false", ErrorClass.PERMANENT),
        (400, "true", ErrorClass.RETRYABLE),
        (429, "TRUE", ErrorClass.RETRYABLE),
    ],
)
def test_x_should_retry_overrides_the_status_policy(status: int, header: str, expected: ErrorClass):
    assert ADAPTER.classify_http_error(status, {"X-Should-Retry": header}, body("x")).error_class is expected


@pytest.mark.parametrize(
    ("error_type", "message", "error_class", "kind"),
    [
        ("server_error", "The server had an error", ErrorClass.RETRYABLE, "server_error"),
        ("rate_limit_exceeded", "Rate limit reached", ErrorClass.RETRYABLE, "rate_limited"),
        ("overloaded_error", "Overloaded", ErrorClass.RETRYABLE, "overloaded"),
        ("error", "The engine is currently overloaded", ErrorClass.RETRYABLE, "overloaded"),
        ("insufficient_quota", "You exceeded your current quota", ErrorClass.PERMANENT, "spend_limit"),
        ("429", AZURE_RATE_LIMIT, ErrorClass.RETRYABLE, "rate_limited"),
        ("context_length_exceeded", "maximum context length", ErrorClass.PERMANENT, "context_overflow"),
        ("invalid_request_error", "bad", ErrorClass.PERMANENT, "invalid_request"),
        ("invalid_prompt", "flagged", ErrorClass.PERMANENT, "provider_error"),
    ],
)
def test_stream_error_classification(error_type: str, message: str, error_class: ErrorClass, kind: str):
    error = ADAPTER.classify_stream_error(ProviderErrorEvent(error_type, message))
    assert (error.error_class, error.kind) == (error_class, kind)
    assert error.status is None


# -- continuation strategy ------------------------------------------------------------


def test_openai_has_no_prefill():
    assert ADAPTER.continuation_strategy("gpt-4o", thinking=False) is Strategy.CONTINUE_MESSAGE
    assert ADAPTER.continuation_strategy("o3", thinking=True) is Strategy.CONTINUE_MESSAGE
    assert ADAPTER.echoes_prefix is False
    assert ADAPTER.name == "openai"


def test_prefix_flag_endpoints():
    deepseek = OpenAIChatAdapter(
        ProviderConfig(name="openai", base_url="https://api.deepseek.com/beta", prefix_flag=True)
    )
    assert deepseek.continuation_strategy("deepseek-chat", thinking=False) is Strategy.PREFIX_FLAG
    assert deepseek.echoes_prefix is False
    mistral = OpenAIChatAdapter(
        ProviderConfig(name="openai", base_url="https://api.mistral.ai/v1", prefix_flag=True, echoes_prefix=True)
    )
    assert mistral.continuation_strategy("mistral-large-latest", thinking=False) is Strategy.PREFIX_FLAG
    assert mistral.echoes_prefix is True


def test_strategy_overrides_come_first():
    config = ProviderConfig(
        name="openai",
        base_url="https://api.deepseek.com/beta",
        prefix_flag=True,
        strategy_overrides={"deepseek-reasoner": "continue_message", "deepseek-*": "prefill"},
    )
    adapter = OpenAIChatAdapter(config)
    assert adapter.continuation_strategy("deepseek-reasoner", thinking=False) is Strategy.CONTINUE_MESSAGE
    assert adapter.continuation_strategy("deepseek-chat", thinking=False) is Strategy.PREFILL
    assert adapter.continuation_strategy("other", thinking=False) is Strategy.PREFIX_FLAG


# -- registry -------------------------------------------------------------------------


def test_registry_finds_both_adapters():
    assert isinstance(get_adapter(CONFIG), OpenAIChatAdapter)
    anthropic = get_adapter(ProviderConfig(name="anthropic", base_url="https://api.anthropic.com"))
    assert isinstance(anthropic, AnthropicAdapter)
    assert anthropic.name == "anthropic"


def test_registry_rejects_unknown_names_listing_the_known_ones():
    with pytest.raises(ValueError, match="cohere") as info:
        get_adapter(ProviderConfig(name="cohere", base_url="https://example.invalid"))
    assert "anthropic" in str(info.value)
    assert "openai" in str(info.value)


class TaggedAdapter(OpenAIChatAdapter):
    """A third-party adapter reached by dotted path (``tests.test_adapter_openai.TaggedAdapter``)."""

    name = "tagged"


TAGGED_PATH = f"{__name__}.TaggedAdapter"


def test_registry_imports_a_dotted_path_factory():
    adapter = get_adapter(ProviderConfig(name=TAGGED_PATH, base_url="https://example.invalid/v1"))
    assert isinstance(adapter, TaggedAdapter)
    assert adapter.name == "tagged"


def test_registry_uses_a_registered_factory(monkeypatch):
    monkeypatch.setitem(ADAPTERS, "mine", TaggedAdapter)
    register_adapter("mine", TaggedAdapter)
    assert isinstance(get_adapter(ProviderConfig(name="mine", base_url="https://example.invalid")), TaggedAdapter)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("cohere", "unknown provider adapter 'cohere'"),
        ("nowhere.at_all.Adapter", "cannot import provider adapter 'nowhere.at_all.Adapter'"),
        (f"{__name__}.NoSuchFactory", "has no callable 'NoSuchFactory'"),
    ],
)
def test_registry_errors_name_the_value_and_the_known_adapters(name, says):
    with pytest.raises(ValueError, match=re.escape(says)) as info:
        get_adapter(ProviderConfig(name=name, base_url="https://example.invalid"))
    assert "'anthropic', 'gemini', 'openai'" in str(info.value)


@pytest.mark.parametrize("field", ["max_completion_tokens", "max_tokens"])
def test_a_proxied_request_keeps_the_name_its_client_gave_the_limit(field):
    from streamrecover.proxy.inbound import parse

    raw = json.dumps({"model": "gpt-5", "stream": True, field: 500, "messages": [{"role": "user", "content": "hi"}]})
    p = parse("openai", raw.encode(), 4096)
    request = ModelRequest(
        model=p.model, messages=p.messages, max_tokens=p.max_tokens, extra=p.extra, max_tokens_field=p.max_tokens_field
    )
    body = ADAPTER.build_request(request).json
    assert body[field] == 500
    assert ({"max_tokens", "max_completion_tokens"} - {field}).isdisjoint(body)


@pytest.mark.parametrize(
    ("recording", "kind"), [("openai_text_logprobs.sse", "content"), ("openai_refusal_logprobs.sse", "refusal")]
)
def test_each_text_delta_carries_its_chunks_logprobs_from_the_real_stream(recording: str, kind: str) -> None:
    """Streams recorded from the API with ``logprobs: true``: a text's tokens under ``content``, a
    refusal's under ``refusal``; each delta carries its own chunk's entries, as the API wrote them."""
    raw = load_recorded(recording).decode()
    sent = [
        (choice["delta"].get(kind), choice["logprobs"][kind])
        for event in sse_events(raw)
        if event.data.startswith("{")
        for choice in json.loads(event.data)["choices"]
        if choice["delta"].get(kind)
    ]
    deltas = [(e.text, list(e.logprobs)) for e in parse(sse_events(raw)) if isinstance(e, TextDelta)]
    assert deltas == sent
    assert all(len(entries) == 1 and entries[0]["token"] == text for text, entries in deltas)
    assert [list(entry) for _, entries in deltas for entry in entries] == [
        ["token", "logprob", "bytes", "top_logprobs"]
    ] * len(deltas)  # the API's field order


def test_logprobs_of_the_wrong_shape_are_left_out_and_the_text_goes_on() -> None:
    good = {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}
    bad = {"token": " there", "logprob": "-0.5", "bytes": [32], "top_logprobs": []}  # a string for a number
    events = parse([_scored_chunk("Hi", [good]), _scored_chunk(" there", [good, bad])])
    deltas = [(e.text, list(e.logprobs)) for e in events if isinstance(e, TextDelta)]
    assert deltas == [("Hi", [good]), (" there", [])]  # never half of a chunk's entries


def test_entries_of_a_chunk_without_text_go_with_the_text_that_follows() -> None:
    first = {"token": "\\xe6\\x97", "logprob": -0.1, "bytes": [230, 151], "top_logprobs": []}
    second = {"token": "\\xa5", "logprob": -0.2, "bytes": [165], "top_logprobs": []}
    events = parse([_scored_chunk("", [first]), _scored_chunk("日", [second])])
    assert [(e.text, list(e.logprobs)) for e in events if isinstance(e, TextDelta)] == [("日", [first, second])]


def _scored_chunk(text: str, entries: list[dict[str, Any]]) -> SSEEvent:
    choice = {"index": 0, "delta": {"content": text}, "logprobs": {"content": entries, "refusal": None}}
    data = {"id": "chatcmpl-1", "model": "gpt-4o", "choices": [{**choice, "finish_reason": None}]}
    return SSEEvent("message", json.dumps(data))
