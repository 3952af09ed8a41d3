"""Fault specs, per-scenario fault scripts, and where exactly a fault hits a stream.

A script is a list of ``Fault``s consumed one per provider request (whatever the request
turns out to be), in order; an empty script means requests succeed. Scripts are keyed by
scenario (the ``x-fake-scenario`` request header, default ``"default"``) so concurrent
tests and demo sessions keep their own.

Compact string form (a command-line flag; ``;`` separates the faults of a script)::

    ok                                    no fault for this request
    drop                                  close the connection before any response byte
    cut:bytes=900                         close abruptly after 900 body bytes (no last chunk)
    cut:events=12                         ... after 12 whole SSE events
    cut:events=12,mid                     ... halfway through event 13
    cut:from_end=1                        ... before the last event (only the terminator is lost;
                                          from_end=2 on OpenAI with usage: the usage chunk too)
    eof:events=12                         clean end (last chunk sent) after 12 events, no terminator
    stall:events=5,seconds=3[,then=cut]   after 5 events send nothing for 3 s (connection open),
                                          then cut (default), eof, or continue the stream
    goaway:events=12[,mid] / goaway:bytes=900
                                          HTTP/2: after 12 events send GOAWAY, then close the
                                          connection (HTTP/1.1 has no GOAWAY: a plain cut)
    stall_headers:seconds=30              read the request, then send nothing at all (not even the
                                          status line) for 30 s, then answer normally
    error:events=8[,type=overloaded_error][,message=Overloaded]
                                          a mid-stream error event after 8 events (HTTP 200), clean end
    garbage:events=3                      event 4 sent with its JSON truncated (invalid), clean end
    bad_utf8:events=3                     event 4 sent with invalid UTF-8 bytes, clean end
    status:429[,retry_after=2][,retry_after_ms=1500][,retry_after_date=5][,should_retry=false]
          [,type=...][,message=...][,quota]
                                          an HTTP error before any stream; retry_after_date sends an
                                          HTTP date that many seconds ahead; quota: OpenAI
                                          insufficient_quota / Anthropic spend-limit 429
    html[:content_type=text/html]         an HTML error page with status 200 (a proxy's or CDN's page)
    mislabel[:content_type=application/json]
                                          the answer's stream under a wrong content type
    long_line:events=3,size=2000000       event 4 is one data line of that many bytes, then a clean end
    unknown:events=3                      an event of a type no adapter knows before event 4; the
                                          stream goes on complete
    noname                                the first tool call's name is sent as ""
    endless:events=5[,seconds=0.05][,text]
                                          after 5 events the stream never ends: a keep-alive (or, with
                                          text, one more text token) every 0.05 s until the client goes

A bare number is the status code (``status``) or ``events`` (other kinds); a bare word is a
flag set to true. Positions count body bytes (SSE bytes, chunk framing excluded) or whole
SSE events (``ping``, ``message_start`` and ``[DONE]`` included). A fault whose position lies
beyond the stream does not trigger. A non-streaming request honours only ``drop`` and
``status`` (it still consumes its fault). Messages cannot contain ``,`` or ``;`` in string form.
"""

from __future__ import annotations

import email.utils
import enum
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from . import hostile
from .wire import WireEvent


class FaultKind(enum.StrEnum):
    OK = "ok"
    DROP = "drop"
    CUT = "cut"
    EOF = "eof"
    STALL = "stall"
    ERROR = "error"
    GARBAGE = "garbage"
    BAD_UTF8 = "bad_utf8"
    STATUS = "status"
    STALL_HEADERS = "stall_headers"
    GOAWAY = "goaway"
    HTML = "html"
    MISLABEL = "mislabel"
    LONG_LINE = "long_line"
    UNKNOWN = "unknown"
    NONAME = "noname"
    ENDLESS = "endless"


_EXTERNAL = {"byte_offset": "bytes", "error_type": "type"}  # field name -> dict / string key
_INTERNAL = {v: k for k, v in _EXTERNAL.items()}
_ALLOWED = {
    FaultKind.OK: set(),
    FaultKind.DROP: set(),
    FaultKind.CUT: {"events", "byte_offset", "mid", "from_end"},
    FaultKind.EOF: {"events", "byte_offset", "mid", "from_end"},
    FaultKind.STALL: {"events", "byte_offset", "mid", "seconds", "then", "from_end"},
    FaultKind.ERROR: {"events", "error_type", "message"},
    FaultKind.GARBAGE: {"events"},
    FaultKind.BAD_UTF8: {"events"},
    FaultKind.STALL_HEADERS: {"seconds"},
    FaultKind.GOAWAY: {"events", "byte_offset", "mid"},
    FaultKind.HTML: {"content_type"},
    FaultKind.MISLABEL: {"content_type"},
    FaultKind.LONG_LINE: {"events", "size"},
    FaultKind.UNKNOWN: {"events"},
    FaultKind.NONAME: set(),
    FaultKind.ENDLESS: {"events", "seconds", "text"},
    FaultKind.STATUS: {
        "code", "error_type", "message", "retry_after", "retry_after_ms", "retry_after_date", "should_retry", "quota",
    },
}  # fmt: skip
_INTS = {"events", "byte_offset", "code", "retry_after_ms", "from_end", "size"}
_FLOATS = {"seconds", "retry_after", "retry_after_date"}
_BOOLS = {"mid", "quota", "should_retry", "text"}
_THEN = ("cut", "eof", "continue")


@dataclass(frozen=True, slots=True)
class Fault:
    """One scripted failure. Build directly (``Fault("cut", byte_offset=900)``), from a
    dict (``Fault.from_dict({"kind": "cut", "bytes": 900})``) or a string
    (``Fault.parse("cut:bytes=900")``)."""

    kind: FaultKind
    events: int | None = None
    byte_offset: int | None = None
    mid: bool = False
    seconds: float = 0.0
    then: str = "cut"
    code: int | None = None
    error_type: str | None = None
    message: str | None = None
    retry_after: float | None = None
    retry_after_ms: int | None = None
    retry_after_date: float | None = None
    should_retry: bool | None = None
    quota: bool = False
    from_end: int | None = None  # a position counted back from the stream's last event
    content_type: str | None = None  # html, mislabel: the content type sent
    size: int | None = None  # long_line: the line's bytes
    text: bool = False  # endless: repeat text tokens, not keep-alives

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FaultKind(self.kind))
        unexpected = [f.name for f in fields(self) if f.name != "kind" and _is_set(self, f.name)]
        unexpected = [name for name in unexpected if name not in _ALLOWED[self.kind]]
        if unexpected:
            raise ValueError(f"{self.kind} fault takes no {', '.join(_EXTERNAL.get(n, n) for n in unexpected)}")
        positioned = self.kind in (FaultKind.CUT, FaultKind.EOF, FaultKind.STALL, FaultKind.GOAWAY)
        if positioned and sum(v is not None for v in (self.events, self.byte_offset, self.from_end)) != 1:
            raise ValueError(f"{self.kind} fault needs exactly one of events=, bytes= or from_end=")
        if self.mid and self.events is None:
            raise ValueError("mid needs events=")
        needs_events = (FaultKind.ERROR, FaultKind.GARBAGE, FaultKind.BAD_UTF8, FaultKind.LONG_LINE, FaultKind.UNKNOWN)
        if self.kind in (*needs_events, FaultKind.ENDLESS) and self.events is None:
            raise ValueError(f"{self.kind} fault needs events=")
        if any(v is not None and v < 0 for v in (self.events, self.byte_offset, self.from_end)):
            raise ValueError("positions cannot be negative")
        if self.kind in (FaultKind.STALL, FaultKind.STALL_HEADERS) and self.seconds <= 0:
            raise ValueError(f"{self.kind} fault needs seconds= (positive)")
        if self.kind is FaultKind.LONG_LINE and (self.size is None or self.size < 1):
            raise ValueError("long_line fault needs size= (bytes, positive)")
        if self.then not in _THEN:
            raise ValueError(f"then= must be one of {', '.join(_THEN)}")
        if self.kind is FaultKind.STATUS and (self.code is None or not 400 <= self.code <= 599):
            raise ValueError("status fault needs a code between 400 and 599")
        if self.retry_after is not None and self.retry_after_date is not None:
            raise ValueError("retry_after and retry_after_date both set one header: choose one")

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``"kind:key=value,..."`` (see the module docstring)."""
        kind, _, rest = text.strip().partition(":")
        values: dict[str, Any] = {"kind": kind.strip()}
        for token in (t.strip() for t in rest.split(",")):
            if not token:
                continue
            key, eq, raw = token.partition("=")
            if not eq and token.isdigit():
                key, raw = ("code" if values["kind"] == "status" else "events"), token
            elif not eq:
                raw = "true"  # a bare word is a flag
            values[key.strip()] = raw.strip()
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        if "kind" not in data:
            raise ValueError("a fault needs a kind")
        try:
            kind = FaultKind(data["kind"])
        except ValueError:
            raise ValueError(f"unknown fault kind {data['kind']!r}") from None
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in data.items():
            if key == "kind":
                continue
            name = _INTERNAL.get(key, key)
            if name not in known or name == "kind":
                raise ValueError(f"unknown fault parameter {key!r}")
            values[name] = _coerce(name, raw)
        return cls(kind, **values)

    def to_dict(self) -> dict[str, Any]:
        """Only the parameters that differ from their defaults, under their external names."""
        data: dict[str, Any] = {"kind": self.kind.value}
        for f in fields(self):
            if f.name != "kind" and _is_set(self, f.name):
                data[_EXTERNAL.get(f.name, f.name)] = getattr(self, f.name)
        return data

    def __str__(self) -> str:
        data = self.to_dict()
        kind = str(data.pop("kind"))
        parts = [str(data.pop("code"))] if "code" in data else []
        parts += [f"{key}={_format(value)}" for key, value in data.items()]
        return kind + (":" + ",".join(parts) if parts else "")

    def retry_headers(self) -> list[tuple[str, str]]:
        """The headers a status fault sends with its error body."""
        headers = []
        if self.retry_after is not None:
            headers.append(("retry-after", _format(self.retry_after)))
        if self.retry_after_date is not None:
            headers.append(("retry-after", email.utils.formatdate(time.time() + self.retry_after_date, usegmt=True)))
        if self.retry_after_ms is not None:
            headers.append(("retry-after-ms", str(self.retry_after_ms)))
        if self.should_retry is not None:
            headers.append(("x-should-retry", "true" if self.should_retry else "false"))
        return headers


def parse_script(text: str) -> list[Fault]:
    """``"ok;cut:bytes=900;status:529"`` -> faults, in order."""
    return [Fault.parse(part) for part in text.replace("\n", ";").split(";") if part.strip()]


def as_fault(value: Fault | str | Mapping[str, Any]) -> Fault:
    if isinstance(value, Fault):
        return value
    return Fault.parse(value) if isinstance(value, str) else Fault.from_dict(value)


class FaultScripts:
    """Fault queues by scenario key, consumed one per provider request. Thread-safe: tests
    set scripts from their thread while the server consumes them in its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Fault]] = {}

    def set(self, scenario: str, faults: Iterable[Fault | str | Mapping[str, Any]]) -> None:
        script = deque(as_fault(f) for f in faults)
        with self._lock:
            self._queues[scenario] = script

    def next(self, scenario: str) -> Fault | None:
        with self._lock:
            queue = self._queues.get(scenario)
            return queue.popleft() if queue else None

    def pending(self) -> dict[str, list[Fault]]:
        with self._lock:
            return {key: list(queue) for key, queue in self._queues.items() if queue}

    def clear(self, scenario: str | None = None) -> None:
        with self._lock:
            if scenario is None:
                self._queues.clear()
            else:
                self._queues.pop(scenario, None)


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes written as one HTTP chunk; ``tokens``/``text`` are billed once it is written,
    so only the piece that completes an event carries them."""

    data: bytes
    tokens: int = 0
    text: str = ""


@dataclass(frozen=True, slots=True)
class Delivery:
    """What the server writes for one stream under one fault."""

    pieces: tuple[Piece, ...]
    clean_end: bool  # send the terminating zero-length chunk
    triggered: bool
    stall_before: int | None = None  # index in ``pieces`` where the stall happens
    stall_seconds: float = 0.0
    complete: bool = True  # every event of the answer is in ``pieces``
    goaway: bool = False  # after ``pieces``, HTTP/2 GOAWAY, then the connection closes
    endless: Piece | None = None  # after ``pieces``, this piece again and again, never an end
    endless_every: float = 0.0  # seconds between two endless pieces


def plan_delivery(events: Sequence[WireEvent], fault: Fault | None, error_event: WireEvent | None = None) -> Delivery:
    """Where ``fault`` hits the stream ``events`` (a pure function, so it is unit-testable)."""
    whole = tuple(Piece(e.data, e.tokens, e.text) for e in events)
    normal = Delivery(whole, clean_end=True, triggered=False)
    if fault is None:
        return normal
    if fault.kind in (FaultKind.CUT, FaultKind.EOF, FaultKind.STALL, FaultKind.GOAWAY):
        split = _split(events, fault)
        if split is None or (fault.kind is FaultKind.EOF and not split[1]):
            return normal
        head, tail = split
        if fault.kind is FaultKind.STALL:
            resumes = fault.then == "continue"
            return Delivery(
                head + (tail if resumes else ()),
                clean_end=fault.then != "cut",
                triggered=True,
                stall_before=len(head),
                stall_seconds=fault.seconds,
                complete=resumes or not tail,
            )
        goaway = fault.kind is FaultKind.GOAWAY
        return Delivery(head, clean_end=fault.kind is FaultKind.EOF, triggered=True, complete=not tail, goaway=goaway)
    n = fault.events if fault.events is not None else 0
    if fault.kind in _HOSTILE:
        return _hostile_delivery(events, fault, n) or normal
    if fault.kind is FaultKind.ERROR and n <= len(events) and error_event is not None:
        return Delivery((*whole[:n], Piece(error_event.data)), clean_end=True, triggered=True, complete=False)
    if fault.kind in (FaultKind.GARBAGE, FaultKind.BAD_UTF8) and n < len(events):
        corrupt = _truncate_json if fault.kind is FaultKind.GARBAGE else _insert_bad_utf8
        return Delivery((*whole[:n], Piece(corrupt(events[n].data))), clean_end=True, triggered=True, complete=False)
    return normal


_HOSTILE = (FaultKind.LONG_LINE, FaultKind.UNKNOWN, FaultKind.NONAME, FaultKind.ENDLESS)


def _hostile_delivery(events: Sequence[WireEvent], fault: Fault, n: int) -> Delivery | None:
    """The stream under a hostile-input fault; None when it does not trigger."""
    whole = tuple(Piece(e.data, e.tokens, e.text) for e in events)
    named = hostile.named(events)
    if fault.kind is FaultKind.NONAME:
        for index, event in enumerate(events):
            blanked = hostile.blank_tool_name(event)
            if blanked is not None:
                piece = Piece(blanked.data, blanked.tokens, blanked.text)
                return Delivery((*whole[:index], piece, *whole[index + 1 :]), clean_end=True, triggered=True)
        return None
    if n >= len(events):
        return None
    if fault.kind is FaultKind.UNKNOWN:
        return Delivery((*whole[:n], Piece(hostile.unknown_event(named)), *whole[n:]), clean_end=True, triggered=True)
    if fault.kind is FaultKind.LONG_LINE:
        line = Piece(hostile.long_line(fault.size or 0))
        return Delivery((*whole[:n], line), clean_end=True, triggered=True, complete=False)
    repeated = hostile.endless_text(named) if fault.text else hostile.keepalive(named)
    return Delivery(
        whole[:n],
        clean_end=False,
        triggered=True,
        complete=False,
        endless=Piece(repeated.data, repeated.tokens, repeated.text),
        endless_every=fault.seconds or 0.05,
    )


def _split(events: Sequence[WireEvent], fault: Fault) -> tuple[tuple[Piece, ...], tuple[Piece, ...]] | None:
    """The pieces before and after the fault's position; None when it lies beyond the stream."""
    whole = [Piece(e.data, e.tokens, e.text) for e in events]
    if fault.from_end is not None:
        n = len(events) - fault.from_end
        if n < 0:
            return None
        return tuple(whole[:n]), tuple(whole[n:])
    if fault.events is not None:
        n = fault.events
        if n > len(events) or (fault.mid and n == len(events)):
            return None
        if not fault.mid:
            return tuple(whole[:n]), tuple(whole[n:])
        event = events[n]
        k = max(1, len(event.data) // 2)
        rest = Piece(event.data[k:], event.tokens, event.text)
        return (*whole[:n], Piece(event.data[:k])), (rest, *whole[n + 1 :])
    offset = fault.byte_offset or 0
    if offset > sum(len(e.data) for e in events):
        return None
    head: list[Piece] = []
    tail: list[Piece] = []
    position = 0
    for event, piece in zip(events, whole, strict=True):
        end = position + len(event.data)
        if end <= offset:
            head.append(piece)
        elif position >= offset:
            tail.append(piece)
        else:
            k = offset - position
            if event.data.endswith(b"\r\n\r\n") and k == len(event.data) - 1:
                # "...\r\n\r" already ends the event for an SSE reader (a lone CR ends a line):
                # the client has it, so it is billed with the head
                head.append(Piece(event.data[:k], event.tokens, event.text))
                tail.append(Piece(event.data[k:]))
            else:
                head.append(Piece(event.data[:k]))
                tail.append(Piece(event.data[k:], event.tokens, event.text))
        position = end
    return tuple(head), tuple(tail)


def _truncate_json(data: bytes) -> bytes:
    """The event with its data line's JSON cut in half: invalid JSON, valid SSE framing."""
    start = data.index(b"data: ") + len(b"data: ")
    payload = data[start:].rstrip(b"\n")
    return data[:start] + payload[: max(1, len(payload) // 2)] + b"\n\n"


def _insert_bad_utf8(data: bytes) -> bytes:
    start = data.index(b"data: ") + len(b"data: ")
    return data[:start] + b"\xff\xfe\xc3" + data[start:]


def _is_set(fault: Fault, name: str) -> bool:
    value = getattr(fault, name)
    default = {"mid": False, "quota": False, "seconds": 0.0, "then": "cut", "text": False}.get(name)
    return value is not None and value != default


def _coerce(name: str, raw: Any) -> Any:
    try:
        if name in _BOOLS:
            if isinstance(raw, str):
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                return raw.lower() in ("true", "1", "yes")
            return bool(raw)
        if name in _INTS:
            return int(raw)
        if name in _FLOATS:
            return float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"bad value for {_EXTERNAL.get(name, name)}: {raw!r}") from None
    return str(raw)


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
