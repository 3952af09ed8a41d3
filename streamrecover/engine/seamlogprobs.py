"""The token logprobs of a continuation's text at the seam: only those of text the client is shown.

The joiner (``engine.join``) may hold a continuation's first text back and then drop its start (a
repeat of the kept text's end, a prefill's whitespace, a restart's repeat of all of it); what it
releases is always the end of what it was fed. An entry goes on only where its token is exactly
the text shown at that place: a delta released whole keeps its entries; a delta the seam cut into
keeps the entries of the tokens after the cut, when its tokens spell its text (else none); a
delta dropped whole loses them. An entry is never made up, nor moved onto other text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import TokenLogprob


@dataclass(frozen=True, slots=True)
class _Fed:
    start: int  # where the delta starts in the continuation's own text (characters)
    text: str
    logprobs: tuple[TokenLogprob, ...]


@dataclass(slots=True)
class SeamLogprobs:
    """One response's continued block: the deltas fed to the joiner whose fate is not known yet."""

    fed_chars: int = 0  # characters of the response's own text fed to the joiner so far
    waiting: list[_Fed] = field(default_factory=list)

    def fed(self, text: str, logprobs: tuple[TokenLogprob, ...]) -> None:
        self.waiting.append(_Fed(self.fed_chars, text, logprobs))
        self.fed_chars += len(text)

    def released(self, text: str, *, decided: bool) -> tuple[TokenLogprob, ...]:
        """The entries of ``text``, which the joiner just released (the end of what it was fed).
        Once the joiner has decided, every delta fed is released or dropped: none waits on."""
        cut = self.fed_chars - len(text)  # the released text starts here in the response's own
        out: list[TokenLogprob] = []
        if text:
            for delta in self.waiting:
                out.extend(_after(delta, cut))
        if text or decided:
            self.waiting.clear()
        return tuple(out)


def _after(delta: _Fed, cut: int) -> list[TokenLogprob]:
    """The delta's entries whose tokens lie wholly at or after ``cut``."""
    if delta.start >= cut:
        return list(delta.logprobs)
    if delta.start + len(delta.text) <= cut or "".join(e["token"] for e in delta.logprobs) != delta.text:
        return []  # dropped whole, or tokens that do not spell the text (bytes of a split character)
    kept: list[TokenLogprob] = []
    at = delta.start
    for entry in delta.logprobs:
        if at >= cut:
            kept.append(entry)
        at += len(entry["token"])
    return kept
