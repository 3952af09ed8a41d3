"""Just enough HTTP/1.1 for a fake provider whose faults are exact at the byte level.

Written on asyncio streams rather than a framework so that a response can stop anywhere:
inside a chunk, before the terminating zero-length chunk, or before the status line.
Every response closes the connection (no keep-alive).
"""

from __future__ import annotations

import asyncio
import http
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
LAST_CHUNK = b"0\r\n\r\n"
_REASONS = {529: "Overloaded"}


class BadHTTPRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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
