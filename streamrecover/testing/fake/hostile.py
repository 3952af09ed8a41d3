"""The bodies of the hostile-input faults: an HTML page, an unknown event, an oversized line,
a tool call with its name blanked, the piece an endless stream repeats.

Kept apart from ``faults.py`` (where a fault hits a stream) because these say what the broken
bytes are; both wire formats are told apart by their bytes (Anthropic events are named).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .wire import WireEvent, compact

HTML_PAGE = (
    b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n"
    b"<body><h1>Bad Gateway</h1><p>The upstream server is temporarily unavailable.</p></body></html>\n"
)


def named(events: Sequence[WireEvent]) -> bool:
    """True for the Anthropic format (every event has an ``event:`` line)."""
    return bool(events) and events[0].data.startswith(b"event:")


def unknown_event(named: bool) -> bytes:
    """An event of a type no adapter knows (providers add event types without notice)."""
    payload = {"type": "future_event_type", "detail": {"note": "a field from a later API version"}}
    if named:
        return f"event: future_event_type\ndata: {compact(payload)}\n\n".encode()
    return f"event: future_event_type\ndata: {compact({'object': 'future.event', **payload})}\n\n".encode()


def long_line(size: int) -> bytes:
    """One ``data:`` line of ``size`` bytes (the SSE framing around it excluded)."""
    return b"data: " + b"x" * max(0, size - 6) + b"\n\n"


def keepalive(named: bool) -> WireEvent:
    """What an endless stream of keep-alives repeats: a ping event, or an SSE comment."""
    return WireEvent(b'event: ping\ndata: {"type":"ping"}\n\n' if named else b": keep-alive\n\n")


def endless_text(named: bool) -> WireEvent:
    """What a runaway stream repeats: one more text token, forever, past any ``max_tokens``."""
    text = "la "
    if named:
        payload: dict[str, Any] = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text},
        }
        return WireEvent(f"event: content_block_delta\ndata: {compact(payload)}\n\n".encode(), 1, text)
    chunk = {
        "id": "chatcmpl-endless",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}}],
    }
    return WireEvent(f"data: {compact(chunk)}\n\n".encode(), 1, text)


def blank_tool_name(event: WireEvent) -> WireEvent | None:
    """The event with its tool call's name set to "", or None when it starts no tool call."""
    head, sep, rest = event.data.partition(b"data: ")
    if not sep:
        return None
    try:
        payload = json.loads(rest)
    except ValueError:
        return None
    block = payload.get("content_block") if isinstance(payload, dict) else None
    if isinstance(block, dict) and block.get("type") == "tool_use":
        block["name"] = ""
    else:
        calls = [
            call
            for choice in (payload.get("choices") or [] if isinstance(payload, dict) else [])
            for call in (choice.get("delta") or {}).get("tool_calls") or []
            if (call.get("function") or {}).get("name")
        ]
        if not calls:
            return None
        calls[0]["function"]["name"] = ""
    return WireEvent(head + sep + compact(payload).encode() + b"\n\n", event.tokens, event.text)
