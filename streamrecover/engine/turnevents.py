"""TurnEvents: a turn's structured events, each sent to the sink with the turn's context."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Unpack, overload

from . import sink as ev
from .sink import AttemptRecord, StructuredEvent
from .turnstate import TurnState


class TurnEvents:
    """Emits the turn's events, stamped with its provider, model, run, turn and attempt."""

    def __init__(self, state: TurnState) -> None:
        self.state = state

    # One overload per event: each call site is checked against that event's payload shape.
    @overload
    async def emit(self, name: Literal["llm_stream_interrupted"], **fields: Unpack[ev.InterruptedFields]) -> None: ...
    @overload
    async def emit(
        self, name: Literal["llm_stream_continuation_started"], **fields: Unpack[ev.ContinuationStartedFields]
    ) -> None: ...
    @overload
    async def emit(
        self, name: Literal["llm_stream_continuation_completed"], **fields: Unpack[ev.ContinuationCompletedFields]
    ) -> None: ...
    @overload
    async def emit(
        self, name: Literal["llm_stream_continuation_failed"], **fields: Unpack[ev.ContinuationFailedFields]
    ) -> None: ...
    @overload
    async def emit(
        self, name: Literal["llm_stream_continuation_exhausted"], **fields: Unpack[ev.ContinuationExhaustedFields]
    ) -> None: ...
    @overload
    async def emit(
        self, name: Literal["discarded_partial_tool_use"], **fields: Unpack[ev.DiscardedToolFields]
    ) -> None: ...
    @overload
    async def emit(self, name: Literal["discarded_thinking"], **fields: Unpack[ev.DiscardedThinkingFields]) -> None: ...
    @overload
    async def emit(self, name: Literal["llm_request_retry"], **fields: Unpack[ev.RequestRetryFields]) -> None: ...
    @overload
    async def emit(self, name: Literal["llm_run_resumed"], **fields: Unpack[ev.RunResumedFields]) -> None: ...
    @overload
    async def emit(self, name: Literal["llm_stream_failover"], **fields: Unpack[ev.FailoverFields]) -> None: ...
    @overload
    async def emit(
        self, name: Literal["llm_response_abandoned"], **fields: Unpack[ev.ResponseAbandonedFields]
    ) -> None: ...

    async def emit(self, name: str, **fields: object) -> None:
        """The event, as of the attempt streaming now."""
        await self.emit_at(self.state.attempt, name, fields)

    async def emit_at(self, attempt: AttemptRecord | None, name: str, fields: Mapping[str, object]) -> None:
        """The event, as of ``attempt`` (one that happened at an earlier attempt's break)."""
        state = self.state
        ctx = state.ctx
        base: ev.EventContext = {
            "provider": ctx.provider,
            "model": state.request.model,
            "run_id": ctx.run_id,
            "turn_id": f"{ctx.run_id}:{state.turn}",
            "attempt": attempt.index if attempt else None,
        }
        await ctx.sink.on_event(StructuredEvent(name, {**base, **fields}))
