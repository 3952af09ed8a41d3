"""Heartbeats and cancel requests of every run on one event loop, in one query each.

A heartbeat is fenced: it beats only where the run's claim epoch is still the one the worker
claimed with; a run whose claim is lost has its task cancelled at once (``runs/fence.py``).

Each run used to poll the database for its own cancel request four times a second and beat
its own heartbeat: a hundred runs on a worker were four hundred queries a second, all through
the one thread the async ORM uses. One watcher per loop asks once per tick for the cancel
requests of all its runs and beats all their heartbeats in one update.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import structlog
from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.db.models import Q
from django.utils import timezone

from ..conf import app_settings
from ..engine.cancel import CancelToken
from ..models import Run
from .cancels import cancel_message
from .fence import Fence, again_on_a_fresh_connection

log = structlog.get_logger("streamrecover")

POLL_S = 0.25  # how soon a cancel request is noticed


@dataclass(slots=True)
class _Watched:
    cancel: CancelToken
    fence: Fence
    running: asyncio.Task[Any]  # cancelled when the claim is lost


def _beat(fences: list[Fence]) -> set[str]:
    """One update for all the runs' heartbeats, each only where its claim is still current;
    the ids of the runs whose claim is lost."""
    live = [f for f in fences if not f.lost]
    if not live:
        return set()
    # One ``pk IN (...)`` per claim epoch, not one ``(pk, epoch)`` pair per run: almost every
    # run is on its first claim, and building a condition of hundreds of OR'd pairs held the
    # GIL for ~16 ms at 250 runs, against ~1 ms for this (the loop's frames wait meanwhile).
    by_epoch: dict[int, list[str]] = {}
    for fence in live:
        by_epoch.setdefault(fence.epoch, []).append(fence.run_id)
    current = Q()
    for epoch, run_ids in by_epoch.items():
        current |= Q(pk__in=run_ids, claim_epoch=epoch)
    if Run.objects.filter(current).update(heartbeat_at=timezone.now()) == len(live):
        return set()
    held = {str(pk) for pk in Run.objects.filter(current).values_list("pk", flat=True)}
    return {f.run_id for f in live if f.run_id not in held}


def _cancels(run_ids: list[str]) -> dict[str, str]:
    rows = Run.objects.filter(Q(pk__in=run_ids) & Q(cancel_requested=True)).values_list("pk", "cancel_reason")
    return {str(pk): cancel_message(reason) for pk, reason in rows}


class Watcher:
    """The loop's watched runs and the task that polls for them while there are any."""

    def __init__(self) -> None:
        self.runs: dict[str, _Watched] = {}
        self._task: asyncio.Task[None] | None = None
        self._last_beat = 0.0

    def add(self, cancel: CancelToken, fence: Fence, running: asyncio.Task[Any]) -> None:
        # No beat of its own: its claim wrote its heartbeat a moment ago (a beat at each arrival
        # beat every run of the loop again at the next tick).
        self.runs[fence.run_id] = _Watched(cancel, fence, running)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._poll())

    def discard(self, fence: Fence) -> None:
        """Stop watching ``fence``'s claim. Only its own entry goes: a newer claim of the same
        run by this process (a stale run swept and claimed again) has replaced it, and that
        claim must go on being beaten and checked for cancels while the old one unwinds."""
        watched = self.runs.get(fence.run_id)
        if watched is not None and watched.fence is fence:
            del self.runs[fence.run_id]

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while self.runs:
            try:
                await self._tick(loop.time())
            except Exception:  # the database is away: try again at the next tick
                log.exception("run_watch_failed", runs=len(self.runs))
                await sync_to_async(close_old_connections)()  # a broken connection is not reused
            await asyncio.sleep(min(POLL_S, float(app_settings.HEARTBEAT_SECONDS)))

    def _beaten(self, watched: _Watched, lost: set[str], sent: float) -> None:
        """What a beat sent at ``sent`` found of one claim it was for: renewed, or lost. A lost
        claim's fence refuses every later write; its task is cancelled while it is the claim the
        run is watched for (not once a newer claim of the run took its place, nor once it left)."""
        fence = watched.fence
        if fence.run_id not in lost:
            fence.renewed(sent)
            return
        fence.lose()
        log.warning("run_claim_lost", run_id=fence.run_id, epoch=fence.epoch, noticed_by="heartbeat")
        if self.runs.get(fence.run_id) is watched:
            del self.runs[fence.run_id]
            watched.running.cancel()

    async def _tick(self, now: float) -> None:
        if now - self._last_beat >= float(app_settings.HEARTBEAT_SECONDS):
            self._last_beat = now
            sent = time.monotonic()
            # The claims this beat is for: a run may be claimed again by this process while the
            # beat is on its way (the sweep took a stale claim back), and what the beat found
            # out about the old claim says nothing of the new one.
            beaten = list(self.runs.values())
            fences = [w.fence for w in beaten]
            # a terminated connection is replaced at once, not a tick later (past the leases)
            lost = await sync_to_async(again_on_a_fresh_connection)(lambda: _beat(fences))
            for watched in beaten:
                self._beaten(watched, lost, sent)
        cancels = await sync_to_async(_cancels)(list(self.runs))
        for run_id, reason in cancels.items():
            asked = self.runs.pop(run_id, None)
            if asked is not None:
                asked.cancel.cancel(reason)


_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Watcher] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def watching(fence: Fence, cancel: CancelToken, running: asyncio.Task[Any]) -> Iterator[None]:
    """Beat the run's heartbeat and notice a cancel request while the block runs; a heartbeat
    that finds the claim taken over cancels the run's task (``running``) at once.

    The loop's one watcher does the work: a run only joins and leaves it, so it costs the run
    no task of its own (a task, its coroutine and an event that only waited for the run's end
    were about 2 KB of every active run)."""
    watcher = _watchers.setdefault(asyncio.get_running_loop(), Watcher())
    watcher.add(cancel, fence, running)
    try:
        yield
    finally:
        watcher.discard(fence)


async def watch(fence: Fence, cancel: CancelToken, running: asyncio.Task[Any]) -> None:
    """``watching`` as a task: until it is cancelled."""
    with watching(fence, cancel, running), contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()
