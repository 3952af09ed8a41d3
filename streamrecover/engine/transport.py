"""HTTP streaming over httpx, with every failure turned into the engine's vocabulary.

httpx's read timeout is measured per socket read, which is exactly "no byte within the
idle window": an idle stall. A body that ends without its terminator is not an httpx
error at all; the runner detects that from the events.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from .contentcoding import decoded
from .errors import InterruptCause, StreamInterrupted
from .netio import use_asyncio_backend

MAX_ERROR_BODY_BYTES = 65_536


@dataclass(slots=True)
class OpenedStream:
    status: int
    headers: Mapping[str, str]
    chunks: AsyncIterator[bytes]  # raw body bytes; raises StreamInterrupted on transport failure
    close: Any  # async callable

    async def read_error_body(self) -> bytes:
        """A bounded read of an error response's body."""
        body = bytearray()
        with contextlib.suppress(StreamInterrupted):
            async for chunk in self.chunks:
                body.extend(chunk)
                if len(body) >= MAX_ERROR_BODY_BYTES:
                    break
        return bytes(body[:MAX_ERROR_BODY_BYTES])


class ConnectFailed(Exception):
    """No response at all (connect error or timeout): retryable before the stream starts."""


def classify_transport_error(exc: BaseException) -> InterruptCause:
    """Map an httpx error raised while reading the body to an interrupt cause."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.ReadTimeout):
        return InterruptCause.IDLE_STALL
    if "GOAWAY" in text or "ConnectionTerminated" in text:
        return InterruptCause.GOAWAY
    if isinstance(exc, httpx.DecodingError):
        return InterruptCause.BODY_DECODE
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.NetworkError | httpx.WriteError):
        return InterruptCause.CONNECTION_RESET
    return InterruptCause.UNKNOWN


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One TLS context per process: building one loads the CA bundle (milliseconds of CPU),
    and every run's client would build its own at each attempt."""
    return httpx.create_ssl_context()


class HttpxTransport:
    """Opens one streaming POST per attempt. Shares one ``httpx.AsyncClient``.

    Speaks HTTP/2 to servers that offer it (ALPN over TLS), HTTP/1.1 otherwise;
    ``http2_prior_knowledge`` speaks HTTP/2 without asking (cleartext h2c, as the fake
    provider's HTTP/2 mode does). A GOAWAY that ends a stream is the ``goaway`` cause.
    """

    def __init__(self, client: httpx.AsyncClient | None = None, *, http2_prior_knowledge: bool = False) -> None:
        self._client = client
        self._owned = client is None
        self._prior_knowledge = http2_prior_knowledge

    async def __aenter__(self) -> HttpxTransport:
        if self._client is None:
            self._client = httpx.AsyncClient(http2=True, http1=not self._prior_knowledge, verify=_ssl_context())
            use_asyncio_backend(self._client)  # no anyio cancel scope and pause/resume per chunk
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._owned and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def open(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        json_body: dict[str, Any],
        idle_timeout_s: float,
        connect_timeout_s: float,
    ) -> OpenedStream:
        if self._client is None:
            await self.__aenter__()
        assert self._client is not None
        timeout = httpx.Timeout(connect=connect_timeout_s, read=idle_timeout_s, write=connect_timeout_s, pool=None)
        # a GET (a native resume's re-attach) carries no body
        body = None if method == "GET" else json_body
        request = self._client.build_request(method, url, headers=dict(headers), json=body, timeout=timeout)
        # httpx asks for gzip by default and inflates it without a limit; SSE from the real APIs
        # is not compressed anyway. A server that compresses regardless is inflated in bounded
        # slices (``contentcoding``).
        request.headers["accept-encoding"] = "identity"
        try:
            response = await self._client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
        except httpx.TransportError as exc:  # e.g. the server closed before any header
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in decoded(response.aiter_raw(), response.headers.get("content-encoding")):
                    yield chunk
            except httpx.HTTPError as exc:
                cause = classify_transport_error(exc)
                raise StreamInterrupted(cause, f"{type(exc).__name__}: {exc}") from exc

        return OpenedStream(
            status=response.status_code,
            headers=response.headers,  # not a copy: the response keeps its own for the stream's time
            chunks=chunks(),
            close=response.aclose,
        )
