"""The engine's asyncio network backend for httpx: bodies arrive whole and in order (also past the
read-pause threshold), over TLS too, idle connections are reused, and a stall or a reset still
becomes the engine's idle_stall / connection_reset."""

from __future__ import annotations

import asyncio
import datetime
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest

from streamrecover.engine.errors import StreamInterrupted
from streamrecover.engine.netio import PAUSE_READING_AT, AsyncioBackend, use_asyncio_backend
from streamrecover.engine.transport import HttpxTransport

BODY = bytes(range(256)) * (3 * PAUSE_READING_AT // 256 + 7)  # three times the pause threshold


async def _serve(handler: object, ssl_context: ssl.SSLContext | None = None) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=ssl_context)  # type: ignore[arg-type]
    return server, server.sockets[0].getsockname()[1]


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    if length:
        await reader.readexactly(length)


async def test_a_body_larger_than_the_pause_threshold_arrives_whole_and_the_connection_is_reused() -> None:
    accepted = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        for _ in range(2):  # two requests on one kept-alive connection
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(BODY))
            for start in range(0, len(BODY), 65536):
                writer.write(BODY[start : start + 65536])
                await writer.drain()
        writer.close()

    server, port = await _serve(handler)
    async with server, HttpxTransport() as transport:
        for _ in range(2):
            opened = await transport.open("POST", f"http://127.0.0.1:{port}/", {}, {"q": 1}, 5.0, 5.0)
            received = bytearray()
            async for chunk in opened.chunks:
                await asyncio.sleep(0)  # a consumer slower than the socket: reading pauses
                received.extend(chunk)
            await opened.close()
            assert bytes(received) == BODY
    assert accepted == 1


async def test_a_stall_is_an_idle_stall_and_a_reset_a_connection_reset() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello")
        await writer.drain()
        await asyncio.sleep(3)
        writer.close()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello")
        await writer.drain()
        writer.transport.abort()

    for handler, cause in ((stall, "idle_stall"), (cut, "connection_reset")):
        server, port = await _serve(handler)
        async with server, HttpxTransport() as transport:
            opened = await transport.open("POST", f"http://127.0.0.1:{port}/", {}, {}, 0.3, 5.0)
            received = bytearray()

            async def drain(opened=opened, received=received) -> None:  # type: ignore[no-untyped-def]
                async for chunk in opened.chunks:
                    received.extend(chunk)

            with pytest.raises(StreamInterrupted) as caught:
                await drain()
            await opened.close()
            assert bytes(received) == b"hello"
            assert caught.value.cause.value == cause


async def test_a_steady_stream_never_times_out_and_a_stall_after_it_still_does() -> None:
    # The read timeout is one timer per connection that follows the last read's deadline: chunks
    # every 0.1 s for twice the 0.3 s idle window must not time out, the stall after them must.
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
        for _ in range(6):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.1)
        await asyncio.sleep(3)
        writer.close()

    server, port = await _serve(trickle)
    async with server, HttpxTransport() as transport:
        opened = await transport.open("POST", f"http://127.0.0.1:{port}/", {}, {}, 0.3, 5.0)
        received = bytearray()
        last = [0.0]
        loop = asyncio.get_running_loop()

        async def drain() -> None:
            async for chunk in opened.chunks:
                received.extend(chunk)
                last[0] = loop.time()

        with pytest.raises(StreamInterrupted) as caught:
            await drain()
        stalled_for = loop.time() - last[0]
        await opened.close()
    assert bytes(received) == b"x" * 6
    assert caught.value.cause.value == "idle_stall"
    assert 0.25 <= stalled_for < 2.0  # the idle window after the last chunk, not before or never


async def test_a_server_that_half_closes_is_still_written_to_and_its_last_bytes_read() -> None:
    # An HTTP/2 server ends with GOAWAY and closes its half; frames that arrived with the end
    # may call for a reply (a window update) before they are read. That write must go out and
    # the frames must still be read: failing it lost what had arrived (the sweep under load).
    heard = asyncio.get_running_loop().create_future()

    async def last_words(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"last frames")
        await writer.drain()
        writer.write_eof()
        heard.set_result(await reader.read())  # the client's reply, up to its close
        writer.close()

    server, port = await _serve(last_words)
    async with server:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=5)
        for _ in range(500):  # until the end of the server's half has arrived, unread
            if stream._protocol.eof:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.01)
        assert stream._protocol.eof, "the server's end never arrived: the case under test did not happen"  # type: ignore[attr-defined]
        await stream.write(b"window update", timeout=5)
        assert await stream.read(1024, timeout=5) == b"last frames"
        assert await stream.read(1024, timeout=5) == b""
        await stream.aclose()
        assert await asyncio.wait_for(heard, 5) == b"window update"


async def test_a_refused_connection_is_a_connect_error() -> None:
    server, port = await _serve(lambda r, w: None)
    server.close()
    await server.wait_closed()
    async with httpx.AsyncClient() as client:
        use_asyncio_backend(client)
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/")


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_with_alpn_over_the_asyncio_backend(tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    server_context.set_alpn_protocols(["http/1.1"])

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        body = datetime.date.today().isoformat().encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server, port = await _serve(handler, server_context)
    async with server:
        client = httpx.AsyncClient(http2=True, verify=ssl.create_default_context(cafile=str(cert)))
        use_asyncio_backend(client)
        async with client:
            response = await client.get(f"https://127.0.0.1:{port}/")
        assert response.text == datetime.date.today().isoformat()
        assert response.http_version == "HTTP/1.1"  # ALPN read from the asyncio TLS transport
    assert isinstance(client._transport._pool._network_backend, AsyncioBackend)  # type: ignore[attr-defined]
