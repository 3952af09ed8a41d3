"""The Anthropic adapter against recorded real streams (``tests/streams.py`` reads them)."""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any

import pytest

from streamrecover.engine.blocks import Accumulator, BlockStatus
from streamrecover.engine.contract import ModelRequest, ProviderConfig, Strategy, ToolSpec
from streamrecover.engine.errors import ErrorClass, ParseError
from streamrecover.engine.events import (
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
from streamrecover.engine.sse import SSEEvent
from streamrecover.providers.anthropic import NO_PREFILL_MODELS, AnthropicAdapter, AnthropicStreamParser

from .streams import cut_points, load_recorded, load_text, sse_events

ANTHROPIC_FIXTURES = [
    "anthropic_basic_text.sse",
    "anthropic_text_tool.sse",
    "anthropic_text_tool_earlier_revision.sse",
    "anthropic_thinking.sse",
    "anthropic_thinking_recorded_padded.sse",
    "anthropic_redacted_thinking_recorded.sse",
]


def parse(events: list[SSEEvent]) -> list[StreamEvent]:
    parser = AnthropicStreamParser()
    return [out for event in events for out in parser.feed(event)]


def assemble(text: str) -> tuple[list[StreamEvent], Accumulator]:
    out = parse(sse_events(text))
    acc = Accumulator()
    for event in out:
        acc.apply(event)
    return out, acc


def ev(data: dict[str, Any] | str, name: str | None = None) -> SSEEvent:
    if isinstance(data, str):
        return SSEEvent(name or "message", data)
    return SSEEvent(name or str(data.get("type", "message")), json.dumps(data))


def feed_one(data: dict[str, Any] | str, name: str | None = None) -> list[StreamEvent]:
    return AnthropicStreamParser().feed(ev(data, name))


ADAPTER = AnthropicAdapter(ProviderConfig(name="anthropic", base_url="https://api.anthropic.com", api_key="sk-test"))


# -- the real streams -----------------------------------------------------------------


def test_text_tool_assembles_text_and_tool_input():
    out, acc = assemble(load_text("anthropic_text_tool.sse"))
    text, tool = acc.blocks
    assert text.to_content() == {"type": "text", "text": "Okay, let's check the weather for San Francisco, CA:"}
    assert tool.to_content() == {
        "type": "tool_use",
        "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
        "name": "get_weather",
        "input": {"location": "San Francisco, CA"},
    }
    assert tool.arguments == '{"location": "San Francisco, CA"}'
    assert [b.status() for b in acc.blocks] == [BlockStatus.COMPLETE, BlockStatus.COMPLETE]
    assert acc.stop_reason == "tool_use"
    assert acc.message_id == "msg_014p7gG3wDgGV9EUtLvnow3U"
    assert acc.usage == Usage(input_tokens=472, output_tokens=89)
    assert acc.ended
    assert out[0] == MessageStart("msg_014p7gG3wDgGV9EUtLvnow3U", "claude-opus-4-8", Usage(472, 2))
    assert BlockStart(1, "tool_use", id="toolu_01T1x1fJ34qAmk2tNTrN7Up6", name="get_weather") in out
    assert StopReason("tool_use", "tool_use") in out


def test_earlier_revision_assembles_the_two_key_input():
    _, acc = assemble(load_text("anthropic_text_tool_earlier_revision.sse"))
    text, tool = acc.blocks
    assert text.text == "Okay, let's check the weather for San Francisco, CA:"
    assert tool.parsed_input() == {"location": "San Francisco, CA", "unit": "fahrenheit"}
    assert tool.status() is BlockStatus.COMPLETE
    assert acc.stop_reason == "tool_use"
    assert acc.ended


def test_the_thinking_part_of_the_output_tokens_is_read_where_the_api_shows_it():
    # newer responses show it in message_delta's output_tokens_details; output_tokens includes it
    _out, acc = assemble(load_recorded("anthropic_thinking_tool.sse").decode())
    assert (acc.usage.output_tokens, acc.usage.reasoning_tokens) == (92, 53)
    # older ones do not say (the thinking is in output_tokens still): None, never a made-up 0
    _out, acc = assemble(load_recorded("anthropic_thinking_text_endash.sse").decode())
    assert (acc.usage.output_tokens, acc.usage.reasoning_tokens) == (234, None)


def test_basic_text_skips_pings_and_takes_the_last_usage():
    out, acc = assemble(load_text("anthropic_basic_text.sse"))
    assert [b.to_content() for b in acc.blocks] == [{"type": "text", "text": "Hello!"}]
    assert acc.usage == Usage(input_tokens=25, output_tokens=15)  # 15 replaces 1, never 16
    assert acc.stop_reason == "end_turn"
    assert out[-1] == StreamEnd()
    assert UsageUpdate(Usage(output_tokens=15)) in out


def test_thinking_keeps_text_and_signature():
    _, acc = assemble(load_text("anthropic_thinking.sse"))
    thinking, text = acc.blocks
    assert thinking.kind == "thinking"
    assert thinking.text == (
        "I need to find the GCD of 1071 and 462 using the Euclidean algorithm.\n\n1071 = 2 \u00d7 462 + 147"
        "\n462 = 3 \u00d7 147 + 21\n147 = 7 \u00d7 21 + 0\nThe remainder is 0, so GCD(1071, 462) = 21."
    )
    assert thinking.signature == "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..."
    assert thinking.status() is BlockStatus.COMPLETE
    assert text.text == "The greatest common divisor of 1071 and 462 is **21**."
    assert acc.usage == Usage()  # the documented example carries no usage at all
    assert acc.ended


def test_padded_recording_parses_by_json():
    out, acc = assemble(load_text("anthropic_thinking_recorded_padded.sse"))
    thinking, text = acc.blocks
    assert thinking.text.startswith("This is a straightforward question about pedestrian safety.")
    assert thinking.text.endswith("could help prevent accidents.")
    assert thinking.signature.startswith("EvMCCkYICxgCKkCHP2cSuEdc")
    assert thinking.signature.endswith("QYAQ==")
    assert ThinkingDelta(0, "") in out  # the empty final thinking delta is passed on harmlessly
    assert thinking.status() is BlockStatus.COMPLETE
    assert text.text.startswith("Here are the basic steps for safely crossing the street:\n\n**At intersections")
    assert text.text.endswith("Always prioritize safety over speed when crossing streets.")
    assert acc.usage == Usage(43, 282, 0, 0)
    assert out[0] == MessageStart("msg_01ALwQ87pTS7hH1PjSdC9wJD", "claude-sonnet-4-20250514", Usage(43, 1, 0, 0))
    assert acc.stop_reason == "end_turn"
    assert acc.ended


def test_redacted_thinking_arrives_whole_in_its_start():
    out, acc = assemble(load_text("anthropic_redacted_thinking_recorded.sse"))
    first, second, text = acc.blocks
    assert first.kind == second.kind == "redacted_thinking"
    assert first.to_content()["data"].startswith("EqkECkYIBxgCKkA8AZ4noDfV5VcOJe")
    assert first.to_content()["data"].endswith("J/hgB")
    assert second.to_content()["data"].endswith("dZ1J0GAE=")
    assert first.status() is second.status() is BlockStatus.COMPLETE
    start = next(e for e in out if isinstance(e, BlockStart))
    assert start.data is not None
    assert start.data["type"] == "redacted_thinking"
    assert text.text.endswith("How can I assist you today with a legitimate task or question?")
    assert acc.usage == Usage(92, 189, 0, 0)


def test_error_event_becomes_a_provider_error_event():
    out, acc = assemble(load_text("anthropic_error_event.sse"))
    assert out == [ProviderErrorEvent("overloaded_error", "Overloaded")]
    assert acc.error == out[0]
    assert not acc.ended
    error = ADAPTER.classify_stream_error(out[0])
    assert error.error_class is ErrorClass.RETRYABLE
    assert error.kind == "overloaded"


@pytest.mark.parametrize("name", ANTHROPIC_FIXTURES)
def test_every_stream_ends_with_exactly_one_stream_end(name: str):
    out = parse(sse_events(load_text(name)))
    assert out[-1] == StreamEnd()
    assert sum(isinstance(e, StreamEnd) for e in out) == 1
    assert sum(isinstance(e, StopReason) for e in out) == 1


@pytest.mark.parametrize("name", ANTHROPIC_FIXTURES)
def test_a_stream_cut_before_its_terminator_never_ends(name: str):
    text = load_text(name)
    for cut in cut_points(text):
        _, acc = assemble(text[:cut])
        assert not acc.ended, f"{name} cut at byte {cut} reported a complete stream"
    _, acc = assemble(text)
    assert acc.ended


def test_a_cut_tool_call_stays_partial():
    text = load_text("anthropic_text_tool.sse")
    cut = text.index('partial_json":"o,"')
    _, acc = assemble(text[:cut])
    assert acc.blocks[0].status() is BlockStatus.COMPLETE
    assert acc.blocks[1].status() is BlockStatus.PARTIAL
    assert acc.stop_reason is None


# -- event shapes ---------------------------------------------------------------------


def test_cumulative_usage_replaces_across_several_message_deltas():
    parser = AnthropicStreamParser()
    acc = Accumulator()
    for data in (
        {
            "type": "message_start",
            "message": {"id": "m", "model": "x", "usage": {"input_tokens": 10, "output_tokens": 1}},
        },
        {"type": "message_delta", "delta": {"stop_reason": None}, "usage": {"output_tokens": 30}},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"input_tokens": 12, "output_tokens": 50},
        },
    ):
        for out in parser.feed(ev(data)):
            acc.apply(out)
    assert acc.usage == Usage(input_tokens=12, output_tokens=50)
    assert acc.stop_reason == "end_turn"


def test_message_start_keeps_cache_fields_and_counts_them_as_input():
    usage = {"input_tokens": 5, "output_tokens": 1, "cache_creation_input_tokens": 7, "cache_read_input_tokens": 9}
    out = feed_one({"type": "message_start", "message": {"id": "msg", "model": "claude", "usage": usage}})
    # Usage's input tokens are all of them (OpenAI's meaning): Anthropic's 5 leave out the 16 cached
    assert out == [MessageStart("msg", "claude", Usage(21, 1, 7, 9))]


def test_a_later_input_count_without_the_cache_fields_still_counts_the_cached_tokens():
    parser = AnthropicStreamParser()
    acc = Accumulator()
    start = {"input_tokens": 5, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 900}
    for data in (
        {"type": "message_start", "message": {"id": "m", "model": "x", "usage": start}},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"input_tokens": 8, "output_tokens": 40},
        },
    ):
        for out in parser.feed(ev(data)):
            acc.apply(out)
    assert acc.usage == Usage(
        input_tokens=908, output_tokens=40, cache_creation_input_tokens=0, cache_read_input_tokens=900
    )


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("end_turn", "end_turn"),
        ("tool_use", "tool_use"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("pause_turn", "pause_turn"),
        ("refusal", "refusal"),
        ("model_context_window_exceeded", "context_overflow"),
        ("some_future_reason", "some_future_reason"),
    ],
)
def test_stop_reasons_are_normalized_and_keep_the_raw_value(raw: str, normalized: str):
    out = feed_one({"type": "message_delta", "delta": {"stop_reason": raw, "stop_sequence": None}})
    # the raw value is the attempt's answer metadata too: the healing endpoint writes it back as sent
    assert out == [StopReason(normalized, raw), AnswerMetadata({"stop_reason": raw})]


def test_stop_details_are_kept_as_the_api_sent_them():
    details = {"type": "refusal", "category": "cyber", "explanation": "Blocked."}
    out = feed_one({"type": "message_delta", "delta": {"stop_reason": "refusal", "stop_details": details}})
    assert out == [
        StopReason("refusal", "refusal"),
        AnswerMetadata({"stop_reason": "refusal", "stop_details": details}),
    ]
    ordinary = feed_one({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_details": None}})
    assert ordinary[1] == AnswerMetadata({"stop_reason": "end_turn", "stop_details": None})  # null, as sent


def test_stop_details_that_are_not_an_object_are_a_parse_error():
    with pytest.raises(ParseError):
        feed_one({"type": "message_delta", "delta": {"stop_reason": "refusal", "stop_details": "cyber"}})


def test_the_stop_sequence_that_matched_is_kept_to_the_attempts_end():
    parser = AnthropicStreamParser()
    acc = Accumulator()
    delta = {"type": "message_delta", "delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"}}
    out = parser.feed(ev(delta))
    assert out == [
        StopReason("stop_sequence", "stop_sequence", "END"),
        AnswerMetadata({"stop_reason": "stop_sequence"}),
    ]
    acc.apply(out[0])
    assert (acc.snapshot().stop_reason, acc.snapshot().stop_sequence) == ("stop_sequence", "END")


def test_a_stop_sequence_that_is_not_a_string_is_a_parse_error():
    with pytest.raises(ParseError):
        feed_one({"type": "message_delta", "delta": {"stop_reason": "stop_sequence", "stop_sequence": 7}})


def test_message_delta_without_a_stop_reason_or_usage_emits_nothing():
    assert feed_one({"type": "message_delta", "delta": {"stop_reason": None}}) == []


@pytest.mark.parametrize(
    "data",
    [
        {"type": "ping"},
        {"type": "some_new_event", "payload": [1, 2]},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "some_new_delta", "content": "…"}},
    ],
)
def test_pings_and_unknown_types_are_ignored(data: dict[str, Any]):
    assert feed_one(data) == []


def test_citations_and_compaction_deltas_are_kept():
    """They fill what history must carry back (a text block's citations, a compaction's summary)."""
    citation = {"type": "web_search_result_location", "cited_text": "x", "encrypted_index": "Eo8B"}
    cite = {"type": "content_block_delta", "index": 2, "delta": {"type": "citations_delta", "citation": citation}}
    assert feed_one(cite) == [CitationDelta(2, citation)]
    compact = {"type": "content_block_delta", "index": 0, "delta": {"type": "compaction_delta", "content": "…"}}
    assert feed_one(compact) == [FieldDelta(0, "content", "…")]


def test_deltas_map_to_their_events():
    parser = AnthropicStreamParser()

    def delta(d: dict[str, Any]) -> list[StreamEvent]:
        return parser.feed(ev({"type": "content_block_delta", "index": 3, "delta": d}))

    assert delta({"type": "text_delta", "text": "hi"}) == [TextDelta(3, "hi")]
    assert delta({"type": "input_json_delta", "partial_json": '{"a'}) == [ToolArgsDelta(3, '{"a')]
    assert delta({"type": "thinking_delta", "thinking": "hm"}) == [ThinkingDelta(3, "hm")]
    assert delta({"type": "signature_delta", "signature": "sig"}) == [SignatureDelta(3, "sig")]
    assert parser.feed(ev({"type": "content_block_stop", "index": 3})) == [BlockStop(3)]


def test_tool_use_start_ignores_the_placeholder_input():
    block = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    assert feed_one({"type": "content_block_start", "index": 1, "content_block": block}) == [
        BlockStart(1, "tool_use", id="toolu_1", name="f")
    ]


def test_server_tool_use_keeps_its_kind_id_and_name():
    block = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    (start,) = feed_one({"type": "content_block_start", "index": 1, "content_block": block})
    assert isinstance(start, BlockStart)
    assert (start.kind, start.id, start.name, start.data) == ("server_tool_use", "srvtoolu_1", "web_search", block)


def test_unknown_block_types_are_kept_opaquely():
    block = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [{"url": "u"}]}
    out = feed_one({"type": "content_block_start", "index": 2, "content_block": block})
    acc = Accumulator()
    for event in [*out, BlockStop(2)]:
        acc.apply(event)
    assert acc.blocks[0].to_content() == block


def test_thinking_start_with_a_signature_and_no_deltas():
    # thinking.display "omitted": the block may open with content already set.
    block = {"type": "thinking", "thinking": "", "signature": "sig"}
    out = feed_one({"type": "content_block_start", "index": 0, "content_block": block})
    assert out == [BlockStart(0, "thinking"), SignatureDelta(0, "sig")]


def test_error_event_keeps_request_id_and_tolerates_details():
    data = {
        "type": "error",
        "error": {"details": None, "type": "overloaded_error", "message": "Overloaded"},
        "request_id": "req_vrtx_1",
    }
    assert feed_one(data) == [ProviderErrorEvent("overloaded_error", "Overloaded", "req_vrtx_1")]


def test_json_type_wins_and_the_event_name_is_the_fallback():
    assert feed_one({"type": "message_stop"}, name="ping") == [StreamEnd()]
    assert feed_one('{"index": 4}', name="content_block_stop") == [BlockStop(4)]


def test_padding_and_a_data_line_without_space_are_both_json():
    (event,) = sse_events('event: message_stop\ndata:{"type":"message_stop"        }\n\n')
    assert AnthropicStreamParser().feed(event) == [StreamEnd()]


@pytest.mark.parametrize(
    ("data", "name"),
    [
        ("not json", "content_block_delta"),
        ('{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}', None),
        ("[1, 2]", "message_start"),
        ('"message_stop"', "message_stop"),
        ('{"index": 0}', None),  # no type and no event name to fall back on
        ('{"type": 7}', "message_stop"),
        ('{"type": "content_block_delta", "delta": {"type": "text_delta", "text": "a"}}', None),
        ('{"type": "content_block_delta", "index": "0", "delta": {"type": "text_delta", "text": "a"}}', None),
        ('{"type": "content_block_delta", "index": 0}', None),
        ('{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}}', None),
        ('{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}}', None),
        ('{"type": "content_block_delta", "index": 0, "delta": "text"}', None),
        ('{"type": "content_block_start", "index": 0}', None),
        ('{"type": "content_block_start", "index": 0, "content_block": {"text": ""}}', None),
        ('{"type": "content_block_stop"}', None),
        ('{"type": "message_start"}', None),
        ('{"type": "message_delta", "delta": "end_turn"}', None),
    ],
)
def test_bad_data_raises_parse_error(data: str, name: str | None):
    with pytest.raises(ParseError):
        AnthropicStreamParser().feed(SSEEvent(name or "message", data))


def test_parse_error_names_the_event_and_truncates_the_excerpt():
    data = "x" * 5000
    with pytest.raises(ParseError) as info:
        AnthropicStreamParser().feed(SSEEvent("content_block_delta", data))
    message = str(info.value)
    assert "content_block_delta" in message
    assert "xxxx" in message
    assert len(message) < 400


# -- requests -------------------------------------------------------------------------


def test_request_url_headers_and_body():
    config = ProviderConfig(
        name="anthropic",
        base_url="https://api.anthropic.com/",
        api_key="sk-secret",
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
        anthropic_version="2023-06-01",
    )
    request = ModelRequest(
        model="claude-sonnet-4-5",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_tokens=512,
        system="Be brief.",
        tools=(ToolSpec("get_weather", "Weather for a place", {"type": "object"}),),
        thinking_budget=2048,
        temperature=0.5,
        extra={"metadata": {"user_id": "u1"}},
    )
    http = AnthropicAdapter(config).build_request(request)
    assert (http.method, http.url) == ("POST", "https://api.anthropic.com/v1/messages")
    assert http.headers == {
        "x-api-key": "sk-secret",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
        "accept": "text/event-stream",
        "anthropic-beta": "interleaved-thinking-2025-05-14",
    }
    assert http.json == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 512,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "stream": True,
        "system": "Be brief.",
        "tools": [{"name": "get_weather", "description": "Weather for a place", "input_schema": {"type": "object"}}],
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "temperature": 0.5,
        "metadata": {"user_id": "u1"},
    }
    assert http.redacted()["headers"]["x-api-key"] == "[redacted]"


def test_a_requests_beta_flags_join_those_of_the_settings_in_one_header():
    config = ProviderConfig(name="a", base_url="https://x", api_key="k", extra_headers={"Anthropic-Beta": "b1, b2"})
    request = ModelRequest(model="m", messages=[{"role": "user", "content": "Hi"}], betas=("b2", "mcp", "mcp"))
    headers = AnthropicAdapter(config).build_request(request).headers
    assert [(k, v) for k, v in headers.items() if k.lower() == "anthropic-beta"] == [("Anthropic-Beta", "b1,b2,mcp")]
    counted = AnthropicAdapter(config).count_request(request)
    assert counted is not None
    assert counted.headers["Anthropic-Beta"] == "b1,b2,mcp"  # the count takes the beta-gated fields too


def test_request_leaves_out_unset_options():
    http = ADAPTER.build_request(ModelRequest(model="m", messages=[{"role": "user", "content": "Hi"}]))
    assert http.json == {
        "model": "m",
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
    }


def test_request_maps_every_canonical_block():
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?", "cache_control": {"type": "ephemeral"}}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Let me look.", "signature": "sig=="},
                {"type": "redacted_thinking", "data": "EqkE"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"location": "SF"}},
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "15 degrees"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "boom"}],
                    "is_error": True,
                },
                {"type": "tool_result", "tool_use_id": "toolu_3", "content": "ok", "is_error": False},
                image,
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "It is"}], "prefix": True},
    ]
    sent = ADAPTER.build_request(ModelRequest(model="claude-sonnet-4-5", messages=messages)).json["messages"]
    assert sent == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?", "cache_control": {"type": "ephemeral"}}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Let me look.", "signature": "sig=="},
                {"type": "redacted_thinking", "data": "EqkE"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"location": "SF"}},
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "15 degrees"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "boom"}],
                    "is_error": True,
                },
                {"type": "tool_result", "tool_use_id": "toolu_3", "content": "ok"},
                image,
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "It is"}]},  # prefill: no "prefix" key
    ]


def test_assembled_blocks_round_trip_into_the_next_request():
    _, acc = assemble(load_text("anthropic_thinking_recorded_padded.sse"))
    content = [b.to_content() for b in acc.blocks]
    sent = ADAPTER.build_request(ModelRequest(model="m", messages=[{"role": "assistant", "content": content}])).json
    assert sent["messages"][0]["content"] == content  # byte-exact thinking + signature


# -- errors ---------------------------------------------------------------------------


def body(error_type: str, message: str, **extra: Any) -> bytes:
    return json.dumps({"type": "error", "error": {"type": error_type, "message": message, **extra}}).encode()


@pytest.mark.parametrize(
    ("status", "payload", "error_class", "kind"),
    [
        (400, body("invalid_request_error", "messages: field required"), ErrorClass.PERMANENT, "invalid_request"),
        (
            400,
            body("invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"),
            ErrorClass.PERMANENT,
            "context_overflow",
        ),
        (
            400,
            body("invalid_request_error", "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000"),
            ErrorClass.PERMANENT,
            "context_overflow",
        ),
        (
            400,
            body(
                "invalid_request_error",
                "This model does not support assistant message prefill. The conversation must end with a user message.",
            ),
            ErrorClass.PREFILL_REFUSED,
            "prefill_refused",
        ),
        (
            400,
            body("invalid_request_error", "The conversation must end with a user message."),
            ErrorClass.PREFILL_REFUSED,
            "prefill_refused",
        ),
        (
            400,
            body(
                "invalid_request_error", "You have reached your specified API usage limits. You will regain access on…"
            ),
            ErrorClass.PERMANENT,
            "spend_limit",
        ),
        (401, body("authentication_error", "invalid x-api-key"), ErrorClass.PERMANENT, "unauthorized"),
        (402, body("billing_error", "credit balance too low"), ErrorClass.PERMANENT, "billing"),
        (403, body("permission_error", "no access"), ErrorClass.PERMANENT, "permission_denied"),
        (404, body("not_found_error", "model: claude-x"), ErrorClass.PERMANENT, "model_not_found"),
        (408, body("timeout_error", "slow"), ErrorClass.RETRYABLE, "timeout"),
        (409, body("conflict_error", "conflict"), ErrorClass.RETRYABLE, "conflict"),
        (413, body("request_too_large", "Request exceeds the maximum size"), ErrorClass.PERMANENT, "request_too_large"),
        (
            429,
            body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
            ErrorClass.RETRYABLE,
            "rate_limited",
        ),
        (
            429,
            body("rate_limit_error", "spend cap reached", details={"error_code": "enforced_spend_limit_reached"}),
            ErrorClass.PERMANENT,
            "spend_limit",
        ),
        (500, body("api_error", "Internal server error"), ErrorClass.RETRYABLE, "server_error"),
        (502, b"<html>Bad Gateway</html>", ErrorClass.RETRYABLE, "server_error"),
        (503, b"", ErrorClass.RETRYABLE, "server_error"),
        (504, body("timeout_error", "Request timed out"), ErrorClass.RETRYABLE, "timeout"),
        (529, body("overloaded_error", "Overloaded"), ErrorClass.RETRYABLE, "overloaded"),
        (422, body("invalid_request_error", "bad"), ErrorClass.PERMANENT, "invalid_request"),
    ],
)
def test_http_error_classification(status: int, payload: bytes, error_class: ErrorClass, kind: str):
    error = ADAPTER.classify_http_error(status, {}, payload)
    assert (error.error_class, error.kind, error.status) == (error_class, kind, status)
    assert error.message


def test_http_error_message_and_request_id():
    payload = json.dumps(
        {"type": "error", "error": {"type": "not_found_error", "message": "model: x"}, "request_id": "req_body"}
    ).encode()
    assert ADAPTER.classify_http_error(404, {}, payload).request_id == "req_body"
    error = ADAPTER.classify_http_error(404, {"Request-Id": "req_header"}, payload)
    assert (error.request_id, error.message) == ("req_header", "model: x")


def test_non_json_body_still_classifies_with_a_clear_message():
    error = ADAPTER.classify_http_error(502, {}, b"<html><body>502 Bad Gateway</body></html>\xff")
    assert error.error_class is ErrorClass.RETRYABLE
    assert "502" in error.message
    assert "Bad Gateway" in error.message


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "30"}, 30.0),
        ({"Retry-After": "1.5"}, 1.5),
        ({"retry-after-ms": "2500", "retry-after": "30"}, 2.5),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_forms(headers: dict[str, str], expected: float | None):
    assert ADAPTER.classify_http_error(429, headers, body("rate_limit_error", "slow down")).retry_after_s == expected


def test_retry_after_as_an_http_date():
    date = email.utils.formatdate(time.time() + 120, usegmt=True)
    retry_after = ADAPTER.classify_http_error(529, {"retry-after": date}, b"").retry_after_s
    assert retry_after is not None
    assert 100 < retry_after <= 121


@pytest.mark.parametrize(
    ("status", "header", "expected"),
    [
        (529, "false", ErrorClass.PERMANENT),
        (500, "False", ErrorClass.PERMANENT),
        (400, "true", ErrorClass.RETRYABLE),
        (429, "true", ErrorClass.RETRYABLE),
        (401, "maybe", ErrorClass.PERMANENT),  # not a boolean: the status policy stands
    ],
)
def test_x_should_retry_overrides_the_status_policy(status: int, header: str, expected: ErrorClass):
    error = ADAPTER.classify_http_error(status, {"x-should-retry": header}, body("api_error", "x"))
    assert error.error_class is expected


def test_x_should_retry_does_not_hide_a_prefill_refusal():
    payload = body("invalid_request_error", "This model does not support assistant message prefill.")
    error = ADAPTER.classify_http_error(400, {"x-should-retry": "true"}, payload)
    assert error.error_class is ErrorClass.PREFILL_REFUSED


@pytest.mark.parametrize(
    ("error_type", "message", "error_class", "kind"),
    [
        ("overloaded_error", "Overloaded", ErrorClass.RETRYABLE, "overloaded"),
        ("api_error", "Internal server error", ErrorClass.RETRYABLE, "server_error"),
        ("rate_limit_error", "slow down", ErrorClass.RETRYABLE, "rate_limited"),
        ("timeout_error", "timed out", ErrorClass.RETRYABLE, "timeout"),
        ("invalid_request_error", "bad request", ErrorClass.PERMANENT, "invalid_request"),
        ("invalid_request_error", "prompt is too long: 1 > 0", ErrorClass.PERMANENT, "context_overflow"),
        ("authentication_error", "bad key", ErrorClass.PERMANENT, "unauthorized"),
        ("permission_error", "no", ErrorClass.PERMANENT, "permission_denied"),
        ("not_found_error", "no", ErrorClass.PERMANENT, "model_not_found"),
        ("billing_error", "no", ErrorClass.PERMANENT, "billing"),
        ("request_too_large", "no", ErrorClass.PERMANENT, "request_too_large"),
        ("brand_new_error", "?", ErrorClass.RETRYABLE, "server_error"),
    ],
)
def test_stream_error_classification(error_type: str, message: str, error_class: ErrorClass, kind: str):
    error = ADAPTER.classify_stream_error(ProviderErrorEvent(error_type, message, "req_1"))
    assert (error.error_class, error.kind, error.request_id) == (error_class, kind, "req_1")
    assert error_type in error.message


# -- continuation strategy ------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "thinking", "expected"),
    [
        ("claude-sonnet-4-5-20250929", False, Strategy.PREFILL),
        ("claude-opus-4-5", False, Strategy.PREFILL),
        ("claude-haiku-4-5", False, Strategy.PREFILL),
        ("claude-3-7-sonnet-latest", False, Strategy.PREFILL),
        ("claude-sonnet-4-5-20250929", True, Strategy.CONTINUE_MESSAGE),
        ("claude-opus-4-6", False, Strategy.CONTINUE_MESSAGE),
        ("claude-opus-4-7-20260301", False, Strategy.CONTINUE_MESSAGE),
        ("claude-opus-4-8", False, Strategy.CONTINUE_MESSAGE),
        ("claude-sonnet-4-6", False, Strategy.CONTINUE_MESSAGE),
        ("claude-sonnet-5", False, Strategy.CONTINUE_MESSAGE),
        ("claude-mythos-preview", False, Strategy.CONTINUE_MESSAGE),
        ("anthropic.claude-opus-4-6-v1:0", False, Strategy.CONTINUE_MESSAGE),
        ("fake-noprefill-model", False, Strategy.CONTINUE_MESSAGE),
    ],
)
def test_strategy_table(model: str, thinking: bool, expected: Strategy):
    assert ADAPTER.continuation_strategy(model, thinking=thinking) is expected


def test_no_prefill_table_is_documented_globs():
    assert all("*" in pattern for pattern in NO_PREFILL_MODELS)


def test_strategy_overrides_come_first_and_the_first_match_wins():
    config = ProviderConfig(
        name="anthropic",
        base_url="https://api.anthropic.com",
        strategy_overrides={"claude-opus-4-6*": "prefill", "claude-*": "continue_message"},
    )
    adapter = AnthropicAdapter(config)
    assert adapter.continuation_strategy("claude-opus-4-6", thinking=True) is Strategy.PREFILL
    assert adapter.continuation_strategy("claude-haiku-4-5", thinking=False) is Strategy.CONTINUE_MESSAGE
    assert adapter.continuation_strategy("other", thinking=False) is Strategy.PREFILL


def test_an_invalid_override_is_a_clear_error():
    config = ProviderConfig(name="anthropic", base_url="u", strategy_overrides={"*": "rewind"})
    with pytest.raises(ValueError, match="rewind"):
        AnthropicAdapter(config).continuation_strategy("claude", thinking=False)


def test_prefill_is_never_echoed():
    assert ADAPTER.echoes_prefix is False
    assert ADAPTER.name == "anthropic"


def test_a_blank_assistant_text_block_is_kept_in_history_but_never_sent() -> None:
    """A web search answer sends " " and "\\n\\n" as text blocks between its cited spans; the API
    refuses a whitespace-only text block in a request (400 "text content blocks must contain
    non-whitespace text"), so the request leaves it out."""
    assistant = [
        {"type": "text", "text": "Cited.", "citations": [{"type": "web_search_result_location", "cited_text": "c"}]},
        {"type": "text", "text": " "},
        {"type": "text", "text": "\n\n"},
        {"type": "text", "text": "Plain."},
    ]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "News?"}]},
        {"role": "assistant", "content": assistant},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]
    body = ADAPTER.build_request(ModelRequest(model="claude-sonnet-4-5", messages=messages, max_tokens=100)).json
    assert body["messages"][1]["content"] == [assistant[0], assistant[3]]


def test_a_responses_search_and_its_annotations_are_not_sent_to_anthropic_after_a_failover() -> None:
    """A Responses answer kept before a failover to Anthropic: its web search call has no Anthropic
    block and its url citations no Anthropic citation (the API refuses unknown types), so the text
    goes back plain; Anthropic's own citations go back as they came."""
    url = {"type": "url_citation", "url": "https://example.com/a", "title": "A", "start_index": 0, "end_index": 5}
    own = {"type": "web_search_result_location", "cited_text": "c", "url": "https://example.com/b"}
    assistant = [
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}},
        {"type": "text", "text": "Rivers flow.", "citations": [url]},
        {"type": "text", "text": "Cited.", "citations": [url, own]},
    ]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "News?"}]},
        {"role": "assistant", "content": assistant},
    ]
    body = ADAPTER.build_request(ModelRequest(model="claude-sonnet-4-5", messages=messages, max_tokens=100)).json
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "Rivers flow."},
        {"type": "text", "text": "Cited.", "citations": [own]},
    ]


def test_a_cited_text_start_says_so_to_the_engine() -> None:
    start = {"type": "content_block_start", "index": 3, "content_block": {"citations": [], "type": "text", "text": ""}}
    assert feed_one(start) == [BlockStart(3, "text", data={"citations": []})]
    plain = {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}}
    assert feed_one(plain) == [BlockStart(2, "text")]
