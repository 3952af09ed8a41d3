"""The server's copy of what a client would show for a run at a given ``seq``.

A snapshot must not need the database per frame, and a reconnecting browser must get
exactly the blocks it would have built from the frames. ``RunState`` applies frames with
the protocol's reducer (``engine.protocol.FrameReducer``) and also remembers every message
the run committed, so a snapshot can be built from one database read plus this state.
"""

from __future__ import annotations

import json
from typing import Any

from ..engine.protocol import FrameReducer, PartialBlock


class RunState(FrameReducer):
    """The client's view of one run after applying every frame up to ``seq``."""

    def __init__(
        self,
        seq: int = 0,
        status: str | None = None,
        error: dict[str, Any] | None = None,
        blocks: dict[int, PartialBlock] | None = None,
        commits: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.seq = seq
        self.status = status
        self.error = error
        self.blocks = blocks if blocks is not None else {}  # in-flight blocks by index
        self.commits: dict[int, dict[str, Any]] = commits if commits is not None else {}  # by thread position

    def on_commit(self, position: int | None, message: dict[str, Any]) -> None:
        self.commits[int(position if position is not None else len(self.commits))] = message

    def on_snapshot_messages(self, messages: list[dict[str, Any]]) -> None:
        self.commits = dict(enumerate(messages))

    def to_json(self) -> str:
        return json.dumps(
            {
                "seq": self.seq,
                "status": self.status,
                "error": self.error,
                "blocks": [[k, _stored(v)] for k, v in self.blocks.items()],
                "commits": [[k, v] for k, v in self.commits.items()],
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> RunState:
        data = json.loads(raw)
        return cls(
            seq=int(data.get("seq") or 0),
            status=data.get("status"),
            error=data.get("error"),
            blocks={int(k): _loaded(v) for k, v in data.get("blocks", [])},
            commits={int(k): v for k, v in data.get("commits", [])},
        )

    def copy(self) -> RunState:
        return RunState.from_json(self.to_json())


def _stored(block: PartialBlock) -> dict[str, Any]:
    """An in-flight block as the buffer stores it (the stored JSON shape is unchanged across versions)."""
    if block.kind in ("text", "thinking"):
        stored: dict[str, Any] = {"kind": block.kind, "text": block.text}
        if block.citations:
            stored["citations"] = block.citations
        if block.refusal:
            stored["refusal"] = True
        return stored
    if block.kind == "tool_use":
        return {"kind": "tool_use", "id": block.id, "name": block.name, "arguments": block.arguments}
    stored = {"kind": block.kind, "content": block.content}
    if block.arguments:  # a server tool call's streamed input
        stored["arguments"] = block.arguments
    return stored


def _loaded(entry: dict[str, Any]) -> PartialBlock:
    kind = entry["kind"]
    if kind in ("text", "thinking"):
        refusal = entry.get("refusal") is True  # absent in a state stored before it was kept: not one
        return PartialBlock(kind, text=entry.get("text", ""), citations=entry.get("citations"), refusal=refusal)
    if kind == "tool_use":
        return PartialBlock(
            "tool_use", id=entry.get("id"), name=entry.get("name"), arguments=entry.get("arguments", "")
        )
    return PartialBlock(kind, content=entry.get("content"), arguments=entry.get("arguments", ""))
