"""Provider data that is well-formed JSON and well-formed SSE but wrong inside: a tool call named
with a number, a delta for a block of another kind, a bad byte after good events in the same
read. Each is a classified break at the last good event, continued; nothing raises out of the
engine, nothing shown is stored differently, nothing received before the break is asked for
again."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from streamrecover.engine.contract import ProviderConfig
from streamrecover.engine.errors import BodyDecodeError, ParseError, SSEError
from streamrecover.engine.sse import SSEDecoder, SSEEvent
from streamrecover.engine.translate import IndexMapper
from streamrecover.providers.anthropic import AnthropicAdapter
from streamrecover.providers.gemini import GeminiAdapter
from streamrecover.providers.openai_chat import OpenAIChatAdapter
from streamrecover.providers.openai_responses import OpenAIResponsesAdapter
from streamrecover.providers.registry import get_adapter

from .harness import with_config
from .scripted import anthropic_blocks, chat_chunk, chat_usage, run_scripted, sse

MODEL = "claude-3-7-sonnet"


def _text(text: str) -> dict[str, Any]:
    return {"type": "text_delta", "text": text}


TEXT_BLOCK = {"type": "text", "text": ""}
REST = anthropic_blocks((TEXT_BLOCK, [_text("It is sunny.")], True), ended=True)


def _answer_text(out: Any) -> str:
    return "".join(block.get("text", "") for block in out.answer if block["type"] == "text")


# -- a tool call whose name or id is not a string ------------------------------------------------

_BAD_CALLS = [({"name": 123}, "name"), ({"id": {"x": 1}}, "id"), ({"id": ["call_1"]}, "id")]


def _parse_all(adapter_cls: Any, payloads: list[dict[str, Any]]) -> None:
    parser = get_adapter(ProviderConfig(name=adapter_cls.name, base_url="https://x.invalid/v1")).new_parser()
    for payload in payloads:
        parser.feed(SSEEvent(payload.get("type", "message"), json.dumps(payload)))


def _anthropic_call(**bad: Any) -> list[dict[str, Any]]:
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}, **bad}
    return [{"type": "content_block_start", "index": 0, "content_block": call}]


def _chat_call(**bad: Any) -> list[dict[str, Any]]:
    fields = {"id": "call_1", "name": "get_weather", **bad}
    call = {"index": 0, "id": fields["id"], "type": "function", "function": {"name": fields["name"], "arguments": ""}}
    return [{"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}]


def _responses_call(**bad: Any) -> list[dict[str, Any]]:
    fields = {"id": "call_1", "name": "get_weather", **bad}
    item = {"type": "function_call", "id": "fc_1", "call_id": fields["id"], "name": fields["name"], "arguments": ""}
    return [{"type": "response.output_item.added", "output_index": 0, "item": item}]


def _gemini_call(**bad: Any) -> list[dict[str, Any]]:
    call = {"name": "get_weather", "args": {}, "id": "call_1", **bad}
    return [{"candidates": [{"content": {"role": "model", "parts": [{"functionCall": call}]}}]}]


@pytest.mark.parametrize(
    ("adapter_cls", "payloads"),
    [
        (AnthropicAdapter, _anthropic_call),
        (OpenAIChatAdapter, _chat_call),
        (OpenAIResponsesAdapter, _responses_call),
        (GeminiAdapter, _gemini_call),
    ],
)
@pytest.mark.parametrize(("bad", "field"), _BAD_CALLS)
def test_every_parser_refuses_a_tool_call_whose_name_or_id_is_not_a_string(adapter_cls, payloads, bad, field):
    with pytest.raises(ParseError, match=field):
        _parse_all(adapter_cls, payloads(**bad))


@pytest.mark.parametrize("bad", [{"name": 123}, {"id": {"x": 1}}])
async def test_a_tool_call_named_with_a_number_is_a_break_continued_not_a_crash(bad):
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}, **bad}
    broken = anthropic_blocks((TEXT_BLOCK, [_text("Let me check. ")], True), (call, [], False))
    out = await run_scripted("anthropic", [(200, {}, broken), (200, {}, REST)], model=MODEL)
    assert out.result.status == "completed", out.result.error
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["cause"] == "sse_parse"
    assert interrupted["kept_text_chars"] == len("Let me check. ")
    assert [a.outcome for a in out.sink.attempts] == ["interrupted", "completed"]
    assert _answer_text(out).startswith("Let me check. ")
    assert [shown for shown, _ in out.view.turns] == [out.answer]


async def test_a_failure_no_check_foresaw_closes_the_attempt_and_keeps_the_text(monkeypatch, caplog):
    """A bug in translating an event (here: making a tool call's id unique) must not leave the
    attempt open and the run stuck: it is an ``unknown`` break, logged with its traceback, and
    what arrived before it is kept and continued."""

    def broken(self: IndexMapper, event: object) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr(IndexMapper, "_unique_tool_id", broken)
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    stream = anthropic_blocks((TEXT_BLOCK, [_text("Let me check. ")], True), (call, [], False))
    with caplog.at_level(logging.ERROR, logger="streamrecover.engine.attempts"):
        out = await run_scripted("anthropic", [(200, {}, stream), (200, {}, REST)], model=MODEL)
    assert out.result.status == "completed", out.result.error
    first = out.sink.attempts[0]
    assert (first.outcome, first.interrupt_cause) == ("interrupted", "unknown")
    assert "RuntimeError: a bug" in (first.error_message or "")
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["kept_text_chars"] == len("Let me check. ")
    assert _answer_text(out).startswith("Let me check. ")
    assert any(record.exc_info for record in caplog.records)


# -- a delta that does not fit its block --------------------------------------------------------


async def test_a_thinking_delta_on_a_text_block_is_never_stored_as_the_answer():
    thinking = {"type": "thinking_delta", "thinking": "SECRET-REASONING"}
    broken = anthropic_blocks((TEXT_BLOCK, [_text("Hi. "), thinking, _text("never applied")], True), ended=True)
    out = await run_scripted("anthropic", [(200, {}, broken), (200, {}, REST)], model=MODEL)
    assert out.result.status == "completed", out.result.error
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["cause"] == "sse_parse"
    assert interrupted["kept_text_chars"] == len("Hi. ")
    assert "SECRET-REASONING" not in json.dumps(out.result.messages)
    assert [shown for shown, _ in out.view.turns] == [out.answer]  # stored = streamed


async def test_a_text_delta_on_a_tool_call_is_neither_shown_nor_lost():
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    args = {"type": "input_json_delta", "partial_json": "{}"}
    broken = anthropic_blocks((call, [args, _text("VISIBLE-TEXT")], True), ended=True)
    out = await run_scripted("anthropic", [(200, {}, broken), (200, {}, REST)], model=MODEL)
    assert out.result.status == "completed", out.result.error
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["cause"] == "sse_parse"
    assert "VISIBLE-TEXT" not in json.dumps(out.sink.frames)
    assert [shown for shown, _ in out.view.turns] == [out.answer]


async def test_an_openai_tool_call_with_a_negative_index_never_lands_on_the_text():
    call = {"index": -1, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    tool_chunk = chat_chunk()
    tool_chunk["choices"][0]["delta"] = {"tool_calls": [call]}
    broken = sse([chat_chunk("Checking. "), tool_chunk, chat_chunk(None, "tool_calls"), None])
    rest = sse([chat_chunk("It is sunny."), chat_chunk(None, "stop"), chat_usage(10, 5), None])
    out = await run_scripted("openai", [(200, {}, broken), (200, {}, rest)])
    assert out.result.status == "completed", out.result.error
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["cause"] == "sse_parse"
    assert not [f for f in out.sink.frames if f["type"] == "tool_call_delta"]  # no call shown that is stored nowhere
    assert [shown for shown, _ in out.view.turns] == [out.answer]


# -- good events in the same read as a bad line -------------------------------------------------

GOOD = anthropic_blocks((TEXT_BLOCK, [_text("Hello "), _text("brave world. ")], False))


@pytest.mark.parametrize(
    ("bad", "cause", "config"),
    [
        (b"event: content_block_delta\ndata: \xff\xfe\n\n", "body_decode", {}),
        (b"data: " + b"a" * 5000, "sse_parse", {"max_line_bytes": 4096}),  # the line's end not here yet
        (b"data: " + b"a" * 5000 + b"\n\n", "sse_parse", {"max_line_bytes": 4096}),
    ],
    ids=["bad-utf8", "long-partial-line", "long-line"],
)
async def test_good_events_read_with_a_bad_line_are_kept_not_asked_for_again(bad, cause, config):
    """One read brings good deltas and then a bad line: the stream breaks at the last good
    event (docs/security.md), so the deltas before it are applied, kept and not paid for twice."""
    out = await run_scripted(
        "anthropic", [(200, {}, GOOD + bad), (200, {}, REST)], model=MODEL, config=with_config(**config)
    )
    assert out.result.status == "completed", out.result.error
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["cause"] == cause
    assert interrupted["kept_text_chars"] == len("Hello brave world. ")
    assert _answer_text(out).startswith("Hello brave world. ")


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (b"data: \xc3\x28\n\n", BodyDecodeError),
        (b"data: ok\r\ndata: \x80\r\n\r\n", BodyDecodeError),
        (b"data: " + b"x" * 200 + b"\n\n", SSEError),
        (b"data: " + b"x" * 200, SSEError),
        (b"data: x\n" * 30, SSEError),  # an event's data too long
    ],
    ids=["bad-utf8", "bad-utf8-crlf", "long-line", "long-partial-line", "long-event"],
)
def test_the_decoder_returns_the_events_before_a_bad_line_then_fails(bad, error):
    decoder = SSEDecoder(max_line_bytes=100)
    events = decoder.feed(b"data: one\n\nevent: e\ndata: two\n\n" + bad)
    assert [(e.event, e.data) for e in events] == [("message", "one"), ("e", "two")]
    assert isinstance(decoder.error, error)
    with pytest.raises(error):
        decoder.feed(b"data: three\n\n")
    # nothing good before it: raised at once, as before
    with pytest.raises(error):
        SSEDecoder(max_line_bytes=100).feed(bad)


# -- the content type ---------------------------------------------------------------------------


async def test_an_event_stream_content_type_in_any_case_is_a_stream():
    whole = anthropic_blocks((TEXT_BLOCK, [_text("Hello")], True), ended=True)
    headers = {"content-type": "Text/Event-Stream; charset=UTF-8"}
    out = await run_scripted("anthropic", [(200, headers, whole)], model=MODEL)
    assert out.result.status == "completed", out.result.error
    assert out.answer == [{"type": "text", "text": "Hello"}]
