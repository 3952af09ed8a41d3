"""What a client would show for a run at a given ``seq``, kept on the server side.

A snapshot must not need the database per frame, and a reconnecting browser must get
exactly the blocks it would have built from the frames. ``RunState`` applies frames with
the rules of ``engine.client_view.ClientView`` and also remembers every message the run
committed, so a snapshot can be built from one database read plus this state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

TERMINAL_STATUSES = frozenset({"completed", "failed", "exhausted", "cancelled"})
DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "tool_call_delta": "arguments_delta"}


@dataclass(slots=True)
class RunState:
    """The client's view of one run after applying every frame up to ``seq``."""

    seq: int = 0
    status: str | None = None
    error: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)  # in-flight blocks by index
    commits: dict[int, dict[str, Any]] = field(default_factory=dict)  # committed messages by position

    def apply(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        block = frame.get("block")
        self.seq = max(self.seq, int(frame.get("seq") or 0))
        if kind == "text_delta":
            self.blocks.setdefault(block, {"kind": "text", "text": ""})["text"] += frame.get("text", "")
        elif kind == "thinking_delta":
            self.blocks.setdefault(block, {"kind": "thinking", "text": ""})["text"] += frame.get("thinking", "")
        elif kind == "tool_call_delta":
            entry = self.blocks.setdefault(
                block, {"kind": "tool_use", "id": frame.get("id"), "name": frame.get("name"), "arguments": ""}
            )
            entry["arguments"] += frame.get("arguments_delta", "")
        elif kind == "block":
            content = frame.get("content") or {}
            self.blocks[block] = {"kind": content.get("type", "block"), "content": content}
        elif kind in ("tool_call_cancel", "block_cancel"):
            self.blocks.pop(block, None)
        elif kind == "stream_reset":
            self.blocks.clear()
        elif kind == "message_committed":
            self.commits[int(frame.get("position", len(self.commits)))] = frame.get("message") or {}
            self.blocks.clear()
        elif kind == "run_status":
            self.status = frame.get("status")
            self.error = frame.get("error")

    def partial(self) -> list[dict[str, Any]]:
        """The in-flight blocks as ``[{block, content}]`` in block order (snapshot shape)."""
        return [{"block": index, "content": _content(self.blocks[index])} for index in sorted(self.blocks)]

    def to_json(self) -> str:
        return json.dumps(
            {
                "seq": self.seq,
                "status": self.status,
                "error": self.error,
                "blocks": [[k, v] for k, v in self.blocks.items()],
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
            blocks={int(k): v for k, v in data.get("blocks", [])},
            commits={int(k): v for k, v in data.get("commits", [])},
        )

    def copy(self) -> RunState:
        return RunState.from_json(self.to_json())


def _content(entry: dict[str, Any]) -> dict[str, Any]:
    """A partial block as canonical content. A tool call's arguments may be half a JSON
    document: ``partial_json`` carries them verbatim so the client appends further deltas."""
    kind = entry["kind"]
    if kind == "text":
        return {"type": "text", "text": entry["text"]}
    if kind == "thinking":
        return {"type": "thinking", "thinking": entry["text"]}
    if kind == "tool_use":
        arguments = entry.get("arguments", "")
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            parsed = {}
        return {
            "type": "tool_use",
            "id": entry.get("id"),
            "name": entry.get("name"),
            "input": parsed if isinstance(parsed, dict) else {},
            "partial_json": arguments,
        }
    return dict(entry.get("content") or {"type": kind})


def frame_span(frame: dict[str, Any]) -> tuple[int, int]:
    """The seqs a (possibly coalesced) frame covers: ``(first_seq, seq)``."""
    seq = int(frame.get("seq") or 0)
    return int(frame.get("first_seq") or seq), seq
