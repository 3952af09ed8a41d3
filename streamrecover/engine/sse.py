"""Incremental Server-Sent Events decoding (WHATWG rules). Implementation pending."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched SSE event. ``event`` is "message" when no ``event:`` field was sent."""

    event: str
    data: str
    id: str | None = None
    retry: int | None = None
