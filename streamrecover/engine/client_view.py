"""The reference client: what a browser reconstructs from the frames it received.

The JavaScript client implements the same rules; tests use this one to check the
invariant that the client's reconstruction equals the committed message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class _ClientBlock:
    kind: str
    text: str = ""
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    content: dict[str, Any] | None = None

    def to_content(self) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text", "text": self.text}
        if self.kind == "tool_use":
            try:
                parsed = json.loads(self.arguments) if self.arguments.strip() else {}
            except ValueError:
                parsed = {"__unparsed__": self.arguments}
            return {"type": "tool_use", "id": self.id, "name": self.name, "input": parsed}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": self.text}
        return dict(self.content or {"type": self.kind})


@dataclass(slots=True)
class ClientView:
    """Applies frames in order. ``turns`` pairs each reconstructed assistant message with the
    committed one, for the invariant check."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    partial: dict[int, _ClientBlock] = field(default_factory=dict)
    status: str | None = None
    last_seq: int = 0
    gaps: int = 0
    turns: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = field(default_factory=list)

    def apply(self, frame: dict[str, Any]) -> None:
        seq = frame.get("seq", 0)
        first = frame.get("first_seq", seq)  # a coalesced frame covers first_seq..seq
        if first != self.last_seq + 1 and frame.get("type") != "snapshot":
            self.gaps += 1
        self.last_seq = seq
        kind = frame["type"]
        block = frame.get("block")
        if kind == "text_delta":
            self.partial.setdefault(block, _ClientBlock("text")).text += frame["text"]
        elif kind == "thinking_delta":
            self.partial.setdefault(block, _ClientBlock("thinking")).text += frame["thinking"]
        elif kind == "tool_call_delta":
            b = self.partial.setdefault(block, _ClientBlock("tool_use", id=frame.get("id"), name=frame.get("name")))
            b.arguments += frame.get("arguments_delta", "")
        elif kind == "block":
            self.partial[block] = _ClientBlock(frame["content"].get("type", "block"), content=frame["content"])
        elif kind in ("tool_call_cancel", "block_cancel"):
            self.partial.pop(block, None)
        elif kind == "stream_reset":
            self.partial.clear()
        elif kind == "message_committed":
            message = frame["message"]
            if message.get("role") == "assistant":
                self.turns.append((self.reconstructed(), [comparable(b) for b in message["content"]]))
            self.messages.append(message)
            self.partial.clear()
        elif kind == "snapshot":
            self.messages = list(frame.get("messages", []))
            self.partial = {}
            for item in frame.get("partial", []):
                content = item["content"]
                self.partial[item["block"]] = _from_content(content)
            self.status = frame.get("status")
        elif kind == "run_status":
            self.status = frame["status"]

    def apply_all(self, frames: Iterable[dict[str, Any]]) -> ClientView:
        """Apply ``frames`` in order (a snapshot first, if any); returns the view."""
        for frame in frames:
            self.apply(frame)
        return self

    def reconstructed(self) -> list[dict[str, Any]]:
        return [comparable(self.partial[i].to_content()) for i in sorted(self.partial)]

    def text(self) -> str:
        """All assistant text the client shows: committed messages, then the partial one."""
        parts = [
            b.get("text", "")
            for m in self.messages
            if m.get("role") == "assistant"
            for b in m.get("content", [])
            if b.get("type") == "text"
        ]
        parts += [b.text for _, b in sorted(self.partial.items()) if b.kind == "text"]
        return "".join(parts)


def _from_content(content: dict[str, Any]) -> _ClientBlock:
    kind = content.get("type", "")
    if kind == "text":
        return _ClientBlock("text", text=content.get("text", ""))
    if kind == "thinking":
        return _ClientBlock("thinking", text=content.get("thinking", ""))
    if kind == "tool_use":
        # a half-received call carries its raw arguments, so later deltas can be appended
        raw = content.get("partial_json")
        arguments = raw if isinstance(raw, str) else json.dumps(content.get("input"))
        return _ClientBlock("tool_use", id=content.get("id"), name=content.get("name"), arguments=arguments)
    return _ClientBlock(kind, content=content)


def comparable(block: dict[str, Any]) -> dict[str, Any]:
    """A block without what the client is never sent (thinking signatures)."""
    if block.get("type") == "thinking":
        return {"type": "thinking", "thinking": block.get("thinking", "")}
    return block
