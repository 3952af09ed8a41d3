"""Retry timing: ``Retry-After`` parsing, the continuation backoff schedule, the pre-stream retry decision.

``Retry-After`` comes in three forms: ``retry-after-ms``, and ``retry-after`` as seconds or an HTTP date.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping, Sequence

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """A header by lower-case name, whatever its case in ``headers``."""
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait, from ``retry-after-ms``, then ``retry-after`` as seconds or an HTTP date.

    Returns None when absent, unparseable or not in the future (the SDKs' order).
    """
    ms = header_value(headers, "retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            value = -1.0
        if value > 0:
            return value
    raw = header_value(headers, "retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        value = float(raw)
    except ValueError:
        parsed = email.utils.parsedate_tz(raw)
        if parsed is None:
            return None
        value = email.utils.mktime_tz(parsed) - (now if now is not None else time.time())
    return value if value > 0 else None


def should_retry_header(headers: Mapping[str, str]) -> bool | None:
    """``x-should-retry: true|false`` overrides the status policy; None when absent."""
    raw = header_value(headers, "x-should-retry")
    if raw is None:
        return None
    raw = raw.strip().lower()
    if raw == "true":
        return True
    if raw == "false":
        return False
    return None


def backoff_delay(
    attempt: int,
    schedule: Sequence[float],
    scale: float = 1.0,
    jitter: float = 0.0,
    retry_after_s: float | None = None,
    max_retry_after_s: float = 60.0,
    rng: random.Random | None = None,
) -> float:
    """The wait before continuation ``attempt`` (1-based): the schedule's step (the last one
    repeats), scaled, with optional downward jitter, but at least a capped ``Retry-After``."""
    base = 0.0 if not schedule else float(schedule[min(attempt, len(schedule)) - 1])
    delay = base * scale
    if jitter > 0:
        delay *= 1.0 - jitter * (rng or random).random()
    if retry_after_s is not None and retry_after_s > 0:
        delay = max(delay, min(retry_after_s, max_retry_after_s))
    return delay
