"""What both wire formats share: an SSE event that knows what it bills, and error specs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class WireEvent:
    """One SSE event, ready to send. ``tokens`` is 1 for a content delta (an output token)
    and ``text`` what a text delta adds to the answer: the billing log sums both over the
    events that were written completely."""

    data: bytes
    tokens: int = 0
    text: str = ""


@dataclass(frozen=True, slots=True)
class ResponseContext:
    """Facts a response repeats about its request; ids derive from ``seed`` (deterministic)."""

    model: str
    seed: str
    input_tokens: int
    include_usage: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)  # the request body (Responses echoes it)


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """An error response before any stream: status, the provider's error fields, headers."""

    status: int
    error_type: str
    message: str
    param: str | None = None
    code: str | None = None
    details: Mapping[str, Any] | None = None
    headers: tuple[tuple[str, str], ...] = ()


def compact(payload: Any) -> str:
    """JSON as the providers send it: compact, UTF-8 kept as is (not \\u escapes)."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def spaced(payload: Any) -> str:
    """JSON with ", " and ": " separators (how the documented error events look)."""
    return json.dumps(payload, ensure_ascii=False)


def sse(data: str, event: str | None = None, *, tokens: int = 0, text: str = "") -> WireEvent:
    head = f"event: {event}\n" if event else ""
    return WireEvent(f"{head}data: {data}\n\n".encode(), tokens, text)
