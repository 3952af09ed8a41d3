"""The splicer alone: text released at once, a tool call only whole, thinking only with its signature
(or, for OpenAI clients, whole once it ended), citations after text of their block, nothing after a
held block before it, and a drop of anything released refused."""

from __future__ import annotations

from typing import Any

import pytest

from streamrecover.proxy.splice import Citation, CloseBlock, OpenText, Splicer, TextPiece, Unsplicable, WholeBlock


def f(type_: str, /, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "run_id": "r", "seq": 0, **fields}


def test_text_goes_out_at_once_and_a_tool_call_only_when_a_later_block_shows_it_ended() -> None:
    s = Splicer()
    assert s.apply(f("text_delta", block=0, text="Hi")) == [OpenText(0), TextPiece(0, "Hi")]
    assert s.apply(f("tool_call_delta", block=1, id="t1", name="get", arguments_delta='{"ci')) == []
    assert s.apply(f("tool_call_delta", block=1, id="t1", name="get", arguments_delta='ty": "Oslo"}')) == []
    ops = s.apply(f("text_delta", block=2, text="then"))
    call = {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Oslo"}}
    assert ops == [CloseBlock(0), WholeBlock(1, call), OpenText(2), TextPiece(2, "then")]


def test_a_cut_tool_call_is_dropped_unseen_and_the_continuation_numbers_on() -> None:
    s = Splicer()
    s.apply(f("text_delta", block=0, text="Let me check"))
    s.apply(f("tool_call_delta", block=1, id="t1", name="get", arguments_delta='{"ci'))
    assert s.apply(f("tool_call_cancel", block=1, id="t1", name="get", reason="partial")) == []
    assert s.apply(f("text_delta", block=0, text=" the weather.")) == [TextPiece(0, " the weather.")]
    s.apply(f("tool_call_delta", block=1, id="t2", name="get", arguments_delta='{"city": "Oslo"}'))
    committed = [
        {"type": "text", "text": "Let me check the weather."},
        {"type": "tool_use", "id": "t2", "name": "get", "input": {"city": "Oslo"}},
    ]
    assert s.finish(committed) == [
        CloseBlock(0),
        WholeBlock(1, committed[1]),
    ]


def test_thinking_waits_for_the_commit_and_holds_what_follows_it() -> None:
    s = Splicer()
    assert s.apply(f("thinking_delta", block=0, thinking="hmm")) == []
    assert s.apply(f("text_delta", block=1, text="Answer")) == []
    committed = [{"type": "thinking", "thinking": "hmm", "signature": "sig"}, {"type": "text", "text": "Answer"}]
    assert s.finish(committed) == [WholeBlock(0, committed[0]), OpenText(1), TextPiece(1, "Answer"), CloseBlock(1)]


def test_a_continuations_thinking_after_text_is_dropped_unseen() -> None:
    s = Splicer()
    s.apply(f("text_delta", block=0, text="Rivers"))
    assert s.apply(f("thinking_delta", block=1, thinking="again")) == []
    assert s.apply(f("block_cancel", block=1, kind="thinking", reason="thinking_after_text")) == []
    assert s.apply(f("text_delta", block=0, text=" flow")) == [TextPiece(0, " flow")]


def test_taking_back_what_was_sent_is_unsplicable() -> None:
    s = Splicer()
    s.apply(f("text_delta", block=0, text="Rivers"))
    with pytest.raises(Unsplicable):
        s.apply(f("stream_reset", reason="continuation_restart"))
    quiet = Splicer()
    quiet.apply(f("thinking_delta", block=0, thinking="hmm"))
    assert quiet.apply(f("stream_reset", reason="whole_restart")) == []  # nothing was sent: start over unseen


def test_citations_go_out_after_text_of_their_block_and_never_for_a_block_cut_before_it() -> None:
    cite = {"type": "web_search_result_location", "cited_text": "x", "url": "https://example.com"}
    s = Splicer()
    assert s.apply(f("citation", block=0, citation=cite)) == []  # no text yet: the block may be dropped
    assert s.apply(f("block_cancel", block=0, kind="text", reason="partial")) == []
    assert s.apply(f("citation", block=0, citation=cite)) == []
    assert s.apply(f("text_delta", block=0, text="Rivers")) == [
        OpenText(0, cited=True),
        TextPiece(0, "Rivers"),
        Citation(0, cite),
    ]
    assert s.apply(f("text_delta", block=0, text=" flow")) == [TextPiece(0, " flow")]


def test_openai_clients_see_thinking_once_it_ended_and_its_drop_takes_nothing_back() -> None:
    shown = Splicer(release_unsigned=True)
    assert shown.apply(f("thinking_delta", block=0, thinking="hmm")) == []
    thinking = {"type": "thinking", "thinking": "hmm", "signature": ""}
    assert shown.apply(f("text_delta", block=1, text="Answer")) == [
        WholeBlock(0, thinking),
        OpenText(1),
        TextPiece(1, "Answer"),
    ]
    assert shown.apply(f("block_cancel", block=0, kind="thinking", reason="unsigned_thinking")) == []
    assert shown.finish([{"type": "text", "text": "Answer"}]) == [CloseBlock(1)]
    held = Splicer()  # Anthropic's clients: unsigned thinking never goes out
    held.apply(f("thinking_delta", block=0, thinking="hmm"))
    held.apply(f("text_delta", block=1, text="Answer"))
    assert held.apply(f("block_cancel", block=0, kind="thinking", reason="unsigned_thinking")) == [
        OpenText(0),
        TextPiece(0, "Answer"),
    ]


def test_a_long_answer_after_reasoning_and_a_call_goes_out_exactly_and_in_order() -> None:
    # Reasoning goes out whole once a later block starts, a tool call once the text after it
    # does; what reaches the client, however many deltas made it, is each block as streamed.
    s = Splicer(release_unsigned=True)
    reasoning = [f"étape {i}; " for i in range(500)]
    words = [("東京 " if i % 50 == 0 else "word ") + "🚀" * (i % 97 == 0) for i in range(3_000)]
    for piece in reasoning:
        assert s.apply(f("thinking_delta", block=0, thinking=piece)) == []
    ops = s.apply(f("tool_call_delta", block=1, id="t1", name="look", arguments_delta='{"q": "Zür'))
    ops += s.apply(f("tool_call_delta", block=1, arguments_delta='ich"}'))
    ops += [op for word in words for op in s.apply(f("text_delta", block=2, text=word))]
    ops += s.finish([])
    thinking = {"type": "thinking", "thinking": "".join(reasoning), "signature": ""}
    call = {"type": "tool_use", "id": "t1", "name": "look", "input": {"q": "Zürich"}}
    assert ops[:3] == [WholeBlock(0, thinking), WholeBlock(1, call), OpenText(2)]
    pieces = [op for op in ops[3:] if isinstance(op, TextPiece)]
    assert "".join(p.text for p in pieces) == "".join(words)
    assert len(pieces) == len(words)  # released as they came, never a piece twice
    assert ops[-1] == CloseBlock(2)


def test_a_web_search_call_goes_out_once_text_follows_it_and_the_text_streams_behind_it() -> None:
    """A Responses search call arrives whole; the client sees it, and the answer's text as it comes,
    before the turn is committed. Before any text it is held: a break there starts the turn over."""
    s = Splicer(release_unsigned=True)
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}}
    assert s.apply(f("block", block=0, content=search)) == []
    assert s.apply(f("text_delta", block=1, text="Rivers")) == [
        WholeBlock(0, search),
        OpenText(1),
        TextPiece(1, "Rivers"),
    ]
    cite = {"type": "url_citation", "url": "https://example.com/r", "title": "R", "start_index": 0, "end_index": 6}
    assert s.apply(f("citation", block=1, citation=cite)) == [Citation(1, cite)]


def test_a_web_search_call_before_any_text_is_dropped_unseen_by_a_restart() -> None:
    s = Splicer(release_unsigned=True)
    s.apply(f("block", block=0, content={"type": "web_search_call", "id": "ws_1", "status": "completed"}))
    assert s.apply(f("stream_reset", reason="whole_restart")) == []
    again = {"type": "web_search_call", "id": "ws_2", "status": "completed"}
    s.apply(f("block", block=0, content=again))
    assert s.apply(f("text_delta", block=1, text="A")) == [WholeBlock(0, again), OpenText(1), TextPiece(1, "A")]
