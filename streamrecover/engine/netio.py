"""An httpcore network backend on asyncio's own transports, for the hot read path of a stream.

httpcore's default backend reads through anyio: every read opens a cancel scope for its
timeout, and anyio's stream pauses the transport after each chunk and resumes it on the next
read (two ``epoll_ctl`` system calls and an extra loop wake-up per chunk). A provider sends
one chunk per event, so that was paid per delta. Here the transport keeps reading into a
small queue; a read takes what is there, or waits on one future, timed out by one lazy timer
per connection (the idle window). Reading pauses only when a megabyte is waiting unread.

Exceptions are httpcore's own (``ReadTimeout``, ``ReadError``...), which httpx maps as
usual, so ``transport.classify_transport_error`` sees the same errors as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

SOCKET_OPTION = tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
PAUSE_READING_AT = 1 << 20  # bytes read but not yet taken: stop reading until they are


class _Protocol(asyncio.Protocol):
    """Buffers what the transport reads and wakes the one waiting reader."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        # Received, not yet read: ``chunk`` (b"": none), then ``more`` in order, a deque made only while
        # two chunks or more wait (an empty deque is 760 bytes, per connection: one per run).
        self.chunk = b""
        self.more: deque[bytes] | None = None
        self.buffered = 0
        self.eof = False
        self.error: BaseException | None = None
        self.reading_paused = False
        self.waiter: asyncio.Future[None] | None = None
        self.writing_paused = False
        self.drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.chunk:
            self.chunk = data
        else:
            if self.more is None:
                self.more = deque()
            self.more.append(data)
        self.buffered += len(data)
        if self.buffered >= PAUSE_READING_AT and self.transport is not None and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        # Keep our half open (plain TCP; asyncio's TLS closes it whatever this says): a server
        # that half-closes after its last frames (an HTTP/2 GOAWAY) still reads, and HTTP/2 may
        # answer those frames (a window update, a settings ack) before it reads them. Closing
        # here failed that write and lost the frames that had arrived (httpcore's own backend
        # keeps the half open too). httpcore closes the connection once it reads the end.
        return self.transport is not None and self.transport.get_extra_info("ssl_object") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection: reads from the protocol's queue, writes straight to the transport.

    A read's timeout is one lazy timer per connection, not one per read: a read sets its
    deadline, and the timer, when it fires early (a later read moved the deadline), moves
    itself to the deadline. A ``call_later`` and its ``cancel`` per chunk were a few percent of
    a busy worker."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._deadline: float | None = None  # when the waiting read times out (None: no limit)
        self._timer: asyncio.TimerHandle | None = None

    def _check_deadline(self) -> None:
        self._timer = None
        waiter, deadline = self._protocol.waiter, self._deadline
        if waiter is None or waiter.done() or deadline is None:
            return  # no read waiting: the next one arms the timer again
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline:
            waiter.set_exception(httpcore.ReadTimeout("timed out"))
        else:
            self._timer = loop.call_at(deadline, self._check_deadline)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        if not protocol.chunk and not protocol.eof:
            loop = asyncio.get_running_loop()
            waiter = protocol.waiter = loop.create_future()
            if timeout is not None:
                self._deadline = deadline = loop.time() + timeout
                if self._timer is None or self._timer.when() > deadline:
                    if self._timer is not None:
                        self._timer.cancel()
                    self._timer = loop.call_at(deadline, self._check_deadline)
            else:
                self._deadline = None
            try:
                await waiter
            finally:
                protocol.waiter = None
        chunk = protocol.chunk
        if not chunk:
            if protocol.error is not None:
                raise httpcore.ReadError(str(protocol.error) or type(protocol.error).__name__)
            return b""
        if len(chunk) > max_bytes:
            protocol.chunk = chunk[max_bytes:]
            chunk = chunk[:max_bytes]
        elif protocol.more:
            protocol.chunk = protocol.more.popleft()
        else:
            protocol.chunk, protocol.more = b"", None
        protocol.buffered -= len(chunk)
        if protocol.reading_paused and protocol.buffered < PAUSE_READING_AT // 2:
            protocol.reading_paused = False
            self._transport.resume_reading()
        return chunk

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        protocol = self._protocol
        if self._transport.is_closing() or (protocol.eof and protocol.error is not None):
            raise httpcore.WriteError("the connection is closed")
        self._transport.write(buffer)
        if not protocol.writing_paused:
            return
        protocol.drained = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await protocol.drained
        except TimeoutError:
            raise httpcore.WriteTimeout("timed out") from None
        finally:
            protocol.drained = None
        if self._transport.is_closing():
            raise httpcore.WriteError("the connection is closed")

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport.close()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport, self._protocol, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError:
            self._transport.close()
            raise httpcore.ConnectTimeout("TLS handshake timed out") from None
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore.ConnectError(str(exc)) from exc
        if transport is None:
            raise httpcore.ConnectError("the connection closed during the TLS handshake")
        assert isinstance(transport, asyncio.Transport)
        self._protocol.transport = transport
        return AsyncioStream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        if info == "is_readable":  # an idle pooled connection that has data or EOF is unusable
            return bool(self._protocol.chunk) or self._protocol.eof or self._transport.is_closing()
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """``connect_tcp`` / ``connect_unix_socket`` on the running asyncio loop."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = (local_address, 0) if local_address else None
        return await self._connect(
            lambda p: loop.create_connection(lambda: p, host, port, local_addr=local), timeout, socket_options
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[SOCKET_OPTION] | None = None
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        return await self._connect(lambda p: loop.create_unix_connection(lambda: p, path), timeout, socket_options)

    async def _connect(
        self, connect: Any, timeout: float | None, options: Iterable[SOCKET_OPTION] | None
    ) -> AsyncioStream:
        protocol = _Protocol()
        try:
            async with asyncio.timeout(timeout):
                transport, _ = await connect(protocol)
        except TimeoutError:
            raise httpcore.ConnectTimeout("connect timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        sock = transport.get_extra_info("socket")
        for option in options or ():
            sock.setsockopt(*option)
        return AsyncioStream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def use_asyncio_backend(client: httpx.AsyncClient) -> None:
    """Make ``client``'s direct connections use ``AsyncioBackend`` (proxied ones keep httpcore's).

    httpx takes no backend argument, so this sets its connection pool's; when a later httpx
    moves the attribute the client keeps its default backend and works as before.
    """
    pool = getattr(client._transport, "_pool", None)
    if isinstance(pool, httpcore.AsyncConnectionPool) and hasattr(pool, "_network_backend"):
        with contextlib.suppress(AttributeError):
            pool._network_backend = AsyncioBackend()
