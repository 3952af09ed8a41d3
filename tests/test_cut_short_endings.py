"""A turn that ends before its answer did (exhausted, cancelled, failed) commits the text its
client was shown, exactly as shown, and a follow-up turn in the thread goes on from it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from streamrecover.engine.agent import run_agent
from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import Checkpoint, InMemoryCheckpointStore
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest
from streamrecover.engine.sink import CollectingSink
from streamrecover.providers.registry import get_adapter
from streamrecover.testing.client import ClientView

from .harness import FAST, Outcome, provider, run, user, with_config

STORY = "Tell me a story about the sea [[words=120]]"
FOLLOW_UP = "And then? [[words=20]]"


def shown_text(out: Outcome) -> str:
    return "".join(f["text"] for f in out.frames("text_delta"))


def assert_committed_as_shown(out: Outcome, status: str, reference: Outcome) -> str:
    """The run ended ``status`` with one assistant message: what the client rebuilt from its
    frames, byte for byte the text it was shown, the start of the uninterrupted answer; its
    drops and the commit came before the run's end. Returns the committed text."""
    assert out.status == status, (out.status, out.result.error)
    ((reconstructed, committed),) = out.view.turns
    assert reconstructed == committed
    assert out.view.blocks == {}  # nothing shown beyond the committed message
    message = out.result.messages[-1]
    assert message["role"] == "assistant"
    assert [b["type"] for b in message["content"]] == ["text"]
    text = message["content"][0]["text"]
    assert text.strip()
    assert text == shown_text(out)
    assert reference.assistant[0]["content"][0]["text"].startswith(text)
    kinds = [f["type"] for f in out.sink.frames]
    assert kinds[-2:] == ["message_committed", "run_status"]
    assert out.sink.frames[-1]["status"] == status
    return text


async def assert_follow_up_works(fake_server: Any, out: Outcome, wire: str, model: str) -> None:
    """The next user message in the thread: the provider takes the cut-short answer in history."""
    thread = [*out.result.messages, user(FOLLOW_UP)]
    after = await run(fake_server, FOLLOW_UP, wire=wire, model=model, messages=thread)
    assert after.status == "completed", after.result.error
    assert after.result.messages[: len(thread)] == thread
    assert after.assistant[-1]["content"][0]["text"].strip()


@pytest.mark.parametrize(("wire", "model"), [("anthropic", "claude-3-7-sonnet"), ("openai", "gpt-4o")])
async def test_an_exhausted_turn_commits_the_text_its_client_was_shown(fake_server, wire, model):
    reference = await run(fake_server, STORY, wire=wire, model=model)
    out = await run(
        fake_server,
        STORY,
        wire=wire,
        model=model,
        faults=["cut:bytes=1500", "cut:events=6", "cut:events=6"],
        config=with_config(max_continuations=2),
    )
    assert_committed_as_shown(out, "exhausted", reference)
    assert out.result.error == {
        "kind": "exhausted",
        "message": "gave up after 2 continuation attempts (sse_transport)",
    }
    await assert_follow_up_works(fake_server, out, wire, model)


async def test_a_turn_cancelled_while_streaming_commits_the_text_its_client_was_shown(fake_server):
    reference = await run(fake_server, STORY)
    cancel = CancelToken()

    async def cancel_soon() -> None:
        await asyncio.sleep(0.3)
        cancel.cancel("user pressed stop")

    task = asyncio.ensure_future(cancel_soon())
    out = await run(fake_server, STORY, faults=["stall:events=20,seconds=5"], cancel=cancel)
    await task
    assert_committed_as_shown(out, "cancelled", reference)
    await assert_follow_up_works(fake_server, out, "anthropic", "claude-3-7-sonnet")


async def test_a_turn_cancelled_during_its_backoff_commits_the_text_its_client_was_shown(fake_server):
    reference = await run(fake_server, STORY)
    cancel = CancelToken()

    async def cancel_soon() -> None:
        await asyncio.sleep(0.5)
        cancel.cancel()

    task = asyncio.ensure_future(cancel_soon())
    config = with_config(backoff_schedule=(5.0,), backoff_scale=1.0)
    out = await run(fake_server, STORY, faults=["cut:bytes=1500"], cancel=cancel, config=config)
    await task
    assert len(out.log) == 1  # the continuation never went out
    assert_committed_as_shown(out, "cancelled", reference)
    await assert_follow_up_works(fake_server, out, "anthropic", "claude-3-7-sonnet")


async def test_a_permanent_error_mid_stream_commits_the_text_its_client_was_shown(fake_server):
    reference = await run(fake_server, STORY)
    out = await run(fake_server, STORY, faults=["error:events=15,type=invalid_request_error"])
    assert len(out.log) == 1  # never continued
    assert_committed_as_shown(out, "failed", reference)
    await assert_follow_up_works(fake_server, out, "anthropic", "claude-3-7-sonnet")


async def test_a_continuation_refused_for_good_commits_the_text_already_kept(fake_server):
    reference = await run(fake_server, STORY)
    out = await run(fake_server, STORY, faults=["cut:bytes=1500", "status:400"])
    assert out.result.error is not None
    assert out.result.error["kind"] == "invalid_request"
    assert_committed_as_shown(out, "failed", reference)


async def test_nothing_is_committed_when_no_text_was_shown(fake_server):
    out = await run(fake_server, STORY, faults=["cut:events=1"] * 3, config=with_config(max_continuations=2))
    assert out.status == "exhausted"
    assert shown_text(out) == ""
    assert out.result.messages[-1]["role"] == "user"
    assert out.frames("message_committed") == []


class WorkerDied(BaseException):
    """Where the test kills the worker: nothing after it runs."""


class StopsThenDiesAtTheCommit(CollectingSink):
    """A client whose user presses stop once text is shown; the worker dies as it commits."""

    def __init__(self, cancel: CancelToken) -> None:
        super().__init__()
        self.cancel = cancel

    async def on_frame(self, frame: Any) -> None:
        await super().on_frame(frame)
        if frame["type"] == "text_delta":
            self.cancel.cancel("user pressed stop")

    async def on_message(self, message: dict[str, Any], position: int) -> None:
        raise WorkerDied("the worker died as it committed the cut-short answer")


def _context(server: Any, scenario: str, run_id: str, store: InMemoryCheckpointStore, sink: Any, cancel: Any) -> Any:
    adapter = get_adapter(provider(server, scenario))
    return RunContext(run_id=run_id, adapter=adapter, config=FAST, sink=sink, checkpoints=store, cancel=cancel)


async def test_a_worker_dying_as_it_commits_a_cancelled_turn_leaves_the_shown_text_to_the_next(fake_server):
    scenario, run_id = uuid.uuid4().hex, uuid.uuid4().hex
    fake_server.set_faults(scenario, ["stall:events=20,seconds=5"])
    store = InMemoryCheckpointStore()
    request = ModelRequest(model="claude-3-7-sonnet", messages=[user(STORY)], max_tokens=4096)
    cancel = CancelToken()
    dying = StopsThenDiesAtTheCommit(cancel)
    with pytest.raises(WorkerDied):
        await run_agent(_context(fake_server, scenario, run_id, store, dying, cancel), request)
    view = ClientView([user(STORY)]).apply_all(dying.frames)
    shown = view.reconstructed()
    assert [b["type"] for b in shown] == ["text"]
    assert shown[0]["text"].strip()  # the client was shown text
    assert await store.get(run_id) is not None  # kept until what the turn ended with is committed

    sink = CollectingSink()
    result = await run_agent(_context(fake_server, scenario, run_id, store, sink, CancelToken()), request, resume=True)
    assert result.status == "cancelled"
    assert result.error == {"kind": "cancel", "message": "user pressed stop"}
    assert len(fake_server.log_for(scenario)) == 1  # neither continued nor asked for again
    assert result.new_messages == [{"role": "assistant", "content": shown}]
    view.apply_all(sink.frames)
    assert view.turns == [(shown, shown)]
    assert await store.get(run_id) is None


async def test_a_run_cancelled_while_no_worker_held_it_commits_the_text_its_checkpoint_kept(fake_server):
    # Its worker died mid-answer and its user pressed stop before another worker claimed it: that
    # one ended the run without the text the client had been shown, its checkpoint left behind.
    scenario, run_id = uuid.uuid4().hex, uuid.uuid4().hex
    store = InMemoryCheckpointStore()
    text = "It was a dark night on the sea, and the"
    await store.put(Checkpoint(run_id=run_id, turn=0, history_len=1, blocks=[{"type": "text", "text": text}], seq=40))
    request = ModelRequest(model="claude-3-7-sonnet", messages=[user(STORY)], max_tokens=4096)
    cancel = CancelToken()
    cancel.cancel("user pressed stop")  # the worker that claims it knows (``runs.execution``)

    sink = CollectingSink()
    result = await run_agent(_context(fake_server, scenario, run_id, store, sink, cancel), request, resume=True)
    assert result.status == "cancelled"
    assert fake_server.log_for(scenario) == []  # nothing asked for
    assert result.new_messages == [{"role": "assistant", "content": [{"type": "text", "text": text}]}]
    view = ClientView([user(STORY)]).apply_all(sink.frames)
    assert view.turns == [([{"type": "text", "text": text}], [{"type": "text", "text": text}])]
    assert await store.get(run_id) is None
