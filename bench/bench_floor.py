"""The floor of a stream's memory: a bare asyncio connection, an httpx client per stream, one shared client."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from streamrecover.engine.netio import use_asyncio_backend
from streamrecover.engine.transport import HttpxTransport, _ssl_context

REPO = Path(__file__).resolve().parent.parent
KINDS = ("bare", "httpx", "shared")
INTERVAL_S = 0.1  # between a stream's events: the pace of the 500-stream delivery load
LABELS = {
    "bare": "bare asyncio connection + task",
    "httpx": "httpx client per stream",
    "shared": "one shared httpx client",
}

HELP = """What a stream costs a process at the least, whatever it carries: N client connections
to a local server (its own process, so the measured one holds only the client side) that
streams an SSE-like chunked body slowly, each connection consumed by one task. Each measurement
is a fresh process: RSS (VmRSS) from before the streams open to mid-stream, with all N open and
each past a few events, over N; then, the streams closed, the same again under tracemalloc
(the Python objects they hold, per stream). Median over the repeats.

* bare: ``loop.create_connection`` with a protocol that keeps only the unread chunk and one
  future, a GET written by hand, one task reading the raw bytes (no ``StreamReader``).
* httpx: what a run does: its own ``HttpxTransport`` (an ``httpx.AsyncClient`` on the
  ``netio`` asyncio backend), a streaming POST, the body through ``aiter_raw``.
* shared: one ``httpx.AsyncClient`` (same backend, a pool of N connections) for every stream.

No assertion on the figures: ``make bench`` puts them beside the worker's memory per stream."""


@dataclass(frozen=True)
class Floor:
    kind: str
    streams: int
    rss: tuple[float, ...]  # RSS growth per stream in bytes, one per repeat
    objects: tuple[float, ...]  # tracemalloc's growth per stream in bytes, one per repeat

    @property
    def rss_per_stream(self) -> float:
        return statistics.median(self.rss)

    @property
    def objects_per_stream(self) -> float:
        return statistics.median(self.objects)


# ---- the server (its own process) -------------------------------------------------------------

EVENT = b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"word "}}\n\n'
CHUNK = f"{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def _serve(interval_s: float) -> None:
    """Answer every request with an endless chunked body, one event per stream every ``interval_s``."""
    writers: set[asyncio.StreamWriter] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            head = await reader.readuntil(b"\r\n\r\n")
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    await reader.readexactly(int(line.split(b":", 1)[1]))
            writer.write(HEAD)
            writers.add(writer)
            await reader.read()  # until the client closes
        writers.discard(writer)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=2048)
    print(server.sockets[0].getsockname()[1], flush=True)
    # One ticker for all the streams: the server's own cost stays small beside 500 clients.
    while True:
        await asyncio.sleep(interval_s)
        for writer in list(writers):
            if writer.is_closing():
                writers.discard(writer)
            else:
                writer.write(CHUNK)


# ---- one measurement (a fresh process) --------------------------------------------------------


def _vmrss() -> int:
    """This process's resident set, in bytes (/proc: what the delivery bench reads for a worker)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class _Reader(asyncio.Protocol):
    """The least a reader of a socket keeps: the chunk not yet read and the one waiting future."""

    __slots__ = ("chunk", "waiter")

    def __init__(self) -> None:
        self.chunk = b""
        self.waiter: asyncio.Future[None] | None = None

    def data_received(self, data: bytes) -> None:
        self.chunk += data
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def read(self) -> bytes:
        """The bytes received since the last read; b"" once the connection is gone."""
        if not self.chunk:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        chunk, self.chunk = self.chunk, b""
        return chunk


Consume = Callable[[list[int], int], Awaitable[None]]


def _consumers(kind: str, port: int, shared: httpx.AsyncClient | None) -> Consume:
    """The task body of one stream of ``kind``: read until cancelled, counting the chunks."""
    url = f"http://127.0.0.1:{port}/v1/messages"

    async def bare(counts: list[int], i: int) -> None:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(_Reader, "127.0.0.1", port)
        try:
            transport.write(f"GET /v1/messages HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n".encode())
            while await protocol.read():
                counts[i] += 1
        finally:
            transport.close()

    async def over_httpx(counts: list[int], i: int) -> None:
        async with HttpxTransport(shared) as transport:
            opened = await transport.open("POST", url, {}, {"stream": True}, 60.0, 30.0)
            try:
                async for _ in opened.chunks:
                    counts[i] += 1
            finally:
                await opened.close()

    return bare if kind == "bare" else over_httpx


async def _open_and_hold(kind: str, n: int, port: int, events: int) -> Callable[[], Awaitable[None]]:
    """Start ``n`` streams and wait until each has read ``events`` chunks; returns their closer."""
    shared = None
    if kind == "shared":
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        shared = httpx.AsyncClient(http2=True, limits=limits, verify=_ssl_context())
        use_asyncio_backend(shared)
    consume = _consumers(kind, port, shared)
    counts = [0] * n
    tasks = [asyncio.ensure_future(consume(counts, i)) for i in range(n)]
    deadline = time.monotonic() + 60
    while min(counts) < events:
        failed = [t for t in tasks if t.done()]
        if failed:
            failed[0].result()  # a stream that ended early: its error, not a figure
            raise RuntimeError("a stream ended before the measurement")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sum(c >= events for c in counts)} of {n} streams read {events} chunks in 60 s")
        await asyncio.sleep(0.02)

    async def close() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if shared is not None:
            await shared.aclose()

    return close


async def _measure(kind: str, n: int, port: int, events: int) -> dict[str, float]:
    # A warm-up pair first, as the delivery bench's warm-up run: imports, code paths and the
    # process-wide TLS context are paid before the base, as in a worker that has served a run.
    close = await _open_and_hold(kind, 2, port, 1)
    await close()
    gc.collect()
    base = _vmrss()
    close = await _open_and_hold(kind, n, port, events)
    gc.collect()
    rss = _vmrss() - base
    await close()
    # tracemalloc's own bookkeeping grows the RSS, so its count is a second round, after the first.
    gc.collect()
    tracemalloc.start()
    traced_base = tracemalloc.get_traced_memory()[0]
    close = await _open_and_hold(kind, n, port, events)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - traced_base
    tracemalloc.stop()
    await close()
    return {"rss_per_stream": rss / n, "objects_per_stream": traced / n}


# ---- the driver -------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _child(args: Sequence[str]) -> dict[str, float]:
    command = [sys.executable, "-m", "bench.bench_floor", *args]
    proc = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_floor {' '.join(args)} failed: {proc.stderr.strip()[-2000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def run(
    streams: Sequence[int],
    repeat: int = 3,
    kinds: Sequence[str] = KINDS,
    interval_s: float = INTERVAL_S,
    events: int = 3,
) -> list[Floor]:
    """Every kind at every count, ``repeat`` fresh processes each, against one server process."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kinds {sorted(unknown)}: choose among {', '.join(KINDS)}")
    command = [sys.executable, "-m", "bench.bench_floor", "--serve", "--interval", str(interval_s)]
    server = subprocess.Popen(command, cwd=REPO, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        if not port:
            raise RuntimeError("the bench_floor server did not start")
        samples: dict[tuple[str, int], list[dict[str, float]]] = {}
        # Repeats outermost: a burst of load on the host touches every kind alike.
        for _ in range(repeat):
            for n in streams:
                for kind in kinds:
                    args = ["--measure", kind, "--streams", str(n), "--port", port, "--events", str(events)]
                    samples.setdefault((kind, n), []).append(_child(args))
    finally:
        server.kill()
        server.wait()
    return [
        Floor(
            kind,
            n,
            tuple(s["rss_per_stream"] for s in samples[(kind, n)]),
            tuple(s["objects_per_stream"] for s in samples[(kind, n)]),
        )
        for n in streams
        for kind in kinds
    ]


def kib(values: Sequence[float]) -> str:
    """The median in KiB, with the range over the repeats when there are several."""
    median = f"{statistics.median(values) / 1024:.1f} KiB"
    if len(values) < 2:
        return median
    return f"{median} ({min(values) / 1024:.1f}–{max(values) / 1024:.1f})"


def table(floors: Sequence[Floor]) -> str:
    out = [
        "| streams | kind | RSS per stream, median (range) | Python objects per stream (tracemalloc), median (range) |",
        "|---|---|---|---|",
    ]
    out += [f"| {f.streams} | {LABELS[f.kind]} | {kib(f.rss)} | {kib(f.objects)} |" for f in floors]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="100,500", help="comma-separated stream counts")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per figure (the median is given)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between a stream's events")
    parser.add_argument("--events", type=int, default=3, help="events each stream reads before the measurement")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server process
    parser.add_argument("--measure", choices=KINDS, help=argparse.SUPPRESS)  # one measurement process
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        # The driver holds this process's stdin: its end (the driver exiting, even killed) ends the server.
        threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
        asyncio.run(_serve(args.interval))
        return 0
    if args.measure:
        print(json.dumps(asyncio.run(_measure(args.measure, int(args.streams), args.port, args.events))))
        return 0
    started = time.monotonic()
    floors = run(
        [int(n) for n in args.streams.split(",") if n],
        args.repeat,
        [k for k in args.kinds.split(",") if k],
        args.interval,
        args.events,
    )
    if args.json:
        medians = [{"rss_per_stream": f.rss_per_stream, "objects_per_stream": f.objects_per_stream} for f in floors]
        print(json.dumps([{**asdict(f), **m} for f, m in zip(floors, medians, strict=True)]))
    else:
        print(table(floors))
        print(f"\n{args.repeat} repeats, {time.monotonic() - started:.0f} s, load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
