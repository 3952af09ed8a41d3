"""The incremental SSE decoder: WHATWG rules, and identical events however the bytes are cut.

Recovery is tested by cutting recorded streams at every byte, so a decoder that behaves
differently at some chunk boundary would make those tests lie. The fixtures are the
recorded provider streams in ``shared/streams`` beside the repository.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import random

import pytest

from streamrecover.engine.blocks import Accumulator, Block
from streamrecover.engine.errors import BodyDecodeError, SSEError
from streamrecover.engine.events import BlockStart, TextDelta, ThinkingDelta, ToolArgsDelta
from streamrecover.engine.sse import SSEDecoder, SSEEvent

from .streams import STREAMS, load_bytes

# name -> (event count, first event type, id found in the first event, last event type, last data)
FIXTURES: dict[str, tuple[int, str, str, str, str | None]] = {
    "anthropic_basic_text.sse": (
        8,
        "message_start",
        "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
        "message_stop",
        '{"type": "message_stop"}',
    ),
    "anthropic_error_event.sse": (1, "error", "overloaded_error", "error", None),
    "anthropic_redacted_thinking_recorded.sse": (
        27,
        "message_start",
        "msg_018XZkwvj9asBiffg3fXt88s",
        "message_stop",
        '{"type":"message_stop"          }',
    ),
    "anthropic_text_tool.sse": (
        27,
        "message_start",
        "msg_014p7gG3wDgGV9EUtLvnow3U",
        "message_stop",
        '{"type":"message_stop"}',
    ),
    "anthropic_text_tool_earlier_revision.sse": (
        30,
        "message_start",
        "msg_014p7gG3wDgGV9EUtLvnow3U",
        "message_stop",
        '{"type":"message_stop"}',
    ),
    "anthropic_thinking.sse": (13, "message_start", "msg_01...", "message_stop", '{"type": "message_stop"}'),
    "anthropic_thinking_recorded_padded.sse": (
        118,
        "message_start",
        "msg_01ALwQ87pTS7hH1PjSdC9wJD",
        "message_stop",
        '{"type":"message_stop"         }',
    ),
    "openai_chat_refusal.sse": (14, "message", "chatcmpl-ABfw4IfQfCCrcuybFm41wJyxjbkz7", "message", "[DONE]"),
    "openai_chat_tool.sse": (18, "message", "chatcmpl-ABfw8AOXnoa2kzy11vVTSjuQhHCQr", "message", "[DONE]"),
    "openai_responses_background_initial.sse": (
        17,
        "response.created",
        "resp_0850765c843cca5300699cc47d93c0819089a181f5feeff8eb",
        "response.completed",
        None,
    ),
    "openai_responses_background_resume_starting_after_0.sse": (
        16,
        "response.queued",
        "resp_0850765c843cca5300699cc47d93c0819089a181f5feeff8eb",
        "response.completed",
        None,
    ),
    "openai_responses_reasoning_tool.sse": (
        14,
        "response.created",
        "resp_0050471a34b36ae60068c97b94a480819587a9d70cf2979b33",
        "response.completed",
        None,
    ),
}
NAMES = sorted(FIXTURES)


def decode(*chunks: bytes, max_line_bytes: int = 1_048_576) -> list[SSEEvent]:
    decoder = SSEDecoder(max_line_bytes)
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
        if decoder.error is not None:  # the events before a bad line come back, then its error
            raise decoder.error
    assert decoder.close() == []
    return events


def bytewise(raw: bytes) -> list[SSEEvent]:
    return decode(*(raw[i : i + 1] for i in range(len(raw))))


def reference(raw: bytes) -> list[SSEEvent]:
    """A slow, literal reading of the WHATWG algorithm, one character at a time."""
    text = raw.decode("utf-8")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char in "\r\n":
            lines.append("".join(current))
            current = []
            if char == "\r" and text[i + 1 : i + 2] == "\n":
                i += 1
        else:
            current.append(char)
        i += 1
    # ``current`` is an unterminated line: discarded at EOF.
    events: list[SSEEvent] = []
    data, event_type, last_id, retry = "", "", None, None
    for line in lines:
        if line == "":
            if data != "":
                events.append(SSEEvent(event_type or "message", data[:-1], last_id, retry))
            data, event_type, retry = "", "", None
            continue
        if line.startswith(":"):
            continue
        if ":" in line:
            name, value = line.split(":", 1)
            if value.startswith(" "):
                value = value[1:]
        else:
            name, value = line, ""
        if name == "data":
            data += value + "\n"
        elif name == "event":
            event_type = value
        elif name == "id" and "\0" not in value:
            last_id = value or None
        elif name == "retry" and value and all(c in "0123456789" for c in value):
            retry = int(value)
    return events


def test_fixture_table_covers_every_recorded_stream() -> None:
    load_bytes(NAMES[0])  # skipped, saying where it looked, when the folder is missing
    assert sorted(p.name for p in STREAMS.glob("*.sse")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_fixture_decodes(name: str) -> None:
    count, first_type, first_id, last_type, last_data = FIXTURES[name]
    events = decode(load_bytes(name))
    assert len(events) == count
    assert events[0].event == first_type
    assert first_id in events[0].data
    assert events[-1].event == last_type
    if last_data is not None:
        assert events[-1].data == last_data
    for event in events:
        assert event.id is None
        assert event.retry is None
        if event.data == "[DONE]":
            continue
        payload = json.loads(event.data)
        if event.event != "message":  # named events: the JSON's type equals the event name
            assert payload["type"] == event.event


@pytest.mark.parametrize("name", NAMES)
def test_fixture_matches_reference(name: str) -> None:
    raw = load_bytes(name)
    assert decode(raw) == reference(raw)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_split_at_every_byte(name: str) -> None:
    raw = load_bytes(name)
    whole = decode(raw)
    for cut in range(len(raw) + 1):
        assert decode(raw[:cut], raw[cut:]) == whole, f"cut at byte {cut}"
    assert bytewise(raw) == whole


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("line_end", [b"\r\n", b"\r"], ids=["crlf", "cr"])
def test_fixture_with_other_line_ends(name: str, line_end: bytes) -> None:
    raw = load_bytes(name)
    other = raw.replace(b"\n", line_end)
    whole = decode(raw)
    assert decode(other) == whole
    assert bytewise(other) == whole
    for cut in range(0, len(other) + 1, 7):
        assert decode(other[:cut], other[cut:]) == whole, f"cut at byte {cut}"


def test_crlf_split_between_cr_and_lf_is_one_line_end() -> None:
    # Were CR and LF two line ends, the blank line between them would dispatch "a" alone.
    assert decode(b"data: a\r", b"\ndata: b\r\n\r\n") == [SSEEvent("message", "a\nb")]
    assert decode(b"data: a\r", b"\n", b"data: b\r", b"\r\n") == [SSEEvent("message", "a\nb")]
    assert decode(b"data: a\r\rdata: b\r\r") == [SSEEvent("message", "a"), SSEEvent("message", "b")]


def test_mixed_line_ends() -> None:
    raw = b"event: x\rdata: 1\r\ndata: 2\n\r\ndata: 3\n\r"
    assert decode(raw) == [SSEEvent("x", "1\n2"), SSEEvent("message", "3")]
    assert bytewise(raw) == decode(raw)


def test_multi_line_data_joined_with_lf() -> None:
    assert decode(b"data: first\ndata: second\ndata:\ndata: fourth\n\n") == [
        SSEEvent("message", "first\nsecond\n\nfourth")
    ]


def test_comments_are_ignored() -> None:
    raw = b": keep-alive\n\n:another\ndata: a\n: in the middle\ndata: b\n\n:\n\n"
    assert decode(raw) == [SSEEvent("message", "a\nb")]


def test_one_optional_space_removed_and_no_other_stripping() -> None:
    assert decode(b"data:x\n\n") == [SSEEvent("message", "x")]
    assert decode(b"data:  two spaces \n\n") == [SSEEvent("message", " two spaces ")]
    assert decode(b"data:\tx\n\n") == [SSEEvent("message", "\tx")]
    assert decode(b"event:ping\ndata:{}\n\n") == [SSEEvent("ping", "{}")]
    assert decode(b"data: a:b: c\n\n") == [SSEEvent("message", "a:b: c")]


def test_field_name_without_colon_has_empty_value() -> None:
    assert decode(b"data\n\n") == [SSEEvent("message", "")]
    assert decode(b"data\ndata\n\n") == [SSEEvent("message", "\n")]
    assert decode(b"event\ndata: x\n\n") == [SSEEvent("message", "x")]


def test_empty_data_buffer_dispatches_nothing_and_resets_the_type() -> None:
    assert decode(b"event: lonely\n\n") == []
    assert decode(b"event: lonely\n\ndata: x\n\n") == [SSEEvent("message", "x")]
    assert decode(b"\n\n\n") == []
    # An empty data line is not an empty buffer: it dispatches an event with empty data.
    assert decode(b"data:\n\n") == [SSEEvent("message", "")]


def test_event_type() -> None:
    assert decode(b"event: a\nevent: b\ndata: x\n\n") == [SSEEvent("b", "x")]
    assert decode(b"event:\ndata: x\n\n") == [SSEEvent("message", "x")]
    assert decode(b"event: a\ndata: 1\n\ndata: 2\n\n") == [SSEEvent("a", "1"), SSEEvent("message", "2")]


def test_unknown_fields_are_ignored() -> None:
    assert decode(b"foo: bar\nDATA: no\ndata : no\ndata: yes\n\n") == [SSEEvent("message", "yes")]


def test_last_event_id_persists_and_null_ids_are_ignored() -> None:
    raw = b"id: 1\ndata: a\n\ndata: b\n\nid: 2\0x\ndata: c\n\nid\ndata: d\n\nid: 3\n\ndata: e\n\n"
    assert decode(raw) == [
        SSEEvent("message", "a", "1"),
        SSEEvent("message", "b", "1"),
        SSEEvent("message", "c", "1"),
        SSEEvent("message", "d", None),
        SSEEvent("message", "e", "3"),  # an id set by an event that never dispatched still counts
    ]


def test_retry_only_when_all_ascii_digits() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"retry: 1500\ndata: a\n\ndata: b\n\nretry: 15x\ndata: c\n\nretry: \xc2\xb2\ndata: d\n\n")
    assert [(e.data, e.retry) for e in events] == [("a", 1500), ("b", None), ("c", None), ("d", None)]
    assert decoder.retry == 1500
    decoder.feed(b"retry:\ndata: e\n\nretry: 20\n\n")
    assert decoder.retry == 20


def test_bom_skipped_only_at_the_start() -> None:
    bom = b"\xef\xbb\xbf"
    raw = bom + b"data: a\n\n"
    assert decode(raw) == [SSEEvent("message", "a")]
    assert bytewise(raw) == [SSEEvent("message", "a")]
    assert decode(bom[:1], bom[1:2], bom[2:] + b"data: a\n\n") == [SSEEvent("message", "a")]
    # A second BOM, or one later on, is part of the field name: an unknown field.
    assert decode(bom + bom + b"data: a\n\n") == []
    assert decode(b"data: a\n\n" + bom + b"data: b\n\n") == [SSEEvent("message", "a")]
    # Bytes that merely start like a BOM are kept.
    assert decode(b"\xef\xbb", b"\xbfdata: x\n\n") == [SSEEvent("message", "x")]
    with pytest.raises(BodyDecodeError):
        decode(b"\xef", b"data: x\n\n")


def test_unterminated_event_at_close_is_discarded_and_flagged() -> None:
    for tail in (b"event: x\ndata: half", b"data: whole line but no blank line\n", b"event: x\n", b"da"):
        decoder = SSEDecoder()
        assert decoder.feed(b"data: done\n\n" + tail) == [SSEEvent("message", "done")]
        assert decoder.close() == []
        assert decoder.had_unterminated_event, tail
    decoder = SSEDecoder()
    decoder.feed(b"data: done\n\n: trailing comment\n")
    decoder.close()
    assert not decoder.had_unterminated_event
    with pytest.raises(SSEError, match="after close"):
        decoder.feed(b"data: more\n\n")


@pytest.mark.parametrize("name", NAMES)
def test_every_truncation_of_a_fixture_flags_exactly_the_cut_ones(name: str) -> None:
    raw = load_bytes(name)
    whole = decode(raw)
    boundaries = {i + 2 for i in range(len(raw)) if raw[i : i + 2] == b"\n\n"} | {0}
    for cut in range(len(raw) + 1):
        decoder = SSEDecoder()
        events = decoder.feed(raw[:cut])
        decoder.close()
        assert events == whole[: len(events)]
        assert decoder.had_unterminated_event == (cut not in boundaries), f"cut at byte {cut}"


def test_bytes_received_counts_everything() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"\xef\xbb\xbfdata: a\r")
    decoder.feed(b"\n\r\n")
    decoder.feed(b"")
    decoder.feed(b"data: partial")
    assert decoder.bytes_received == 27


def test_oversized_line_raises_without_unbounded_buffering() -> None:
    decoder = SSEDecoder(max_line_bytes=100)
    decoder.feed(b"data: ok\n\n")
    fed = 0

    def feed_forever() -> None:
        nonlocal fed
        for _ in range(1000):  # a line end never comes
            decoder.feed(b"x" * 30)
            fed += 1

    with pytest.raises(SSEError, match="SSE line exceeds 100 bytes"):
        feed_forever()
    assert fed == 3  # the fourth chunk took the line past 100 bytes
    assert decoder.bytes_received <= 10 + 4 * 30
    with pytest.raises(SSEError):
        decoder.feed(b"\n\n")


@pytest.mark.parametrize("split", ["whole", "bytewise"])
def test_line_length_limit_is_exact_and_independent_of_chunking(split: str) -> None:
    def run(raw: bytes) -> list[SSEEvent]:
        chunks = [raw] if split == "whole" else [raw[i : i + 1] for i in range(len(raw))]
        return decode(*chunks, max_line_bytes=20)

    fits = b"data: " + b"y" * 14  # exactly 20 bytes
    assert run(fits + b"\r\n\r\n") == [SSEEvent("message", "y" * 14)]
    with pytest.raises(SSEError, match="exceeds 20 bytes"):
        run(b"data: a\n\n" + fits + b"y\n\n")


def test_invalid_utf8_raises_with_the_byte_offset() -> None:
    raw = b"data: ok\n\ndata: bad \xff here\n\n"
    with pytest.raises(BodyDecodeError, match="byte offset 20"):
        decode(raw)
    with pytest.raises(BodyDecodeError, match="byte offset 20"):
        bytewise(raw)
    with pytest.raises(BodyDecodeError, match="byte offset 23"):
        decode(b"\xef\xbb\xbf" + raw)
    # A multi-byte sequence cut by a line end is invalid too.
    with pytest.raises(BodyDecodeError, match="byte offset 6"):
        decode(b"data: \xc3\ndata: x\n\n")
    with pytest.raises(BodyDecodeError, match="byte offset 6"):
        decode(b"data: \xed\xa0\x80\n\n")  # an encoded surrogate


@pytest.mark.parametrize("text", ["é", "日本", "🎉", "aé日🎉b", "\u2028\x85\x1c"])
def test_multibyte_characters_split_at_every_byte(text: str) -> None:
    raw = f'event: t{text}\ndata: {{"text": "{text}"}}\n\n'.encode()
    expected = [SSEEvent(f"t{text}", f'{{"text": "{text}"}}')]
    assert decode(raw) == expected
    assert bytewise(raw) == expected
    for cut in range(len(raw) + 1):
        assert decode(raw[:cut], raw[cut:]) == expected, f"cut at byte {cut}"
    for a in range(1, len(raw)):
        for b in range(a, len(raw)):
            assert decode(raw[:a], raw[a:b], raw[b:]) == expected


def _random_stream(rng: random.Random) -> bytes:
    words = ["a", "b c", "é", "日本", "🎉", ":", " ", "", "\0", "12", "\u2028", "x" * 50]
    parts: list[str] = []
    if rng.random() < 0.2:
        parts.append("\ufeff")
    for _ in range(rng.randint(0, 30)):
        kind = rng.choice(["data", "data", "data:", "event", "id", "retry", ":", "unknown", "bare", "blank", "blank"])
        value = "".join(rng.choice(words) for _ in range(rng.randint(0, 3)))
        if kind == "blank":
            line = ""
        elif kind == "bare":
            line = rng.choice(["data", "event", "id", "retry"])
        elif kind == "data:":
            line = "data:" + value
        elif kind == "retry":
            line = "retry: " + rng.choice(["100", "", "1a", "007"])
        elif kind == ":":
            line = ":" + value
        elif kind == "unknown":
            line = "other: " + value
        else:
            line = f"{kind}: {value}"
        parts.append(line + rng.choice(["\n", "\r\n", "\r"]))
    if rng.random() < 0.5:
        parts.append(rng.choice(["data: tail", "event: x", ""]))
    return "".join(parts).encode()


def test_random_streams_match_the_reference_for_random_chunkings() -> None:
    rng = random.Random(20240611)
    for _ in range(400):
        raw = _random_stream(rng)
        expected = reference(raw)
        assert decode(raw) == expected, raw
        cuts = sorted(rng.sample(range(len(raw) + 1), min(len(raw) + 1, rng.randint(1, 8))))
        chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
        assert decode(*chunks) == expected, (raw, cuts)
        assert bytewise(raw) == expected, raw


# -- The accumulator's lazy text, changed together with the decoder for the parse benchmark:
# Block.text and Block.arguments must still behave exactly like plain dataclass fields.


def test_block_text_and_arguments_behave_like_plain_fields() -> None:
    acc = Accumulator()
    acc.apply(BlockStart(0, "text"))
    for part in ("Hel", "lo", " 日本", "🎉"):
        acc.apply(TextDelta(0, part))
    acc.apply(BlockStart(1, "tool_use", id="t1", name="f"))
    for part in ("", '{"a": ', "1}"):
        acc.apply(ToolArgsDelta(1, part))
    acc.apply(ThinkingDelta(2, "hm"))  # a delta without its start
    acc.apply(ThinkingDelta(2, "m"))
    text, tool, thinking = acc.blocks
    assert text.text == "Hello 日本🎉"
    assert tool.arguments == '{"a": 1}'
    assert tool.parsed_input() == {"a": 1}
    assert thinking.kind == "thinking"
    assert thinking.text == "hmm"

    snapshot = acc.snapshot()
    acc.apply(TextDelta(0, "!"))
    assert snapshot.blocks[0].text == "Hello 日本🎉"  # a snapshot does not see later deltas
    assert text.text == "Hello 日本🎉!"

    text.text = "replaced"
    text.text += " and more"
    assert text.text == "replaced and more"
    assert text == Block(0, "text", text="replaced and more")
    assert text != Block(0, "text", text="other")
    assert repr(Block(3, "text", text="x")) == (
        "Block(index=3, kind='text', text='x', id=None, name=None, arguments='', signature='', data=None, "
        "closed=False, citations=None, field='', refusal=False)"
    )
    assert dataclasses.asdict(tool)["arguments"] == '{"a": 1}'
    assert dataclasses.replace(tool, closed=True).arguments == '{"a": 1}'
    assert [f.name for f in dataclasses.fields(Block)][:3] == ["index", "kind", "text"]
    copied = tool.copy()
    acc.apply(ToolArgsDelta(1, " "))
    assert copied.arguments == '{"a": 1}'
    assert pickle.loads(pickle.dumps(copied)) == copied
    assert Block.from_content(0, {"type": "text", "text": "t"}).text == "t"


class _MyDelta(TextDelta):
    """A subclass takes the match path instead of the exact-type fast path."""


def test_accumulator_handles_delta_subclasses_like_before() -> None:
    acc = Accumulator()
    acc.apply(TextDelta(0, "a"))
    acc.apply(_MyDelta(0, "b"))
    assert acc.blocks[0].text == "ab"
