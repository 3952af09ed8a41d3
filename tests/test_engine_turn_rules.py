"""The turn's rules where the real providers are stricter than a kind fake: thinking on
every response, a prefill refused once, an answer that had ended, the turn's max_tokens
budget, a refusal in progress, and never an empty assistant message. Real HTTP against
the fake provider, like tests/test_engine_recovery.py."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from streamrecover.engine.continuation import forget_prefill_refusals
from streamrecover.engine.sse import SSEDecoder
from streamrecover.testing.tools import demo_registry

from .harness import assert_invariants, events_until, run, with_config

REFUSAL_TEXT = "I'm sorry, but I can't help with that request."  # what the fake refuses with
STORY = "Tell me a story about the sea [[words=120]]"
WEATHER = "What is the weather in Paris? [[tool=get_weather]]"
NO_PREFILL = "claude-opus-4-6"  # the fake refuses a prefill from this model with a 400, as the real API does
FORCE_PREFILL = {"strategy_overrides": {"*": "prefill"}}


def _raw_events(reference) -> list[dict]:
    """The SSE events (parsed JSON data, [DONE] as None) the fake sends for the reference request."""
    import json

    request = reference.sink.attempts[0].request
    headers = {k: v for k, v in request["headers"].items() if v != "[redacted]"}
    headers.update({"x-api-key": "k", "authorization": "Bearer k", "x-fake-scenario": uuid.uuid4().hex})
    raw = httpx.post(request["url"], json=request["json"], headers=headers).content
    decoder = SSEDecoder()
    return [None if e.data == "[DONE]" else json.loads(e.data) for e in decoder.feed(raw) + decoder.close()]


# ---- a prefill refused once is remembered --------------------------------------------------


async def test_a_prefill_refused_once_is_not_sent_again_in_the_same_turn(fake_server):
    reference = await run(fake_server, STORY, model=NO_PREFILL)
    out = await run(
        fake_server,
        STORY,
        model=NO_PREFILL,
        faults=["cut:bytes=1500", "ok", "cut:bytes=1500", "ok"],
        provider_kw=FORCE_PREFILL,
    )
    assert_invariants(out, reference)
    assert [e.status for e in out.log] == [200, 400, 200, 200]
    assert [e.understood_as for e in out.log[2:]] == ["continue_message", "continue_message"]
    assert [e["strategy"] for e in out.events("llm_stream_continuation_started")] == ["prefill", "continue_message"]


async def test_a_prefill_refusal_is_remembered_for_the_model_in_the_process(fake_server):
    reference = await run(fake_server, STORY, model=NO_PREFILL)
    first = await run(fake_server, STORY, model=NO_PREFILL, faults=["cut:bytes=1500"], provider_kw=FORCE_PREFILL)
    assert [e.status for e in first.log] == [200, 400, 200]
    second = await run(fake_server, STORY, model=NO_PREFILL, faults=["cut:bytes=1500"], provider_kw=FORCE_PREFILL)
    assert_invariants(second, reference)
    assert [e.status for e in second.log] == [200, 200]  # no second refusal
    assert second.log[1].understood_as == "continue_message"
    # another model of the same provider still gets its prefill
    other = await run(fake_server, STORY, faults=["cut:bytes=1500"], provider_kw=FORCE_PREFILL)
    assert [e.understood_as for e in other.log] == ["fresh", "prefill"]
    forget_prefill_refusals()
    again = await run(fake_server, STORY, model=NO_PREFILL, faults=["cut:bytes=1500"], provider_kw=FORCE_PREFILL)
    assert [e.status for e in again.log] == [200, 400, 200]


# ---- the answer had ended ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "model", "prompt", "fault", "stop", "usage_missing"),
    [
        ("anthropic", "claude-3-7-sonnet", STORY, "cut:from_end=1", "end_turn", False),  # message_stop lost
        ("anthropic", "claude-3-7-sonnet", STORY, "eof:from_end=1", "end_turn", False),
        ("anthropic", "claude-3-7-sonnet", WEATHER, "cut:from_end=1", "tool_use", False),
        ("openai", "gpt-4o", STORY, "cut:from_end=1", "end_turn", False),  # [DONE] lost
        ("openai", "gpt-4o", STORY, "cut:from_end=2", "end_turn", True),  # the usage chunk and [DONE] lost
        ("openai", "gpt-4o", WEATHER, "cut:from_end=2", "tool_use", True),
    ],
)
async def test_an_answer_whose_stop_reason_arrived_is_not_continued(
    fake_server, wire, model, prompt, fault, stop, usage_missing
):
    reference = await run(fake_server, prompt, wire=wire, model=model, tools=demo_registry())
    tools = demo_registry()
    out = await run(fake_server, prompt, wire=wire, model=model, tools=tools, faults=[fault])
    assert_invariants(out, reference)
    assert len(out.log) == len(reference.log)  # no continuation: the same calls as uninterrupted
    assert out.events("llm_stream_continuation_started") == []
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["answer_complete"] is True
    assert interrupted["final_usage_missing"] is usage_missing
    first = out.sink.attempts[0]
    assert (first.outcome, first.stop_reason) == ("interrupted", stop)
    if stop == "tool_use":
        assert [name for name, _ in tools.calls] == ["get_weather"]


# ---- a tool call cut by max_tokens in an answer that ended ------------------------------------

CUT_CALL = "What is the weather in Paris? [[tool=get_weather]] [[partial_tool_at_limit]]"


@pytest.mark.parametrize(("wire", "model"), [("anthropic", "claude-3-7-sonnet"), ("openai", "gpt-4o")])
@pytest.mark.parametrize("fault", [None, "cut:from_end=1"])  # a clean end, or only its terminator lost
async def test_a_tool_call_cut_by_max_tokens_is_dropped_for_the_client_too(fake_server, wire, model, fault):
    """The provider stops inside a call's arguments (OpenAI ``length``; Anthropic fine-grained
    tool streaming) and ends the stream: the call is not committed, so the client, which saw
    it stream, is told to drop it, and the drop is recorded, as at a break."""
    whole = await run(fake_server, CUT_CALL, wire=wire, model=model, tools=demo_registry())
    limit = whole.log[0].output_tokens - 3  # three pieces of the call's arguments short
    tools = demo_registry()
    out = await run(
        fake_server,
        CUT_CALL,
        wire=wire,
        model=model,
        tools=tools,
        max_tokens=limit,
        faults=[fault] if fault else [],
        config=with_config(notify_model_of_discarded_tools=True),
    )
    assert_invariants(out)  # among them: what the client shows is what was committed
    ((shown, committed),) = out.view.turns
    assert shown == committed
    assert [b["type"] for b in committed] == ["text"]
    assert tools.calls == []
    (cancel,) = out.frames("tool_call_cancel")
    assert cancel["name"] == "get_weather"
    (discarded,) = out.events("discarded_partial_tool_use")
    assert discarded["tool_name"] == "get_weather"
    assert discarded["tool_call_id"] == cancel["id"]
    assert discarded["reason"] == "invalid_arguments_json"  # its block closed with broken JSON
    assert discarded["partial_input_bytes"] > 0
    assert out.result.undelivered_notices == [
        {"id": cancel["id"], "name": "get_weather", "reason": "invalid_arguments_json"}
    ]
    assert len(out.log) == 1  # the answer had ended: never continued


# ---- a refusal in progress -------------------------------------------------------------------


@pytest.mark.parametrize("cut", ["cut:events=5", "cut:events=5,mid", "eof:events=3", "cut:from_end=3"])
async def test_an_openai_refusal_cut_before_its_finish_reason_is_never_continued(fake_server, cut):
    prompt = "Explain something forbidden [[refuse]]"
    reference = await run(fake_server, prompt, wire="openai", model="gpt-4o")
    assert reference.assistant[0]["content"] == [{"type": "text", "text": REFUSAL_TEXT}]
    out = await run(fake_server, prompt, wire="openai", model="gpt-4o", faults=[cut])
    assert out.status == "completed"
    assert len(out.log) == 1  # never continued
    (text_block,) = out.assistant[0]["content"]
    assert REFUSAL_TEXT.startswith(text_block["text"])
    for reconstructed, committed in out.view.turns:
        assert reconstructed == committed
    assert out.sink.attempts[0].stop_reason == "refusal"
    assert out.events("llm_stream_continuation_started") == []


# ---- never an empty assistant message --------------------------------------------------------

_EMPTY_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_01empty","type":"message",'
    b'"role":"assistant","model":"claude-3-7-sonnet","content":[],"stop_reason":null,"stop_sequence":null,'
    b'"usage":{"input_tokens":12,"output_tokens":1}}}\n\n'
)


def _empty_answer(stop: str) -> bytes:
    return (
        _EMPTY_START
        + b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"'
        + stop.encode()
        + b'","stop_sequence":null},"usage":{"output_tokens":2}}\n\n'
        + b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def _assert_no_empty_assistant(out) -> None:
    assert out.status == "completed", out.result.error
    assert all(m["content"] for m in out.result.messages if m["role"] == "assistant")
    assert out.frames("message_committed") == []


@pytest.mark.parametrize("stop", ["end_turn", "refusal"])
@pytest.mark.parametrize("fault", [None, "cut:from_end=1"])
async def test_an_answer_with_no_content_is_not_committed(fake_server, stop, fault):
    out = await run(fake_server, STORY, recording=_empty_answer(stop), faults=[fault] if fault else [])
    _assert_no_empty_assistant(out)
    assert out.result.new_messages == []
    assert len(out.log) == 1


async def test_a_run_re_executed_after_its_final_commit_adds_nothing(fake_server):
    reference = await run(fake_server, STORY)
    thread = reference.result.messages
    out = await run(fake_server, STORY, messages=[dict(m) for m in thread], resume=True)
    _assert_no_empty_assistant(out)
    assert out.result.new_messages == []
    assert out.result.messages == thread
    assert out.log == []  # the provider was not asked again


# ---- extended thinking on a continuation -----------------------------------------------------


async def test_a_continuations_thinking_block_is_shown_then_dropped_and_the_text_stays_one_block(fake_server):
    reference = await run(fake_server, STORY, thinking_budget=2048)
    thinking_end = await events_until(fake_server, reference, "thinking")
    faults = [
        f"cut:events={thinking_end + 8}",  # in the first response's text
        "cut:events=10",  # inside the continuation's own thinking block (unsigned: dropped as partial)
        "cut:events=45",  # after the next continuation's thinking block, inside its text
    ]
    out = await run(fake_server, STORY, thinking_budget=2048, faults=faults)
    assert_invariants(out, reference)  # committed = client view = uninterrupted
    assert [b["type"] for b in out.assistant[0]["content"]] == ["thinking", "text"]
    assert [e.understood_as for e in out.log] == ["fresh"] + ["continue_message"] * 3
    # every continuation started with a thinking block; the client saw it stream (after the
    # text, block 2) and was told to drop it each time
    assert {f["block"] for f in out.frames("thinking_delta")} == {0, 2}
    assert [e["reason"] for e in out.events("discarded_thinking")] == [
        "unsigned_partial_thinking",
        "thinking_after_text",
        "thinking_after_text",
    ]
    cancels = [(f["block"], f["kind"], f["reason"]) for f in out.frames("block_cancel")]
    assert cancels == [
        (2, "thinking", "partial"),
        (2, "thinking", "thinking_after_text"),
        (2, "thinking", "thinking_after_text"),
    ]


async def test_without_continuation_thinking_nothing_is_dropped(fake_server):
    prompt = STORY + " [[no_continuation_thinking]]"
    reference = await run(fake_server, prompt, thinking_budget=2048)
    thinking_end = await events_until(fake_server, reference, "thinking")
    out = await run(fake_server, prompt, thinking_budget=2048, faults=[f"cut:events={thinking_end + 8}"])
    assert_invariants(out, reference)
    assert out.frames("block_cancel") == []
    assert out.events("discarded_thinking") == []


# ---- max_tokens is the turn's budget ---------------------------------------------------------

LONG = "Tell me a long story about the sea [[words=400]]"
LIMIT = 500  # output tokens: the uninterrupted answer stops here with max_tokens


def _text(out) -> str:
    return "".join(b["text"] for m in out.assistant for b in m["content"] if b["type"] == "text")


@pytest.mark.parametrize(("wire", "model"), [("anthropic", "claude-3-7-sonnet"), ("openai", "gpt-4o")])
async def test_a_turn_cut_twice_never_receives_more_than_max_tokens(fake_server, wire, model):
    reference = await run(fake_server, LONG, wire=wire, model=model, max_tokens=LIMIT)
    assert reference.sink.attempts[-1].stop_reason == "max_tokens"  # the fake honours max_tokens
    assert reference.log[0].billed_output_tokens == LIMIT
    out = await run(
        fake_server, LONG, wire=wire, model=model, max_tokens=LIMIT, faults=["cut:events=80", "cut:events=40"]
    )
    assert out.status == "completed", out.result.error
    for reconstructed, committed in out.view.turns:
        assert reconstructed == committed
    # never more output than the caller allowed, across every call of the turn
    assert sum(e.billed_output_tokens for e in out.log) <= LIMIT
    sent = [a.request["json"].get("max_tokens") for a in out.sink.attempts]
    assert sent[0] == LIMIT
    assert sent[0] > sent[1] > sent[2] > 0
    # it ends as the uninterrupted run does: at its limit, with max_tokens, not continued again
    assert len(out.log) == 3
    assert out.sink.attempts[-1].stop_reason == "max_tokens"
    if wire == "openai":
        # a chunk per token, but a chunk with a multi-byte character (the fake's "café", "日本語",
        # "🚀") may carry several on the real API and counts its bytes: the answer ends early,
        # as the uninterrupted one's beginning, never late
        assert_invariants(out)
        assert _text(reference).startswith(_text(out))
        return
    # and with exactly the uninterrupted (truncated) answer: each continuation asked for what the
    # provider's count of the prefix says is left
    assert_invariants(out, reference)
    assert sum(e.billed_output_tokens for e in out.log) == LIMIT


async def test_a_turn_whose_budget_is_spent_at_the_break_ends_with_max_tokens(fake_server):
    # every allowed token arrived, the stop reason did not: the provider's count says the
    # budget is spent, so nothing more is asked for
    out = await run(fake_server, LONG, max_tokens=120, faults=["cut:from_end=3"])
    assert out.status == "completed", out.result.error
    assert len(out.log) == 1  # no continuation: nothing is left of the budget
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["turn_output_tokens"] >= 120
    reference = await run(fake_server, LONG, max_tokens=120)
    assert _text(out) == _text(reference)
    assert out.result.messages[-1] == reference.result.messages[-1]
    for reconstructed, committed in out.view.turns:
        assert reconstructed == committed


async def test_a_break_near_the_limit_is_continued_for_exactly_what_is_left(fake_server):
    # Before the provider's count, the bytes received (~4 per token) said the budget was spent
    # and the answer was stored 13 tokens short of the uninterrupted one.
    reference = await run(fake_server, LONG, max_tokens=120)
    out = await run(fake_server, LONG, max_tokens=120, faults=["cut:events=110"])
    assert out.status == "completed", out.result.error
    assert_invariants(out, reference)
    assert out.sink.attempts[-1].stop_reason == "max_tokens"
    assert sum(e.billed_output_tokens for e in out.log) == 120


MIDDLE = "Tell me a long story about the sea [[words=400]]"  # ~700 tokens: under the default 1024


@pytest.mark.parametrize(("wire", "model"), [("anthropic", "claude-3-7-sonnet"), ("openai", "gpt-4o")])
@pytest.mark.parametrize("faults", [["cut:events=200"], ["cut:events=450"], ["cut:events=250", "cut:events=200"]])
async def test_a_long_answer_cut_in_the_middle_is_committed_whole(fake_server, wire, model, faults):
    # The default max_tokens (1024) is more than the answer needs. Counted by its bytes (~4 per
    # token) the half that arrived looked like most of the budget: the continuation asked for
    # too little and the answer was stored cut short, with stop reason max_tokens.
    reference = await run(fake_server, MIDDLE, wire=wire, model=model, max_tokens=1024)
    assert reference.sink.attempts[-1].stop_reason == "end_turn"
    assert reference.log[0].billed_output_tokens < 1024
    out = await run(fake_server, MIDDLE, wire=wire, model=model, max_tokens=1024, faults=faults)
    assert_invariants(out, reference)
    assert out.sink.attempts[-1].stop_reason == "end_turn"
    assert len(out.log) == len(faults) + 1  # one call per break, no more
    assert sum(e.billed_output_tokens for e in out.log) == reference.log[0].billed_output_tokens


async def test_a_continue_message_at_the_limit_ends_at_most_the_instruction_short(fake_server):
    # Anthropic without prefill: the count of the prefix includes the continue instruction and
    # its framing, so at the limit the answer can end that many tokens early (never over it).
    from streamrecover.engine.contract import CONTINUE_INSTRUCTION
    from streamrecover.testing.fake.model import CONTINUE_FRAMING_TOKENS, split_pieces

    reference = await run(fake_server, LONG, model=NO_PREFILL, max_tokens=LIMIT)
    out = await run(fake_server, LONG, model=NO_PREFILL, max_tokens=LIMIT, faults=["cut:events=80", "cut:events=40"])
    assert out.status == "completed", out.result.error
    for reconstructed, committed in out.view.turns:
        assert reconstructed == committed
    assert [e.understood_as for e in out.log[1:]] == ["continue_message", "continue_message"]
    billed = sum(e.billed_output_tokens for e in out.log)
    overhead = len(split_pieces(CONTINUE_INSTRUCTION, 1, 6)) + CONTINUE_FRAMING_TOKENS
    assert LIMIT - overhead <= billed <= LIMIT
    assert out.sink.attempts[-1].stop_reason == "max_tokens"
    assert _text(reference).startswith(_text(out))


async def test_the_providers_count_runs_during_the_backoff_not_before_it(fake_server, monkeypatch):
    # The count of what the turn used (two free count_tokens calls on its first break) only
    # lowers the running bound, so while the bound leaves budget it runs inside the backoff:
    # the continuation starts a backoff after the break, not a backoff plus the counts.
    from streamrecover.engine import budget as budget_module

    real = budget_module.count_input_tokens
    counted = []

    async def slow_count(ctx, request):
        await asyncio.sleep(COUNT_S)  # a provider far away
        counted.append(request.url)
        return await real(ctx, request)

    monkeypatch.setattr(budget_module, "count_input_tokens", slow_count)
    reference = await run(fake_server, LONG, max_tokens=LIMIT)
    config = with_config(backoff_schedule=(BACKOFF_S,), backoff_scale=1.0)
    out = await run(fake_server, LONG, max_tokens=LIMIT, faults=["cut:events=80"], config=config)
    assert_invariants(out, reference)
    assert len(counted) == 2  # the turn's request and the continuation's, both counted
    first, second = out.sink.attempts[0], out.sink.attempts[1]
    assert first.ended_at is not None
    waited = second.started_at - first.ended_at
    assert BACKOFF_S <= waited < BACKOFF_S + COUNT_S  # serial, it was >= backoff + 2 counts
    # and the count still set the continuation's budget: what is left, exactly
    assert sum(e.billed_output_tokens for e in out.log) == LIMIT


BACKOFF_S = 0.6
COUNT_S = 0.4
