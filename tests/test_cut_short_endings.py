"""A turn that ends before its answer did (exhausted, cancelled, failed) commits the text its
client was shown, exactly as shown, and a follow-up turn in the thread goes on from it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streamrecover.engine.cancel import CancelToken

from .harness import Outcome, run, user, with_config

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
