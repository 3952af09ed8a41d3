"""ToolNotice: a tool call a turn lost, as the model may be told of it, and the text that tells it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict


class ToolNotice(TypedDict):
    """A tool call cut off before its arguments were complete (or unusable): never executed.
    Plain JSON, so checkpoints and the thread's pending notices store it as it is."""

    id: str | None
    name: str | None
    reason: str  # incomplete_arguments, invalid_arguments_json, not_executed...


def tool_notice(id: str | None, name: str | None, reason: str) -> ToolNotice:
    return {"id": id, "name": name, "reason": reason}


def stored_notice(stored: Mapping[str, Any]) -> ToolNotice:
    """A notice read back from JSON, keeping only its own keys (what else a row holds stays there)."""
    return tool_notice(stored.get("id"), stored.get("name"), str(stored.get("reason") or ""))


def notice_blocks(notices: Iterable[ToolNotice]) -> list[dict[str, Any]]:
    """The text blocks that tell the model about discarded tool calls (never hidden: persisted)."""
    return [{"type": "text", "text": discarded_tool_notice(notice)} for notice in notices]


def discarded_tool_notice(notice: ToolNotice) -> str:
    return (
        f"[streamrecover] Your call of tool {notice.get('name')!r} (id {notice.get('id')}) was cut off "
        "by a connection failure before its arguments were complete. It was not executed."
    )
