"""A worker's checkpoint writes, outbox calls, batched ORM transactions and GC passes, to a file each second.

The file is ``BENCH_COUNTS`` (``{pid}`` replaced).

The engine's ``CheckpointWriter.write``, the outbox's send and the attempt rows' transaction are wrapped
in the worker process only (by ``bench.delivery_settings``); the bench reads the files after the run.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

COUNTS: dict[str, int] = {
    "checkpoint_writes": 0,
    "outbox_calls": 0,
    "outbox_frames": 0,
    "attempt_transactions": 0,
    "attempt_writes": 0,
    "claim_transactions": 0,
    "claims": 0,
    "settlement_transactions": 0,
    "settlements": 0,
}
# Every pass of the cyclic garbage collector: [unix time, generation, microseconds the process
# was stopped]. Timed in wall clock: on a busy host a pass that the kernel preempts stops the
# process's threads (the loop included) for that long too. The bench keeps the measured phase's.
GC_PASSES: list[list[float]] = []


def _time_gc() -> None:
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        GC_PASSES.append([time.time(), info["generation"], round((time.perf_counter() - started[0]) * 1e6)])

    gc.callbacks.append(on_gc)


def install(target: str) -> None:
    from streamrecover.engine.checkpoint import CheckpointWriter
    from streamrecover.live.outbox import Outbox

    original = CheckpointWriter.write

    @functools.wraps(original)
    async def write(self: Any, checkpoint: Any) -> None:
        COUNTS["checkpoint_writes"] += 1
        await original(self, checkpoint)

    CheckpointWriter.write = write  # type: ignore[method-assign]
    send = Outbox._send

    @functools.wraps(send)
    async def send_counted(self: Any, batch: list[Any]) -> None:
        COUNTS["outbox_calls"] += 1
        COUNTS["outbox_frames"] += len(batch)
        await send(self, batch)

    Outbox._send = send_counted  # type: ignore[method-assign]
    from celery.signals import worker_ready

    @worker_ready.connect(weak=False)
    def count_batched_writes(**_: Any) -> None:
        # Imported once the apps are ready (they import the models): not at settings time.
        from streamrecover.runs import attempt_writes, claims, lifecycle

        _count_batches(attempt_writes, "write_attempts", "attempt_transactions", "attempt_writes")
        _count_batches(claims, "claim_many", "claim_transactions", "claims")
        _count_batches(lifecycle, "finish_many", "settlement_transactions", "settlements")

    _time_gc()
    out = Path(target.replace("{pid}", str(os.getpid())))

    def dump() -> None:
        while True:
            time.sleep(1.0)
            partial = out.with_suffix(".part")
            partial.write_text(json.dumps({**COUNTS, "gc_passes": GC_PASSES}))
            partial.replace(out)  # atomic: the bench never reads half a file

    threading.Thread(target=dump, name="bench-counters", daemon=True).start()


def _count_batches(module: Any, name: str, calls: str, items: str) -> None:
    """Count the calls of ``module.name`` (whose first argument is a batch) and the items they carry."""
    batched = getattr(module, name)

    @functools.wraps(batched)
    def counted(batch: Any, *args: Any) -> Any:
        COUNTS[calls] += 1
        COUNTS[items] += len(batch)
        return batched(batch, *args)

    setattr(module, name, counted)


def profile_run_loop(target: str, every_s: float = 3.0) -> None:
    """cProfile the worker's shared run loop (``BENCH_CPROFILE``): deterministic, one thread,
    slower; the stats are dumped to ``target`` every few seconds (``pstats`` format)."""
    import cProfile

    out = target.replace("{pid}", str(os.getpid()))
    profiler = cProfile.Profile()

    def dump() -> None:
        profiler.disable()
        profiler.dump_stats(out)
        profiler.enable()

    def attach() -> None:
        from streamrecover.runs import loop as run_loop

        while run_loop._shared._loop is None:
            time.sleep(0.2)
        shared = run_loop._shared._loop
        shared.call_soon_threadsafe(profiler.enable)
        while True:
            time.sleep(every_s)
            shared.call_soon_threadsafe(dump)

    threading.Thread(target=attach, name="bench-cprofile", daemon=True).start()


def profile_main_thread(target: str) -> None:
    """cProfile this process's main thread from now until it exits (``BENCH_DAPHNE_CPROFILE``:
    Daphne's reactor and every consumer run there); the stats are dumped at exit."""
    import atexit
    import cProfile

    profiler = cProfile.Profile()

    def dump() -> None:
        profiler.disable()
        profiler.dump_stats(target.replace("{pid}", str(os.getpid())))

    atexit.register(dump)
    profiler.enable()


def trace_memory(target: str, every_s: float = 2.0, top: int = 40) -> None:
    """tracemalloc in this process (``BENCH_TRACEMALLOC``): at each new peak of traced memory,
    what holds it, by allocating line and by file, written to ``target`` (``{pid}`` replaced)."""
    import tracemalloc

    tracemalloc.start(1)
    out = Path(target.replace("{pid}", str(os.getpid())))
    first_task = threading.Event()

    from celery.signals import task_postrun

    task_postrun.connect(lambda **_: first_task.set(), weak=False)
    ignored = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap*"),
    ]

    def watch() -> None:
        peak = 0
        first_task.wait()  # the base: the warm-up run has ended (what it imports and builds once is in)
        time.sleep(0.5)
        base = tracemalloc.take_snapshot().filter_traces(ignored)
        peak = tracemalloc.get_traced_memory()[0]
        while True:
            time.sleep(every_s)
            current, _ = tracemalloc.get_traced_memory()
            if current <= peak:
                continue  # the report stays the one taken at the peak
            peak = current
            snapshot = tracemalloc.take_snapshot().filter_traces(ignored)
            lines = [f"# traced {current / 1024:.0f} KiB (growth since the warm-up run, by line, then by file)", ""]
            for stat in snapshot.compare_to(base, "lineno")[:top]:
                lines.append(f"{stat.size_diff / 1024:9.1f} KiB {stat.count_diff:+7d}  {stat.traceback[0]}")
            lines.append("")
            for stat in snapshot.compare_to(base, "filename")[:top]:
                lines.append(f"{stat.size_diff / 1024:9.1f} KiB {stat.count_diff:+7d}  {stat.traceback[0].filename}")
            partial = out.with_suffix(".part")
            partial.write_text("\n".join(lines) + "\n")
            partial.replace(out)

    threading.Thread(target=watch, name="bench-tracemalloc", daemon=True).start()
