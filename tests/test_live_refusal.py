"""A refusal on the run's WebSocket: a client that connects mid-refusal is told it is one, as a
client that stayed connected was, and the committed answer is the same plain text for both."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from streamrecover import starter
from streamrecover.live.buffer import reader_buffer
from streamrecover.live.state import RunState
from streamrecover.testing.client import ClientView
from streamrecover.testing.fake.model import REFUSAL_TEXT

from .factories import make_user
from .test_live_consumer import TIMEOUT, close, finished, new_run, receive, receive_until, socket

pytestmark = pytest.mark.django_db(transaction=True)

# OpenAI Chat (``delta.refusal``): the fake's answer stalls after a few of the refusal's chunks,
# long enough for a second client to connect while it is in flight.
PROMPT = "Explain something forbidden [[refuse]]"
STALL = "stall:events=4,seconds=2,then=continue"


async def test_a_client_that_connects_mid_refusal_gets_the_flag_in_its_snapshot() -> None:
    owner = await sync_to_async(make_user)()
    run = await new_run(owner, PROMPT, model="gpt-4o", faults=[STALL])
    stayed = await socket(run.pk, owner)
    stayed_view = ClientView()
    stayed_view.apply(await receive(stayed))
    task = asyncio.ensure_future(starter.execute_here(str(run.pk)))
    shown = await receive_until(stayed, lambda f: f["type"] == "text_delta")
    assert all(f.get("refusal") is True for f in shown if f["type"] == "text_delta")
    stayed_view.apply_all(shown)

    # the answer is stalled mid-refusal: a client that connects now (a reload) gets a snapshot
    late = await socket(run.pk, owner)
    snapshot = await receive(late)
    assert snapshot["type"] == "snapshot"
    assert snapshot["status"] == "running"
    ((entry,),) = [snapshot["partial"]]
    arrived = entry["content"]["text"]
    assert arrived
    assert REFUSAL_TEXT.startswith(arrived)
    assert arrived != REFUSAL_TEXT  # mid-refusal, not after it
    assert entry == {"block": 0, "content": {"type": "text", "text": arrived, "refusal": True}}
    late_view = ClientView().apply_all([snapshot])
    assert late_view.blocks[0].refusal is True

    result = await asyncio.wait_for(task, TIMEOUT + 5)
    assert result is not None
    assert result.status == "completed", result.error
    for ws, view in ((stayed, stayed_view), (late, late_view)):
        view.apply_all(await receive_until(ws, finished))
        assert view.status == "completed"
        assert view.messages == result.messages
        await close(ws)
    # the committed answer is history as the provider takes it back: plain text, for every client
    assert result.messages[-1]["content"] == [{"type": "text", "text": REFUSAL_TEXT}]
    ((rebuilt, committed),) = late_view.turns
    assert rebuilt == committed
    await reader_buffer().discard(str(run.pk))


def test_the_replay_buffers_stored_state_keeps_a_refusal_and_an_older_one_reads_as_text() -> None:
    """A snapshot built on another server process reads the run's state from the buffer's JSON."""
    state = RunState()
    state.apply({"type": "text_delta", "run_id": "r", "seq": 1, "block": 0, "text": "I'm sorry", "refusal": True})
    state.apply({"type": "text_delta", "run_id": "r", "seq": 2, "block": 1, "text": "Rivers"})
    read = RunState.from_json(state.to_json())
    assert read.partial() == [
        {"block": 0, "content": {"type": "text", "text": "I'm sorry", "refusal": True}},
        {"block": 1, "content": {"type": "text", "text": "Rivers"}},
    ]
    older = '{"seq": 1, "blocks": [[0, {"kind": "text", "text": "I\'m sorry"}]], "commits": []}'
    assert RunState.from_json(older).partial() == [{"block": 0, "content": {"type": "text", "text": "I'm sorry"}}]
