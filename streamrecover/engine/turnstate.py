"""TurnState: where one turn stands (its request, blocks, prefix, attempt), shared by its collaborators."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import sink as ev
from .blocks import Accumulator, Block, Snapshot
from .context import RunContext
from .continuation import as_restart, continue_from, prefill_refused, strategy_for
from .contract import ModelRequest, ResumePoint, Strategy
from .plan import PlanKind, RecoveryPlan, plan
from .sink import AttemptRecord

NATIVE_RESUME = PlanKind.NATIVE_RESUME.value  # the attempt kind and strategy of a re-attach
PAUSED_TURN = "as_is"  # the strategy of an attempt that sends a paused answer back


@dataclass(slots=True)
class TurnState:
    """The turn's position, read and moved by the runner and its collaborators. ``request`` and
    ``ctx.adapter`` change on a failover: read them when needed, never keep a copy."""

    ctx: RunContext
    request: ModelRequest
    turn: int
    acc: Accumulator = field(default_factory=Accumulator)  # the turn's blocks, numbered as the client sees them
    prefix: list[Block] = field(default_factory=list)  # kept blocks the current attempt continues from
    strategy: Strategy | None = None
    continuation: int = 0
    attempt_kind: str = "initial"
    attempt: AttemptRecord | None = None  # the attempt streaming now (the last one, once it ended)
    native: ResumePoint | None = None  # where the current attempt re-attaches (native resume)
    # the blocks the client holds while a plan waits for its continuation (its drops sent):
    # what a turn ending then keeps from; None while the client holds the turn's blocks
    held: list[Block] | None = None
    joins: list[ev.JoinRecord] = field(default_factory=list)  # how each continuation joined the kept text
    # the prefix is a paused answer (Anthropic's ``pause_turn``), sent back as it is for the model
    # to go on with its turn: no trimming, no continue instruction, no text joined onto it
    paused: bool = False
    # how often the provider paused the turn before the request streaming now (each request
    # counts against max_turns): its checkpoints keep the count for a resume
    pauses: int = 0

    def model_strategy(self) -> Strategy:
        """The model's strategy; ``continue_message`` once it refused a prefill in this run or process."""
        strategy = strategy_for(self.ctx.adapter, self.request)
        model = self.request.model
        if strategy is Strategy.PREFILL and (
            model in self.ctx.prefill_refused or prefill_refused(self.ctx.provider, model)
        ):
            return Strategy.CONTINUE_MESSAGE
        return strategy

    def strategy_name(self) -> str | None:
        """How the current attempt carries on: ``native_resume``, or the continuation strategy."""
        if self.native is not None:
            return NATIVE_RESUME
        if self.paused:
            return PAUSED_TURN
        return self.strategy.value if (self.strategy and self.prefix) else None

    def ordinary_plan(self, snapshot: Snapshot) -> RecoveryPlan:
        """The plan of blocks a native resume kept, for a provider that continues instead: a
        structured answer goes on only by prefill (``ModelRequest.structured``), else starts over."""
        recovery = plan(snapshot)
        if recovery.continues and self.request.structured and self.model_strategy() is not Strategy.PREFILL:
            recovery = as_restart(recovery)
        return recovery

    def carry_paused(self, blocks: list[Block]) -> None:
        """The turn goes on from a paused answer's ``blocks`` (numbered as its client holds them):
        sent back as they are, they are the first blocks of the answer this turn builds."""
        self.prefix = [b.copy() for b in blocks]
        self.acc = Accumulator()
        self.acc.restore(self.prefix)
        self.paused = True

    def set_native(self, keep: list[Block], point: ResumePoint) -> None:
        """The next attempt re-attaches at ``point``, from exactly the blocks ``keep``."""
        self.prefix = [b.copy() for b in keep]
        self.acc = Accumulator()
        self.acc.restore([b.copy() for b in keep])
        self.strategy, self.attempt_kind, self.native = None, NATIVE_RESUME, point
        self.held = None
        self.paused = False

    def set_prefix(self, recovery: RecoveryPlan) -> bool:
        """The next attempt continues from what ``recovery`` keeps, or starts over: True then
        (the caller drops what the answer cost from its prefix's cost: ``OutputBudget.restart``)."""
        self.native = None
        self.held = None
        self.paused = False  # a break after it: the answer goes on the way any broken one does
        chosen = continue_from(recovery, self.model_strategy())
        self.prefix, self.strategy, self.acc, self.attempt_kind = (
            chosen.prefix,
            chosen.strategy,
            chosen.acc,
            chosen.kind,
        )
        return chosen.kind == "restart"
