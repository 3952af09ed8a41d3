"""Parse + accumulate throughput: this engine against the anthropic SDK and a bare floor.

Every token of every stream goes through the SSE decoder, the adapter's parser and the
accumulator, so this is the engine's hot path. Three pipelines get the same bytes in the
same chunks and are timed in events per second (SSE events dispatched, ``ping`` included):

* ``engine``: ``SSEDecoder`` -> ``AnthropicAdapter.new_parser().feed`` -> ``Accumulator.apply``.
* ``sdk``: the official SDK end to end, ``client.messages.stream(...)`` over an in-memory
  ``httpx2.MockTransport`` that returns the bytes, then ``get_final_message()``: its SSE
  decoder, pydantic event models, ``MessageStream`` events and ``accumulate_event``. This
  includes a fixed cost per request (building it, the mock round trip), so ``sdk-direct``
  is measured too: the SDK's ``SSEDecoder`` + ``construct_type`` + ``accumulate_event``
  with no HTTP at all.
* ``floor``: httpx-sse's line and event decoders (the ones ``EventSource.iter_sse`` uses,
  minus the httpx response) on incrementally decoded text, plus ``json.loads`` of each
  data. Nothing is accumulated: no real consumer can be faster than this.

Run: ``.venv/bin/python -m bench.bench_parse`` (``--help`` for sizes and repetitions).
No assertions on speed here or in tests: ``make bench`` puts the figures in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import codecs
import datetime
import gc
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anthropic
import httpx2
from anthropic._models import construct_type
from anthropic._streaming import SSEDecoder as SDKSSEDecoder
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from httpx_sse._decoders import SSEDecoder as HttpxSSEDecoder
from httpx_sse._decoders import SSELineDecoder

from streamrecover.engine.blocks import Accumulator
from streamrecover.engine.contract import ProviderConfig
from streamrecover.engine.sse import SSEDecoder
from streamrecover.providers.anthropic import AnthropicAdapter

STREAMS = Path(__file__).resolve().parents[2] / "shared" / "streams"
# Recorded Anthropic streams the SDK can read to the end. Left out: the error fixture (the
# SDK raises on it, by design) and anthropic_thinking.sse, the documented example, whose
# message_start and message_delta carry no usage: anthropic 2.14's accumulate_event then
# fails with AttributeError ('NoneType' object has no attribute 'output_tokens').
FIXTURES = (
    "anthropic_basic_text.sse",
    "anthropic_text_tool.sse",
    "anthropic_text_tool_earlier_revision.sse",
    "anthropic_thinking_recorded_padded.sse",
    "anthropic_redacted_thinking_recorded.sse",
)

Pipeline = Callable[[list[bytes]], tuple[int, Any]]


# -- input ------------------------------------------------------------------------------

_WORDS = (
    "The",
    " quick",
    " br",
    "own",
    " fox",
    ",",
    " jumps",
    " over",
    " the",
    " lazy",
    " dog",
    ".",
    "\n\n",
    " café",
    " naïve",
    " 日本",
    "語",
    " 🎉",
    ' "quoted"',
    " a\\b",
    " 42",
    "%",
)


def generate_stream(text_deltas: int = 5000, json_fragments: int = 1000, seed: int = 7) -> tuple[bytes, dict[str, Any]]:
    """A long Anthropic stream shaped like the recorded ones (whitespace padding before the
    final ``}``, a ``ping``, raw UTF-8), and the message it must accumulate to."""
    rng = random.Random(seed)
    out: list[str] = []

    def event(name: str, payload: dict[str, Any], pad: bool = True) -> None:
        data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        if pad:
            data = data[:-1] + " " * rng.choice((0, 4, 7, 10, 13, 15)) + "}"
        out.append(f"event: {name}\ndata: {data}\n\n")

    event(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_bench",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5-20250929",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 1200, "output_tokens": 1},
            },
        },
    )
    text_block = {"type": "text", "text": ""}
    event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": text_block})
    event("ping", {"type": "ping"}, pad=False)
    pieces = [rng.choice(_WORDS) for _ in range(text_deltas)]
    for piece in pieces:
        delta = {"type": "text_delta", "text": piece}
        event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    event("content_block_stop", {"type": "content_block_stop", "index": 0})

    tool_input = {
        "path": "src/app/main.py",
        "content": "".join(rng.choice(_WORDS) for _ in range(json_fragments * 2)),
        "lines": list(range(40)),
        "options": {"overwrite": True, "encoding": "utf-8"},
    }
    raw_json = json.dumps(tool_input, ensure_ascii=False)  # default separators: spaces, like the API
    cuts = sorted(rng.sample(range(1, len(raw_json)), json_fragments - 2))
    fragments = [""] + [raw_json[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw_json)], strict=True)]
    event(
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_bench", "name": "write_file", "input": {}},
        },
    )
    for fragment in fragments:
        delta = {"type": "input_json_delta", "partial_json": fragment}
        event("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": delta})
    event("content_block_stop", {"type": "content_block_stop", "index": 1})
    event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": text_deltas + json_fragments},
        },
    )
    event("message_stop", {"type": "message_stop"})
    expected = {
        "content": [
            {"type": "text", "text": "".join(pieces)},
            {"type": "tool_use", "id": "toolu_bench", "name": "write_file", "input": tool_input},
        ],
        "stop_reason": "tool_use",
        "output_tokens": text_deltas + json_fragments,
    }
    return "".join(out).encode(), expected


def chunked(raw: bytes, rng: random.Random, low: int, high: int) -> list[bytes]:
    """The body cut the way a TLS/HTTP stack delivers it: chunks of ``low``-``high`` bytes."""
    chunks = []
    pos = 0
    while pos < len(raw):
        size = rng.randint(low, high)
        chunks.append(raw[pos : pos + size])
        pos += size
    return chunks


# -- the pipelines ----------------------------------------------------------------------

_ADAPTER = AnthropicAdapter(ProviderConfig(name="anthropic", base_url="https://api.anthropic.com", api_key="bench"))


def run_engine(chunks: list[bytes]) -> tuple[int, Any]:
    decoder = SSEDecoder()
    feed = _ADAPTER.new_parser().feed
    acc = Accumulator()
    apply = acc.apply
    count = 0
    for chunk in chunks:
        for sse in decoder.feed(chunk):
            count += 1
            for event in feed(sse):
                apply(event)
    decoder.close()
    return count, acc


class _SDKClient:
    """One SDK client whose transport answers every request with the current chunks."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        transport = httpx2.MockTransport(self._handle)
        self.client = anthropic.Anthropic(
            api_key="bench",
            base_url="http://bench.invalid",
            http_client=httpx2.Client(transport=transport),
            max_retries=0,
        )

    def _handle(self, request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200,
            headers={"content-type": "text/event-stream; charset=utf-8", "request-id": "req_bench"},
            content=self._body(),
        )

    def _body(self) -> Iterator[bytes]:
        yield from self.chunks

    def run(self, chunks: list[bytes]) -> tuple[int, Any]:
        self.chunks = chunks
        with self.client.messages.stream(
            model="bench-model", max_tokens=8192, messages=[{"role": "user", "content": "bench"}]
        ) as stream:
            message = stream.get_final_message()
        return -1, message  # no count of SSE events here: sdk-direct and the floor check the count


_SDK = _SDKClient()


def run_sdk(chunks: list[bytes]) -> tuple[int, Any]:
    return _SDK.run(chunks)


def run_sdk_direct(chunks: list[bytes]) -> tuple[int, Any]:
    """What ``Stream.__stream__`` + ``MessageStream`` do per event, without HTTP or the
    ``MessageStream`` event objects."""
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    count = 0
    for sse in SDKSSEDecoder().iter_bytes(iter(chunks)):
        count += 1
        if sse.event == "ping" or not sse.data:
            continue
        event = cast(RawMessageStreamEvent, construct_type(type_=RawMessageStreamEvent, value=sse.json()))
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    return count, snapshot


def run_floor(chunks: list[bytes]) -> tuple[int, Any]:
    text_decoder = codecs.getincrementaldecoder("utf-8")()
    lines = SSELineDecoder()
    events = HttpxSSEDecoder()
    count = 0
    last = None
    for chunk in chunks:
        for line in lines.decode(text_decoder.decode(chunk)):
            sse = events.decode(line)
            if sse is not None:
                count += 1
                last = json.loads(sse.data)
    return count, last


PIPELINES: dict[str, Pipeline] = {
    "engine": run_engine,
    "sdk": run_sdk,
    "sdk-direct": run_sdk_direct,
    "floor": run_floor,
}


# -- checking that they all did the same work -------------------------------------------


def engine_message(acc: Accumulator) -> dict[str, Any]:
    return {
        "content": [b.to_content() for b in acc.blocks],
        "stop_reason": acc.stop_reason,
        "output_tokens": acc.usage.output_tokens,
    }


def sdk_message(message: Any) -> dict[str, Any]:
    content = []
    for block in message.content:
        raw = block.to_dict()
        keep = {"text": ("text",), "tool_use": ("id", "name", "input"), "thinking": ("thinking", "signature")}
        content.append({"type": raw["type"], **{k: raw[k] for k in keep.get(raw["type"], ("data",))}})
    return {"content": content, "stop_reason": message.stop_reason, "output_tokens": message.usage.output_tokens}


def check(name: str, chunks: list[bytes], expected: dict[str, Any] | None) -> int:
    """Run every pipeline once; they must agree (with ``expected`` too when given)."""
    count, acc = run_engine(chunks)
    mine = engine_message(acc)
    if expected is not None and mine != expected:
        raise SystemExit(f"{name}: the engine accumulated something else than the generator wrote")
    for label, sdk_result in (("sdk", run_sdk(chunks)[1]), ("sdk-direct", run_sdk_direct(chunks)[1])):
        if sdk_message(sdk_result) != mine:
            raise SystemExit(f"{name}: {label} and the engine disagree:\n{sdk_message(sdk_result)}\n{mine}")
    if run_sdk_direct(chunks)[0] != count or run_floor(chunks)[0] != count:
        raise SystemExit(f"{name}: the pipelines saw different numbers of SSE events")
    return count


# -- timing -----------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    events: int
    nbytes: int
    best_s: dict[str, float]

    def rate(self, pipeline: str) -> float:
        return self.events / self.best_s[pipeline]


def measure(name: str, inputs: list[list[bytes]], expected: list[dict[str, Any] | None], repeat: int) -> Row:
    """Best of ``repeat`` samples per pipeline, interleaved so that noise from other work
    on the machine hits every pipeline alike. A sample runs all ``inputs`` once, as many
    times as it takes to last about 30 ms."""
    pairs = zip(inputs, expected, strict=True)
    events = sum(check(f"{name}[{i}]", chunks, exp) for i, (chunks, exp) in enumerate(pairs))
    nbytes = sum(len(c) for chunks in inputs for c in chunks)

    def once(pipeline: Pipeline) -> None:
        for chunks in inputs:
            pipeline(chunks)

    loops: dict[str, int] = {}
    for label, pipeline in PIPELINES.items():
        start = time.perf_counter()
        once(pipeline)
        elapsed = time.perf_counter() - start
        loops[label] = max(1, round(0.03 / max(elapsed, 1e-9)))
    best = dict.fromkeys(PIPELINES, float("inf"))
    for _ in range(repeat):
        for label, pipeline in PIPELINES.items():
            gc.collect()
            start = time.perf_counter()
            for _ in range(loops[label]):
                once(pipeline)
            best[label] = min(best[label], (time.perf_counter() - start) / loops[label])
    return Row(name, events, nbytes, best)


def table(rows: list[Row]) -> str:
    head = (
        "| input | events | KiB | engine ev/s | sdk ev/s | sdk-direct ev/s | floor ev/s "
        "| engine/sdk | engine/sdk-direct | engine/floor |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.events} | {r.nbytes / 1024:.0f} | {r.rate('engine'):,.0f} | {r.rate('sdk'):,.0f} "
            f"| {r.rate('sdk-direct'):,.0f} | {r.rate('floor'):,.0f} | {r.rate('engine') / r.rate('sdk'):.1f}x "
            f"| {r.rate('engine') / r.rate('sdk-direct'):.1f}x | {r.rate('engine') / r.rate('floor'):.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text-deltas", type=int, default=5000)
    parser.add_argument("--json-fragments", type=int, default=1000)
    parser.add_argument("--chunk-min", type=int, default=1024)
    parser.add_argument("--chunk-max", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=20, help="samples per pipeline; the best counts")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-long", dest="long", action="store_false", help="skip the 8x longer generated stream")
    args = parser.parse_args(argv)

    if not STREAMS.is_dir():
        raise SystemExit(f"fixture folder {STREAMS} is missing: put a copy of shared/ beside the repository")
    rng = random.Random(args.seed)
    raw, expected = generate_stream(args.text_deltas, args.json_fragments, args.seed)
    generated = chunked(raw, rng, args.chunk_min, args.chunk_max)
    recorded = [chunked((STREAMS / name).read_bytes(), rng, args.chunk_min, args.chunk_max) for name in FIXTURES]

    print(
        f"{datetime.date.today()} · Python {platform.python_version()} · {platform.machine()} · "
        f"{os.cpu_count()} cores · anthropic {anthropic.__version__} · chunks {args.chunk_min}-{args.chunk_max} B · "
        f"best of {args.repeat}",
        file=sys.stderr,
    )
    label = f"generated: {args.text_deltas} text + {args.json_fragments} json deltas"
    rows = [
        measure(label, [generated], [expected], args.repeat),
        measure(f"recorded fixtures (all {len(FIXTURES)})", recorded, [None] * len(recorded), args.repeat),
    ]
    if args.long:
        # A long answer: where per-delta costs that grow with the text (str +=, re-parsing
        # the partial JSON) show up.
        long_raw, long_expected = generate_stream(args.text_deltas * 8, args.json_fragments * 4, args.seed)
        long_chunks = chunked(long_raw, rng, args.chunk_min, args.chunk_max)
        name = f"generated long: {args.text_deltas * 8} text + {args.json_fragments * 4} json deltas"
        rows.insert(1, measure(name, [long_chunks], [long_expected], max(3, args.repeat // 4)))
    for name, chunks in zip(FIXTURES, recorded, strict=True):
        rows.append(measure(name.removesuffix(".sse"), [chunks], [None], args.repeat))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
