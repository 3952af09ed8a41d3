"""The fake continues a recorded answer the way the real model would: with the rest of it.

A continuation request (a prefill, or the kept blocks and a continue message) of a scenario
that serves a recording gets the rest of the recorded answer from the cut on: the rest of
the cut text block, then every later block with fresh indices (text with its citations,
server tool calls and results, thinking when the request enables it), in the recording's
own encoding, and the billing log counts only what this response sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from streamrecover.engine.contract import CONTINUE_INSTRUCTION
from streamrecover.testing.fake import FakeProviderServer

from .recorded_reading import CITATION, SEARCH_QUERY, SEARCH_RESULT, anthropic_stream, read, web_search_stream

HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}
SERVER_TOOL_USE = {"type": "server_tool_use", "id": "srvtoolu_01HandBuilt", "name": "web_search", "input": SEARCH_QUERY}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProviderServer]:
    with FakeProviderServer() as fake:
        yield fake


def _continue(server: FakeProviderServer, raw: bytes, messages: list[dict[str, Any]], **body: Any) -> bytes:
    scenario = f"recording-{len(server.log)}"
    server.set_recording(scenario, raw)
    request = {"model": "claude-sonnet-4-5", "max_tokens": 4096, "stream": True, "messages": messages, **body}
    response = httpx.post(
        f"{server.base_url}/v1/messages", json=request, headers={**HEADERS, "x-fake-scenario": scenario}
    )
    assert response.status_code == 200, response.text
    return response.content


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _payloads(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in raw.decode().splitlines() if line.startswith("data:")]


def test_a_prefill_gets_the_rest_of_the_cut_block_then_every_later_block(server: FakeProviderServer) -> None:
    # the kept text lost its trailing space (a prefill may not end with one): the rest starts with it
    prefix = [SERVER_TOOL_USE, SEARCH_RESULT, {"type": "text", "text": "Here is what I found:"}]
    raw = _continue(server, web_search_stream(), [_user("Search"), {"role": "assistant", "content": prefix}])
    assert read(raw, "anthropic").content == [
        {"type": "text", "text": " "},
        {"type": "text", "text": "the lighthouse was relit — 🚀.", "citations": [CITATION]},
        {"type": "text", "text": " That is all."},
    ]
    payloads = _payloads(raw)
    assert [p["index"] for p in payloads if p["type"] == "content_block_start"] == [0, 1, 2]
    assert payloads[0]["message"]["id"] == "msg_01HandBuiltStream0000000"  # the recording's own events
    assert b"event: content_block_delta\ndata: {" in raw
    entry = server.log[-1]
    assert (entry.understood_as, entry.prefix_matched) == ("prefill", True)
    assert entry.billed_text == " the lighthouse was relit — 🚀. That is all."
    assert entry.billed_output_tokens == entry.output_tokens == 4
    assert payloads[-2]["usage"]["output_tokens"] == 4


def test_a_continue_message_cut_inside_a_cited_block_gets_its_rest_without_its_citations_again(
    server: FakeProviderServer,
) -> None:
    kept = [
        SERVER_TOOL_USE,
        SEARCH_RESULT,
        {"type": "text", "text": "Here is what I found: "},
        {"type": "text", "text": "the lighth", "citations": [CITATION]},
    ]
    messages = [_user("Search"), {"role": "assistant", "content": kept}, _user(CONTINUE_INSTRUCTION)]
    raw = _continue(server, web_search_stream(), messages, model="claude-sonnet-4-6")
    payloads = _payloads(raw)
    first = next(p for p in payloads if p["type"] == "content_block_start")
    assert first["content_block"] == {"citations": [], "type": "text", "text": ""}  # still a cited span
    assert not any(p.get("delta", {}).get("type") == "citations_delta" for p in payloads)
    assert [b["text"] for b in read(raw, "anthropic").content] == ["ouse was relit — 🚀.", " That is all."]
    assert server.log[-1].understood_as == "continue_message"


THINKING = {"type": "thinking", "thinking": "", "signature": ""}
TEXT_THINKING_TEXT = anthropic_stream(
    [
        (
            {"type": "text", "text": ""},
            [{"type": "text_delta", "text": "First, "}, {"type": "text_delta", "text": "this."}],
        ),
        (
            THINKING,
            [
                {"type": "thinking_delta", "thinking": "Then the rest."},
                {"type": "signature_delta", "signature": "c2ln"},
            ],
        ),
        ({"type": "text", "text": ""}, [{"type": "text_delta", "text": "The rest."}]),
    ]
)


@pytest.mark.parametrize("thinking", [True, False])
def test_thinking_after_the_cut_is_sent_only_when_the_request_enables_it(
    server: FakeProviderServer, thinking: bool
) -> None:
    messages = [
        _user("Go"),
        {"role": "assistant", "content": [{"type": "text", "text": "First, th"}]},
        _user(CONTINUE_INSTRUCTION),
    ]
    extra = {"thinking": {"type": "enabled", "budget_tokens": 1024}} if thinking else {}
    raw = _continue(server, TEXT_THINKING_TEXT, messages, **extra)
    kinds = [b["type"] for b in read(raw, "anthropic").content]
    assert kinds == (["text", "thinking", "text"] if thinking else ["text", "text"])


def test_a_prefix_that_is_not_the_recordings_beginning_gets_the_plan_answer(server: FakeProviderServer) -> None:
    messages = [_user("Go"), {"role": "assistant", "content": [{"type": "text", "text": "Something else"}]}]
    _continue(server, TEXT_THINKING_TEXT, messages)
    assert server.log[-1].prefix_matched is False
