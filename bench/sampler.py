"""A sampling profiler for every thread of a process (py-spy style, in pure Python).

cProfile sees one thread and slows it several times; a worker serving many runs spends its
time across threads and event loops. This samples ``sys._current_frames()`` every few
milliseconds from a daemon thread and counts, per function, the samples in which it was on
some thread's stack (inclusive) and at its top (self). Threads parked in a wait (a selector,
a lock, a queue) are left out, so the counts approximate CPU time, with a bias: the sampler
itself runs only when it holds the GIL, mostly while the other threads are in system calls
(which release it), so socket sends and receives are over-counted. ``py-spy record --gil``
(outside the process, only the thread that holds the GIL) is the unbiased view. Started by
``bench.delivery_settings`` when ``BENCH_PROFILE`` names an output file; the report is
rewritten every few seconds, so a worker stopped by a signal still leaves one.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from pathlib import Path
from types import FrameType

# Leaf functions that mean "this thread is waiting, not running".
IDLE_LEAVES = frozenset(
    {
        "select",
        "poll",
        "epoll",
        "wait",
        "_wait_for_tstate_lock",
        "acquire",
        "get",
        "sleep",
        "accept",
        "recv",
        "recv_into",
        "read",
        "readline",
        "_worker",
    }
)


def _name(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    for marker in ("site-packages/", "lib/python3.11/", "/streamrecover/", "/bench/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{code.co_name}"


class Sampler:
    def __init__(self, out: Path, interval_s: float = 0.005, write_every_s: float = 3.0, only: str = "") -> None:
        self.out = out
        self.only = only  # sample only the threads whose name starts with this
        self.interval_s = interval_s
        self.write_every_s = write_every_s
        self.samples = 0
        self.busy = 0
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.own: collections.Counter[str] = collections.Counter()
        self._me = 0

    def start(self) -> None:
        thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)
        thread.start()

    def _loop(self) -> None:
        self._me = threading.get_ident()
        last_write = time.monotonic()
        while True:
            time.sleep(self.interval_s)
            self._sample()
            if time.monotonic() - last_write >= self.write_every_s:
                self.write()
                last_write = time.monotonic()

    def _sample(self) -> None:
        self.samples += 1
        threads = threading.enumerate()
        mine = {t.ident for t in threads if t.name.startswith("bench-")}
        if self.only:
            mine |= {t.ident for t in threads if not t.name.startswith(self.only)}
        for ident, frame in sys._current_frames().items():
            if ident in mine or frame.f_code.co_name in IDLE_LEAVES:
                continue
            self.busy += 1
            self.own[_name(frame)] += 1
            seen = set()
            walk: FrameType | None = frame
            while walk is not None:
                name = _name(walk)
                if name not in seen:
                    seen.add(name)
                    self.inclusive[name] += 1
                walk = walk.f_back

    def write(self, top: int = 60) -> None:
        busy = max(1, self.busy)
        lines = [f"# pid {os.getpid()}: {self.samples} ticks, {self.busy} busy thread-samples", "", "## self", ""]
        lines += [f"{100 * n / busy:5.1f}%  {name}" for name, n in self.own.most_common(top)]
        lines += ["", "## inclusive", ""]
        lines += [f"{100 * n / busy:5.1f}%  {name}" for name, n in self.inclusive.most_common(top)]
        self.out.write_text("\n".join(lines) + "\n")


def start_from_env(variable: str = "BENCH_PROFILE") -> Sampler | None:
    """Start sampling when ``variable`` names an output file (``{pid}`` is replaced)."""
    target = os.environ.get(variable)
    if not target:
        return None
    only = os.environ.get(variable + "_THREAD", "")
    sampler = Sampler(Path(target.replace("{pid}", str(os.getpid()))), only=only)
    sampler.start()
    return sampler
