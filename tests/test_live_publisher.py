"""The live publisher: deltas coalesced by time and size without changing a character, one
group message per frame, and the bounded replay buffer (in memory and on the real Redis)."""

from __future__ import annotations

import asyncio
import itertools
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from django.conf import settings

from streamrecover.engine.protocol import frame_span
from streamrecover.live.buffer import FINISHED_TTL_S, InMemoryFrameBuffer, RedisFrameBuffer
from streamrecover.live.delivery import FRAME_EVENT, group_name
from streamrecover.live.publisher import Publisher, make_publisher

PIECES = ["Hé", "llo", " 日本", "語", " 🚀", "!", " ca", "fé", "\n", "ok"]


class CapturingLayer:
    """Stands in for a channel layer: records every group message."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self.sent.append((group, message))

    def frames(self) -> list[dict[str, Any]]:
        return [message["frame"] for _, message in self.sent]


def text_frame(run_id: str, seq: int, text: str, block: int = 0) -> dict[str, Any]:
    return {"type": "text_delta", "run_id": run_id, "seq": seq, "block": block, "text": text}


def publisher(buffer: Any, layer: CapturingLayer, *, coalesce_s: float = 0.05, max_chars: int = 4096) -> Publisher:
    return Publisher(uuid.uuid4().hex, buffer, layer, coalesce_s=coalesce_s, max_chars=max_chars)


def assert_whole_pieces(frames: list[dict[str, Any]], pieces: list[str]) -> None:
    """Every frame's text is a run of whole deltas: no delta, so no character, is ever split."""
    boundaries = {0}
    total = 0
    for piece in pieces:
        total += len(piece)
        boundaries.add(total)
    position = 0
    for frame in frames:
        position += len(frame["text"])
        assert position in boundaries
        frame["text"].encode("utf-8")  # no lone surrogate


@pytest.fixture
async def redis_buffer() -> AsyncIterator[RedisFrameBuffer]:
    buffer = RedisFrameBuffer(settings.REDIS_URL, max_frames=50, prefix=f"streamrecover:test:{uuid.uuid4().hex}:")
    yield buffer
    client = buffer._redis()
    keys = [key async for key in client.scan_iter(match=f"{buffer.prefix}*")]
    if keys:
        await client.delete(*keys)
    await buffer.aclose()


async def test_deltas_in_quick_succession_become_fewer_frames_with_identical_text() -> None:
    layer = CapturingLayer()
    pub = publisher(InMemoryFrameBuffer(), layer, coalesce_s=0.05)
    deltas = PIECES * 10
    for seq, piece in enumerate(deltas, start=1):
        await pub.on_frame(text_frame(pub.run_id, seq, piece))
    await pub.aclose()
    frames = layer.frames()
    assert len(frames) < len(deltas) / 5
    assert "".join(f["text"] for f in frames) == "".join(deltas)
    assert frames[-1]["seq"] == len(deltas)  # the last seq of the merged frames
    assert frame_span(frames[0])[0] == 1
    assert_whole_pieces(frames, deltas)
    # one group message per frame, and the buffer holds exactly what the group got
    assert len(layer.sent) == len(frames) == pub.sent
    assert await pub.buffer.frames_after(pub.run_id, 0) == frames


async def test_token_logprobs_of_a_text_delta_never_reach_browsers_nor_the_buffer() -> None:
    """They are for the healing endpoint's Chat stream: a coalesced frame would carry only its first
    delta's, and nothing in the browser protocol reads them."""
    layer = CapturingLayer()
    pub = publisher(InMemoryFrameBuffer(), layer, coalesce_s=0.05)
    for seq, piece in enumerate(PIECES, start=1):
        entry = {"token": piece, "logprob": -0.5, "bytes": list(piece.encode()), "top_logprobs": []}
        await pub.on_frame({**text_frame(pub.run_id, seq, piece), "logprobs": [entry]})
    await pub.aclose()
    frames = layer.frames()
    assert "".join(f["text"] for f in frames) == "".join(PIECES)
    assert all("logprobs" not in f for f in frames)
    assert await pub.buffer.frames_after(pub.run_id, 0) == frames


async def test_the_coalescing_window_is_time_based_and_a_timer_flushes_a_lone_delta() -> None:
    layer = CapturingLayer()
    pub = publisher(InMemoryFrameBuffer(), layer, coalesce_s=0.04)
    for seq, piece in enumerate(PIECES, start=1):
        await pub.on_frame(text_frame(pub.run_id, seq, piece))
        await asyncio.sleep(0.015)
    await asyncio.sleep(0.1)  # no flush call: the timer publishes what is pending
    frames = layer.frames()
    assert 1 < len(frames) < len(PIECES)
    assert "".join(f["text"] for f in frames) == "".join(PIECES)
    assert frames[-1]["seq"] == len(PIECES)
    spans = [frame_span(f) for f in frames]
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(spans))  # contiguous, ordered
    await pub.aclose()


async def test_a_delta_whose_window_ends_goes_out_before_the_frame_taken_after_it() -> None:
    # Without an outbox each frame's sends are awaited; the window's timer hands its delta to a
    # task, and the engine's next frame may get the lock before that task starts.
    layer = CapturingLayer()
    now = [0.0]
    pub = Publisher(
        uuid.uuid4().hex, InMemoryFrameBuffer(), layer, coalesce_s=0.05, max_chars=4096, clock=lambda: now[0]
    )
    await pub.on_frame(text_frame(pub.run_id, 1, "Hello"))  # pending: its window is open
    now[0] = 1.0
    pub._due()  # the loop's timer: the window is over
    await pub.on_frame({"type": "run_status", "run_id": pub.run_id, "seq": 2, "status": "completed"})  # type: ignore[typeddict-item]
    await pub.aclose()
    assert [f["seq"] for f in layer.frames()] == [1, 2]


async def test_frames_never_exceed_the_size_limit_and_never_split_a_delta() -> None:
    layer = CapturingLayer()
    pub = publisher(InMemoryFrameBuffer(), layer, coalesce_s=10, max_chars=10)
    deltas = ["日本語", "🚀🚀", "abc", "é", "xyz!"] * 12
    for seq, piece in enumerate(deltas, start=1):
        await pub.on_frame(text_frame(pub.run_id, seq, piece))
    await pub.aclose()
    frames = layer.frames()
    assert all(len(f["text"]) <= 10 for f in frames)
    assert len(frames) < len(deltas)
    assert "".join(f["text"] for f in frames) == "".join(deltas)
    assert_whole_pieces(frames, deltas)
    assert frames[-1]["seq"] == len(deltas)


async def test_a_delta_longer_than_the_limit_goes_out_whole() -> None:
    layer = CapturingLayer()
    pub = publisher(InMemoryFrameBuffer(), layer, coalesce_s=10, max_chars=4)
    await pub.on_frame(text_frame(pub.run_id, 1, "ab"))
    await pub.on_frame(text_frame(pub.run_id, 2, "🚀 long delta"))
    await pub.aclose()
    assert [f["text"] for f in layer.frames()] == ["ab", "🚀 long delta"]


async def test_other_frames_flush_pending_deltas_first_and_blocks_never_merge() -> None:
    layer = CapturingLayer()
    pub = publisher(InMemoryFrameBuffer(), layer, coalesce_s=10)
    run_id = pub.run_id
    sequence = [
        {"type": "run_status", "status": "running"},
        {"type": "text_delta", "block": 0, "text": "Hello"},
        {"type": "text_delta", "block": 0, "text": " there"},
        {"type": "tool_call_delta", "block": 1, "id": "t1", "name": "get_weather", "arguments_delta": ""},
        {"type": "tool_call_delta", "block": 1, "id": "t1", "name": "get_weather", "arguments_delta": '{"ci'},
        {"type": "tool_call_delta", "block": 1, "id": "t1", "name": "get_weather", "arguments_delta": 'ty": '},
        {"type": "recovery", "phase": "backoff", "attempt": 1, "plan": "truncate_before_tool", "backoff_s": 1.0},
        {"type": "tool_call_cancel", "block": 1, "id": "t1", "name": "get_weather", "reason": "partial"},
        {"type": "thinking_delta", "block": 2, "thinking": "hm"},
        {"type": "text_delta", "block": 3, "text": "!"},
    ]
    for seq, frame in enumerate(sequence, start=1):
        await pub.on_frame({**frame, "run_id": run_id, "seq": seq})
    await pub.aclose()
    frames = layer.frames()
    assert [(f["type"], f["seq"]) for f in frames] == [
        ("run_status", 1),
        ("text_delta", 3),
        ("tool_call_delta", 6),
        ("recovery", 7),
        ("tool_call_cancel", 8),
        ("thinking_delta", 9),
        ("text_delta", 10),
    ]
    assert frames[1]["text"] == "Hello there"
    assert frames[1]["first_seq"] == 2
    assert frames[2]["arguments_delta"] == '{"city": '
    assert frames[2]["first_seq"] == 4
    assert "first_seq" not in frames[0]
    assert "first_seq" not in frames[-1]


async def test_without_a_window_every_delta_is_its_own_frame() -> None:
    layer = CapturingLayer()
    pub = publisher(InMemoryFrameBuffer(), layer, coalesce_s=0)
    for seq, piece in enumerate(PIECES, start=1):
        await pub.on_frame(text_frame(pub.run_id, seq, piece))
    await pub.aclose()
    assert [f["text"] for f in layer.frames()] == PIECES


def test_group_names_are_valid_for_every_channel_layer() -> None:
    name = group_name(uuid.uuid4())
    assert re.fullmatch(r"[a-zA-Z\d\-_.]+", name)
    assert len(name) < 100
    assert name.startswith("streamrecover.run.")


async def test_memory_buffer_is_bounded_and_knows_when_frames_are_gone() -> None:
    buffer = InMemoryFrameBuffer(max_frames=50)
    run_id = uuid.uuid4().hex
    for seq in range(1, 501):
        await buffer.append(run_id, text_frame(run_id, seq, "x"))
    assert len(buffer._runs[run_id].frames) == 50
    assert await buffer.frames_after(run_id, 0) is None  # trimmed: the client needs a snapshot
    assert [f["seq"] for f in await buffer.frames_after(run_id, 490)] == list(range(491, 501))
    assert await buffer.frames_after(run_id, 500) == []
    assert await buffer.frames_after(run_id, 501) is None
    state = await buffer.state(run_id)
    assert state is not None
    assert state.partial() == [{"block": 0, "content": {"type": "text", "text": "x" * 500}}]
    assert await buffer.last_seq(run_id) == 500


async def test_memory_buffer_expires_after_the_run_ends() -> None:
    now = [0.0]
    buffer = InMemoryFrameBuffer(finished_ttl_s=60, clock=lambda: now[0])
    run_id = uuid.uuid4().hex
    await buffer.append(run_id, text_frame(run_id, 1, "x"))
    await buffer.finish(run_id)
    now[0] = 59
    assert await buffer.last_seq(run_id) == 1
    now[0] = 61
    assert await buffer.last_seq(run_id) == 0
    assert await buffer.frames_after(run_id, 0) is None
    assert await buffer.state(run_id) is None


@pytest.mark.services
async def test_redis_buffer_is_bounded_and_rebuilds_the_state_past_the_cap(redis_buffer: RedisFrameBuffer) -> None:
    run_id = str(uuid.uuid4())
    pieces = [PIECES[i % len(PIECES)] for i in range(500)]
    for seq, piece in enumerate(pieces, start=1):
        await redis_buffer.append(run_id, text_frame(run_id, seq, piece))
    state_key, frames_key = redis_buffer.keys(run_id)
    client = redis_buffer._redis()
    assert 50 <= await client.xlen(frames_key) < 500  # MAXLEN ~ 50
    assert await redis_buffer.frames_after(run_id, 0) is None
    assert [f["seq"] for f in await redis_buffer.frames_after(run_id, 490)] == list(range(491, 501))
    assert await redis_buffer.frames_after(run_id, 500) == []
    # a reader (another process) rebuilds the client's view from the saved state + the frames after it
    reader = RedisFrameBuffer(settings.REDIS_URL, prefix=redis_buffer.prefix)
    state = await reader.state(run_id)
    assert state is not None
    assert state.seq == 500
    assert state.partial() == [{"block": 0, "content": {"type": "text", "text": "".join(pieces)}}]
    assert await reader.last_seq(run_id) == 500
    await reader.aclose()
    # an older seq (a stale worker) is refused, not appended
    await redis_buffer.append(run_id, text_frame(run_id, 7, "late"))
    assert await redis_buffer.last_seq(run_id) == 500
    await redis_buffer.finish(run_id)
    assert 0 < await client.ttl(frames_key) <= FINISHED_TTL_S
    assert 0 < await client.ttl(state_key) <= FINISHED_TTL_S


@pytest.mark.services
async def test_a_resumed_run_numbers_on_from_the_buffer(redis_buffer: RedisFrameBuffer) -> None:
    run_id = str(uuid.uuid4())
    layer = CapturingLayer()
    first = await make_publisher(run_id, buffer=redis_buffer, layer=layer)
    assert first.last_seq == 0
    for seq in range(1, 8):
        await first.on_frame(text_frame(run_id, seq, "a"))
    await first.flush()
    other_worker = RedisFrameBuffer(settings.REDIS_URL, prefix=redis_buffer.prefix)
    second = await make_publisher(run_id, buffer=other_worker, layer=layer)
    assert second.last_seq == 7
    await second.on_frame({"type": "stream_reset", "run_id": run_id, "seq": 8, "reason": "resume"})
    await second.on_frame(text_frame(run_id, 9, "b"))
    await second.flush()
    state = await redis_buffer.state(run_id)
    assert state is not None
    assert state.seq == 9
    assert state.partial() == [{"block": 0, "content": {"type": "text", "text": "b"}}]
    assert all(message["type"] == FRAME_EVENT for _, message in layer.sent)
    await other_worker.aclose()


@pytest.mark.services
async def test_a_run_reclaimed_by_a_worker_that_lost_it_earlier_numbers_on_from_redis() -> None:
    # Worker 1 streams to seq 5 and loses its claim; worker 2 streams on to 20; worker 1 claims
    # the run again: its frames must follow seq 20, or the buffer refuses them and every socket
    # drops them as already seen.
    prefix = f"streamrecover:test:{uuid.uuid4().hex}:"
    worker1, worker2, reader = (RedisFrameBuffer(settings.REDIS_URL, prefix=prefix) for _ in range(3))
    run_id = str(uuid.uuid4())

    async def stream(buffer: RedisFrameBuffer, texts: list[str]) -> Publisher:
        pub = await make_publisher(run_id, buffer=buffer)  # the tests' layer: through the outbox
        assert pub.outbox is not None
        pub.coalesce_s = 0
        if pub.last_seq:
            pub.last_seq += 1  # a new claim leaves one seq out (runs.execution)
            await pub.on_frame({"type": "stream_reset", "run_id": run_id, "seq": pub.last_seq, "reason": "reclaimed"})
        for text in texts:
            await pub.on_frame(text_frame(run_id, pub.last_seq + 1, text))
        await pub.flush()
        await pub.outbox.barrier()
        return pub

    try:
        lost = await stream(worker1, ["a"] * 5)
        lost.abandon()
        await lost.aclose()
        assert run_id not in worker1._writing  # nothing of the lost claim stays in the worker
        done = await stream(worker2, ["b"] * 14)
        await done.aclose()
        assert await reader.last_seq(run_id) == 20
        again = await stream(worker1, ["new"])
        assert again.last_seq == 22
        frames = await reader.frames_after(run_id, 20)
        assert frames is not None
        assert [(f["seq"], f.get("text")) for f in frames] == [(21, None), (22, "new")]
        state = await reader.state(run_id)
        assert state is not None
        assert state.partial() == [{"block": 0, "content": {"type": "text", "text": "new"}}]
        await again.aclose()
    finally:
        await reader.discard(run_id)
        for buffer in (worker1, worker2, reader):
            await buffer.aclose()


@pytest.mark.services
async def test_a_lost_claim_let_go_after_the_runs_new_claim_began_leaves_its_frames_kept(
    redis_buffer: RedisFrameBuffer,
) -> None:
    # The same worker claims the run again before its first claim has noticed the loss.
    run_id = str(uuid.uuid4())
    lost = await make_publisher(run_id, buffer=redis_buffer)
    assert lost.outbox is not None
    lost.coalesce_s = 0
    await lost.on_frame(text_frame(run_id, 1, "old"))
    await lost.outbox.barrier()
    new = await make_publisher(run_id, buffer=redis_buffer)
    new.coalesce_s = 0
    lost.abandon()
    await lost.aclose()
    await new.on_frame({"type": "stream_reset", "run_id": run_id, "seq": 3, "reason": "reclaimed"})
    await new.on_frame(text_frame(run_id, 4, "new"))
    await new.aclose()
    reader = RedisFrameBuffer(settings.REDIS_URL, prefix=redis_buffer.prefix)
    last, state = await reader.last_seq(run_id), await reader.state(run_id)
    await reader.aclose()
    assert last == 4
    assert state is not None
    assert state.partial() == [{"block": 0, "content": {"type": "text", "text": "new"}}]


class FailingBuffer(InMemoryFrameBuffer):
    """A buffer whose storage is down."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def append(self, run_id: str, frame: dict[str, Any]) -> None:
        self.calls += 1
        raise ConnectionError("redis is down")


async def test_a_failing_buffer_never_stops_delivery_and_is_left_alone_for_a_while() -> None:
    layer = CapturingLayer()
    buffer = FailingBuffer()
    pub = publisher(buffer, layer, coalesce_s=0)
    for seq, piece in enumerate(PIECES, start=1):
        await pub.on_frame(text_frame(pub.run_id, seq, piece))
    await pub.aclose()
    assert [f["text"] for f in layer.frames()] == PIECES
    assert buffer.calls == 1  # one failure, then skipped instead of stalling every frame


@pytest.mark.services
@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_last_seqs_reads_many_runs_at_once_as_last_seq_does_one(
    kind: str,
    redis_buffer: RedisFrameBuffer,
) -> None:
    buffer: InMemoryFrameBuffer | RedisFrameBuffer = InMemoryFrameBuffer() if kind == "memory" else redis_buffer
    plain, merged, empty = (str(uuid.uuid4()) for _ in range(3))
    for seq in (1, 2, 3):
        await buffer.append(plain, text_frame(plain, seq, PIECES[seq]))
    # a coalesced frame (seqs 4 to 9 in one) ends the other run's stream: its last seq counts
    await buffer.append(merged, text_frame(merged, 3, "a"))
    await buffer.append(merged, {**text_frame(merged, 9, "bcdefg"), "first_seq": 4})
    found = await buffer.last_seqs([plain, merged, empty])
    assert found == {plain: 3, merged: 9, empty: 0}
    assert found == {run: await buffer.last_seq(run) for run in (plain, merged, empty)}
