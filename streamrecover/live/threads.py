"""The thread's WebSocket: its owner's pages hear of every run started in the thread, to follow it."""

from __future__ import annotations

import asyncio
from typing import Any, Final, Literal, TypedDict

import structlog
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer

from ..models import Run, Thread
from .consumer import FORBIDDEN_CLOSE_CODE
from .delivery import bind_home_loop, group_send
from .publisher import ANNOUNCE_TIMEOUT_S

THREAD_GROUP_PREFIX = "streamrecover.thread."
RUN_STARTED_EVENT: Final = "thread.run_started"  # handled by ThreadConsumer.thread_run_started
log = structlog.get_logger("streamrecover.live")


class RunStarted(TypedDict):
    """``run_started``: a run of the thread to follow on its own socket (``ws/streamrecover/runs/<run_id>/``)."""

    type: Literal["run_started"]
    thread_id: int
    run_id: str


class ThreadError(TypedDict):
    """``error``: the socket's refusal (``forbidden``, then 4403), or a message it does not take."""

    type: Literal["error"]
    thread_id: int
    code: str
    message: str


class RunStartedEvent(TypedDict):
    """The channel-layer message behind ``run_started``, sent to the thread's group."""

    type: Literal["thread.run_started"]
    run_id: str


def thread_group(thread_id: int) -> str:
    """``streamrecover.thread.<id>``: the sockets of the thread's owner watching it."""
    return f"{THREAD_GROUP_PREFIX}{int(thread_id)}"


def announce_run_started(thread_id: int, run_id: str) -> None:
    """Tell the thread's sockets that ``run_id`` started, from the thread whose transaction created
    it (committed: a page that follows it finds it). Best effort: a page that misses it learns of
    the run when it sends, reloads, or reconnects (the socket sends the thread's latest run first)."""
    layer = get_channel_layer()
    if layer is None:
        return
    event: RunStartedEvent = {"type": RUN_STARTED_EVENT, "run_id": str(run_id)}
    try:
        async_to_sync(_send_in_time)(layer, thread_group(thread_id), event)
    except Exception:
        log.exception("live_run_announce_failed", thread_id=thread_id, run_id=str(run_id))


async def _send_in_time(layer: Any, group: str, event: RunStartedEvent) -> None:
    # the request that created the run waits for this: a layer that hangs must not hold it
    await asyncio.wait_for(group_send(layer, group, dict(event)), ANNOUNCE_TIMEOUT_S)


class ThreadConsumer(AsyncJsonWebsocketConsumer):
    """``ws/streamrecover/threads/<thread_id>/``: the thread's owner only (a stranger, anonymous or
    not, and an unknown thread get ``forbidden`` and close 4403, the same answer for both).

    On connect it sends the thread's latest run as a ``run_started`` (one started between the page
    being rendered and this socket opening is not missed), then one per run started in the thread.
    The client sends nothing; anything it sends is answered with ``unknown_type``, unparsed.
    """

    thread_id: int
    joined: bool = False

    async def connect(self) -> None:
        self.thread_id = int(self.scope["url_route"]["kwargs"]["thread_id"])
        await self.accept()
        if not await self._owned():
            await self._send_error("forbidden", "You may not watch this thread.")
            await self.close(code=FORBIDDEN_CLOSE_CODE)
            return
        if self.channel_layer is not None:
            bind_home_loop(self.channel_layer)
            await self.channel_layer.group_add(thread_group(self.thread_id), self.channel_name)
            self.joined = True
        # read after joining: a run started in between is announced, or read here, or both
        latest = await self._latest_run()
        if latest is not None:
            await self._send_run(latest)

    async def disconnect(self, code: int) -> None:
        if self.joined and self.channel_layer is not None:
            await self.channel_layer.group_discard(thread_group(self.thread_id), self.channel_name)
            self.joined = False

    async def thread_run_started(self, event: RunStartedEvent) -> None:
        await self._send_run(event["run_id"])

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        await self._send_error("unknown_type", "This socket takes no messages.")

    async def _send_run(self, run_id: str) -> None:
        frame: RunStarted = {"type": "run_started", "thread_id": self.thread_id, "run_id": run_id}
        await self.send_json(frame)

    async def _send_error(self, code: str, message: str) -> None:
        frame: ThreadError = {"type": "error", "thread_id": self.thread_id, "code": code, "message": message}
        await self.send_json(frame)

    @database_sync_to_async
    def _owned(self) -> bool:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return False
        return Thread.objects.filter(pk=self.thread_id, owner=user).exists()

    @database_sync_to_async
    def _latest_run(self) -> str | None:
        latest = Run.objects.filter(thread_id=self.thread_id).order_by("-created").values_list("pk", flat=True).first()
        return str(latest) if latest is not None else None
