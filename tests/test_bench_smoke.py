"""Each benchmark still runs and still produces its figures: tiny parameters, no timing asserted.

The benchmarks themselves (``make bench``) stay out of the suite; these smoke runs only prove
that a change did not break one (a renamed function, a frame shape the bench no longer reads).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_recovery_and_billing_bench_produce_their_figures() -> None:
    from bench import bench_recovery

    result = asyncio.run(bench_recovery.run_all(repeat=1, cut=1500, words=60, points=1))
    assert {row["strategy"] for row in result["overhead"]} == {"prefill", "prefix_flag", "continue_message"}
    for row in result["overhead"]:
        assert row["n"] == 1
        assert row["p50"] == row["p50"]  # measured, not NaN
    (billing,) = result["billing"]
    # a naive retry pays the text before the cut twice; the continuation pays it once
    assert billing["naive_output"] > billing["ours_output"] >= billing["uninterrupted_output"]
    assert billing["ours_input"] > billing["naive_input"] > 0


def test_parse_bench_produces_its_table() -> None:
    import random

    from bench import bench_parse

    raw, expected = bench_parse.generate_stream(100, 20)
    chunks = bench_parse.chunked(raw, random.Random(7), 512, 2048)
    row = bench_parse.measure("smoke", [chunks], [expected], repeat=1)  # checks every pipeline agrees
    assert row.events > 120
    assert set(row.best_s) == {"engine", "sdk", "sdk-direct", "floor"}
    assert "| smoke |" in bench_parse.table([row])


def test_text_memory_bench_measures_both_holders_against_the_str_layout() -> None:
    from bench import bench_textmem, report

    deltas = bench_textmem.answer(300, spiced=True)
    held = bench_textmem.held(deltas, "mixed")
    assert held.text_bytes == len("".join(deltas).encode())
    # two holders of the text: at least two bytes held per byte of it, and the str layout's
    # anchor is wider than UTF-8 once a 4-byte character is in the text
    assert held.held_bytes >= 2 * held.text_bytes
    assert held.as_str_bytes > 2 * held.text_bytes
    timing = bench_textmem.per_delta(deltas, repeat=1)
    assert timing.utf8_us > 0
    assert timing.str_us > 0
    assert "| mixed | 300 |" in bench_textmem.tables([held], [timing])
    section = report.text(quick=True)
    assert "| ASCII | 2,000 |" in section, section


def test_floor_bench_measures_each_kind_of_stream_and_report_sets_it_against_the_goal() -> None:
    """Twenty streams of each kind (fewer may fit in pages the process already has: no RSS
    growth), each kind in a fresh process against a server process of its own; the delivery
    section's table puts the bare floor beside twice the text per stream."""
    from bench import bench_floor, report

    floors = {f.kind: f for f in bench_floor.run([20], repeat=1)}
    assert set(floors) == {"bare", "httpx", "shared"}
    for floor in floors.values():
        assert floor.streams == 20
        assert 0 < floor.rss_per_stream < 1024 * 1024, floor  # grown, and not by a megabyte a stream
        assert 500 < floor.objects_per_stream < 200 * 1024, floor  # a socket, a transport, a task at least
    # an httpx client and its response hold more than a bare connection; sharing the client holds less
    assert floors["bare"].objects_per_stream < floors["shared"].objects_per_stream
    assert floors["shared"].objects_per_stream < floors["httpx"].objects_per_stream
    section = report.stream_floor({5: 2034.0}, quick=True)
    (row,) = [line for line in section.splitlines() if line.startswith("| 5 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["2,034 B", "4,068 B"]  # the text per stream, and the goal: twice it
    assert all(re.fullmatch(r"[0-9.]+ KiB, [0-9.]+ KiB", cell) for cell in cells[3:6]), cells
    assert re.fullmatch(r"[0-9.]+\u00d7 \((within|above) it\)", cells[6]), cells


def test_delivery_latency_is_split_by_when_the_frame_was_published() -> None:
    """Two runs: frames before the later run's first one are the start burst, frames from the
    earlier run's last one on are the end burst; each latency lands in one phase only."""
    from bench.bench_delivery import ClientResult, _publish_by_phase

    def frame(out: float, latency_ms: float) -> tuple[float, dict[str, object]]:
        return out + latency_ms / 1000, {"type": "text_delta", "debug_ts": {"in": out, "out": out}}

    early = ClientResult("a", frames=[frame(0.0, 5), frame(1.0, 6), frame(2.0, 7), frame(3.0, 40)])
    late = ClientResult("b", frames=[frame(0.5, 30), frame(1.5, 8), frame(4.0, 50), (4.1, {"type": "run_status"})])
    phases = _publish_by_phase([early, late, ClientResult("never connected")])
    assert {name: sorted(round(v) for v in values) for name, values in phases.items()} == {
        "start": [5],  # published before "b" had published anything
        "steady": [6, 7, 8, 30],
        "end": [40, 50],  # from "a"'s last frame on
    }


def test_the_delivery_bench_stops_with_the_log_of_a_process_that_died(tmp_path: Path) -> None:
    """A worker that exits (a settings error, a crash) would leave every run unfinished and the
    bench waiting out its whole time limit (15 minutes by default); it stops within a second or
    two instead and shows the end of that process's log."""
    from bench.bench_delivery import ProcessDied, _start, await_all, check_alive

    dying = _start(
        [sys.executable, "-c", "import sys; print('boom: no such setting'); sys.exit(3)"],
        {**os.environ},
        tmp_path / "worker0.log",
    )
    living = _start([sys.executable, "-c", "import time; time.sleep(60)"], {**os.environ}, tmp_path / "daphne.log")
    try:
        dying.wait(timeout=30)
        processes = {"daphne": (living, tmp_path / "daphne.log"), "worker0": (dying, tmp_path / "worker0.log")}
        with pytest.raises(ProcessDied, match="worker0 exited \\(3\\)") as died:
            check_alive(processes)
        assert "boom: no such setting" in str(died.value)
        check_alive({"daphne": processes["daphne"]})  # a running process is no reason to stop

        async def clients_of_runs_that_never_end() -> tuple[float, list[asyncio.Task[None]]]:
            tasks = [asyncio.ensure_future(asyncio.sleep(3600)) for _ in range(3)]
            started = time.monotonic()
            with pytest.raises(ProcessDied):
                await await_all(tasks, 900, lambda: check_alive(processes), every_s=0.1)
            return time.monotonic() - started, tasks

        waited, tasks = asyncio.run(clients_of_runs_that_never_end())
        assert waited < 60  # not the 900 s limit
        assert all(task.cancelled() for task in tasks)
    finally:
        living.kill()
        living.wait()


def test_the_delivery_bench_returns_the_runs_still_going_at_its_time_limit() -> None:
    from bench.bench_delivery import await_all

    async def some_end_some_do_not() -> tuple[int, int]:
        quick = [asyncio.ensure_future(asyncio.sleep(0)) for _ in range(2)]
        endless = [asyncio.ensure_future(asyncio.sleep(3600)) for _ in range(3)]
        late = await await_all([*quick, *endless], 0.3, lambda: None, every_s=0.1)
        for task in late:
            task.cancel()
        return len(late), sum(task in late for task in endless)

    assert asyncio.run(some_end_some_do_not()) == (3, 3)


@pytest.mark.services
def test_delivery_bench_runs_every_process_and_checks_the_rebuild() -> None:
    """Two streams through a fake provider process, Daphne, a Celery worker and two WebSocket
    clients, on a database of its own beside the test database."""
    database = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/streamrecover")
    name = urlparse(database).path.lstrip("/") or "streamrecover"
    env = {
        **os.environ,
        "BENCH_DATABASE_URL": database.rsplit("/", 1)[0] + f"/{name}_bench_smoke",
        "BENCH_REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    # What an interrupted bench leaves behind: a task of a run in the queue, which the next
    # bench's worker would execute beside its own runs unless the bench drops it first.
    from celery import Celery

    leftover = Celery(broker=env["BENCH_REDIS_URL"])
    leftover.conf.task_default_queue = os.environ.get("CELERY_QUEUE", "celery")
    leftover.send_task("streamrecover.execute_run", args=["00000000-0000-0000-0000-000000000000"])
    leftover.close()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_delivery", "--only", "100x30", "--runs", "2", "--words", "10"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("| 100 streams")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2 x 30/s"
    assert cells[11] == "0"  # rebuild mismatches
    assert float(cells[8]) > 0  # worker CPU per delta was measured
    assert "memory/stream" in proc.stdout
    assert "tasks an earlier bench left in the queue, dropped first: 1" in proc.stdout
    assert "by phase: start" in proc.stdout
    assert "checkpoint writes/s/run" in proc.stdout
    (per_call,) = re.findall(r"frames per Redis call ([0-9.]+)", proc.stdout)
    assert float(per_call) >= 1  # the worker's outbox calls were counted, each with a frame or more
    (per_transaction,) = re.findall(r"attempt rows per transaction ([0-9.]+)", proc.stdout)
    assert float(per_transaction) >= 1  # the attempt rows went through the loop's batches and were counted
    (claims_per_transaction,) = re.findall(r"claims per transaction ([0-9.]+)", proc.stdout)
    assert float(claims_per_transaction) >= 1  # the runs were claimed through the loop's batches, and counted
    (settlements_per_transaction,) = re.findall(r"settlements per transaction ([0-9.]+)", proc.stdout)
    assert float(settlements_per_transaction) >= 1  # the runs' ends went through the loop's batches, and counted
    (passes, full, total_ms, longest_ms) = re.findall(
        r"worker garbage collection: ([0-9,]+) passes \(([0-9]+) full\), ([0-9,]+) ms in all, longest ([0-9]+) ms",
        proc.stdout,
    )[0]
    assert int(passes.replace(",", "")) >= int(full)  # the workers' collector passes were timed in the phase
    assert float(total_ms.replace(",", "")) >= float(longest_ms)


@pytest.mark.services
def test_analytics_bench_generates_a_history_and_times_every_query(tmp_path: Path) -> None:
    """A small history (its 1,000,000-event floor lowered) on a database of its own, every query,
    endpoint and command timed once, the BENCHMARKS.md section written where it is told."""
    database = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/streamrecover")
    name = urlparse(database).path.lstrip("/") or "streamrecover"
    results = tmp_path / "analytics.md"
    env = {**os.environ, "BENCH_PG_URL": database.rsplit("/", 1)[0]}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench.bench_analytics", "--database", f"{name}_analytics_smoke",
            "--runs", "1200", "--min-events", "1000", "--repeat", "1", "--regenerate", "--results", str(results),
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    section = results.read_text()
    assert "history: 1,200 runs" in section
    for figure in ("build_report", "rollup=False", "GET /streamrecover/analytics.json", "streamrecover_stats --json"):
        assert figure in section, figure
    assert "fold " in section  # a finished run's fold was timed
