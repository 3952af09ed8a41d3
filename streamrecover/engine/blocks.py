"""Content blocks, the accumulator that builds them from stream events, and its snapshot.

The snapshot is what recovery decides on: for every block it says whether the block is
complete (safe to put in history), partial (text that may be kept and continued, or
something that must be dropped) or broken (closed, but unusable).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any

from .events import (
    BlockStart,
    BlockStop,
    CitationDelta,
    FieldDelta,
    MessageStart,
    ProviderErrorEvent,
    SignatureDelta,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolArgsDelta,
    Usage,
    UsageUpdate,
)
from .utf8text import Utf8Attr, Utf8Slots, Utf8Text

TEXT = "text"
TOOL_USE = "tool_use"
THINKING = "thinking"
REDACTED_THINKING = "redacted_thinking"
REASONING = "reasoning"  # an OpenAI Responses reasoning item, kept whole (opaque)
COMPACT_AT = Utf8Text.COMPACT_AT


class BlockStatus(enum.StrEnum):
    COMPLETE = "complete"
    PARTIAL = "partial"
    BROKEN = "broken"


@dataclass(slots=True)
class Block(Utf8Slots):
    """One content block as it is being received.

    ``text`` and ``arguments`` read and assign like plain ``str`` fields; they are kept as
    UTF-8 (``Utf8Attr``, installed below the class), because a ``str`` grown delta by delta
    is copied whole on every append and holds up to 4 bytes per character. The
    accumulator appends to their ``Utf8Text`` directly.
    """

    index: int
    kind: str
    text: str = ""  # text, or thinking text
    id: str | None = None
    name: str | None = None
    arguments: str = ""  # raw tool-call arguments JSON as received
    signature: str = ""
    data: dict[str, Any] | None = None  # redacted_thinking / opaque blocks, whole
    closed: bool = False
    citations: list[dict[str, Any]] | None = None  # a text block's citations, as sent
    field: str = ""  # an opaque block's string field that ``text`` fills (FieldDelta)
    # a text block that is the model's refusal (``BlockStart.refusal``): stored as plain text,
    # the run's stop reason says it was one; live clients are told on each of its deltas
    refusal: bool = False

    def status(self) -> BlockStatus:
        if self.kind == TEXT:
            return BlockStatus.COMPLETE if self.closed else BlockStatus.PARTIAL
        if self.kind == TOOL_USE:
            if not self.closed:
                return BlockStatus.PARTIAL
            return BlockStatus.COMPLETE if self.parsed_input() is not None else BlockStatus.BROKEN
        if self.kind == THINKING:
            if not self.closed:
                return BlockStatus.PARTIAL
            return BlockStatus.COMPLETE if self.signature else BlockStatus.BROKEN
        return BlockStatus.COMPLETE if self.closed else BlockStatus.PARTIAL

    def parsed_input(self) -> dict[str, Any] | None:
        """The tool call's arguments as an object, or None when they do not parse."""
        raw = self.arguments.strip()
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def to_content(self) -> dict[str, Any]:
        """The block in the canonical content shape used for history and output."""
        if self.kind == TEXT:
            if self.citations:
                return {"type": "text", "text": self.text, "citations": [dict(c) for c in self.citations]}
            return {"type": "text", "text": self.text}
        if self.kind == TOOL_USE:
            call = {"type": "tool_use", "id": self.id, "name": self.name, "input": self.parsed_input() or {}}
            if self.signature:  # Gemini's thought signature on a function call: sent back with it
                call["signature"] = self.signature
            return call
        if self.kind == THINKING:
            return {"type": "thinking", "thinking": self.text, "signature": self.signature}
        if self.kind == REDACTED_THINKING:
            return {"type": "redacted_thinking", "data": (self.data or {}).get("data", "")}
        content = dict(self.data or {"type": self.kind})
        if self.arguments:  # server tool calls stream their input like tool_use does
            content["input"] = self.parsed_input() or {}
        if self.field:  # a field streamed in pieces (a compaction block's content)
            content[self.field] = self.text
        return content

    def to_checkpoint(self) -> dict[str, Any]:
        """``to_content`` as a checkpoint keeps it: a refusal's text block also says
        ``"refusal": true`` (canonical content, stored and sent back, has no such field)."""
        content = self.to_content()
        if self.kind == TEXT and self.refusal:
            content["refusal"] = True
        return content

    def copy(self) -> Block:
        return replace(
            self,
            data=dict(self.data) if self.data is not None else None,
            citations=list(self.citations) if self.citations is not None else None,
        )

    @classmethod
    def from_content(cls, index: int, content: dict[str, Any]) -> Block:
        """A closed block from canonical content (a checkpoint or a stored message)."""
        kind = content.get("type", "")
        if kind == TEXT:
            cited = content.get("citations")
            citations = [dict(c) for c in cited] if isinstance(cited, list) and cited else None
            return cls(index, TEXT, text=content.get("text", ""), citations=citations, closed=True)
        if kind == TOOL_USE:
            return cls(
                index,
                TOOL_USE,
                id=content.get("id"),
                name=content.get("name"),
                arguments=json.dumps(content.get("input") or {}),
                signature=content.get("signature", ""),
                closed=True,
            )
        if kind == THINKING:
            return cls(
                index, THINKING, text=content.get("thinking", ""), signature=content.get("signature", ""), closed=True
            )
        if kind == REDACTED_THINKING:
            return cls(index, REDACTED_THINKING, data={"data": content.get("data", "")}, closed=True)
        return cls(index, kind, data=dict(content), closed=True)

    @classmethod
    def from_checkpoint(cls, index: int, content: dict[str, Any]) -> Block:
        """A closed block from a checkpoint's ``to_checkpoint`` content; without ``refusal``
        (a checkpoint from before it was kept) the block is not a refusal."""
        block = cls.from_content(index, content)
        block.refusal = block.kind == TEXT and content.get("refusal") is True
        return block


# After the dataclass is built, so its __init__, __eq__, __repr__, replace() and asdict()
# all go through these (the unused slots named "text" and "arguments" stay empty).
Block.text = Utf8Attr("_text")  # type: ignore[assignment,misc]
Block.arguments = Utf8Attr("_arguments")  # type: ignore[assignment,misc]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A copy of the accumulator's blocks at one instant, in block order."""

    blocks: tuple[Block, ...]
    stop_reason: str | None = None
    stop_sequence: str | None = None
    usage: Usage = field(default_factory=Usage)
    ended: bool = False

    def statuses(self) -> list[tuple[Block, BlockStatus]]:
        return [(b, b.status()) for b in self.blocks]

    def has_text(self) -> bool:
        return any(b.kind == TEXT and b.text for b in self.blocks)

    def complete_tool_calls(self) -> list[Block]:
        return [b for b in self.blocks if b.kind == TOOL_USE and b.status() is BlockStatus.COMPLETE]

    def incomplete_tool_calls(self) -> list[Block]:
        return [b for b in self.blocks if b.kind == TOOL_USE and b.status() is not BlockStatus.COMPLETE]


class Accumulator:
    """Builds blocks, usage and the stop reason from one response's normalized events."""

    def __init__(self) -> None:
        self._blocks: dict[int, Block] = {}
        self.usage = Usage()
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None  # the one that ended the answer, where the provider says
        self.message_id: str | None = None
        self.ended = False
        self.error: ProviderErrorEvent | None = None

    def apply(self, event: StreamEvent) -> Block | None:
        """Apply one event; returns the block it touched, if any."""
        # Deltas are nearly every event: handled first by exact type, without the match.
        kind = type(event)
        # (``type(...) is`` does not narrow the union for mypy, hence the ignores)
        # (the Utf8Text's pending list is appended to inline: a method call per delta showed in
        # the parse bench)
        if kind is TextDelta:
            block = self._blocks.get(event.index) or self._block(event.index, TEXT)  # type: ignore[union-attr]
            parts = block._text.parts
            parts.append(event.text)  # type: ignore[union-attr]
            if len(parts) >= COMPACT_AT:
                block._text.compact()
            return block
        if kind is ToolArgsDelta:
            block = self._blocks.get(event.index) or self._block(event.index, TOOL_USE)  # type: ignore[union-attr]
            parts = block._arguments.parts
            parts.append(event.partial_json)  # type: ignore[union-attr]
            if len(parts) >= COMPACT_AT:
                block._arguments.compact()
            return block
        if kind is ThinkingDelta:
            block = self._blocks.get(event.index) or self._block(event.index, THINKING)  # type: ignore[union-attr]
            parts = block._text.parts
            parts.append(event.thinking)  # type: ignore[union-attr]
            if len(parts) >= COMPACT_AT:
                block._text.compact()
            return block
        match event:
            case TextDelta(index=i, text=t):  # subclasses of the delta types
                block = self._block(i, TEXT)
                block._text.append(t)
                return block
            case ToolArgsDelta(index=i, partial_json=p):
                block = self._block(i, TOOL_USE)
                block._arguments.append(p)
                return block
            case ThinkingDelta(index=i, thinking=t):
                block = self._block(i, THINKING)
                block._text.append(t)
                return block
            case SignatureDelta(index=i, signature=s):
                block = self._block(i, THINKING)
                block.signature = s
                return block
            case CitationDelta(index=i, citation=c):
                block = self._block(i, TEXT)
                if block.citations is None:
                    block.citations = []
                block.citations.append(c)
                return block
            case FieldDelta(index=i, field=name, text=t):
                block = self._block(i, name)
                block.field = name
                block._text.append(t)
                return block
            case BlockStart(index=i, kind=k, id=ident, name=name, data=data, refusal=refusal):
                block = Block(i, k, id=ident, name=name, data=dict(data) if data else None, refusal=refusal)
                self._blocks[i] = block
                return block
            case BlockStop(index=i):
                stopped = self._blocks.get(i)
                if stopped is not None:
                    stopped.closed = True
                return stopped
            case MessageStart(message_id=mid, usage=usage):
                self.message_id = mid
                self.usage = self.usage.merged(usage)
            case UsageUpdate(usage=usage):
                self.usage = self.usage.merged(usage)
            case StopReason(reason=reason, sequence=sequence):
                self.stop_reason = reason
                self.stop_sequence = sequence
            case StreamEnd():
                self.ended = True
            case ProviderErrorEvent():
                self.error = event
        return None

    def _block(self, index: int, kind: str) -> Block:
        block = self._blocks.get(index)
        if block is None:  # a delta without its start: providers that skip starts
            block = Block(index, kind)
            self._blocks[index] = block
        return block

    def restore(self, blocks: list[Block]) -> None:
        """Seed with closed blocks (a continuation's prefix or a checkpoint), keeping indices."""
        for block in blocks:
            copy = block.copy()
            copy.closed = True
            self._blocks[copy.index] = copy

    def remove(self, index: int) -> None:
        """Forget a block (one that may not reach history); the other blocks keep their indices."""
        self._blocks.pop(index, None)

    def reopen(self, index: int) -> None:
        """A continuation carries on inside this (text) block: it is open again."""
        self._blocks[index].closed = False

    def block_at(self, index: int) -> Block | None:
        return self._blocks.get(index)

    @property
    def blocks(self) -> list[Block]:
        return [self._blocks[i] for i in sorted(self._blocks)]

    def snapshot(self) -> Snapshot:
        return Snapshot(
            blocks=tuple(b.copy() for b in self.blocks),
            stop_reason=self.stop_reason,
            stop_sequence=self.stop_sequence,
            usage=self.usage,
            ended=self.ended,
        )
