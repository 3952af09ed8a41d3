"""Helpers every adapter shares: message excerpts, typed ints, the status policy, and
the ``STRATEGY_OVERRIDES`` lookup."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from ..engine.errors import ErrorClass
from ..engine.retry import RETRYABLE_STATUSES
from .base import Strategy

EXCERPT_CHARS = 160


def excerpt(text: str) -> str:
    """A short, quoted piece of bad input for an error message."""
    return repr(text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…")


def as_int(value: Any) -> int | None:
    return value if type(value) is int else None


def status_policy(status: int, table: Mapping[int, tuple[str, ErrorClass]]) -> tuple[str, ErrorClass]:
    """The adapter's table first; then any 5xx (or listed retryable status) is retried and
    any other 4xx is permanent."""
    policy = table.get(status)
    if policy is not None:
        return policy
    if status in RETRYABLE_STATUSES or status >= 500:
        return "server_error", ErrorClass.RETRYABLE
    if status >= 400:
        return "invalid_request", ErrorClass.PERMANENT
    return "unexpected_status", ErrorClass.PERMANENT


def strategy_override(overrides: Mapping[str, str], model: str) -> Strategy | None:
    """The first ``model glob -> strategy`` setting that matches, if any."""
    for pattern, value in overrides.items():
        if fnmatchcase(model, pattern):
            try:
                return Strategy(value)
            except ValueError:
                known = ", ".join(s.value for s in Strategy)
                raise ValueError(
                    f"strategy override {pattern!r} -> {value!r} is not a strategy (known: {known})"
                ) from None
    return None
