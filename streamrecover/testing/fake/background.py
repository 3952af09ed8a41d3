"""A background response (OpenAI Responses ``background: true``): generated at the model's pace
whether anyone reads it or not, and billed as it is generated, until it ends or is cancelled."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .wire import WireEvent

IN_PROGRESS = "in_progress"
COMPLETED = "completed"
CANCELLED = "cancelled"


@dataclass(slots=True)
class BackgroundResponse:
    """Event n is generated ``n * pace`` seconds after the first (the schedule the fake's streams
    are paced on, ``event_delay``; 0: the whole response at once), and billed then: a client
    that hangs up or reads nothing stops neither. Only ``cancel`` does, as on the real API
    (``POST /v1/responses/{id}/cancel``), where what was generated before it stays billed."""

    events: list[WireEvent]
    pace: float = 0.0
    started: float = field(default_factory=time.monotonic)
    stopped: float | None = None  # when a cancel stopped the generation

    def due(self, index: int) -> float:
        """When event ``index`` is (or was) generated: no stream may send it earlier."""
        return self.started + index * self.pace

    def generated(self, now: float | None = None) -> int:
        """How many events exist by ``now`` (by the cancel, once cancelled)."""
        if self.pace <= 0:
            return len(self.events)
        moment = time.monotonic() if now is None else now
        if self.stopped is not None:
            moment = min(moment, self.stopped)
        return min(len(self.events), int((moment - self.started) / self.pace) + 1)

    def status(self, now: float | None = None) -> str:
        if self.generated(now) >= len(self.events):
            return COMPLETED
        return CANCELLED if self.stopped is not None else IN_PROGRESS

    def cancel(self) -> str:
        """Stop the generation where it is; the response's status afterwards. One that already
        ended (completed, or cancelled before) is left as it is: a second cancel changes nothing."""
        now = time.monotonic()
        if self.status(now) == IN_PROGRESS:
            self.stopped = now
        return self.status(now)

    def billed(self) -> tuple[int, list[str]]:
        """Output tokens and text of the events generated so far."""
        made = self.events[: self.generated()]
        return sum(e.tokens for e in made), [e.text for e in made]
