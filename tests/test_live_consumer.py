"""The run's WebSocket on the real Redis (pub/sub layer and replay buffer) and PostgreSQL:
who may watch, what a snapshot holds, live frames, replay, resync, cancel, bad input."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.urls import reverse

from project.asgi import application
from streamrecover import starter
from streamrecover.engine.protocol import frame_span
from streamrecover.live.buffer import reader_buffer, writer_buffer
from streamrecover.live.delivery import FRAME_EVENT, group_name
from streamrecover.live.publisher import Publisher
from streamrecover.models import Run
from streamrecover.runs import lifecycle
from streamrecover.testing.client import ClientView

from .factories import make_user

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 10


def _session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def socket(run_id: Any, user: Any = None, *, after: int | None = None) -> WebsocketCommunicator:
    """A connected client of the project's ASGI application (origin check, session auth)."""
    headers = [(b"origin", b"http://testserver")]
    if user is not None:
        headers.append((b"cookie", f"sessionid={await sync_to_async(_session_cookie)(user)}".encode()))
    path = f"/ws/streamrecover/runs/{run_id}/" + (f"?after={after}" if after is not None else "")
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert connected
    return communicator


async def receive(communicator: WebsocketCommunicator) -> dict[str, Any]:
    return await communicator.receive_json_from(timeout=TIMEOUT)


async def receive_until(communicator: WebsocketCommunicator, done: Any) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while True:
        frame = await receive(communicator)
        frames.append(frame)
        if done(frame):
            return frames


def finished(frame: dict[str, Any]) -> bool:
    return frame["type"] == "run_status" and frame["status"] not in ("running", "recovering")


async def new_run(owner: Any, prompt: str = "Tell me a story [[words=60]]", **kwargs: Any) -> Run:
    return await sync_to_async(lifecycle.create_run)(prompt=prompt, owner=owner, **kwargs)


@pytest.fixture
async def owner() -> Any:
    return await sync_to_async(make_user)()


@pytest.fixture
async def frames_out() -> AsyncIterator[Any]:
    """Publishes hand-made frames for a run through a real publisher (no coalescing)."""
    publishers: list[Publisher] = []

    async def publish(run: Run, *frames: dict[str, Any]) -> Publisher:
        run_id = str(run.pk)
        pub = next((p for p in publishers if p.run_id == run_id), None)
        if pub is None:
            buffer = writer_buffer()
            pub = Publisher(
                run_id,
                buffer,
                get_channel_layer(),
                coalesce_s=0,
                max_chars=4096,
                last_seq=await buffer.last_seq(run_id),
            )
            publishers.append(pub)
        for frame in frames:
            await pub.on_frame({"run_id": run_id, "seq": pub.last_seq + 1, **frame})
        return pub

    yield publish
    for pub in publishers:
        await reader_buffer().discard(pub.run_id)
        await pub.buffer.aclose()


async def close(communicator: WebsocketCommunicator) -> None:
    await communicator.disconnect()


# ---- who may watch --------------------------------------------------------------------------


async def test_the_owner_gets_a_snapshot_of_the_thread_and_the_partial_answer(owner: Any, frames_out: Any) -> None:
    run = await new_run(owner, "Hello [[words=5]]")
    await frames_out(
        run,
        {"type": "run_status", "status": "running"},
        {"type": "text_delta", "block": 0, "text": "Bonjour, "},
        {"type": "text_delta", "block": 0, "text": "café 🚀"},
        {"type": "tool_call_delta", "block": 1, "id": "t1", "name": "get_weather", "arguments_delta": '{"city": "Pa'},
    )
    ws = await socket(run.pk, owner)
    snapshot = await receive(ws)
    assert snapshot == {
        "type": "snapshot",
        "run_id": str(run.pk),
        "seq": 4,
        "status": "running",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello [[words=5]]"}]}],
        "partial": [
            {"block": 0, "content": {"type": "text", "text": "Bonjour, café 🚀"}},
            {
                "block": 1,
                "content": {
                    "type": "tool_use",
                    "id": "t1",
                    "name": "get_weather",
                    "input": {},
                    "partial_json": '{"city": "Pa',
                },
            },
        ],
        "error": None,
    }
    await close(ws)


async def test_staff_with_the_view_permission_may_watch_any_run(owner: Any, frames_out: Any) -> None:
    run = await new_run(owner)
    staff = await sync_to_async(make_user)(is_staff=True)
    view_run = await Permission.objects.aget(codename="view_run")
    await staff.user_permissions.aadd(view_run)
    ws = await socket(run.pk, staff)
    snapshot = await receive(ws)
    assert snapshot["type"] == "snapshot"
    assert snapshot["status"] == "queued"
    assert snapshot["seq"] == 0
    await close(ws)


@pytest.mark.parametrize("who", ["other user", "anonymous", "unknown run"])
async def test_anyone_else_gets_an_error_frame_then_4403(owner: Any, who: str) -> None:
    run = await new_run(owner)
    run_id: Any = run.pk
    user = None
    if who == "other user":
        user = await sync_to_async(make_user)()
    elif who == "unknown run":
        run_id, user = uuid.uuid4(), owner
    ws = await socket(run_id, user)
    error = await receive(ws)
    assert error["type"] == "error"
    assert error["code"] == "forbidden"
    assert error["message"]
    assert error["run_id"] == str(run_id)
    assert await ws.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4403}


# ---- live frames, replay, resync --------------------------------------------------------------


async def test_a_real_run_streams_in_order_and_the_client_rebuilds_the_committed_answer(owner: Any) -> None:
    run = await new_run(owner, "Tell me a story about the sea [[words=150]]", faults=["cut:bytes=1500"])
    ws = await socket(run.pk, owner)
    snapshot = await receive(ws)
    assert snapshot["seq"] == 0
    assert snapshot["status"] == "queued"
    task = asyncio.ensure_future(starter.execute_here(str(run.pk)))
    frames = await receive_until(ws, finished)
    result = await task
    assert result is not None
    assert result.status == "completed"
    spans = [frame_span(f) for f in frames]
    assert spans[0][0] == 1
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(spans))  # increasing, no gap
    assert frames[-1]["seq"] == result.seq
    assert len(frames) < result.seq  # deltas were coalesced into fewer frames
    assert [f["phase"] for f in frames if f["type"] == "recovery"] == ["backoff", "continuing"]
    view = ClientView().apply_all([snapshot, *frames])
    ((reconstructed, committed),) = view.turns
    assert reconstructed == committed
    assert view.messages == result.messages
    await close(ws)
    await reader_buffer().discard(str(run.pk))


async def test_reconnecting_with_after_replays_exactly_the_missed_frames(owner: Any, frames_out: Any) -> None:
    run = await new_run(owner)
    await frames_out(run, {"type": "run_status", "status": "running"})
    for word in ["one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight ", "nine "]:
        await frames_out(run, {"type": "text_delta", "block": 0, "text": word})
    ws = await socket(run.pk, owner, after=4)
    replayed = [await receive(ws) for _ in range(6)]
    assert [f["seq"] for f in replayed] == [5, 6, 7, 8, 9, 10]
    assert "".join(f["text"] for f in replayed) == "four five six seven eight nine "
    assert await ws.receive_nothing(timeout=0.2)  # no snapshot, nothing else
    await frames_out(run, {"type": "text_delta", "block": 0, "text": "ten"})
    live = await receive(ws)
    assert (live["seq"], live["text"]) == (11, "ten")
    await close(ws)
    # a client that has everything gets nothing; one from the future gets a snapshot
    ws = await socket(run.pk, owner, after=11)
    assert await ws.receive_nothing(timeout=0.2)
    await close(ws)
    ws = await socket(run.pk, owner, after=99)
    assert (await receive(ws))["type"] == "snapshot"
    await close(ws)


async def test_frames_already_in_the_snapshot_are_not_sent_again(owner: Any, frames_out: Any) -> None:
    run = await new_run(owner)
    await frames_out(run, {"type": "run_status", "status": "running"}, {"type": "text_delta", "block": 0, "text": "a"})
    ws = await socket(run.pk, owner)
    assert (await receive(ws))["seq"] == 2
    layer = get_channel_layer()
    stale = {"type": "text_delta", "run_id": str(run.pk), "seq": 2, "block": 0, "text": "a"}
    await layer.group_send(group_name(run.pk), {"type": FRAME_EVENT, "frame": stale})
    await frames_out(run, {"type": "text_delta", "block": 0, "text": "b"})
    frame = await receive(ws)
    assert (frame["seq"], frame["text"]) == (3, "b")
    await close(ws)


async def test_a_client_that_sees_a_gap_asks_for_resync_and_gets_a_snapshot(owner: Any, frames_out: Any) -> None:
    run = await new_run(owner)
    await frames_out(run, {"type": "run_status", "status": "running"})
    ws = await socket(run.pk, owner)
    view = ClientView()
    view.apply(await receive(ws))
    # the channel layer loses a frame (channels_redis drops over capacity): only the buffer has it
    pub = await frames_out(run)
    await pub.buffer.append(
        str(run.pk), {"type": "text_delta", "run_id": str(run.pk), "seq": 2, "block": 0, "text": "lost "}
    )
    pub.last_seq = 2
    await frames_out(run, {"type": "text_delta", "block": 0, "text": "found"})
    frame = await receive(ws)
    assert frame["seq"] == 3
    assert frame["seq"] != view.last_seq + 1
    await ws.send_json_to({"type": "resync"})
    snapshot = await receive(ws)
    assert snapshot["type"] == "snapshot"
    assert snapshot["seq"] == 3
    assert snapshot["partial"] == [{"block": 0, "content": {"type": "text", "text": "lost found"}}]
    await frames_out(run, {"type": "text_delta", "block": 0, "text": "!"})
    assert (await receive(ws))["seq"] == 4
    await close(ws)


async def test_when_the_buffer_has_expired_a_reconnect_gets_a_snapshot_from_the_database(owner: Any) -> None:
    run = await new_run(owner, "Short [[words=8]]")
    result = await starter.execute_here(str(run.pk))
    assert result is not None
    assert result.status == "completed"
    kept = await reader_buffer().frames_after(str(run.pk), 0)  # kept for a while after the end
    assert kept
    assert kept[-1]["seq"] == result.seq
    await reader_buffer().discard(str(run.pk))  # what expiry does
    ws = await socket(run.pk, owner, after=kept[0]["seq"])
    snapshot = await receive(ws)
    assert snapshot["type"] == "snapshot"
    assert snapshot["status"] == "completed"
    assert snapshot["partial"] == []
    assert snapshot["messages"] == result.messages
    await close(ws)


async def test_a_client_that_connects_after_a_run_failed_shows_its_error(owner: Any) -> None:
    """A reload after a run failed: the snapshot carries the run's error, and the reference
    client keeps it as client.js does (``onStatus(status, error)``), so a test sees what a user
    is told; it kept only the status."""
    run = await new_run(owner, "Short [[words=8]]", faults=["status:400,message=prompt is too long"])
    result = await starter.execute_here(str(run.pk))
    assert result is not None
    assert result.status == "failed"
    assert result.error
    ws = await socket(run.pk, owner)
    snapshot = await receive(ws)
    await close(ws)
    assert snapshot["type"] == "snapshot"
    view = ClientView().apply_all([snapshot])
    assert (view.status, view.error) == ("failed", result.error)
    assert "prompt is too long" in view.error["message"]
    stored = await Run.objects.aget(pk=run.pk)
    assert (view.error["kind"], view.error["message"]) == (stored.error_kind, stored.error_message)


async def test_an_exhausted_answer_stays_after_the_buffer_expires_and_the_thread_goes_on(owner: Any) -> None:
    """Text streamed before the continuation budget ran out is committed as the client saw it:
    a reload after the replay buffer is gone (a restart, expiry) still shows it, and a follow-up
    in the thread is answered."""
    faults = ["cut:bytes=1500", "cut:events=6", "cut:events=6"]
    run = await new_run(
        owner, "Tell me a story about the sea [[words=150]]", faults=faults, engine={"max_continuations": 2}
    )
    ws = await socket(run.pk, owner)
    snapshot = await receive(ws)
    task = asyncio.ensure_future(starter.execute_here(str(run.pk)))
    frames = await receive_until(ws, finished)
    result = await asyncio.wait_for(task, TIMEOUT)
    assert result is not None
    assert result.status == "exhausted"
    view = ClientView().apply_all([snapshot, *frames])
    ((reconstructed, committed),) = view.turns
    assert reconstructed == committed
    assert committed[0]["text"] == "".join(f["text"] for f in frames if f["type"] == "text_delta")
    await close(ws)
    await reader_buffer().discard(str(run.pk))  # what expiry (or a restart) does
    ws = await socket(run.pk, owner, after=1)
    reload = await receive(ws)
    assert reload["type"] == "snapshot"
    assert (reload["status"], reload["partial"]) == ("exhausted", [])
    assert reload["messages"] == view.messages == result.messages
    await close(ws)
    client = Client()
    await sync_to_async(client.force_login)(owner)
    detail = (await sync_to_async(client.get)(reverse("streamrecover:api-run", args=[run.pk]))).json()
    assert [m["content"] for m in detail["messages"]][-1] == committed
    thread = await sync_to_async(lambda: Run.objects.select_related("thread").get(pk=run.pk).thread)()
    follow_up = await sync_to_async(lifecycle.create_run)(prompt="And then? [[words=20]]", owner=owner, thread=thread)
    after = await starter.execute_here(str(follow_up.pk))
    assert after is not None
    assert after.status == "completed", after.error
    assert after.messages[: len(result.messages)] == result.messages
    await reader_buffer().discard(str(follow_up.pk))


# ---- client -> server -------------------------------------------------------------------------


async def test_cancel_from_the_socket_stops_a_running_run(owner: Any) -> None:
    run = await new_run(owner, "A long story [[words=200]]", faults=["stall:events=12,seconds=30"])
    ws = await socket(run.pk, owner)
    await receive(ws)
    task = asyncio.ensure_future(starter.execute_here(str(run.pk)))
    await receive_until(ws, lambda f: f["type"] == "text_delta")
    await ws.send_json_to({"type": "cancel"})
    frames = await receive_until(ws, finished)
    assert frames[-1]["status"] == "cancelled"
    result = await asyncio.wait_for(task, TIMEOUT)
    assert result is not None
    assert result.status == "cancelled"
    assert (await Run.objects.aget(pk=run.pk)).status == "cancelled"
    await ws.send_json_to({"type": "cancel"})
    error = await receive(ws)
    assert (error["type"], error["code"]) == ("error", "not_cancellable")
    await close(ws)
    await reader_buffer().discard(str(run.pk))


@override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "LIVE_CHECK_SECONDS": 0})
async def test_cancelling_a_queued_run_tells_every_socket_watching_it_at_once(owner: Any) -> None:
    # No worker ever claims the run, so none publishes its end; without it the sockets heard of
    # the cancel only at a catch-up check (never, with the check off as here).
    run = await new_run(owner)
    asking, other = await socket(run.pk, owner), await socket(run.pk, owner)
    assert (await receive(asking))["status"] == (await receive(other))["status"] == "queued"
    await asking.send_json_to({"type": "cancel"})
    for ws in (asking, other):
        frame = await ws.receive_json_from(timeout=2)
        error = {"kind": "cancel", "message": "cancelled by user"}  # as a worker's cancel ends
        assert frame == {"type": "run_status", "run_id": str(run.pk), "seq": 1, "status": "cancelled", "error": error}
    assert (await Run.objects.aget(pk=run.pk)).status == "cancelled"
    # a reconnecting client finds the same end in the replay buffer
    again = await socket(run.pk, owner, after=0)
    assert (await receive(again))["seq"] == 1
    await asking.send_json_to({"type": "cancel"})
    assert (await receive(asking))["code"] == "not_cancellable"
    for ws in (asking, other, again):
        await close(ws)
    await reader_buffer().discard(str(run.pk))


def _rest_error(user: Any, run_id: Any) -> Any:
    client = Client()
    client.force_login(user)
    return client.get(reverse("streamrecover:api-run", args=[run_id])).json()["error"]


async def _cancelled_end(owner: Any, *, worker: bool) -> dict[str, Any]:
    """A run cancelled from its socket, queued or held by a worker: the error of its end
    frame, of a reconnecting client's snapshot and replay, and of the REST detail."""
    run = await new_run(owner, "A long story [[words=200]]", faults=["stall:events=12,seconds=30"])
    ws = await socket(run.pk, owner)
    await receive(ws)
    task = asyncio.ensure_future(starter.execute_here(str(run.pk))) if worker else None
    if task is not None:
        await receive_until(ws, lambda f: f["type"] == "text_delta")
    await ws.send_json_to({"type": "cancel"})
    end = (await receive_until(ws, finished))[-1]
    if task is not None:
        await asyncio.wait_for(task, TIMEOUT)
    await close(ws)
    snapshot_ws, replay_ws = await socket(run.pk, owner), await socket(run.pk, owner, after=end["seq"] - 1)
    snapshot, replayed = await receive(snapshot_ws), await receive(replay_ws)
    await close(snapshot_ws)
    await close(replay_ws)
    await reader_buffer().discard(str(run.pk))
    assert (end["status"], snapshot["type"], snapshot["status"]) == ("cancelled", "snapshot", "cancelled")
    assert replayed == end  # the replay buffer holds the same end
    rest = await sync_to_async(_rest_error)(owner, run.pk)
    return {"frame": end["error"], "snapshot": snapshot["error"], "rest": rest}


@override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "LIVE_CHECK_SECONDS": 0})
async def test_a_cancel_ends_a_run_alike_whether_it_was_queued_or_running(owner: Any) -> None:
    # A client shows one end for a cancel: the queued run's (no worker) is the worker's.
    by_worker = await _cancelled_end(owner, worker=True)
    in_queue = await _cancelled_end(owner, worker=False)
    error = {"kind": "cancel", "message": "cancelled by user"}
    assert by_worker == in_queue == {"frame": error, "snapshot": error, "rest": error}


@override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "LIVE_CHECK_SECONDS": 0})
async def test_a_queued_run_cancelled_after_an_earlier_claim_streamed_ends_after_a_gap(
    owner: Any, frames_out: Any
) -> None:
    # Swept back to the queue after a claim streamed (Redis may have lost that claim's last
    # frames): the end leaves a seq out as a new claim would, so the client takes a snapshot.
    run = await new_run(owner)
    await frames_out(run, {"type": "run_status", "status": "running"}, {"type": "text_delta", "block": 0, "text": "Hi"})
    ws = await socket(run.pk, owner)
    view = ClientView()
    view.apply(await receive(ws))
    assert view.last_seq == 2
    await sync_to_async(lifecycle.request_cancel)(run.pk, "stop")  # from the API, the admin, the CLI
    end = await ws.receive_json_from(timeout=2)
    assert (end["type"], end["status"], end["seq"]) == ("run_status", "cancelled", 4)
    assert end["seq"] != view.last_seq + 1  # a gap: the client resyncs
    await ws.send_json_to({"type": "resync"})
    snapshot = await receive(ws)
    assert (snapshot["status"], snapshot["seq"]) == ("cancelled", 4)
    await close(ws)
    reconnect = await socket(run.pk, owner, after=2)  # the buffer holds the gap too
    assert (await receive(reconnect))["type"] == "snapshot"
    await close(reconnect)
    await reader_buffer().discard(str(run.pk))


async def test_cancelling_a_claimed_run_leaves_its_end_to_the_worker(owner: Any) -> None:
    run = await new_run(owner)
    assert await sync_to_async(lifecycle.claim_run)(str(run.pk))
    assert await sync_to_async(lifecycle.request_cancel)(run.pk)
    assert await reader_buffer().last_seq(str(run.pk)) == 0  # nothing numbered beside the worker


async def test_bad_client_input_gets_an_error_frame_and_the_socket_stays_open(owner: Any, frames_out: Any) -> None:
    run = await new_run(owner)
    ws = await socket(run.pk, owner)
    await receive(ws)
    await ws.send_to(text_data="not json {")
    assert (await receive(ws))["code"] == "bad_json"
    await ws.send_json_to({"type": "dance"})
    assert (await receive(ws))["code"] == "unknown_type"
    await ws.send_json_to(["cancel"])
    assert (await receive(ws))["code"] == "unknown_type"
    await ws.send_to(bytes_data=b"\x00\x01")
    error = await receive(ws)
    assert error["type"] == "error"
    assert error["code"] == "bad_message"
    assert error["run_id"] == str(run.pk)
    await ws.send_json_to({"type": "resync"})
    assert (await receive(ws))["type"] == "snapshot"
    await close(ws)


# ---- embedded mode ------------------------------------------------------------------------------


@override_settings(CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}})
async def test_embedded_mode_delivers_from_the_run_thread_to_the_socket_loop(owner: Any) -> None:
    run = await new_run(owner, "Tell me a story [[words=80]]", faults=["cut:bytes=1500"])
    ws = await socket(run.pk, owner)
    snapshot = await receive(ws)
    executing = await sync_to_async(starter.start_in_thread)(str(run.pk))  # its own thread and event loop
    frames = await receive_until(ws, finished)
    assert frames[-1]["status"] == "completed"
    view = ClientView().apply_all([snapshot, *frames])
    ((reconstructed, committed),) = view.turns
    assert reconstructed == committed
    await close(ws)
    # The finished frame comes before the run's last writes: wait for its thread, not the frame.
    await asyncio.to_thread(executing.join, 60)
    assert not executing.is_alive()
    await reader_buffer().discard(str(run.pk))
