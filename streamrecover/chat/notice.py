"""The recovery notice of a run that is over, read from its stored events as the live frames said it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..engine.plan import PlanKind
from ..engine.protocol import TERMINAL_STATUSES
from ..engine.sink import (
    LLM_STREAM_CONTINUATION_COMPLETED,
    LLM_STREAM_CONTINUATION_EXHAUSTED,
    LLM_STREAM_CONTINUATION_FAILED,
    LLM_STREAM_CONTINUATION_STARTED,
    LLM_STREAM_INTERRUPTED,
)
from ..models import Run

# The events that mark a step of the live notice, or tell what happened after one.
_STEPS = (
    LLM_STREAM_INTERRUPTED,
    LLM_STREAM_CONTINUATION_STARTED,
    LLM_STREAM_CONTINUATION_COMPLETED,
    LLM_STREAM_CONTINUATION_FAILED,
    LLM_STREAM_CONTINUATION_EXHAUSTED,
)
# The events sent with a recovery frame that sets the live notice: ``continuing`` (the frame
# right after the event) and ``exhausted``.
_NOTICE_FRAMES = (LLM_STREAM_CONTINUATION_STARTED, LLM_STREAM_CONTINUATION_EXHAUSTED)


@dataclass(frozen=True, slots=True)
class RecoveryNotice:
    """What ``#sr-recovery`` says after a reload (``chat.js`` says the same from the frames live)."""

    phase: Literal["recovered", "exhausted"]
    # recovered: the last recovery kept nothing and the answer started over (``whole_restart``)
    restarted: bool = False
    # exhausted: the continuation attempts spent, and the plan its ``exhausted`` frame named
    continuations: int = 0
    plan: str = ""


@dataclass(frozen=True, slots=True)
class _Step:
    """One stored event of ``_STEPS``."""

    name: str
    plan: str
    payload: dict[str, Any]

    def is_break(self) -> bool:
        """A stream or a continuation's request that failed and was not recovered in place: the
        page heard a ``backoff`` frame next, or the run's end. Not a break: one whose answer had
        ended or that ends the turn as a tool call (no frame follows: the turn goes on), nor a
        refused prefill or re-attach (the same continuation goes on, with no new frame)."""
        if self.name == LLM_STREAM_INTERRUPTED:
            return not self.payload.get("answer_complete") and self.plan != PlanKind.SYNTHESIZE_TOOL_USE
        return self.name == LLM_STREAM_CONTINUATION_FAILED and "fallback_strategy" not in self.payload

    def counts(self) -> bool:
        return self.name == LLM_STREAM_CONTINUATION_COMPLETED or self.is_break()


def recovery_notice(run: Run | None) -> RecoveryNotice | None:
    """The notice the live page was left showing when ``run`` ended, whatever its end; else None.

    Live (``chat.js``) the notice follows the run's recovery frames: the last ``continuing`` one,
    once a delta follows it, says "Recovered…" until another recovery frame comes, whatever the
    run's end (a later turn cancelled or failed included); an ``exhausted`` one says "Gave up…";
    a ``backoff`` the run ends in (cancelled while it waits) is hidden with the run's end. Each
    ``continuing`` frame has a ``llm_stream_continuation_started`` event of the same plan, the
    ``exhausted`` frame its ``llm_stream_continuation_exhausted`` event; the events after them
    say whether the continuation sent anything and whether the run ended in a backoff.
    """
    if run is None or run.status not in TERMINAL_STATUSES:
        return None
    rows = run.events.filter(name__in=_STEPS).order_by("created", "id").values_list("name", "plan", "payload")
    steps = [_Step(name, plan, payload if isinstance(payload, dict) else {}) for name, plan, payload in rows]
    return _notice_of(run.status, steps)


def _notice_of(status: str, steps: Sequence[_Step]) -> RecoveryNotice | None:
    """The notice of a run that ended with ``status`` after ``steps``, in the order they happened."""
    last = max((i for i, step in enumerate(steps) if step.name in _NOTICE_FRAMES), default=None)
    if last is None:
        return None
    frame = steps[last]
    if frame.name == LLM_STREAM_CONTINUATION_EXHAUSTED:
        attempts = frame.payload.get("attempts")
        if not isinstance(attempts, int):
            return None
        # the plan the exhausted frame named: the event's own (not the last break's: a continuation
        # refused before it streamed gives up on the blocks kept, e.g. the text before a dropped tool call)
        return RecoveryNotice("exhausted", continuations=attempts, plan=frame.plan)
    after = [step for step in steps[last + 1 :] if step.counts()]
    if after and status == Run.Status.CANCELLED and after[-1].is_break():
        return None  # cancelled in the backoff after a later break: the page was saying "reconnecting…"
    if after and after[0].is_break() and not _went_on(after[0], frame):
        return None  # the continuation broke before it sent anything: no delta followed "continuing"
    return RecoveryNotice("recovered", restarted=frame.plan == PlanKind.WHOLE_RESTART)


def _went_on(broke: _Step, started: _Step) -> bool:
    """Whether the continuation ``started`` sent text before it ``broke``: it broke with more text
    kept than it started from (a continuation's request refused sent nothing)."""
    if broke.name != LLM_STREAM_INTERRUPTED:
        return False
    committed = started.payload.get("committed")
    text_before = committed.get("text_chars", 0) if isinstance(committed, dict) else 0
    kept = broke.payload.get("kept_text_chars", 0)
    return isinstance(kept, int) and isinstance(text_before, int) and kept > text_before
