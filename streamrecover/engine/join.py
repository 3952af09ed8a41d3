"""Joining a continuation's first text onto the prefix it continues, exactly.

The client already shows the prefix (trailing whitespace included), so whatever the
continuation repeats must be dropped before it is shown or stored:
- ``prefill``: the prefix was sent without its trailing whitespace (the API refuses it);
  a continuation that starts with that whitespace has it dropped once.
- ``prefix echo`` (Mistral): the response repeats the whole prefix; it is dropped.
- ``continue_message``: a model told to continue may repeat the end of what it wrote;
  an overlap of at least ``min_overlap`` characters with the prefix's end is dropped.
The joiner holds back only as many characters as it needs to decide, then passes
everything through unchanged.
"""

from __future__ import annotations


class ContinuationJoiner:
    def __init__(self, expect: str = "", *, overlap_with: str = "", min_overlap: int = 16, window: int = 256) -> None:
        # expect: text the continuation is expected to start with and that must be dropped
        # overlap_with: prefix whose tail the continuation may repeat (continue_message)
        self._expect = expect
        self._tail = overlap_with[-window:] if overlap_with else ""
        self._min_overlap = min_overlap
        self._buffer = ""
        self._decided = not expect and len(self._tail) < min_overlap

    @property
    def decided(self) -> bool:
        return self._decided

    def feed(self, text: str) -> str:
        """The part of ``text`` that may be shown now."""
        if self._decided:
            return text
        self._buffer += text
        if self._expect:
            if self._expect.startswith(self._buffer):
                return ""  # still matching, need more
            if self._buffer.startswith(self._expect):
                return self._release(self._buffer[len(self._expect) :])
            return self._release(self._buffer)
        # overlap detection: wait until we have enough characters to compare
        if len(self._buffer) < len(self._tail) and self._tail_could_match():
            return ""
        return self._release(self._drop_overlap(self._buffer))

    def flush(self) -> str:
        """End of the continuation's text: release what is held back."""
        if self._decided:
            return ""
        if self._expect:
            # still undecided: the continuation was only (part of) the expected whitespace
            return self._release("")
        return self._release(self._drop_overlap(self._buffer))

    def _release(self, text: str) -> str:
        self._decided = True
        self._buffer = ""
        return text

    def _tail_could_match(self) -> bool:
        buf = self._buffer
        return any(self._tail[start:].startswith(buf) for start in range(len(self._tail) - self._min_overlap + 1))

    def _drop_overlap(self, text: str) -> str:
        tail = self._tail
        for size in range(min(len(tail), len(text)), self._min_overlap - 1, -1):
            if tail.endswith(text[:size]):
                return text[size:]
        return text
