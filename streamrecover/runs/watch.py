"""Heartbeats and cancel requests of every run on one event loop, in one query each.

Each run used to poll the database for its own cancel request four times a second and beat
its own heartbeat: a hundred runs on a worker were four hundred queries a second, all through
the one thread the async ORM uses. One watcher per loop asks once per tick for the cancel
requests of all its runs and beats all their heartbeats in one update.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from dataclasses import dataclass

import structlog
from asgiref.sync import sync_to_async
from django.db.models import Q
from django.utils import timezone

from ..conf import app_settings
from ..engine.cancel import CancelToken
from ..models import Run

log = structlog.get_logger("streamrecover")

POLL_S = 0.25  # how soon a cancel request is noticed


@dataclass(slots=True)
class _Watched:
    cancel: CancelToken
    worker: str


def _beat(runs: dict[str, str]) -> None:
    """One update per worker name: the runs' heartbeats (only where that worker still holds them)."""
    now = timezone.now()
    by_worker: dict[str, list[str]] = {}
    for run_id, worker in runs.items():
        by_worker.setdefault(worker, []).append(run_id)
    for worker, run_ids in by_worker.items():
        Run.objects.filter(pk__in=run_ids, worker=worker).update(heartbeat_at=now)


def _cancels(run_ids: list[str]) -> dict[str, str]:
    rows = Run.objects.filter(Q(pk__in=run_ids) & Q(cancel_requested=True)).values_list("pk", "cancel_reason")
    return {str(pk): reason or "cancelled by user" for pk, reason in rows}


class Watcher:
    """The loop's watched runs and the task that polls for them while there are any."""

    def __init__(self) -> None:
        self.runs: dict[str, _Watched] = {}
        self._task: asyncio.Task[None] | None = None
        self._last_beat = 0.0

    def add(self, run_id: str, cancel: CancelToken, worker: str) -> None:
        self.runs[run_id] = _Watched(cancel, worker)
        self._last_beat = 0.0  # beat at the next tick: the new run is alive
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._poll())

    def discard(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while self.runs:
            try:
                await self._tick(loop.time())
            except Exception:  # the database is away: try again at the next tick
                log.exception("run_watch_failed", runs=len(self.runs))
            await asyncio.sleep(min(POLL_S, float(app_settings.HEARTBEAT_SECONDS)))

    async def _tick(self, now: float) -> None:
        if now - self._last_beat >= float(app_settings.HEARTBEAT_SECONDS):
            self._last_beat = now
            await sync_to_async(_beat)({run_id: w.worker for run_id, w in self.runs.items()})
        cancels = await sync_to_async(_cancels)(list(self.runs))
        for run_id, reason in cancels.items():
            watched = self.runs.pop(run_id, None)
            if watched is not None:
                watched.cancel.cancel(reason)


_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Watcher] = weakref.WeakKeyDictionary()


async def watch(run_id: str, cancel: CancelToken, worker: str) -> None:
    """Beat the run's heartbeat and notice a cancel request until this task is cancelled."""
    watcher = _watchers.setdefault(asyncio.get_running_loop(), Watcher())
    watcher.add(run_id, cancel, worker)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()  # until cancelled by the run's end
    finally:
        watcher.discard(run_id)
