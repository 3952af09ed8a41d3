"""What a worker keeps per run it holds, measured with tracemalloc: the hand-over to the loop, the
run's publisher and its provider connection keep no synchronisation objects or empty deques (760
bytes each) for the stream's time, and the response's headers are its own, not a copy."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

from streamrecover.engine.netio import AsyncioBackend
from streamrecover.engine.transport import HttpxTransport
from streamrecover.live.buffer import InMemoryFrameBuffer
from streamrecover.live.publisher import Publisher
from streamrecover.runs.holder import RunHolder
from streamrecover.runs.loop import run_on_shared_loop

COUNT = 50


def _growth(snapshot: tracemalloc.Snapshot, base: tracemalloc.Snapshot, filename: str = "") -> int:
    """Bytes grown between the snapshots (in ``filename``'s allocations only, when given)."""
    stats = snapshot.compare_to(base, "filename")
    return sum(s.size_diff for s in stats if filename in s.traceback[0].filename)


def _per_object(make: Callable[[], object], filename: str = "") -> float:
    """Bytes that ``make()`` allocates and its result keeps, per call (the first call is not counted:
    it warms caches and interned strings up)."""
    kept = [make()]
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.take_snapshot()
        kept.extend(make() for _ in range(COUNT))
        grown = _growth(tracemalloc.take_snapshot(), base, filename)
    finally:
        tracemalloc.stop()
    assert len(kept) == COUNT + 1
    return grown / COUNT


def test_a_run_held_on_the_loop_costs_the_holder_about_a_kilobyte() -> None:
    holder = RunHolder()

    async def make_gate() -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()

    gate = run_on_shared_loop(make_gate())

    async def run(claimed: Callable[[], None]) -> None:
        claimed()
        await gate

    try:
        # the run's task and coroutine included (about 1.2 KB); two threading.Events and a concurrent
        # future kept for the run's time made it 6.2 KB
        assert _per_object(lambda: holder.hand_over(run, limit=10 * COUNT)) < 2_500
    finally:
        gate.get_loop().call_soon_threadsafe(gate.set_result, None)
        assert holder.drain(timeout=10)


class _Outbox:
    def channel(self, run_id: str) -> str:
        return run_id


def test_a_publisher_with_an_outbox_keeps_no_queue_of_its_own() -> None:
    buffer = InMemoryFrameBuffer()

    def make() -> Publisher:
        return Publisher("0" * 32, buffer, None, coalesce_s=0.025, max_chars=1000, outbox=_Outbox())  # type: ignore[arg-type]

    # 0.9 KB; its empty deque made it 1.7 KB
    assert _per_object(make) < 1_300


async def test_a_connection_with_nothing_unread_keeps_no_queue() -> None:
    connected: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = AsyncioBackend()
    streams: list[Any] = [await backend.connect_tcp("127.0.0.1", port)]
    try:
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.take_snapshot()
            for _ in range(COUNT):
                streams.append(await backend.connect_tcp("127.0.0.1", port))
            grown = _growth(tracemalloc.take_snapshot(), base, "netio.py")
        finally:
            tracemalloc.stop()
        # the stream and protocol objects: 0.35 KB; an empty deque per connection made it 1.1 KB
        assert grown / COUNT < 700
    finally:
        for stream in streams:
            await stream.aclose()
        for writer in connected:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_the_response_headers_are_the_responses_own_and_read_in_any_case() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        await reader.readexactly(next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length")))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nRequest-Id: req_1\r\ncontent-length: 2\r\n\r\n\n\n"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, HttpxTransport() as transport:
        opened = await transport.open("POST", f"http://127.0.0.1:{port}/", {}, {"q": 1}, 5.0, 5.0)
        try:
            # HTTP's names are case-insensitive: a copy into a dict (1 KB per stream, held as long
            # as the stream) answered only to lower case
            assert opened.headers.get("Request-Id") == opened.headers.get("request-id") == "req_1"
            assert opened.headers.get("Content-Type") == "text/event-stream"
        finally:
            await opened.close()
