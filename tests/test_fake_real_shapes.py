"""The fake provider is no kinder than the real APIs: what it refuses and the shape of its bytes.

Each test compares the fake's answer with a fact about the real API: its documented rules, or
the streams recorded from it (read from beside the repository; skipped, saying where it
looked, when they are not there). A fake cleaner than the real thing hides the product's
bugs: a client that only ever sees compact JSON, or prefills that succeed, is not tested.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import httpx
import pytest

from streamrecover.engine.sse import SSEDecoder
from streamrecover.providers.anthropic import NO_PREFILL_MODELS
from streamrecover.testing.fake import FakeProviderServer

from . import fake_fixtures
from .fake_fixtures import HTTP, TIME_TOOL
from .recorded_reading import read
from .streams import RECORDINGS, REFERENCE

ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-key", "anthropic-version": "2023-06-01"}
OPENAI_HEADERS = {"authorization": "Bearer sk-openai-key"}
PREFILL_REFUSED = (
    "This model does not support assistant message prefill. The conversation must end with a user message."
)

# this module's fake provider, reset before each test
server = fake_fixtures.server
clean_server = fake_fixtures.clean_server


def _payloads(raw: bytes) -> list[tuple[str | None, str]]:
    """Each event's name and its data exactly as sent (the SSE framing removed, nothing else)."""
    decoder = SSEDecoder()
    return [(event.event, event.data) for event in decoder.feed(raw) + decoder.close()]


def _prefill(server: FakeProviderServer, model: str) -> httpx.Response:
    body = {
        "model": model,
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well"}],
    }
    return HTTP.post(server.base_url + "/v1/messages", json=body, headers=ANTHROPIC_HEADERS)


# -- 1. prefill: refused wherever the real API refuses it --------------------------------------


def _listed_models() -> list[str]:
    """A model id for each of the product's no-prefill globs, bare and as Bedrock names it."""
    names = [pattern.strip("*") for pattern in NO_PREFILL_MODELS if "claude" in pattern]
    return [*names, *(f"anthropic.{name}-v1:0" for name in names)]


@pytest.mark.parametrize(
    "model",
    [
        *_listed_models(),
        "claude-mythos-preview",
        "anthropic.claude-opus-4-6-v1",
        "claude-sonnet-4-6@20260201",
        # newer than 4.6, in no list: the real API refuses prefill from Claude 4.6 on
        "claude-opus-5",
        "claude-haiku-5",
        "claude-fable-5-1",
        "claude-opus-4-9",
        "claude-haiku-4-6",
        "us.anthropic.claude-haiku-5-v1:0",
    ],
)
def test_a_prefill_is_refused_on_every_model_the_real_api_refuses_it(server: FakeProviderServer, model: str) -> None:
    response = _prefill(server, model)
    assert response.status_code == 400
    body = response.json()
    assert (body["type"], body["error"]["type"]) == ("error", "invalid_request_error")
    assert body["error"]["message"] == PREFILL_REFUSED


@pytest.mark.parametrize(
    "model",
    ["claude-sonnet-4-5-20250929", "claude-haiku-4-5", "claude-sonnet-4-20250514", "claude-3-7-sonnet-latest"],
)
def test_a_prefill_is_still_accepted_by_models_before_4_6(server: FakeProviderServer, model: str) -> None:
    assert _prefill(server, model).status_code == 200


# -- 2. Anthropic: padded JSON and cumulative usage, as recorded since September 2025 -----------

_PADDING = re.compile(r"( *)}$")
# recordings whose bytes are the API's own (cassettes); the vercel/ai fixtures were re-serialized
PADDED_RECORDINGS = ("anthropic_text_multiparagraph.sse", "anthropic_thinking_text_endash.sse")


def _padding_facts(raw: bytes) -> dict[str, Any]:
    """How a stream pads: the share of non-ping payloads padded, the longest padding, the ping
    as sent, the keys of ``message_start``'s and ``message_delta``'s usage."""
    payloads = _payloads(raw)
    pads = [len(m.group(1)) for name, data in payloads if name != "ping" and (m := _PADDING.search(data))]
    others = [data for name, data in payloads if name != "ping"]
    objects = {name: json.loads(data) for name, data in payloads}
    return {
        "padded_share": sum(1 for n in pads if n) / len(others),
        "longest": max(pads),
        "pings": {data for name, data in payloads if name == "ping"},
        "start_usage": set(objects["message_start"]["message"]["usage"]),
        "delta_usage": set(objects["message_delta"]["usage"]),
    }


def _anthropic_stream(server: FakeProviderServer, prompt: str, **extra: Any) -> bytes:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 4000, "stream": True, **extra}
    body["messages"] = [{"role": "user", "content": prompt}]
    response = HTTP.post(server.base_url + "/v1/messages", json=body, headers=ANTHROPIC_HEADERS)
    assert response.status_code == 200
    return response.content


@pytest.mark.parametrize("recording", PADDED_RECORDINGS)
def test_anthropic_streams_are_padded_and_repeat_usage_like_the_recordings(
    server: FakeProviderServer, recording: str
) -> None:
    real = _padding_facts(RECORDINGS.file(recording).read_bytes())
    thinking = {"type": "enabled", "budget_tokens": 1024}
    fake = _padding_facts(_anthropic_stream(server, "Tell me [[words=40]]", thinking=thinking))
    assert real["padded_share"] > 0.75  # the fact the fake follows
    assert fake["padded_share"] > 0.75
    assert 0 < fake["longest"] <= real["longest"]
    assert fake["pings"] == real["pings"] == {'{"type": "ping"}'}
    assert fake["delta_usage"] == real["delta_usage"]  # input and cache counts repeated at the end
    assert fake["start_usage"] <= real["start_usage"] | {"inference_geo"}
    assert {"cache_creation", "service_tier"} <= fake["start_usage"]


def test_the_reference_padded_stream_says_the_same(server: FakeProviderServer) -> None:
    real = _padding_facts(REFERENCE.file("anthropic_thinking_recorded_padded.sse").read_bytes())
    fake = _padding_facts(_anthropic_stream(server, "Tell me [[words=40]]"))
    assert fake["padded_share"] > 0.75 < real["padded_share"]
    assert fake["longest"] <= real["longest"]
    assert fake["delta_usage"] == real["delta_usage"]


def test_the_engine_reads_a_padded_stream_as_the_answer(server: FakeProviderServer) -> None:
    raw = _anthropic_stream(server, "A tool too [[words=30]] [[tool=get_time]]", tools=[TIME_TOOL])
    assert b" }\n" in raw
    reading = read(raw, "anthropic")
    assert reading.ended
    assert reading.stop_reason == "tool_use"
    assert [block["type"] for block in reading.content] == ["text", "tool_use"]
    assert len(reading.content[0]["text"].split()) == 30


# -- 3. OpenAI Chat: usage null, service_tier and obfuscation on every chunk -------------------

CURRENT_CHAT_RECORDING = "openai_text_long.sse"  # February 2026, include_usage on


def _chunks(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(data) for _, data in _payloads(raw) if data != "[DONE]"]


def _chat_stream(server: FakeProviderServer, **stream_options: Any) -> list[dict[str, Any]]:
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Hi [[words=8]]"}]}
    if stream_options:
        body["stream_options"] = stream_options
    response = HTTP.post(server.base_url + "/v1/chat/completions", json=body, headers=OPENAI_HEADERS)
    assert response.status_code == 200
    return _chunks(response.content)


def test_openai_chunks_have_the_fields_and_order_of_a_current_recording(server: FakeProviderServer) -> None:
    real = _chunks(RECORDINGS.file(CURRENT_CHAT_RECORDING).read_bytes())
    fake = _chat_stream(server, include_usage=True)
    assert [list(c) for c in fake[:-1]] == [list(real[0])] * (len(fake) - 1)
    assert all(c["usage"] is None for c in fake[:-1])
    assert all(c["usage"] is None for c in real[:-1])
    assert list(fake[-1]) == list(real[-1])  # the usage chunk: choices [], usage, obfuscation
    assert fake[-1]["choices"] == []
    assert fake[-1]["usage"]["total_tokens"] > 0
    assert {c["service_tier"] for c in fake} == {c["service_tier"] for c in real} == {"default"}
    real_lengths = {len(c["obfuscation"]) for c in real}
    assert {len(c["obfuscation"]) for c in fake} <= set(range(min(real_lengths), max(real_lengths) + 1))
    assert len({c["obfuscation"] for c in fake}) > 1  # random padding, not a constant


def test_openai_obfuscation_can_be_turned_off_and_usage_is_absent_when_not_asked(server: FakeProviderServer) -> None:
    plain = _chat_stream(server)
    assert all("usage" not in c and "obfuscation" in c for c in plain)
    quiet = _chat_stream(server, include_usage=True, include_obfuscation=False)
    assert all("obfuscation" not in c for c in quiet)
    assert quiet[-1]["usage"]["total_tokens"] > 0


# -- 4. Responses: a mid-stream error continues the stream's sequence numbers ----------------


def _responses(server: FakeProviderServer, scenario: str, *, background: bool = False) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"model": "gpt-4o", "input": "Hi [[words=8]]", "stream": True}
    if background:
        body.update(background=True, store=True)
    headers = {**OPENAI_HEADERS, "x-fake-scenario": scenario}
    response = HTTP.post(server.base_url + "/v1/responses", json=body, headers=headers)
    assert response.status_code == 200
    return _chunks(response.content)


@pytest.mark.parametrize("after", [0, 1, 6])
def test_a_responses_error_event_takes_the_next_sequence_number(server: FakeProviderServer, after: int) -> None:
    scenario = uuid.uuid4().hex
    server.set_faults(scenario, [f"error:events={after}"])
    events = _responses(server, scenario)
    assert events[-1]["type"] == "error"
    assert [e["sequence_number"] for e in events] == list(range(after + 1))


def test_a_reattached_streams_error_event_continues_from_the_cursor(server: FakeProviderServer) -> None:
    scenario = uuid.uuid4().hex
    whole = _responses(server, scenario, background=True)
    rid = whole[0]["response"]["id"]
    server.set_faults(scenario, ["error:events=2"])
    url = f"{server.base_url}/v1/responses/{rid}?stream=true&starting_after=4"
    tail = _chunks(HTTP.get(url, headers={**OPENAI_HEADERS, "x-fake-scenario": scenario}).content)
    assert [(e["type"], e["sequence_number"]) for e in tail][-1] == ("error", 7)
    assert [e["sequence_number"] for e in tail] == [5, 6, 7]


AZURE_CHAT_PATHS = (
    "/openai/v1/chat/completions",
    "/openai/deployments/prod-4o/chat/completions?api-version=2024-10-21",
)


def _azure_chat(server: FakeProviderServer, path: str, faults: list[str] | None = None) -> list[Any]:
    scenario = uuid.uuid4().hex
    server.set_faults(scenario, faults or [])
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Hi [[words=8]]"}]}
    headers = {"api-key": "azure-key", "x-fake-scenario": scenario}
    response = HTTP.post(server.base_url + path, json=body, headers=headers)
    assert response.status_code == 200
    return [None if data == "[DONE]" else json.loads(data) for _, data in _payloads(response.content)]


@pytest.mark.parametrize("path", AZURE_CHAT_PATHS)
def test_an_azure_chat_stream_opens_with_its_empty_choices_chunk(server: FakeProviderServer, path: str) -> None:
    """Azure OpenAI's first chunk carries the prompt's content-filter results and no choice: a
    client that reads ``choices[0]`` of every chunk breaks on it at once."""
    first, second, *_ = _azure_chat(server, path)
    assert {k: first[k] for k in ("choices", "created", "id", "model", "object")} == {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
    }
    (filtered,) = first["prompt_filter_results"]
    assert filtered["prompt_index"] == 0
    assert filtered["content_filter_results"]
    assert second["choices"][0]["delta"]["role"] == "assistant"
    # it is an event like any other: a fault's position counts it
    assert _azure_chat(server, path, ["eof:events=1"]) == [first]


def test_openai_chat_streams_have_no_empty_choices_chunk_first(server: FakeProviderServer) -> None:
    scenario = uuid.uuid4().hex
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Hi [[words=8]]"}]}
    response = HTTP.post(
        server.base_url + "/v1/chat/completions", json=body, headers={**OPENAI_HEADERS, "x-fake-scenario": scenario}
    )
    first = json.loads(_payloads(response.content)[0][1])
    assert first["choices"][0]["delta"]["role"] == "assistant"


def _logprobs_shape(value: Any) -> Any:
    """Keys in order all the way down (a list by its first item), leaves by type: a chunk's logprobs."""
    if isinstance(value, dict):
        return [(name, _logprobs_shape(item)) for name, item in value.items()]
    if isinstance(value, list):
        return [_logprobs_shape(value[0])] if value else []
    return type(value).__name__


@pytest.mark.parametrize(
    ("recording", "prompt"),
    [("openai_text_logprobs.sse", "Hi [[words=4]]"), ("openai_refusal_logprobs.sse", "Hi [[refuse]]")],
)
def test_openai_logprobs_have_the_shape_of_a_recording_when_asked_and_are_null_when_not(
    server: FakeProviderServer, recording: str, prompt: str
) -> None:
    """Asked for, each chunk's ``logprobs`` is shaped as the API's (the opening chunk's empty list,
    one entry per text chunk: a text's under ``content``, a refusal's under ``refusal``, the finish
    chunk's null); the same values for the same request; not asked for, null on every chunk."""
    real = [c["choices"][0]["logprobs"] for c in _chunks(RECORDINGS.file(recording).read_bytes()) if c["choices"]]
    body = {"model": "gpt-4o", "stream": True, "logprobs": True, "messages": [{"role": "user", "content": prompt}]}

    def logprobs(request: dict[str, Any]) -> list[Any]:
        response = HTTP.post(server.base_url + "/v1/chat/completions", json=request, headers=OPENAI_HEADERS)
        return [c["choices"][0]["logprobs"] for c in _chunks(response.content) if c["choices"]]

    fake = logprobs(body)
    assert [_logprobs_shape(p) for p in fake] == [_logprobs_shape(real[0])] + [_logprobs_shape(real[1])] * (
        len(fake) - 2
    ) + [_logprobs_shape(real[-1])]
    assert logprobs(body) == fake  # deterministic
    assert set(map(str, logprobs({**body, "logprobs": False}))) == {"None"}


def test_openai_top_logprobs_need_logprobs_as_the_api_reference_says(server: FakeProviderServer) -> None:
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 3}
    refused = HTTP.post(server.base_url + "/v1/chat/completions", json=body, headers=OPENAI_HEADERS)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "top_logprobs"
    answered = HTTP.post(
        server.base_url + "/v1/chat/completions", json={**body, "logprobs": True}, headers=OPENAI_HEADERS
    )
    entries = [
        e
        for c in _chunks(answered.content)
        if c["choices"]
        for e in (c["choices"][0]["logprobs"] or {}).get("content") or ()
    ]
    assert entries
    assert all(len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["token"] == e["token"] for e in entries)
