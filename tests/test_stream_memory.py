"""What an active stream holds on its loop: a worker's memory per stream is mostly objects each
stream keeps alive (issue 13), so a run keeps no task that only waits for its end or for its
cancel token, and a cancel still stops it mid-stream."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from streamrecover.engine.agent import run_agent
from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import InMemoryCheckpointStore
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest, ProviderConfig
from streamrecover.engine.sink import CollectingSink
from streamrecover.engine.transport import OpenedStream
from streamrecover.providers.registry import get_adapter
from streamrecover.runs.fence import Fence
from streamrecover.runs.watch import watching

from .harness import FAST, user
from .scripted import anthropic_blocks


class _HeldTransport:
    """Sends the first deltas of an answer, then holds the stream open until closed."""

    def __init__(self) -> None:
        self.streaming = asyncio.Event()
        self.closed = False

    async def __aenter__(self) -> _HeldTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], json_body: dict[str, Any], *timeouts: float
    ) -> OpenedStream:
        if url.endswith("/count_tokens"):
            return OpenedStream(404, {"content-type": "application/json"}, _body(b"{}"), self._close)
        head = anthropic_blocks(({"type": "text", "text": ""}, [{"type": "text_delta", "text": "Hello"}], False))

        async def chunks() -> AsyncIterator[bytes]:
            yield head
            self.streaming.set()
            await asyncio.Event().wait()  # the model is still thinking
            yield b""  # pragma: no cover

        return OpenedStream(200, {"content-type": "text/event-stream"}, chunks(), self._close)

    async def _close(self) -> None:
        self.closed = True


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_a_streaming_run_holds_one_task_beside_its_own_and_a_cancel_still_stops_it() -> None:
    transport = _HeldTransport()
    provider = ProviderConfig(name="anthropic", base_url="https://scripted.invalid", api_key="k")
    cancel = CancelToken()
    sink = CollectingSink()
    ctx = RunContext(
        run_id=uuid.uuid4().hex,
        adapter=get_adapter(provider),
        config=FAST,
        sink=sink,
        checkpoints=InMemoryCheckpointStore(),
        cancel=cancel,
        transport=transport,  # type: ignore[arg-type]  # the transport's interface, not its class
    )
    request = ModelRequest(model="claude-3-7-sonnet", messages=[user("Tell me something")], max_tokens=64)
    before = asyncio.all_tasks()
    run = asyncio.ensure_future(run_agent(ctx, request))
    await asyncio.wait_for(transport.streaming.wait(), 10)
    await asyncio.sleep(0)
    held = asyncio.all_tasks() - before - {run}
    # the stream's reader; a task per attempt that only awaited the cancel token was the other
    assert len(held) == 1
    cancel.cancel("the user stopped it")
    result = await asyncio.wait_for(run, 10)
    assert result.status == "cancelled"
    assert transport.closed
    assert "Hello" in "".join(f.get("text", "") for f in sink.frames if f["type"] == "text_delta")


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
