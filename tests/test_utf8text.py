"""A streamed answer kept as UTF-8: what is read back is exactly what was appended, however it was cut."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from streamrecover.engine.blocks import Accumulator, Block
from streamrecover.engine.events import TextDelta, ThinkingDelta, ToolArgsDelta
from streamrecover.engine.protocol import FrameReducer, PartialBlock
from streamrecover.engine.utf8text import Utf8Text
from streamrecover.live.state import RunState

# Every code point, lone surrogates included (a JSON "\ud83d" escape decodes to one).
ANY_TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=12)


@given(st.lists(st.tuples(ANY_TEXT, st.booleans()), max_size=60))
def test_reading_gives_back_exactly_what_was_appended(steps: list[tuple[str, bool]]) -> None:
    text = Utf8Text()
    expected = ""
    for part, read_now in steps:
        text.append(part)
        expected += part
        if read_now:  # a read between appends (a checkpoint) changes nothing that follows
            assert str(text) == expected
    assert str(text) == expected
    assert bool(text) is bool(expected)
    assert text.encoded() == expected.encode("utf-8", "surrogatepass")


@given(ANY_TEXT, st.lists(ANY_TEXT, max_size=20))
def test_a_surrogate_split_across_deltas_is_kept_as_received(first: str, rest: list[str]) -> None:
    # Python does not pair two lone surrogates appended to each other; neither does the buffer.
    text = Utf8Text(first + "\ud83d")
    text.append("\ude80")
    for part in rest:
        text.append(part)
    assert str(text) == first + "\ud83d\ude80" + "".join(rest)


def test_a_long_answer_is_held_in_a_few_chunks() -> None:
    # 40,000 deltas of a few characters, one of them wide: the chunks stay logarithmic in
    # number and fewer than COMPACT_AT deltas wait to be encoded, so what is held is the
    # answer's UTF-8 and not a list of 40,000 small objects.
    text = Utf8Text()
    for i in range(40_000):
        text.append("naïve 🚀 " if i % 97 == 0 else "word ")
        encoded_bytes = sum(len(chunk) for chunk in text._chunks)
        assert len(text._chunks) <= math.log2(max(encoded_bytes, 1)) + 1
        assert len(text.parts) < Utf8Text.COMPACT_AT
    assert str(text).count("🚀") == math.ceil(40_000 / 97)


def test_an_engine_block_keeps_an_emoji_answer_exactly() -> None:
    acc = Accumulator()
    deltas = ["Bonjour ", "à ", "東京 ", "🚀", "!", ""]
    for delta in deltas:
        acc.apply(TextDelta(0, delta))
    acc.apply(ThinkingDelta(1, "hm"))
    acc.apply(ToolArgsDelta(2, '{"city": "Zür'))
    acc.apply(ToolArgsDelta(2, 'ich"}'))
    snapshot = acc.snapshot()
    text, thinking, call = snapshot.blocks
    assert text.text == "".join(deltas)
    assert thinking.text == "hm"
    assert call.parsed_input() == {"city": "Zürich"}
    assert text == Block(0, "text", text="Bonjour à 東京 🚀!")


def test_the_client_view_rebuilds_text_and_arguments_from_many_frames() -> None:
    reducer = FrameReducer()
    words = [("é" if i % 5 == 0 else "w") + str(i) + " " for i in range(2_000)]
    for seq, word in enumerate(words, start=1):
        reducer.apply({"type": "text_delta", "seq": seq, "block": 0, "text": word})
    reducer.apply(
        {"type": "tool_call_delta", "seq": 2_001, "block": 1, "id": "t1", "name": "f", "arguments_delta": '{"a"'}
    )
    reducer.apply({"type": "tool_call_delta", "seq": 2_002, "block": 1, "arguments_delta": ': "ü"}'})
    assert reducer.blocks[0].text == "".join(words)
    assert reducer.blocks[1].to_content() == {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": "ü"}}
    assert reducer.blocks[1] == PartialBlock("tool_use", id="t1", name="f", arguments='{"a": "ü"}')


def test_the_servers_snapshot_state_survives_its_json_round_trip() -> None:
    state = RunState()
    for seq, delta in enumerate(["日本", "語 ", "🙂"], start=1):
        state.apply({"type": "text_delta", "seq": seq, "block": 0, "text": delta})
    again = RunState.from_json(state.to_json())
    again.apply({"type": "text_delta", "seq": 4, "block": 0, "text": "!"})
    assert again.blocks[0].text == "日本語 🙂!"
    assert again.seq == 4
