"""A client whose frames were lost on the way still ends with the committed messages.

A Redis restart drops the frames a run publishes while Redis is down (and for a while after:
the publisher pauses), its end included; no later frame shows the client a gap, and a reconnect
with ``?after=`` finds nothing missing in a buffer that never got them. The consumer's periodic
check and its reconnect rule catch the client up. On a Redis server of the test's own (a free
port, no persistence, so a restart also empties the replay buffer), then on the suite's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket as sockets
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import override_settings

from streamrecover import starter
from streamrecover.engine.protocol import TERMINAL_STATUSES
from streamrecover.models import Message
from streamrecover.runs import lifecycle
from streamrecover.testing.client import ClientView

from .e2e_helpers import free_port
from .test_live_consumer import close, frames_out, new_run, owner, receive, socket  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

CHECK_S = 0.3


class OwnRedis:
    """``redis-server`` on a free port, nothing persisted: a restart empties it."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(argv, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), sockets.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    redis = OwnRedis(tmp_path)
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


async def follow(ws: WebsocketCommunicator, view: ClientView, timeout: float) -> None:
    """Apply frames as the reference client does (a seq gap asks for a snapshot) until the
    view shows the run's end; fails when it does not come within ``timeout``."""
    deadline = time.monotonic() + timeout
    while view.status not in TERMINAL_STATUSES:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"the client was left at {view.status!r} (seq {view.last_seq})")
        try:
            frame = await ws.receive_json_from(timeout=left)
        except TimeoutError:
            continue
        if frame["type"] not in ("snapshot", "error") and frame.get("first_seq", frame["seq"]) != view.last_seq + 1:
            await ws.send_json_to({"type": "resync"})
            continue
        view.apply(frame)


async def run_that_began(owner: Any, frames_out: Any, text: str = "") -> Any:  # noqa: F811
    """A new run whose worker published its running status and, when ``text``, a first delta."""
    run = await new_run(owner)
    first = [{"type": "text_delta", "block": 0, "text": text}] if text else []
    await frames_out(run, {"type": "run_status", "status": "running"}, *first)
    return run


def _committed(run_id: str) -> list[dict[str, Any]]:
    run = lifecycle.Run.objects.get(pk=run_id)
    return list(Message.objects.of_thread(run.thread_id).canonical())


async def test_a_client_whose_run_ends_while_redis_restarts_ends_with_the_committed_messages(
    owner: Any,  # noqa: F811
    own_redis: OwnRedis,
) -> None:
    layer = {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": {"hosts": [own_redis.url]}}
    layers = {"default": layer}
    streamrecover = {**settings.STREAMRECOVER, "REDIS_URL": own_redis.url, "LIVE_CHECK_SECONDS": CHECK_S}
    with override_settings(CHANNEL_LAYERS=layers, STREAMRECOVER=streamrecover):
        # a stall mid-answer keeps the run going while Redis is down; it ends ~1 s after Redis is
        # back, inside the publisher's pause after a failed write: its last frames are never sent
        run = await new_run(owner, "Tell me a story [[words=80]]", faults=["stall:events=20,seconds=2,then=continue"])
        ws = await socket(run.pk, owner)
        view = ClientView()
        view.apply(await receive(ws))
        task = asyncio.ensure_future(starter.execute_here(str(run.pk)))
        while not any(block for block in view.blocks.values()):
            frame = await receive(ws)
            view.apply(frame)
        await sync_to_async(own_redis.stop)()
        await asyncio.sleep(0.5)
        await sync_to_async(own_redis.start)()
        result = await asyncio.wait_for(task, 30)
        assert result is not None
        assert result.status == "completed"
        await follow(ws, view, timeout=10)
        assert view.status == "completed"
        committed = await sync_to_async(_committed)(str(run.pk))
        assert view.messages == committed == result.messages
        await close(ws)


async def test_a_reconnect_after_what_the_buffer_holds_of_an_ended_run_gets_a_snapshot(
    owner: Any,  # noqa: F811
    frames_out: Any,  # noqa: F811
) -> None:
    run = await run_that_began(owner, frames_out, "Hi")
    # the run ends, but its last frames never reached the buffer (lost while Redis was down)
    answer = {"role": "assistant", "content": [{"type": "text", "text": "Hi there"}]}
    await sync_to_async(lifecycle.finish)(str(run.pk), "completed", message=answer, position=1)
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "LIVE_CHECK_SECONDS": 0}):
        ws = await socket(run.pk, owner, after=2)  # the buffer's last seq: it says nothing is missing
        snapshot = await receive(ws)
        assert snapshot["type"] == "snapshot"
        assert snapshot["status"] == "completed"
        assert snapshot["messages"] == await sync_to_async(_committed)(str(run.pk))
        assert snapshot["messages"][-1] == answer
        await close(ws)


async def test_a_connected_client_whose_end_frames_were_lost_gets_a_snapshot(
    owner: Any,  # noqa: F811
    frames_out: Any,  # noqa: F811
) -> None:
    run = await run_that_began(owner, frames_out, "Hi")
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "LIVE_CHECK_SECONDS": CHECK_S}):
        ws = await socket(run.pk, owner)
        view = ClientView()
        view.apply(await receive(ws))
        assert view.status == "running"
        answer = {"role": "assistant", "content": [{"type": "text", "text": "Hi there"}]}
        await sync_to_async(lifecycle.finish)(str(run.pk), "completed", message=answer, position=1)
        await follow(ws, view, timeout=5)  # no frame comes: only the check can tell the client
        assert view.messages == await sync_to_async(_committed)(str(run.pk))
        await close(ws)


async def test_a_client_behind_a_buffer_it_never_heard_from_gets_the_missed_frames(
    owner: Any,  # noqa: F811
    frames_out: Any,  # noqa: F811
) -> None:
    run = await run_that_began(owner, frames_out)
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "LIVE_CHECK_SECONDS": CHECK_S}):
        ws = await socket(run.pk, owner)
        assert (await receive(ws))["seq"] == 1
        # frames reach the buffer but not the socket (its subscription was lost with Redis)
        from streamrecover.live.buffer import reader_buffer

        for seq, text in ((2, "a"), (3, "b")):
            await reader_buffer().append(
                str(run.pk), {"type": "text_delta", "run_id": str(run.pk), "seq": seq, "block": 0, "text": text}
            )
        frames = [await receive(ws), await receive(ws)]
        assert [(f["seq"], f["text"]) for f in frames] == [(2, "a"), (3, "b")]
        await close(ws)


async def test_a_run_taken_over_without_a_checkpoint_drops_what_the_first_worker_streamed(
    owner: Any,  # noqa: F811
    frames_out: Any,  # noqa: F811
) -> None:
    run = await new_run(owner, "Tell me a story [[words=30]]")
    # a first worker streamed the start of an answer, then died before any checkpoint
    await frames_out(run, {"type": "run_status", "status": "running"})
    await frames_out(run, {"type": "text_delta", "block": 0, "text": "Once upon a ti"})
    ws = await socket(run.pk, owner)
    view = ClientView()
    view.apply(await receive(ws))
    assert view.blocks  # the client shows the partial answer
    result = await starter.execute_here(str(run.pk))  # the next claim starts the turn over
    assert result is not None
    assert result.status == "completed"
    await follow(ws, view, timeout=10)
    # not "Once upon a ti" followed by the whole answer (the new claim's first frame leaves a
    # seq out, so the client may also have taken a snapshot on the way)
    assert all(reconstructed == committed for reconstructed, committed in view.turns)
    assert view.messages == result.messages
    await close(ws)


async def test_frames_an_outage_kept_from_the_buffer_still_reach_the_snapshot(monkeypatch: Any) -> None:
    from streamrecover.live import outbox as outbox_module
    from streamrecover.live.buffer import RedisFrameBuffer

    run_id = str(uuid.uuid4())
    prefix = f"test:lost:{uuid.uuid4().hex}:"
    writer = RedisFrameBuffer(settings.STREAMRECOVER["REDIS_URL"], prefix=prefix)
    reader = RedisFrameBuffer(settings.STREAMRECOVER["REDIS_URL"], prefix=prefix)
    await writer.prepare(run_id)
    box = outbox_module.Outbox(writer)
    channel = box.channel(run_id)
    monkeypatch.setattr(outbox_module, "PAUSE_AFTER_FAILURE_S", 0.2)

    def put(seq: int, frame: dict[str, Any]) -> None:
        full = {"run_id": run_id, "seq": seq, **frame}
        box.put(run_id, channel, full, json.dumps(full))

    put(1, {"type": "run_status", "status": "running"})
    put(2, {"type": "text_delta", "block": 0, "text": "Hello "})
    await box.barrier()
    send = box._send

    async def redis_is_down(batch: Any) -> None:
        """``_send`` with Redis away: the frames are staged (the writer's state applies them),
        then the pipeline fails."""
        for item in batch:
            writer.planned_write(item.run_id, item.frame, item.text)
        raise ConnectionError("Redis is restarting")

    monkeypatch.setattr(box, "_send", redis_is_down)
    put(3, {"type": "text_delta", "block": 0, "text": "wor"})  # its write fails
    await box.barrier()
    put(4, {"type": "text_delta", "block": 0, "text": "ld"})  # skipped: the outbox pauses
    await box.barrier()
    await asyncio.sleep(0.25)
    monkeypatch.setattr(box, "_send", send)
    put(5, {"type": "text_delta", "block": 0, "text": "!"})
    await box.barrier()
    try:
        state = await reader.state(run_id)
        assert state is not None
        assert state.seq == 5
        assert [b.text for b in state.blocks.values()] == ["Hello world!"]  # not "Hello !"
        assert await reader.frames_after(run_id, 2) is None  # a hole: the client gets a snapshot
        assert [f["seq"] for f in await reader.frames_after(run_id, 4) or []] == [5]
    finally:
        await reader.discard(run_id)
        await reader.aclose()
        await writer.aclose()


async def test_a_message_committed_by_a_claim_whose_frames_redis_lost_reaches_the_client(
    owner: Any,  # noqa: F811
    frames_out: Any,  # noqa: F811
) -> None:
    from streamrecover.runs.recorder import write_message

    run = await new_run(owner, "Weather in Lisbon? [[words=20]] [[tool=get_weather]]", demo_tools=True)
    await frames_out(run, {"type": "run_status", "status": "running"})
    ws = await socket(run.pk, owner, after=1)
    view = ClientView()
    view.apply({"type": "snapshot", "run_id": str(run.pk), "seq": 0, "status": "queued", "messages": []})
    view.apply({"type": "run_status", "run_id": str(run.pk), "seq": 1, "status": "running"})
    # the first worker committed its tool call, then died; Redis lost every frame after seq 1
    call = {"type": "tool_use", "id": "toolu_lost", "name": "get_weather", "input": {"city": "Lisbon"}}
    await sync_to_async(write_message)(run.thread_id, run.pk, {"role": "assistant", "content": [call]}, 1)
    result = await starter.execute_here(str(run.pk))  # the next claim goes on from the tool call
    assert result is not None
    assert result.status == "completed"
    await follow(ws, view, timeout=10)
    committed = await sync_to_async(_committed)(str(run.pk))
    assert len(committed) == 4
    assert view.messages[1:] == committed[1:]  # the lost tool call included
    await close(ws)


def test_a_snapshot_taken_between_the_runs_end_and_its_last_frame_shows_the_answer_once() -> None:
    from streamrecover.engine.protocol import PartialBlock
    from streamrecover.live.snapshot import RunRecord, build_snapshot
    from streamrecover.live.state import RunState

    question = {"role": "user", "content": [{"type": "text", "text": "Hi?"}]}
    answer = {"role": "assistant", "content": [{"type": "text", "text": "Hello there."}]}
    # the run's end (and answer) are stored; its message_committed frame is not in the buffer yet
    state = RunState(seq=9, status="running", blocks={0: PartialBlock("text", text="Hello there.")})
    snapshot = build_snapshot(RunRecord("r", "running", None, {0: question, 1: answer}), state)
    assert snapshot["messages"] == [question, answer]
    assert snapshot["partial"] == []  # the answer is not shown twice, committed and in flight
    view = ClientView()
    view.apply(snapshot)
    view.apply({"type": "message_committed", "run_id": "r", "seq": 10, "position": 1, "message": answer})
    view.apply({"type": "run_status", "run_id": "r", "seq": 11, "status": "completed"})
    assert view.messages == [question, answer]  # the frame confirms it in its place
