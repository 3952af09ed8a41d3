"""Report windows and their time arithmetic: ``Window``, ``parse_span``, 15-minute slots, chart buckets."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.utils import timezone

PRESETS: dict[str, timedelta] = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
HOURLY_UP_TO = timedelta(days=7)
_SPAN = re.compile(r"^\s*(\d+)\s*([hdw])\s*$")
_UNITS = {"h": "hours", "d": "days", "w": "weeks"}


def parse_span(text: str) -> timedelta:
    """``24h``, ``7d``, ``2w`` -> a timedelta; anything else is a ``ValueError``."""
    match = _SPAN.match(text or "")
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"not a window length: {text!r} (use e.g. 24h, 7d, 30d)")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


@dataclass(frozen=True, slots=True)
class Window:
    """Runs created in ``[start, end)``, optionally of one provider and one model."""

    start: datetime
    end: datetime
    provider: str | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError("the window ends before it starts")

    @classmethod
    def last(cls, span: timedelta, *, now: datetime | None = None, **filters: str | None) -> Window:
        end = now or timezone.now()
        return cls(end - span, end, **filters)

    @property
    def bucket(self) -> str:
        """Hourly points up to a week (at most 168), daily beyond."""
        return "hour" if self.end - self.start <= HOURLY_UP_TO else "day"

    def as_dict(self) -> dict[str, Any]:
        return {
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "bucket": self.bucket,
            "provider": self.provider,
            "model": self.model,
        }


SLOT = timedelta(minutes=15)


def slot_floor(moment: datetime) -> datetime:
    """The start of the 15-minute slot (UTC) holding ``moment``."""
    step = SLOT.total_seconds()
    return datetime.fromtimestamp(math.floor(moment.timestamp() / step) * step, UTC)


def slot_ceil(moment: datetime) -> datetime:
    floor = slot_floor(moment)
    return floor if floor == moment else floor + SLOT


def buckets(window: Window) -> list[datetime]:
    """Every bucket start from the one holding ``start`` up to ``end``, empty ones included.

    Hours step in UTC (a DST change neither repeats nor skips one); days step on the calendar.
    """
    tz = timezone.get_current_timezone()
    start = timezone.localtime(window.start, tz)
    buckets = []
    if window.bucket == "hour":
        current = start.replace(minute=0, second=0, microsecond=0)
        while current < window.end:
            buckets.append(current)
            current = timezone.localtime(current.astimezone(UTC) + timedelta(hours=1), tz)
        return buckets
    day = start.date()
    while (current := datetime.combine(day, time.min, tzinfo=tz)) < window.end:
        buckets.append(current)
        day += timedelta(days=1)
    return buckets
