"""CPU seconds and memory per process (psutil), so a bench says where the time went.

A ``CpuMeter`` is told which processes play which role (a worker and its children, Daphne,
the fake provider, this process as the clients; Redis and PostgreSQL found by name), reads
their CPU times when the measured phase starts and again when it ends, and gives the
difference per role. PostgreSQL backends are counted only when they serve the bench's own
database (``pg_stat_activity``); Redis is one shared server, so its figure includes whatever
else uses it at the time (said in the report).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil


def _cpu(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
        return float(times.user + times.system)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def by_name(name: str) -> list[int]:
    """Pids of the processes whose name is ``name`` (``redis-server``, ``postgres``)."""
    pids = []
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == name:
            pids.append(process.pid)
    return pids


def rss_mib(pids: Iterable[int]) -> float:
    total = 0
    for pid in pids:
        for process in _tree(pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                total += process.memory_info().rss
    return total / (1024 * 1024)


@dataclass(slots=True)
class CpuMeter:
    """Roles -> a function giving the role's root pids now (children are included)."""

    roles: dict[str, Callable[[], Iterable[int]]]
    trees: set[str] = field(default_factory=set)  # roles whose children count too
    _start: dict[int, float] = field(default_factory=dict)

    def _pids(self, role: str) -> list[int]:
        pids: list[int] = []
        for pid in self.roles[role]():
            pids.extend(p.pid for p in _tree(pid)) if role in self.trees else pids.append(pid)
        return pids

    def start(self) -> None:
        self._start = {}
        for role in self.roles:
            for pid in self._pids(role):
                with contextlib.suppress(psutil.NoSuchProcess):
                    self._start[pid] = _cpu(psutil.Process(pid))

    def stop(self) -> dict[str, float]:
        """CPU seconds used per role since ``start`` (a process born since counts whole)."""
        used: dict[str, float] = {}
        for role in self.roles:
            total = 0.0
            for pid in self._pids(role):
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += _cpu(psutil.Process(pid)) - self._start.get(pid, 0.0)
            used[role] = total
        return used
