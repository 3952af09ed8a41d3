"""Live delivery: many concurrent runs from Celery workers through Redis and Daphne to
WebSocket clients, with the CPU each process spent and where the time went.

Everything is real and separate, as in production: PostgreSQL, Redis, the fake provider in
its own process (``manage.py streamrecover_fake_provider``, reached through
``STREAMRECOVER_FAKE_URL``), one Daphne process, Celery worker process(es) (threads pool),
and this process as N WebSocket clients (the ``websockets`` package). Workers run with
``STREAMRECOVER_FRAME_TIMESTAMPS=1``, so each frame says when its first delta reached the
publisher (``in``) and when it was published (``out``). Reported per configuration:

* deltas/s received by all clients vs offered (streams / the fake's gap between events);
* publish -> client and first delta -> client latency, p50/p99/max;
* CPU seconds per process (workers, Daphne, fake provider, clients, Redis, PostgreSQL) over
  the measured phase, and CPU microseconds per delivered delta in the workers and Daphne;
* worker memory per active stream (peak RSS growth / streams) against the stream's text;
* checkpoint writes per second per run;
* that every client rebuilt exactly the committed messages (the invariant, under load).

``--profile`` samples every thread of the workers (``bench.sampler``) and prints the top.
Run: ``python -m bench.bench_delivery --help``. Needs PostgreSQL and Redis as for the tests;
the database and Redis db come from ``BENCH_DATABASE_URL`` / ``BENCH_REDIS_URL`` (defaults:
``streamrecover_bench`` and Redis db 13).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parent.parent
DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/streamrecover_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
TERMINAL = ("completed", "failed", "exhausted", "cancelled")
DELTA_TYPES = ("text_delta", "thinking_delta", "tool_call_delta")


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    runs: int
    words: int
    event_delay: float
    coalesce_ms: float = 25
    fault_every: int = 0  # every n-th run has its connection cut once (R1); 0: none
    workers: int = 1
    concurrency: int = 16  # Celery pool threads per worker: a run holds none once claimed
    layer: str = "pubsub"  # "core": the core channels_redis layer (the per-token baseline)

    @property
    def max_runs(self) -> int:
        """``WORKER_MAX_RUNS`` of each worker: every run has a place at once."""
        return -(-self.runs // self.workers)


@dataclass(slots=True)
class ClientResult:
    run_id: str
    frames: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    snapshot: dict[str, Any] | None = None
    error: str = ""  # why the socket ended before the run's end (the server closed it...)
    resyncs: int = 0  # snapshots asked for after a seq gap (frames lost on the way), as client.js does


def _db_name() -> str:
    return urlparse(DATABASE_URL).path.lstrip("/")


def _env(config: Config, logs: Path, fake_url: str, profile: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.update(
        DJANGO_SETTINGS_MODULE="bench.delivery_settings",
        DATABASE_URL=DATABASE_URL,
        REDIS_URL=REDIS_URL,
        DJANGO_DEBUG="0",
        LOG_FORMAT="json",
        LOG_LEVEL=os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
        PYTHONUNBUFFERED="1",
        STREAMRECOVER_FRAME_TIMESTAMPS="1",
        STREAMRECOVER_FAKE_URL=fake_url,
        BENCH_FRAME_COALESCE_MS=str(config.coalesce_ms),
        BENCH_LAYER=config.layer,
    )
    env.pop("BENCH_PROFILE", None)
    env.pop("BENCH_CPROFILE", None)
    env.pop("BENCH_COUNTS", None)
    env.pop("BENCH_DAPHNE_CPROFILE", None)
    env.pop("BENCH_TRACEMALLOC", None)
    return env


def _worker_env(env: dict[str, str], logs: Path, tag: str, profile: str) -> dict[str, str]:
    worker = {**env, "BENCH_COUNTS": str(logs / f"{tag}-counts-{{pid}}.json")}
    if profile == "tracemalloc":
        worker["BENCH_TRACEMALLOC"] = str(logs / f"{tag}-memory-{{pid}}.txt")
        return worker
    if profile == "cprofile":
        worker["BENCH_CPROFILE"] = str(logs / f"{tag}-cprofile-{{pid}}.pstats")
    elif profile:
        worker["BENCH_PROFILE"] = str(logs / f"{tag}-profile-{{pid}}.txt")
        worker["BENCH_PROFILE_THREAD"] = os.environ.get("BENCH_PROFILE_THREAD", "streamrecover-loop")
    return worker


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ensure_database() -> None:
    import psycopg

    name = _db_name()
    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class ProcessDied(RuntimeError):
    """A process the bench started (a worker, Daphne, the fake provider) exited mid-bench."""


def check_alive(processes: dict[str, tuple[subprocess.Popen[bytes], Path]], tail_lines: int = 15) -> None:
    """Raise ``ProcessDied`` (with the end of its log) if any of ``processes`` has exited: the
    runs it served would never end, and the bench would wait out its whole time limit for them."""
    for name, (process, log) in processes.items():
        if process.poll() is None:
            continue
        try:
            tail = log.read_text(errors="replace").splitlines()[-tail_lines:]
        except OSError:
            tail = ["(no log)"]
        raise ProcessDied(f"{name} exited ({process.returncode}); the end of {log}:\n" + "\n".join(tail))


async def await_all(
    tasks: Sequence[asyncio.Future[Any]], timeout_s: float, check: Callable[[], None], every_s: float = 1.0
) -> set[asyncio.Future[Any]]:
    """Wait up to ``timeout_s`` for ``tasks``; the ones still pending then are returned. ``check``
    runs every ``every_s`` meanwhile: what it raises cancels every task and is raised."""
    deadline = time.monotonic() + timeout_s
    pending = set(tasks)
    while pending and time.monotonic() < deadline:
        _, pending = await asyncio.wait(pending, timeout=min(every_s, max(0.0, deadline - time.monotonic())))
        try:
            check()
        except BaseException:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            raise
    return pending


def drop_stale_tasks() -> int:
    """Empty the bench's Celery queue before its workers start, and say how many tasks were in it.
    A bench that was interrupted (or whose workers died) leaves its runs' tasks there; the next
    bench's workers would execute those runs too, beside its own, and every figure would count
    them (twice the checkpoint writes, CPU no client's deltas paid for)."""
    from project.celery import app

    return int(app.control.purge() or 0)


def _wait_http(url: str, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited ({process.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer")


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "max": ordered[-1]}


async def _client(url: str, headers: list[tuple[str, str]], result: ClientResult, ready: asyncio.Event) -> None:
    import websockets

    try:
        async with websockets.connect(url, additional_headers=headers, max_size=None, open_timeout=60) as ws:
            result.snapshot = json.loads(await ws.recv())
            ready.set()
            last_seq = result.snapshot.get("seq", 0)
            awaiting_snapshot = False
            async for raw in ws:
                received = time.time()
                frame = json.loads(raw)
                result.frames.append((received, frame))
                # As the browser's client does: a seq gap means frames were lost on the way, and
                # the client asks for a snapshot (once, until it comes) rather than show a hole.
                if frame.get("type") == "snapshot":
                    awaiting_snapshot = False
                elif frame.get("first_seq", frame.get("seq", last_seq + 1)) > last_seq + 1 and not awaiting_snapshot:
                    awaiting_snapshot = True
                    result.resyncs += 1
                    await ws.send(json.dumps({"type": "resync"}))
                last_seq = max(last_seq, frame.get("seq", last_seq))
                # the run's end, in a run_status frame or in a snapshot (which replaces everything)
                if frame.get("type") in ("run_status", "snapshot") and frame.get("status") in TERMINAL:
                    return
        result.error = "closed before the run's end"
    except (TimeoutError, OSError, websockets.exceptions.WebSocketException) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        ready.set()  # a client that failed to connect must not hold the others


async def _drive(
    base: str,
    cookie: str,
    run_ids: list[str],
    on_started: Any,
    check: Callable[[], None],
    drive_timeout_s: float = 900,
) -> list[ClientResult]:
    from streamrecover.tasks import execute_run_task

    ws_base = base.replace("http://", "ws://")
    headers = [("Cookie", f"sessionid={cookie}"), ("Origin", base)]
    results = [ClientResult(run_id) for run_id in run_ids]
    readies = [asyncio.Event() for _ in run_ids]
    tasks = []
    for r, e in zip(results, readies, strict=True):  # connect in waves: Daphne's backlog is finite
        tasks.append(asyncio.ensure_future(_client(f"{ws_base}/ws/streamrecover/runs/{r.run_id}/", headers, r, e)))
        if len(tasks) % 25 == 0:
            await asyncio.sleep(0.5)
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in readies)), 300)
    on_started()
    for run_id in run_ids:  # all clients listen before any run starts
        execute_run_task.delay(run_id)
    late = await await_all(tasks, drive_timeout_s, check)
    for task in late:  # a load the pipeline cannot carry: measure what arrived, count the rest
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    for result, task in zip(results, tasks, strict=True):
        if task in late:
            result.error = f"run not over after {drive_timeout_s:.0f} s"
    return results


def _deltas(frame: dict[str, Any]) -> int:
    if frame.get("type") not in DELTA_TYPES:
        return 0
    return int(frame["seq"]) - int(frame.get("first_seq", frame["seq"])) + 1


def _publish_by_phase(results: list[ClientResult]) -> dict[str, list[float]]:
    """Publish -> client latencies (ms) split by when the frame was published: ``start`` until
    every run has published its first frame (runs being claimed, their rows read, their first
    requests sent), ``end`` from the first run's last frame (runs settling, their messages and
    usage stored), ``steady`` in between: where a tail comes from, not only how long it is."""
    stamped = [[f["debug_ts"]["out"] for _, f in r.frames if "debug_ts" in f] for r in results]
    stamped = [outs for outs in stamped if outs]
    phases: dict[str, list[float]] = {"start": [], "steady": [], "end": []}
    if not stamped:
        return phases
    all_started = max(min(outs) for outs in stamped)
    first_ended = min(max(outs) for outs in stamped)
    for r in results:
        for t, f in r.frames:
            if "debug_ts" not in f:
                continue
            out = f["debug_ts"]["out"]
            phase = "start" if out < all_started else "end" if out >= first_ended else "steady"
            phases[phase].append((t - out) * 1000)
    return phases


def _analyse(config: Config, results: list[ClientResult]) -> dict[str, Any]:
    from streamrecover.models import Message, Run
    from streamrecover.testing.client import ClientView, comparable

    frames = [(t, f) for r in results for t, f in r.frames]
    delta_frames = [(t, f) for t, f in frames if f.get("type") in DELTA_TYPES]
    deltas = sum(_deltas(f) for _, f in delta_frames)
    # Received rate: each run's deltas over its own span at the client, summed over the runs.
    rate = 0.0
    spans = []
    text_chars = []
    for r in results:
        times = [t for t, f in r.frames if f.get("type") in DELTA_TYPES]
        count = sum(_deltas(f) for _, f in r.frames)
        if len(times) > 1:
            spans.append(times[-1] - times[0])
            rate += (count - 1) / (times[-1] - times[0])
    publish = [(t - f["debug_ts"]["out"]) * 1000 for t, f in frames if "debug_ts" in f]
    first_delta = [(t - f["debug_ts"]["in"]) * 1000 for t, f in delta_frames if "debug_ts" in f]
    phases = _publish_by_phase(results)
    mismatches = 0
    dropped = sum(1 for r in results if r.error)
    statuses: dict[str, int] = {}
    stuck: list[str] = []
    for result in results:
        snapshot = [result.snapshot] if result.snapshot is not None else []
        view = ClientView().apply_all([*snapshot, *(frame for _, frame in result.frames)])
        run = Run.objects.get(pk=result.run_id)
        statuses[run.status] = statuses.get(run.status, 0) + 1
        committed = [m.content for m in Message.objects.filter(run=run, role="assistant").order_by("position")]
        # What the client ends up showing: the assistant messages it holds (a snapshot that came
        # after the answer was stored brings it whole; the message_committed after it confirms
        # it in place), and at each commit it did see, the deltas it had rebuilt.
        shown = [[comparable(b) for b in m["content"]] for m in view.messages if m.get("role") == "assistant"]
        if result.error:
            seen = [f.get("seq", 0) for _, f in result.frames]
            start = result.frames[0][0] if result.frames else 0.0
            stuck.append(
                f"{result.run_id} {run.status}: {result.error}; {len(result.frames)} frames, last seq "
                f"{max(seen, default=(result.snapshot or {}).get('seq'))}"
                f" ({result.frames[-1][1].get('type') if result.frames else 'snapshot only'})"
                + "; last frames: "
                + ", ".join(f"{f.get('type')}#{f.get('seq')}@{t - start:.1f}s" for t, f in result.frames[-4:])
            )
        if not result.error:  # a socket that ended early cannot have rebuilt the whole run
            expected = [[comparable(b) for b in content] for content in committed]
            mismatches += int(shown != expected or any(a != b for a, b in view.turns))
        text_chars.append(sum(len(json.dumps(c, ensure_ascii=False).encode()) for c in committed) if committed else 0)
    offered = config.runs / config.event_delay if config.event_delay else float("nan")
    return {
        "runs": len(results),
        "statuses": statuses,
        "frames": len(frames),
        "deltas": deltas,
        "received_per_s": rate,
        "offered_per_s": offered,
        "completeness": rate / offered if offered == offered and offered else float("nan"),
        "mean_span_s": sum(spans) / len(spans) if spans else 0.0,
        "publish_ms": percentiles(publish),
        "publish_ms_by_phase": {name: percentiles(values) for name, values in phases.items()},
        "first_delta_ms": percentiles(first_delta),
        "mismatches": mismatches,
        "resyncs": sum(r.resyncs for r in results),
        "runs_resynced": sum(1 for r in results if r.resyncs),
        "dropped": dropped,
        "errors": sorted({r.error for r in results if r.error})[:3],
        "stuck": stuck,
        "text_bytes_per_run": sum(text_chars) / max(1, len(text_chars)),
    }


def _pg_backends() -> list[int]:
    import psycopg

    with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (_db_name(),)).fetchall()
    return [int(pid) for (pid,) in rows]


class _RssPeak:
    """The workers' RSS, sampled every half second from a thread, and its peak."""

    def __init__(self, pids: list[int]) -> None:
        from bench.procstats import rss_mib

        self._rss = rss_mib
        self.pids = pids
        self.base = rss_mib(pids)
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, self._rss(self.pids))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _counts(logs: Path, tag: str) -> dict[str, int]:
    """The workers' counters (``bench.counters``), summed over the worker processes."""
    total: dict[str, int] = {}
    for path in logs.glob(f"{tag}-counts-*.json"):
        for name, value in json.loads(path.read_text()).items():
            if isinstance(value, int):
                total[name] = total.get(name, 0) + value
    return total


def _gc_pauses(logs: Path, tag: str, since: float, until: float) -> dict[str, float]:
    """The workers' garbage collector passes between ``since`` and ``until`` (unix times): how
    many, the time they stopped a worker in all (ms, summed over the workers) and the longest."""
    pauses = [
        (int(generation), microseconds / 1000)
        for path in logs.glob(f"{tag}-counts-*.json")
        for at, generation, microseconds in json.loads(path.read_text()).get("gc_passes", [])
        if since <= at <= until
    ]
    return {
        "passes": len(pauses),
        "full_passes": sum(1 for generation, _ in pauses if generation == 2),
        "total_ms": sum(ms for _, ms in pauses),
        "longest_ms": max((ms for _, ms in pauses), default=0.0),
    }


def _profile_top(logs: Path, tag: str, lines: int = 25) -> str:
    import io
    import pstats

    out = []
    for path in sorted([*logs.glob(f"{tag}-cprofile-*.pstats"), *logs.glob(f"{tag}-daphne-cprofile-*.pstats")]):
        text = io.StringIO()
        stats = pstats.Stats(str(path), stream=text)
        stats.sort_stats("tottime").print_stats(lines)
        stats.sort_stats("cumulative").print_stats(lines)
        out.append(text.getvalue())
    for path in sorted([*logs.glob(f"{tag}-memory-*.txt")]):
        out.append(path.read_text())
    for path in sorted([*logs.glob(f"{tag}-profile-*.txt"), *logs.glob(f"{tag}-daphne-profile-*.txt")]):
        head = path.read_text().splitlines()[: lines + 4]
        out.append("\n".join(head))
    return "\n\n".join(out)


def _warm_up(user: Any, workers: int, check: Callable[[], None], timeout_s: float = 60) -> None:
    """One short run per worker before the measured phase: what a worker loads on its first run
    (modules imported on first use, the shared loop, its clients) is not per-stream memory."""
    from streamrecover.models import Run
    from streamrecover.runs import lifecycle
    from streamrecover.tasks import execute_run_task

    ids = [str(lifecycle.create_run(prompt="warm-up [[words=5]]", owner=user).pk) for _ in range(workers)]
    for run_id in ids:
        execute_run_task.delay(run_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if Run.objects.filter(pk__in=ids, status__in=TERMINAL).count() == len(ids):
            return
        check()
        time.sleep(0.2)
    raise RuntimeError(
        f"the warm-up runs did not end within {timeout_s:.0f} s: no worker took them (see the worker logs)"
    )


def run_config(
    config: Config, logs: Path, *, nice: int = 0, profile: str = "", drive_timeout_s: float = 900
) -> dict[str, Any]:
    """One configuration end to end: start the processes, drive the runs, measure, stop."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from bench.procstats import CpuMeter, by_name
    from streamrecover.runs import lifecycle

    tag = "".join(ch if ch.isalnum() else "_" for ch in config.name)
    stale_tasks = drop_stale_tasks()
    for old in logs.glob(f"{tag}-*"):
        old.unlink()
    load_before = os.getloadavg()
    fake_port = _free_port()
    fake_url = f"http://127.0.0.1:{fake_port}"
    env = _env(config, logs, fake_url, profile)
    fake = _start(
        [
            sys.executable,
            "manage.py",
            "streamrecover_fake_provider",
            "--port",
            str(fake_port),
            "--event-delay",
            str(config.event_delay),
        ],
        env,
        logs / f"{tag}-fake.log",
    )
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    daphne_env = env
    if profile == "tracemalloc":
        pass  # the workers' memory only
    elif profile == "cprofile":  # Daphne's reactor and consumers all run on its main thread
        daphne_env = {**env, "BENCH_DAPHNE_CPROFILE": str(logs / f"{tag}-daphne-cprofile-{{pid}}.pstats")}
    elif profile:
        daphne_env = {**env, "BENCH_PROFILE": str(logs / f"{tag}-daphne-profile-{{pid}}.txt")}
    daphne = _start(
        [
            *(sys.executable, "-m", "daphne", "-v", "0", "-b", "127.0.0.1", "-p", str(port)),
            *("--websocket_connect_timeout", "120"),  # hundreds of sockets connect at once
            "project.asgi:application",
        ],
        daphne_env,
        logs / f"{tag}-daphne.log",
    )
    workers = [
        _start(
            [
                *(["nice", "-n", str(nice)] if nice else []),
                sys.executable,
                "-m",
                "celery",
                "-A",
                "project",
                "worker",
                "--pool=threads",
                f"--concurrency={config.concurrency}",
                "--loglevel=WARNING",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"bench{i}-{os.getpid()}@%h",
            ],
            {**_worker_env(env, logs, tag, profile), "BENCH_WORKER_MAX_RUNS": str(config.max_runs)},
            logs / f"{tag}-worker{i}.log",
        )
        for i in range(config.workers)
    ]
    started_processes = {
        **{f"worker{i}": (w, logs / f"{tag}-worker{i}.log") for i, w in enumerate(workers)},
        "daphne": (daphne, logs / f"{tag}-daphne.log"),
        "fake provider": (fake, logs / f"{tag}-fake.log"),
    }

    def check() -> None:
        check_alive(started_processes)

    meter = CpuMeter(
        roles={
            "workers": lambda: [w.pid for w in workers],
            "daphne": lambda: [daphne.pid],
            "fake provider": lambda: [fake.pid],
            "clients (bench)": lambda: [os.getpid()],
            "redis (shared)": lambda: by_name("redis-server"),
            "postgresql (bench db)": _pg_backends,
        },
        trees={"workers"},
    )
    try:
        _wait_http(f"{base}/streamrecover/login/", daphne)
        _wait_http(f"{fake_url}/_fake/faults", fake)
        user, _ = get_user_model().objects.get_or_create(username="bench")
        client = Client()
        client.force_login(user)
        cookie = client.cookies["sessionid"].value
        run_ids = []
        for i in range(config.runs):
            faults = ["cut:bytes=4000"] if config.fault_every and i % config.fault_every == 0 else []
            prompt = f"Run {i}: a long story [[words={config.words}]]"
            run = lifecycle.create_run(prompt=prompt, owner=user, faults=faults)
            run_ids.append(str(run.pk))
        time.sleep(3)  # let the workers finish booting
        _warm_up(user, config.workers, check)
        rss: list[_RssPeak] = []

        phase: list[float] = []

        def started() -> None:
            rss.append(_RssPeak([w.pid for w in workers]))
            meter.start()
            phase.append(time.time())

        wall = time.monotonic()
        # The clients keep every frame for the checks afterwards, so this process's heap grows
        # through the measured phase, and each full collection of it paused all the clients at
        # once (160-170 ms at 500 streams): latency that no part of the pipeline caused. The
        # heap as it is now is frozen and collection waits until the clients are done.
        gc.freeze()
        gc.disable()
        try:
            results = asyncio.run(_drive(base, cookie, run_ids, started, check, drive_timeout_s))
        finally:
            gc.enable()
            gc.unfreeze()
        wall = time.monotonic() - wall
        phase.append(time.time())
        cpu = meter.stop()
        rss[0].stop()
        time.sleep(1.2)  # the counters are written every second
        result = _analyse(config, results)
        counts = _counts(logs, tag)
        writes = counts.get("checkpoint_writes", 0)
        result.update(
            config=config,
            load_before=load_before,
            load_after=os.getloadavg(),
            wall_s=wall,
            cpu_s=cpu,
            worker_us_per_delta=1e6 * cpu["workers"] / max(1, result["deltas"]),
            daphne_us_per_delta=1e6 * cpu["daphne"] / max(1, result["deltas"]),
            rss_base_mib=rss[0].base,
            rss_peak_mib=rss[0].peak,
            memory_per_stream_bytes=(rss[0].peak - rss[0].base) * 1024 * 1024 / config.runs,
            checkpoint_writes=writes,
            checkpoint_writes_per_run_s=writes / max(1e-9, config.runs * max(result["mean_span_s"], 1e-9)),
            frames_per_redis_call=counts.get("outbox_frames", 0) / max(1, counts.get("outbox_calls", 0)),
            attempt_rows_per_transaction=(
                counts.get("attempt_writes", 0) / max(1, counts.get("attempt_transactions", 0))
            ),
            claims_per_transaction=counts.get("claims", 0) / max(1, counts.get("claim_transactions", 0)),
            settlements_per_transaction=(
                counts.get("settlements", 0) / max(1, counts.get("settlement_transactions", 0))
            ),
            worker_gc=_gc_pauses(logs, tag, phase[0], phase[-1]),
            stale_tasks=stale_tasks,
        )
    finally:
        for process in [*workers, daphne, fake]:
            _stop(process)
    result["profile"] = _profile_top(logs, tag) if profile else ""  # Daphne's is dumped as it exits
    return result


def gc_summary(pauses: dict[str, float]) -> str:
    """The measured phase's collector passes in the workers, in a few words."""
    return (
        f"{pauses['passes']:.0f} passes ({pauses['full_passes']:.0f} full), {pauses['total_ms']:,.0f} ms in all, "
        f"longest {pauses['longest_ms']:.0f} ms"
    )


def row(result: dict[str, Any]) -> str:
    c: Config = result["config"]
    pub, first = result["publish_ms"], result["first_delta_ms"]
    cpu = result["cpu_s"]
    dropped = f" ({result['dropped']} clients without the run's end)" if result["dropped"] else ""
    if result.get("runs_resynced"):
        dropped = f" ({result['runs_resynced']} clients resynced after lost frames){dropped}"
    return (
        f"| {c.name} | {c.runs} x {1 / c.event_delay:.0f}/s | {c.workers} | {c.coalesce_ms:g} ms | {c.layer} "
        f"| {result['received_per_s']:,.0f} / {result['offered_per_s']:,.0f} ({100 * result['completeness']:.0f}%) "
        f"| {pub['p50']:.1f} / {pub['p99']:.1f} | {first['p50']:.1f} / {first['p99']:.1f} "
        f"| {result['worker_us_per_delta']:.0f} | {result['daphne_us_per_delta']:.0f} "
        f"| {cpu['workers']:.1f} / {cpu['daphne']:.1f} / {cpu['fake provider']:.1f} / {cpu['clients (bench)']:.1f} "
        f"/ {cpu['redis (shared)']:.1f} / {cpu['postgresql (bench db)']:.1f} "
        f"| {result['mismatches']}{dropped} "
        f"| {result['load_before'][0]:.1f} → {result['load_after'][0]:.1f} |"
    )


HEADER = (
    "| config | streams x offered rate | workers | coalesce | layer | deltas/s received / offered "
    "| publish→client ms p50 / p99 | first delta→client ms p50 / p99 | worker µs/delta | Daphne µs/delta "
    "| CPU s: workers / Daphne / fake / clients / Redis / PG | rebuild mismatches | load avg (1 min) before → after |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def setup() -> None:
    """Django for this process (the clients and the checks), on the bench database."""
    _ensure_database()
    os.environ.update(DJANGO_SETTINGS_MODULE="bench.delivery_settings", LOG_FORMAT="json")
    os.environ.update(DATABASE_URL=DATABASE_URL, REDIS_URL=REDIS_URL)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import project.celery  # noqa: F401  the Celery app the tasks are sent with


CONFIGS = {
    "100x30": Config("100 streams x 30/s", 100, 300, 1 / 30),
    "500x10": Config("500 streams x 10/s, 2 workers", 500, 100, 1 / 10, workers=2),
    "baseline": Config("100 streams x 30/s, per-token group_send, core layer", 100, 300, 1 / 30, 0, layer="core"),
    "faults": Config("100 streams x 30/s, every 2nd cut", 100, 300, 1 / 30, fault_every=2),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="100x30", help=f"comma-separated configurations: {', '.join(CONFIGS)}")
    parser.add_argument("--runs", type=int, default=0, help="override the number of streams")
    parser.add_argument("--words", type=int, default=0, help="override the words per stream")
    parser.add_argument(
        "--profile",
        choices=("sample", "cprofile", "tracemalloc"),
        default="",
        help="sample the workers' run loop thread (bench.sampler), or cProfile it (slower, deterministic);"
        " Daphne is sampled or cProfiled (its main thread) alike; or tracemalloc the workers' memory",
    )
    parser.add_argument("--workers", type=int, default=0, help="override the number of worker processes")
    parser.add_argument(
        "--drive-timeout", type=float, default=900, help="seconds to wait for every run's end at its client"
    )
    parser.add_argument("--nice", type=int, default=0, help="run the workers at this niceness")
    args = parser.parse_args(argv)
    setup()
    logs = Path("/tmp") / f"streamrecover-bench-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    print(HEADER)
    for key in args.only.split(","):
        config = CONFIGS[key]
        if args.runs:
            config = replace(config, runs=args.runs)
        if args.words:
            config = replace(config, words=args.words)
        if args.workers:
            config = replace(config, workers=args.workers, name=f"{config.name}, {args.workers} workers")
        result = run_config(config, logs, nice=args.nice, profile=args.profile, drive_timeout_s=args.drive_timeout)
        print(row(result), flush=True)
        print(
            "   publish→client p50 / p99 ms by phase: "
            + ", ".join(f"{name} {p['p50']:.1f} / {p['p99']:.1f}" for name, p in result["publish_ms_by_phase"].items()),
            flush=True,
        )
        print(
            f"   memory/stream {result['memory_per_stream_bytes'] / 1024:.0f} KiB "
            f"(text {result['text_bytes_per_run']:.0f} B), "
            f"checkpoint writes/s/run {result['checkpoint_writes_per_run_s']:.2f}, wall {result['wall_s']:.1f} s, "
            f"frames {result['frames']:,} for {result['deltas']:,} deltas, "
            f"frames per Redis call {result['frames_per_redis_call']:.1f}, "
            f"attempt rows per transaction {result['attempt_rows_per_transaction']:.1f}, "
            f"claims per transaction {result['claims_per_transaction']:.1f}, "
            f"settlements per transaction {result['settlements_per_transaction']:.1f}",
            flush=True,
        )
        print(f"   worker garbage collection: {gc_summary(result['worker_gc'])}", flush=True)
        if result["stale_tasks"]:
            print(f"   tasks an earlier bench left in the queue, dropped first: {result['stale_tasks']}", flush=True)
        for line in result["stuck"]:
            print(f"   ended early: {line}", flush=True)
        if result["profile"]:
            print(result["profile"])
    print(f"logs in {logs}")


if __name__ == "__main__":
    main()
