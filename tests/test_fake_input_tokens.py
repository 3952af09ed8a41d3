"""The fake counts input as it bills output: re-sending a prefix as input costs the pieces
(tokens) generating it cost, a continue instruction costs its own, and the free
``/v1/messages/count_tokens`` endpoint says what ``message_start`` would."""

from __future__ import annotations

import json
import uuid

import httpx

from streamrecover.engine.contract import CONTINUE_INSTRUCTION
from streamrecover.testing.fake.model import CONTINUE_FRAMING_TOKENS, split_pieces

PROMPT = "Tell me about rivers [[words=60]]"
HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01", "content-type": "application/json"}


def _stream(server, body: dict) -> list[dict]:
    headers = {**HEADERS, "x-fake-scenario": uuid.uuid4().hex}
    raw = httpx.post(f"{server.base_url}/v1/messages", json={**body, "stream": True}, headers=headers).text
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]


def _count(server, body: dict) -> int:
    fields = {k: v for k, v in body.items() if k in ("model", "messages", "system", "tools", "thinking")}
    response = httpx.post(f"{server.base_url}/v1/messages/count_tokens", json=fields, headers=HEADERS)
    assert response.status_code == 200, response.text
    return response.json()["input_tokens"]


def _input_and_deltas(events: list[dict]) -> tuple[int, list[str]]:
    start = next(e for e in events if e["type"] == "message_start")
    deltas = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]
    return start["message"]["usage"]["input_tokens"], deltas


def test_a_prefix_sent_back_as_input_costs_what_generating_it_cost(fake_server):
    fresh = {"model": "claude-3-7-sonnet", "max_tokens": 1024, "messages": [{"role": "user", "content": PROMPT}]}
    base, deltas = _input_and_deltas(_stream(fake_server, fresh))
    for n in (1, 7, 20):
        prefix = "".join(deltas[:n])
        prefill = {**fresh, "messages": [*fresh["messages"], {"role": "assistant", "content": prefix.rstrip()}]}
        continued, _ = _input_and_deltas(_stream(fake_server, prefill))
        assert continued - base == n  # a piece cut by the stripped whitespace still counts whole
        assert _count(fake_server, prefill) == continued
        message = {
            **fresh,
            "messages": [
                *fresh["messages"],
                {"role": "assistant", "content": prefix},
                {"role": "user", "content": CONTINUE_INSTRUCTION},
            ],
        }
        asked, _ = _input_and_deltas(_stream(fake_server, message))
        assert asked - base == n + len(split_pieces(CONTINUE_INSTRUCTION, 1, 6)) + CONTINUE_FRAMING_TOKENS
    assert _count(fake_server, fresh) == base


def test_token_counts_are_free(fake_server):
    before = len(fake_server.log)
    fresh = {"model": "claude-3-7-sonnet", "messages": [{"role": "user", "content": PROMPT}]}
    assert _count(fake_server, fresh) > 0
    assert len(fake_server.log) == before  # nothing generated, nothing billed


def test_a_count_takes_a_request_with_extended_thinking(fake_server):
    # the real endpoint takes no max_tokens; the fake checked a made-up one against budget_tokens
    thinking = {
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": PROMPT}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    assert _count(fake_server, thinking) == _count(fake_server, {**thinking, "thinking": {"type": "disabled"}})
