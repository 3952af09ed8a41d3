"""What an active stream holds on its loop: a worker's memory per stream is mostly objects each
stream keeps alive (issue 13), so a run keeps no task that only waits for its end."""

from __future__ import annotations

import asyncio

from streamrecover.engine.cancel import CancelToken
from streamrecover.runs.fence import Fence
from streamrecover.runs.watch import watching


async def test_watched_runs_hold_no_task_of_their_own() -> None:
    before = asyncio.all_tasks()
    running = asyncio.current_task()
    assert running is not None
    tokens = [CancelToken() for _ in range(3)]
    with (
        watching(Fence("run-a", 1, 10.0), tokens[0], running),
        watching(Fence("run-b", 1, 10.0), tokens[1], running),
        watching(Fence("run-c", 1, 10.0), tokens[2], running),
    ):
        held = asyncio.all_tasks() - before
        assert len(held) == 1  # the loop's one watcher, whatever the number of runs
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
