"""Just enough HTTP/1.1 for a fake provider whose faults are exact at the byte level.

Written on asyncio streams rather than a framework so that a response can stop anywhere:
inside a chunk, before the terminating zero-length chunk, or before the status line.
Every response closes the connection (no keep-alive). A ``Responder`` is where the server
writes one response; ``H1Responder`` writes it here, ``http2.H2Responder`` on an HTTP/2 stream.
"""

from __future__ import annotations

import asyncio
import http
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
LAST_CHUNK = b"0\r\n\r\n"
_REASONS = {529: "Overloaded"}


class BadHTTPRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HTTP2Preface(Exception):
    """The connection opened with the HTTP/2 preface (prior knowledge): not HTTP/1.1."""


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased
    body: bytes


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request, or None when the peer closed before sending one."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise BadHTTPRequest(400, "incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise BadHTTPRequest(431, "request header fields too large") from None
    if head == b"PRI * HTTP/2.0\r\n\r\n" and await reader.readexactly(6) == b"SM\r\n\r\n":
        raise HTTP2Preface
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadHTTPRequest(400, "malformed request line")
    method, target, _ = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise BadHTTPRequest(400, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    path, _, query = target.partition("?")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            raise BadHTTPRequest(400, "bad content-length") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise BadHTTPRequest(413, "request body too large")
        body = await reader.readexactly(length)
    return Request(method.upper(), path, dict(urllib.parse.parse_qsl(query)), headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError:
            raise BadHTTPRequest(400, "bad chunk size") from None
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return bytes(body)
        if len(body) + size > MAX_BODY_BYTES:
            raise BadHTTPRequest(413, "request body too large")
        body += await reader.readexactly(size)
        await reader.readexactly(2)


def response_head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = _REASONS.get(status, "Unknown")
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{name}: {value}" for name, value in headers), "", ""]
    return "\r\n".join(lines).encode("latin-1")


def full_response(status: int, headers: Iterable[tuple[str, str]], body: bytes, content_type: str) -> bytes:
    """A complete non-streaming response (Content-Length, then the connection closes)."""
    all_headers = [("content-type", content_type), ("content-length", str(len(body))), ("connection", "close")]
    return response_head(status, [*all_headers, *headers]) + body


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Responder(Protocol):
    """Where one response goes: an HTTP/1.1 connection, or one HTTP/2 stream. A response
    that returns without ``end_stream`` is cut: the connection is closed under it."""

    async def full(self, status: int, headers: Iterable[tuple[str, str]], body: bytes, content_type: str) -> None:
        """A complete non-streaming response."""

    async def head(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        """The status and headers of a streamed body."""

    async def data(self, data: bytes, *, end_stream: bool = False) -> None:
        """Body bytes; ``end_stream`` ends the body cleanly after them."""

    def closing(self) -> bool:
        """The peer is gone: stop writing."""

    async def goaway(self) -> None:
        """HTTP/2: tell the client the connection is going away (GOAWAY), then close it."""


class H1Responder:
    """A response on an HTTP/1.1 connection: chunked body, ``Connection: close``."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def full(self, status: int, headers: Iterable[tuple[str, str]], body: bytes, content_type: str) -> None:
        self.writer.write(full_response(status, headers, body, content_type))

    async def head(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        framing = [("transfer-encoding", "chunked"), ("connection", "close")]
        self.writer.write(response_head(status, [*framing, *headers]))

    async def data(self, data: bytes, *, end_stream: bool = False) -> None:
        self.writer.write((chunk(data) if data else b"") + (LAST_CHUNK if end_stream else b""))
        await self.writer.drain()

    def closing(self) -> bool:
        return self.writer.is_closing()

    async def goaway(self) -> None:
        """HTTP/1.1 has no GOAWAY: the connection just closes (a cut)."""
