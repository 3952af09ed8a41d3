"""A turn Anthropic pauses (``pause_turn``, a long server-tool turn) goes on in the agent loop:
the answer so far is sent back as it is, and the turn's answer is one assistant message, the
same as unpaused. Real HTTP against the fake provider, which pauses a web search answer after
each search call (``[[pause]]``) and refuses a server tool call left without its result."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import InMemoryCheckpointStore
from streamrecover.engine.sink import AttemptOutcome, AttemptRecord, CollectingSink

from .harness import WorkerDied, assert_invariants, run, user, with_config

PROMPT = "What happened at sea this week?"
WEB_SEARCH = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]
SEARCHES = 2


def _search(*directives: str) -> dict[str, Any]:
    """The request's web_search server tool, and the fake steered from the system prompt (the
    user's words, which the answer is generated from, stay the same)."""
    return {"tools": WEB_SEARCH, "system": " ".join(directives)}


UNPAUSED = _search(f"[[search={SEARCHES}]]")
PAUSED = _search(f"[[search={SEARCHES}]]", "[[pause]]")


def _types(message: dict[str, Any]) -> list[str]:
    return [block["type"] for block in message["content"]]


async def test_a_paused_turn_goes_on_and_the_run_ends_with_the_whole_answer(fake_server):
    reference = await run(fake_server, PROMPT, extra=UNPAUSED)
    assert len(reference.log) == 1
    out = await run(fake_server, PROMPT, extra=PAUSED)
    # what the client was shown, what is stored and the unpaused answer are one message
    assert_invariants(out, reference)
    (answer,) = out.assistant
    assert _types(answer) == ["text", *["server_tool_use", "web_search_tool_result"] * SEARCHES, "text"]
    # one request per pause, each sending the answer so far back as it is
    assert [e.understood_as for e in out.log] == ["fresh", "paused_turn", "paused_turn"]
    assert [e.prefix_matched for e in out.log[1:]] == [True, True]
    attempts = out.sink.attempts
    assert [a.stop_reason for a in attempts] == ["pause_turn", "pause_turn", "end_turn"]
    assert [a.strategy for a in attempts] == [None, "as_is", "as_is"]
    assert {a.turn for a in attempts} == {0}  # one turn, however often paused
    assert out.result.turns == 3  # each request counts against max_turns
    assert out.events("llm_stream_continuation_started") == []


@pytest.mark.parametrize("fault", ["cut:from_end=1", "eof:from_end=1"])
async def test_a_lost_terminator_after_a_pause_is_not_a_break_and_the_turn_goes_on(fake_server, fault):
    """The paused answer had ended (its stop reason arrived): it is not continued as a broken
    stream, it is sent back for the turn to go on."""
    reference = await run(fake_server, PROMPT, extra=UNPAUSED)
    out = await run(fake_server, PROMPT, extra=PAUSED, faults=[fault])
    assert_invariants(out, reference)
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["answer_complete"] is True
    assert out.events("llm_stream_continuation_started") == []
    assert [e.understood_as for e in out.log] == ["fresh", "paused_turn", "paused_turn"]


@pytest.mark.parametrize(
    ("faults", "understood"),
    [
        (["cut:events=6"], ["fresh", "prefill", "paused_turn", "paused_turn"]),  # in the first text
        (["ok", "ok", "cut:from_end=6"], ["fresh", "paused_turn", "paused_turn", "prefill"]),  # in the last
    ],
)
async def test_a_break_in_a_paused_turn_is_recovered_and_the_answer_is_the_unpaused_one(
    fake_server, faults, understood
):
    reference = await run(fake_server, PROMPT, extra=UNPAUSED)
    out = await run(fake_server, PROMPT, extra=PAUSED, faults=faults)
    assert_invariants(out, reference)
    assert [e.understood_as for e in out.log] == understood
    assert all(e.prefix_matched for e in out.log[1:])
    assert len(out.events("llm_stream_continuation_started")) == 1


NO_PREFILL = "claude-sonnet-4-6"  # refuses a prefill: a break is continued with a continue message


@pytest.mark.parametrize(
    ("faults", "understood"),
    [
        (["cut:events=6"], ["fresh", "continue_message", "paused_turn", "paused_turn"]),  # in the first text
        (["ok", "ok", "cut:from_end=6"], ["fresh", "paused_turn", "paused_turn", "continue_message"]),  # in the last
    ],
)
async def test_a_break_in_a_paused_turn_on_a_model_without_prefill_is_recovered_with_a_continue_message(
    fake_server, faults, understood
):
    """The answer so far (its searches too) is sent back with a continue message, and the model
    goes on after it: the answer is the unpaused one."""
    reference = await run(fake_server, PROMPT, model=NO_PREFILL, extra=UNPAUSED)
    out = await run(fake_server, PROMPT, model=NO_PREFILL, extra=PAUSED, faults=faults)
    assert_invariants(out, reference)
    assert [e.understood_as for e in out.log] == understood
    assert all(e.prefix_matched for e in out.log[1:])
    assert len(out.events("llm_stream_continuation_started")) == 1


async def test_the_stored_answer_of_a_paused_turn_is_a_valid_history_for_the_next_request(fake_server):
    """The fake refuses a server tool call without its result in any but the last message, as
    the API does: the thread goes on from the stored answer without a 400."""
    out = await run(fake_server, PROMPT, extra=PAUSED)
    follow_up = await run(
        fake_server, messages=[*out.result.messages, user("And what else? [[words=12]]")], extra=_search()
    )
    assert follow_up.status == "completed", follow_up.result.error
    assert [e.status for e in follow_up.log] == [200]
    assert _types(follow_up.assistant[-1]) == ["text"]


async def test_a_turn_that_pauses_forever_ends_at_max_turns_with_what_history_takes(fake_server):
    out = await run(fake_server, PROMPT, extra=_search("[[search=40]]", "[[pause]]"), config=with_config(max_turns=3))
    assert out.status == "failed"
    error = out.result.error
    assert error is not None
    assert error["kind"] == "max_turns"
    assert error["message"] == "stopped after 3 assistant turns: the provider paused the last one (pause_turn)"
    assert len(out.log) == 3  # asked no more than max_turns times
    # The client saw the searches stream; history takes no call without its result (every
    # provider refuses one), so it keeps the text and the client is told to drop the rest.
    (answer,) = out.assistant
    assert _types(answer) == ["text"]
    ((reconstructed, committed),) = out.view.turns
    assert reconstructed == committed == answer["content"]
    follow_up = await run(fake_server, messages=[*out.result.messages, user("Go on. [[words=12]]")], extra=_search())
    assert follow_up.status == "completed", follow_up.result.error


class CancelsAtThePause(CollectingSink):
    """The user cancels as the paused response ends, before it is sent back."""

    def __init__(self, cancel: CancelToken) -> None:
        super().__init__()
        self.cancel = cancel

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        await super().on_attempt(attempt)
        if attempt.stop_reason == "pause_turn":
            self.cancel.cancel("enough")


async def test_a_cancel_at_a_pause_ends_the_turn_with_what_history_takes(fake_server):
    cancel = CancelToken()
    out = await run(fake_server, PROMPT, extra=PAUSED, cancel=cancel, sink=CancelsAtThePause(cancel))
    assert out.status == "cancelled"
    assert len(out.log) == 1  # not sent back
    (answer,) = out.assistant
    assert _types(answer) == ["text"]
    ((reconstructed, committed),) = out.view.turns
    assert reconstructed == committed == answer["content"]


class DiesSendingThePauseBack(CollectingSink):
    """The worker dies as the first request that sends a paused answer back starts."""

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        await super().on_attempt(attempt)
        if attempt.strategy == "as_is" and attempt.outcome == AttemptOutcome.PENDING:
            raise WorkerDied("killed as the paused answer was sent back")


async def test_a_worker_dying_after_a_pause_leaves_the_turn_to_the_next_one_which_goes_on(fake_server):
    """The paused answer is in the turn's checkpoint until the turn's answer is committed: the
    next worker goes on from it, and nobody pays for it twice."""
    reference = await run(fake_server, PROMPT, extra=UNPAUSED)
    store = InMemoryCheckpointStore()
    run_id, scenario = uuid.uuid4().hex, uuid.uuid4().hex
    with pytest.raises(WorkerDied):
        await run(
            fake_server, PROMPT, extra=PAUSED, checkpoints=store, run_id=run_id, scenario=scenario,
            sink=DiesSendingThePauseBack(),
        )  # fmt: skip
    first = len(fake_server.log_for(scenario))
    out = await run(fake_server, PROMPT, extra=PAUSED, checkpoints=store, run_id=run_id, scenario=scenario, resume=True)
    assert out.status == "completed", out.result.error
    assert out.result.messages == reference.result.messages
    (answer,) = out.assistant
    ((reconstructed, committed),) = out.view.turns
    assert reconstructed == committed == answer["content"]
    # the paused response was asked for once, by the worker that died
    assert [e.understood_as for e in out.log[first:]] == ["paused_turn", "paused_turn"]
    assert await store.get(run_id) is None


class DiesAtAPause(CollectingSink):
    """The worker dies as it is about to send the paused answer back for the ``nth`` time."""

    def __init__(self, nth: int) -> None:
        super().__init__()
        self.nth = nth
        self.sent_back = 0

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        await super().on_attempt(attempt)
        if attempt.strategy == "as_is" and attempt.outcome == AttemptOutcome.PENDING:
            self.sent_back += 1
            if self.sent_back == self.nth:
                raise WorkerDied(f"killed at pause {self.nth}")


async def test_a_turn_that_pauses_forever_across_worker_deaths_ends_at_max_turns_in_all(fake_server):
    """The requests a paused turn made before its worker died count after the resume: the
    turn's checkpoint keeps how often it was paused. Two deaths ask no more than one worker."""
    max_turns = 6
    store = InMemoryCheckpointStore()
    run_id, scenario = uuid.uuid4().hex, uuid.uuid4().hex
    pausing = _search("[[search=40]]", "[[pause]]")
    config = with_config(max_turns=max_turns)
    same_run: dict[str, Any] = {"checkpoints": store, "run_id": run_id, "scenario": scenario, "config": config}
    with pytest.raises(WorkerDied):
        await run(fake_server, PROMPT, extra=pausing, sink=DiesAtAPause(3), **same_run)
    assert len(fake_server.log_for(scenario)) == 3  # the third pause is not sent back
    with pytest.raises(WorkerDied):
        await run(fake_server, PROMPT, extra=pausing, sink=DiesAtAPause(2), resume=True, **same_run)
    assert len(fake_server.log_for(scenario)) == 4  # the resume asks nothing: the pause is in the checkpoint
    out = await run(fake_server, PROMPT, extra=pausing, resume=True, **same_run)
    assert out.status == "failed"
    assert out.result.error is not None
    assert out.result.error == {
        "kind": "max_turns",
        "message": f"stopped after {max_turns} assistant turns: the provider paused the last one (pause_turn)",
    }
    assert len(fake_server.log_for(scenario)) == max_turns  # asked max_turns times in all
    assert out.result.turns == max_turns
    (answer,) = out.assistant
    assert _types(answer) == ["text"]
