"""The recorded provider streams the tests read, from a folder beside the repository.

The streams are test data kept outside the repository (``../shared/streams``, or the folder
named by ``STREAMRECOVER_STREAMS_DIR``). In a clone with nothing beside it the tests that
need them are skipped, each saying where it looked, and the run's summary counts them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamrecover.engine.sse import SSEDecoder, SSEEvent


@dataclass(frozen=True)
class DataFolder:
    """A folder of test data kept beside the repository, or where ``env`` says."""

    what: str
    name: str
    env: str

    @property
    def path(self) -> Path:
        return Path(os.environ.get(self.env) or Path(__file__).resolve().parents[2] / "shared" / self.name)

    def file(self, name: str) -> Path:
        """The file's path. Without the folder the test is skipped, saying where it looked; a
        folder that is there but lacks the file fails the test (a renamed or lost fixture)."""
        folder = self.path
        if not folder.is_dir():
            pytest.skip(f"{MISSING}: {self.what}: {folder} does not exist (set {self.env})")
        path = folder / name
        if not path.is_file():
            pytest.fail(f"{self.what}: {path} is missing from {folder}", pytrace=False)
        return path


MISSING = "test data beside the repository not found"
REFERENCE = DataFolder("reference provider streams", "streams", "STREAMRECOVER_STREAMS_DIR")
RECORDINGS = DataFolder("streams recorded from the real APIs", "recorded", "STREAMRECOVER_RECORDED_DIR")
STREAMS = REFERENCE.path


def stream_path(name: str) -> Path:
    return REFERENCE.file(name)


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


def load_recorded(name: str) -> bytes:
    return RECORDINGS.file(name).read_bytes()
