"""What a worker holds for a run's text while it streams, and what each delta costs as the text grows.

A worker keeps a streaming answer twice: the engine's blocks (``engine.blocks.Accumulator``,
which checkpoints and continuations read) and the live state a snapshot is built from
(``live.state.RunState``, every frame applied to it). Both keep the text as UTF-8
(``engine.utf8text.Utf8Text``). This bench feeds both the same answer, delta by delta, and
reports:

* **bytes held per byte of text** (tracemalloc, after a read as a checkpoint makes): the
  growth of both holders together over the answer's UTF-8 size. The anchor is the same text
  held as two ``str`` (the layout before ``Utf8Text``): ``2 * sys.getsizeof(text)``, which is
  up to 4 bytes per character once one emoji is in the text.
* **µs per delta** applying the frames to a ``RunState``, for a short and a long answer,
  against ``+=`` on a ``str`` attribute (what its reducer did before) in the same run: the
  ``str`` copies its whole text per delta, so its cost grows with the answer's length.

The vocabulary is the fake provider's (mostly ASCII words, some accented, some CJK, an emoji
now and then) or plain ASCII. Run: ``python -m bench.bench_textmem`` (``--help``).
No assertions on speed here or in tests: ``make bench`` puts the figures in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamrecover.engine.blocks import Accumulator
from streamrecover.engine.events import TextDelta
from streamrecover.live.state import RunState
from streamrecover.testing.fake.model import _PLAIN_WORDS, _SPICE_WORDS


@dataclass(frozen=True)
class Held:
    vocabulary: str
    deltas: int
    text_bytes: int
    held_bytes: int
    as_str_bytes: int  # the anchor: the text as two ``str``


@dataclass(frozen=True)
class PerDelta:
    deltas: int
    text_bytes: int
    utf8_us: float
    str_us: float


def answer(deltas: int, spiced: bool, seed: int = 7) -> list[str]:
    """``deltas`` deltas of one or two words each, as a provider streams them."""
    rng = random.Random(seed)
    words = [*_PLAIN_WORDS, *_SPICE_WORDS] if spiced else list(_PLAIN_WORDS)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 2))) + " " for _ in range(deltas)]


def text_frames(deltas: list[str]) -> list[dict[str, Any]]:
    """The client frames that carry ``deltas`` in block 0, numbered from 1."""
    return [{"type": "text_delta", "seq": seq, "block": 0, "text": d} for seq, d in enumerate(deltas, start=1)]


def held(deltas: list[str], vocabulary: str) -> Held:
    """Both holders' growth after every delta and a read, over the text's UTF-8."""
    frames = text_frames(deltas)
    events = [TextDelta(0, d) for d in deltas]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    acc, state = Accumulator(), RunState()
    for event, frame in zip(events, frames, strict=True):
        acc.apply(event)
        state.apply(frame)
    acc.snapshot()  # a checkpoint's read: what it leaves held is counted, the copy it returns is not
    state.to_json()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    text = "".join(deltas)
    assert acc.snapshot().blocks[0].text == text
    assert state.blocks[0].text == text
    return Held(vocabulary, len(deltas), len(text.encode()), grown, 2 * sys.getsizeof(text))


class _StrBlock:
    """The previous reducer's in-flight text block: a ``str`` attribute grown with ``+=``."""

    __slots__ = ("text",)

    def __init__(self) -> None:
        self.text = ""


class _StrReducer(RunState):
    """``RunState`` with its text deltas applied as before ``Utf8Text``: ``+=`` on a ``str``
    attribute, which copies the whole text whenever something else also refers to it."""

    def apply(self, frame: Mapping[str, Any]) -> None:
        if frame.get("type") == "text_delta":
            self.seq = max(self.seq, int(frame.get("seq") or 0))
            self.blocks.setdefault(frame["block"], _StrBlock()).text += frame.get("text", "")  # type: ignore[arg-type]
            return
        super().apply(frame)


def per_delta(deltas: list[str], repeat: int) -> PerDelta:
    frames = text_frames(deltas)

    def timed(state: RunState) -> float:
        start = time.perf_counter()
        for frame in frames:
            state.apply(frame)
        return time.perf_counter() - start

    best_utf8 = min(timed(RunState()) for _ in range(repeat))
    best_str = min(timed(_StrReducer()) for _ in range(repeat))
    return PerDelta(
        len(deltas), len("".join(deltas).encode()), best_utf8 / len(frames) * 1e6, best_str / len(frames) * 1e6
    )


def tables(held_rows: list[Held], delta_rows: list[PerDelta]) -> str:
    out = [
        "| text | deltas | text (UTF-8) | held by the engine's blocks and the live state | per byte of text"
        " | as two `str` (before) | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in held_rows:
        out.append(
            f"| {row.vocabulary} | {row.deltas:,} | {row.text_bytes:,} B | {row.held_bytes:,} B "
            f"| {row.held_bytes / row.text_bytes:.2f} | {row.as_str_bytes:,} B "
            f"({row.as_str_bytes / row.text_bytes:.2f} per byte) | {row.held_bytes / row.as_str_bytes:.2f}× |"
        )
    out += [
        "",
        "| deltas applied to a `RunState` | text (UTF-8) | µs per delta, `Utf8Text`"
        " | µs per delta, `str +=` (before) | ratio |",
        "|---|---|---|---|---|",
    ]
    for d in delta_rows:
        out.append(
            f"| {d.deltas:,} | {d.text_bytes:,} B | {d.utf8_us:.2f} | {d.str_us:.2f} | {d.utf8_us / d.str_us:.2f}× |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deltas", default="1000,50000", help="comma-separated answer lengths in deltas")
    parser.add_argument("--repeat", type=int, default=5, help="best of this many timings")
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.deltas.split(",") if n]
    held_rows = [held(answer(n, spiced), name) for n in lengths for spiced, name in ((True, "mixed"), (False, "ASCII"))]
    delta_rows = [per_delta(answer(n, True), args.repeat) for n in lengths]
    print(tables(held_rows, delta_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
