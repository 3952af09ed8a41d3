"""The recorded provider streams in ``shared/streams`` beside the repository, as the tests read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrecover.engine.sse import SSEDecoder, SSEEvent

STREAMS = Path(__file__).resolve().parents[2] / "shared" / "streams"


def stream_path(name: str) -> Path:
    """The fixture's path; a missing one fails the test and says where it was looked for."""
    path = STREAMS / name
    if not path.is_file():
        pytest.fail(
            f"reference stream {path} is missing: the tests expect a copy of shared/ beside the repository",
            pytrace=False,
        )
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
