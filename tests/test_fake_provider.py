"""The fake provider answers like the real APIs: wire formats, continuation rules, errors.

Plain httpx against the real loopback server, no mocks: what a client sees is what the
product will see.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamrecover.engine.contract import CONTINUE_INSTRUCTION
from streamrecover.engine.sse import SSEDecoder, SSEEvent
from streamrecover.testing.fake import FakeProviderServer

from . import fake_fixtures
from .fake_fixtures import HTTP, TIME_TOOL

ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-secret-key", "anthropic-version": "2023-06-01"}
OPENAI_HEADERS = {"authorization": "Bearer sk-openai-secret-key"}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a place",
    "input_schema": {
        "type": "object",
        "properties": {"location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["location"],
    },
}

# this module's fake provider, reset before each test
server = fake_fixtures.server
clean_server = fake_fixtures.clean_server


# -- helpers -------------------------------------------------------------------------------


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def anthropic_body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 2048, "stream": True, "messages": list(messages), **extra}


def openai_body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "stream": True, "messages": list(messages), **extra}


def post_anthropic(server: FakeProviderServer, body: Any, **kwargs: Any) -> httpx.Response:
    headers = {**ANTHROPIC_HEADERS, **kwargs.pop("headers", {})}
    return HTTP.post(server.base_url + "/v1/messages", json=body, headers=headers, **kwargs)


def post_openai(server: FakeProviderServer, body: Any, path: str = "/v1/chat/completions", **kw: Any) -> httpx.Response:
    headers = {**OPENAI_HEADERS, **kw.pop("headers", {})}
    return HTTP.post(server.base_url + path, json=body, headers=headers, **kw)


def sse_events(raw: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return decoder.feed(raw) + decoder.close()


def anthropic_message(response: httpx.Response) -> dict[str, Any]:
    """Rebuild the message from its events, checking that each event names its type."""
    blocks: list[dict[str, Any]] = []
    message: dict[str, Any] = {"events": []}
    for event in sse_events(response.content):
        data = json.loads(event.data)
        assert data["type"] == event.event
        message["events"].append(event.event)
        if event.event == "message_start":
            message["usage"] = data["message"]["usage"]
        elif event.event == "content_block_start":
            assert data["index"] == len(blocks)
            blocks.append(dict(data["content_block"], partial_json=""))
        elif event.event == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                block["partial_json"] += delta["partial_json"]
        elif event.event == "message_delta":
            message["stop_reason"] = data["delta"]["stop_reason"]
            message["output_tokens"] = data["usage"]["output_tokens"]
    for block in blocks:
        if block["type"] in ("tool_use", "server_tool_use"):
            block["input"] = json.loads(block["partial_json"])
        del block["partial_json"]
    message["content"] = blocks
    message["text"] = "".join(b["text"] for b in blocks if b["type"] == "text")
    return message


def openai_chunks(response: httpx.Response) -> list[Any]:
    return [e.data if e.data == "[DONE]" else json.loads(e.data) for e in sse_events(response.content)]


def openai_message(response: httpx.Response) -> dict[str, Any]:
    chunks = openai_chunks(response)
    assert chunks[-1] == "[DONE]"
    text, refusal, calls, finish = "", "", {}, None
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            text += delta.get("content") or ""
            refusal += delta.get("refusal") or ""
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], {"id": call.get("id"), "name": None, "arguments": ""})
                entry["name"] = call.get("function", {}).get("name") or entry["name"]
                entry["arguments"] += call.get("function", {}).get("arguments", "")
            finish = choice["finish_reason"] or finish
    return {"text": text, "refusal": refusal, "tool_calls": [calls[i] for i in sorted(calls)], "finish": finish}


# -- wire formats --------------------------------------------------------------------------


def test_anthropic_stream_has_the_real_event_order_framing_and_usage(server: FakeProviderServer) -> None:
    response = post_anthropic(server, anthropic_body(user("Tell me about rivers")))

    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert response.headers["transfer-encoding"] == "chunked"
    assert response.headers["request-id"].startswith("req_")
    message = anthropic_message(response)
    events = message["events"]
    assert events[:3] == ["message_start", "content_block_start", "ping"]
    assert set(events[3:-3]) == {"content_block_delta"}
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert message["stop_reason"] == "end_turn"
    assert message["output_tokens"] == events.count("content_block_delta")
    assert message["usage"]["input_tokens"] > 0
    text = message["text"]
    assert len(text.split()) >= 100
    assert all(marker in text for marker in ("é", "日本語", "🚀", "\n"))
    assert text == text.rstrip()
    # byte-for-byte the framing of the recorded streams (padded before the final "}" since Sep 2025)
    raw = response.content
    assert raw.startswith(b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_01')
    assert re.search(
        rb'event: content_block_start\ndata: \{"type":"content_block_start","index":0,'
        rb'"content_block":\{"type":"text","text":""\} *\}\n\nevent: ping\ndata: \{"type": "ping"\}\n\n',
        raw,
    )
    assert re.search(rb'event: message_stop\ndata: \{"type":"message_stop" *\}\n\n\Z', raw)


def test_openai_stream_has_role_chunk_finish_chunk_usage_and_done(server: FakeProviderServer) -> None:
    body = openai_body(user("Tell me about rivers"), stream_options={"include_usage": True})
    response = post_openai(server, body)

    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    chunks = openai_chunks(response)
    assert chunks[-1] == "[DONE]"
    first, finish, usage = chunks[0], chunks[-3], chunks[-2]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert {(c["id"], c["created"], c["object"]) for c in chunks[:-1]} == {
        (first["id"], first["created"], "chat.completion.chunk")
    }
    assert finish["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    content_chunks = [c for c in chunks[1:-3] if c["choices"][0]["delta"].get("content")]
    assert len(content_chunks) == len(chunks) - 4
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(content_chunks)
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + len(content_chunks)
    assert response.content.endswith(b"\n\ndata: [DONE]\n\n")

    without_usage = openai_chunks(post_openai(server, openai_body(user("Tell me about rivers"))))
    assert all(chunk == "[DONE]" or chunk["choices"] for chunk in without_usage)


def test_a_chat_reasoners_usage_counts_its_reasoning_apart_as_the_real_api_does(server: FakeProviderServer) -> None:
    body = openai_body(user("Tell me about rivers"), model="deepseek-reasoner", stream_options={"include_usage": True})
    chunks = [c for c in openai_chunks(post_openai(server, body)) if c != "[DONE]"]
    reasoning = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning_content")]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    usage = chunks[-1]["usage"]
    assert reasoning
    assert usage["completion_tokens_details"] == {"reasoning_tokens": len(reasoning)}
    assert usage["completion_tokens"] == len(reasoning) + len(content)  # the reasoning is billed as output


def test_same_request_gives_the_same_bytes(server: FakeProviderServer) -> None:
    body = anthropic_body(user("Determinism, please"))
    first, second = post_anthropic(server, body), post_anthropic(server, body)
    assert first.content == second.content
    other = post_anthropic(server, anthropic_body(user("Something else")))
    assert anthropic_message(other)["text"] != anthropic_message(first)["text"]
    openai = openai_body(user("Determinism, please"))
    assert post_openai(server, openai).content == post_openai(server, openai).content


def test_same_prompt_same_text_in_both_formats(server: FakeProviderServer) -> None:
    text = anthropic_message(post_anthropic(server, anthropic_body(user("Shared prompt"))))["text"]
    assert openai_message(post_openai(server, openai_body(user("Shared prompt"))))["text"] == text


def test_words_and_exact_text_directives(server: FakeProviderServer) -> None:
    short = anthropic_message(post_anthropic(server, anthropic_body(user("Be brief [[words=7]]"))))
    assert len(short["text"].split()) == 7
    script = '<script>alert("x")</script> & <b>bold</b>'
    exact = openai_message(post_openai(server, openai_body(user(f"Echo [[text={script}]]"))))
    assert exact["text"] == script


# -- tools, refusal, thinking --------------------------------------------------------------


def test_anthropic_tool_call_then_final_answer_naming_the_result(server: FakeProviderServer) -> None:
    prompt = user("Weather in Zürich? [[tool]]")
    first = anthropic_message(post_anthropic(server, anthropic_body(prompt, tools=[WEATHER_TOOL, TIME_TOOL])))

    assert [b["type"] for b in first["content"]] == ["text", "tool_use"]
    call = first["content"][1]
    assert call["name"] == "get_weather"
    assert call["id"].startswith("toolu_")
    assert call["input"] == {"location": "Weather in Zürich?", "unit": "celsius"}
    assert first["stop_reason"] == "tool_use"
    assert "input_json_delta" in post_anthropic(server, anthropic_body(prompt, tools=[WEATHER_TOOL])).text

    assistant = {
        "role": "assistant",
        "content": [{"type": "text", "text": first["text"]}, call | {"input": call["input"]}],
    }
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "15 degrees and sunny"}
    body = anthropic_body(prompt, assistant, {"role": "user", "content": [result]}, tools=[WEATHER_TOOL])
    final = anthropic_message(post_anthropic(server, body))
    assert final["stop_reason"] == "end_turn"
    assert final["text"].startswith("get_weather returned: 15 degrees and sunny\n\n")


def test_parallel_tool_calls_and_named_tool(server: FakeProviderServer) -> None:
    tools = [WEATHER_TOOL, TIME_TOOL]
    both = anthropic_message(post_anthropic(server, anthropic_body(user("Both [[tools=2]]"), tools=tools)))
    assert [(b["type"], b.get("name")) for b in both["content"]] == [
        ("text", None),
        ("tool_use", "get_weather"),
        ("tool_use", "get_time"),
    ]
    named = anthropic_message(post_anthropic(server, anthropic_body(user("Time [[tool=get_time]]"), tools=tools)))
    assert named["content"][1]["name"] == "get_time"
    no_tools = anthropic_message(post_anthropic(server, anthropic_body(user("No tools offered [[tool]]"))))
    assert [b["type"] for b in no_tools["content"]] == ["text"]


def test_openai_tool_calls_then_tool_message(server: FakeProviderServer) -> None:
    tools = [
        {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
        for t in (WEATHER_TOOL, TIME_TOOL)
    ]
    prompt = user("Weather and time [[tools=2]]")
    response = post_openai(server, openai_body(prompt, tools=tools))
    message = openai_message(response)

    assert message["finish"] == "tool_calls"
    assert [c["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert all(c["id"].startswith("call_") for c in message["tool_calls"])
    assert json.loads(message["tool_calls"][0]["arguments"])["unit"] == "celsius"
    assert b'"tool_calls":[{"index":1,"id":"call_' in response.content

    assistant = {
        "role": "assistant",
        "content": message["text"],
        "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in message["tool_calls"]
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": c["id"], "content": f"result {i}"} for i, c in enumerate(message["tool_calls"])
    ]
    final = openai_message(post_openai(server, openai_body(prompt, assistant, *results, tools=tools)))
    assert final["finish"] == "stop"
    assert final["text"].startswith("get_weather returned: result 0\nget_time returned: result 1\n\n")


def test_refusal_in_both_formats(server: FakeProviderServer) -> None:
    anthropic = anthropic_message(post_anthropic(server, anthropic_body(user("Do it [[refuse]]"))))
    assert anthropic["stop_reason"] == "refusal"
    assert anthropic["text"]
    response = post_openai(server, openai_body(user("Do it [[refuse]]")))
    first = openai_chunks(response)[0]["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": None, "refusal": ""}
    message = openai_message(response)
    assert message["refusal"] == anthropic["text"]
    assert message["text"] == ""
    assert message["finish"] == "stop"


THINKING = {"type": "enabled", "budget_tokens": 1024}


def test_thinking_block_comes_first_and_must_come_back_unmodified(server: FakeProviderServer) -> None:
    prompt = user("Think first [[words=40]]")
    first = anthropic_message(post_anthropic(server, anthropic_body(prompt, thinking=THINKING)))
    thinking, text = first["content"]
    assert thinking["type"] == "thinking"
    assert thinking["signature"]
    assert text["type"] == "text"

    partial = text["text"][:50].rstrip()
    assistant = {"role": "assistant", "content": [thinking, {"type": "text", "text": partial}]}
    body = anthropic_body(prompt, assistant, user(CONTINUE_INSTRUCTION), thinking=THINKING)
    rest = anthropic_message(post_anthropic(server, body))
    # like the real API, every response starts with a thinking block, a continuation's too
    new_thinking, rest_text = rest["content"]
    assert (new_thinking["type"], rest_text["type"]) == ("thinking", "text")
    assert new_thinking["signature"]
    assert new_thinking["thinking"] != thinking["thinking"]
    assert partial + rest["text"] == text["text"]
    # the switch: a continuation without one
    quiet = user("Think first [[words=40]] [[no_continuation_thinking]]")
    whole = anthropic_message(post_anthropic(server, anthropic_body(quiet, thinking=THINKING)))
    q_thinking, q_text = whole["content"]
    q_partial = q_text["text"][:50].rstrip()
    q_assistant = {"role": "assistant", "content": [q_thinking, {"type": "text", "text": q_partial}]}
    q_body = anthropic_body(quiet, q_assistant, user(CONTINUE_INSTRUCTION), thinking=THINKING)
    assert [b["type"] for b in anthropic_message(post_anthropic(server, q_body))["content"]] == ["text"]

    tampered = {"role": "assistant", "content": [thinking | {"thinking": thinking["thinking"] + "!"}, text]}
    response = post_anthropic(server, anthropic_body(prompt, tampered, user(CONTINUE_INSTRUCTION), thinking=THINKING))
    assert response.status_code == 400
    assert "cannot be modified" in response.json()["error"]["message"]


def _tool_loop(assistant_content: list[dict[str, Any]], thinking: dict[str, Any]) -> dict[str, Any]:
    """A tool loop's second request: the call, then its result."""
    result = {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "12:00"}
    return anthropic_body(
        user("What time is it? [[tool]]"),
        {"role": "assistant", "content": assistant_content},
        {"role": "user", "content": [result]},
        tools=[TIME_TOOL],
        thinking=thinking,
    )


CALL = {"type": "tool_use", "id": "toolu_01A", "name": "get_time", "input": {}}


@pytest.mark.parametrize("first", [[CALL], [{"type": "text", "text": "Let me check."}, CALL]])
def test_a_tool_loop_under_manual_thinking_needs_the_call_to_follow_its_thinking(
    server: FakeProviderServer, first: list[dict[str, Any]]
) -> None:
    """As the real API: the assistant message a tool_result answers starts with its thinking."""
    response = post_anthropic(server, _tool_loop(first, THINKING))
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith(
        f"messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first[0]['type']}`. "
        "When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding "
        "the lastmost set of `tool_use` and `tool_result` blocks)"
    )
    # adaptive thinking does not ask for it, and neither does a request without thinking
    assert post_anthropic(server, _tool_loop(first, {"type": "adaptive"})).status_code == 200
    assert post_anthropic(server, _tool_loop(first, {"type": "disabled"})).status_code == 200


def test_a_tool_loop_whose_call_follows_its_thinking_is_accepted(server: FakeProviderServer) -> None:
    body = anthropic_body(user("What time is it? [[tool=get_time]]"), tools=[TIME_TOOL], thinking=THINKING)
    first = anthropic_message(post_anthropic(server, body))
    assert first["content"][0]["type"] == "thinking"
    calls = [b for b in first["content"] if b["type"] == "tool_use"]
    answered = [{"type": "tool_result", "tool_use_id": c["id"], "content": "12:00"} for c in calls]
    follow = {**body, "messages": [*body["messages"], {"role": "assistant", "content": first["content"]}]}
    follow["messages"].append({"role": "user", "content": answered})
    assert post_anthropic(server, follow).status_code == 200
    # an earlier, finished tool loop may leave its thinking out: only the last one is checked
    later = {**follow, "messages": [*follow["messages"], {"role": "assistant", "content": "It is noon."}]}
    later["messages"].append(user("Thanks"))
    earlier = later["messages"][1]
    later["messages"][1] = {**earlier, "content": [b for b in earlier["content"] if b["type"] != "thinking"]}
    assert post_anthropic(server, later).status_code == 200


# -- continuation ---------------------------------------------------------------------------


def test_anthropic_prefill_continues_without_repeating_the_prefix(server: FakeProviderServer) -> None:
    prompt = user("Continue me")
    full = anthropic_message(post_anthropic(server, anthropic_body(prompt)))["text"]
    prefix = full[:77].rstrip()
    response = post_anthropic(server, anthropic_body(prompt, {"role": "assistant", "content": prefix}))

    rest = anthropic_message(response)
    assert rest["stop_reason"] == "end_turn"
    assert prefix + rest["text"] == full
    entry = server.log[-1]
    assert (entry.understood_as, entry.prefix_chars, entry.prefix_matched) == ("prefill", len(prefix), True)
    assert (
        entry.output_tokens
        == rest["output_tokens"]
        < anthropic_message(post_anthropic(server, anthropic_body(prompt)))["output_tokens"]
    )


def test_anthropic_prefill_inside_the_text_before_a_tool_call(server: FakeProviderServer) -> None:
    prompt = user("Look it up [[tool]]")
    full = anthropic_message(post_anthropic(server, anthropic_body(prompt, tools=[WEATHER_TOOL])))
    prefix = full["text"][:20].rstrip()
    assistant = {"role": "assistant", "content": [{"type": "text", "text": prefix}]}
    rest = anthropic_message(post_anthropic(server, anthropic_body(prompt, assistant, tools=[WEATHER_TOOL])))
    assert [b["type"] for b in rest["content"]] == ["text", "tool_use"]
    assert prefix + rest["text"] == full["text"]
    assert rest["content"][1] == full["content"][1]
    assert rest["stop_reason"] == "tool_use"


def test_prefill_that_is_not_a_prefix_gets_the_answer_from_its_start(server: FakeProviderServer) -> None:
    prompt = user("Continue me")
    full = anthropic_message(post_anthropic(server, anthropic_body(prompt)))["text"]
    rest = anthropic_message(
        post_anthropic(server, anthropic_body(prompt, {"role": "assistant", "content": "Wrong start"}))
    )
    assert rest["text"] == full
    assert server.log[-1].prefix_matched is False


@pytest.mark.parametrize(
    ("model", "extra", "content", "message"),
    [
        ("claude-sonnet-4-5", {}, "Ends with a space ", "final assistant content cannot end with trailing whitespace"),
        (
            "claude-sonnet-4-5",
            {},
            "Ends with a newline\n",
            "final assistant content cannot end with trailing whitespace",
        ),
        ("claude-sonnet-4-5", {"thinking": THINKING}, "Some text", "must start with a thinking block"),
        ("fake-noprefill", {}, "Some text", "does not support assistant message prefill"),
        ("claude-opus-4-6", {}, "Some text", "does not support assistant message prefill"),
        ("claude-opus-4-8-20260901", {}, "Some text", "does not support assistant message prefill"),
        ("claude-sonnet-5", {}, "Some text", "does not support assistant message prefill"),
    ],
)
def test_prefill_rules_answer_400_like_the_real_api(
    server: FakeProviderServer, model: str, extra: dict[str, Any], content: str, message: str
) -> None:
    body = anthropic_body(user("Hi"), {"role": "assistant", "content": content}, model=model, **extra)
    response = post_anthropic(server, body)
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"]
    assert error["request_id"] == response.headers["request-id"]


def test_prefill_is_accepted_by_older_models(server: FakeProviderServer) -> None:
    for model in ("claude-sonnet-4-5", "claude-opus-4-5", "claude-3-7-sonnet-latest"):
        body = anthropic_body(user("Hi"), {"role": "assistant", "content": "Hello"}, model=model)
        assert post_anthropic(server, body).status_code == 200


def test_anthropic_continue_message_carries_only_the_rest(server: FakeProviderServer) -> None:
    prompt = user("Continue via message")
    full = anthropic_message(post_anthropic(server, anthropic_body(prompt)))["text"]
    partial = full[:64]  # trailing whitespace is fine here: the assistant message is not last
    body = anthropic_body(
        prompt, {"role": "assistant", "content": partial}, user(CONTINUE_INSTRUCTION), model="claude-opus-4-6"
    )
    rest = anthropic_message(post_anthropic(server, body))
    assert partial + rest["text"] == full
    assert server.log[-1].understood_as == "continue_message"


def test_openai_continue_message_carries_only_the_rest(server: FakeProviderServer) -> None:
    prompt = user("Continue via message")
    full = openai_message(post_openai(server, openai_body(prompt)))["text"]
    partial = full[:64]
    body = openai_body(prompt, {"role": "assistant", "content": partial}, user(CONTINUE_INSTRUCTION))
    assert partial + openai_message(post_openai(server, body))["text"] == full
    entry = server.log[-1]
    assert (entry.understood_as, entry.prefix_chars, entry.prefix_matched) == ("continue_message", 64, True)


def test_openai_trailing_assistant_is_a_finished_turn_but_prefix_flag_continues(server: FakeProviderServer) -> None:
    prompt = user("OpenAI has no prefill")
    full = openai_message(post_openai(server, openai_body(prompt)))["text"]
    partial = full[:40]

    bare = openai_message(post_openai(server, openai_body(prompt, {"role": "assistant", "content": partial})))
    assert bare["text"] == full  # a new answer from its start: a client appending it would duplicate text
    assert server.log[-1].understood_as == "new_turn_after_assistant"

    flagged = {"role": "assistant", "content": partial, "prefix": True}
    rest = openai_message(post_openai(server, openai_body(prompt, flagged), path="/beta/chat/completions"))
    assert partial + rest["text"] == full
    assert server.log[-1].understood_as == "prefix_flag"
    assert server.log[-1].path == "/beta/chat/completions"


# -- requests the real APIs reject -----------------------------------------------------------


def test_missing_key_is_401_in_each_shape_and_keys_never_reach_the_log(server: FakeProviderServer) -> None:
    response = HTTP.post(
        server.base_url + "/v1/messages", json=anthropic_body(user("Hi")), headers={"anthropic-version": "2023-06-01"}
    )
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    response = HTTP.post(server.base_url + "/v1/chat/completions", json=openai_body(user("Hi")))
    assert response.status_code == 401
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    post_anthropic(server, anthropic_body(user("Hi")))
    post_openai(server, openai_body(user("Hi")))
    dumped = json.dumps([entry.to_dict() for entry in server.log])
    dumped += HTTP.get(server.base_url + "/_fake/log").text
    assert "secret-key" not in dumped
    assert all("x-api-key" not in e.headers and "authorization" not in e.headers for e in server.log)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_malformed_requests_are_400_in_the_provider_shape(server: FakeProviderServer, provider: str) -> None:
    is_anthropic = provider == "anthropic"
    url = server.base_url + ("/v1/messages" if is_anthropic else "/v1/chat/completions")
    auth = ANTHROPIC_HEADERS if is_anthropic else OPENAI_HEADERS
    good = anthropic_body(user("Hi")) if is_anthropic else openai_body(user("Hi"))
    cases = [
        HTTP.post(url, content=b"{not json", headers={**auth, "content-type": "application/json"}),
        HTTP.post(url, content=json.dumps(good).encode(), headers={**auth, "content-type": "text/plain"}),
        HTTP.post(url, json={k: v for k, v in good.items() if k != "model"}, headers=auth),
        HTTP.post(url, json={k: v for k, v in good.items() if k != "messages"}, headers=auth),
        HTTP.post(url, json=good | {"messages": []}, headers=auth),
        HTTP.post(url, json=good | {"messages": [{"role": "robot", "content": "x"}]}, headers=auth),
    ]
    for response in cases:
        assert response.status_code == 400, response.text
        body = response.json()
        if is_anthropic:
            assert body["type"] == "error"
            assert body["error"]["type"] == "invalid_request_error"
        else:
            assert body["error"]["type"] == "invalid_request_error"
            assert "param" in body["error"]
    assert [e.status for e in server.log] == [400] * len(cases)


def test_tool_calls_and_results_must_pair_up(server: FakeProviderServer) -> None:
    call = {"type": "tool_use", "id": "toolu_x", "name": "get_weather", "input": {}}
    unanswered = anthropic_body(user("Hi"), {"role": "assistant", "content": [call]}, user("next"))
    response = post_anthropic(server, unanswered)
    assert response.status_code == 400
    assert "without `tool_result` blocks" in response.json()["error"]["message"]
    stray = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}
    assert "unexpected `tool_use_id`" in post_anthropic(server, anthropic_body(stray)).json()["error"]["message"]

    orphan = openai_body(user("Hi"), {"role": "tool", "tool_call_id": "call_x", "content": "x"})
    assert "must be a response to a preceeding message" in post_openai(server, orphan).json()["error"]["message"]
    calls = [{"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    missing = openai_body(user("Hi"), {"role": "assistant", "content": None, "tool_calls": calls}, user("next"))
    assert "did not have response messages: call_x" in post_openai(server, missing).json()["error"]["message"]


def test_anthropic_requires_version_header_and_rejects_empty_blocks(server: FakeProviderServer) -> None:
    response = HTTP.post(server.base_url + "/v1/messages", json=anthropic_body(user("Hi")), headers={"x-api-key": "k"})
    assert response.status_code == 400
    assert "anthropic-version" in response.json()["error"]["message"]
    empty = {"role": "assistant", "content": [{"type": "text", "text": ""}]}
    assert post_anthropic(server, anthropic_body(user("Hi"), empty, user("again"))).status_code == 400


def test_anthropic_refuses_a_content_block_of_another_providers_format(server: FakeProviderServer) -> None:
    """A block the Messages API does not know (a Responses search call carried over by a
    failover) is a 400, as the API answers it; the types it knows pass."""
    foreign = {"type": "web_search_call", "id": "ws_1", "status": "completed"}
    said = {"type": "text", "text": "Searched."}
    body = anthropic_body(user("Hi"), {"role": "assistant", "content": [foreign, said]}, user("next"))
    response = post_anthropic(server, body)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith("messages.1.content.0: Input tag 'web_search_call' found using 'type'")
    assert "'server_tool_use'" in message
    known = anthropic_body(user("Hi"), {"role": "assistant", "content": [said]}, user("next"))
    assert post_anthropic(server, known).status_code == 200


# -- the rest of the surface --------------------------------------------------------------


def test_non_streaming_requests_get_a_whole_message(server: FakeProviderServer) -> None:
    streamed = anthropic_message(post_anthropic(server, anthropic_body(user("Whole"))))["text"]
    whole = post_anthropic(server, anthropic_body(user("Whole"), stream=False)).json()
    assert whole["content"] == [{"type": "text", "text": streamed}]
    assert whole["usage"]["output_tokens"] == server.log[-1].output_tokens
    completion = post_openai(server, openai_body(user("Whole"), stream=False)).json()
    assert completion["choices"][0]["message"]["content"] == streamed
    assert completion["choices"][0]["finish_reason"] == "stop"


def test_control_endpoints_set_faults_read_the_log_and_reset(server: FakeProviderServer) -> None:
    base = server.base_url
    answer = HTTP.post(base + "/_fake/faults", json={"scenario": "ctl", "faults": ["cut:bytes=50", {"kind": "ok"}]})
    assert answer.json() == {"scenario": "ctl", "faults": [{"kind": "cut", "bytes": 50}, {"kind": "ok"}]}
    assert HTTP.get(base + "/_fake/faults").json()["scenarios"]["ctl"][0] == {"kind": "cut", "bytes": 50}
    assert HTTP.post(base + "/_fake/faults", json={"faults": ["cut:nothing"]}).status_code == 400

    with pytest.raises(httpx.RemoteProtocolError):
        post_anthropic(server, anthropic_body(user("Hi")), headers={"x-fake-scenario": "ctl"})
    entries = HTTP.get(base + "/_fake/log", params={"scenario": "ctl"}).json()["entries"]
    assert len(entries) == 1
    assert entries[0]["fault"] == {"kind": "cut", "bytes": 50}
    assert entries[0]["bytes_sent"] == 50
    assert entries[0]["request"]["messages"] == [user("Hi")]

    assert HTTP.post(base + "/_fake/reset", json={"scenario": "ctl"}).status_code == 200
    assert HTTP.get(base + "/_fake/log").json()["entries"] == []
    assert server.pending_faults("ctl") == []
    assert HTTP.get(base + "/nowhere").status_code == 404


async def test_runs_inside_an_existing_event_loop() -> None:
    async with FakeProviderServer() as fake, httpx.AsyncClient() as client:
        response = await client.post(
            fake.base_url + "/v1/chat/completions", json=openai_body(user("Async")), headers=OPENAI_HEADERS
        )
        assert response.status_code == 200
        assert response.content.endswith(b"data: [DONE]\n\n")
        assert fake.log[0].completed


def test_management_command_serves_and_prints_its_url() -> None:
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(root)}
    command = [sys.executable, "-m", "django", "streamrecover_fake_provider", "--port", "0", "--faults", "status:529"]
    process = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("Fake provider listening on http://127.0.0.1:"), line or process.stderr.read()
        url = line.split()[-1] + "/v1/messages"
        body = anthropic_body(user("Hi"))
        assert HTTP.post(url, json=body, headers=ANTHROPIC_HEADERS).status_code == 529  # the --faults script
        assert HTTP.post(url, json=body, headers=ANTHROPIC_HEADERS).status_code == 200  # then requests succeed
    finally:
        process.terminate()
        process.wait(timeout=10)


# -- a server-tool turn the API pauses --------------------------------------------------------

WEB_SEARCH = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]
SEARCH_PROMPT = user("What happened at sea? [[search]]")


def _whole_answer(server: FakeProviderServer, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body = anthropic_body(*messages, tools=WEB_SEARCH, stream=False, model="claude-opus-4-6", **extra)
    response = post_anthropic(server, body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_paused_search_turn_goes_on_when_its_answer_is_sent_back_as_it_is(server: FakeProviderServer) -> None:
    """``[[pause]]``: the API pauses right after the search call, before running it. The paused
    answer sent back as the last assistant message (a model that takes no prefill takes this
    too) gets the search's result and the rest: together, the unpaused answer."""
    unpaused = _whole_answer(server, SEARCH_PROMPT)
    assert [b["type"] for b in unpaused["content"]] == ["text", "server_tool_use", "web_search_tool_result", "text"]
    paused = _whole_answer(server, SEARCH_PROMPT, system="[[pause]]")
    assert paused["stop_reason"] == "pause_turn"
    assert [b["type"] for b in paused["content"]] == ["text", "server_tool_use"]
    sent_back = {"role": "assistant", "content": paused["content"]}
    rest = _whole_answer(server, SEARCH_PROMPT, sent_back, system="[[pause]]")
    assert rest["stop_reason"] == "end_turn"
    assert paused["content"] + rest["content"] == unpaused["content"]
    streamed = anthropic_message(
        post_anthropic(server, anthropic_body(SEARCH_PROMPT, tools=WEB_SEARCH, system="[[pause]]"))
    )
    assert (streamed["stop_reason"], streamed["content"]) == ("pause_turn", paused["content"])


def test_a_server_tool_call_without_its_result_is_refused_but_in_the_last_message(server: FakeProviderServer) -> None:
    """As the real API answers it: history may not hold a server tool call whose result is not in
    the same message, so a paused answer and its continuation are one message there."""
    paused = _whole_answer(server, SEARCH_PROMPT, system="[[pause]]")["content"]
    rest = _whole_answer(server, SEARCH_PROMPT, {"role": "assistant", "content": paused}, system="[[pause]]")["content"]
    call = paused[1]["id"]
    refused = (
        [SEARCH_PROMPT, {"role": "assistant", "content": paused}, user("And then?")],
        [SEARCH_PROMPT, {"role": "assistant", "content": paused}, {"role": "assistant", "content": rest}, user("More")],
    )
    for messages in refused:
        response = post_anthropic(server, anthropic_body(*messages, tools=WEB_SEARCH))
        assert response.status_code == 400
        assert response.json()["error"]["message"] == (
            f"messages.1: `web_search` tool use with id `{call}` was found without a corresponding "
            "`web_search_tool_result` block"
        )
    whole = [SEARCH_PROMPT, {"role": "assistant", "content": paused + rest}, user("And then?")]
    assert post_anthropic(server, anthropic_body(*whole, tools=WEB_SEARCH)).status_code == 200


def _assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _went_on(server: FakeProviderServer, *messages: dict[str, Any], prompt: dict[str, Any] = SEARCH_PROMPT) -> Any:
    """The rest of the paused search answer after ``messages``, which must have been recognised as
    its beginning (a model that does not recognise it starts over)."""
    rest = _whole_answer(server, prompt, *messages, system="[[pause]]")["content"]
    assert server.log[-1].prefix_matched is True, [b["type"] for b in rest]
    return rest


def test_a_paused_turns_answer_goes_on_after_any_number_of_continue_message_rounds(server: FakeProviderServer) -> None:
    """The answer so far of a paused turn sent back, then broken again and again, each time sent
    back with a continue message after the text it got (a round per break): the model goes on
    from the whole assistant content so far, its text cut off in one round and carried on in the
    next, and the rest is the unpaused answer's."""
    paused = _whole_answer(server, SEARCH_PROMPT, system="[[pause]]")["content"]
    result, answer = _went_on(server, _assistant(*paused))
    text = answer["text"]
    carry_on = user(CONTINUE_INSTRUCTION)
    for rounds in (1, 2, 3):
        cuts = [len(text) * k // (rounds + 1) for k in range(1, rounds + 1)]
        pieces = [text[start:end] for start, end in zip([0, *cuts[:-1]], cuts, strict=True)]
        messages = [_assistant(*paused, result, _text(pieces[0])), carry_on]
        for piece in pieces[1:]:
            messages += [_assistant(_text(piece)), carry_on]
        rest = _went_on(server, *messages)
        assert server.log[-1].understood_as == "continue_message"
        assert "".join(b["text"] for b in rest) == text[cuts[-1] :], f"{rounds} rounds"


def test_a_turn_paused_again_after_a_continue_message_round_goes_on_from_the_whole_answer(
    server: FakeProviderServer,
) -> None:
    """A break before the first search, carried on after a continue message, and the answer then
    paused twice, each time sent back as the last assistant message after that round, and broken
    once more: every request goes on where the answer so far (all its messages) ends."""
    prompt = user("What happened at sea? [[search=2]]")
    opening, *searches, text = _whole_answer(server, prompt)["content"]
    assert [b["type"] for b in searches] == ["server_tool_use", "web_search_tool_result"] * 2
    first = opening["text"][: len(opening["text"]) // 2]
    carry_on = user(CONTINUE_INSTRUCTION)
    rounds = [_assistant(_text(first)), carry_on]
    so_far = [_text(opening["text"][len(first) :]), searches[0]]  # paused after the first call
    assert _went_on(server, *rounds, _assistant(*so_far), prompt=prompt) == searches[1:3]  # and the second
    assert server.log[-1].understood_as == "paused_turn"
    so_far += searches[1:3]
    assert _went_on(server, *rounds, _assistant(*so_far), prompt=prompt) == [searches[3], text]
    half = text["text"][: len(text["text"]) // 2]
    rest = _went_on(server, *rounds, _assistant(*so_far, searches[3], _text(half)), carry_on, prompt=prompt)
    assert "".join(b["text"] for b in rest) == text["text"][len(half) :]
