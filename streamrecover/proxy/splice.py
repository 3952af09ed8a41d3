"""From the engine's client frames to the blocks a proxied client may be shown: text at once,
every other block only once it is complete, never anything that a recovery later takes back.

The engine numbers a turn's blocks across its attempts (a continuation's text goes on in the kept
block) and tells live clients when it drops one (``tool_call_cancel``, ``block_cancel``,
``stream_reset``). A provider's wire format cannot take anything back, so ``Splicer`` holds a tool
call until a later block of another kind shows it ended (parallel calls until the commit), and
thinking and other blocks until the turn's message is committed (their signatures and final content
arrive only with it); blocks after a held one wait behind it, so the client sees them in order. A
block that arrives whole and is kept once text follows it (a Responses ``web_search_call``: a break
before any text starts the turn over, and the search with it) goes out once a later text block has
text. A text block's citations go out once the block has text (text is always kept; a cited block
cut before its text is dropped), after the text. Where the client's format shows reasoning for reading only
(OpenAI's ``reasoning_content``, a Responses reasoning summary: ``release_unsigned``), thinking goes
out whole once a later block started, signed or not, and its later drop (DeepSeek's reasoning is
unsigned: no provider takes it back) takes nothing back from the client. What it releases is
numbered contiguously. A drop of something already released is ``Unsplicable``: the stream cannot go
on truthfully and ends with the provider's error event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..engine.citespan import makes_cited_span
from ..engine.events import TokenLogprob
from ..engine.protocol import FrameKind
from ..engine.utf8text import Utf8Attr, Utf8Slots
from ..providers.openai_responses import WEB_SEARCH_CALL

TEXT = "text"
TOOL_USE = "tool_use"
THINKING = "thinking"
# blocks that arrive whole and are kept by a recovery once text follows them
WHOLE_BEFORE_TEXT = frozenset({WEB_SEARCH_CALL})


class Unsplicable(Exception):
    """Something the client already received was dropped by the recovery."""


@dataclass(frozen=True, slots=True)
class OpenText:
    index: int  # downstream block index
    cited: bool = False  # a cited span (Anthropic's): its citations follow its text
    refusal: bool = False  # the model's refusal: a format with a place for one writes its text there


@dataclass(frozen=True, slots=True)
class TextPiece:
    """Text of the open block, with the logprobs of its tokens that the engine passed on."""

    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class CloseBlock:
    index: int


@dataclass(frozen=True, slots=True)
class WholeBlock:
    """A complete non-text block, opened and closed at once (canonical content)."""

    index: int
    content: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Citation:
    """One citation of the open text block, sent after text of it."""

    index: int
    citation: dict[str, Any]


Op = OpenText | TextPiece | Citation | CloseBlock | WholeBlock

UNSIGNED = "unsigned_thinking"  # the engine's reason for dropping complete reasoning no provider takes back


@dataclass(slots=True)
class _Held(Utf8Slots):
    kind: str
    text: str = ""  # thinking's (a text block's goes out as it arrives: only ``unsent`` is kept)
    unsent: list[str] = field(default_factory=list)  # a text block's deltas not yet released
    unsent_logprobs: list[TokenLogprob] = field(default_factory=list)  # their tokens' logprobs
    has_text: bool = False  # a text block received some text
    refusal: bool = False  # a text block that is the model's refusal (its deltas say so)
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    content: dict[str, Any] | None = None
    released: bool = False
    down: int | None = None  # the downstream block carrying its text
    citations: list[dict[str, Any]] = field(default_factory=list)
    cited_sent: int = 0  # citations released
    unsigned: bool = False  # complete reasoning the engine did not commit (nothing to sign it)

    def whole(self) -> dict[str, Any]:
        if self.content is not None:
            return self.content
        if self.kind == TOOL_USE:
            try:
                arguments = json.loads(self.arguments) if self.arguments.strip() else {}
            except ValueError:
                arguments = {}
            return {"type": TOOL_USE, "id": self.id, "name": self.name, "input": arguments}
        if self.kind == THINKING:
            return {"type": THINKING, "thinking": self.text, "signature": ""}
        return {"type": self.kind}


# After the dataclass is built, as for the engine's blocks.
_Held.text = Utf8Attr("_text")  # type: ignore[assignment,misc]
_Held.arguments = Utf8Attr("_arguments")  # type: ignore[assignment,misc]


@dataclass(slots=True)
class Splicer:
    blocks: dict[int, _Held] = field(default_factory=dict)  # by the engine's block index
    next_index: int = 0
    open_index: int | None = None
    released_any: bool = False
    release_unsigned: bool = False  # the client's format can show unsigned reasoning (OpenAI's)

    def apply(self, frame: Mapping[str, Any]) -> list[Op]:
        """The ops one frame releases; raises ``Unsplicable``."""
        kind = frame.get("type")
        index: int = frame.get("block", -1)
        # Deltas are appended, never ``+=`` on a held str: that copies all of it on every delta.
        if kind == FrameKind.TEXT_DELTA:
            held = self._at(index, TEXT)
            piece = frame.get("text", "")
            if piece:
                held.unsent.append(piece)
                held.unsent_logprobs.extend(frame.get("logprobs") or ())
                held.has_text = True
                held.refusal = held.refusal or frame.get("refusal") is True
        elif kind == FrameKind.THINKING_DELTA:
            self._at(index, THINKING)._text.append(frame.get("thinking", ""))
        elif kind == FrameKind.TOOL_CALL_DELTA:
            held = self._at(index, TOOL_USE)
            held.id, held.name = held.id or frame.get("id"), held.name or frame.get("name")
            held._arguments.append(frame.get("arguments_delta", ""))
        elif kind == FrameKind.BLOCK:
            content = dict(frame.get("content") or {})
            earlier = self.blocks.get(index)
            if earlier is not None and earlier.released:
                raise Unsplicable(f"block {index} changed after it was sent")
            self.blocks[index] = _Held(str(content.get("type", "block")), content=content)
        elif kind == FrameKind.CITATION:
            self._at(index, TEXT).citations.append(dict(frame.get("citation") or {}))
        elif kind == FrameKind.BLOCK_CANCEL and frame.get("reason") == UNSIGNED and self.release_unsigned:
            unsigned = self.blocks.get(index)
            if unsigned is not None and unsigned.kind == THINKING:
                unsigned.unsigned = True
        elif kind in (FrameKind.TOOL_CALL_CANCEL, FrameKind.BLOCK_CANCEL):
            dropped = self.blocks.pop(index, None)
            # reasoning shown to an OpenAI client is for reading only: it never goes back, nothing to take back
            shown_only = dropped is not None and dropped.kind == THINKING and self.release_unsigned
            if dropped is not None and dropped.released and not shown_only:
                raise Unsplicable(f"block {index} was dropped after it was sent ({frame.get('reason')})")
        elif kind == FrameKind.STREAM_RESET:
            if self.released_any:
                raise Unsplicable(f"the answer started over ({frame.get('reason')}) after part of it was sent")
            self.blocks.clear()
        else:
            return []
        return self._pump(final=False)

    def finish(self, committed: list[dict[str, Any]]) -> list[Op]:
        """The turn's message is committed: what is still held goes out, as committed, then the open block closes."""
        live = [
            held
            for held in (self.blocks[i] for i in sorted(self.blocks))
            if not (held.kind == TEXT and not held.has_text) and not held.unsigned
        ]
        if len(live) == len(committed):
            for held, content in zip(live, committed, strict=True):
                if not held.released and held.kind != TEXT and content.get("type") == held.kind:
                    held.content = content
        ops = self._pump(final=True)
        ops.extend(self._close())
        return ops

    def released_tools(self) -> int:
        return sum(1 for h in self.blocks.values() if h.released and h.kind == TOOL_USE)

    # ---- internals --------------------------------------------------------------------

    def _at(self, index: int, kind: str) -> _Held:
        held = self.blocks.get(index)
        if held is None:
            held = self.blocks[index] = _Held(kind)
        return held

    def _close(self) -> list[Op]:
        if self.open_index is None:
            return []
        index, self.open_index = self.open_index, None
        return [CloseBlock(index)]

    def _pump(self, *, final: bool) -> list[Op]:
        ops: list[Op] = []
        order = sorted(self.blocks)
        for position, index in enumerate(order):
            held = self.blocks[index]
            if held.kind == TEXT:
                if held.unsent:
                    if held.down is None or held.down != self.open_index:
                        ops.extend(self._close())
                        held.down = self.open_index = self._next()
                        ops.append(OpenText(held.down, makes_cited_span(held.citations), held.refusal))
                    ops.append(TextPiece(held.down, "".join(held.unsent), tuple(held.unsent_logprobs)))
                    held.unsent.clear()
                    held.unsent_logprobs.clear()
                    held.released = self.released_any = True
                if held.down is not None and held.down == self.open_index and len(held.citations) > held.cited_sent:
                    ops.extend(Citation(held.down, c) for c in held.citations[held.cited_sent :])
                    held.cited_sent = len(held.citations)
                continue
            if held.released:
                continue
            # a tool call is complete once a later block of another kind started (blocks arrive one
            # after another); so is reasoning shown without its signature. A later call is no proof:
            # a Chat stream closes its calls only at its end, so a break in the second drops the first.
            later = position < len(order) - 1
            other_kind_after = any(self.blocks[i].kind != TOOL_USE for i in order[position + 1 :])
            complete = (
                final
                or held.unsigned
                or (held.kind in WHOLE_BEFORE_TEXT and any(self.blocks[i].has_text for i in order[position + 1 :]))
                or (held.kind == TOOL_USE and other_kind_after)
                or (later and held.kind == THINKING and self.release_unsigned)
            )
            if not complete:
                break
            ops.extend(self._close())
            ops.append(WholeBlock(self._next(), held.whole()))
            held.released = self.released_any = True
        return ops

    def _next(self) -> int:
        index = self.next_index
        self.next_index += 1
        return index
