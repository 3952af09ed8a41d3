"""Report windows and their time arithmetic: ``Window``, ``parse_span``, 15-minute slots, chart buckets."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta, tzinfo
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

    Hours are the current time zone's wall-clock hours, the ones ``TruncHour`` groups by: a
    repeated hour or half hour (a DST change back) joins its wall-clock hour, a skipped one has
    no point, and an hour partly skipped (a 30-minute change forward) has one for what is left.
    Each is labelled with its wall-clock hour in the offset of its first occurrence (``fold=0``,
    what ``make_aware`` gives the database's buckets). Days step on the calendar.
    """
    tz = timezone.get_current_timezone()
    if window.bucket == "hour":
        return _wall_clock_hours(window, tz)
    day = timezone.localtime(window.start, tz).date()
    days = []
    while (current := datetime.combine(day, time.min, tzinfo=tz)) < window.end:
        days.append(current)
        day += timedelta(days=1)
    return days


def _wall_clock_hours(window: Window, tz: tzinfo) -> list[datetime]:
    """The wall-clock hours that some instant of the window falls in, in the order met.

    Stepping an hour at a time (in UTC or on the wall clock) goes off the grid across a change
    that is not a whole hour (Australia/Lord_Howe's 30 minutes). Every offset in use is a whole
    number of 15-minute slots, so an instant in every slot meets every wall-clock hour there is.
    """
    seen: dict[datetime, None] = {}  # naive wall-clock hours, in the order met
    moment = window.start
    while moment < window.end:
        # A repeated hour or half hour meets its wall-clock hour again: one point.
        seen.setdefault(moment.astimezone(tz).replace(minute=0, second=0, microsecond=0, tzinfo=None))
        moment = slot_floor(moment) + SLOT
    return [hour.replace(tzinfo=tz) for hour in seen]  # fold=0: the offset of the hour's first occurrence
