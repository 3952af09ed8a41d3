"""Stored tool results: a tool call is executed at most once per committed call.

A run stores each call's result (keyed by the run, the position of the assistant message that
made the call and the call's id) before it goes on; a resumed run finds it and does not call
the tool again. A tool that may be interrupted mid-call gets a stable idempotency key
(``ToolCallContext``) to recognise the call when it is made again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ToolCallContext:
    """What a tool is told about the call it executes (a tool takes it as ``context``)."""

    run_id: str
    tool_call_id: str
    position: int  # of the assistant message that made the call
    idempotency_key: str  # the same every time this call is made: "<run_id>:<position>:<tool_call_id>"

    @classmethod
    def for_call(cls, run_id: str, position: int, tool_call_id: str) -> ToolCallContext:
        return cls(run_id, tool_call_id, position, f"{run_id}:{position}:{tool_call_id}")


class ToolResultStore(Protocol):
    async def get(self, run_id: str, position: int, tool_call_id: str) -> dict[str, Any] | None:
        """The stored ``tool_result`` block of the call, or None when it has none."""
        ...

    async def before_call(self, run_id: str, position: int, tool_call_id: str) -> None:
        """Called immediately before the call is made (it has no stored result); raises to stop
        it. A store of a run that several workers may claim raises ``ClaimLost`` here once this
        worker's claim is lost: the new owner makes the call, and a tool's side effect (a
        payment, an e-mail) must not happen twice."""
        ...

    async def put(self, run_id: str, position: int, tool_call_id: str, result: dict[str, Any]) -> None:
        """Store the call's ``tool_result`` block (a second put of the same call changes nothing)."""
        ...


class InMemoryToolResultStore:
    """One process, one run context: the engine's default (and the command line's)."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, int, str], dict[str, Any]] = {}

    async def get(self, run_id: str, position: int, tool_call_id: str) -> dict[str, Any] | None:
        return self._items.get((run_id, position, tool_call_id))

    async def before_call(self, run_id: str, position: int, tool_call_id: str) -> None:
        """One process owns the run: always free to call."""

    async def put(self, run_id: str, position: int, tool_call_id: str, result: dict[str, Any]) -> None:
        self._items.setdefault((run_id, position, tool_call_id), result)
