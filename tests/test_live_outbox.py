"""A worker serving many runs: one shared event loop, every run's frames leaving in a few Redis
pipelines (in order, encoded once), one watcher noticing each run's cancel (real Redis, PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db.models import F

from streamrecover.engine.cancel import CancelToken
from streamrecover.live.buffer import RedisFrameBuffer
from streamrecover.live.fanout import fanout_for, frames_channel
from streamrecover.live.outbox import outbox_for
from streamrecover.live.publisher import make_publisher
from streamrecover.models import Run
from streamrecover.runs import lifecycle
from streamrecover.runs import watch as run_watch
from streamrecover.runs.fence import Fence
from streamrecover.runs.loop import on_shared_loop, run_on_shared_loop
from streamrecover.runs.watch import _beat, watch

from .factories import make_user

RUNS = 5
DELTAS = 20


class Watcher:
    """What the fan-out pushes to one socket."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[tuple[int, str]] = asyncio.Queue()

    async def push_frame(self, seq: int, text: str) -> None:
        self.frames.put_nowait((seq, text))


@pytest.mark.services
async def test_many_runs_frames_leave_in_a_few_pipelines_in_order_and_encoded_once() -> None:
    layer = get_channel_layer()
    buffer = RedisFrameBuffer(settings.REDIS_URL, prefix=f"streamrecover:test:{uuid.uuid4().hex}:")
    run_ids = [uuid.uuid4().hex for _ in range(RUNS)]
    fanout = fanout_for(buffer)
    watchers = {run_id: Watcher() for run_id in run_ids}
    for run_id, watcher in watchers.items():  # a socket of each run, as a consumer is
        await fanout.join(frames_channel(buffer, run_id), watcher)
    publishers = [await make_publisher(run_id, buffer=buffer, layer=layer) for run_id in run_ids]
    outbox = outbox_for(buffer, layer)
    assert outbox is not None
    assert all(p.outbox is outbox for p in publishers)
    for p in publishers:
        p.coalesce_s = 0.0  # one frame per delta: the most frames the outbox can be given
    sent = {run_id: [] for run_id in run_ids}
    for i in range(DELTAS):  # the runs' deltas interleaved, as on a shared loop
        for p in publishers:
            frame = {"type": "text_delta", "run_id": p.run_id, "seq": i + 1, "block": 0, "text": f"w{i} "}
            sent[p.run_id].append(frame)
            await p.on_frame(frame)  # type: ignore[arg-type]
    await outbox.barrier()
    try:
        # a hundred frames from five runs left in a handful of pipelines, not a hundred round trips
        assert outbox.frames == RUNS * DELTAS
        assert outbox.pipelines <= 5
        for run_id in run_ids:
            received = []
            for _ in range(DELTAS):
                seq, text = await asyncio.wait_for(watchers[run_id].frames.get(), 5)
                assert json.loads(text)["seq"] == seq  # the text is the frame
                received.append(json.loads(text))
            assert received == sent[run_id]  # in order, nothing lost, nothing changed
            # and the replay buffer kept the very same frames
            assert await buffer.frames_after(run_id, 0) == sent[run_id]
    finally:
        for run_id, watcher in watchers.items():
            await fanout.leave(frames_channel(buffer, run_id), watcher)
        for p in publishers:
            await p.aclose()
        client = buffer._redis()
        keys = [key async for key in client.scan_iter(match=f"{buffer.prefix}*")]
        if keys:
            await client.delete(*keys)
        await buffer.aclose()


def test_tasks_in_different_threads_share_one_event_loop() -> None:
    async def which() -> tuple[int, bool]:
        await asyncio.sleep(0)
        return id(asyncio.get_running_loop()), on_shared_loop()

    results: list[tuple[int, bool]] = []
    threads = [threading.Thread(target=lambda: results.append(run_on_shared_loop(which()))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4
    assert len({loop for loop, _ in results}) == 1
    assert all(shared for _, shared in results)

    async def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run_on_shared_loop(fails())


@pytest.mark.django_db(transaction=True)
async def test_one_watcher_beats_every_run_and_cancels_only_the_run_asked_to_stop() -> None:
    user = await sync_to_async(make_user)()
    runs = [await sync_to_async(lifecycle.create_run)(prompt=f"story {i}", owner=user) for i in range(4)]
    fences = []
    for run in runs:
        claimed = await sync_to_async(lifecycle.claim_run)(str(run.pk), "worker-a")
        assert claimed is not None
        fences.append(Fence(str(run.pk), claimed.claim_epoch, 10.0))
    await Run.objects.filter(pk__in=[r.pk for r in runs]).aupdate(heartbeat_at=None)
    # run 3's claim is taken over (a sweep raised its epoch): its heartbeat must not be written
    await Run.objects.filter(pk=runs[3].pk).aupdate(claim_epoch=F("claim_epoch") + 1)
    tokens = [CancelToken() for _ in runs]
    for token in tokens:
        token.bind()
    running = [asyncio.ensure_future(asyncio.Event().wait()) for _ in runs]  # the runs' tasks
    watchers = [
        asyncio.ensure_future(watch(fence, token, task))
        for fence, token, task in zip(fences, tokens, running, strict=True)
    ]
    try:
        await sync_to_async(lifecycle.request_cancel)(runs[2].pk, "stop that one")
        deadline = time.monotonic() + 5
        while not (tokens[2].stopped and running[3].done()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert tokens[2].stopped
        assert tokens[2].reason == "stop that one"
        assert [t.stopped for t in tokens] == [False, False, True, False]
        # the lost claim: its task is cancelled, its fence refuses every later write
        assert [task.cancelled() for task in running] == [False, False, False, True]
        assert [fence.lost for fence in fences] == [False, False, False, True]
        beats: list[Any] = [
            r
            async for r in Run.objects.filter(pk__in=[r.pk for r in runs])
            .order_by("created")
            .values_list("pk", "heartbeat_at")
        ]
        by_run = dict(beats)
        assert all(by_run[r.pk] is not None for r in runs[:3])
        assert by_run[runs[3].pk] is None
    finally:
        for task in [*watchers, *running]:
            task.cancel()
        await asyncio.gather(*watchers, *running, return_exceptions=True)


@pytest.mark.django_db(transaction=True)
async def test_a_heartbeat_that_finds_a_stale_claim_lost_leaves_the_runs_newer_claim_running(monkeypatch: Any) -> None:
    """The worker claims again a run it still executes under a stale claim (the sweep took the
    run back meanwhile), while the watcher's heartbeat for the stale claim is on its way: that
    beat finds the stale claim lost. Only the stale claim may be fenced out. The watcher took
    the run's new claim for the lost one: it cancelled the new claim's task, so the run stood
    still, unbeaten, until it went stale and was swept again."""
    user = await sync_to_async(make_user)()
    run = await sync_to_async(lifecycle.create_run)(prompt="story", owner=user)
    claimed = await sync_to_async(lifecycle.claim_run)(str(run.pk), "worker-a")
    assert claimed is not None
    stale = Fence(str(run.pk), claimed.claim_epoch, 10.0)
    await Run.objects.filter(pk=run.pk).aupdate(claim_epoch=F("claim_epoch") + 2)  # swept, claimed again
    newer = Fence(str(run.pk), claimed.claim_epoch + 2, 10.0)

    beating, joined = threading.Event(), threading.Event()
    real_beat = run_watch._beat

    def beat_while_the_run_is_claimed_again(fences: list[Fence]) -> set[str]:
        beating.set()
        joined.wait(5)  # the newer claim joins the watcher while this beat is on its way
        return real_beat(fences)

    monkeypatch.setattr(run_watch, "_beat", beat_while_the_run_is_claimed_again)
    tokens = [CancelToken(), CancelToken()]
    running = [asyncio.ensure_future(asyncio.Event().wait()) for _ in tokens]  # the claims' tasks
    watchers = [asyncio.ensure_future(watch(stale, tokens[0], running[0]))]
    try:
        while not beating.is_set():
            await asyncio.sleep(0.01)
        watchers.append(asyncio.ensure_future(watch(newer, tokens[1], running[1])))
        await asyncio.sleep(0)  # the newer claim's watch joins
        joined.set()
        deadline = time.monotonic() + 5
        while not (stale.lost or newer.lost) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        assert (newer.lost, running[1].done()) == (False, False)  # the newer one goes on
        assert stale.lost  # the stale claim is fenced out: it writes nothing more
        assert run_watch._watchers[asyncio.get_running_loop()].runs[str(run.pk)].fence is newer  # still beaten
    finally:
        joined.set()
        for task in [*watchers, *running]:
            task.cancel()
        await asyncio.gather(*watchers, *running, return_exceptions=True)


@pytest.mark.django_db
def test_one_heartbeat_statement_beats_runs_of_every_claim_epoch_and_names_the_lost_ones(
    django_assert_num_queries: Any,
) -> None:
    user = make_user()
    runs = [lifecycle.create_run(prompt=f"story {i}", owner=user) for i in range(12)]
    fences = []
    for run in runs:
        claimed = lifecycle.claim_run(str(run.pk), "worker-a")
        assert claimed is not None
        fences.append(Fence(str(run.pk), claimed.claim_epoch, 10.0))
    # runs 0-3 were resumed by a later claim (a later epoch, still theirs); run 11's was taken over
    for index in range(4):
        Run.objects.filter(pk=runs[index].pk).update(claim_epoch=F("claim_epoch") + 2)
        fences[index] = Fence(str(runs[index].pk), fences[index].epoch + 2, 10.0)
    Run.objects.filter(pk=runs[11].pk).update(claim_epoch=F("claim_epoch") + 1)
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(heartbeat_at=None)

    with django_assert_num_queries(1):  # every claim current: one UPDATE, whatever the run count
        assert _beat(fences[:11]) == set()
    assert _beat(fences) == {str(runs[11].pk)}

    beaten = dict(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("pk", "heartbeat_at"))
    assert all(beaten[r.pk] is not None for r in runs[:11])
    assert beaten[runs[11].pk] is None  # a lost claim's heartbeat is never written


@pytest.mark.services
async def test_a_lost_claims_late_frames_reach_neither_the_buffer_nor_the_sockets() -> None:
    """Worker A loses its claim while frames sit in its outbox (its process paused); worker B
    takes the run over and numbers on from A's last kept seq. A's late frames, flushed once it
    resumes, must not replace B's in the buffer nor reach the run's sockets."""
    layer = get_channel_layer()
    prefix = f"streamrecover:test:{uuid.uuid4().hex}:"
    run_id = uuid.uuid4().hex
    worker_a = RedisFrameBuffer(settings.REDIS_URL, prefix=prefix)
    worker_b = RedisFrameBuffer(settings.REDIS_URL, prefix=prefix)
    fanout = fanout_for(worker_b)
    socket = Watcher()
    await fanout.join(frames_channel(worker_b, run_id), socket)
    a = await make_publisher(run_id, buffer=worker_a, layer=layer)
    a.coalesce_s = 0.0

    def delta(seq: int, text: str) -> Any:
        return {"type": "text_delta", "run_id": run_id, "seq": seq, "block": 0, "text": text}

    try:
        for seq in (1, 2, 3):
            await a.on_frame(delta(seq, "a"))
        assert a.outbox is not None
        await a.outbox.barrier()
        b = await make_publisher(run_id, buffer=worker_b, layer=layer)  # B claims: numbers on from 3 (+1 left out)
        b.coalesce_s = 0.0
        await b.on_frame({"type": "run_status", "run_id": run_id, "seq": 5, "status": "running"})  # type: ignore[arg-type]
        assert b.outbox is not None
        await b.outbox.barrier()
        for seq in (4, 5, 6):  # A resumes: what its outbox held goes out
            await a.on_frame(delta(seq, "STALE"))
        await a.outbox.barrier()
        await b.on_frame({"type": "stream_reset", "run_id": run_id, "seq": 6, "reason": "reclaimed"})  # type: ignore[arg-type]
        await b.outbox.barrier()
        await asyncio.sleep(0.3)
        received = []
        while not socket.frames.empty():
            received.append(json.loads((await socket.frames.get())[1]))
        kept = await worker_b.frames_after(run_id, 4) or []
        assert [f["type"] for f in kept] == ["run_status", "stream_reset"]  # B's frames, not A's
        assert all(f.get("text") != "STALE" for f in received)
    finally:
        await fanout.leave(frames_channel(worker_b, run_id), socket)
        client = worker_b._redis()
        keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
        await worker_a.aclose()
        await worker_b.aclose()
