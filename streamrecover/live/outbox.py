"""The outbox: every run's frames on one event loop leave in one Redis pipeline per round trip.

A frame used to cost two awaited round trips of its own (the replay buffer's ``XADD``, then
the channel layer's ``PUBLISH``, which channels_redis serialises behind one lock per
connection). With a hundred runs on one loop they queued behind each other. Here a
publisher hands over the frame encoded once (its JSON text) and returns at once; one flusher
task per loop sends whatever has gathered since its last send in one pipeline: per frame the
buffer's ``XADD`` (the state hash now and then) and the ``PUBLISH`` on the run's frames
channel, in the order the frames were put. Nothing waits for a window: the next pipeline starts as soon
as the previous one is answered, so under load a pipeline carries many frames and when idle
a frame leaves alone.

Used when the channel layer is channels_redis' pub/sub layer on the same Redis as the
replay buffer (the distributed setup); any other layer keeps one ``group_send`` per frame.
The message is ``<seq> <frame JSON>`` on the run's own channel (``fanout.frames_channel``),
read by each Daphne's ``fanout.Fanout``, not by the layer: a consumer sends the text as it is,
without decoding or encoding it again.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass
from typing import Any

import structlog

from .buffer import RedisFrameBuffer, flush_fields
from .fanout import direct_frames, encode_message, frames_channel

log = structlog.get_logger("streamrecover.live")

PAUSE_AFTER_FAILURE_S = 5.0  # after a failed pipeline, drop frames this long (the run goes on)


@dataclass(slots=True)
class _Item:
    run_id: str
    channel: str
    frame: dict[str, Any]
    text: str


class Outbox:
    """One per event loop and buffer: ``put`` stages a frame, a flusher task sends them."""

    def __init__(self, buffer: RedisFrameBuffer) -> None:
        self.buffer = buffer
        self._pending: list[_Item] = []
        self._flusher: asyncio.Task[None] | None = None
        self._down_until = 0.0
        self.pipelines = 0  # pipelines sent
        self.frames = 0  # frames sent

    def channel(self, run_id: str) -> str:
        """The Redis channel the run's frames go out on (read by ``fanout.Fanout``)."""
        return frames_channel(self.buffer, run_id)

    def put(self, run_id: str, channel: str, frame: dict[str, Any], text: str) -> None:
        self._pending.append(_Item(run_id, channel, frame, text))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_all())

    async def barrier(self) -> None:
        """Return once every frame put so far has been sent (or dropped)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _flush_all(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            if time.monotonic() < self._down_until:
                for item in batch:  # not sent, but the runs' buffered state goes on
                    self.buffer.skip(item.run_id, item.frame)
                continue
            try:
                await self._send(batch)
            except Exception:
                # Live delivery must never stall a run: drop for a while. A client that misses
                # frames sees the gap (or the consumer's check does) and gets a snapshot; the
                # runs' states are saved whole with their next frames, across the hole.
                self._down_until = time.monotonic() + PAUSE_AFTER_FAILURE_S
                for run_id in {item.run_id for item in batch}:
                    self.buffer.unsaved(run_id)
                log.exception("live_outbox_failed", frames=len(batch))

    async def _send(self, batch: list[_Item]) -> None:
        buffer = self.buffer
        fields: list[Any] = []
        for item in batch:
            try:
                write = buffer.planned_write(item.run_id, item.frame, item.text)
            except KeyError:  # the run's buffer was finished already: publish, keep nothing
                log.warning("live_outbox_run_finished", run_id=item.run_id, seq=item.frame.get("seq"))
                write = None
            fields += flush_fields(write, item.channel, encode_message(int(item.frame.get("seq") or 0), item.text))
        refused = await buffer.flush(fields)
        self.pipelines += 1
        self.frames += len(batch)
        if refused:  # an earlier claim's frame, or a seq already kept: neither kept nor sent
            log.warning("live_outbox_refused", count=int(refused[0]), error=refused[1].decode(errors="replace"))


_outboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Outbox]] = weakref.WeakKeyDictionary()


def outbox_for(buffer: Any, layer: Any) -> Outbox | None:
    """This loop's outbox for ``buffer``, or None when frames cannot skip ``layer`` (``direct_frames``)."""
    if not direct_frames(buffer, layer):
        return None
    loop = asyncio.get_running_loop()
    boxes = _outboxes.setdefault(loop, {})
    box = boxes.get(id(buffer))
    if box is None or box.buffer is not buffer:
        box = boxes[id(buffer)] = Outbox(buffer)
    return box
