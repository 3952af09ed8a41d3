"""Incremental Server-Sent Events decoding (WHATWG rules).

Bytes arrive in arbitrary chunks; events must come out the same however the body was
cut, because recovery tests cut recorded streams at every byte. The decoder works on
whole chunks: it splits the complete lines off in C (``bytes.rfind``, one UTF-8 decode
per chunk, ``str.split``) and only loops in Python once per line, never per character.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import BodyDecodeError, SSEError, StreamRecoverError

_BOM = b"\xef\xbb\xbf"
_DEFAULT_EVENT = "message"


def is_event_stream(content_type: str) -> bool:
    """True for ``text/event-stream`` with or without parameters, in any case (media types
    are case-insensitive: ``Text/Event-Stream; charset=UTF-8`` is a stream)."""
    return content_type.partition(";")[0].strip().lower() == "text/event-stream"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched SSE event. ``event`` is "message" when no ``event:`` field was sent."""

    event: str
    data: str
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Turns a byte stream into ``SSEEvent``s, one chunk at a time.

    ``id`` on each event is the stream's last event ID (it persists across events, as the
    spec says; an empty ``id:`` resets it to None). ``retry`` is the reconnection time sent
    in that event's own lines, if any; ``self.retry`` keeps the latest one for the stream.
    """

    __slots__ = (
        "_at_start",
        "_bytes_received",
        "_closed",
        "_data",
        "_data_bytes",
        "_event_retry",
        "_event_type",
        "_had_unterminated",
        "_last_event_id",
        "_max_line_bytes",
        "_partial",
        "_pending_fields",
        "_skip_lf",
        "_text_offset",
        "error",
        "retry",
    )

    def __init__(self, max_line_bytes: int = 1_048_576) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self._max_line_bytes = max_line_bytes
        self._partial = b""  # bytes of a line whose end has not arrived yet
        self._at_start = True  # the BOM check is still pending
        self._skip_lf = False  # the last chunk ended in CR: a leading LF belongs to it
        self._bytes_received = 0
        self._text_offset = 0  # stream offset of the first byte of ``_partial`` (for errors)
        self._closed = False
        self._had_unterminated = False
        # Event buffers (spec: data buffer, event type buffer, last event ID buffer).
        self._data: list[str] = []
        self._data_bytes = 0  # characters of the event's data lines so far: bounded like a line
        self._event_type = ""
        self._event_retry: int | None = None
        self._pending_fields = False  # a field line arrived since the last blank line
        self._last_event_id: str | None = None
        self.retry: int | None = None
        # the error that ended the stream after the events ``feed`` returned with it (see feed)
        self.error: StreamRecoverError | None = None

    @property
    def bytes_received(self) -> int:
        """Every byte fed so far, BOM and line ends included (for attempt accounting)."""
        return self._bytes_received

    @property
    def had_unterminated_event(self) -> bool:
        """After ``close()``: True when a partial line or an undispatched event was thrown
        away, i.e. the body was cut mid-event. (After a decoding error the exception says it.)"""
        return self._had_unterminated

    @property
    def last_event_id(self) -> str | None:
        return self._last_event_id

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Events completed by this chunk, in order.

        A line, or an event's data, longer than ``max_line_bytes`` (a stream of short ``data:``
        lines without a blank line is as unbounded as one long line) is an ``SSEError``; bytes
        that are not UTF-8 are a ``BodyDecodeError``. The stream is broken there, at its last
        good event: the events completed before the bad line in the same chunk are returned,
        the error is set on ``self.error`` for the caller to raise once it has applied them,
        and the decoder is finished (the next ``feed`` raises it). With nothing good before
        it, the error is raised at once.
        """
        if self._closed:
            raise self.error or SSEError("SSEDecoder.feed() called after close() or after a decoding error")
        if not chunk:
            return []
        self._bytes_received += len(chunk)
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                self._text_offset += 1
                chunk = chunk[1:]
                if not chunk:
                    return []
        data = self._partial + chunk if self._partial else chunk
        if self._at_start:
            if len(data) < 3 and _BOM.startswith(data):
                self._partial = data  # could still be a BOM: wait for more bytes
                return []
            self._at_start = False
            if data.startswith(_BOM):
                data = data[3:]
                self._text_offset += 3

        # The last line end in this data; the rest is a partial line for later.
        end = data.rfind(b"\n")
        cr = data.find(b"\r", end + 1) if end >= 0 else data.find(b"\r")
        if cr >= 0:  # a CR after the last LF (rare: CR or CRLF streams)
            end = data.rfind(b"\r")
        if end < 0:
            if len(data) > self._max_line_bytes:
                return self._fail([], self._long("line"))  # (raises: nothing good before it)
            self._partial = data
            return []
        cut = end + 1
        offset = self._text_offset
        self._text_offset = offset + cut
        if cut == len(data):
            complete = data
            self._partial = b""
        else:
            complete = data[:cut]
            rest = data[cut:]
            self._partial = rest
            if len(rest) > self._max_line_bytes:
                return self._feed_broken(complete, offset, self._long("line"))
        # (the fast path: one length test and one decode per chunk; the slow one only on failure)
        if len(complete) > self._max_line_bytes and max(map(len, complete.splitlines())) > self._max_line_bytes:
            return self._feed_broken(complete, offset, None)
        try:
            text = complete.decode("utf-8")
        except UnicodeDecodeError:
            return self._feed_broken(complete, offset, None)
        if "\r" in text:
            if not self._partial and text[-1] == "\r":
                self._skip_lf = True  # the LF of a CRLF may start the next chunk
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        lines.pop()  # the empty string after the final line end
        return self._process(lines)

    def _feed_broken(self, complete: bytes, offset: int, error: StreamRecoverError | None) -> list[SSEEvent]:
        """The complete lines ``complete`` (from stream offset ``offset``) hold a line too long or
        bytes that are not UTF-8, or the partial line after them is too long (``error``): the
        events of the good lines before the first bad one, the decoder finished with the
        first error set (see ``feed``)."""
        limit = self._max_line_bytes
        if len(complete) > limit:
            good = 0
            for line in complete.splitlines(keepends=True):
                if len(line.rstrip(b"\r\n")) > limit:
                    complete = complete[:good]
                    error = self._long("line")
                    break
                good += len(line)
        try:
            text = complete.decode("utf-8")
        except UnicodeDecodeError as exc:
            # the lines that end before the bad byte are whole UTF-8: kept
            good = max(complete.rfind(b"\n", 0, exc.start), complete.rfind(b"\r", 0, exc.start)) + 1
            text = complete[:good].decode("utf-8")
            error = BodyDecodeError(f"SSE body is not valid UTF-8 at byte offset {offset + exc.start}: {exc.reason}")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        lines.pop()
        events = self._process(lines)
        if self.error is None:  # (not an event too long before it: that one came first)
            assert error is not None, "called for a broken stream"
            self._fail(events, error)
        return events

    def close(self) -> list[SSEEvent]:
        """End of body. An unterminated event is discarded, as the spec says; see
        ``had_unterminated_event``. Always returns []."""
        if not self._closed:
            self._closed = True
            self._had_unterminated = bool(self._partial) or self._pending_fields
            self._partial = b""
            self._data = []
            self._data_bytes = 0
            self._event_type = ""
            self._event_retry = None
            self._pending_fields = False
        return []

    def _long(self, what: str) -> SSEError:
        # an event's data is counted in characters (no second encode in the hot loop)
        unit = "characters" if what == "event" else "bytes"
        return SSEError(f"SSE {what} exceeds {self._max_line_bytes} {unit}")

    def _fail(self, events: list[SSEEvent], error: StreamRecoverError) -> list[SSEEvent]:
        """Finish the decoder with ``error`` set: ``events`` (those before it) go back to the
        caller, or with none, ``error`` is raised."""
        self._partial = b""
        self._data = []
        self._data_bytes = 0
        self._closed = True
        self.error = error
        if not events:
            raise error
        return events

    def _process(self, lines: list[str]) -> list[SSEEvent]:
        """Interpret complete lines. The hot loop: common lines first, kept flat."""
        out: list[SSEEvent] = []
        data = self._data
        size = self._data_bytes
        limit = self._max_line_bytes
        event_type = self._event_type
        pending = self._pending_fields
        for line in lines:
            if not line:  # blank line: dispatch
                if data:
                    # SSEEvent(...), built the fast way (see _object_new below)
                    event = _object_new(SSEEvent)
                    _set_event(event, event_type or _DEFAULT_EVENT)
                    _set_data(event, "\n".join(data))
                    _set_id(event, self._last_event_id)
                    _set_retry(event, self._event_retry)
                    out.append(event)
                    data = []
                    size = 0
                event_type = ""
                self._event_retry = None
                pending = False
            elif line[:6] == "data: ":
                data.append(line[6:])
                pending = True
                size += len(line)
                if size > limit:
                    return self._fail(out, self._long("event"))
            elif line[:7] == "event: ":
                event_type = line[7:]
                pending = True
            else:
                name, _, value = line.partition(":")
                if not name:  # a comment
                    continue
                if value[:1] == " ":
                    value = value[1:]
                pending = True
                if name == "data":
                    data.append(value)
                    size += len(line)
                    if size > limit:
                        return self._fail(out, self._long("event"))
                elif name == "event":
                    event_type = value
                elif name == "id":
                    if "\0" not in value:
                        self._last_event_id = value or None
                elif name == "retry" and value.isascii() and value.isdigit():
                    self._event_retry = self.retry = int(value)
                # other fields are ignored
        self._data = data
        self._data_bytes = size
        self._event_type = event_type
        self._pending_fields = pending
        return out


# Events are built as ``object.__new__`` + the slot descriptors: half the cost of
# ``SSEEvent(...)``, whose frozen ``__init__`` goes through ``object.__setattr__`` per field
# (it was the largest single cost of decoding). Same object, same equality and hash.
_object_new = object.__new__
_set_event = vars(SSEEvent)["event"].__set__
_set_data = vars(SSEEvent)["data"].__set__
_set_id = vars(SSEEvent)["id"].__set__
_set_retry = vars(SSEEvent)["retry"].__set__
