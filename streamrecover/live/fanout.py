"""Frames from the worker's outbox straight to this process's sockets, past the channel layer.

Through the channel layer a frame cost Daphne, per socket: channels_redis' reader waking with a
timeout per message, a queue put and get, Channels' ``await_many_dispatch`` (a new task and an
``asyncio.wait`` per message) and a msgpack decoding; four loop turns before the socket's write.
The outbox publishes each frame on a Redis channel of the run's own (``frames_channel``) as
``<seq> <frame JSON>``; here one pub/sub connection per event loop subscribes to the runs that
have sockets on it and hands each frame to them (``Receiver.push_frame``) in the turn it is read.

Used exactly when the outbox is (channels_redis' pub/sub layer on the replay buffer's Redis):
both sides decide with ``direct_frames``. Sockets still join the run's group on the layer, for
frames sent without the outbox (a publisher whose buffer was unavailable when its run started).
A Redis restart is survived as the layer does: redis-py connects and subscribes again; what is
published meanwhile is lost, and the consumer's periodic check catches its client up.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import structlog

from .buffer import RedisFrameBuffer
from .delivery import run_hex

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.client import PubSub

log = structlog.get_logger("streamrecover.live")

RETRY_AFTER_S = 1.0  # after a failed read (Redis away), wait this long before reading again


class Receiver(Protocol):
    async def push_frame(self, seq: int, text: str) -> None: ...


def frames_channel(buffer: RedisFrameBuffer, run_id: str | uuid.UUID) -> str:
    """The Redis channel the run's frames are published on (pub/sub ignores the db number: the
    buffer's prefix keeps apps on one server apart, the run id runs apart)."""
    return f"{buffer.prefix}frames:{run_hex(run_id)}"


def encode_message(seq: int, text: str) -> bytes:
    return f"{seq} {text}".encode()


def decode_message(data: bytes) -> tuple[int, str]:
    head, _, text = data.partition(b" ")
    return int(head), text.decode()


def same_redis(layer: Any, url: str) -> bool:
    """Whether ``layer`` is channels_redis' pub/sub layer with one host, the Redis at ``url``."""
    try:
        from channels_redis.pubsub import RedisPubSubChannelLayer
    except ImportError:
        return False
    if not isinstance(layer, RedisPubSubChannelLayer):
        return False
    hosts = layer._kwargs.get("hosts") or (layer._args[0] if layer._args else None)
    if not hosts or len(hosts) != 1:
        return False
    host = hosts[0]
    address = host.get("address") if isinstance(host, dict) else host
    return isinstance(address, str) and address == url


def direct_frames(buffer: Any, layer: Any) -> TypeGuard[RedisFrameBuffer]:
    """Whether frames travel outbox → ``frames_channel`` → ``Fanout`` (else: the layer's group)."""
    return isinstance(buffer, RedisFrameBuffer) and same_redis(layer, buffer.url)


class Fanout:
    """One per event loop and Redis: subscribes to a run's channel while a socket watches it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._members: dict[str, set[Receiver]] = {}
        self._client: Redis | None = None
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        # One (un)subscribe at a time: two sockets' first subscribes at once made redis-py's
        # PubSub take a connection each, and the one it dropped stayed subscribed, unread.
        self._lock = asyncio.Lock()

    def _connection(self) -> PubSub:
        if self._pubsub is None:
            from redis.asyncio import Redis

            # Its own connection, without a socket timeout: the reader blocks until a frame comes.
            self._client = Redis.from_url(self.url, socket_connect_timeout=2)
            self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        return self._pubsub

    async def join(self, channel: str, receiver: Receiver) -> None:
        """From now on ``receiver`` gets the frames published on ``channel``."""
        async with self._lock:
            members = self._members.setdefault(channel, set())
            members.add(receiver)
            if len(members) == 1:
                try:
                    await self._connection().subscribe(channel)
                except BaseException:
                    # Undone, or the channel would keep a member that never leaves (its socket's
                    # connect failed here) and the run's next socket would not subscribe again.
                    await self._forget(channel, receiver)
                    raise
            if self._reader is None or self._reader.done():
                self._reader = asyncio.ensure_future(self._read())

    async def leave(self, channel: str, receiver: Receiver) -> None:
        async with self._lock:
            members = self._members.get(channel)
            if members is None or receiver not in members:
                return
            members.discard(receiver)
            if members:
                return
            del self._members[channel]
            if self._members:
                with contextlib.suppress(Exception):  # Redis away: the subscription goes with the connection
                    await self._connection().unsubscribe(channel)
                return
            await self._close()  # nobody watches: no task and no connection left behind

    async def _forget(self, channel: str, receiver: Receiver) -> None:
        """A failed join undone (the lock held): the channel was never subscribed, so nothing to
        unsubscribe; with nobody left, the connection the failure broke goes too."""
        members = self._members.get(channel)
        if members is not None:
            members.discard(receiver)
            if not members:
                del self._members[channel]
        if not self._members:
            await self._close()

    async def _close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        pubsub, client = self._pubsub, self._client
        self._pubsub = self._client = None
        with contextlib.suppress(Exception):
            if pubsub is not None:
                await pubsub.aclose()
            if client is not None:
                await client.aclose()

    async def _read(self) -> None:
        while self._members:
            pubsub = self._connection()
            try:
                message = await pubsub.get_message(timeout=None)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("live_fanout_read_failed", exc_info=True)
                await asyncio.sleep(RETRY_AFTER_S)
                continue
            if message is None or message.get("type") != "message":
                continue
            channel = message["channel"]
            receivers = self._members.get(channel.decode() if isinstance(channel, bytes) else channel)
            if not receivers:
                continue
            try:
                seq, text = decode_message(message["data"])
            except (ValueError, UnicodeDecodeError):
                log.warning("live_fanout_bad_message", channel=str(channel))
                continue
            for receiver in list(receivers):
                try:
                    await receiver.push_frame(seq, text)
                except Exception:  # one socket's failure is not the others'
                    log.warning("live_fanout_push_failed", exc_info=True)


_fanouts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Fanout]] = weakref.WeakKeyDictionary()


def fanout_for(buffer: RedisFrameBuffer) -> Fanout:
    """This loop's fan-out for ``buffer``'s Redis."""
    loop = asyncio.get_running_loop()
    fanouts = _fanouts.setdefault(loop, {})
    found = fanouts.get(buffer.url)
    if found is None:
        found = fanouts[buffer.url] = Fanout(buffer.url)
    return found
