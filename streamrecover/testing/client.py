"""The reference client: what a browser reconstructs from the frames it received.

It applies frames with the protocol's reducer (``engine.protocol.FrameReducer``), the
rules ``static/streamrecover/client.js`` implements too, and adds what tests and the
delivery benchmark check: gaps in ``seq``, and each reconstructed assistant message paired
with the committed one (the invariant that the two are equal).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..engine.protocol import FrameKind, FrameReducer


class ClientView(FrameReducer):
    """Applies frames in order. ``turns`` pairs each reconstructed assistant message with the
    committed one, for the invariant check."""

    def __init__(self, messages: list[dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.messages: list[dict[str, Any]] = list(messages) if messages is not None else []
        self.last_seq = 0
        self.gaps = 0
        self.turns: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    def apply(self, frame: Mapping[str, Any]) -> None:
        seq = frame.get("seq", 0)
        first = frame.get("first_seq", seq)  # a coalesced frame covers first_seq..seq
        if first != self.last_seq + 1 and frame.get("type") != FrameKind.SNAPSHOT:
            self.gaps += 1
        self.last_seq = seq
        super().apply(frame)

    def on_commit(self, position: int | None, message: dict[str, Any]) -> None:
        if position is not None and position < len(self.messages):
            # already here (a snapshot read it from the database before this frame came): the
            # frame confirms it, in its place
            self.messages[position] = message
            return
        if message.get("role") == "assistant":
            self.turns.append((self.reconstructed(), [comparable(b) for b in message["content"]]))
        self.messages.append(message)

    def on_snapshot_messages(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages

    def apply_all(self, frames: Iterable[Mapping[str, Any]]) -> ClientView:
        """Apply ``frames`` in order (a snapshot first, if any); returns the view."""
        for frame in frames:
            self.apply(frame)
        return self

    def reconstructed(self) -> list[dict[str, Any]]:
        return [comparable(content) for content in super().reconstructed()]

    def text(self) -> str:
        """All assistant text the client shows: committed messages, then the partial one."""
        parts = [
            b.get("text", "")
            for m in self.messages
            if m.get("role") == "assistant"
            for b in m.get("content", [])
            if b.get("type") == "text"
        ]
        parts += [b.text for _, b in sorted(self.blocks.items()) if b.kind == "text"]
        return "".join(parts)


def comparable(block: dict[str, Any]) -> dict[str, Any]:
    """A block without what the client is never sent (thinking and function-call signatures)."""
    if block.get("type") == "thinking":
        return {"type": "thinking", "thinking": block.get("thinking", "")}
    if block.get("type") == "tool_use" and "signature" in block:
        return {k: v for k, v in block.items() if k != "signature"}
    return block
