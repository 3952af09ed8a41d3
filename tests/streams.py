"""The recorded provider streams the tests read, from a folder beside the repository.

The streams are test data kept outside the repository (``../shared/streams``, or the folder
named by ``STREAMRECOVER_STREAMS_DIR``). In a clone with nothing beside it the tests that
need them are skipped, each saying where it looked, and the run's summary counts them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamrecover.engine.sse import SSEDecoder, SSEEvent

BESIDE = Path(__file__).resolve().parents[2] / "shared" / "streams"
STREAMS = Path(os.environ.get("STREAMRECOVER_STREAMS_DIR") or BESIDE)
MISSING = "recorded streams not found"


def stream_path(name: str) -> Path:
    """The fixture's path. Without the folder the test is skipped, saying where it looked; a
    folder that is there but lacks this stream fails the test (a renamed or lost fixture)."""
    path = STREAMS / name
    if not STREAMS.is_dir():
        pytest.skip(f"{MISSING}: {STREAMS} does not exist (set STREAMRECOVER_STREAMS_DIR)")
    if not path.is_file():
        pytest.fail(f"reference stream {path} is missing from {STREAMS}", pytrace=False)
    return path


def load_bytes(name: str) -> bytes:
    return stream_path(name).read_bytes()


def load_text(name: str) -> str:
    return stream_path(name).read_text(encoding="utf-8")


def sse_events(text: str) -> list[SSEEvent]:
    """The events the engine's decoder dispatches for ``text`` with the stream still open: an
    event whose blank line has not arrived (the text after the last one) is not among them."""
    return SSEDecoder().feed(text.encode())


def cut_points(text: str) -> list[int]:
    """Where to cut a recorded stream to test that it never looks complete: around every event
    boundary (just before, at, just after, 20 characters before) and at the very ends."""
    boundaries = [i + 2 for i in range(len(text)) if text.startswith("\n\n", i)]
    cuts = {0, len(text) - 1, len(text) - 2}
    for end in boundaries:
        cuts.update({end - 1, end, end + 1, max(0, end - 20)})
    return sorted(c for c in cuts if c < len(text))


# ---- the recorded real-API streams (``../shared/recorded``) ---------------------------------

RECORDED_BESIDE = Path(__file__).resolve().parents[2] / "shared" / "recorded"
RECORDED = Path(os.environ.get("STREAMRECOVER_RECORDED_DIR") or RECORDED_BESIDE)
MISSING_RECORDED = "recorded real-API streams not found"


def recorded_path(name: str) -> Path:
    """A stream recorded from a real API. Without the folder the test is skipped, saying where
    it looked; a folder that is there but lacks this stream fails the test."""
    path = RECORDED / name
    if not RECORDED.is_dir():
        pytest.skip(f"{MISSING_RECORDED}: {RECORDED} does not exist (set STREAMRECOVER_RECORDED_DIR)")
    if not path.is_file():
        pytest.fail(f"recorded stream {path} is missing from {RECORDED}", pytrace=False)
    return path


def load_recorded(name: str) -> bytes:
    return recorded_path(name).read_bytes()
