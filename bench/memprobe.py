"""Where a worker's memory per stream goes: its mappings, allocators, objects and threads, at the base and mid-stream.

``BENCH_MEMPROBE=<file>`` (``{pid}`` replaced) in a worker: once the warm-up run has ended the
probe takes a base, and once ``BENCH_MEMPROBE_RUNS`` runs have been executing at once for
``BENCH_MEMPROBE_AFTER_S`` seconds (mid-stream) it takes the same figures again and writes the
difference: RSS by kind of mapping (``/proc/self/smaps``), glibc's ``mallinfo2``, pymalloc's
arenas (``sys._debugmallocstats``), threads and sockets, Python objects by type (``gc``), and
with ``BENCH_MEMPROBE_FRAMES=n`` tracemalloc's growth by traceback (n frames; slows the worker a lot),
its snapshots dumped beside the file (``.base``, ``.peak``) for ``tracemalloc.Snapshot.load``;
with ``BENCH_MEMPROBE_TRIM=1`` the RSS again after ``malloc_trim(0)`` (what glibc's free bytes would give back).
"""

from __future__ import annotations

import collections
import ctypes
import gc
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def mallinfo() -> dict[str, int]:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return {
        "malloc sbrk+arenas (arena)": info.arena,
        "malloc mmapped chunks (hblkhd)": info.hblkhd,
        "malloc in use (uordblks)": info.uordblks,
        "malloc free in arenas (fordblks)": info.fordblks,
    }


def pymalloc() -> dict[str, int]:
    """pymalloc's own account (``sys._debugmallocstats`` writes it to C's stderr)."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    figures: dict[str, int] = {}
    for key, pattern in (
        ("pymalloc arenas", r"# arenas allocated current\s*=\s*([\d,]+)"),
        ("pymalloc bytes in allocated blocks", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
        ("pymalloc bytes in available blocks", r"# bytes in available blocks\s*=\s*([\d,]+)"),
        ("pymalloc bytes in free pools", r"\d+ unused pools \* \d+ bytes\s*=\s*([\d,]+)"),
        ("pymalloc bytes lost to quantization", r"# bytes lost to quantization\s*=\s*([\d,]+)"),
        ("pymalloc total", r"Total\s*=\s*([\d,]+)"),
    ):
        match = re.search(pattern, text)
        if match:
            figures[key] = int(match.group(1).replace(",", ""))
    return figures


def mappings() -> dict[str, int]:
    """RSS (bytes) by kind of mapping, and how many mappings of each kind."""
    rss: dict[str, int] = collections.Counter()
    current = ""
    size = 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            start, end = (int(x, 16) for x in head[0].split("-"))
            size = end - start
            name = head[5] if len(head) > 5 else ""
            if name == "[heap]":
                current = "heap (brk: main arena)"
            elif name == "[stack]":
                current = "main stack"
            elif name.startswith("/") or name.startswith("["):
                current = "file and other named"
            elif size == 8 << 20 or size == (8 << 20) - 4096 or size == 8 << 20 + 4096:
                current = "thread stacks (8 MiB)"
            elif size == 64 << 20 or size % (64 << 20) == 0:
                current = "glibc thread arenas (64 MiB heaps)"
            elif size == 1 << 20:
                current = "1 MiB anonymous (pymalloc arenas, unless merged)"
            else:
                current = "other anonymous (malloc mmap chunks, ...)"
            rss[f"mappings: {current}"] += 1
        elif head and head[0] == "Rss:":
            rss[f"RSS: {current}"] += int(head[1]) * 1024
    return dict(rss)


def process() -> dict[str, int]:
    status = Path("/proc/self/status").read_text()
    figures = {}
    for key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
        match = re.search(rf"^{key}:\s+(\d+)", status, re.M)
        if match:
            figures[key] = int(match.group(1)) * (1 if key == "Threads" else 1024)
    kinds: dict[str, int] = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kinds["fds: " + (target.split(":")[0] if ":" in target else "file")] += 1
    figures.update(kinds)
    return figures


def objects() -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        counts[f"{kind.__module__}.{kind.__qualname__}"] += 1
    return counts


def figures() -> dict[str, int]:
    return {**process(), **mappings(), **mallinfo(), **pymalloc()}


def install(target: str) -> None:
    from streamrecover.runs.holder import holder  # the runs the worker holds, none with a task of its own

    runs = int(os.environ.get("BENCH_MEMPROBE_RUNS", "100"))
    after_s = float(os.environ.get("BENCH_MEMPROBE_AFTER_S", "6"))
    frames = int(os.environ.get("BENCH_MEMPROBE_FRAMES", "0"))
    out = Path(target.replace("{pid}", str(os.getpid())))

    def watch() -> None:
        while holder.held == 0:  # the warm-up run has not started
            time.sleep(0.05)
        while holder.held:  # ... nor ended
            time.sleep(0.05)
        time.sleep(1.0)
        gc.collect()
        base, base_objects = figures(), objects()
        if frames:  # traced from the base on: what the process held before is not this figure's
            import tracemalloc

            tracemalloc.start(frames)
        base_snapshot = _snapshot() if frames else None
        while holder.held < runs:
            time.sleep(0.1)
        time.sleep(after_s)
        seen = holder.held
        peak, peak_objects = figures(), objects()
        peak_snapshot = _snapshot() if frames else None
        lines = [f"# {seen} runs executing; growth from the base (after the warm-up) to mid-stream", ""]
        for key in sorted(set(base) | set(peak)):
            growth = peak.get(key, 0) - base.get(key, 0)
            lines.append(
                f"{key:55s} {base.get(key, 0):>14,} -> {peak.get(key, 0):>14,}  {growth:>+13,}"
                f"  per run {growth / seen:>+11,.0f}"
            )
        lines += ["", "# Python objects (gc-tracked) by type, growth", ""]
        grown = peak_objects.copy()
        grown.subtract(base_objects)
        for name, count in grown.most_common(60):
            lines.append(f"{count:>+8,}  per run {count / seen:>7.1f}  {name}")
        if base_snapshot is not None and peak_snapshot is not None:
            total = sum(s.size_diff for s in peak_snapshot.compare_to(base_snapshot, "filename"))
            lines += ["", f"# tracemalloc growth {total:,} B ({total / seen:,.0f} per run), by file", ""]
            for stat in peak_snapshot.compare_to(base_snapshot, "filename")[:40]:
                lines.append(f"{stat.size_diff:>+12,} {stat.count_diff:>+8,}  {stat.traceback[0].filename}")
            lines += ["", "# by line", ""]
            for stat in peak_snapshot.compare_to(base_snapshot, "lineno")[:80]:
                lines.append(f"{stat.size_diff:>+12,} {stat.count_diff:>+8,}  {stat.traceback[0]}")
            peak_snapshot.dump(str(out) + ".peak")
            base_snapshot.dump(str(out) + ".base")
            lines += ["", "# by traceback", ""]
            for stat in peak_snapshot.compare_to(base_snapshot, "traceback")[:60]:
                lines.append(f"{stat.size_diff:>+12,} {stat.count_diff:>+8,}")
                lines += [f"      {frame.filename}:{frame.lineno}" for frame in stat.traceback[:frames]]
        if os.environ.get("BENCH_MEMPROBE_TRIM"):  # what glibc would give back, were it asked
            started = time.perf_counter()
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            took = time.perf_counter() - started
            trimmed = figures()
            lines += ["", f"# after malloc_trim(0) at mid-stream ({took * 1000:.1f} ms)", ""]
            for key in ("VmRSS", "RssAnon", "malloc free in arenas (fordblks)", "malloc sbrk+arenas (arena)"):
                growth = trimmed.get(key, 0) - base.get(key, 0)
                lines.append(f"{key:55s} {trimmed.get(key, 0):>14,}  growth per run {growth / seen:>+11,.0f}")
        out.write_text("\n".join(lines) + "\n")

    threading.Thread(target=watch, name="bench-memprobe", daemon=True).start()


def _snapshot() -> Any:
    import tracemalloc

    return tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap*")]
    )
