"""The streams recorded from the real Anthropic and OpenAI APIs, cut and recovered.

Each recording (``../shared/recorded``, skipped with a message when absent) is read whole by
the adapter (the uninterrupted reading), served byte for byte by the fake provider, and cut:
at event boundaries (every one for small streams, an even sample for big ones), inside tool
arguments, inside multi-byte characters and just before the terminator. A cut reading never
looks complete and never contradicts the whole one; a recovered run commits exactly the
uninterrupted reading, and the client's view equals what was committed.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamrecover.engine.blocks import Accumulator
from streamrecover.engine.sse import SSEDecoder

from .harness import FAST, assert_invariants, run
from .recorded_reading import read
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


EMPTY_REFUSAL = pytest.mark.xfail(
    strict=True,
    reason="issue 11, 'Empty assistant messages' (helper A): a refusal before any content commits content []",
)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=EMPTY_REFUSAL) if n == "anthropic_refusal_stop_details.sse" else n
        for n in sorted(RECORDINGS)
    ],
)
async def test_served_whole_the_committed_message_is_the_uninterrupted_reading(fake_server: Any, name: str) -> None:
    wire, model, thinking = RECORDINGS[name]
    raw = load_recorded(name)
    outcome = await run(
        fake_server, f"Replay {name}", wire=wire, model=model, thinking_budget=thinking, recording=raw, config=FAST
    )
    assert all(m["content"] for m in outcome.assistant), "an empty assistant message was committed"
    assert_invariants(outcome)
    assert outcome.assistant[0]["content"] == read(raw, wire).content


# The fake answers a continuation of a recording from its plan, which knows one text block
# and the tool calls after it: recordings with several text blocks or server blocks between
# them are swept at the adapter level above and served whole, not recovered through the fake.
RECOVERABLE = sorted(
    n
    for n in RECORDINGS
    if n
    not in {
        "anthropic_adaptive_text_thinking_text.sse",
        "anthropic_web_search_citations.sse",
        "anthropic_web_search_thinking.sse",
        "anthropic_code_execution_text_editor.sse",
        "anthropic_compaction_emoji.sse",
        "anthropic_mcp_tool.sse",
        "anthropic_refusal_stop_details.sse",
    }
)


@pytest.mark.parametrize("name", RECOVERABLE)
async def test_cut_and_recovered_the_committed_message_is_the_uninterrupted_one(fake_server: Any, name: str) -> None:
    wire, model, thinking = RECORDINGS[name]
    raw = load_recorded(name)
    reference = await run(
        fake_server, f"Replay {name}", wire=wire, model=model, thinking_budget=thinking, recording=raw, config=FAST
    )
    assert_invariants(reference)
    failures = []
    for where, offset in byte_cuts(raw).items():
        outcome = await run(
            fake_server,
            f"Replay {name}",
            faults=[f"cut:bytes={offset}"],
            wire=wire,
            model=model,
            thinking_budget=thinking,
            recording=raw,
            config=FAST,
        )
        try:
            assert_invariants(outcome, reference)
        except AssertionError as exc:
            failures.append(f"{where}: {str(exc)[:300]}")
    assert not failures, "\n".join(failures)
