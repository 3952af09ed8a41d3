"""TurnCheckpoints: one turn's checkpoints, coalesced while it streams and forced at breaks and endings."""

from __future__ import annotations

import logging
from typing import Any

from .blocks import TEXT, Block
from .budget import OutputBudget
from .checkpoint import Checkpoint, CheckpointWriter, CoalescePolicy
from .discards import Discards
from .nativeresume import NativeResume
from .plan import native_plan, plan
from .translate import Translator
from .turnstate import TurnState

log = logging.getLogger("streamrecover.engine.turn")  # the turn's log: its records keep their logger name


class TurnCheckpoints:
    """Writes what the turn holds (its blocks, where it re-attaches, what it cost) to the run's
    checkpoint store. A store outage is logged, kept in ``store_errors``, and the turn goes on."""

    def __init__(
        self,
        state: TurnState,
        translator: Translator,
        budget: OutputBudget,
        native: NativeResume,
        discards: Discards,
        history_len: int,
    ) -> None:
        self.state = state
        self.translator = translator
        self.budget = budget
        self.native = native
        self.discards = discards
        self.history_len = history_len
        config = state.ctx.config
        self.writer = CheckpointWriter(
            state.ctx.checkpoints,
            CoalescePolicy(
                config.checkpoint_every_deltas,
                config.checkpoint_every_bytes,
                config.checkpoint_every_seconds,
            ),
            on_error=self._store_failed,
        )
        self.store_errors: list[str] = []

    async def on_delta(self, delta_bytes: int) -> None:
        """One output delta streamed: a routine checkpoint when the policy says one is due."""
        if self.writer.note(delta_bytes):
            await self.write()

    async def now(self) -> None:
        await self.write(force=True)

    async def write(
        self,
        force: bool = False,
        blocks: list[Block] | None = None,
        stop_reason: str | None = None,
        ending: dict[str, Any] | None = None,
    ) -> None:
        state = self.state
        ended = stop_reason is not None or ending is not None
        point = self.native.resume_point() if not ended else None
        if blocks is not None:
            keep = blocks
        elif point is not None:
            keep = native_plan(state.acc.snapshot()).keep
        else:
            # what the client holds: while a plan waits for its continuation, what that plan kept
            # (nothing when the answer starts over, as a structured one does), else the plan's keep
            keep = state.held if state.held is not None else plan(state.acc.snapshot()).keep
        in_flight = self.translator.in_flight_tool if not ended else None
        used, received = self.budget.answer_output()
        checkpoint = Checkpoint(
            run_id=state.ctx.run_id,
            turn=state.turn,
            history_len=self.history_len,
            blocks=[b.to_checkpoint() for b in keep],
            in_flight_tool=dict(in_flight) if in_flight is not None else None,
            attempt=state.attempt.index if state.attempt else 0,
            continuation=state.continuation,
            seq=state.ctx.seq,
            native={**point.as_dict(), "open_text": _open_text(keep)} if point is not None else None,
            stop_reason=stop_reason,
            discarded_tools=list(self.discards.tools),
            # with nothing kept a resume starts the answer over: what it cost so far is dropped too
            dropped_output=self.budget.dropped_output + (0 if keep else used),
            output_used=used if keep else 0,
            received_bytes=received if keep else 0,
            ending=ending,
            pauses=state.pauses,
        )
        await self.writer.write(checkpoint)

    async def delete(self) -> None:
        await self.writer.delete(self.state.ctx.run_id)

    def _store_failed(self, what: str, exc: BaseException) -> None:
        """A checkpoint store outage is logged and the run goes on without it."""
        self.store_errors.append(f"{what}: {type(exc).__name__}: {exc}")
        log.warning("%s run_id=%s error=%s: %s", what, self.state.ctx.run_id, type(exc).__name__, exc)


def _open_text(blocks: list[Block]) -> bool:
    """True when the last block is a text block still receiving text."""
    return bool(blocks) and blocks[-1].kind == TEXT and not blocks[-1].closed
