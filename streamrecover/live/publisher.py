"""The run's live publisher: a ``RunSink`` that coalesces deltas and sends frames out.

A per-token ``group_send`` cannot serve even a few busy streams, so consecutive
deltas of one block are merged into one frame until ``FRAME_COALESCE_MS`` has passed since
the first of them or the text reaches ``FRAME_MAX_CHARS``. A merged frame keeps the last
seq and says where it starts (``first_seq``), so a client can still tell a gap from a
merge. Strings are joined whole: nothing is ever split, so no character is. Any other frame
first flushes the pending delta, so the order never changes.

Each frame goes into the replay buffer, then to the run's watchers. On the distributed setup
(channels_redis' pub/sub layer on the buffer's Redis) a frame is encoded once and handed to
the loop's ``Outbox``, which sends every run's frames in one script call per round trip, on
each run's frames channel (``fanout``); otherwise each frame is one buffer write and one
``group_send``.

With ``STREAMRECOVER_FRAME_TIMESTAMPS=1`` in the worker's environment every frame carries
``debug_ts``: when its first delta reached the publisher (``in``) and when it was published
(``out``), in Unix seconds; the delivery benchmark measures latency with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import structlog
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from ..engine.protocol import DELTA_FIELDS, Frame, FrameKind, RunStatus, RunStatusFrame
from ..engine.sink import BaseSink
from .buffer import FrameBuffer, RedisFrameBuffer, shared_writer_buffer, writer_buffer
from .delivery import FRAME_EVENT, group_name, group_send
from .outbox import Outbox, outbox_for
from .state import RunState

log = structlog.get_logger("streamrecover.live")

TIMESTAMPS_ENV = "STREAMRECOVER_FRAME_TIMESTAMPS"
PAUSE_AFTER_FAILURE_S = 5.0  # after a failed buffer write or group_send, skip it this long
ANNOUNCE_TIMEOUT_S = 5.0  # a queued run's cancel waits at most this long for its frame to go out


def _mergeable(pending: dict[str, Any] | None, frame: dict[str, Any]) -> bool:
    return (
        pending is not None
        and pending["type"] == frame["type"]
        and pending.get("block") == frame.get("block")
        and pending.get("id") == frame.get("id")
    )


def _merged(pending: dict[str, Any], frame: dict[str, Any]) -> dict[str, Any]:
    name = DELTA_FIELDS[frame["type"]]
    first = pending.get("first_seq", pending["seq"])
    return {**pending, name: pending.get(name, "") + frame.get(name, ""), "seq": frame["seq"], "first_seq": first}


class _Deadlines:
    """Every publisher's pending delta on one loop, flushed from one timer: a frame's timer and
    task each (``call_later`` then ``ensure_future``) were a tenth of a busy worker's time.

    Entries are never removed: a publisher that flushed early ignores its stale deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Publisher]] = []
        self._count = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, when: float, publisher: Publisher) -> None:
        self._count += 1
        heapq.heappush(self._heap, (when, self._count, publisher))
        if self._timer is None or when < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        while self._heap and self._heap[0][0] <= now + 0.001:
            _, _, publisher = heapq.heappop(self._heap)
            publisher._due()
        if self._heap:
            self._timer = self._loop.call_at(self._heap[0][0], self._fire)


_deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deadlines] = weakref.WeakKeyDictionary()


def _deadlines_here() -> _Deadlines:
    loop = asyncio.get_running_loop()
    found = _deadlines.get(loop)
    if found is None:
        found = _deadlines[loop] = _Deadlines(loop)
    return found


class Publisher(BaseSink):
    """``RunSink`` for one run's frames; ``last_seq`` is the last frame number kept.

    What to send and when is decided without awaiting (``_take``), so frames are numbered and
    ordered as they come; through an ``Outbox`` sending awaits nothing either, otherwise frames
    queue in that order and each one's buffer write and ``group_send`` are awaited in turn."""

    def __init__(
        self,
        run_id: str,
        buffer: FrameBuffer,
        layer: Any,
        *,
        coalesce_s: float,
        max_chars: int,
        last_seq: int = 0,
        own_buffer: bool = False,
        timestamps: bool = False,
        clock: Callable[[], float] = time.monotonic,
        outbox: Outbox | None = None,
        writer_state: RunState | None = None,
    ) -> None:
        self.run_id = run_id
        self.outbox = outbox
        self._channel = outbox.channel(run_id) if outbox is not None else ""
        self.group = group_name(run_id)
        self.buffer = buffer
        self.layer = layer
        self.coalesce_s = coalesce_s
        self.max_chars = max(1, max_chars)
        self.last_seq = last_seq
        self.sent = 0  # frames published
        self._own_buffer = own_buffer
        self.timestamps = timestamps
        self._clock = clock
        self._lock = asyncio.Lock()
        self._pending: dict[str, Any] | None = None
        self._deadline = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        # taken, not yet sent (without an outbox; made on first use: an empty deque is 760 bytes,
        # and a worker's publishers, one per run it holds, all have an outbox)
        self._queue: deque[dict[str, Any]] | None = None
        self._buffer_down_until = 0.0
        self._layer_down_until = 0.0
        self._abandoned = False
        self._writer_state = writer_state  # this claim's state in a shared buffer, to release

    # ---- RunSink ------------------------------------------------------------------------

    async def on_frame(self, frame: Frame) -> None:
        # The publisher relays frames without looking into their kinds' shapes, but for a text
        # delta's token logprobs: they are for the healing endpoint, not for browsers (nor the buffer).
        relayed = cast("dict[str, Any]", frame)
        if "logprobs" in relayed:
            relayed = {name: value for name, value in relayed.items() if name != "logprobs"}
        ready = self._take(relayed)
        if ready:
            await self._deliver(ready)

    def _take(self, frame: dict[str, Any]) -> list[dict[str, Any]]:
        """Fold ``frame`` into the pending delta or not; the frames now ready to send, in order."""
        if self.timestamps:
            frame = {**frame, "debug_ts": {"in": time.time()}}
        kind = frame.get("type")
        name = DELTA_FIELDS.get(kind) if isinstance(kind, str) else None
        if name is None:
            return [*self._take_pending(), frame]
        text = frame.get(name, "")
        pending = self._pending
        if (
            pending is not None
            and _mergeable(pending, frame)
            and len(pending.get(name, "")) + len(text) <= self.max_chars
        ):
            self._pending = merged = _merged(pending, frame)
            if self._clock() >= self._deadline or len(merged[name]) >= self.max_chars:
                return self._take_pending()
            return []
        ready = self._take_pending()
        if self.coalesce_s <= 0 or len(text) >= self.max_chars:
            return [*ready, frame]
        self._pending = dict(frame)
        self._deadline = self._clock() + self.coalesce_s
        _deadlines_here().add(asyncio.get_running_loop().time() + self.coalesce_s, self)
        return ready

    def _take_pending(self) -> list[dict[str, Any]]:
        pending, self._pending = self._pending, None
        return [] if pending is None else [pending]

    def _due(self) -> None:
        """The loop's timer: send the pending delta if its window is over (else it went already,
        or a later one is pending with a deadline of its own)."""
        if self._pending is None or self._clock() < self._deadline - 0.001:
            return
        # handed over now, not in the task: a frame taken after it goes after it
        if self._hand_over(self._take_pending()):
            task = asyncio.ensure_future(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ---- sending ------------------------------------------------------------------------

    def _hand_over(self, frames: list[dict[str, Any]]) -> bool:
        """Frames to the outbox, or onto the queue in the order taken; True for the queue: the
        caller drains it (even empty, draining waits for a drain under way to end)."""
        if self.outbox is not None:
            self._put(frames)
            return False
        if self._queue is None:
            self._queue = deque()
        self._queue.extend(frames)
        return True

    async def _deliver(self, frames: list[dict[str, Any]]) -> None:
        if self._hand_over(frames):
            await self._drain()

    async def _drain(self) -> None:
        """Send the queued frames in the order they were taken, whoever gets the lock first."""
        async with self._lock:
            while self._queue:
                await self._send(self._queue.popleft())

    def _stamped(self, frame: dict[str, Any]) -> dict[str, Any]:
        if self.timestamps:
            frame = {**frame, "debug_ts": {**frame.get("debug_ts", {}), "out": time.time()}}
        self.last_seq = max(self.last_seq, int(frame.get("seq") or 0))
        self.sent += 1
        return frame

    def _put(self, frames: list[dict[str, Any]]) -> None:
        """Hand frames to the outbox: encoded once, sent by its flusher (awaits nothing)."""
        assert self.outbox is not None
        for frame in frames:
            if self._abandoned:
                return
            frame = self._stamped(frame)
            text = json.dumps(frame, separators=(",", ":"), ensure_ascii=False)  # the one encoding
            self.outbox.put(self.run_id, self._channel, frame, text)

    async def _send(self, frame: dict[str, Any]) -> None:
        """One frame to the buffer, then to the group (caller holds the lock)."""
        if self._abandoned:
            return
        frame = self._stamped(frame)
        now = self._clock()
        if now < self._buffer_down_until and isinstance(self.buffer, RedisFrameBuffer):
            self.buffer.skip(self.run_id, frame)  # not written: its state still goes on
        if now >= self._buffer_down_until:
            try:
                await self.buffer.append(self.run_id, frame)
            except Exception:
                # Live delivery must never stall the run: skip the buffer for a while. A client
                # that misses frames sees the gap and gets a snapshot from the database.
                self._buffer_down_until = self._clock() + PAUSE_AFTER_FAILURE_S
                log.exception("live_buffer_append_failed", run_id=self.run_id, seq=frame.get("seq"))
        if self.layer is None or now < self._layer_down_until:
            return
        try:
            await group_send(self.layer, self.group, {"type": FRAME_EVENT, "frame": frame})
        except Exception:
            self._layer_down_until = self._clock() + PAUSE_AFTER_FAILURE_S
            log.exception("live_group_send_failed", run_id=self.run_id, seq=frame.get("seq"))

    async def flush(self) -> None:
        """Send the pending delta; return once every frame taken so far is sent (or handed to
        the outbox)."""
        await self._deliver(self._take_pending())

    def abandon(self) -> None:
        """The worker lost its claim of the run: send nothing more, not even the held-back delta,
        and leave the replay buffer to the run's new owner (``aclose`` then only lets go)."""
        self._abandoned = True
        self._pending = None
        if self._writer_state is not None and isinstance(self.buffer, RedisFrameBuffer):
            # finish never runs for this claim: its state would stay in the worker's buffer
            self.buffer.release(self.run_id, self._writer_state)

    async def aclose(self) -> None:
        """Flush, let the buffered frames expire in a while, release the connections."""
        if self._abandoned:
            for task in list(self._tasks):
                task.cancel()
            if self._own_buffer:
                with contextlib.suppress(Exception):
                    await self.buffer.aclose()
            return
        await self.flush()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.outbox is not None:
            await self.outbox.barrier()  # every frame sent before the keys start to expire
        try:
            await self.buffer.finish(self.run_id)
        except Exception:
            log.exception("live_buffer_finish_failed", run_id=self.run_id)
        finally:
            if self._own_buffer:
                await self.buffer.aclose()


async def make_publisher(run_id: str, *, buffer: FrameBuffer | None = None, layer: Any = None) -> Publisher:
    """The publisher for ``run_id`` on the configured buffer and channel layer; numbering goes
    on from the highest seq already kept (a run resumed by another worker)."""
    from ..conf import app_settings
    from ..runs.loop import on_shared_loop

    shared = buffer is None and on_shared_loop()
    own = buffer is None and not shared
    # On the worker's shared loop every run writes through one buffer (one Redis client).
    buffer = buffer or (shared_writer_buffer() if shared else writer_buffer())
    layer = layer if layer is not None else get_channel_layer()
    outbox = outbox_for(buffer, layer)
    writer_state = None
    try:
        if isinstance(buffer, RedisFrameBuffer):
            # A worker's shared buffer may still hold this run's state from an earlier claim of
            # its own (lost, then the run streamed on elsewhere): numbering goes on from Redis,
            # from the last seq kept when this claim fenced the earlier ones' late frames out.
            buffer.release(run_id)
            writer_state = await buffer.prepare(run_id)
            last_seq = buffer.fenced_seq(run_id)
        else:
            last_seq = await buffer.last_seq(run_id)
    except Exception:  # no buffer: the run goes on, clients get snapshots
        log.exception("live_buffer_unavailable", run_id=run_id)
        last_seq = 0
        outbox = None
    return Publisher(
        run_id,
        buffer,
        layer,
        coalesce_s=float(app_settings.FRAME_COALESCE_MS) / 1000.0,
        max_chars=int(app_settings.FRAME_MAX_CHARS),
        last_seq=last_seq,
        own_buffer=own,
        timestamps=os.environ.get(TIMESTAMPS_ENV) == "1",
        outbox=outbox,
        writer_state=writer_state,
    )


async def publish_cancelled_in_queue(run_id: str, error: dict[str, str]) -> None:
    """The end of a run cancelled while queued, as a worker publishes a run's end: one
    ``run_status`` frame with the error a worker's cancel ends with (``runs.cancels``), kept in
    the buffer (which expires as any ended run's) and sent to the run's group, which every
    socket watching it has joined. Numbered as a new claim's first
    frame: after an earlier claim's frames one seq is left out, so its clients take a snapshot
    (with whatever that claim committed). Only ``lifecycle.request_cancel`` decides that no
    worker sends it, so nothing else numbers this run's frames now."""
    from ..conf import app_settings

    buffer = writer_buffer()
    try:
        last_seq = await buffer.last_seq(run_id)
        # Without the outbox: outboxes stay on their loop, and this may be a Daphne's.
        publisher = Publisher(
            run_id,
            buffer,
            get_channel_layer(),
            coalesce_s=0.0,
            max_chars=int(app_settings.FRAME_MAX_CHARS),
            last_seq=last_seq,
        )
        seq = last_seq + 2 if last_seq else 1
        await publisher.on_frame(
            RunStatusFrame(type=FrameKind.RUN_STATUS, run_id=run_id, seq=seq, status=RunStatus.CANCELLED, error=error)
        )
        await publisher.aclose()  # the buffer's keys expire as an ended run's
    finally:
        await buffer.aclose()  # this loop's client, even when the time ran out


async def _publish_cancelled_in_time(run_id: str, error: dict[str, str]) -> None:
    await asyncio.wait_for(publish_cancelled_in_queue(run_id, error), ANNOUNCE_TIMEOUT_S)


def announce_cancelled_in_queue(run_id: str, error: dict[str, str]) -> None:
    """``publish_cancelled_in_queue`` from the thread whose transaction cancelled the run (on a
    Daphne's database thread it runs on the sockets' loop). Best effort: the cancel stands, and
    a socket that misses the frame learns of it at its next catch-up check."""
    try:
        async_to_sync(_publish_cancelled_in_time)(run_id, error)
    except Exception:
        log.exception("live_cancel_publish_failed", run_id=run_id)
