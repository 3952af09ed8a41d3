"""Hundreds of runs (or sockets) on one shared Redis client: they wait for a connection, never fail for one."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.conf import settings

from streamrecover.live.buffer import RedisFrameBuffer
from streamrecover.redisclients import MAX_CONNECTIONS
from streamrecover.runs.checkpoints import RedisCheckpointStore

from .factories import make_checkpoint

pytestmark = pytest.mark.services

# More callers at once than redis-py's default pool allows (100 connections in use), which
# raised MaxConnectionsError under the 500-stream delivery load: failed runs, no snapshots.
CALLERS = 300


def test_a_shared_checkpoint_store_serves_more_runs_at_once_than_it_has_connections() -> None:
    prefix = f"test-pool-{uuid.uuid4().hex}:"
    store = RedisCheckpointStore(settings.STREAMRECOVER["REDIS_URL"], ttl_s=60, prefix=prefix)
    run_ids = [str(uuid.uuid4()) for _ in range(CALLERS)]

    async def main() -> list[str | None]:
        try:
            await asyncio.gather(*(store.put(make_checkpoint(run_id)) for run_id in run_ids))
            got = await asyncio.gather(*(store.get(run_id) for run_id in run_ids))
            await asyncio.gather(*(store.delete(run_id) for run_id in run_ids))
            return [checkpoint.run_id if checkpoint else None for checkpoint in got]
        finally:
            await store.aclose()

    assert asyncio.run(main()) == run_ids
    assert CALLERS > MAX_CONNECTIONS


def test_a_shared_frame_buffer_answers_every_socket_at_once() -> None:
    prefix = f"test-pool-{uuid.uuid4().hex}:"
    buffer = RedisFrameBuffer(settings.STREAMRECOVER["REDIS_URL"], prefix=prefix)
    run_id = str(uuid.uuid4())

    async def main() -> list[int]:
        try:
            await buffer.append(run_id, {"type": "run_status", "run_id": run_id, "seq": 1, "status": "running"})
            # what a connecting or checking socket reads: the frames after its seq, in a transaction
            replays = await asyncio.gather(*(buffer.frames_after(run_id, 0) for _ in range(CALLERS)))
            return [frames[-1]["seq"] if frames else 0 for frames in replays]
        finally:
            await buffer.discard(run_id)
            await buffer.aclose()

    assert asyncio.run(main()) == [1] * CALLERS
