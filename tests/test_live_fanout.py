"""The fan-out: frames published on a run's channel reach every socket watching it on this
process, however many join at once, and nothing is left running once the last one leaves
(real Redis)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.conf import settings
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from streamrecover.live.buffer import RedisFrameBuffer
from streamrecover.live.fanout import Fanout, decode_message, encode_message, fanout_for, frames_channel

pytestmark = pytest.mark.services


class Socket:
    def __init__(self) -> None:
        self.frames: list[tuple[int, str]] = []

    async def push_frame(self, seq: int, text: str) -> None:
        self.frames.append((seq, text))


async def _until(predicate: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "the frames did not all arrive"
        await asyncio.sleep(0.01)


def _next_subscribe_fails(fanout: Fanout) -> None:
    """The fan-out's next SUBSCRIBE fails once, as when Redis restarts under it."""
    pubsub = fanout._connection()
    subscribe = pubsub.subscribe

    async def refused(*args: object, **kwargs: object) -> None:
        pubsub.subscribe = subscribe  # type: ignore[method-assign]
        raise RedisConnectionError("Redis is restarting")

    pubsub.subscribe = refused  # type: ignore[method-assign]


def test_a_message_is_the_seq_and_the_frame_text_as_sent() -> None:
    text = '{"type":"text_delta","seq":12,"text":"café 🚀 a b"}'
    assert decode_message(encode_message(12, text)) == (12, text)


async def test_sockets_joining_at_once_all_get_their_runs_frames_in_order() -> None:
    buffer = RedisFrameBuffer(settings.REDIS_URL, prefix=f"streamrecover:test:{uuid.uuid4().hex}:")
    fanout = fanout_for(buffer)
    runs = [uuid.uuid4().hex for _ in range(20)]
    sockets = {run: [Socket(), Socket()] for run in runs}  # two watchers of each run
    # every socket's first subscribe at once: they must share one connection and all be read
    await asyncio.gather(*(fanout.join(frames_channel(buffer, run), socket) for run in runs for socket in sockets[run]))
    publisher = Redis.from_url(settings.REDIS_URL)
    try:
        for seq in range(1, 4):
            for run in runs:
                await publisher.publish(frames_channel(buffer, run), encode_message(seq, f'"{run}:{seq}"'))
        await _until(lambda: all(len(s.frames) == 3 for pair in sockets.values() for s in pair))
        for run, pair in sockets.items():
            for socket in pair:
                assert socket.frames == [(seq, f'"{run}:{seq}"') for seq in range(1, 4)]
    finally:
        for run in runs:
            for socket in sockets[run]:
                await fanout.leave(frames_channel(buffer, run), socket)
        await publisher.aclose()
    # the last socket gone: no reader task, no connection held
    assert fanout._reader is None
    assert fanout._pubsub is None


async def test_a_run_id_is_one_channel_however_it_is_spelt() -> None:
    buffer = RedisFrameBuffer(settings.REDIS_URL)
    run = uuid.uuid4()
    assert frames_channel(buffer, str(run)) == frames_channel(buffer, run.hex) == frames_channel(buffer, run)


async def test_after_a_failed_subscribe_the_runs_next_socket_gets_its_frames_live() -> None:
    buffer = RedisFrameBuffer(settings.REDIS_URL, prefix=f"streamrecover:test:{uuid.uuid4().hex}:")
    fanout = fanout_for(buffer)
    channel = frames_channel(buffer, uuid.uuid4())
    failed, next_one = Socket(), Socket()
    _next_subscribe_fails(fanout)
    with pytest.raises(RedisConnectionError):
        await fanout.join(channel, failed)
    await fanout.join(channel, next_one)
    publisher = Redis.from_url(settings.REDIS_URL)
    try:
        await publisher.publish(channel, encode_message(1, '"hello"'))
        await _until(lambda: next_one.frames)
        assert next_one.frames == [(1, '"hello"')]
        assert failed.frames == []
    finally:
        await fanout.leave(channel, next_one)
        await publisher.aclose()
    assert fanout._members == {}  # the failed socket is no member left behind
    assert fanout._reader is None


@pytest.mark.django_db(transaction=True)
async def test_a_socket_whose_subscribe_fails_is_closed_and_the_next_one_streams() -> None:
    # The failed socket must not linger as the run's member on the process's fan-out, where it
    # kept every later socket of the run from subscribing (their frames came only at catch-up).
    from asgiref.sync import sync_to_async

    from streamrecover.live.buffer import reader_buffer
    from streamrecover.live.publisher import make_publisher

    from .factories import make_user
    from .test_live_consumer import TIMEOUT, close, new_run, receive, socket

    owner = await sync_to_async(make_user)()
    run = await new_run(owner)
    run_id = str(run.pk)
    buffer = reader_buffer()
    assert isinstance(buffer, RedisFrameBuffer)
    _next_subscribe_fails(fanout_for(buffer))
    refused = await socket(run_id, owner)
    assert await refused.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 1013}
    await close(refused)
    ws = await socket(run_id, owner)  # the client's reconnect, or another tab
    publisher = await make_publisher(run_id)
    assert publisher.outbox is not None
    publisher.coalesce_s = 0.0
    try:
        assert (await receive(ws))["type"] == "snapshot"
        await publisher.on_frame({"run_id": run_id, "seq": 1, "type": "run_status", "status": "running"})
        await publisher.outbox.barrier()
        # live, well before the catch-up check (LIVE_CHECK_SECONDS, 5 s) could have sent it
        frame = await ws.receive_json_from(timeout=2)
        assert (frame["type"], frame["seq"]) == ("run_status", 1)
    finally:
        await close(ws)
        await publisher.aclose()
        await buffer.discard(run_id)


@pytest.mark.django_db(transaction=True)
async def test_frames_pushed_while_a_socket_connects_come_after_its_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fan-out pushes frames outside Channels' dispatch; the connect handler must hold them.
    from asgiref.sync import sync_to_async

    from streamrecover.live.buffer import reader_buffer
    from streamrecover.live.publisher import make_publisher
    from streamrecover.testing.client import ClientView

    from .factories import make_user
    from .test_live_consumer import close, new_run, receive, socket

    owner = await sync_to_async(make_user)()
    run = await new_run(owner)
    run_id = str(run.pk)
    publisher = await make_publisher(run_id)
    assert publisher.outbox is not None  # the fan-out's path: the outbox, the run's channel
    publisher.coalesce_s = 0.0
    texts = ["Once", " upon", " a", " time"]

    async def say(*frames: dict[str, object]) -> None:
        for frame in frames:
            await publisher.on_frame({"run_id": run_id, "seq": publisher.last_seq + 1, **frame})  # type: ignore[arg-type]
        assert publisher.outbox is not None
        await publisher.outbox.barrier()

    await say({"type": "run_status", "status": "running"}, {"type": "text_delta", "block": 0, "text": texts[0]})
    buffer = reader_buffer()
    read_state = buffer.state

    async def slow_state(run: str) -> object:
        # the socket has joined the run's channel and read the state its snapshot is built from;
        # a frame goes out before the snapshot does
        state = await read_state(run)
        await say({"type": "text_delta", "block": 0, "text": texts[1]})
        await asyncio.sleep(0.2)
        return state

    monkeypatch.setattr(buffer, "state", slow_state)
    ws = await socket(run_id, owner)
    try:
        first = await receive(ws)
        assert first["type"] == "snapshot"  # nothing pushed during connect went out before it
        view = ClientView()
        view.apply(first)
        await say(
            {"type": "text_delta", "block": 0, "text": texts[2]}, {"type": "text_delta", "block": 0, "text": texts[3]}
        )
        while view.last_seq < publisher.last_seq:
            frame = await receive(ws)
            assert frame["seq"] > first["seq"]  # never a frame the snapshot already holds
            view.apply(frame)
        assert "".join(b.text for b in view.blocks.values()) == "".join(texts)
    finally:
        await close(ws)
        await publisher.aclose()
