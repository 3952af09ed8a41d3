"""Self-hosted OpenAI-compatible servers: vLLM/SGLang/llama.cpp's ``continue_final_message``
prefill (and servers that refuse or ignore it), and DeepSeek's ``reasoning_content``."""

from __future__ import annotations

import pytest

from streamrecover.engine.contract import ModelRequest, ProviderConfig, Strategy
from streamrecover.engine.sse import SSEEvent
from streamrecover.providers.openai_chat import OpenAIChatAdapter, OpenAIChatStreamParser
from streamrecover.testing.fake import FakeProviderServer

from .harness import assert_invariants, run

PROMPT = "A long story [[words=60]]"
VLLM = {"continue_final_message": True}


def test_the_strategy_and_request_of_a_continue_final_message_server() -> None:
    adapter = OpenAIChatAdapter(ProviderConfig(name="openai", base_url="http://vllm:8000/v1", **VLLM))
    assert adapter.continuation_strategy("Qwen/Qwen3-8B", thinking=False) is Strategy.PREFILL
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello, how"}]},
    ]
    body = adapter.build_request(ModelRequest(model="m", messages=messages)).json
    assert body["continue_final_message"] is True
    assert body["add_generation_prompt"] is False
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello, how"}
    fresh = adapter.build_request(ModelRequest(model="m", messages=messages[:1])).json
    assert "continue_final_message" not in fresh
    plain = OpenAIChatAdapter(ProviderConfig(name="openai", base_url="http://x"))
    assert plain.continuation_strategy("m", thinking=False) is Strategy.CONTINUE_MESSAGE


async def test_vllm_continues_inside_the_partial_message(fake_server: FakeProviderServer) -> None:
    kw = {"wire": "openai", "model": "Qwen/Qwen3-8B", "provider_kw": VLLM}
    reference = await run(fake_server, PROMPT, **kw)
    outcome = await run(fake_server, PROMPT, faults=["cut:events=20"], **kw)
    assert_invariants(outcome, reference)
    assert [e.understood_as for e in outcome.log] == ["fresh", "prefill"]
    continued = outcome.log[1].request
    assert continued["continue_final_message"] is True
    assert continued["add_generation_prompt"] is False
    assert continued["messages"][-1]["role"] == "assistant"
    assert outcome.log[1].prefix_matched is True
    committed = outcome.assistant[0]["content"][0]["text"]
    assert len(outcome.billed_text()) - len(committed) <= 2  # a prefill's held-back whitespace at most


async def test_a_server_that_refuses_it_falls_back_to_a_continue_message(fake_server: FakeProviderServer) -> None:
    kw = {"wire": "openai", "model": "old-server-nocontinue", "provider_kw": VLLM}
    reference = await run(fake_server, PROMPT, **kw)
    outcome = await run(fake_server, PROMPT, faults=["cut:events=20"], **kw)
    assert_invariants(outcome, reference)
    assert [(e.status, e.understood_as) for e in outcome.log] == [
        (200, "fresh"),
        (400, None),
        (200, "continue_message"),
    ]


async def test_a_server_that_ignores_it_starts_over_and_the_repeat_is_dropped(fake_server: FakeProviderServer) -> None:
    kw = {"wire": "openai", "model": "server-ignorecontinue", "provider_kw": VLLM}
    reference = await run(fake_server, PROMPT, **kw)
    outcome = await run(fake_server, PROMPT, faults=["cut:events=20"], **kw)
    assert_invariants(outcome, reference)
    assert outcome.log[1].understood_as == "new_turn_after_assistant"
    joins = outcome.events("llm_stream_continuation_completed")[0]["joins"]
    assert joins[0]["kind"] == "restart_trimmed"


def _reasoning_chunk(delta: dict) -> SSEEvent:
    import json

    choice = {"index": 0, "delta": delta, "finish_reason": None}
    return SSEEvent("message", json.dumps({"id": "c1", "choices": [choice]}))


def test_reasoning_content_is_a_thinking_block_never_the_answer() -> None:
    from streamrecover.engine.blocks import Accumulator

    parser, acc = OpenAIChatStreamParser(), Accumulator()
    for delta in (
        {"role": "assistant", "content": None, "reasoning_content": ""},
        {"content": None, "reasoning_content": "Let me "},
        {"content": None, "reasoning_content": "think."},
        {"content": "The answer", "reasoning_content": None},
    ):
        for event in parser.feed(_reasoning_chunk(delta)):
            acc.apply(event)
    thinking, text = acc.blocks
    assert (thinking.kind, thinking.text, thinking.closed) == ("thinking", "Let me think.", True)
    assert (text.kind, text.text) == ("text", "The answer")


@pytest.mark.parametrize("cut", [None, "cut:events=5", "cut:events=40"])
async def test_deepseek_reasoning_is_shown_dropped_and_never_sent_back(fake_server: FakeProviderServer, cut) -> None:
    """Cut inside the reasoning or inside the answer: the answer is the uninterrupted one, the
    reasoning never reaches it nor history (DeepSeek refuses ``reasoning_content`` back)."""
    kw = {"wire": "openai", "model": "deepseek-reasoner", "provider_kw": {"prefix_flag": True}}
    reference = await run(fake_server, PROMPT, **kw)
    outcome = await run(fake_server, PROMPT, faults=[cut] if cut else [], **kw)
    assert_invariants(outcome, reference)
    assert all(e.status == 200 for e in outcome.log)
    assert outcome.frames("thinking_delta")  # the client saw the reasoning stream
    [message] = outcome.assistant
    assert [b["type"] for b in message["content"]] == ["text"]
    reasoning = "".join(f["thinking"] for f in outcome.frames("thinking_delta"))
    assert reasoning
    assert reasoning[:20] not in message["content"][0]["text"]
    dropped = outcome.events("discarded_thinking")
    assert dropped
    assert all("reasoning_content" not in m for e in outcome.log for m in e.request["messages"])
