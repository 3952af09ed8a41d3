"""A character beyond the BMP whose UTF-16 pair a server split across two deltas (``\\ud83d``
ending one, ``\\ude80`` starting the next: legal JSON escapes) is the model's character,
streamed and stored once, in order, on every wire; a half with no pair is U+FFFD (it has no
UTF-8 form), as before. Through the parsers, then through the engine with a break between
the two halves."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamrecover.engine.blocks import Accumulator
from streamrecover.engine.contract import ProviderConfig
from streamrecover.engine.events import ProviderErrorEvent, StreamEvent, TextDelta, ToolArgsDelta
from streamrecover.engine.sse import SSEEvent
from streamrecover.providers.openai_responses import ResponsesStreamParser
from streamrecover.providers.registry import get_adapter

from .harness import assert_invariants, run
from .recorded_reading import _text, anthropic_stream

ROCKET = "\U0001f680"
HIGH, LOW = "\ud83d", "\ude80"  # ROCKET's UTF-16 pair, each half a lone surrogate alone
WIRES = ["anthropic", "openai", "gemini", "openai-responses"]


def _sse(payload: dict[str, Any], name: str = "message") -> SSEEvent:
    return SSEEvent(name, json.dumps(payload))  # ensure_ascii: a lone surrogate goes as its escape


def _anthropic(pieces: list[str]) -> list[SSEEvent]:
    events = [
        {"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {"input_tokens": 3}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}} for p in pieces),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]
    return [_sse(e, e["type"]) for e in events]


def _openai(pieces: list[str]) -> list[SSEEvent]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> SSEEvent:
        return _sse({"id": "c1", "model": "gpt", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    return [*(chunk({"content": p}) for p in pieces), chunk({}, "stop"), SSEEvent("message", "[DONE]")]


def _gemini(pieces: list[str]) -> list[SSEEvent]:
    def chunk(text: str, finish: str | None) -> SSEEvent:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
        if finish:
            candidate["finishReason"] = finish
        return _sse({"candidates": [candidate], "responseId": "r1"})

    return [chunk(p, "STOP" if i == len(pieces) - 1 else None) for i, p in enumerate(pieces)]


def _responses(pieces: list[str]) -> list[SSEEvent]:
    message = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    part = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    events = [
        {"type": "response.created", "response": {"id": "resp_1", "model": "gpt"}},
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {"type": "response.content_part.added", **part, "part": {"type": "output_text", "text": ""}},
        *({"type": "response.output_text.delta", **part, "delta": p} for p in pieces),
        {"type": "response.content_part.done", **part, "part": {"type": "output_text"}},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {"type": "response.completed", "response": {"id": "resp_1", "output": []}},
    ]
    return [_sse({**e, "sequence_number": n}, e["type"]) for n, e in enumerate(events)]


STREAMS = {"anthropic": _anthropic, "openai": _openai, "gemini": _gemini, "openai-responses": _responses}


def _parse(wire: str, events: list[SSEEvent]) -> list[StreamEvent]:
    parser = get_adapter(ProviderConfig(name=wire, base_url="http://unused", api_key="k")).new_parser()
    return [out for event in events for out in parser.feed(event)]


def _read(wire: str, pieces: list[str]) -> tuple[str, str]:
    """The text block as stored (accumulated) and as streamed (its deltas, one by one)."""
    out = _parse(wire, STREAMS[wire](pieces))
    acc = Accumulator()
    for event in out:
        acc.apply(event)
    streamed = [e.text for e in out if isinstance(e, TextDelta)]
    for text in streamed:
        text.encode("utf-8")  # each delta, as a client gets it, has a UTF-8 form: no half character
    (block,) = acc.blocks
    return block.text, "".join(streamed)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        (["Launch " + HIGH, LOW + " now"], f"Launch {ROCKET} now"),
        ([HIGH, LOW], ROCKET),  # each delta nothing but a half
        (["a" + HIGH, LOW + "b" + HIGH, LOW + "c"], f"a{ROCKET}b{ROCKET}c"),  # a delta with both ends split
        (["a" + HIGH, "b"], "a\ufffdb"),  # the next delta does not begin with its pair
        (["a" + HIGH], "a\ufffd"),  # the block ends after it
        ([LOW + "x"], "\ufffdx"),  # a low half with nothing before it
        (["a" + LOW, HIGH + "b"], "a\ufffd\ufffdb"),  # halves in the wrong order are no pair
    ],
)
def test_a_pair_split_across_two_deltas_is_one_character_stored_and_streamed(wire, pieces, expected) -> None:
    stored, streamed = _read(wire, pieces)
    assert stored == expected
    assert streamed == expected


def test_a_pair_split_in_tool_arguments_is_joined_while_another_call_streams_between() -> None:
    def call(index: int, arguments: str, start: bool = False) -> dict[str, Any]:
        function = {"name": f"tool{index}", "arguments": arguments} if start else {"arguments": arguments}
        return {"index": index, **({"id": f"call_{index}"} if start else {}), "function": function}

    def chunk(calls: list[dict[str, Any]], finish: str | None = None) -> SSEEvent:
        delta = {"tool_calls": calls} if calls else {}
        return _sse({"id": "c1", "model": "gpt", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    events = [
        chunk([call(0, '{"q": "go ' + HIGH, start=True)]),
        chunk([call(1, "{}", start=True)]),  # the second call, between the two halves
        chunk([call(0, LOW + '"}')]),
        chunk([], "tool_calls"),
        SSEEvent("message", "[DONE]"),
    ]
    out = _parse("openai", events)
    acc = Accumulator()
    for event in out:
        acc.apply(event)
    assert [b.parsed_input() for b in acc.blocks] == [{"q": f"go {ROCKET}"}, {}]
    # the events keep their order: the second call's arguments still come after the first's start
    assert [(e.index, e.partial_json) for e in out if isinstance(e, ToolArgsDelta)] == [
        (1, '{"q": "go '),
        (2, "{}"),
        (1, ROCKET + '"}'),
    ]


def test_a_provider_error_after_a_high_half_drops_the_half_for_the_continuation_to_write() -> None:
    events = _anthropic(["Launch " + HIGH])[:3]
    events.append(_sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error"))
    out = _parse("anthropic", events)
    assert [e for e in out if isinstance(e, TextDelta)] == [TextDelta(0, "Launch ")]
    assert isinstance(out[-1], ProviderErrorEvent)


def test_a_responses_resume_point_stays_before_a_held_half() -> None:
    """A native resume re-attaches after the last event whose content went on: the event that
    ended with half a character is sent again, and joined with its pair then."""
    events = _responses(["Launch " + HIGH, LOW + " now"])
    parser = ResponsesStreamParser()
    for event in events[:3]:
        parser.feed(event)
    before = parser.resume_point()
    assert before is not None
    assert parser.feed(events[3]) == []  # the delta that ends with the high half: held
    assert parser.resume_point() == before
    assert [e.text for e in parser.feed(events[4]) if isinstance(e, TextDelta)] == ["Launch ", f"{ROCKET} now"]
    point = parser.resume_point()
    assert point is not None
    assert point.after == 4


# ---- through the engine, with a break between the two halves ---------------------------------

# the builder writes UTF-8, which has no lone surrogate: each half goes in as its JSON escape
SPLIT = (
    anthropic_stream([({"type": "text", "text": ""}, _text("Launch HIGH", "LOW now, then the rest."))])
    .replace(b"HIGH", b"\\ud83d")
    .replace(b"LOW", b"\\ude80")
)


@pytest.mark.parametrize("fault", [None, "cut:events=3", "cut:events=3,mid", "cut:events=4"])
async def test_a_split_pair_reaches_the_client_and_the_thread_once_whatever_breaks_between(fake_server, fault):
    # message_start, content_block_start, then the delta ending with the high half (event 3)
    out = await run(fake_server, "Replay", recording=SPLIT, faults=[fault] if fault else [])
    assert_invariants(out)  # among them: what the client shows is what was committed
    expected = [{"type": "text", "text": f"Launch {ROCKET} now, then the rest."}]
    assert out.assistant[-1]["content"] == expected
    streamed = "".join(f["text"] for f in out.frames("text_delta"))
    assert streamed.count(ROCKET) == 1
    assert "\ufffd" not in streamed
    if fault:
        assert len(out.log) == 2  # continued once
