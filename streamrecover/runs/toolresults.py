"""The tool result store of the Django layer: one ``ToolCallResult`` row per executed call.

A result is written only while the worker's claim is current (``runs.fence``), in the same
transaction that checks it; the row is unique per call, so a second write changes nothing. A
call is made only within the claim's lease (``before_call``), so a worker whose run was taken
over never makes a call the new owner makes too.
"""

from __future__ import annotations

from typing import Any

from ..models import ToolCallResult
from ..redaction import cut_secrets
from .fence import Fence
from .rows import jsonable


class DjangoToolResultStore:
    """``engine.toolresults.ToolResultStore`` on ``ToolCallResult`` rows, fenced by a claim."""

    def __init__(self, fence: Fence) -> None:
        self.fence = fence

    async def get(self, run_id: str, position: int, tool_call_id: str) -> dict[str, Any] | None:
        self.fence.check()
        row = await ToolCallResult.objects.filter(run_id=run_id, position=position, tool_call_id=tool_call_id).afirst()
        return dict(row.result) if row is not None else None

    async def before_call(self, run_id: str, position: int, tool_call_id: str) -> None:
        """The check frames get (``Fence.ensure``): within the lease the claim is still this
        worker's; past it (the loop stopped between ``get`` and the call) the worker beats
        first, and a claim taken meanwhile raises ``ClaimLost`` before the tool is called."""
        await self.fence.ensure()

    async def put(self, run_id: str, position: int, tool_call_id: str, result: dict[str, Any]) -> None:
        stored = cut_secrets(jsonable(result))  # as the committed message will hold it
        await self.fence.awrite(
            lambda: ToolCallResult.objects.get_or_create(
                run_id=run_id,
                position=position,
                tool_call_id=tool_call_id,
                defaults={"result": stored},
            )
        )
