"""The process's catch-up check: every socket watching a run that is not over, checked together.

Frames can be lost on the way without any later frame showing the gap (a Redis restart drops
a run's last frames, its end included). So every ``LIVE_CHECK_SECONDS`` each such socket is
compared with the run: its status in the database and the replay buffer's last seq. A socket
still behind at the next check (frames in flight at the first have arrived by the second) is
caught up: the missed frames, or a snapshot when the buffer lacks them or the run has ended.

One check per event loop serves all its sockets: one status read for all their runs and one
Redis round trip for their buffers' last seqs per interval. Each socket checking on its own
timer cost, at 500 sockets, a hundred database reads a second (each with its connection's
health check) and as many Redis round trips, all through Daphne's one thread for the ORM.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import structlog
from channels.db import database_sync_to_async

from ..conf import app_settings
from ..engine.protocol import TERMINAL_STATUSES
from ..models import Run
from .buffer import FrameBuffer

log = structlog.get_logger("streamrecover.live")


class Watcher(Protocol):
    """A socket the check looks after (``consumer.RunConsumer``)."""

    run_id: str
    last_seq: int  # the last frame the client has

    @property
    def buffer(self) -> FrameBuffer: ...

    async def catch_up(self) -> bool:
        """Send the missed frames or a snapshot; True when the client now has the run's end."""
        ...


@dataclass(slots=True)
class _Watch:
    behind_at: int | None = None  # the client's seq when it was first seen behind
    catching_up: bool = False


def _statuses(run_ids: list[str]) -> dict[str, str]:
    """Each run's status, by id (a run that is gone is absent)."""
    return {str(pk): status for pk, status in Run.objects.filter(pk__in=run_ids).values_list("pk", "status")}


class CatchUpCheck:
    """The sockets of one event loop that watch a run not yet over, and the task checking them."""

    def __init__(self) -> None:
        self._watched: dict[Watcher, _Watch] = {}
        self._task: asyncio.Task[None] | None = None
        self._catch_ups: set[asyncio.Task[None]] = set()

    def watch(self, watcher: Watcher) -> None:
        """Check ``watcher`` from the next interval on (not at all when the interval is 0)."""
        if float(app_settings.LIVE_CHECK_SECONDS) <= 0:
            return
        self._watched[watcher] = _Watch()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def forget(self, watcher: Watcher) -> None:
        self._watched.pop(watcher, None)

    def watching_any(self) -> bool:
        return bool(self._watched)

    async def _run(self) -> None:
        while self._watched:
            interval = float(app_settings.LIVE_CHECK_SECONDS)
            if interval <= 0:
                self._watched.clear()
                return
            await asyncio.sleep(interval)
            try:
                await self.check_now()
            except Exception:  # a database hiccup: try again at the next interval
                log.exception("live_check_failed", sockets=len(self._watched))

    async def check_now(self) -> None:
        """One check of every watched socket."""
        watched = [w for w, state in self._watched.items() if not state.catching_up]
        if not watched:
            return
        statuses = await database_sync_to_async(_statuses)(sorted({w.run_id for w in watched}))
        for buffer, group in _by_buffer(watched):
            going = sorted({w.run_id for w in group if statuses.get(w.run_id) not in (None, *TERMINAL_STATUSES)})
            ended = sorted({w.run_id for w in group if statuses.get(w.run_id) in TERMINAL_STATUSES})
            last: dict[str, int] = {}
            end_seqs: dict[str, int | None] = {}
            try:
                if going:
                    last = await buffer.last_seqs(going)
                for run_id in ended:  # once per run, as it ends: its buffered end, if any
                    state = await buffer.state(run_id)
                    end_seqs[run_id] = state.seq if state is not None and state.status in TERMINAL_STATUSES else None
            except Exception:  # the buffer is down: the runs still going are left for the next check
                log.exception("live_buffer_read_failed", runs=len(going) + len(ended))
                last = {}
                end_seqs = {run_id: None for run_id in ended}
            for watcher in group:
                self._judge(watcher, statuses.get(watcher.run_id), last, end_seqs)

    def _judge(
        self, watcher: Watcher, status: str | None, last: dict[str, int], end_seqs: dict[str, int | None]
    ) -> None:
        state = self._watched.get(watcher)
        if state is None:  # gone while the reads were awaited
            return
        if status is None:  # the run is gone
            self.forget(watcher)
            return
        if status in TERMINAL_STATUSES:
            end = end_seqs.get(watcher.run_id)
            if end is not None and end <= watcher.last_seq:  # the client has the end
                self.forget(watcher)
                return
            behind = True
        else:
            seq = last.get(watcher.run_id)
            behind = seq is not None and seq > watcher.last_seq
        if not behind:
            state.behind_at = None
        elif state.behind_at != watcher.last_seq:
            state.behind_at = watcher.last_seq  # behind once: frames may still be on the way
        else:
            state.catching_up = True
            task = asyncio.ensure_future(self._catch_up(watcher, state))
            self._catch_ups.add(task)
            task.add_done_callback(self._catch_ups.discard)

    async def _catch_up(self, watcher: Watcher, state: _Watch) -> None:
        try:
            if await watcher.catch_up():
                self.forget(watcher)
        except Exception:
            log.exception("live_check_failed", run_id=watcher.run_id)
        state.behind_at = None
        state.catching_up = False


def _by_buffer(watchers: Iterable[Watcher]) -> list[tuple[FrameBuffer, list[Watcher]]]:
    groups: dict[int, tuple[FrameBuffer, list[Watcher]]] = {}
    for watcher in watchers:
        buffer = watcher.buffer
        groups.setdefault(id(buffer), (buffer, []))[1].append(watcher)
    return list(groups.values())


_checks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CatchUpCheck] = weakref.WeakKeyDictionary()


def catch_up_check() -> CatchUpCheck:
    """The running loop's check."""
    loop = asyncio.get_running_loop()
    check = _checks.get(loop)
    if check is None:
        check = _checks[loop] = CatchUpCheck()
    return check
