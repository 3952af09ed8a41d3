"""The streams recorded from the real Anthropic and OpenAI APIs, cut and recovered.

Each recording (the folder ``tests/streams.py`` finds, skipped with a message when absent) is read whole by
the adapter (the uninterrupted reading), served byte for byte by the fake provider, and cut:
at event boundaries (every one for small streams, an even sample for big ones), inside tool
arguments, inside multi-byte characters and just before the terminator. A cut reading never
looks complete and never contradicts the whole one; a recovered run commits exactly the
uninterrupted reading (same blocks, same text, same citations on the same blocks), the
client's view equals what was committed, and no text is billed twice. The streams the tests
write in the real API's shape (web search with citations, MCP, compaction) are swept the
same way under both Anthropic continuation strategies, in any clone.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamrecover.engine.blocks import Accumulator
from streamrecover.engine.sse import SSEDecoder

from .harness import FAST, assert_invariants, run
from .recorded_reading import CITATION, anthropic_stream, compaction_stream, mcp_stream, read, web_search_stream
from .streams import load_recorded

# name -> (wire, model the run asks for, thinking budget). Models that take a prefill where
# the recording's model does not would only change the continuation strategy.
RECORDINGS: dict[str, tuple[str, str, int | None]] = {
    "anthropic_text_short.sse": ("anthropic", "claude-sonnet-4-5", None),
    "anthropic_text_multiparagraph.sse": ("anthropic", "claude-sonnet-4-5", None),
    "anthropic_text_image_description.sse": ("anthropic", "claude-sonnet-4-5", None),
    "anthropic_text_json_output.sse": ("anthropic", "claude-sonnet-4-5", None),
    "anthropic_text_tool_json.sse": ("anthropic", "claude-haiku-4-5", None),
    "anthropic_text_tool_noargs.sse": ("anthropic", "claude-sonnet-4-5", None),
    "anthropic_thinking_tool.sse": ("anthropic", "claude-haiku-4-5", 2048),
    "anthropic_thinking_text_divide.sse": ("anthropic", "claude-sonnet-4-5", 2048),
    "anthropic_thinking_text_endash.sse": ("anthropic", "claude-haiku-4-5", 2048),
    "anthropic_thinking_text_37.sse": ("anthropic", "claude-3-7-sonnet", 2048),
    "anthropic_adaptive_text_thinking_text.sse": ("anthropic", "claude-opus-4-6", 2048),
    "anthropic_web_search_citations.sse": ("anthropic", "claude-sonnet-4-5", None),
    "anthropic_web_search_thinking.sse": ("anthropic", "claude-sonnet-4-5", 2048),
    "anthropic_code_execution_text_editor.sse": ("anthropic", "claude-sonnet-4-6", None),
    "anthropic_compaction_emoji.sse": ("anthropic", "claude-sonnet-4-6", None),
    "anthropic_mcp_tool.sse": ("anthropic", "claude-sonnet-4-5", None),
    "anthropic_refusal_stop_details.sse": ("anthropic", "claude-sonnet-4-5", None),
    "openai_text.sse": ("openai", "gpt-4o", None),
    "openai_text_json_degrees.sse": ("openai", "gpt-4o", None),
    "openai_text_long.sse": ("openai", "gpt-4.1-nano", None),
    "openai_text_logprobs.sse": ("openai", "gpt-4o", None),
    "openai_tool_single.sse": ("openai", "gpt-4o", None),
    "openai_tool_parallel_two.sse": ("openai", "gpt-4o", None),
    "openai_tool_parallel_prefect.sse": ("openai", "gpt-4o", None),
    "openai_tool_long_arguments.sse": ("openai", "gpt-4o", None),
    "openai_tool_4omini.sse": ("openai", "gpt-4o-mini", None),
    "openai_refusal_logprobs.sse": ("openai", "gpt-4o", None),
}
ALL_BOUNDARIES_UP_TO = 30  # events; bigger streams get an even sample of this many
MULTIBYTE_SAMPLES = 6


def _events(raw: bytes) -> list[tuple[int, bytes]]:
    """(end offset, bytes) of every event: a blank line ends it."""
    out, start = [], 0
    while (end := raw.find(b"\n\n", start)) >= 0:
        out.append((end + 2, raw[start : end + 2]))
        start = end + 2
    return out


def _sample(values: list[int], count: int) -> list[int]:
    if len(values) <= count:
        return values
    step = len(values) / count
    return sorted({values[int(i * step)] for i in range(count)} | {values[-1]})


def byte_cuts(raw: bytes) -> dict[str, int]:
    """Where to cut, by what the cut tests: ``name -> bytes delivered``."""
    events = _events(raw)
    ends = [end for end, _ in events[:-1]]
    cuts = {f"boundary-{n + 1}": end for n, end in enumerate(ends) if end in _sample(ends, ALL_BOUNDARIES_UP_TO)}
    inside = [i for i in range(1, len(raw)) if 0x80 <= raw[i] <= 0xBF]
    cuts.update({f"inside-char@{i}": i for i in _sample(inside, MULTIBYTE_SAMPLES)})
    starts = [0, *(end for end, _ in events)]
    args = [
        (starts[n], chunk)
        for n, (_, chunk) in enumerate(events)
        if b"input_json_delta" in chunk or (b'"arguments":"' in chunk and b'"arguments":""' not in chunk)
    ]
    for start, chunk in _sample_pairs(args, 3):
        cuts[f"inside-arguments@{start + len(chunk) // 2}"] = start + len(chunk) // 2
    cuts["before-terminator"] = starts[-2]
    return cuts


def _sample_pairs(pairs: list[tuple[int, bytes]], count: int) -> list[tuple[int, bytes]]:
    keep = set(_sample(list(range(len(pairs))), count))
    return [p for i, p in enumerate(pairs) if i in keep]


def _cut_reading(raw: bytes, wire: str) -> Accumulator:
    from streamrecover.engine.contract import ProviderConfig
    from streamrecover.providers.registry import get_adapter

    parser = get_adapter(ProviderConfig(name=wire, base_url="http://unused", api_key="k")).new_parser()
    acc = Accumulator()
    for event in SSEDecoder().feed(raw):
        for normalized in parser.feed(event):
            acc.apply(normalized)
    return acc


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_a_cut_recording_never_looks_complete_nor_contradicts_the_whole(name: str) -> None:
    wire = RECORDINGS[name][0]
    raw = load_recorded(name)
    whole = _cut_reading(raw, wire)
    assert whole.ended
    assert whole.stop_reason is not None
    by_index = {b.index: b.to_content() for b in whole.blocks}
    for where, offset in byte_cuts(raw).items():
        acc = _cut_reading(raw[:offset], wire)
        assert not acc.ended, where
        for block in acc.blocks:
            full = by_index[block.index]
            if block.closed:
                assert block.to_content() == full, where
            elif block.kind == "text":
                assert full["text"].startswith(block.text), where


def assert_nothing_committed(outcome: Any) -> None:
    """An answer with no content (a refusal before any text) commits no assistant message,
    and the client is left showing nothing either."""
    assert outcome.status == "completed", outcome.result.error
    assert outcome.assistant == [], "an assistant message was committed for an answer with no content"
    assert outcome.view.reconstructed() == []


def committed_content(outcome: Any) -> list[dict[str, Any]]:
    """The answer as committed; no assistant message at all for an answer with no content
    (an empty one is never committed: the provider rejects it in later history)."""
    assert all(m["content"] for m in outcome.assistant), "an empty assistant message was committed"
    return outcome.assistant[0]["content"] if outcome.assistant else []


@pytest.mark.parametrize("name", sorted(RECORDINGS))
async def test_served_whole_the_committed_message_is_the_uninterrupted_reading(fake_server: Any, name: str) -> None:
    wire, model, thinking = RECORDINGS[name]
    raw = load_recorded(name)
    outcome = await run(
        fake_server, f"Replay {name}", wire=wire, model=model, thinking_budget=thinking, recording=raw, config=FAST
    )
    reading = read(raw, wire).content
    if not reading:
        assert_nothing_committed(outcome)
        return
    assert_invariants(outcome)
    assert committed_content(outcome) == reading


def _assert_billed_once(outcome: Any, committed: list[dict[str, Any]]) -> None:
    """Every character of the answer's text was billed once across the run's requests, but
    what a continuation had to write again: the trailing whitespace a prefill may not end
    with, and a whitespace-only block the API takes no more (not sent, so written again)."""
    text = "".join(b.get("text", "") for b in committed if b["type"] == "text")
    turn = [e for e in outcome.log if not _answers_tool_results(e.request)]  # the first turn's requests
    billed = "".join(e.billed_text for e in turn)
    assert "".join(billed.split()) == "".join(text.split()), "text billed twice (or never)"
    assert len(billed) >= len(text)
    assert len(billed) - len(text) <= 2 * (len(turn) - 1), "more than whitespace billed twice"


def _text(content: list[dict[str, Any]]) -> str:
    return "".join(b.get("text", "") for b in content if b["type"] == "text")


def _answers_tool_results(request: Any) -> bool:
    """A request of the run's next turn (the agent ran the recorded tool calls)."""
    for message in (request or {}).get("messages", []):
        if message.get("role") == "tool":
            return True
        content = message.get("content")
        if isinstance(content, list) and any(b.get("type") == "tool_result" for b in content):
            return True
    return False


async def _sweep_cuts(fake_server: Any, raw: bytes, wire: str, model: str, thinking: int | None) -> list[str]:
    """Every cut of ``raw``, recovered: the failures, each named by its cut."""
    whole = read(raw, wire)
    reading = whole.content
    failures = []
    for where, offset in byte_cuts(raw).items():
        outcome = await run(
            fake_server,
            "Replay the recording",
            faults=[f"cut:bytes={offset}"],
            wire=wire,
            model=model,
            thinking_budget=thinking,
            recording=raw,
            config=FAST,
        )
        try:
            if not reading:
                assert_nothing_committed(outcome)
                continue
            assert_invariants(outcome)  # committed == what the client rebuilt from the frames
            committed = committed_content(outcome)
            if whole.stop_reason == "refusal" and committed != reading:
                # a refusal is never continued, wherever it is cut: what arrived of it is the answer
                assert outcome.events("llm_stream_continuation_started") == [], "a refusal was continued"
                assert _text(reading).startswith(_text(committed)), "a cut refusal is not what arrived of it"
                continue
            assert committed == reading, "committed != the uninterrupted reading"
            _assert_billed_once(outcome, reading)
        except AssertionError as exc:
            failures.append(f"{where}: {str(exc)[:300]}")
    return failures


@pytest.mark.parametrize("name", sorted(RECORDINGS))
async def test_cut_and_recovered_the_committed_message_is_the_uninterrupted_reading(
    fake_server: Any, name: str
) -> None:
    """Cut anywhere, continued by the fake with the rest of the recorded answer (in its own
    encoding for Anthropic): the committed message is the uninterrupted reading, block for
    block (text, citations, server tool blocks, compaction, thinking), the client shows it."""
    wire, model, thinking = RECORDINGS[name]
    failures = await _sweep_cuts(fake_server, load_recorded(name), wire, model, thinking)
    assert not failures, "\n".join(failures)


# Streams the tests write in the real API's shape (any clone), under both Anthropic
# continuation strategies: prefill (claude-sonnet-4-5) and a continue message (claude-sonnet-4-6
# refuses the prefill; with thinking every model gets a continue message).
BUILT = {"web_search": web_search_stream, "mcp": mcp_stream, "compaction": compaction_stream}


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "claude-sonnet-4-6"])
@pytest.mark.parametrize("kind", sorted(BUILT))
async def test_built_streams_cut_and_recovered_are_the_uninterrupted_reading(
    fake_server: Any, kind: str, model: str
) -> None:
    failures = await _sweep_cuts(fake_server, BUILT[kind](), "anthropic", model, None)
    assert not failures, "\n".join(failures)


# ---- the one seam a provider cannot tell ----------------------------------------------------

SECOND_CITATION = {**CITATION, "cited_text": "Keepers moved out in 1985.", "url": "https://example.org/history"}
ADJACENT_CITED = anthropic_stream(
    [
        ({"type": "text", "text": ""}, [{"type": "text_delta", "text": "Two sources: "}]),
        (
            {"citations": [], "type": "text", "text": ""},
            [{"type": "citations_delta", "citation": CITATION}, {"type": "text_delta", "text": "it was relit"}],
        ),
        (
            {"citations": [], "type": "text", "text": ""},
            [{"type": "citations_delta", "citation": SECOND_CITATION}, {"type": "text_delta", "text": ", long dark."}],
        ),
    ]
)


def joined_at_seams(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content with adjacent text blocks of one kind (both plain, or both cited) joined:
    their text concatenated, their citations in order. docs/recovery.md, "Text blocks at the seam"."""
    out: list[dict[str, Any]] = []
    for block in content:
        last = out[-1] if out else None
        if (
            last is not None
            and block["type"] == last["type"] == "text"
            and ("citations" in block) == ("citations" in last)
        ):
            out[-1] = {**last, "text": last["text"] + block["text"]}
            if "citations" in block:
                out[-1]["citations"] = [*last["citations"], *block["citations"]]
        else:
            out.append(dict(block))
    return out


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "claude-sonnet-4-6"])
async def test_two_cited_spans_in_a_row_are_one_block_only_where_the_break_cannot_tell_them_apart(
    fake_server: Any, model: str
) -> None:
    """Two adjacent text blocks of one kind (never seen in the recorded answers, where cited
    spans alternate with plain text): a break between them leaves a kept block that may or may
    not be finished, and the continuation's first block cannot say which. The committed
    message is then the uninterrupted one joined at that seam, never anything else, and the
    client shows exactly what was committed."""
    reading = read(ADJACENT_CITED, "anthropic").content
    assert len(reading) == 3
    raw = ADJACENT_CITED
    seam = (raw.index(b"\n\n", raw.index(b"it was relit")) + 2, raw.index(b", long dark."))
    joined = 0
    for where, offset in byte_cuts(raw).items():
        outcome = await run(
            fake_server, "Replay", faults=[f"cut:bytes={offset}"], model=model, recording=ADJACENT_CITED, config=FAST
        )
        assert_invariants(outcome)
        committed = outcome.assistant[0]["content"]
        if committed != reading:
            # the first span's text all arrived, the second span's text not yet
            assert seam[0] <= offset < seam[1], where
            assert committed == joined_at_seams(reading), where
            joined += 1
    assert joined
