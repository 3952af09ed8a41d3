"""The recovery engine end to end: real HTTP against the fake provider, every plan,
strategy, budget and stop rule, checked by what a user would notice."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import Checkpoint, InMemoryCheckpointStore
from streamrecover.testing.tools import demo_registry

from .harness import assert_invariants, events_until, run, with_config
from .scripted import anthropic_blocks, chat_chunk, chat_usage, run_scripted, sse

STORY = "Tell me a story about the sea [[words=120]]"
WEATHER = "What is the weather in Paris? [[tool=get_weather]]"


async def test_uninterrupted_run_completes_in_one_request(fake_server):
    out = await run(fake_server, STORY)
    assert_invariants(out)
    assert len(out.log) == 1
    assert out.events("llm_stream_interrupted") == []


async def test_r1_cut_mid_text_continues_with_prefill_and_bills_no_text_twice(fake_server):
    reference = await run(fake_server, STORY)
    out = await run(fake_server, STORY, faults=["cut:bytes=1500"])
    assert_invariants(out, reference)
    assert [e.understood_as for e in out.log] == ["fresh", "prefill"]
    assert out.log[1].prefix_matched is True
    # every character was generated (billed) exactly once across the two calls
    assert out.billed_text() == out.assistant[0]["content"][0]["text"]
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["plan"] == "continue_text"
    assert interrupted["cause"] == "connection_reset"
    assert interrupted["committed_partial_text"] is True
    (started,) = out.events("llm_stream_continuation_started")
    assert started["strategy"] == "prefill"
    (completed,) = out.events("llm_stream_continuation_completed")
    assert completed["completion_reason"] == "end_turn"
    assert [a.kind for a in out.sink.attempts] == ["initial", "continuation"]
    assert out.frames("stream_reset") == []
    assert out.frames("tool_call_cancel") == []


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        ("eof:events=20", "connection_reset"),
        ("error:events=20,type=overloaded_error", "provider_error_mid_stream"),
        ("garbage:events=20", "sse_parse"),
        ("bad_utf8:events=20", "body_decode"),
        ("stall:events=20,seconds=3", "idle_stall"),
        ("cut:events=20,mid", "connection_reset"),
    ],
)
async def test_every_interrupt_cause_is_classified_and_recovered(fake_server, fault, cause):
    reference = await run(fake_server, STORY)
    out = await run(fake_server, STORY, faults=[fault], config=with_config(idle_timeout_s=0.4))
    assert_invariants(out, reference)
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["cause"] == cause
    assert out.sink.attempts[0].interrupt_cause == cause


async def test_openai_continues_with_an_explicit_continue_message(fake_server):
    reference = await run(fake_server, STORY, wire="openai", model="gpt-4o")
    out = await run(fake_server, STORY, wire="openai", model="gpt-4o", faults=["cut:bytes=1200"])
    assert_invariants(out, reference)
    assert [e.understood_as for e in out.log] == ["fresh", "continue_message"]
    sent = out.sink.attempts[1].request["json"]["messages"]
    assert sent[-1]["role"] == "user"
    assert "Continue exactly where it stopped" in sent[-1]["content"]
    assert out.billed_text() == out.assistant[0]["content"][0]["text"]


async def test_openai_compatible_prefix_flag(fake_server):
    reference = await run(fake_server, STORY, wire="openai", model="deepseek-chat")
    out = await run(
        fake_server,
        STORY,
        wire="openai",
        model="deepseek-chat",
        faults=["cut:bytes=1300"],
        provider_kw={"prefix_flag": True},
    )
    assert_invariants(out, reference)
    assert [e.understood_as for e in out.log] == ["fresh", "prefix_flag"]


async def test_r2_completed_tool_call_ends_the_turn_and_runs_the_tool_once(fake_server):
    tools = demo_registry()
    reference = await run(fake_server, WEATHER, tools=demo_registry())
    # cut after the tool call's content_block_stop but before message_delta/message_stop
    events_before_stop = await events_until(fake_server, reference, "tool")
    out = await run(fake_server, WEATHER, tools=tools, faults=[f"cut:events={events_before_stop}"])
    assert_invariants(out, reference)
    assert [name for name, _ in tools.calls] == ["get_weather"]
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["plan"] == "synthesize_tool_use"
    assert out.frames("tool_call_cancel") == []


async def test_r2_with_a_half_received_second_call_cancels_it(fake_server):
    tools = demo_registry()
    prompt = "Weather in Paris and Rome? [[tools=2]]"
    reference = await run(fake_server, prompt, tools=demo_registry())
    cut = await events_until(fake_server, reference, "tool") + 4  # inside the second tool call's arguments
    out = await run(fake_server, prompt, tools=tools, faults=[f"cut:events={cut}"])
    assert out.status == "completed"
    for reconstructed, committed in out.view.turns:
        assert reconstructed == committed
    first_turn = out.assistant[0]["content"]
    assert [b["type"] for b in first_turn].count("tool_use") == 1
    (cancel,) = out.frames("tool_call_cancel")
    (discarded,) = out.events("discarded_partial_tool_use")
    assert cancel["id"] == discarded["tool_call_id"]
    assert discarded["partial_input_bytes"] > 0
    # the complete call ran exactly once; the half one never ran
    kept_call = next(b for b in first_turn if b["type"] == "tool_use")
    assert tools.calls[0] == ("get_weather", kept_call["input"])
    assert [c for c in tools.calls if c == tools.calls[0]] == [tools.calls[0]]


async def test_r3_text_then_partial_tool_call_is_truncated_and_continued(fake_server):
    tools = demo_registry()
    reference = await run(fake_server, WEATHER, tools=demo_registry())
    cut = await events_until(fake_server, reference, "tool") - 2  # inside the arguments JSON
    out = await run(fake_server, WEATHER, tools=tools, faults=[f"cut:events={cut}"])
    assert_invariants(out, reference)
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["plan"] == "truncate_before_tool"
    (cancel,) = out.frames("tool_call_cancel")
    assert cancel["name"] == "get_weather"
    assert cancel["reason"]
    assert [name for name, _ in tools.calls] == ["get_weather"]  # executed once, complete


async def test_r4_nothing_salvageable_restarts_and_resets_the_client(fake_server):
    reference = await run(fake_server, STORY, thinking_budget=2048)
    out = await run(fake_server, STORY, thinking_budget=2048, faults=["cut:events=6"])
    assert_invariants(out, reference)
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["plan"] == "whole_restart"
    assert len(out.frames("stream_reset")) == 1
    (thinking,) = out.events("discarded_thinking")
    assert thinking["reason"] == "unsigned_partial_thinking"
    assert [a.kind for a in out.sink.attempts] == ["initial", "restart"]


async def test_signed_thinking_is_kept_and_text_continues_without_prefill(fake_server):
    reference = await run(fake_server, STORY, thinking_budget=2048)
    thinking_end = await events_until(fake_server, reference, "thinking")
    out = await run(fake_server, STORY, thinking_budget=2048, faults=[f"cut:events={thinking_end + 8}"])
    assert_invariants(out, reference)
    assert out.assistant[0]["content"][0]["type"] == "thinking"
    assert out.assistant[0]["content"][0]["signature"]
    assert [e.understood_as for e in out.log] == ["fresh", "continue_message"]  # no prefill with thinking


async def test_prefill_refused_falls_back_to_continue_message(fake_server):
    model = "claude-opus-4-6"
    reference = await run(fake_server, STORY, model=model)
    out = await run(
        fake_server,
        STORY,
        model=model,
        faults=["cut:bytes=1500"],
        provider_kw={"strategy_overrides": {"*": "prefill"}},
    )
    assert_invariants(out, reference)
    assert [e.status for e in out.log] == [200, 400, 200]
    assert out.log[2].understood_as == "continue_message"
    failed = out.events("llm_stream_continuation_failed")
    assert failed
    assert failed[0]["fallback_strategy"] == "continue_message"


CITED = {"type": "web_search_result_location", "url": "https://example.org/apple", "cited_text": "Apple said so."}


def _text(text: str) -> dict:
    return {"type": "text_delta", "text": text}


def _cite(citation: dict) -> dict:
    return {"type": "citations_delta", "citation": citation}


def _like_anthropic(answer: bytes):
    """The continuation's response, after the API's own prefill rule (a 400 for a prefill that
    ends in whitespace, as Anthropic answers it)."""
    refusal = json.dumps(
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "messages: final assistant content cannot end with trailing whitespace",
            },
        }
    ).encode()

    def respond(body: dict) -> tuple[int, dict[str, str], bytes]:
        last = body["messages"][-1]
        if last["role"] == "assistant" and last["content"][-1]["text"] != last["content"][-1]["text"].rstrip():
            return 400, {"content-type": "application/json"}, refusal
        return 200, {}, answer

    return respond


async def test_a_prefill_after_a_blank_block_that_follows_trailing_whitespace_continues_the_answer():
    """Kept: a cited span ending in a space, then a block of one space, cut there. The prefill
    may end in no whitespace: the blank block is left out and the span's space too, while
    what the client was shown (and what is stored) keeps both, once; the answer goes on."""
    broken = anthropic_blocks(
        ({"type": "text", "text": ""}, [_text("Intro: ")], True),
        ({"type": "text", "text": "", "citations": []}, [_cite(CITED), _text("Apple said so. ")], True),
        ({"type": "text", "text": ""}, [_text(" ")], False),
    )  # fmt: skip
    rest = anthropic_blocks(({"type": "text", "text": ""}, [_text(" And that"), _text(" is all.")], True), ended=True)
    out = await run_scripted("anthropic", [(200, {}, broken), _like_anthropic(rest)], model="claude-3-7-sonnet")
    assert out.result.status == "completed", out.result.error
    assert out.answer == [
        {"type": "text", "text": "Intro: "},
        {"type": "text", "text": "Apple said so. ", "citations": [CITED]},
        {"type": "text", "text": " And that is all."},  # the space the model wrote again is not doubled
    ]
    assert [shown for shown, _ in out.view.turns] == [out.answer]  # what the client showed
    prefill = out.requests[1]["messages"][-1]
    assert prefill["content"][-1]["text"] == "Apple said so."


async def test_a_cited_span_that_continues_plain_kept_text_joins_it_at_the_seam():
    """Kept: plain text ending in a space, cut inside its block. The prefill leaves the space out
    and the continuation writes it again, at the start of a cited span (a block of its own, as
    uninterrupted): the space is dropped there once, as at any seam, so the blocks' text is the
    uninterrupted answer's, neither doubled nor lost, as shown and as stored."""
    broken = anthropic_blocks(({"type": "text", "text": ""}, [_text("Intro: "), _text("as they put it, ")], False))
    rest = anthropic_blocks(
        ({"type": "text", "text": "", "citations": []}, [_cite(CITED), _text(" Apple"), _text(" said so.")], True),
        ended=True,
    )
    out = await run_scripted("anthropic", [(200, {}, broken), _like_anthropic(rest)], model="claude-3-7-sonnet")
    assert out.result.status == "completed", out.result.error
    assert out.answer == [
        {"type": "text", "text": "Intro: as they put it, "},
        {"type": "text", "text": "Apple said so.", "citations": [CITED]},
    ]
    assert [shown for shown, _ in out.view.turns] == [out.answer]  # what the client showed
    assert out.events("llm_stream_continuation_completed")[-1]["join"] == "echo_dropped"


async def test_plain_text_that_continues_a_cited_span_joins_it_at_the_seam():
    """The other way: kept, a cited span ending in a space, cut inside it; the continuation goes on
    in plain text (a block of its own) that starts with the space the prefill left out: dropped once."""
    broken = anthropic_blocks(
        ({"type": "text", "text": "", "citations": []}, [_cite(CITED), _text("Apple said so. ")], False)
    )
    rest = anthropic_blocks(({"type": "text", "text": ""}, [_text(" And that"), _text(" is all.")], True), ended=True)
    out = await run_scripted("anthropic", [(200, {}, broken), _like_anthropic(rest)], model="claude-3-7-sonnet")
    assert out.result.status == "completed", out.result.error
    assert out.answer == [
        {"type": "text", "text": "Apple said so. ", "citations": [CITED]},
        {"type": "text", "text": "And that is all."},
    ]
    assert [shown for shown, _ in out.view.turns] == [out.answer]


async def test_a_cited_span_that_repeats_the_end_of_plain_kept_text_has_the_repeat_trimmed():
    """A continue-message continuation that opens a cited span by repeating the kept text's last
    words: the repeat is trimmed as at any seam, though the span is a block of its own."""
    kept = "The report, published by the company last spring, says that "
    out = await run_scripted(
        "anthropic",
        [
            (200, {}, anthropic_blocks(({"type": "text", "text": ""}, [_text(kept)], False))),
            (
                200,
                {},
                anthropic_blocks(
                    (
                        {"type": "text", "text": "", "citations": []},
                        [_cite(CITED), _text("last spring, says that "), _text("Apple said so.")],
                        True,
                    ),
                    ended=True,
                ),
            ),
        ],
        model="claude-3-7-sonnet",
        provider_kw={"strategy_overrides": {"claude-*": "continue_message"}},
    )
    assert out.result.status == "completed", out.result.error
    assert "".join(b["text"] for b in out.answer) == kept + "Apple said so."
    assert out.answer[-1] == {"type": "text", "text": "Apple said so.", "citations": [CITED]}
    assert [shown for shown, _ in out.view.turns] == [out.answer]
    assert out.events("llm_stream_continuation_completed")[-1]["join"] == "overlap_trimmed"


async def test_a_cited_span_that_restarts_plain_kept_text_replaces_it():
    """A continuation that starts the answer over in a cited span and then says something else:
    its text replaces the kept text, whose plain block goes, as shown after the reset and stored."""
    kept = "The report, published by the company last spring, says that "
    again = "The report, published by the company in May, found that Apple said so."
    out = await run_scripted(
        "anthropic",
        [
            (200, {}, anthropic_blocks(({"type": "text", "text": ""}, [_text(kept)], False))),
            (
                200,
                {},
                anthropic_blocks(
                    ({"type": "text", "text": "", "citations": []}, [_cite(CITED), _text(again)], True), ended=True
                ),
            ),
        ],
        model="claude-3-7-sonnet",
        provider_kw={"strategy_overrides": {"claude-*": "continue_message"}},
    )
    assert out.result.status == "completed", out.result.error
    assert out.answer == [{"type": "text", "text": again, "citations": [CITED]}]
    assert [shown for shown, _ in out.view.turns] == [out.answer]
    assert out.events("llm_stream_continuation_completed")[-1]["join"] == "restart_replaced"


def _chat_text(text: str) -> list[str]:
    return [chat_chunk(text[i : i + 7]) for i in range(0, len(text), 7)]


async def _continued(kept: str, again: str, finish: str = "stop"):
    """``kept`` streamed then cut; the continuation (continue_message) writes ``again``."""
    broken = sse(_chat_text(kept))
    rest = sse([*_chat_text(again), chat_chunk(None, finish), chat_usage(10, 10), None])
    out = await run_scripted("openai", [(200, {}, broken), (200, {}, rest)])
    assert out.result.status == "completed", out.result.error
    assert [shown for shown, _ in out.view.turns] == [out.answer]  # what the client showed
    return out


async def test_a_restart_of_a_block_starting_with_blank_lines_is_not_shown_twice():
    kept = "\n\n" + "The quick brown fox jumps over the lazy dog. " * 7 + "And then"
    out = await _continued(kept, kept + " it slept.")
    assert out.answer == [{"type": "text", "text": kept + " it slept."}]
    assert out.events("llm_stream_continuation_completed")[-1]["join"] == "restart_trimmed"


async def test_a_restart_cut_short_by_max_tokens_keeps_the_text_already_shown():
    kept = "The quick brown fox jumps over the lazy dog. Then it"
    out = await _continued(kept, "The quick brown fox jumps over", finish="length")
    assert out.answer == [{"type": "text", "text": kept}]
    assert [f for f in out.sink.frames if f["type"] == "stream_reset"] == []


async def test_budget_exhausted_after_exactly_max_continuations(fake_server):
    out = await run(fake_server, STORY, faults=["cut:bytes=900"] * 10)
    assert out.status == "exhausted"
    assert len(out.log) == 1 + 5
    (exhausted,) = out.events("llm_stream_continuation_exhausted")
    assert exhausted["attempts"] == 5
    # what the client was shown is committed, as shown (tests/test_cut_short_endings.py)
    ((reconstructed, committed),) = out.view.turns
    assert reconstructed == committed


async def test_changed_settings_are_obeyed(fake_server):
    config = with_config(max_continuations=2, backoff_schedule=(0.05, 0.1), backoff_scale=1.0)
    started = time.monotonic()
    out = await run(fake_server, STORY, faults=["cut:bytes=900"] * 10, config=config)
    assert out.status == "exhausted"
    assert len(out.log) == 3
    assert [e["backoff_s"] for e in out.events("llm_stream_continuation_started")] == [0.05, 0.1]
    assert time.monotonic() - started >= 0.15


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("status:401", "unauthorized"),
        ("status:400", "invalid_request"),
        ("status:404,type=not_found_error", "model_not_found"),
        ("status:429,quota", "spend_limit"),
    ],
)
async def test_permanent_errors_are_never_retried(fake_server, fault, kind):
    out = await run(fake_server, STORY, faults=[fault])
    assert out.status == "failed"
    assert out.result.error["kind"] == kind
    assert len(out.log) == 1


async def test_openai_insufficient_quota_is_permanent(fake_server):
    out = await run(fake_server, STORY, wire="openai", model="gpt-4o", faults=["status:429,quota"])
    assert out.status == "failed"
    assert len(out.log) == 1


async def test_permanent_error_mid_stream_is_not_continued(fake_server):
    out = await run(fake_server, STORY, faults=["error:events=15,type=invalid_request_error"])
    assert out.status == "failed"
    assert len(out.log) == 1


async def test_retry_after_is_honoured_before_the_stream(fake_server):
    started = time.monotonic()
    out = await run(fake_server, STORY, faults=["status:429,retry_after=0.4", "status:529,retry_after_ms=300"])
    assert_invariants(out)
    retries = out.events("llm_request_retry")
    assert [r["delay_s"] for r in retries] == [0.4, 0.3]
    assert time.monotonic() - started >= 0.7
    assert [a.kind for a in out.sink.attempts] == ["initial", "pre_stream_retry", "pre_stream_retry"]


async def test_retry_after_http_date_and_cap(fake_server):
    out = await run(
        fake_server, STORY, faults=["status:429,retry_after=3600"], config=with_config(max_retry_after_s=0.2)
    )
    assert_invariants(out)
    assert out.events("llm_request_retry")[0]["delay_s"] == 0.2
    out = await run(fake_server, STORY, faults=["status:529,retry_after_date=2"])
    assert_invariants(out)
    assert 0 < out.events("llm_request_retry")[0]["retry_after_s"] <= 2.0


async def test_retry_after_during_a_continuation_waits_at_least_that_long(fake_server):
    out = await run(fake_server, STORY, faults=["cut:bytes=1500", "status:429,retry_after=0.3"])
    assert_invariants(out)
    assert [e.understood_as for e in out.log][-1] == "prefill"
    assert out.events("llm_request_retry")[0]["delay_s"] == 0.3


async def test_pre_stream_budget_is_separate_and_bounded(fake_server):
    out = await run(fake_server, STORY, faults=["status:500"] * 5, config=with_config(max_request_retries=2))
    assert out.status == "failed"
    assert len(out.log) == 3
    assert out.events("llm_stream_interrupted") == []


async def test_x_should_retry_false_stops_a_retryable_status(fake_server):
    out = await run(fake_server, STORY, faults=["status:529,should_retry=false"])
    assert out.status == "failed"
    assert len(out.log) == 1


async def test_cancel_during_streaming_stops_at_once_and_never_continues(fake_server):
    cancel = CancelToken()

    async def cancel_soon():
        await asyncio.sleep(0.3)
        cancel.cancel("user pressed stop")

    task = asyncio.ensure_future(cancel_soon())
    started = time.monotonic()
    out = await run(fake_server, STORY, faults=["stall:events=20,seconds=5"], cancel=cancel)
    await task
    assert out.status == "cancelled"
    assert time.monotonic() - started < 2
    assert len(out.sink.attempts) == 1  # the stalled call is the only one
    assert out.sink.attempts[0].outcome == "cancelled"
    assert out.events("llm_stream_continuation_started") == []


@pytest.mark.parametrize("fault", ["stall_headers:seconds=30", "stall:events=0,seconds=30"])
async def test_cancel_while_waiting_for_the_response_beats_the_timeouts(fake_server, fault):
    """A provider that accepts the connection and then sends nothing (no headers, or headers
    and no body byte): a cancel ends the run at once, not after the connect or idle timeout."""
    cancel = CancelToken()
    config = with_config(idle_timeout_s=60.0, connect_timeout_s=60.0)

    async def cancel_soon():
        await asyncio.sleep(0.3)
        cancel.cancel("user pressed stop")

    task = asyncio.ensure_future(cancel_soon())
    started = time.monotonic()
    out = await asyncio.wait_for(run(fake_server, STORY, faults=[fault], cancel=cancel, config=config), 20)
    await task
    assert out.status == "cancelled"
    assert time.monotonic() - started < 2
    assert [a.outcome for a in out.sink.attempts] == ["cancelled"]
    assert out.events("llm_stream_continuation_started") == []


async def test_cancel_during_backoff_beats_the_continuation(fake_server):
    cancel = CancelToken()
    config = with_config(backoff_schedule=(5.0,), backoff_scale=1.0)

    async def cancel_soon():
        await asyncio.sleep(0.5)
        cancel.cancel()

    task = asyncio.ensure_future(cancel_soon())
    started = time.monotonic()
    out = await run(fake_server, STORY, faults=["cut:bytes=1500"], cancel=cancel, config=config)
    await task
    assert out.status == "cancelled"
    assert time.monotonic() - started < 3
    assert len(out.log) == 1  # the continuation never went out
    assert out.frames("recovery")[0]["phase"] == "backoff"


async def test_resume_from_a_checkpoint_continues_without_spending_the_budget(fake_server):
    reference = await run(fake_server, STORY)
    text = reference.assistant[0]["content"][0]["text"]
    store = InMemoryCheckpointStore()
    await store.put(
        Checkpoint(run_id="resume-1", turn=0, history_len=1, blocks=[{"type": "text", "text": text[:200]}], seq=40)
    )
    out = await run(
        fake_server, STORY, checkpoints=store, run_id="resume-1", resume=True, config=with_config(max_continuations=0)
    )
    assert out.status == "completed"
    assert out.result.messages == reference.result.messages
    assert [e.understood_as for e in out.log] == ["prefill"]
    assert out.sink.attempts[0].kind == "resume"
    assert out.sink.frames[0]["seq"] == 41  # numbering goes on from the checkpoint
    assert out.frames("stream_reset")[0]["reason"] == "resume"
    assert await store.get("resume-1") is None  # deleted when the turn committed


async def test_checkpoint_written_on_interruption_and_deleted_on_commit(fake_server):
    store = InMemoryCheckpointStore()
    seen = []
    original_put = store.put

    async def spy(checkpoint):
        seen.append(checkpoint.to_dict())
        await original_put(checkpoint)

    store.put = spy
    out = await run(fake_server, STORY, faults=["cut:bytes=1500"], checkpoints=store, run_id="cp-1")
    assert_invariants(out)
    # written on the interruption, holding exactly the text the client had been sent
    assert seen
    text_at_break = "".join(f["text"] for f in out.sink.frames[: _first(out, "recovery")] if f["type"] == "text_delta")
    assert any(c["blocks"] == [{"type": "text", "text": text_at_break}] for c in seen)
    assert await store.get("cp-1") is None


async def test_structured_output_restarts_instead_of_continue_message(fake_server):
    out = await run(fake_server, STORY, wire="openai", model="gpt-4o", faults=["cut:bytes=1200"], structured=True)
    assert out.status == "completed"
    assert [e.understood_as for e in out.log] == ["fresh", "fresh"]
    assert out.events("llm_stream_interrupted")[0]["plan"] == "whole_restart"
    assert len(out.frames("stream_reset")) == 1


async def test_unknown_tool_gets_an_error_result(fake_server):
    out = await run(fake_server, "Use it [[tool=launch_rocket]]", tools=demo_registry())
    assert out.status == "completed"
    result = out.result.messages[2]["content"][0]
    assert result["type"] == "tool_result"
    assert result["is_error"] is True
    assert "unknown tool" in result["content"]


async def test_turn_bound_is_enforced(fake_server):
    out = await run(fake_server, WEATHER, tools=demo_registry(), config=with_config(max_turns=1))
    assert out.status == "failed"
    assert out.result.error["kind"] == "max_turns"


async def _cut_with_tools(fake_server, prompt: str, cut: int, *, notify: bool):
    """The demo tools offered, the stream cut after ``cut`` events, notices on or off."""
    config = with_config(notify_model_of_discarded_tools=notify)
    return await run(fake_server, prompt, tools=demo_registry(), faults=[f"cut:events={cut}"], config=config)


async def test_model_is_told_about_a_discarded_tool_call_only_when_enabled(fake_server):
    prompt = "Weather in Paris and Rome? [[tools=2]]"
    reference = await run(fake_server, prompt, tools=demo_registry())
    cut = await events_until(fake_server, reference, "tool") + 4
    quiet = await _cut_with_tools(fake_server, prompt, cut, notify=False)
    assert all(b["type"] == "tool_result" for b in quiet.result.messages[2]["content"])
    told = await _cut_with_tools(fake_server, prompt, cut, notify=True)
    notices = [b for b in told.result.messages[2]["content"] if b["type"] == "text"]
    assert len(notices) == 1
    assert "was not executed" in notices[0]["text"]
    assert told.result.undelivered_notices == []  # delivered with the tool results


async def test_a_notice_the_run_could_not_deliver_is_handed_back(fake_server):
    """R3, and the model ends its turn instead of calling the tool again: no tool-results
    message follows, so the notice is returned for the thread's next user message."""
    prompt = "Weather in Paris? [[tool]] [[no_tool_after_break]]"
    reference = await run(fake_server, prompt, tools=demo_registry())
    cut = await events_until(fake_server, reference, "tool") - 2  # inside the arguments JSON
    quiet = await _cut_with_tools(fake_server, prompt, cut, notify=False)
    told = await _cut_with_tools(fake_server, prompt, cut, notify=True)
    for out in (quiet, told):
        assert out.status == "completed"
        assert out.events("llm_stream_interrupted")[0]["plan"] == "truncate_before_tool"
        assert [b["type"] for b in out.assistant[-1]["content"]] == ["text"]  # the turn ended, no call
    assert quiet.result.undelivered_notices == []
    (discarded,) = told.events("discarded_partial_tool_use")
    (notice,) = told.result.undelivered_notices
    assert (notice["id"], notice["name"]) == (discarded["tool_call_id"], "get_weather")


def _first(outcome, kind: str) -> int:
    return next(i for i, f in enumerate(outcome.sink.frames) if f["type"] == kind)


async def test_checkpoints_are_coalesced_not_written_per_delta(fake_server):
    store = InMemoryCheckpointStore()
    config = with_config(checkpoint_every_deltas=25, checkpoint_every_bytes=10**9, checkpoint_every_seconds=60)
    out = await run(fake_server, "A long one [[words=400]]", checkpoints=store, config=config)
    deltas = len(out.frames("text_delta"))
    assert deltas > 200
    assert 0 < store.writes <= deltas // 25 + 1


async def test_usage_is_recorded_per_attempt_including_the_interrupted_one(fake_server):
    out = await run(fake_server, STORY, faults=["cut:bytes=1500"])
    first, second = out.sink.attempts
    assert first.outcome == "interrupted"
    assert first.usage.input_tokens > 0
    assert first.bytes_received > 0
    assert first.first_byte_at is not None
    assert second.outcome == "completed"
    assert second.usage.output_tokens > 0
    # the continuation's request carried the prefix as input, larger than the original prompt
    assert second.usage.input_tokens > first.usage.input_tokens


async def test_a_failing_checkpoint_store_is_logged_and_never_kills_the_run(fake_server, caplog):
    class BrokenStore(InMemoryCheckpointStore):
        async def put(self, checkpoint):
            raise ConnectionError("checkpoint store is down")

    reference = await run(fake_server, STORY)
    out = await run(fake_server, STORY, faults=["cut:bytes=1500"], checkpoints=BrokenStore())
    assert_invariants(out, reference)
    assert "checkpoint_put_failed" in caplog.text
    assert "checkpoint store is down" in caplog.text


def test_http2_goaway_and_other_transport_errors_are_classified():
    import httpx

    from streamrecover.engine.transport import classify_transport_error

    goaway = httpx.RemoteProtocolError("<ConnectionTerminated error_code:0, last_stream_id:1, additional_data:None>")
    assert classify_transport_error(goaway).value == "goaway"
    assert classify_transport_error(httpx.RemoteProtocolError("peer closed connection")).value == "connection_reset"
    assert classify_transport_error(httpx.ReadTimeout("timed out")).value == "idle_stall"
    assert classify_transport_error(httpx.ReadError("[Errno 104] Connection reset by peer")).value == "connection_reset"
    assert classify_transport_error(httpx.DecodingError("bad gzip")).value == "body_decode"
