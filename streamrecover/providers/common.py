"""Helpers every adapter shares: excerpts, typed ints, the status policy, the ``STRATEGY_OVERRIDES`` lookup."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from fnmatch import fnmatchcase
from typing import Any, cast

from ..engine.contract import HTTPRequest, ModelRequest, ProviderConfig, Strategy, ThinkingRule
from ..engine.errors import ErrorClass, ParseError
from ..engine.events import (
    BlockStop,
    FieldDelta,
    ProviderErrorEvent,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolArgsDelta,
)
from ..engine.retry import RETRYABLE_STATUSES, should_retry_header

EXCERPT_CHARS = 160


_json_decode = json.JSONDecoder().decode
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_event_json(data: str) -> Any:
    """An event's JSON data. A lone surrogate escape (``\\ud83d`` without its pair) decodes to
    U+FFFD, as a UTF-8 decoder does with broken bytes: a string holding one has no UTF-8
    form, so it could be neither counted, sent on nor stored, and the client and the
    database see the same replacement. (A pair a server split across two deltas is joined
    again by ``SplitPairs``, which reads the events a parser makes of this value.)"""
    return _decode(data, None, _maybe_lone(data))


def event_object(data: str, what: str) -> dict[str, Any]:
    """An event's data as a JSON object (``decode_event_json``), or a ``ParseError`` that
    names ``what`` the event was and shows the start of its data."""
    return _object(data, what, None, _maybe_lone(data))


# id of a decoded string -> (the string, the low surrogate it began with, the high one it ended with)
_Edges = dict[int, tuple[str, str, str]]


def _maybe_lone(data: str) -> bool:
    """Whether ``data`` may decode to a lone surrogate: only its escape can (UTF-8 has none)."""
    return "\\ud" in data or "\\uD" in data


def _decode(data: str, edges: _Edges | None, maybe_lone: bool) -> Any:
    value = _json_decode(data)
    if maybe_lone:  # json.loads already joined every escaped pair
        value = _without_lone_surrogates(value, edges)
    return value


def _object(data: str, what: str, edges: _Edges | None, maybe_lone: bool) -> dict[str, Any]:
    try:
        value = _decode(data, edges, maybe_lone)
    except ValueError as exc:
        raise ParseError(f"{what}: data is not JSON ({exc}): {excerpt(data)}") from None
    if type(value) is not dict:
        raise ParseError(f"{what}: data is not a JSON object: {excerpt(data)}")
    return value


def _without_lone_surrogates(value: Any, edges: _Edges | None = None) -> Any:
    if isinstance(value, str):
        if not LONE_SURROGATE.search(value):
            return value
        clean = LONE_SURROGATE.sub("\ufffd", value)
        low = value[0] if "\udc00" <= value[0] <= "\udfff" else ""
        high = value[-1] if "\ud800" <= value[-1] <= "\udbff" else ""
        if edges is not None and (low or high):
            # half a pair at either end: the other half may end the previous delta or begin
            # the next. Two strings replaced by one object (a cached U+FFFD) say neither.
            edges[id(clean)] = (clean, low, high) if id(clean) not in edges else (clean, "", "")
        return clean
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v, edges) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_lone_surrogates(v, edges) for v in value]
    return value


# the deltas a pair can be split across, and the field each carries its text in
_DELTA_TEXT: dict[type[Any], str] = {
    TextDelta: "text",
    ThinkingDelta: "thinking",
    ToolArgsDelta: "partial_json",
    FieldDelta: "text",
}


def _delta_text(event: Any) -> str:
    text: str = getattr(event, _DELTA_TEXT[type(event)])
    return text


def _with_text(event: Any, text: str) -> StreamEvent | None:
    """The delta with ``text`` instead, or None when nothing is left of it."""
    return cast(StreamEvent, replace(event, **{_DELTA_TEXT[type(event)]: text})) if text else None


class SplitPairs:
    """One response's reader of UTF-16 pairs a server split across two deltas of one block.

    JSON escapes a character beyond the BMP as a surrogate pair (``\\ud83d\\ude80``); a server
    that cuts its deltas at UTF-16 units may send the high half at the end of one delta and
    the low half at the start of the next. Decoded alone, each is a lone surrogate, which
    becomes U+FFFD, and the model's character would be rewritten twice. A parser decodes its
    events with ``event_object`` here, which notes the strings that begin or end with half a
    pair, and passes the events it made through ``settle``: a delta that ends with a high half
    is held back, with every event after it, until the next delta of the same block. When
    that one begins with the low half, the two deltas carry the real character, once, in
    order; otherwise (another delta, the block's stop, the stream's end) the half stays the
    U+FFFD it was decoded to. So neither the engine's blocks, nor the frames sent to
    clients, nor a checkpoint ever hold half a character; a stream that breaks in between
    loses what was held, which the next attempt sends again (a continuation carries on from
    the text before it; a native resume re-attaches before it: ``holding``). A provider error
    releases what was held without its half (the continuation writes the character).

    The pair is recognized by identity: a delta must carry the very string the decoded
    value held (as every parser's deltas do); any other string keeps its U+FFFD.
    """

    __slots__ = ("_edges", "_pending", "_queue")

    def __init__(self) -> None:
        self._edges: _Edges | None = None  # the strings of the event being parsed with half a pair
        self._queue: list[StreamEvent | None] = []  # held back, in order (None: a delta emptied)
        self._pending: dict[tuple[type, int], tuple[int, str]] = {}  # delta key -> (queue position, high half)

    @property
    def holding(self) -> bool:
        """True while events are held back: the stream's state lags the last event read."""
        return bool(self._queue)

    def event_object(self, data: str, what: str) -> dict[str, Any]:
        """``event_object``, noting which of the value's strings begin or end with half a pair."""
        if _maybe_lone(data):
            edges = self._edges = {}
            return _object(data, what, edges, True)
        self._edges = None
        return _object(data, what, None, False)

    def settle(self, events: list[StreamEvent]) -> list[StreamEvent]:
        """The events a parser made of the last event decoded, as they may go on now."""
        edges = self._edges
        if edges is None and not self._queue:
            return events
        self._edges = None
        for event in events:
            self._take(event, edges or {})
        if self._pending:
            return []
        released = [e for e in self._queue if e is not None]
        self._queue = []
        return released

    def _take(self, event: StreamEvent, edges: _Edges) -> None:
        if type(event) in _DELTA_TEXT:
            self._delta(event, edges)
            return
        if isinstance(event, BlockStop):  # the block ends: a held high half stays U+FFFD
            for key in [k for k in self._pending if k[1] == event.index]:
                del self._pending[key]
        elif isinstance(event, StreamEnd):
            self._pending.clear()
        elif isinstance(event, ProviderErrorEvent):  # the half is dropped: a continuation writes it whole
            for position, _ in self._pending.values():
                held = self._queue[position]
                assert held is not None
                self._queue[position] = _with_text(held, _delta_text(held)[:-1])
            self._pending.clear()
        self._queue.append(event)

    def _delta(self, event: StreamEvent, edges: _Edges) -> None:
        text = _delta_text(event)
        edge = edges.get(id(text))
        low, high = (edge[1], edge[2]) if edge is not None and edge[0] is text else ("", "")
        key: tuple[type, int] = (type(event), event.index)  # type: ignore[union-attr]
        pending = self._pending.pop(key, None)
        if pending is not None and low:  # the pair: the held delta gives up its U+FFFD, this one its own
            position, held_high = pending
            held = self._queue[position]
            assert held is not None
            self._queue[position] = _with_text(held, _delta_text(held)[:-1])
            text = _joined(held_high, low) + text[1:]
        if high:
            self._pending[key] = (len(self._queue), high)
        self._queue.append(_with_text(event, text) if text != _delta_text(event) else event)


def _joined(high: str, low: str) -> str:
    """The character a UTF-16 surrogate pair encodes."""
    return chr(0x10000 + ((ord(high) - 0xD800) << 10) + (ord(low) - 0xDC00))


def excerpt(text: str) -> str:
    """A short, quoted piece of bad input for an error message."""
    return repr(text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…")


def optional_strings(*values: object) -> bool:
    """True when each of ``values`` is a ``str`` or None: a tool call's name and id, which the
    engine stores, shows and sends back as strings (another type is bad data, not a crash)."""
    return all(value is None or type(value) is str for value in values)


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


# The rule of an adapter that sends no thinking budget (OpenAI's APIs): the run's stays as it is.
UNSENT_THINKING = ThinkingRule(minimum=None, send_minimum=True)


class ContinueMessageOnly:
    """The recovery protocol of an API with neither a prefill nor a count endpoint (Gemini,
    OpenAI Responses): a settings override or a continue message; the continuation does not
    repeat the prefix; nothing to count before a continuation (usage comes with the stream)."""

    config: ProviderConfig

    def continuation_strategy(self, model: str, *, thinking: bool) -> Strategy:
        override = strategy_override(self.config.strategy_overrides, model)
        return override if override is not None else Strategy.CONTINUE_MESSAGE

    @property
    def echoes_prefix(self) -> bool:
        return False

    def count_request(self, request: ModelRequest) -> HTTPRequest | None:
        return None

    def read_count(self, body: bytes) -> int | None:
        return None


def read_error_body(status: int, body: bytes) -> tuple[dict[str, Any], Any, str]:
    """An error response's JSON object (or ``{}``), its ``error`` member, and a message:
    the error's own, or a clear one built from the status and an excerpt of the body."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text) if text.strip() else None
    except ValueError:
        parsed = None
    document = parsed if isinstance(parsed, dict) else {}
    error = document.get("error")
    message = ""
    if isinstance(error, dict):
        message = str(error.get("message") or "")
    elif isinstance(error, str):
        message = error
    if not message:
        message = f"HTTP {status} with an unexpected body: {excerpt(text)}" if text.strip() else f"HTTP {status}"
    return document, error, message


def with_should_retry(headers: Mapping[str, str], error_class: ErrorClass) -> ErrorClass:
    """``x-should-retry`` overrides the status policy (never a prefill refusal: that is the
    signal to fall back to a continue message)."""
    override = should_retry_header(headers)
    if override is None or error_class is ErrorClass.PREFILL_REFUSED:
        return error_class
    return ErrorClass.RETRYABLE if override else ErrorClass.PERMANENT


def text_of(content: Any) -> str:
    """Tool-result or message content (a string or canonical blocks) as the string OpenAI takes."""
    if isinstance(content, str):
        return content
    if not content:
        return ""
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")
