"""A provider is asked for an uncompressed stream; one compressed regardless (a gzip bomb: a few
hundred kilobytes on the wire, gigabytes inflated) is inflated a bounded slice at a time, with the
other runs of the loop going on between slices, and broken at ``MAX_LINE_BYTES`` like any long line."""

from __future__ import annotations

import asyncio
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest

from streamrecover.engine.agent import RunResult, run_agent
from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import InMemoryCheckpointStore
from streamrecover.engine.contentcoding import SLICE_BYTES, decoded
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest, ProviderConfig
from streamrecover.engine.errors import StreamInterrupted
from streamrecover.engine.sink import CollectingSink
from streamrecover.engine.transport import HttpxTransport
from streamrecover.providers.registry import get_adapter

from .harness import FAST, user
from .scripted_upstream import ScriptedUpstream, anthropic_stream

MIB = 1024 * 1024


def gzip(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return packer.compress(data) + packer.flush()


def deflate(data: bytes, wbits: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return packer.compress(data) + packer.flush()


async def pieces(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def inflate(data: bytes, encoding: str, size: int = 65_536) -> list[bytes]:
    return [piece async for piece in decoded(pieces(data, size), encoding)]


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    served = ScriptedUpstream()
    yield served
    served.close()


async def run_against(upstream: ScriptedUpstream, max_line_bytes: int = MIB) -> tuple[RunResult, CollectingSink]:
    sink = CollectingSink()
    ctx = RunContext(
        run_id=uuid.uuid4().hex,
        adapter=get_adapter(ProviderConfig(name="anthropic", base_url=upstream.url, api_key="sk-test")),
        config=replace(FAST, max_continuations=0, max_line_bytes=max_line_bytes),
        sink=sink,
        checkpoints=InMemoryCheckpointStore(),
        cancel=CancelToken(),
    )
    request = ModelRequest(model="claude-x", messages=[user("hi")], max_tokens=100)
    return await run_agent(ctx, request), sink


async def test_a_provider_is_asked_for_an_uncompressed_stream(upstream: ScriptedUpstream) -> None:
    upstream.responses = {"/v1/messages": anthropic_stream("Hello")}
    result, _ = await run_against(upstream)
    assert result.status == "completed"
    sent = {name.lower(): value for name, value in upstream.requests[-1]["headers"].items()}
    assert sent["accept-encoding"] == "identity"


async def test_a_stream_compressed_regardless_is_streamed_as_it_would_be_plain(upstream: ScriptedUpstream) -> None:
    upstream.responses = {"/v1/messages": gzip(anthropic_stream("Hello there, compressed"))}
    upstream.headers = {"content-encoding": "gzip"}
    result, sink = await run_against(upstream)
    assert result.status == "completed"
    assert result.messages[-1]["content"][0]["text"] == "Hello there, compressed"
    assert sink.attempts[0].bytes_received == len(anthropic_stream("Hello there, compressed"))


async def test_a_gzip_bomb_is_broken_at_the_line_limit_having_inflated_one_slice_past_it(
    upstream: ScriptedUpstream,
) -> None:
    """64 KiB on the wire, 64 MiB inflated, one line: the attempt stops at ``MAX_LINE_BYTES`` (1 MiB)
    having read no more than one slice past it (httpx inflated a whole 64 KiB read at once: 64 MiB)."""
    upstream.responses = {"/v1/messages": gzip(b"data: " + b"a" * (64 * MIB))}
    upstream.headers = {"content-encoding": "gzip"}
    result, sink = await run_against(upstream)
    assert result.status == "exhausted"
    (attempt,) = sink.attempts
    assert attempt.interrupt_cause == "sse_parse"
    assert "SSE line exceeds 1048576 bytes" in (attempt.error_message or "")
    assert attempt.bytes_received <= MIB + SLICE_BYTES


async def test_inflating_gives_bounded_slices_and_lets_the_loop_run_between_them(upstream: ScriptedUpstream) -> None:
    """Short lines (comments: nothing for the line limit to catch) inflated from a body a thousand
    times smaller: no piece is larger than a slice, and another task runs between every two."""
    body = b": keep-alive\n" * (8 * MIB // 13)
    upstream.responses = {"/v1/messages": gzip(body)}
    upstream.headers = {"content-encoding": "gzip"}
    turns = 0

    async def other_run() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.ensure_future(other_run())
    sizes: list[int] = []
    starved = 0
    async with HttpxTransport() as transport:
        opened = await transport.open("POST", upstream.url + "/v1/messages", {}, {}, 10.0, 10.0)
        async for chunk in opened.chunks:
            sizes.append(len(chunk))
            starved += turns == 0 and len(sizes) > 1
            turns = 0
        await opened.close()
    other.cancel()
    assert sum(sizes) == len(body)
    assert max(sizes) <= SLICE_BYTES
    assert starved == 0


async def test_gzip_and_both_deflates_inflate_exactly_however_the_body_is_cut() -> None:
    data = b"".join(b'data: {"n": %d, "text": "a line of an event stream"}\n\n' % n for n in range(3_000))
    assert len(data) > 2 * SLICE_BYTES
    for encoding, packed in (
        ("gzip", gzip(data)),
        ("x-gzip", gzip(data)),
        ("deflate", deflate(data, zlib.MAX_WBITS)),
        ("deflate", deflate(data, -zlib.MAX_WBITS)),  # raw deflate, as some servers send it
        ("gzip, deflate", deflate(gzip(data), zlib.MAX_WBITS)),
        ("identity", data),
    ):
        for size in (1, 7, 4096, len(packed)) if encoding != "identity" else (4096,):
            out = await inflate(packed, encoding, size)
            assert b"".join(out) == data, (encoding, size)
            assert max(map(len, out)) <= max(SLICE_BYTES, size if encoding == "identity" else 0)


async def test_a_corrupt_or_unsupported_body_is_a_body_decode_interruption() -> None:
    corrupt = bytearray(gzip(b"data: x\n\n" * 1000))
    corrupt[20:30] = b"\xff" * 10
    for packed, encoding, says in ((bytes(corrupt), "gzip", "corrupt"), (b"\x1b\x00", "br", "'br'")):
        with pytest.raises(StreamInterrupted) as raised:
            await inflate(packed, encoding)
        assert raised.value.cause == "body_decode"
        assert says in raised.value.message
