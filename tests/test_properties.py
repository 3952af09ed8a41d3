"""Property-based tests (hypothesis) of the decoder, the accumulator and the joiner.

- Any chunking of a valid stream gives the same events and the same accumulated blocks
  (streams the fake provider writes, and the recorded ones when they are beside the repo).
- Arbitrary bytes (and arbitrary JSON in well-framed events) raise only the engine's own
  error types, never a ``KeyError`` or ``TypeError`` that would escape the runner's handling.
- Joining a continuation onto its prefix gives exactly what the reference client rebuilds
  from the frames, and the same whatever the continuation's deltas.

Example counts are modest and the search is derandomized (the ``PROFILE`` below), so a run
is deterministic and short; ``HYPOTHESIS_EXAMPLES`` raises the count for a deeper search.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrecover.engine.blocks import TEXT, Accumulator
from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import InMemoryCheckpointStore
from streamrecover.engine.config import EngineConfig
from streamrecover.engine.context import RunContext
from streamrecover.engine.continuation import continue_from, joiner_for
from streamrecover.engine.contract import ModelRequest, ProviderConfig, Strategy
from streamrecover.engine.errors import StreamRecoverError
from streamrecover.engine.events import BlockStart, BlockStop, StreamEnd, TextDelta, ThinkingDelta, ToolArgsDelta
from streamrecover.engine.plan import plan
from streamrecover.engine.protocol import FrameReducer
from streamrecover.engine.sink import AttemptRecord, CollectingSink
from streamrecover.engine.sse import SSEDecoder, SSEEvent
from streamrecover.engine.translate import AttemptDone, Translator
from streamrecover.providers.registry import get_adapter
from streamrecover.testing.tools import demo_registry

from .streams import RECORDINGS, REFERENCE

PROFILE = settings(
    max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "40")),
    derandomize=True,  # the same examples on every run: CI is deterministic
    database=None,  # nothing written beside the repository
    deadline=None,  # a loaded 2-core CI machine must not turn slowness into failures
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
WIRES = ("anthropic", "openai")
FAKE_PROMPTS = {
    "story": ("Tell me a story about the sea, café 日本語 🚀 [[words=60]]", False, None),
    "tool": ("What is the weather in Paris? [[tool=get_weather]]", True, None),
    "two_tools": ("Weather in Paris and Rome? [[tools=2]]", True, None),
    "thinking": ("Think, then answer [[words=30]]", False, 2048),
}


def _adapter(wire: str) -> Any:
    return get_adapter(ProviderConfig(name=wire, base_url="http://unused", api_key="k"))


def _fetch(fake_server: Any, wire: str, prompt: str, tools: bool, thinking: int | None) -> bytes:
    base = fake_server.base_url if wire == "anthropic" else f"{fake_server.base_url}/v1"
    adapter = get_adapter(ProviderConfig(name=wire, base_url=base, api_key="sk-test"))
    model = "claude-3-7-sonnet" if wire == "anthropic" else "gpt-4o"
    request = ModelRequest(
        model=model,
        messages=[{"role": "user", "content": [{"type": "text", "text": prompt}]}],
        max_tokens=4096,
        tools=demo_registry().specs() if tools else (),
        thinking_budget=thinking if wire == "anthropic" else None,
    )
    http = adapter.build_request(request)
    response = httpx.post(http.url, headers=dict(http.headers), json=http.json, timeout=30)
    assert response.status_code == 200, response.text
    return response.content


@pytest.fixture(scope="module")
def corpus(fake_server: Any) -> list[tuple[str, str, bytes]]:
    """(name, wire, body): streams the fake writes, plus the recorded ones when present."""
    streams = [
        (f"fake-{wire}-{name}", wire, _fetch(fake_server, wire, *spec))
        for wire in WIRES
        for name, spec in FAKE_PROMPTS.items()
    ]
    for folder in (REFERENCE.path, RECORDINGS.path):
        if Path(folder).is_dir():
            for path in sorted(Path(folder).glob("*.sse")):
                wire = "openai" if path.name.startswith("openai") else "anthropic"
                streams.append((path.name, wire, path.read_bytes()))
    return streams


def _decode(*chunks: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    decoder.close()
    return events


def _accumulate(wire: str, events: list[SSEEvent]) -> tuple[list[dict[str, Any]], str | None, bool]:
    parser = _adapter(wire).new_parser()
    acc = Accumulator()
    for sse in events:
        for event in parser.feed(sse):
            acc.apply(event)
    return [b.to_content() for b in acc.blocks], acc.stop_reason, acc.ended


def _chunks(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(raw)) for c in cuts})
    return [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]


# ---- any chunking of a valid stream gives the same result ------------------------------------------


def test_the_corpus_has_the_fakes_streams_in_both_formats(corpus: list[tuple[str, str, bytes]]) -> None:
    fake = [(name, wire, raw) for name, wire, raw in corpus if name.startswith("fake-")]
    assert len(fake) == len(WIRES) * len(FAKE_PROMPTS)
    for name, wire, raw in fake:
        blocks, stop_reason, _ended = _accumulate(wire, _decode(raw))
        assert blocks, name
        assert stop_reason in ("end_turn", "tool_use", "stop", "tool_calls"), name


@PROFILE
@given(data=st.data())
def test_any_chunking_gives_the_same_events_and_blocks(corpus: list[tuple[str, str, bytes]], data: Any) -> None:
    name, wire, raw = data.draw(st.sampled_from(corpus), label="stream")
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=40), label="cuts")
    whole = _decode(raw)
    chunked = _decode(*_chunks(raw, cuts))
    assert chunked == whole, name
    assert _accumulate(wire, chunked) == _accumulate(wire, whole), name


@PROFILE
@given(data=st.data())
def test_any_split_of_the_deltas_gives_the_same_blocks(corpus: list[tuple[str, str, bytes]], data: Any) -> None:
    """The accumulator: text, thinking and tool arguments cut into smaller deltas anywhere
    (a character is never split) accumulate the same blocks."""
    name, wire, raw = data.draw(st.sampled_from(corpus), label="stream")
    parser = _adapter(wire).new_parser()
    events = [event for sse in _decode(raw) for event in parser.feed(sse)]
    whole, split = Accumulator(), Accumulator()
    for event in events:
        whole.apply(event)
        text = _delta_text(event)
        if text is None or len(text) < 2:
            split.apply(event)
            continue
        cuts = data.draw(st.lists(st.integers(1, len(text) - 1), max_size=6, unique=True), label="delta cuts")
        points = sorted(cuts)
        for a, b in zip([0, *points], [*points, len(text)], strict=True):
            split.apply(_with_text(event, text[a:b]))
    assert [b.to_content() for b in split.blocks] == [b.to_content() for b in whole.blocks], name
    assert (split.stop_reason, split.ended) == (whole.stop_reason, whole.ended)


def _delta_text(event: Any) -> str | None:
    if isinstance(event, TextDelta | ThinkingDelta):
        return event.text if isinstance(event, TextDelta) else event.thinking
    if isinstance(event, ToolArgsDelta):
        return event.partial_json
    return None


def _with_text(event: Any, text: str) -> Any:
    if isinstance(event, TextDelta):
        return TextDelta(event.index, text)
    if isinstance(event, ThinkingDelta):
        return ThinkingDelta(event.index, text)
    return ToolArgsDelta(event.index, text)


# ---- arbitrary bytes raise only the engine's own errors ------------------------------------------

_SSE_PIECES = st.sampled_from(
    [b"data: ", b"data:", b"event: ", b"id: ", b"retry: 10", b": comment", b"\n", b"\r\n", b"\r", b"\n\n", b"{", b"}"]
)
# any text, with the characters that are valid JSON escapes but awkward everywhere else (NUL,
# lone surrogates, line separators, a BOM), which hypothesis does not draw by default
_ODD = st.sampled_from(["\x00", "\ud800", "\udc00", "\ud83d", "\u2028", "\ufeff", "\r\n", "é"])
_ANY_TEXT = st.lists(st.one_of(_ODD, st.text(max_size=3)), min_size=1, max_size=4).map("".join)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=6,
)
_TYPES = [
    "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
    "message_stop", "ping", "error", "text_delta", "input_json_delta", "thinking_delta", "signature_delta",
    "tool_use", "text", "thinking", "citations_delta", "server_tool_use", "redacted_thinking",
]  # fmt: skip


def _feed_everything(wire: str, chunks: list[bytes]) -> None:
    """Decoder, the adapter's parser and the turn's translator (the accumulator behind it)
    over ``chunks``: only the engine's own errors may come out (the runner classifies exactly
    those as a broken stream) or the end of the stream."""
    translator, record, _ = _translator(wire)

    async def feed() -> None:
        decoder = SSEDecoder(max_line_bytes=4096)
        parser = translator.ctx.adapter.new_parser()
        for chunk in chunks:
            for sse in decoder.feed(chunk):
                for event in parser.feed(sse):
                    await translator.on_event(event, record)
        decoder.close()

    with contextlib.suppress(StreamRecoverError, AttemptDone):
        asyncio.run(feed())


def _translator(wire: str) -> tuple[Translator, AttemptRecord, CollectingSink]:
    """A turn's translator on an in-memory context, its attempt record and frame sink."""
    sink = CollectingSink()
    ctx = RunContext(
        run_id="prop",
        adapter=_adapter(wire),
        config=EngineConfig(),
        sink=sink,
        checkpoints=InMemoryCheckpointStore(),
        cancel=CancelToken(),
    )

    async def nothing(*_: Any) -> None:
        return None

    translator = Translator(ctx, nothing, nothing)
    translator.begin(Accumulator(), [], None)
    record = AttemptRecord(
        run_id="prop", turn=0, index=0, kind="initial", continuation=0, strategy=None, request={}, started_at=0.0
    )
    return translator, record, sink


@PROFILE
@given(
    wire=st.sampled_from(WIRES),
    pieces=st.lists(st.one_of(st.binary(max_size=40), _SSE_PIECES), max_size=60),
    cuts=st.lists(st.integers(0, 4000), max_size=8),
)
def test_arbitrary_bytes_raise_only_the_engines_errors(wire: str, pieces: list[bytes], cuts: list[int]) -> None:
    raw = b"".join(pieces)
    _feed_everything(wire, _chunks(raw, cuts))


_KEYS = ["type", "index", "delta", "content_block", "message", "usage", "error", "choices", "id", "model"]


@st.composite
def _hostile_payload(draw: Any) -> Any:
    """JSON shaped like a provider event: any field missing or of any type, or a well-formed
    delta carrying any string."""
    shape = draw(st.sampled_from(["any", "shaped", "anthropic_delta", "openai_delta"]))
    if shape == "any":
        return draw(_JSON)
    if shape == "anthropic_delta":
        field = draw(st.sampled_from(["text", "thinking", "partial_json"]))
        kind = "input_json_delta" if field == "partial_json" else f"{field}_delta"
        return {
            "type": "content_block_delta",
            "index": draw(st.integers(0, 2)),
            "delta": {"type": kind, field: draw(_ANY_TEXT)},
        }
    if shape == "openai_delta":
        delta = draw(
            st.sampled_from([{"content": draw(_ANY_TEXT)}, {"reasoning_content": draw(_ANY_TEXT)}, draw(_JSON)])
        )
        return {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    payload = draw(st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=4))
    if draw(st.booleans()):
        payload["type"] = draw(st.sampled_from(_TYPES))
    for key in ("delta", "content_block"):
        if draw(st.booleans()):
            extra = draw(st.dictionaries(st.sampled_from(["text", "name", "id", "partial_json", "index"]), _JSON))
            payload[key] = {"type": draw(st.sampled_from(_TYPES)), **extra}
    if draw(st.booleans()):
        payload["choices"] = [{"index": draw(st.integers(-2, 3)), "delta": draw(_JSON), "finish_reason": draw(_JSON)}]
    if draw(st.booleans()):
        payload["index"] = draw(st.integers(-3, 5))
    return payload


@PROFILE
@given(wire=st.sampled_from(WIRES), payloads=st.lists(_hostile_payload(), min_size=1, max_size=8))
def test_arbitrary_json_in_well_framed_events_raises_only_the_engines_errors(wire: str, payloads: list[Any]) -> None:
    events = [
        (f"event: {p['type']}\n" if isinstance(p, dict) and isinstance(p.get("type"), str) else "")
        + f"data: {json.dumps(p)}\n\n"
        for p in payloads
    ]
    for event in events:  # each on its own (in a sequence, the first bad one ends the stream)
        _feed_everything(wire, [event.encode()])
    _feed_everything(wire, ["".join(events).encode()])


# ---- join(prefix, continuation) is what the client rebuilds ------------------------------------------

_WORDS = st.sampled_from(
    ["The", "sea", "was", "calm,", "and", "the", "boat", "drifted", "north.", "café", "日本語", "🚀", "\n\n", "over"]
)


@st.composite
def _seam(draw: Any) -> tuple[str, str, Strategy, bool]:
    """A kept prefix, a continuation the model might write and the strategy that makes it
    possible: clean; after a prefill, the held-back whitespace again; after a prefix flag,
    the whole prefix echoed; after a continue message, the tail repeated, the answer started
    over (whole, or its beginning and then something else). The last item: echoes_prefix."""
    prefix = " ".join(draw(st.lists(_WORDS, min_size=6, max_size=30)))
    if draw(st.booleans()):
        prefix += draw(st.sampled_from([" ", "\n\n"]))
    rest = " ".join(draw(st.lists(_WORDS, min_size=1, max_size=20)))
    shape = draw(st.sampled_from(["clean", "prefill_space", "echo", "tail", "restart", "restart_other"]))
    if shape == "clean":
        strategy = draw(st.sampled_from([Strategy.PREFILL, Strategy.CONTINUE_MESSAGE, Strategy.PREFIX_FLAG]))
        return prefix, rest, strategy, False
    if shape == "prefill_space":  # the model writes again the whitespace the prefill had to lose
        return prefix, prefix[len(prefix.rstrip()) :] + "Next " + rest, Strategy.PREFILL, False
    if shape == "echo":
        return prefix, prefix + "Next " + rest, Strategy.PREFIX_FLAG, True
    if shape == "tail":
        continuation = prefix[-draw(st.integers(1, len(prefix))) :] + rest
    elif shape == "restart":
        continuation = prefix + rest
    else:  # the answer's beginning (often past the 24 characters that make it a restart), then other words
        continuation = prefix[: draw(st.integers(0, len(prefix)))] + "Otherwise, " + rest
    return prefix, continuation, Strategy.CONTINUE_MESSAGE, False


async def _join_through_translator(
    prefix: str, deltas: list[str], strategy: Strategy, echoes: bool
) -> tuple[str, FrameReducer]:
    """The turn's path: a first response whose text is ``prefix`` breaks, the plan keeps it,
    the continuation's text arrives as ``deltas``. Returns the committed text and the client."""
    translator, record, sink = _translator("anthropic")
    first = translator.acc
    for event in (BlockStart(0, TEXT), TextDelta(0, prefix)):
        await translator.on_event(event, record)
    chosen = continue_from(plan(first.snapshot()), strategy)
    assert chosen.acc is not None
    translator.begin(chosen.acc, chosen.prefix, joiner_for(chosen.prefix, strategy, echoes_prefix=echoes))
    try:
        for event in (BlockStart(0, TEXT), *(TextDelta(0, d) for d in deltas), BlockStop(0), StreamEnd()):
            await translator.on_event(event, record)
    except AttemptDone:
        pass
    client = FrameReducer()
    for frame in sink.frames:
        client.apply(frame)
    committed = "".join(b.text for b in translator.acc.blocks if b.kind == TEXT)
    return committed, client


@PROFILE
@given(seam=_seam(), data=st.data())
def test_the_joined_text_is_what_the_client_rebuilds_however_the_continuation_arrives(
    seam: tuple[str, str, Strategy, bool], data: Any
) -> None:
    prefix, continuation, strategy, echoes = seam
    if not prefix.strip():
        return  # a blank prefix restarts the turn (nothing to join)
    cuts = sorted(data.draw(st.lists(st.integers(1, max(1, len(continuation) - 1)), max_size=8, unique=True)))
    deltas = [continuation[a:b] for a, b in zip([0, *cuts], [*cuts, len(continuation)], strict=True) if b > a]
    committed, client = asyncio.run(_join_through_translator(prefix, deltas, strategy, echoes))
    shown = "".join(block.get("text", "") for block in client.reconstructed())
    assert shown == committed
    whole, _ = asyncio.run(_join_through_translator(prefix, [continuation], strategy, echoes))
    assert committed == whole  # the same join whatever the deltas
    # nothing is lost: the committed text ends with the continuation's new words
    assert committed.endswith(continuation[-1:]) or not continuation.strip()
    if "Next " in continuation and strategy is not Strategy.CONTINUE_MESSAGE:  # a known repeat: dropped once
        assert committed == prefix + continuation[continuation.index("Next ") :]
