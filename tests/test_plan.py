"""Recovery plans R1-R4 decided from snapshots, and the continuation joiner."""

from __future__ import annotations

from streamrecover.engine.blocks import Accumulator
from streamrecover.engine.events import BlockStart, BlockStop, SignatureDelta, TextDelta, ThinkingDelta, ToolArgsDelta
from streamrecover.engine.join import ContinuationJoiner
from streamrecover.engine.plan import PlanKind, cut_short, plan


def _acc(*events):
    acc = Accumulator()
    for e in events:
        acc.apply(e)
    return acc.snapshot()


def test_partial_text_only_continues_text():
    p = plan(_acc(BlockStart(0, "text"), TextDelta(0, "Once upon a ti")))
    assert p.kind is PlanKind.CONTINUE_TEXT
    assert [b.text for b in p.keep] == ["Once upon a ti"]
    assert not p.discarded


def test_complete_tool_call_synthesizes_tool_use_and_drops_the_half_one():
    snap = _acc(
        BlockStart(0, "text"),
        TextDelta(0, "Checking."),
        BlockStop(0),
        BlockStart(1, "tool_use", id="t1", name="weather"),
        ToolArgsDelta(1, '{"city": "Paris"}'),
        BlockStop(1),
        BlockStart(2, "tool_use", id="t2", name="weather"),
        ToolArgsDelta(2, '{"city": "Ro'),
    )
    p = plan(snap)
    assert p.kind is PlanKind.SYNTHESIZE_TOOL_USE
    assert [b.to_content() for b in p.keep] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}},
    ]
    assert [b.id for b in p.discarded_tools] == ["t2"]


def test_text_then_partial_tool_call_truncates_before_the_tool():
    p = plan(
        _acc(
            BlockStart(0, "text"),
            TextDelta(0, "Let me look."),
            BlockStop(0),
            BlockStart(1, "tool_use", id="t1", name="search"),
            ToolArgsDelta(1, '{"q": '),
        )
    )
    assert p.kind is PlanKind.TRUNCATE_BEFORE_TOOL
    assert [b.text for b in p.keep] == ["Let me look."]
    assert [b.name for b in p.discarded_tools] == ["search"]


def test_closed_tool_call_with_invalid_json_is_never_kept():
    p = plan(
        _acc(
            BlockStart(0, "text"),
            TextDelta(0, "x"),
            BlockStart(1, "tool_use", id="t1", name="f"),
            ToolArgsDelta(1, '{"a": '),
            BlockStop(1),
        )
    )
    assert p.kind is PlanKind.TRUNCATE_BEFORE_TOOL
    assert all(b.kind != "tool_use" for b in p.keep)


def test_nothing_salvageable_restarts_and_discards_unsigned_thinking():
    p = plan(_acc(BlockStart(0, "thinking"), ThinkingDelta(0, "Let me think")))
    assert p.kind is PlanKind.WHOLE_RESTART
    assert p.keep == []
    assert [b.text for b in p.discarded_thinking] == ["Let me think"]


def test_signed_thinking_is_kept_before_partial_text():
    p = plan(
        _acc(
            BlockStart(0, "thinking"),
            ThinkingDelta(0, "Plan."),
            SignatureDelta(0, "sig"),
            BlockStop(0),
            BlockStart(1, "text"),
            TextDelta(1, "The answer"),
        )
    )
    assert p.kind is PlanKind.CONTINUE_TEXT
    assert [b.kind for b in p.keep] == ["thinking", "text"]


def test_thinking_closed_without_signature_is_discarded():
    p = plan(
        _acc(
            BlockStart(0, "thinking"),
            ThinkingDelta(0, "Plan."),
            BlockStop(0),
            BlockStart(1, "text"),
            TextDelta(1, "Hi"),
        )
    )
    assert [b.kind for b in p.keep] == ["text"]
    assert len(p.discarded_thinking) == 1


def test_prefill_joiner_drops_the_held_back_whitespace_once():
    j = ContinuationJoiner(" ")
    assert j.feed(" ") == ""
    assert j.feed("world") == "world"
    j = ContinuationJoiner("\n\n")
    assert j.feed("\n") == ""
    assert j.feed("\nNext") == "Next"


def test_prefill_joiner_keeps_a_continuation_that_does_not_repeat_the_whitespace():
    j = ContinuationJoiner(" ")
    assert j.feed("!") == "!"
    assert j.feed(" more") == " more"


def test_continue_message_joiner_drops_a_repeated_tail_only():
    prefix = "The quick brown fox jumps over the lazy dog and then"
    j = ContinuationJoiner(overlap_with=prefix)
    out = j.feed("over the lazy dog and then") + j.feed(" runs away.")
    assert out == " runs away."
    j = ContinuationJoiner(overlap_with=prefix)
    assert j.feed(" runs") + j.feed(" away.") == " runs away."
    j = ContinuationJoiner(overlap_with=prefix)
    assert j.feed("then") + j.flush() == "then"  # a short coincidence is not an overlap


def test_server_tool_use_keeps_its_streamed_input():
    snap = _acc(
        BlockStart(0, "server_tool_use", id="srv1", name="web_search", data={"type": "server_tool_use", "input": {}}),
        ToolArgsDelta(0, '{"query": "tides"}'),
        BlockStop(0),
    )
    assert snap.blocks[0].to_content()["input"] == {"query": "tides"}


def test_client_view_accepts_coalesced_frames_and_a_mid_tool_snapshot():
    from streamrecover.testing.client import ClientView

    view = ClientView()
    view.apply({"type": "snapshot", "seq": 4, "messages": [], "partial": [
        {"block": 0, "content": {"type": "tool_use", "id": "t", "name": "f", "partial_json": '{"a": '}},
    ]})  # fmt: skip
    view.last_seq = 4
    view.apply({"type": "tool_call_delta", "seq": 7, "first_seq": 5, "block": 0, "arguments_delta": "1}"})
    assert view.gaps == 0
    assert view.reconstructed() == [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]
    view.apply({"type": "text_delta", "seq": 9, "block": 1, "text": "x"})
    assert view.gaps == 1


# ---- text that is not enough to go on from, or that the API takes no more ---------------------


def test_a_cited_block_cut_between_its_citations_and_its_text_is_cancelled_for_the_client():
    """The client saw the citations (citation frames): the block is dropped with a block_cancel,
    not silently, or the client would show them twice when the continuation sends the block."""
    from streamrecover.engine.events import CitationDelta

    p = plan(
        _acc(
            BlockStart(0, "text"),
            TextDelta(0, "Here is what I found: "),
            BlockStop(0),
            BlockStart(1, "text", data={"citations": []}),
            CitationDelta(1, {"type": "web_search_result_location", "cited_text": "x"}),
        )
    )
    assert p.kind is PlanKind.CONTINUE_TEXT
    assert [b.index for b in p.keep] == [0]
    assert [b.index for b in p.discarded_other] == [1]


def test_only_whitespace_text_restarts_the_turn():
    """The API refuses a blank text block, and a prefix of nothing else would be an empty
    assistant message: there is nothing to go on from (the adaptive answer opens with "\\n\\n")."""
    p = plan(_acc(BlockStart(0, "text"), TextDelta(0, "\n\n"), BlockStop(0), BlockStart(1, "thinking")))
    assert p.kind is PlanKind.WHOLE_RESTART
    assert p.keep == []


def test_a_blank_last_block_is_not_sent_so_the_continuation_writes_it_again_once():
    from streamrecover.engine.blocks import Block
    from streamrecover.engine.continuation import joiner_for
    from streamrecover.engine.contract import Strategy

    prefix = [Block(0, "text", text="Cited span.", closed=True), Block(1, "text", text=" ", closed=True)]
    for strategy in (Strategy.PREFILL, Strategy.CONTINUE_MESSAGE):
        joiner = joiner_for(prefix, strategy, echoes_prefix=False)
        assert joiner is not None
        assert joiner.feed(" ") + joiner.feed("Next.") == "Next.", strategy


def test_a_prefill_never_ends_in_whitespace_when_a_blank_block_follows_trailing_whitespace():
    """The API refuses a prefill that ends in whitespace (a 400, and the run failed): with a
    blank last block after a block ending in a space, both are left out of the prefill, the
    kept blocks stay as shown, and the continuation's space is not added to theirs."""
    from streamrecover.engine.blocks import Block
    from streamrecover.engine.continuation import continuation_messages, joiner_for
    from streamrecover.engine.contract import Strategy

    citation = {"type": "web_search_result_location", "url": "u"}
    prefix = [
        Block(0, "text", text="Apple said so. ", citations=[citation], closed=True),
        Block(1, "text", text=" \n", closed=True),
        Block(2, "text", text=" ", closed=False),
    ]
    messages = continuation_messages([{"role": "user", "content": "q"}], prefix, Strategy.PREFILL)
    assert messages[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Apple said so.", "citations": [citation]}],
    }
    assert [b.text for b in prefix] == ["Apple said so. ", " \n", " "]  # shown and stored as streamed
    for written in ("  \n Next.", " Next.", "Next."):
        joiner = joiner_for(prefix, Strategy.PREFILL, echoes_prefix=False)
        assert joiner is not None
        assert joiner.feed(written) + joiner.flush() == "Next.", written


def test_prefill_joiner_drops_the_part_of_the_held_whitespace_the_continuation_wrote_again():
    j = ContinuationJoiner("\n\n")
    assert j.feed("\nNext") == "Next"
    assert j.result.kind == "echo_dropped"
    assert j.result.chars == 1
    # an echoed prefix (Mistral) is dropped whole or not at all: words are never cut
    j = ContinuationJoiner("Hello world")
    assert j.feed("Hello there") == "Hello there"


def test_a_cited_continuation_block_never_joins_plain_kept_text_nor_plain_a_cited_one():
    """A cited span is a block of its own: the continuation's first text block continues the
    kept one only when both are plain or both cited (the remainder of a cut cited span)."""
    from streamrecover.engine.blocks import Block
    from streamrecover.engine.translate import IndexMapper

    plain = Block(0, "text", text="Here is what I found: ")
    cited = Block(0, "text", text="the lighth", citations=[{"cited_text": "x"}])
    cases = [
        (plain, BlockStart(0, "text", data={"citations": []}), 1),
        (plain, BlockStart(0, "text"), 0),
        (cited, BlockStart(0, "text"), 1),
        (cited, BlockStart(0, "text", data={"citations": []}), 0),
    ]
    for kept, start, expected in cases:
        acc = Accumulator()
        acc.restore([kept])
        assert IndexMapper(acc, [kept]).start(start) == expected, (kept.citations, start.data)


def _join(prefix, *pieces):
    j = ContinuationJoiner(overlap_with=prefix)
    out = "".join(j.feed(p) for p in pieces) + j.flush()
    return out, j


def test_joiner_trims_a_short_repeat_of_whole_words():
    out, j = _join("The lighthouse stood on the rocky", " on the rocky", " point.")
    assert out == " point."
    assert j.result.kind == "overlap_trimmed"
    assert j.result.chars == len(" on the rocky")
    # a word cut in half, restated whole with the words before it
    out, j = _join("The lighthouse stood on the roc", "on the rocky point.")
    assert out == "ky point."
    assert j.result.kind == "overlap_trimmed"
    # the kept text ends in a space: the repeat leaves no double space
    out, _ = _join("The lighthouse stood on the ", "on the rocky point.")
    assert out == "rocky point."


def test_joiner_keeps_legitimate_text_that_only_looks_like_a_repeat():
    assert _join("The lighthouse stood on the rocky", " rocky shore.")[0] == " rocky shore."  # one word: "had had"
    assert _join("They had", " had enough.")[0] == " had enough."
    assert _join("The lighthouse stood on the rock", "y point.")[0] == "y point."
    # a one-word answer restated whole with no space first: "TheTheory" is no text
    assert _join("The", "Theory of light.")[0] == "ory of light."
    assert _join("The", " Theory of light.")[0] == " Theory of light."
    out, j = _join("A story about the sea and the wind.", " The end.")
    assert out == " The end."
    assert j.result.kind == "clean"


def test_joiner_drops_a_restart_that_repeats_the_kept_text():
    prefix = "The lighthouse stood on the rocky point, watching"
    out, j = _join(prefix, "The lighthouse stood on ", "the rocky point, watching over", " the bay.")
    assert out == " over the bay."
    assert j.result.kind == "restart_trimmed"
    assert j.result.chars == len(prefix)


def test_joiner_replaces_the_kept_text_when_a_restart_says_something_else():
    prefix = "The lighthouse stood on the rocky point, watching"
    j = ContinuationJoiner(overlap_with=prefix)
    assert j.feed("The lighthouse stood on the ") == ""
    assert j.feed("cliff, alone.") == ""
    assert j.take_replacement() == "The lighthouse stood on the cliff, alone."
    assert j.result.kind == "restart_replaced"
    assert j.feed(" More.") == " More."


def test_joiner_sees_a_restart_of_kept_text_that_starts_with_blank_lines():
    """Claude's text after thinking often starts with "\n\n"; a restart does not repeat them."""
    prefix = "\n\n" + "The lighthouse stood on the rocky point. " * 7 + "And then"  # longer than the window
    first = "\n\nThe lighthouse stood on the rocky point. "
    out, j = _join(prefix, first, prefix[len(first) :], " it slept.")
    assert out == " it slept."  # the answer is not shown twice
    assert j.result.kind == "restart_trimmed"
    j = ContinuationJoiner(overlap_with="\n\nHere is a thorough answer to your question about cats")
    assert j.feed("Here is a thorough answer: dogs are better.") + j.flush() == ""
    assert j.result.kind == "restart_replaced"
    assert j.take_replacement() == "\n\nHere is a thorough answer: dogs are better."  # the block's blank lines stay


def test_joiner_keeps_the_longer_kept_text_when_a_restart_stops_partway():
    """A restart cut short (max_tokens) adds nothing: the text the user saw stays."""
    prefix = "The lighthouse stood on the rocky point, watching the bay. Then it"
    out, j = _join(prefix, "The lighthouse stood ", "on the rocky point")
    assert out == ""
    assert j.take_replacement() is None
    assert j.result.kind == "restart_trimmed"


def test_joiner_reports_a_rephrase_and_keeps_it():
    prefix = "Intro. The old keeper climbed the narrow stairs every eve"
    out, j = _join(prefix, "ning. In other words, every evening the keeper climbed those narrow stairs.")
    assert out.startswith("ning. In other words")
    assert j.result.kind == "rephrased"


def test_a_turn_cut_short_keeps_its_text_and_signed_thinking_and_never_a_tool_call():
    """Ended (exhausted, cancelled, failed) with a whole tool call: the call is never run, so
    it is dropped with the half one (no result would follow it in history); the text stays,
    trailing whitespace and all."""
    snap = _acc(
        BlockStart(0, "thinking"),
        ThinkingDelta(0, "Weather first."),
        SignatureDelta(0, "sig"),
        BlockStop(0),
        BlockStart(1, "text"),
        TextDelta(1, "Checking. "),
        BlockStop(1),
        BlockStart(2, "tool_use", id="t1", name="weather"),
        ToolArgsDelta(2, '{"city": "Paris"}'),
        BlockStop(2),
        BlockStart(3, "text"),
        TextDelta(3, "And Ro"),
        BlockStart(4, "tool_use", id="t2", name="weather"),
        ToolArgsDelta(4, '{"city": "Ro'),
    )
    cut = cut_short(snap.blocks)
    assert [b.to_content() for b in cut.keep] == [
        {"type": "thinking", "thinking": "Weather first.", "signature": "sig"},
        {"type": "text", "text": "Checking. "},
        {"type": "text", "text": "And Ro"},
    ]
    assert [b.id for b in cut.discarded_tools] == ["t1", "t2"]


def test_a_turn_cut_short_with_no_text_keeps_nothing():
    snap = _acc(
        BlockStart(0, "thinking"),
        ThinkingDelta(0, "Hmm"),
        BlockStart(1, "tool_use", id="t1", name="weather"),
        ToolArgsDelta(1, "{}"),
        BlockStop(1),
    )
    cut = cut_short(snap.blocks)
    assert cut.keep == []
    assert [b.kind for b in cut.discarded] == ["tool_use", "thinking"]
