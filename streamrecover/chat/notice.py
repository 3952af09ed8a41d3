"""The recovery notice of a run that is over, read from its stored events as the live frames said it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..engine.plan import PlanKind
from ..engine.sink import (
    LLM_STREAM_CONTINUATION_EXHAUSTED,
    LLM_STREAM_CONTINUATION_STARTED,
    LLM_STREAM_INTERRUPTED,
)
from ..models import Run


@dataclass(frozen=True, slots=True)
class RecoveryNotice:
    """What ``#sr-recovery`` says after a reload (``chat.js`` says the same from the frames live)."""

    phase: Literal["recovered", "exhausted"]
    # recovered: the last recovery kept nothing and the answer started over (``whole_restart``)
    restarted: bool = False
    # exhausted: the continuation attempts spent, and the plan of the break it gave up on
    continuations: int = 0
    plan: str = ""


def recovery_notice(run: Run | None) -> RecoveryNotice | None:
    """The notice of a completed run that was recovered, or of an exhausted one; else None.

    Live, the page names the plan of the run's last ``continuing`` frame; each such frame has a
    ``llm_stream_continuation_started`` event with the same plan, stored. A run's continuation
    count cannot tell it: a whole restart's attempt is a ``restart``, not a continuation.
    """
    if run is None:
        return None
    latest = run.events.order_by("-created", "-id")
    if run.status == Run.Status.COMPLETED:
        plan = latest.filter(name=LLM_STREAM_CONTINUATION_STARTED).values_list("plan", flat=True).first()
        if plan is None:
            return None
        return RecoveryNotice("recovered", restarted=plan == PlanKind.WHOLE_RESTART)
    if run.status == Run.Status.EXHAUSTED:
        gave_up = latest.filter(name=LLM_STREAM_CONTINUATION_EXHAUSTED).values_list("payload", flat=True).first()
        attempts = gave_up.get("attempts") if isinstance(gave_up, dict) else None
        if not isinstance(attempts, int):
            return None
        # the exhausted frame names the plan of the break that found no continuation left
        plan = latest.filter(name=LLM_STREAM_INTERRUPTED).values_list("plan", flat=True).first() or ""
        return RecoveryNotice("exhausted", continuations=attempts, plan=plan)
    return None
