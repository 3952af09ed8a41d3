"""The sweep: real provider streams and long generated ones, broken at every event
boundary and at many byte offsets (inside multi-byte characters too), by every fault
kind (a GOAWAY over HTTP/2 among them). Every run must complete with exactly the
uninterrupted answer, the client's view must equal what was committed, no text may be
billed twice, and no partial tool call may ever reach history. Models that repeat,
rephrase or restart when asked to continue are swept too (``test_sweep_seams``).

Reference streams are served byte for byte by the fake provider (``set_recording``); a
continuation is answered with the rest of the recorded answer. With thinking enabled every
continuation starts with a new signed thinking block, as the real API's responses do: the
committed message must still be the uninterrupted one (that block is dropped, and the
client told so).
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from streamrecover.engine.sse import SSEDecoder
from streamrecover.engine.transport import HttpxTransport
from streamrecover.testing.tools import demo_registry

from .harness import FAST, assert_invariants, run
from .streams import load_bytes

EVERY_BOUNDARY = "cut:events={n}"  # the commonest break: tried at every event boundary
SAMPLED_FAULTS = (
    "cut:events={n},mid",
    "eof:events={n}",
    "error:events={n}",
    "garbage:events={n}",
    "bad_utf8:events={n}",
    "goaway:events={n}",  # over HTTP/2 (the fake's h2c mode): GOAWAY mid-stream
)
MAX_SAMPLES = 12  # boundaries per sampled fault kind (evenly spread, first and last included)
# No fault here is a stall, so nothing waits for the idle timeout: a roomy one keeps a loaded
# host's pause (the fake serves from this process) from breaking an attempt the fake has already
# billed in full, which the billed-once check would take for text billed twice.
SWEEP = replace(FAST, idle_timeout_s=15.0)

# name -> (wire, model, thinking budget)
RECORDED = {
    "anthropic_basic_text.sse": ("anthropic", "claude-3-7-sonnet", None),
    "anthropic_text_tool.sse": ("anthropic", "claude-3-7-sonnet", None),
    "anthropic_text_tool_earlier_revision.sse": ("anthropic", "claude-3-7-sonnet", None),
    "anthropic_thinking.sse": ("anthropic", "claude-3-7-sonnet", 2048),
    "anthropic_thinking_recorded_padded.sse": ("anthropic", "claude-3-7-sonnet", 2048),
    "anthropic_redacted_thinking_recorded.sse": ("anthropic", "claude-3-7-sonnet", 2048),
    "openai_chat_tool.sse": ("openai", "gpt-4o", None),
    "openai_chat_refusal.sse": ("openai", "gpt-4o", None),
    "openai_responses_reasoning_tool.sse": ("openai-responses", "gpt-5", None),
    "openai_responses_background_initial.sse": ("openai-responses", "gpt-4o", None),
}

GENERATED = {
    "anthropic-thinking-text-then-tool": (
        "anthropic",
        "claude-3-7-sonnet",
        2048,
        "Think, then check [[words=40]] [[tool=get_weather]]",
    ),
    "anthropic-long-text": ("anthropic", "claude-3-7-sonnet", None, "A long story [[words=150]]"),
    "anthropic-text-then-tool": ("anthropic", "claude-3-7-sonnet", None, "Weather? [[words=40]] [[tool=get_weather]]"),
    "anthropic-thinking-text": ("anthropic", "claude-3-7-sonnet", 2048, "Think first [[words=120]]"),
    "openai-long-text": ("openai", "gpt-4o", None, "A long story [[words=150]]"),
    "openai-text-then-tool": ("openai", "gpt-4o", None, "Weather? [[words=40]] [[tool=get_weather]]"),
    "responses-long-text": ("openai-responses", "gpt-4o", None, "A long story [[words=20]]"),
    # reasoning on: a reasoning item first, a new one at the head of every continuation
    "responses-reasoning-text-then-tool": (
        "openai-responses",
        "gpt-5",
        None,
        "Think, then check [[words=6]] [[tool=get_weather]]",
    ),
    "gemini-long-text": ("gemini", "gemini-2.5-flash", None, "A long story [[words=40]]"),
    "gemini-text-then-tool": ("gemini", "gemini-2.5-flash", None, "Weather? [[words=20]] [[tool=get_weather]]"),
    "gemini-thinking-text": ("gemini", "gemini-2.5-flash", 2048, "Think first [[words=40]]"),
}
# extra request fields by generated case
EXTRA = {"responses-reasoning-text-then-tool": {"reasoning": {"effort": "low"}}}


def _event_count(raw: bytes) -> int:
    decoder = SSEDecoder()
    return len(decoder.feed(raw) + decoder.close())


def _byte_offsets(raw: bytes, count: int) -> list[int]:
    """``count`` evenly spread offsets, plus offsets that fall inside multi-byte UTF-8 characters."""
    offsets = set(range(1, len(raw), max(1, len(raw) // count)))
    inside = [i for i in range(1, len(raw)) if 0x80 <= raw[i] <= 0xBF]
    offsets.update(inside[:: max(1, len(inside) // 12)] if inside else [])
    return sorted(offsets)


async def _sweep(
    server, *, wire, model, thinking, prompt, recording: bytes | None, byte_samples: int, extra=None
) -> int:
    async def once(faults):
        http2 = any(str(f).startswith("goaway") for f in faults)
        async with HttpxTransport(http2_prior_knowledge=http2) as transport:
            return await run(
                server,
                prompt,
                faults=faults,
                wire=wire,
                model=model,
                thinking_budget=thinking,
                tools=demo_registry(),
                config=SWEEP,
                recording=recording,
                transport=transport,
                extra=extra,
            )

    reference = await once([])
    assert_invariants(reference)
    raw = recording if recording is not None else _raw_of(reference)
    boundaries = list(range(1, _event_count(raw)))
    cases = [EVERY_BOUNDARY.format(n=n) for n in boundaries]
    sampled = boundaries[:: max(1, len(boundaries) // MAX_SAMPLES)] + boundaries[-1:]
    cases += [f.format(n=n) for n in sampled for f in SAMPLED_FAULTS]
    cases += [f"cut:bytes={b}" for b in _byte_offsets(raw, byte_samples)]
    refusal = reference.sink.attempts[-1].stop_reason == "refusal"
    for fault in cases:
        outcome = await once([fault])
        try:
            if refusal and outcome.result.messages != reference.result.messages:
                _assert_refusal_kept_as_it_is(outcome, reference)
                continue
            assert_invariants(outcome, reference)
            if fault.startswith("goaway") and not outcome.log[0].completed:
                first = outcome.sink.attempts[0]
                assert first.interrupt_cause == "goaway", (first.interrupt_cause, first.error_message)
            assistant_text = "".join(b["text"] for m in outcome.assistant for b in m["content"] if b["type"] == "text")
            _assert_billed_once(outcome, assistant_text)
        except AssertionError as exc:
            raise AssertionError(f"fault {fault!r}: {exc}") from exc
    return len(cases)


def _assert_refusal_kept_as_it_is(outcome, reference) -> None:
    """A refusal is never continued, wherever it is cut: what arrived of it is the answer."""
    assert outcome.status == "completed", outcome.result.error
    assert outcome.events("llm_stream_continuation_started") == []
    for reconstructed, committed in outcome.view.turns:
        assert reconstructed == committed
    text = "".join(b["text"] for m in outcome.assistant for b in m["content"] if b["type"] == "text")
    assert "".join(b["text"] for m in reference.assistant for b in m["content"] if b["type"] == "text").startswith(text)


def _raw_of(reference) -> bytes:
    """The bytes the fake sends for the reference request (fetched once more)."""
    import httpx

    request = reference.sink.attempts[0].request
    headers = {k: v for k, v in request["headers"].items() if v != "[redacted]"}
    headers.update({"x-api-key": "k", "authorization": "Bearer k", "x-goog-api-key": "k"})
    headers["x-fake-scenario"] = uuid.uuid4().hex
    return httpx.post(request["url"], json=request["json"], headers=headers).content


@pytest.mark.parametrize("name", sorted(RECORDED))
async def test_sweep_reference_stream(fake_server, name):
    wire, model, thinking = RECORDED[name]
    raw = load_bytes(name)
    count = await _sweep(
        fake_server, wire=wire, model=model, thinking=thinking, prompt=f"Replay {name}", recording=raw, byte_samples=40
    )
    assert count > 10


@pytest.mark.parametrize("name", sorted(GENERATED))
async def test_sweep_generated_stream(fake_server, name):
    wire, model, thinking, prompt = GENERATED[name]
    count = await _sweep(
        fake_server,
        wire=wire,
        model=model,
        thinking=thinking,
        prompt=prompt,
        recording=None,
        byte_samples=40,
        extra=EXTRA.get(name),
    )
    assert count > 50


def _assert_billed_once(outcome, committed: str) -> None:
    """Every character of the answer was generated exactly once across all calls, except
    the trailing whitespace a prefill may not end with: the model regenerates that."""
    billed = outcome.billed_text()
    attempts = [(a.kind, a.interrupt_cause, a.error_kind, a.outcome) for a in outcome.sink.attempts]
    assert "".join(billed.split()) == "".join(committed.split()), f"text billed twice (or never); attempts {attempts}"
    extra = len(billed) - len(committed)
    prefills = sum(1 for e in outcome.log if e.understood_as == "prefill")
    assert 0 <= extra <= 2 * prefills, f"{extra} characters billed twice"


# A model asked to continue with a continue message that does not simply continue:
# seam directive -> the join kinds it may report, and whether the committed answer still
# equals the uninterrupted one (a rephrase or a different restart cannot).
SEAMS = {
    "repeat": ({"clean", "overlap_trimmed", "restart_trimmed"}, True),
    "repeat:8": ({"clean", "overlap_trimmed", "restart_trimmed"}, True),
    "restart": ({"restart_trimmed"}, True),
    "rephrase": ({"clean", "rephrased"}, False),
    "restart_new": ({"restart_replaced", "restart_trimmed"}, False),
}
SEAM_PROMPTS = {
    "openai": ("openai", "gpt-4o", "A long story [[words=60]]"),
    "anthropic-noprefill": ("anthropic", "claude-opus-4-6", "Weather? [[words=30]] [[tool=get_weather]]"),
}


@pytest.mark.parametrize("seam", sorted(SEAMS))
@pytest.mark.parametrize("case", sorted(SEAM_PROMPTS))
async def test_sweep_seams(fake_server, seam, case):
    """Every event boundary, with a model that repeats, rephrases or restarts at the seam:
    the client and the committed message agree, the event names the join, a repeat or an
    identical restart leaves exactly the uninterrupted answer, and the only text billed
    twice is what the model repeated (reported as the join's characters)."""
    wire, model, prompt = SEAM_PROMPTS[case]
    prompt = f"{prompt} [[seam={seam}]]"
    kinds, exact = SEAMS[seam]

    async def once(faults):
        return await run(
            fake_server, prompt, faults=faults, wire=wire, model=model, tools=demo_registry(), config=SWEEP
        )

    reference = await once([])
    raw = _raw_of(reference)
    seen: set[str] = set()
    for n in range(1, _event_count(raw)):
        fault = f"cut:events={n}"
        outcome = await once([fault])
        try:
            assert_invariants(outcome, reference if exact else None)
            joins = [j for e in outcome.events("llm_stream_continuation_completed") for j in e.get("joins", [])]
            assert {j["kind"] for j in joins} <= kinds, joins
            seen.update(j["kind"] for j in joins)
            committed = "".join(b["text"] for m in outcome.assistant for b in m["content"] if b["type"] == "text")
            repeated = sum(j["chars"] for j in joins if j["kind"] != "rephrased")
            assert len(outcome.billed_text()) - len(committed) == repeated, "text billed twice"
        except AssertionError as exc:
            raise AssertionError(f"fault {fault!r}: {exc}") from exc
    assert seen - {"clean"}, f"the seam {seam!r} never showed"
