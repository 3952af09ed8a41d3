"""The ``snapshot`` frame: one database read plus the buffer's ``RunState``, made consistent.

The database is read first and the buffer second. Whatever the run committed between the
two reads is in the state (it remembers every ``message_committed``), so merging the two by
position gives exactly the messages committed up to the snapshot's seq: none missing, none
that a later live frame would add again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine.protocol import TERMINAL_STATUSES, FrameKind, RunStatus
from .state import RunState


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What the database says about a run, loaded once per snapshot."""

    run_id: str
    status: str
    error: dict[str, Any] | None
    messages: dict[int, dict[str, Any]]  # the thread's committed messages by position


def snapshot_status(db_status: str, state: RunState | None) -> str:
    """The frames know about a start or an end first; the database knows about recovering
    and about a run re-queued or given up on without a final frame."""
    live = state.status if state is not None else None
    if not live:
        return db_status
    if live in TERMINAL_STATUSES:
        return db_status if db_status == RunStatus.QUEUED else live
    return live if db_status == RunStatus.QUEUED else db_status


def build_snapshot(record: RunRecord, state: RunState | None) -> dict[str, Any]:
    messages = dict(record.messages)
    if state is not None:
        for position, message in state.commits.items():
            messages.setdefault(position, message)
    partial = state.partial() if state is not None else []
    last = max(messages) if messages else None
    if (
        state is not None
        and last is not None
        and last not in state.commits
        and messages[last].get("role") == "assistant"
    ):
        # The run's answer is in the database but its frame is not in the buffer yet (a run's
        # end is stored before its last frames are sent): the in-flight blocks are that answer,
        # shown once, as committed. The frame that follows puts it in the same place.
        partial = []
    status = snapshot_status(record.status, state)
    error = record.error
    if state is not None and state.status == status and state.error:
        error = state.error
    return {
        "type": FrameKind.SNAPSHOT,
        "run_id": record.run_id,
        "seq": state.seq if state is not None else 0,
        "status": status,
        "messages": [messages[p] for p in sorted(messages)],
        "partial": partial,
        "error": error,
    }
