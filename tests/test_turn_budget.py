"""The turn's max_tokens budget at its edges: less left than the provider takes in a request,
a native resume that falls back to a continuation with the budget spent, a whole restart, a
thinking turn whose prefix the provider counts, and Gemini's thinking that is billed but not
shown. Real HTTP against the fake provider."""

from __future__ import annotations

import json
import uuid

import pytest

from streamrecover.engine.agent import run_agent
from streamrecover.engine.checkpoint import Checkpoint, InMemoryCheckpointStore, UnreadableCheckpoint
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest
from streamrecover.engine.sink import AttemptOutcome, CollectingSink
from streamrecover.providers.registry import get_adapter

from .harness import FAST, DiesAt, DiesAtFrame, WorkerDied, events_until, provider, run, user, with_config

STORY = "A story [[words=60]]"
LONG = "A story [[words=3000]]"
THINKING_MODEL = "claude-sonnet-4-5"


def _asked(out, field: str) -> list[int | None]:
    return _asked_of(out.sink, field)


def _asked_of(sink: CollectingSink, field: str) -> list[int | None]:
    return [a.request["json"].get(field) for a in sink.attempts]


# Cut where 13 to 19 tokens of 40 arrived: 21 to 27 left in the bound, and the minimum a
# Responses request takes is 16; a continuation asking for less was a permanent 400 and the run
# failed. Now a continuation asks for 16 or more, or the turn ends at its limit.
@pytest.mark.parametrize("cut", [13, 16, 19])
async def test_responses_with_less_left_than_it_takes_ends_as_max_tokens(fake_server, cut):
    out = await run(
        fake_server, STORY, wire="openai-responses", model="gpt-4o", max_tokens=40, faults=[f"cut:events={cut}"]
    )
    assert out.status == "completed", out.result.error
    assert all(m is not None and m >= 16 for m in _asked(out, "max_output_tokens"))
    assert sum(e.billed_output_tokens for e in out.log) <= 40


async def test_a_native_resume_that_falls_back_with_the_budget_spent_ends_as_max_tokens(fake_server):
    # the response is gone (404) when the turn has used its budget: no continuation for 1 token
    out = await run(
        fake_server,
        STORY,
        wire="openai-responses",
        model="gpt-4o",
        max_tokens=40,
        faults=["cut:events=22", "status:404"],
        provider_kw={"native_resume": True},
    )
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["turn_output_tokens"] >= 40
    assert out.status == "completed", out.result.error
    assert [a.kind for a in out.sink.attempts] == ["initial", "native_resume"]  # no continuation
    assert out.result.new_messages[-1]["content"]  # what arrived is the answer, at its limit
    assert sum(e.billed_output_tokens for e in out.log) <= 40


async def test_a_whole_restart_asks_for_what_is_left_of_the_budget(fake_server):
    # cut inside the first thinking block: the answer starts over, and what it dropped was billed
    out = await run(
        fake_server, LONG, model=THINKING_MODEL, thinking_budget=1024, max_tokens=1500, faults=["cut:events=12"]
    )
    assert out.status == "completed", out.result.error
    assert [a.kind for a in out.sink.attempts] == ["initial", "restart"]
    restart = out.sink.attempts[1].request["json"]
    assert restart["max_tokens"] < 1500
    assert restart["thinking"]["budget_tokens"] < restart["max_tokens"]
    assert sum(e.billed_output_tokens for e in out.log) <= 1500


async def test_a_whole_restart_leaves_out_thinking_that_no_longer_fits(fake_server):
    out = await run(
        fake_server, LONG, model=THINKING_MODEL, thinking_budget=1024, max_tokens=1030, faults=["cut:events=12"]
    )
    assert out.status == "completed", out.result.error
    assert [a.kind for a in out.sink.attempts] == ["initial", "restart"]
    assert "thinking" not in out.sink.attempts[1].request["json"]
    assert sum(e.billed_output_tokens for e in out.log) <= 1030


async def test_a_thinking_continuation_gets_the_providers_count_of_what_is_left(fake_server):
    # The fake's count_tokens refused every request with thinking (it checked a max_tokens the
    # endpoint does not take), so the turn fell back to the byte bound and asked for far less.
    out = await run(
        fake_server, LONG, model=THINKING_MODEL, thinking_budget=1024, max_tokens=1500, faults=["cut:events=200"]
    )
    assert out.status == "completed", out.result.error
    (interrupted,) = out.events("llm_stream_interrupted")
    bound_left = 1500 - interrupted["turn_output_tokens"]
    assert _asked(out, "max_tokens")[1] > bound_left  # the count lowered the bound
    billed = sum(e.billed_output_tokens for e in out.log)
    assert 1200 <= billed <= 1500


# OpenAI's o-series and gpt-5 take only max_completion_tokens. Named in extra, it was re-sent at
# its full value on every continuation, and the turn was billed past its max_tokens.
@pytest.mark.parametrize(
    ("extra", "provider_kw"),
    [({"max_completion_tokens": 40}, {}), ({}, {"max_tokens_field": "max_completion_tokens"})],
    ids=["named-in-extra", "provider-setting"],
)
async def test_max_completion_tokens_asks_for_what_is_left(fake_server, extra, provider_kw):
    out = await run(
        fake_server,
        STORY,
        wire="openai",
        model="o3",
        max_tokens=40,
        extra=extra,
        provider_kw=provider_kw,
        faults=["cut:events=10"],
    )
    assert out.status == "completed", out.result.error
    asked = _asked(out, "max_completion_tokens")
    assert asked[0] == 40
    assert 0 < asked[1] < 40
    assert _asked(out, "max_tokens") == [None, None]
    assert sum(e.billed_output_tokens for e in out.log) <= 40


async def test_the_fake_refuses_max_tokens_from_a_model_that_takes_only_max_completion_tokens(fake_server):
    out = await run(fake_server, STORY, wire="openai", model="gpt-5-mini", max_tokens=40)
    assert out.status == "failed"
    assert out.result.error is not None
    assert "Unsupported parameter: 'max_tokens' is not supported with this model." in out.result.error["message"]


async def test_no_failover_to_a_provider_that_cannot_be_asked_for_what_is_left(fake_server):
    # Chat takes a budget of 1; its fallback (Responses) takes no less than 16. With fewer left
    # when Chat gives up, switching would ask Responses for less than it takes: the turn ends
    # exhausted with what it kept instead of failing over (it raised, and the run crashed).
    out = await run(
        fake_server,
        STORY,
        wire="openai",
        model="gpt-4o",
        max_tokens=40,
        config=with_config(max_continuations=1),
        faults=["cut:events=10", "cut:events=4"],  # 30 of 40 used, 10 left
        failover=("openai-responses", "gpt-4o"),
    )
    assert out.status == "exhausted", out.result.error
    assert not out.events("llm_stream_failover")
    assert [a.kind for a in out.sink.attempts] == ["initial", "continuation"]
    assert out.result.new_messages[-1]["content"]  # what was shown is kept


@pytest.mark.parametrize(
    ("restart_faults", "dies_as"),
    [([], AttemptOutcome.PENDING), (["cut:events=5"], AttemptOutcome.INTERRUPTED)],
    ids=["the_restart_starts", "the_restart_breaks"],
)
async def test_a_resumed_turn_still_counts_the_answer_it_dropped_against_max_tokens(
    fake_server, restart_faults, dies_as
):
    # The first answer is cut inside its thinking and dropped to start over (billed all the
    # same); the worker dies as the restart starts, or as it breaks too before keeping anything.
    # The next worker resumed from the checkpoint without the dropped answer's cost, asked for the
    # whole max_tokens again, and the turn was billed past it.
    scenario, run_id = uuid.uuid4().hex, uuid.uuid4().hex
    fake_server.set_faults(scenario, ["cut:events=12", *restart_faults])
    store = InMemoryCheckpointStore()
    request = ModelRequest(model=THINKING_MODEL, messages=[user(LONG)], max_tokens=1500, thinking_budget=1024)

    def context(sink: CollectingSink) -> RunContext:
        adapter = get_adapter(provider(fake_server, scenario))
        return RunContext(run_id=run_id, adapter=adapter, config=FAST, sink=sink, checkpoints=store)

    dying = DiesAt(1, dies_as)
    with pytest.raises(WorkerDied):
        await run_agent(context(dying), request)
    assert [a.kind for a in dying.attempts][-1] == "restart"
    assert await store.get(run_id) is not None

    sink = CollectingSink()
    result = await run_agent(context(sink), request, resume=True)
    assert result.status == "completed", result.error
    assert [a.kind for a in sink.attempts] == ["restart"]
    assert _asked_of(sink, "max_tokens")[0] < 1500
    assert sum(e.billed_output_tokens for e in fake_server.log_for(scenario)) <= 1500


def test_a_checkpoint_from_before_reads_as_having_dropped_nothing():
    older = {"run_id": "r", "turn": 0, "history_len": 1, "blocks": [{"type": "text", "text": "It"}], "seq": 3}
    checkpoint = Checkpoint.from_json(json.dumps(older))
    assert (checkpoint.dropped_output, checkpoint.ending, checkpoint.output_used, checkpoint.received_bytes) == (
        0,
        None,
        None,
        0,
    )
    with pytest.raises(UnreadableCheckpoint):
        Checkpoint.from_dict({**older, "dropped_output": "12"})
    with pytest.raises(UnreadableCheckpoint):
        Checkpoint.from_dict({**older, "output_used": "12"})


async def test_a_resumed_turn_counts_the_thinking_its_checkpoint_did_not_hold_against_max_tokens(fake_server):
    # The answer breaks inside its thinking and the worker dies there: the checkpoint written at
    # the break (before the attempt's output is counted, as one written while it streams) held
    # nothing, unfinished thinking being never kept, and said nothing of the thinking that was
    # billed. The next worker started the answer over asking for the whole max_tokens again, and
    # the turn was billed past it.
    scenario, run_id = uuid.uuid4().hex, uuid.uuid4().hex
    fake_server.set_faults(scenario, ["cut:events=12"])
    store = InMemoryCheckpointStore()
    request = ModelRequest(model=THINKING_MODEL, messages=[user(LONG)], max_tokens=1500, thinking_budget=1024)

    def context(sink: CollectingSink) -> RunContext:
        adapter = get_adapter(provider(fake_server, scenario))
        return RunContext(run_id=run_id, adapter=adapter, config=FAST, sink=sink, checkpoints=store)

    with pytest.raises(WorkerDied):
        await run_agent(context(DiesAt(0, AttemptOutcome.INTERRUPTED)), request)
    checkpoint = await store.get(run_id)
    assert checkpoint is not None
    assert checkpoint.blocks == []  # the thinking it had was unfinished
    (first,) = fake_server.log_for(scenario)
    assert first.billed_output_tokens > 0

    sink = CollectingSink()
    result = await run_agent(context(sink), request, resume=True)
    assert result.status == "completed", result.error
    assert [a.kind for a in sink.attempts] == ["restart"]
    assert _asked_of(sink, "max_tokens")[0] <= 1500 - first.billed_output_tokens
    assert sum(e.billed_output_tokens for e in fake_server.log_for(scenario)) <= 1500


async def test_a_resumed_turn_asks_for_no_more_than_an_unbroken_worker_would(fake_server):
    # Kept blocks (signed thinking, text), and a continuation's own thinking, which is dropped
    # (it came after the kept text): the worker dies as that continuation breaks too. The
    # checkpoint held the kept blocks only, and the next worker counted only them, forgetting the
    # dropped thinking that was billed: it asked for more of max_tokens than the worker that did
    # not die went on to ask for.
    request = ModelRequest(model=THINKING_MODEL, messages=[user(LONG)], max_tokens=4000, thinking_budget=1024)
    thinking_end = await events_until(
        fake_server, await run(fake_server, LONG, model=THINKING_MODEL, thinking_budget=1024), "thinking"
    )
    faults = [f"cut:events={thinking_end + 8}"] * 2
    unbroken = await run(fake_server, LONG, model=THINKING_MODEL, thinking_budget=1024, max_tokens=4000, faults=faults)
    assert [a.kind for a in unbroken.sink.attempts] == ["initial", "continuation", "continuation"]
    assert [e.fields["reason"] for e in unbroken.sink.events if e.name == "discarded_thinking"] == [
        "thinking_after_text"
    ] * 2

    scenario, run_id = uuid.uuid4().hex, uuid.uuid4().hex
    fake_server.set_faults(scenario, faults)
    store = InMemoryCheckpointStore()

    def context(sink: CollectingSink) -> RunContext:
        adapter = get_adapter(provider(fake_server, scenario))
        return RunContext(run_id=run_id, adapter=adapter, config=FAST, sink=sink, checkpoints=store)

    with pytest.raises(WorkerDied):
        await run_agent(context(DiesAt(1, AttemptOutcome.INTERRUPTED)), request)
    sink = CollectingSink()
    result = await run_agent(context(sink), request, resume=True)
    assert result.status == "completed", result.error
    assert [a.kind for a in sink.attempts] == ["resume"]
    assert _asked_of(sink, "max_tokens")[0] <= _asked(unbroken, "max_tokens")[2]


async def test_a_resumed_answer_is_not_counted_twice(fake_server):
    # The worker dies mid-answer, its checkpoint holding most of what it had received: the next
    # worker counts that as the worker that wrote it would (the provider's count of the kept text),
    # not that count and the bytes' bound of the same text, which would end the answer short.
    prompt = "A story [[words=300]]"
    reference = await run(fake_server, prompt, max_tokens=1000)
    assert reference.result.messages[-1]["content"]
    scenario, run_id = uuid.uuid4().hex, uuid.uuid4().hex
    store = InMemoryCheckpointStore()
    request = ModelRequest(model="claude-3-7-sonnet", messages=[user(prompt)], max_tokens=1000)

    def context(sink: CollectingSink) -> RunContext:
        adapter = get_adapter(provider(fake_server, scenario))
        config = with_config(checkpoint_every_deltas=8)
        return RunContext(run_id=run_id, adapter=adapter, config=config, sink=sink, checkpoints=store)

    with pytest.raises(WorkerDied):
        await run_agent(context(DiesAtFrame("text_delta", 200)), request)
    checkpoint = await store.get(run_id)
    assert checkpoint is not None
    assert checkpoint.blocks  # most of the answer

    result = await run_agent(context(CollectingSink()), request, resume=True)
    assert result.status == "completed", result.error
    assert result.new_messages == reference.result.new_messages


def _text(outcome) -> str:
    return "".join(b["text"] for b in outcome.assistant[0]["content"] if b["type"] == "text")


# Gemini 3 thinks whether or not the request asks to see it, and bills that thinking as output,
# within maxOutputTokens: a stream without thought parts still reports it in every chunk's
# thoughtsTokenCount. A break mid-answer must count it against the turn's max_tokens, with the
# text, and the continuation (which thinks again) ask for what is left of it.
@pytest.mark.parametrize("cut", ["cut:events=4", "cut:events=6,mid"])
@pytest.mark.parametrize("max_tokens", [4096, 80], ids=["roomy", "at-the-limit"])
async def test_a_gemini_break_counts_the_thinking_it_did_not_show_against_max_tokens(fake_server, cut, max_tokens):
    kw = {"wire": "gemini", "model": "gemini-3-pro-preview", "max_tokens": max_tokens}
    reference = await run(fake_server, STORY, **kw)
    out = await run(fake_server, STORY, faults=[cut], **kw)
    assert out.status == "completed", out.result.error
    assert [a.kind for a in out.sink.attempts] == ["initial", "continuation"]
    assert not any(b["type"] == "thinking" for b in out.assistant[0]["content"])  # none was shown
    broken, continued = out.log
    first = out.sink.attempts[0].usage
    assert first.reasoning_tokens  # the thinking the stream reported but did not show
    assert first.output_tokens == broken.billed_output_tokens  # it and the text: all that was billed
    assert all(a.usage.reasoning_tokens for a in out.sink.attempts)  # each attempt thought, and records it
    asked = [a.request["json"]["generationConfig"]["maxOutputTokens"] for a in out.sink.attempts]
    assert asked == [max_tokens, max_tokens - broken.billed_output_tokens]
    assert broken.billed_output_tokens + continued.billed_output_tokens <= max_tokens
    if max_tokens == 4096:
        assert _text(out) == _text(reference)
    else:  # the continuation's own thinking takes its share: the turn ends at its limit, a bit shorter
        assert out.sink.attempts[-1].stop_reason == "max_tokens"
        assert broken.billed_output_tokens + continued.billed_output_tokens == max_tokens
        assert _text(reference).startswith(_text(out))


# 2.5 Pro takes a thinkingBudget from 128 to 32768 and thinks at most about that much. A turn cut
# in its text goes on with a continuation the model accepts, each response thinking within the
# budget, and the thinking of both (billed, shown) and their text within the turn's max_tokens.
@pytest.mark.parametrize(
    ("max_tokens", "cut"), [(1024, "cut:events=60"), (300, "cut:events=55")], ids=["roomy", "little-left"]
)
async def test_a_broken_2_5_pro_turn_thinks_within_its_budget_and_max_tokens(fake_server, max_tokens, cut):
    kw = {"wire": "gemini", "model": "gemini-2.5-pro", "thinking_budget": 200, "max_tokens": max_tokens}
    prompt = "A long story [[words=200]] [[think=300]]"  # it would think longer than its budget
    reference = await run(fake_server, prompt, **kw)
    out = await run(fake_server, prompt, faults=[cut], **kw)
    assert out.status == "completed", out.result.error
    assert [a.kind for a in out.sink.attempts] == ["initial", "continuation"]
    assert [e.status for e in out.log] == [200, 200]  # no request the model refuses
    thoughts = [a.usage.reasoning_tokens for a in out.sink.attempts]
    assert thoughts[0] == 200  # it spent its budget, and no more
    assert all(t <= 200 for t in thoughts)
    assert sum(e.billed_output_tokens for e in out.log) <= max_tokens
    reference_text = _text(reference)
    if max_tokens == 1024:
        assert _text(out) == reference_text
        assert sum(e.billed_output_tokens for e in reference.log) <= max_tokens
    else:  # the continuation thinks again: the turn ends at its limit, a bit shorter
        assert out.sink.attempts[-1].stop_reason == "max_tokens"
        assert reference_text.startswith(_text(out))


async def test_a_budget_of_0_on_2_5_pro_fails_the_run_with_the_apis_400(fake_server):
    """2.5 Pro cannot turn thinking off: the run fails at once with the API's message, as it
    would against Google (a 400 is permanent: not retried, not continued)."""
    out = await run(fake_server, STORY, wire="gemini", model="gemini-2.5-pro", thinking_budget=0)
    assert out.status == "failed"
    assert [e.status for e in out.log] == [400]
    assert "only works in thinking mode" in str(out.result.error)


# A continuation used to lower a thinking budget only down to Anthropic's 1024 and, with less
# left than that, send no thinkingConfig: a Gemini turn that showed its thoughts stopped showing
# them (no includeThoughts) and the model thought its default amount. The budget now follows the
# model's own floor (Gemini docs: 2.5 Pro 128, 2.5 Flash 1, 2.5 Flash-Lite 512; unknown for
# Gemini 3, whose budget is then kept): lowered to one below what is left where the model takes
# that, else that floor, with maxOutputTokens capping thinking and answer together.
@pytest.mark.parametrize(
    ("model", "floor", "budget", "max_tokens", "cut", "kind"),
    [
        ("gemini-2.5-pro", 128, 200, 400, "cut:events=60", "continuation"),  # lowered to left - 1
        ("gemini-2.5-pro", 128, 200, 300, "cut:events=55", "continuation"),  # left - 1 < 128
        ("gemini-2.5-pro", 128, 200, 300, "cut:events=50", "restart"),  # cut while thinking
        ("gemini-2.5-flash", 1, 200, 300, "cut:events=55", "continuation"),
        ("gemini-2.5-flash-lite", 512, 600, 700, "cut:events=160", "continuation"),
        ("gemini-3-pro-preview", None, 200, 300, "cut:events=55", "continuation"),
    ],
    ids=["pro-lowered", "pro-at-its-minimum", "pro-restart", "flash", "flash-lite", "gemini-3"],
)
async def test_a_gemini_continuation_with_little_left_keeps_showing_its_thoughts(
    fake_server, model, floor, budget, max_tokens, cut, kind
):
    kw = {"wire": "gemini", "model": model, "thinking_budget": budget, "max_tokens": max_tokens}
    prompt = "A long story [[words=200]] [[think=800]]"
    reference = await run(fake_server, prompt, **kw)
    out = await run(fake_server, prompt, faults=[cut], **kw)
    assert out.status == "completed", out.result.error
    assert [a.kind for a in out.sink.attempts] == ["initial", kind]
    assert [e.status for e in out.log] == [200, 200]  # a budget the model takes
    second = out.sink.attempts[1].request["json"]["generationConfig"]
    left = second["maxOutputTokens"]
    assert left < budget  # little left: the budget had to change
    config = second.get("thinkingConfig")
    assert config is not None  # thinking goes on within a budget, not the model's default amount
    assert config.get("includeThoughts") is True  # as the turn's first request asked
    expected = budget if floor is None else max(floor, left - 1)
    assert config["thinkingBudget"] == expected
    assert 0 < out.sink.attempts[1].usage.reasoning_tokens <= config["thinkingBudget"]
    # the client is shown the second response's thoughts as they stream, as the first one's
    frames = out.sink.frames
    recovered = next(i for i, f in enumerate(frames) if f["type"] == "recovery")
    assert "".join(f["thinking"] for f in frames[recovered:] if f["type"] == "thinking_delta").strip()
    assert sum(e.billed_output_tokens for e in out.log) <= max_tokens
    assert out.sink.attempts[-1].stop_reason == "max_tokens"  # it ends at its limit, not late
    assert _text(reference).startswith(_text(out))
