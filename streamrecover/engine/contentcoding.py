"""A response body's content coding (gzip, deflate) undone a bounded slice at a time.

Providers are asked for ``Accept-Encoding: identity``; a server that compresses anyway gets
its body inflated here instead of by httpx, whose decoders have no size limit (a 64 KiB read
of a gzip bomb was 64 MiB in one piece, split by the SSE decoder in one synchronous pass that
held the event loop every run of the worker shares). Each piece is at most ``SLICE_BYTES``
and the loop runs other tasks between pieces, so a stream holds one slice, its consumer's line
limit (``MAX_LINE_BYTES``) applies before more is inflated, and a cancel or a deadline lands.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator

from .errors import InterruptCause, StreamInterrupted

SLICE_BYTES = 65_536  # the most one piece of an inflated body holds

_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


def codings(content_encoding: str | None) -> list[str]:
    """The codings of a ``Content-Encoding`` value in the order they were applied (identity dropped)."""
    values = (value.strip().lower() for value in (content_encoding or "").split(","))
    return [value for value in values if value and value != "identity"]


def unsupported(content_encoding: str | None) -> str | None:
    """The first coding of ``content_encoding`` this module cannot undo, or None."""
    return next((coding for coding in codings(content_encoding) if coding not in _WBITS), None)


def decoded(raw: AsyncIterator[bytes], content_encoding: str | None) -> AsyncIterator[bytes]:
    """``raw`` with every coding of ``content_encoding`` undone (the last applied first).

    An unsupported coding (``br``, ``zstd``: not asked for, not installed) or a corrupt body
    raises ``StreamInterrupted`` (``body_decode``) rather than passing bytes no parser can read.
    """
    other = unsupported(content_encoding)
    if other is not None:
        return _refused(raw, other)
    body = raw
    for coding in reversed(codings(content_encoding)):
        body = _inflate(body, coding)
    return body


async def _refused(raw: AsyncIterator[bytes], coding: str) -> AsyncIterator[bytes]:
    raise StreamInterrupted(
        InterruptCause.BODY_DECODE,
        f"the provider sent its body with Content-Encoding {coding!r} although asked for identity",
    )
    yield b""  # pragma: no cover  (makes this an async generator)


async def _inflate(raw: AsyncIterator[bytes], coding: str) -> AsyncIterator[bytes]:
    inflater = zlib.decompressobj(_WBITS[coding])
    # "deflate" is zlib-wrapped by the RFC, raw from some servers (httpx takes both): the wrapper's
    # two header bytes tell, so they are kept until then to be read again as raw deflate
    head: bytes | None = b"" if coding == "deflate" else None
    async for data in raw:
        pending = True
        while pending and not inflater.eof:
            if head is not None:
                head += data
            try:
                piece = inflater.decompress(data, SLICE_BYTES)
            except zlib.error as exc:
                if head is not None:
                    inflater, data, head = zlib.decompressobj(-zlib.MAX_WBITS), head, None
                    continue
                raise StreamInterrupted(InterruptCause.BODY_DECODE, f"the {coding} body is corrupt: {exc}") from exc
            if head is not None and len(head) >= 2:
                head = None
            data = inflater.unconsumed_tail
            # a full slice may leave output inside zlib with no input left: ask again for it
            pending = bool(data) or len(piece) == SLICE_BYTES
            if piece:
                yield piece
                await asyncio.sleep(0)  # the other runs on this loop go on between slices
