"""The run context: one run's identity and shared services, built once by the code that executes the run.

Every turn of the run gets the same ``RunContext``: the adapter and engine settings, the
sink the run reports to, the checkpoint and tool result stores, the cancel token, the HTTP transport, and
the two counters that continue across turns and processes (the client frame ``seq`` and
the attempt index).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from .cancel import CancelToken
from .checkpoint import CheckpointStore, InMemoryCheckpointStore
from .config import EngineConfig
from .contract import ProviderAdapter
from .notices import ToolNotice
from .protocol import Frame
from .sink import RunSink
from .toolresults import InMemoryToolResultStore, ToolResultStore
from .transport import HttpxTransport


class RunCancelled(Exception):
    """The cancel token fired; carries what stopped the run."""


@dataclass(frozen=True, slots=True)
class Failover:
    """Where a turn goes on when its provider gives up mid-answer (continuations exhausted, or a
    permanent error after the answer started): another provider and model, from the same prefix."""

    adapter: ProviderAdapter
    model: str
    provider_name: str
    # the request's pass-through fields for this provider (another wire format's); None: unchanged
    extra: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    """How a run ended, with its final answer when that is not committed yet: the caller
    stores both in one step (``RunContext.settle``), so a run is never left with its answer
    committed and its end not, nor the other way round."""

    status: str
    error: dict[str, str] | None
    message: dict[str, Any] | None  # the final assistant message, to commit at ``position``
    position: int
    notices: list[ToolNotice]  # discarded-tool notices no message of the run carried


Settle = Callable[[Settlement], Awaitable[None]]


@dataclass(slots=True)
class RunContext:
    """Identity and shared services of one run, handed to every turn."""

    run_id: str
    adapter: ProviderAdapter
    config: EngineConfig
    sink: RunSink
    checkpoints: CheckpointStore = field(default_factory=InMemoryCheckpointStore)
    cancel: CancelToken = field(default_factory=CancelToken)
    tool_results: ToolResultStore = field(default_factory=InMemoryToolResultStore)
    # None: ``run_agent`` opens a transport for the run and closes it at the end
    transport: HttpxTransport | None = None
    seq: int = 0  # the last client frame number; a resumed run numbers on from it
    attempts: int = 0  # attempts so far across the run (the first attempt's index), for AttemptRecord.index
    turns: int = 0  # assistant turns of this run already committed (by an earlier process): MAX_TURNS counts them
    provider_name: str = ""  # the configured provider's name for events (default: the adapter's)
    # models that refused a prefill in this run: every later continuation uses continue_message
    prefill_refused: set[str] = field(default_factory=set)
    failover: Failover | None = None  # used at most once per turn
    # stores the run's end and its final answer in one step; None: the final answer is committed
    # through the sink like any message and the caller stores the end (``RunResult``)
    settle: Settle | None = None

    @property
    def provider(self) -> str:
        return self.provider_name or self.adapter.name

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    async def frame(self, type_: str, /, **payload: Any) -> None:
        """Number one client frame and hand it to the sink."""
        frame = cast(Frame, {"type": type_, "run_id": self.run_id, "seq": self.next_seq(), **payload})
        await self.sink.on_frame(frame)

    def check_cancel(self) -> None:
        if self.cancel.stopped:
            raise RunCancelled

    async def sleep(self, delay: float) -> None:
        """Back off for ``delay`` seconds; a cancel ends the wait and raises ``RunCancelled``."""
        if await self.cancel.sleep(delay):
            raise RunCancelled
