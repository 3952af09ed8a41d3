"""Joining a continuation's first text onto the prefix it continues, exactly.

The client already shows the prefix (trailing whitespace included), so whatever the
continuation repeats must be dropped before it is shown or stored:
- ``prefill``: the prefix was sent without its trailing whitespace (the API refuses it);
  a continuation that starts with that whitespace has it dropped once.
- ``prefix echo`` (Mistral): the response repeats the whole prefix; it is dropped.
- ``continue_message``: a model told to continue does not always continue. It may
  - repeat the end of what it wrote: an overlap of at least ``min_overlap`` characters
    with the prefix's end is dropped, and so is a repeat of two or more whole words (a
    single repeated word is kept: "had had" is English);
  - start the answer over: when it repeats the whole kept text, the repeat is dropped
    (``restart_trimmed``); when it starts the same way (``restart_min`` characters or
    more) and then says something else, its new text replaces the kept text
    (``restart_replaced``: the translator resets the client to the new text);
  - rephrase the last sentence: nothing can be trimmed safely; the seam is kept as the
    model wrote it and reported as ``rephrased`` (a heuristic: its first words are mostly
    words of the prefix's last sentence).
The joiner holds back only as many characters as it needs to decide, then passes
everything through unchanged. ``result`` says what it did.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

_WORD = re.compile(r"\w{3,}")


class JoinKind(enum.StrEnum):
    CLEAN = "clean"  # nothing repeated
    ECHO_DROPPED = "echo_dropped"  # the expected repeat (prefill whitespace, prefix echo) dropped
    OVERLAP_TRIMMED = "overlap_trimmed"  # the model repeated the end of the kept text; dropped
    RESTART_TRIMMED = "restart_trimmed"  # it started over and repeated all the kept text; dropped
    RESTART_REPLACED = "restart_replaced"  # it started over, then wrote something else: kept text replaced
    REPHRASED = "rephrased"  # it seems to restate its last sentence: kept as written


@dataclass(slots=True)
class JoinResult:
    kind: JoinKind = JoinKind.CLEAN
    chars: int = 0  # characters dropped (trimmed), or of kept text replaced


class ContinuationJoiner:
    def __init__(
        self,
        expect: str = "",
        *,
        overlap_with: str = "",
        min_overlap: int = 16,
        window: int = 256,
        restart_min: int = 24,
        restarts_only: bool = False,
    ) -> None:
        # expect: text the continuation is expected to start with and that must be dropped
        # overlap_with: the kept text the continuation may repeat or restart (continue_message)
        self._expect = expect
        self._prefix = overlap_with
        # a restart is compared without leading whitespace on either side: a kept block that
        # starts with "\n\n" (Claude's text after thinking) is restarted by "The..." as well
        self._kept = overlap_with.lstrip()
        self._tail = overlap_with[-window:] if overlap_with else ""
        self._min_overlap = min_overlap
        self._restart_min = restart_min
        self._buffer = ""
        # restarts_only (a prefill): only a start-over is looked for, never an overlap or a rephrase
        self._restarts_only = restarts_only
        self._candidates = [] if restarts_only else self._overlap_candidates(len(overlap_with) <= window)
        self._decided = not expect and not overlap_with
        self.result = JoinResult()
        # set when the continuation replaces the kept text: the block's whole new text
        self.replacement: str | None = None
        self._seen = ""  # the first released characters, for the rephrase label
        self._recent: set[str] | None = None  # words of the prefix's last sentence

    @property
    def decided(self) -> bool:
        return self._decided

    def feed(self, text: str) -> str:
        """The part of ``text`` that may be shown now (see ``replacement``)."""
        if self._decided:
            self._observe(text)
            return text
        self._buffer += text
        if self._expect:
            if self._expect.startswith(self._buffer):
                return ""  # still matching, need more
            if self._buffer.startswith(self._expect):
                self.result = JoinResult(JoinKind.ECHO_DROPPED, len(self._expect))
                return self._release(self._buffer[len(self._expect) :])
            return self._release(self._buffer[self._partial_whitespace() :])
        if self._could_restart() or self._could_overlap():
            return ""
        return self._decide()

    def flush(self) -> str:
        """End of the continuation's text: release what is held back."""
        if self._decided:
            return ""
        if self._expect:
            # still undecided: the continuation was only (part of) the expected whitespace
            if self._buffer:
                self.result = JoinResult(JoinKind.ECHO_DROPPED, len(self._buffer))
            return self._release("")
        return self._decide()

    def _partial_whitespace(self) -> int:
        """How much of a continuation that wrote only part of the expected whitespace, then went
        on, is dropped: that part, when the expectation is a prefill's held-back whitespace (it
        is shown already; "  " held and " And" written is "  And", never "   And"); nothing of
        a partial echo of the prefix's words."""
        if not self._expect.isspace():
            return 0
        dropped = _common_prefix(self._buffer, self._expect)
        if dropped:
            self.result = JoinResult(JoinKind.ECHO_DROPPED, dropped)
        return dropped

    def take_replacement(self) -> str | None:
        replacement, self.replacement = self.replacement, None
        return replacement

    # ---- deciding -------------------------------------------------------------------

    def _decide(self) -> str:
        buffer, prefix, kept = self._buffer, self._prefix, self._kept
        body, matched = self._restart_body()
        if body is not None and matched >= len(kept):
            self.result = JoinResult(JoinKind.RESTART_TRIMMED, len(buffer) - len(body) + len(kept))
            rest = body[len(kept) :]
            return self._release(rest.lstrip() if prefix != prefix.rstrip() else rest)
        if body is not None and matched == len(body):
            # only reached at the end: a restart that stopped partway (e.g. at max_tokens) adds
            # nothing, and the longer kept text the user saw (and paid for) stays
            self.result = JoinResult(JoinKind.RESTART_TRIMMED, len(buffer))
            return self._release("")
        if body is not None:
            self.result = JoinResult(JoinKind.RESTART_REPLACED, len(prefix))
            # the kept text's leading whitespace is part of the block the client shows
            self.replacement = prefix[: len(prefix) - len(kept)] + body
            self._release(body)
            return ""
        best = self._best_overlap()
        if best is not None:
            rest, dropped = best
            self.result = JoinResult(JoinKind.OVERLAP_TRIMMED, dropped)
            return self._release(rest)
        return self._release(buffer)

    def _release(self, text: str) -> str:
        self._decided = True
        self._buffer = ""
        self._observe(text)
        return text

    def _observe(self, text: str) -> None:
        if self._prefix and not self._restarts_only and len(self._seen) < 200:
            self._seen += text
            if self.result.kind is JoinKind.CLEAN and self._looks_rephrased():
                self.result = JoinResult(JoinKind.REPHRASED)
            elif self.result.kind is JoinKind.REPHRASED and not self._looks_rephrased():
                self.result = JoinResult(JoinKind.CLEAN)

    # ---- restarts -------------------------------------------------------------------

    def _restart_body(self) -> tuple[str | None, int]:
        """The continuation as a restart (leading whitespace dropped) and how much of the
        kept text it repeats from the start; (None, 0) when it is no restart."""
        kept = self._kept
        body = self._buffer.lstrip()
        matched = _common_prefix(body, kept)
        if matched == len(kept) and kept:
            if len(kept) >= self._restart_min or _words(kept) >= 2:
                return body, matched
            # a one-word answer is restarted only by the very same characters, no space first
            return (body, matched) if self._buffer.startswith(self._prefix) else (None, 0)
        if matched >= self._restart_min:
            return body, matched
        return None, 0

    def _could_restart(self) -> bool:
        body, kept = self._buffer.lstrip(), self._kept
        return bool(kept) and len(body) < len(kept) and kept.startswith(body)

    # ---- overlaps -------------------------------------------------------------------

    def _overlap_candidates(self, whole: bool) -> list[tuple[str, bool]]:
        """Tails of the kept text a repeat may equal: (text, word_level). Character
        overlaps are ``min_overlap`` long or more; word-level ones start at a word and hold
        two or more words (compared after the continuation's leading whitespace)."""
        tail = self._tail
        found: list[tuple[str, bool]] = [(tail[s:], False) for s in range(len(tail) - self._min_overlap + 1)]
        stripped = tail.rstrip()
        for s in range(len(stripped)):
            at_word = not stripped[s].isspace() and (stripped[s - 1].isspace() if s else whole)
            if at_word and _words(stripped[s:]) >= 2:
                found.append((stripped[s:], True))
        return found

    def _could_overlap(self) -> bool:
        buffer, body = self._buffer, self._buffer.lstrip()
        for text, word_level in self._candidates:
            probe = body if word_level else buffer
            if len(probe) < len(text) and text.startswith(probe):
                return True
        return False

    def _best_overlap(self) -> tuple[str, int] | None:
        buffer, body = self._buffer, self._buffer.lstrip()
        trailing = self._tail != self._tail.rstrip()
        best: tuple[str, int] | None = None
        for text, word_level in self._candidates:
            probe = body if word_level else buffer
            if not probe.startswith(text):
                continue
            rest = probe[len(text) :]
            if word_level and trailing:
                rest = rest.lstrip()
            dropped = len(buffer) - len(rest)
            if best is None or dropped > best[1]:
                best = (rest, dropped)
        return best

    # ---- rephrasing -----------------------------------------------------------------

    def _looks_rephrased(self) -> bool:
        seen = _WORD.findall(self._seen.casefold())[:8]
        if len(seen) < 4:
            return False
        if self._recent is None:
            self._recent = set(_WORD.findall(_last_sentence(self._prefix).casefold()))
        recent = self._recent
        shared = [word for word in seen if any(word.startswith(r) for r in recent)]
        return len(set(shared)) >= 3 and len(shared) * 2 >= len(seen)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _words(text: str) -> int:
    return len(text.split())


def _last_sentence(text: str) -> str:
    """The prefix's unfinished (or last) sentence, with a few words before it."""
    stripped = text.rstrip()
    cut = max(stripped.rfind(mark, 0, max(0, len(stripped) - 1)) for mark in (". ", "! ", "? ", "\n"))
    start = max(0, cut + 1) if cut >= 0 else 0
    return stripped[max(0, start - 40) :][-200:]
