"""The run's WebSocket: a snapshot (or the missed frames) on connect, then live frames.

Thin on purpose: the database is read once per connect or resync,
through one private helper, never per frame, because dispatch is serial per socket and
one slow handler would stall every later frame. A frame with a seq the client already has
(it was in the snapshot or the replay) is dropped, so nothing arrives twice.

Frames can be lost on the way without any later frame showing the gap (a Redis restart drops
a run's last frames, its end included; a reconnect then finds nothing missing in a buffer
that never got them). So while the run is not over, the socket is watched by the process's
catch-up check (``catchup``): every ``LIVE_CHECK_SECONDS`` the run's status and the buffer's
last seq, read for all the process's sockets at once. A client still behind at the next check
(frames in flight have arrived by then) gets the missed frames, or a snapshot when the buffer
lacks them or the run has ended.
The group subscription itself needs no care: channels_redis' pub/sub layer reconnects and
subscribes again by itself (redis-py); what it misses while Redis is down is what this catches.

On the distributed setup frames come from the process's ``fanout.Fanout``, not the layer
(``push_frame``), outside Channels' dispatch. The consumer keeps dispatch's promise itself: a
frame pushed while a handler runs (connect, a resync, a catch-up) is held and sent after it,
so a snapshot never goes out after a newer frame.
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs

import structlog
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from ..engine.protocol import TERMINAL_STATUSES, FrameKind, frame_span
from ..models import Message, Run
from ..runs import lifecycle
from .buffer import FrameBuffer, reader_buffer
from .catchup import catch_up_check
from .delivery import FRAME_EVENT, bind_home_loop, group_name
from .fanout import Fanout, direct_frames, fanout_for, frames_channel
from .snapshot import RunRecord, build_snapshot

FORBIDDEN_CLOSE_CODE = 4403
TRY_AGAIN_CLOSE_CODE = 1013  # "try again later": the run's frames could not be subscribed to
# A client sends only {"type": "cancel"} or {"type": "resync"}: anything much longer is refused
# before it is parsed, so a client cannot make the consumer parse megabytes.
MAX_CLIENT_MESSAGE_CHARS = 4096
T = TypeVar("T")
# Why a cancel from the socket was not requested: the run is no longer the caller's to watch, the
# caller may watch but not cancel it, or it has already ended.
CancelRefusal = Literal["unseen", "forbidden", "ended"]
log = structlog.get_logger("streamrecover.live")


def _after(scope: dict[str, Any]) -> int | None:
    """``?after=<seq>``: the last seq the reconnecting client applied (None: not given or bad)."""
    values = parse_qs((scope.get("query_string") or b"").decode("latin-1")).get("after")
    if not values:
        return None
    try:
        after = int(values[-1])
    except ValueError:
        return None
    return after if after >= 0 else None


class RunConsumer(AsyncJsonWebsocketConsumer):
    """``ws/streamrecover/runs/<run_id>/``: the run's owner, or whoever may view runs in the admin (``view_run``)."""

    run_id: str
    group: str
    last_seq: int = 0
    joined: bool = False
    fanout: Fanout | None = None  # where frames come from, when not from the layer
    frames_channel: str = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._holding = 0  # handlers running: pushed frames wait in _held
        self._held: deque[tuple[int, str]] = deque()

    @property
    def buffer(self) -> FrameBuffer:
        return reader_buffer()

    async def connect(self) -> None:
        self.run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
        self.group = group_name(self.run_id)
        await self.accept()
        record = await self._load()
        if record is None:  # someone else's run or no such run: the same answer for both
            await self.send_error("forbidden", "You may not watch this run.")
            await self.close(code=FORBIDDEN_CLOSE_CODE)
            return
        if self.channel_layer is not None:
            bind_home_loop(self.channel_layer)
            await self.channel_layer.group_add(self.group, self.channel_name)
            self.joined = True
            if not await self._join_frames():
                await self.disconnect(TRY_AGAIN_CLOSE_CODE)  # leaves the group it joined
                await self.close(code=TRY_AGAIN_CLOSE_CODE)
                return
        if record.status not in TERMINAL_STATUSES:
            catch_up_check().watch(self)
        after = _after(self.scope)
        if after is not None and await self._replay(record, after):
            return
        await self._send_snapshot(record)

    async def _join_frames(self) -> bool:
        """Join the run's frames channel on the fan-out, when frames come that way. False when the
        subscribe fails (Redis away): a socket that stayed open would get its frames only from
        the catch-up check, so it is closed instead and the client reconnects (with backoff)."""
        buffer = self.buffer
        if not direct_frames(buffer, self.channel_layer):
            return True
        channel = frames_channel(buffer, self.run_id)
        fanout = fanout_for(buffer)
        try:
            await fanout.join(channel, self)
        except Exception:
            log.warning("live_subscribe_failed", run_id=self.run_id, exc_info=True)
            return False
        self.fanout, self.frames_channel = fanout, channel
        return True

    async def _replay(self, record: RunRecord, after: int) -> bool:
        """Send the frames after ``after`` from the buffer; False when a snapshot must go instead:
        some are gone, or the run has ended but the buffer never got its end (lost frames)."""
        frames = await self._buffered(self.buffer.frames_after(self.run_id, after))
        if frames is None:
            return False
        if record.status in TERMINAL_STATUSES:
            state = await self._buffered(self.buffer.state(self.run_id))
            if state is None or state.status not in TERMINAL_STATUSES:
                return False
        self.last_seq = after
        for frame in frames:
            await self._forward(frame)
        return True

    async def disconnect(self, code: int) -> None:
        catch_up_check().forget(self)
        self._held.clear()
        if self.fanout is not None:
            await self.fanout.leave(self.frames_channel, self)
            self.fanout = None
        if self.joined and self.channel_layer is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.joined = False

    # ---- from the group -----------------------------------------------------------------

    async def dispatch(self, message: dict[str, Any]) -> None:
        """A frame goes straight to ``run_frame``. Channels' own dispatch first closes stale
        database connections through ``sync_to_async`` (a hop to the sync thread and back) for
        every message: per frame that was about a third of Daphne's CPU, and a frame never
        touches the database. Every other message (connect, receive, disconnect) keeps it,
        with the fan-out's frames held until it is handled."""
        if message.get("type") == FRAME_EVENT:
            await self.run_frame(message)
            return
        async with self._frames_held():
            await super().dispatch(message)

    async def run_frame(self, event: dict[str, Any]) -> None:
        """``run.frame``: one published frame, as a dict (``frame``) or already encoded by the
        publisher (``text``, with its ``seq`` and ``first_seq``): then sent as it is."""
        text = event.get("text")
        if text is None:
            await self._forward(event["frame"])
            return
        await self._send_text(int(event["seq"]), text)

    async def push_frame(self, seq: int, text: str) -> None:
        """From the fan-out: a frame's JSON, sent as it is (or held while a handler runs)."""
        if self._holding:
            self._held.append((seq, text))
            return
        await self._send_text(seq, text)

    @contextlib.asynccontextmanager
    async def _frames_held(self) -> AsyncIterator[None]:
        self._holding += 1
        try:
            yield
        finally:
            try:
                while self._held and self._holding == 1:  # still held: later pushes queue behind
                    await self._send_text(*self._held.popleft())
            finally:
                self._holding -= 1

    async def _send_text(self, seq: int, text: str) -> None:
        if seq <= self.last_seq:
            return  # already in the snapshot or the replay
        self.last_seq = seq
        await self.send(text_data=text)

    async def _forward(self, frame: dict[str, Any]) -> None:
        _, seq = frame_span(frame)
        if seq <= self.last_seq:
            return  # already in the snapshot or the replay
        self.last_seq = seq
        await self.send_json(frame)

    # ---- the client is not left behind lost frames -------------------------------------------

    async def catch_up(self) -> bool:
        """For the process's catch-up check (``catchup``): the missed frames or a snapshot, with
        the fan-out's frames held meanwhile. True when the client now has the run's end."""
        async with self._frames_held():
            return await self._catch_up()

    async def _catch_up(self) -> bool:
        """The missed frames (a run still going, a buffer that has them all), else a snapshot.
        True when the client now has the run's end."""
        record = await self._load()
        if record is None:
            return True
        if record.status not in TERMINAL_STATUSES:
            frames = await self._buffered(self.buffer.frames_after(self.run_id, self.last_seq))
            if frames:
                log.info("live_client_caught_up", run_id=self.run_id, after=self.last_seq, frames=len(frames))
                for frame in frames:
                    await self._forward(frame)
                return False
        log.info("live_client_resynced", run_id=self.run_id, after=self.last_seq, status=record.status)
        await self._send_snapshot(record)
        return record.status in TERMINAL_STATUSES

    # ---- from the client ----------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if text_data is None:
            await self.send_error("bad_message", "Send JSON text messages.")
            return
        if len(text_data) > MAX_CLIENT_MESSAGE_CHARS:
            await self.send_error("too_large", f"Messages are at most {MAX_CLIENT_MESSAGE_CHARS} characters.")
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            await self.send_error("bad_json", "The message is not JSON.")
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "cancel":
            refused = await self._cancel()
            if refused == "unseen":  # no longer the caller's to watch: as at connect
                await self.send_error("forbidden", "You may not watch this run.")
                await self.close(code=FORBIDDEN_CLOSE_CODE)
            elif refused == "forbidden":  # watched with the view permission, not the change one
                await self.send_error("forbidden", "You may not cancel this run (it needs the change permission).")
            elif refused == "ended":
                await self.send_error("not_cancellable", "The run has already ended.")
        elif kind == "resync":
            record = await self._load()
            if record is None:
                await self.send_error("forbidden", "You may not watch this run.")
                await self.close(code=FORBIDDEN_CLOSE_CODE)
                return
            await self._send_snapshot(record)
        else:
            await self.send_error("unknown_type", 'Expected {"type": "cancel"} or {"type": "resync"}.')

    # ---- sending --------------------------------------------------------------------------

    async def _buffered(self, read: Awaitable[T]) -> T | None:
        """A buffer read, or None when the buffer fails: the database alone still gives a
        correct snapshot (without the in-flight blocks)."""
        try:
            return await read
        except Exception:
            log.exception("live_buffer_read_failed", run_id=self.run_id)
            return None

    async def _send_snapshot(self, record: RunRecord) -> None:
        snapshot = build_snapshot(record, await self._buffered(self.buffer.state(self.run_id)))
        self.last_seq = snapshot["seq"]
        await self.send_json(snapshot)

    async def send_error(self, code: str, message: str) -> None:
        """Outside the frame sequence: carries the seq of the last frame sent."""
        await self.send_json(
            {"type": FrameKind.ERROR, "run_id": self.run_id, "seq": self.last_seq, "code": code, "message": message}
        )

    # ---- the database (once per connect, resync or cancel) ----------------------------------

    @database_sync_to_async
    def _load(self) -> RunRecord | None:
        run = Run.objects.visible_to(self.scope.get("user")).filter(pk=self.run_id).first()
        if run is None:
            return None
        messages = {m.position: m.as_canonical() for m in Message.objects.filter(thread_id=run.thread_id)}
        error = {"kind": run.error_kind, "message": run.error_message} if run.error_kind else None
        return RunRecord(str(run.pk), run.status, error, messages)

    @database_sync_to_async
    def _cancel(self) -> CancelRefusal | None:
        """Request the run's cancel, or say why not (nothing is written then)."""
        user = self.scope.get("user")
        if not Run.objects.visible_to(user).filter(pk=self.run_id).exists():
            return "unseen"
        if not Run.objects.cancellable_by(user).filter(pk=self.run_id).exists():
            return "forbidden"
        return None if lifecycle.request_cancel(self.run_id) else "ended"
