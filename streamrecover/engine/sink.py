"""The sink contract: what the engine tells the world (structured events, attempts, client frames, commits).

The engine depends on the ``RunSink`` protocol only. Django (the recorder), Channels (the
publisher) and the command line implement it, usually by subclassing ``BaseSink`` and
overriding the hooks they need; ``FanOutSink`` joins several.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Final, NotRequired, Protocol, TypedDict

from .events import Usage
from .protocol import Frame

log = logging.getLogger(__name__)

# Structured event names: the one place they are spelled.
LLM_STREAM_INTERRUPTED: Final = "llm_stream_interrupted"
LLM_STREAM_CONTINUATION_STARTED: Final = "llm_stream_continuation_started"
LLM_STREAM_CONTINUATION_COMPLETED: Final = "llm_stream_continuation_completed"
LLM_STREAM_CONTINUATION_FAILED: Final = "llm_stream_continuation_failed"
LLM_STREAM_CONTINUATION_EXHAUSTED: Final = "llm_stream_continuation_exhausted"
DISCARDED_PARTIAL_TOOL_USE: Final = "discarded_partial_tool_use"
DISCARDED_THINKING: Final = "discarded_thinking"
LLM_REQUEST_RETRY: Final = "llm_request_retry"
LLM_RUN_RESUMED: Final = "llm_run_resumed"
LLM_STREAM_FAILOVER: Final = "llm_stream_failover"
LLM_RESPONSE_ABANDONED: Final = "llm_response_abandoned"
# every name above, in the order a run's story reads (the admin's filter offers them all)
EVENT_NAMES: Final = (
    LLM_STREAM_INTERRUPTED,
    LLM_STREAM_CONTINUATION_STARTED,
    LLM_STREAM_CONTINUATION_COMPLETED,
    LLM_STREAM_CONTINUATION_FAILED,
    LLM_STREAM_CONTINUATION_EXHAUSTED,
    DISCARDED_PARTIAL_TOOL_USE,
    DISCARDED_THINKING,
    LLM_REQUEST_RETRY,
    LLM_RUN_RESUMED,
    LLM_STREAM_FAILOVER,
    LLM_RESPONSE_ABANDONED,
)


# ---- event payloads: every event carries EventContext plus its own fields -----------------


class EventContext(TypedDict):
    """The fields every structured event carries."""

    provider: str
    model: str
    run_id: str
    turn_id: str
    attempt: int | None


class BlockSummary(TypedDict):
    """Counts of the blocks a continuation carries on from."""

    text_blocks: int
    text_chars: int
    tool_calls: int
    thinking_blocks: int


class InterruptedFields(TypedDict):
    continuation_attempt: int
    cause: str
    error_kind: str
    error_message: str
    committed_text_blocks: int
    committed_partial_text: bool
    discarded_partial_tool_uses: int
    discarded_thinking_blocks: int
    usage_flushed: bool  # the response's closing usage arrived
    answer_complete: bool  # its stop reason arrived: only the terminator was lost, nothing is continued
    final_usage_missing: bool
    plan: str
    kept_text_chars: int
    kept_output_tokens_estimate: int  # ceil(kept_text_chars / 4): the base of "tokens saved"
    turn_output_tokens: int  # output counted against the turn's max_tokens so far
    max_tokens: int


class ContinuationStartedFields(TypedDict):
    continuation_attempt: int
    backoff_s: float
    committed: BlockSummary
    strategy: str | None  # None: a whole restart
    plan: str


class JoinRecord(TypedDict):
    """How one continuation's text joined the kept text (``engine.join.JoinKind``)."""

    continuation: int
    kind: str
    chars: int  # characters dropped (trimmed), or of kept text replaced


class ContinuationCompletedFields(TypedDict):
    continuation_attempt: int
    completion_reason: str  # the stop reason, or "synthesized_tool_use"
    plan: NotRequired[str]
    join: NotRequired[str | None]  # the last seam's kind
    joins: NotRequired[list[JoinRecord]]  # every seam of the turn


class ContinuationFailedFields(TypedDict):
    continuation_attempt: int
    error_kind: str
    error_message: str
    fallback_strategy: NotRequired[str]  # set when a refused prefill falls back


class ContinuationExhaustedFields(TypedDict):
    attempts: int
    final_reason: str
    plan: str  # the plan of the blocks it gave up on, as the ``exhausted`` frame names it


class DiscardedToolFields(TypedDict):
    tool_name: str | None
    tool_call_id: str | None
    partial_input_bytes: int
    reason: str


class DiscardedThinkingFields(TypedDict):
    kind: str
    partial_bytes: int
    reason: str


class RequestRetryFields(TypedDict):
    status: int | None
    error_kind: str
    retry_after_s: float | None
    delay_s: float
    retry: int


class RunResumedFields(TypedDict):
    plan: str
    committed: BlockSummary
    checkpoint_attempt: int
    checkpoint_continuation: int


class FailoverFields(TypedDict):
    continuation_attempt: int
    reason: str  # exhausted, or the permanent error's kind
    from_provider: str
    from_model: str
    to_provider: str
    to_model: str
    plan: str


class ResponseAbandonedFields(TypedDict):
    """A background response the turn left behind (native resume), and the cancel that stops it."""

    response_id: str
    # failover, reattach_failed, no_resume_point (a break inside a continuation's open seam);
    # exhausted, failed (the turn ended with it unread); cancel, abort, yield (the run was stopped)
    reason: str
    cancelled: bool  # the provider stopped it (the cancel's answer says "cancelled")
    response_status: str | None  # the status the cancel's answer gives ("completed": it had ended)
    error: str | None  # why the cancel failed: no answer in time, or an HTTP error


@dataclass(frozen=True, slots=True)
class StructuredEvent:
    """One structured event; ``fields`` always carries provider, model, run_id, turn_id, attempt."""

    name: str
    fields: dict[str, object]  # EventContext plus the event's own fields (the TypedDicts above)

    def as_dict(self) -> dict[str, object]:
        return {"event": self.name, **self.fields}


class AttemptOutcome:
    """How one provider call ended (``pending`` while it streams)."""

    PENDING: Final = "pending"
    COMPLETED: Final = "completed"
    INTERRUPTED: Final = "interrupted"
    REQUEST_FAILED: Final = "request_failed"
    CANCELLED: Final = "cancelled"


@dataclass(slots=True)
class AttemptRecord:
    """One HTTP call to the provider, filled in as it goes."""

    run_id: str
    turn: int
    index: int  # 0-based across the run
    kind: str  # initial, pre_stream_retry, continuation, restart, resume
    continuation: int
    strategy: str | None
    request: dict[str, Any]  # as sent, secrets removed
    started_at: float
    status_code: int | None = None
    request_id: str | None = None
    first_byte_at: float | None = None
    ended_at: float | None = None
    usage: Usage = field(default_factory=Usage)
    # the stream broke before the provider's final usage: ``usage`` holds the engine's estimate
    # of what was billed (``engine.estimate``), not the provider's count
    usage_estimated: bool = False
    bytes_received: int = 0
    interrupt_cause: str | None = None
    error_kind: str | None = None
    error_message: str | None = None
    stop_reason: str | None = None
    stop_sequence: str | None = None  # the stop sequence that ended it, where the provider names it
    outcome: str = AttemptOutcome.PENDING
    # the provider's ``AnswerMetadata`` so far, the latest value per key (not stored: read by
    # the healing endpoint's writers)
    metadata: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["usage"] = self.usage.as_dict()
        return data


class RunSink(Protocol):
    async def on_event(self, event: StructuredEvent) -> None: ...

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        """Called when an attempt starts and again when it ends (same object, updated)."""
        ...

    async def on_frame(self, frame: Frame) -> None:
        """A client protocol frame (``engine.protocol``), already carrying ``seq`` and ``run_id``."""
        ...

    async def on_message(self, message: dict[str, Any], position: int) -> None:
        """A message committed to the thread log at ``position``."""
        ...


class BaseSink:
    """A ``RunSink`` whose hooks do nothing: subclass it and override the ones you need."""

    async def on_event(self, event: StructuredEvent) -> None:
        return None

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        return None

    async def on_frame(self, frame: Frame) -> None:
        return None

    async def on_message(self, message: dict[str, Any], position: int) -> None:
        return None


class NullSink(BaseSink):
    """Discards everything."""


class CollectingSink(BaseSink):
    """Keeps everything in lists: the command line's ``--json`` output and the tests."""

    def __init__(self) -> None:
        self.events: list[StructuredEvent] = []
        self.attempts: list[AttemptRecord] = []
        self.frames: list[Frame] = []
        self.messages: list[tuple[int, dict[str, Any]]] = []

    async def on_event(self, event: StructuredEvent) -> None:
        self.events.append(event)

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        if attempt not in self.attempts:
            self.attempts.append(attempt)

    async def on_frame(self, frame: Frame) -> None:
        self.frames.append(frame)

    async def on_message(self, message: dict[str, Any], position: int) -> None:
        self.messages.append((position, message))

    def names(self) -> list[str]:
        return [e.name for e in self.events]


class FanOutSink:
    """Calls every sink; one failing sink is logged and does not stop the others or the run.

    Except the ``store`` (the run's store of record, called first): a committed message it
    failed to store raises, so the run stops instead of going on from a message its thread
    lacks (the next turn, and the final answer, would be stored after a hole)."""

    def __init__(self, *sinks: RunSink, store: RunSink | None = None) -> None:
        self.sinks = (store, *sinks) if store is not None else sinks
        self.store = store

    async def _each(self, method: str, *args: Any) -> None:
        for sink in self.sinks:
            try:
                await getattr(sink, method)(*args)
            except Exception:
                if sink is self.store and method == "on_message":
                    raise
                log.exception("sink %s.%s failed", type(sink).__name__, method)

    async def on_event(self, event: StructuredEvent) -> None:
        await self._each("on_event", event)

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        await self._each("on_attempt", attempt)

    async def on_frame(self, frame: Frame) -> None:
        await self._each("on_frame", frame)

    async def on_message(self, message: dict[str, Any], position: int) -> None:
        await self._each("on_message", message, position)
