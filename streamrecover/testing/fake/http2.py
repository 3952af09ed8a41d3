"""HTTP/2 for the fake provider: cleartext with prior knowledge (h2c), one task per stream.

A connection that opens with the HTTP/2 preface is served here instead of by ``http11``,
with the same answers and faults: a response that ends without ``end_stream`` (a cut)
closes the whole connection, as a network failure would, and the ``goaway`` fault sends
GOAWAY in the middle of a stream, then closes the connection. Flow control is honoured.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from .http11 import Request, Responder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
LINGER_S = 2.0  # after closing our side, how long the client may take to close its own
POLL_S = 0.2  # how often an idle connection looks whether a stream closed it
_HOP_BY_HOP = {"connection", "transfer-encoding", "keep-alive", "upgrade", "proxy-connection"}

Handler = Callable[[Request, Responder], Awaitable[None]]


class H2ServerConnection:
    """Serves one HTTP/2 connection; ``handler`` answers each request on its own stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
        self.reader = reader
        self.writer = writer
        self.handler = handler
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config=config)
        self.closed = False
        self.window = asyncio.Event()
        self._requests: dict[int, tuple[list[tuple[str, str]], bytearray]] = {}
        self._streams: dict[int, asyncio.Task[None]] = {}

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def abort(self) -> None:
        """Close the connection under every stream (a cut, or the end after a GOAWAY).

        Only our side is closed (FIN); the connection is read on until the client closes it
        (``LINGER_S`` at most). Closing a socket with unread bytes from the client (its
        window updates) would reset it, and the reset can overtake the GOAWAY frame."""
        self.closed = True
        self.window.set()
        if self.writer.can_write_eof() and not self.writer.is_closing():
            with contextlib.suppress(OSError):
                self.writer.write_eof()
                return
        self.writer.close()

    async def serve(self, first: bytes = PREFACE) -> None:
        self.h2.initiate_connection()
        self.flush()
        data = first
        loop = asyncio.get_running_loop()
        linger_until: float | None = None
        try:
            while True:
                if data and not self.closed:
                    try:
                        events = self.h2.receive_data(data)
                    except h2.exceptions.ProtocolError:
                        self.flush()
                        break
                    for event in events:
                        self._on_event(event)
                    self.flush()
                    await self.writer.drain()
                if self.closed and linger_until is None:
                    linger_until = loop.time() + LINGER_S
                timeout = POLL_S if linger_until is None else linger_until - loop.time()
                if timeout <= 0:
                    break
                try:
                    data = await asyncio.wait_for(self.reader.read(65536), timeout)
                except TimeoutError:
                    data = b""
                    continue
                if not data:
                    break
        finally:
            self.closed = True
            self.window.set()
            tasks = list(self._streams.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _forget(self, stream_id: int, _task: asyncio.Task[None]) -> None:
        """A stream's response is over: its task is no longer one to cancel."""
        self._streams.pop(stream_id, None)

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            headers = [(str(k), str(v)) for k, v in event.headers or []]
            self._requests[event.stream_id] = (headers, bytearray())
        elif isinstance(event, h2.events.DataReceived):
            pending = self._requests.get(event.stream_id)
            if pending is not None and event.data:
                pending[1].extend(event.data)
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            received = self._requests.pop(event.stream_id, None)
            if received is not None:
                task = asyncio.ensure_future(self._respond(event.stream_id, _request(*received)))
                self._streams[event.stream_id] = task
                task.add_done_callback(functools.partial(self._forget, event.stream_id))
        elif isinstance(event, h2.events.StreamReset):
            running = self._streams.get(event.stream_id)
            if running is not None:
                running.cancel()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self.window.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.closed = True

    async def _respond(self, stream_id: int, request: Request) -> None:
        responder = H2Responder(self, stream_id)
        with contextlib.suppress(ConnectionError, h2.exceptions.StreamClosedError):
            await self.handler(request, responder)
        if not responder.ended and not self.closed:
            self.abort()


class H2Responder:
    """One response on one HTTP/2 stream."""

    def __init__(self, connection: H2ServerConnection, stream_id: int) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.ended = False

    async def full(self, status: int, headers: Iterable[tuple[str, str]], body: bytes, content_type: str) -> None:
        await self.head(status, [("content-type", content_type), ("content-length", str(len(body))), *headers])
        await self.data(body, end_stream=True)

    async def head(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        if self.closing():
            return
        fields = [(":status", str(status))]
        fields += [(name.lower(), value) for name, value in headers if name.lower() not in _HOP_BY_HOP]
        self.connection.h2.send_headers(self.stream_id, fields)
        self.connection.flush()

    async def data(self, data: bytes, *, end_stream: bool = False) -> None:
        conn = self.connection
        view = memoryview(data)
        while view and not self.closing():
            size = min(conn.h2.local_flow_control_window(self.stream_id), conn.h2.max_outbound_frame_size, len(view))
            if size <= 0:
                conn.window.clear()
                await conn.window.wait()
                continue
            conn.h2.send_data(self.stream_id, bytes(view[:size]))
            view = view[size:]
            conn.flush()
        if end_stream and not self.closing():
            conn.h2.end_stream(self.stream_id)
            self.ended = True
            conn.flush()
        if not conn.writer.is_closing():
            await conn.writer.drain()

    def closing(self) -> bool:
        return self.connection.closed or self.connection.writer.is_closing()

    async def goaway(self) -> None:
        conn = self.connection
        if self.closing():
            return
        conn.h2.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR, last_stream_id=self.stream_id)
        conn.flush()
        with contextlib.suppress(ConnectionError):
            await conn.writer.drain()
        conn.abort()


def _request(headers: list[tuple[str, str]], body: bytearray) -> Request:
    pseudo = {k: v for k, v in headers if k.startswith(":")}
    target = pseudo.get(":path", "/")
    path, _, query = target.partition("?")
    plain = {k.lower(): v for k, v in headers if not k.startswith(":")}
    return Request(pseudo.get(":method", "GET").upper(), path, dict(urllib.parse.parse_qsl(query)), plain, bytes(body))
