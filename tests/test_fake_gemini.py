"""The fake provider's Gemini dialect: parsed by the official google-genai client, faults
included, and the engine's recovery through it end to end."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from streamrecover.testing import parse_faults
from streamrecover.testing.fake import FakeProviderServer
from streamrecover.testing.tools import demo_registry

from .harness import assert_invariants, run

MODEL = "gemini-2.5-flash"
OFF = {"thinkingConfig": {"thinkingBudget": 0}}  # no thinking, on a model that can turn it off
WEATHER_TOOL = {
    "functionDeclarations": [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ]
}


def _client(server: FakeProviderServer, scenario: str) -> Any:
    from google import genai
    from google.genai import types

    options = types.HttpOptions(base_url=server.base_url, headers={"x-fake-scenario": scenario})
    return genai.Client(api_key="AIza-fake", http_options=options)


def _post(
    server: FakeProviderServer, body: dict[str, Any], *, model: str = MODEL, key: str = "AIza-fake"
) -> httpx.Response:
    url = f"{server.base_url}/v1beta/models/{model}:streamGenerateContent?alt=sse"
    headers = {"x-goog-api-key": key, "x-fake-scenario": uuid.uuid4().hex} if key else {}
    return httpx.post(url, json=body, headers=headers)


def test_google_genai_client_reads_the_text_stream(fake_server: FakeProviderServer) -> None:
    client = _client(fake_server, uuid.uuid4().hex)
    chunks = list(client.models.generate_content_stream(model=MODEL, contents="Tell me a story [[words=40]]"))
    text = "".join(c.text or "" for c in chunks)
    reference = _post(
        fake_server, {"contents": [{"role": "user", "parts": [{"text": "Tell me a story [[words=40]]"}]}]}
    )
    expected = "".join(
        p.get("text", "")
        for line in reference.text.split("\r\n\r\n")
        if line.startswith("data: ")
        for p in json.loads(line[6:])["candidates"][0]["content"]["parts"]
    )
    assert text == expected
    assert len(text.split()) >= 40
    assert chunks[-1].candidates[0].finish_reason.value == "STOP"
    assert chunks[-1].usage_metadata.prompt_token_count > 0
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])


def test_google_genai_client_reads_function_calls_and_thoughts(fake_server: FakeProviderServer) -> None:
    from google.genai import types

    client = _client(fake_server, uuid.uuid4().hex)
    config = types.GenerateContentConfig(
        tools=[
            types.Tool(function_declarations=[types.FunctionDeclaration(**WEATHER_TOOL["functionDeclarations"][0])])
        ],
        thinking_config=types.ThinkingConfig(include_thoughts=True, thinking_budget=1024),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    chunks = list(
        client.models.generate_content_stream(model=MODEL, contents="Weather? [[tool=get_weather]]", config=config)
    )
    parts = [p for c in chunks for p in c.candidates[0].content.parts]
    thoughts = [p for p in parts if p.thought]
    calls = [p for p in parts if p.function_call]
    assert thoughts
    assert all(p.text for p in thoughts)
    assert len(calls) == 1
    assert calls[0].function_call.name == "get_weather"
    assert calls[0].function_call.args == {"city": "Weather?"}
    assert calls[0].thought_signature  # bytes, decoded by the client from base64


def test_framing_is_crlf_data_events_with_the_finish_on_the_last(fake_server: FakeProviderServer) -> None:
    response = _post(fake_server, {"contents": [{"parts": [{"text": "Hi [[words=12]]"}]}]})
    assert response.headers["content-type"].startswith("text/event-stream")
    body = response.content
    assert body.startswith(b'data: {"candidates": [{"content": {"parts": [{"text": ')
    assert body.endswith(b"\r\n\r\n")
    assert b"\n\n" not in body.replace(b"\r\n\r\n", b"")
    chunks = [json.loads(e[6:]) for e in body.decode().split("\r\n\r\n") if e]
    assert [("finishReason" in c["candidates"][0]) for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert all({"usageMetadata", "modelVersion", "responseId"} <= c.keys() for c in chunks)


def _chunks(server: FakeProviderServer, prompt: str, faults: list[str] | None = None) -> list[dict[str, Any]]:
    scenario = uuid.uuid4().hex
    if faults:
        server.set_faults(scenario, parse_faults(faults))
    url = f"{server.base_url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    body = {"contents": [{"parts": [{"text": prompt}]}]}
    response = httpx.post(url, json=body, headers={"x-goog-api-key": "AIza-fake", "x-fake-scenario": scenario})
    return [json.loads(e[6:]) for e in response.text.split("\r\n\r\n") if e]


def test_a_content_stop_chunk_carries_the_usage_and_ids_as_every_chunk_does(fake_server: FakeProviderServer) -> None:
    chunks = _chunks(fake_server, "A story [[words=40]]", ["error:events=3,type=SAFETY"])
    assert len(chunks) == 4
    last = chunks[-1]
    assert last["candidates"][0]["finishReason"] == "SAFETY"
    assert last["candidates"][0]["safetyRatings"]
    assert {"usageMetadata", "modelVersion", "responseId"} <= last.keys()
    assert last["usageMetadata"] == chunks[-2]["usageMetadata"]  # nothing more was generated
    assert last["responseId"] == chunks[0]["responseId"]


def test_a_cited_answer_is_grounded_on_its_last_chunk(fake_server: FakeProviderServer) -> None:
    chunks = _chunks(fake_server, "Tell me about rivers [[words=30]] [[cite]]")
    assert all("groundingMetadata" not in c["candidates"][0] for c in chunks[:-1])
    candidate = chunks[-1]["candidates"][0]
    grounding = candidate["groundingMetadata"]
    text = "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"]).encode()
    assert len(grounding["groundingChunks"]) == len(grounding["groundingSupports"]) == 2
    for support in grounding["groundingSupports"]:  # UTF-8 byte offsets into the response's text
        segment = support["segment"]
        assert text[segment.get("startIndex", 0) : segment["endIndex"]].decode() == segment["text"]
    assert grounding["webSearchQueries"]
    assert grounding["searchEntryPoint"]["renderedContent"]
    (source,) = candidate["citationMetadata"]["citationSources"]
    assert source["uri"] == grounding["groundingChunks"][0]["web"]["uri"]
    assert source["endIndex"] == grounding["groundingSupports"][0]["segment"]["endIndex"]
    plain = _chunks(fake_server, "Tell me about rivers [[words=30]]")[-1]["candidates"][0]
    assert "groundingMetadata" not in plain
    assert "citationMetadata" not in plain


def test_google_shaped_errors(fake_server: FakeProviderServer) -> None:
    missing = _post(fake_server, {"contents": [{"parts": [{"text": "x"}]}]}, key="")
    assert missing.status_code == 403
    assert missing.json()["error"]["status"] == "PERMISSION_DENIED"
    empty = _post(fake_server, {"contents": []})
    assert empty.status_code == 400
    assert empty.json()["error"]["status"] == "INVALID_ARGUMENT"
    role = _post(fake_server, {"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]})
    assert role.status_code == 400
    assert "valid role" in role.json()["error"]["message"]
    # a Gemini 3 function call sent back without its thought signature is refused, as the real API does
    history = {
        "contents": [
            {"role": "user", "parts": [{"text": "Weather?"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"result": "rain"}}}]},
        ]
    }
    refused = _post(fake_server, history, model="gemini-3-pro-preview")
    assert refused.status_code == 400
    assert "thought_signature" in refused.json()["error"]["message"]
    assert _post(fake_server, history).status_code == 200  # Gemini 2.5 does not insist


async def test_a_break_is_continued_with_the_partial_answer_and_a_continue_message(
    fake_server: FakeProviderServer,
) -> None:
    reference = await run(fake_server, "A long story [[words=80]]", wire="gemini", model=MODEL)
    outcome = await run(
        fake_server, "A long story [[words=80]]", wire="gemini", model=MODEL, faults=["cut:events=4,mid"]
    )
    assert_invariants(outcome, reference)
    assert [e.understood_as for e in outcome.log] == ["fresh", "continue_message"]
    contents = outcome.log[1].request["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert outcome.log[1].prefix_matched is True


async def test_a_stream_that_ends_without_its_finish_reason_is_a_break(fake_server: FakeProviderServer) -> None:
    reference = await run(fake_server, "A story [[words=60]]", wire="gemini", model=MODEL)
    outcome = await run(fake_server, "A story [[words=60]]", wire="gemini", model=MODEL, faults=["eof:events=3"])
    assert_invariants(outcome, reference)
    assert outcome.sink.attempts[0].interrupt_cause == "connection_reset"
    assert len(outcome.log) == 2


@pytest.mark.parametrize("reason", ["SAFETY", "RECITATION"])
async def test_a_content_stop_is_kept_and_never_continued(fake_server: FakeProviderServer, reason: str) -> None:
    outcome = await run(
        fake_server, "A story [[words=60]]", wire="gemini", model=MODEL, faults=[f"error:events=3,type={reason}"]
    )
    assert outcome.status == "completed"
    assert len(outcome.log) == 1  # no second request
    assert outcome.sink.attempts[0].stop_reason == "content_filter"
    assert outcome.events("llm_stream_continuation_started") == []
    text = outcome.assistant[0]["content"][0]["text"]
    assert text
    assert outcome.log[0].billed_text.startswith(text)


async def test_overloaded_mid_stream_is_continued(fake_server: FakeProviderServer) -> None:
    reference = await run(fake_server, "A story [[words=60]]", wire="gemini", model=MODEL)
    outcome = await run(fake_server, "A story [[words=60]]", wire="gemini", model=MODEL, faults=["error:events=3"])
    assert_invariants(outcome, reference)
    assert outcome.sink.attempts[0].error_kind == "overloaded"


async def test_a_gemini_3_tool_call_keeps_its_signature_across_a_break(fake_server: FakeProviderServer) -> None:
    """Thinking, text, then a call: cut inside the text, the thought run (unsigned yet) is
    dropped, the continuation's call arrives with its signature, and the next turn (the tool
    result) is accepted by a model that refuses calls without one."""
    prompt = "Weather? [[words=30]] [[tool=get_weather]]"
    kw: dict[str, Any] = {
        "wire": "gemini",
        "model": "gemini-3-pro-preview",
        "tools": demo_registry(),
        "thinking_budget": 2048,
    }
    reference = await run(fake_server, prompt, **kw)
    outcome = await run(fake_server, prompt, faults=["cut:events=6"], **kw)
    assert outcome.status == "completed", outcome.result.error
    assert [e.status for e in outcome.log] == [200, 200, 200]
    call = next(b for b in outcome.assistant[0]["content"] if b["type"] == "tool_use")
    assert call["signature"]
    texts = [
        [b["text"] for b in m["content"] if b["type"] == "text"] for m in (reference, outcome) for m in [m.assistant[0]]
    ]
    assert texts[0] == texts[1]
    assert outcome.assistant[-1] == reference.assistant[-1]
    for reconstructed, committed in outcome.view.turns:
        assert reconstructed == committed


async def test_a_gemini_3_call_is_signed_when_its_thoughts_are_not_shown(fake_server: FakeProviderServer) -> None:
    """A Gemini 3 model thinks whether or not the request asks for its thoughts: its first call
    is signed all the same, cut or not, and the turn with the tool's result is accepted."""
    prompt = "Weather? [[words=12]] [[tool=get_weather]]"
    kw: dict[str, Any] = {"wire": "gemini", "model": "gemini-3-pro-preview", "tools": demo_registry()}
    for faults in ([], ["cut:events=2"]):
        outcome = await run(fake_server, prompt, faults=faults, **kw)
        assert outcome.status == "completed", outcome.result.error
        call = next(b for b in outcome.assistant[0]["content"] if b["type"] == "tool_use")
        assert call["signature"]
        assert not any(b["type"] == "thinking" for b in outcome.assistant[0]["content"])


def test_a_whole_gemini_3_answer_signs_its_first_call(fake_server: FakeProviderServer) -> None:
    url = f"{fake_server.base_url}/v1beta/models/gemini-3-pro-preview:generateContent"
    contents = [{"role": "user", "parts": [{"text": "Weather? [[tool=get_weather]]"}]}]
    response = httpx.post(url, json={"contents": contents, "tools": [WEATHER_TOOL]}, headers={"x-goog-api-key": "k"})
    parts = response.json()["candidates"][0]["content"]["parts"]
    calls = [p for p in parts if "functionCall" in p]
    assert calls
    assert calls[0].get("thoughtSignature")


def test_google_genai_client_reads_a_whole_answer(fake_server: FakeProviderServer) -> None:
    client = _client(fake_server, uuid.uuid4().hex)
    whole = client.models.generate_content(model=MODEL, contents="Tell me a story [[words=40]]")
    chunks = client.models.generate_content_stream(model=MODEL, contents="Tell me a story [[words=40]]")
    assert whole.text == "".join(c.text or "" for c in chunks)
    assert whole.candidates[0].finish_reason.value == "STOP"
    assert whole.usage_metadata.candidates_token_count > 0


def _stream(
    server: FakeProviderServer, model: str, *, prompt: str = "A story [[words=30]]", **config: Any
) -> tuple[list[dict[str, Any]], Any]:
    """The chunks of an answer to a story prompt, and the fake's billing log entry for it."""
    scenario = uuid.uuid4().hex
    url = f"{server.base_url}/v1beta/models/{model}:streamGenerateContent?alt=sse"
    body = {"contents": [{"parts": [{"text": prompt}]}], "generationConfig": config}
    response = httpx.post(url, json=body, headers={"x-goog-api-key": "AIza-fake", "x-fake-scenario": scenario})
    (entry,) = server.log_for(scenario)
    return [json.loads(e[6:]) for e in response.text.split("\r\n\r\n") if e], entry


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"])


def _usage(chunk: dict[str, Any]) -> tuple[int, int, int, int]:
    usage = chunk["usageMetadata"]
    counts = ("promptTokenCount", "candidatesTokenCount", "thoughtsTokenCount", "totalTokenCount")
    return tuple(usage.get(name, 0) for name in counts)  # type: ignore[return-value]


@pytest.mark.parametrize("model", ["gemini-3-pro-preview", "gemini-2.5-flash"])
def test_a_thinking_model_bills_the_thoughts_it_does_not_show(fake_server: FakeProviderServer, model: str) -> None:
    """Asked for no thoughts, a thinking model thinks all the same: no thought part, but the
    thinking is in every chunk's usage from the first on, billed as output, and it takes its
    share of ``maxOutputTokens`` (all of it, when that is smaller: a ``MAX_TOKENS`` stop with no text)."""
    chunks, entry = _stream(fake_server, model)
    assert not any(p.get("thought") for c in chunks for p in c["candidates"][0]["content"]["parts"])
    thoughts = _usage(chunks[0])[2]
    assert thoughts > 0
    for chunk in chunks:
        prompt, candidates, counted, total = _usage(chunk)
        assert counted == thoughts
        assert total == prompt + candidates + thoughts
    candidates = _usage(chunks[-1])[1]
    assert entry.billed_output_tokens == entry.output_tokens == candidates + thoughts

    limited, entry = _stream(fake_server, model, maxOutputTokens=thoughts + 3)
    assert limited[-1]["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert _usage(limited[-1])[1:3] == (3, thoughts)
    assert entry.billed_output_tokens == thoughts + 3
    spent, entry = _stream(fake_server, model, maxOutputTokens=thoughts - 5)
    assert (_text(spent), spent[-1]["candidates"][0]["finishReason"]) == ("", "MAX_TOKENS")
    assert _usage(spent[-1])[1:3] == (0, thoughts - 5)
    assert entry.billed_output_tokens == thoughts - 5

    # a model that does not think (thinking turned off where it can be) answers the same, for its text alone
    for other, config in [("gemini-2.0-flash", {}), ("gemini-2.5-flash-lite", {}), ("gemini-2.5-flash", OFF)]:
        plain, entry = _stream(fake_server, other, **config)
        assert _text(plain) == _text(chunks)
        assert all("thoughtsTokenCount" not in c["usageMetadata"] for c in plain)
        assert entry.billed_output_tokens == _usage(plain[-1])[1] == candidates


def test_a_whole_answer_bills_the_thoughts_it_does_not_show(fake_server: FakeProviderServer) -> None:
    url = f"{fake_server.base_url}/v1beta/models/gemini-3-pro-preview:generateContent"
    scenario = uuid.uuid4().hex
    body = {"contents": [{"parts": [{"text": "A story [[words=30]]"}]}]}
    response = httpx.post(url, json=body, headers={"x-goog-api-key": "k", "x-fake-scenario": scenario})
    answer = response.json()
    assert not any(p.get("thought") for p in answer["candidates"][0]["content"]["parts"])
    prompt, candidates, thoughts, total = _usage(answer)
    assert thoughts > 0
    assert total == prompt + candidates + thoughts
    (entry,) = fake_server.log_for(scenario)
    assert entry.billed_output_tokens == candidates + thoughts


def _budget(budget: int, *, shown: bool = False) -> dict[str, Any]:
    return {"thinkingConfig": {"thinkingBudget": budget, "includeThoughts": shown}}


# Gemini API docs, "Gemini thinking": 2.5 Pro takes 128 to 32768 and cannot turn thinking off;
# 2.5 Flash 0 to 24576; 2.5 Flash-Lite 512 to 24576, or 0 (off); -1 (dynamic) on all three.
@pytest.mark.parametrize(
    ("model", "refused", "taken"),
    [
        ("gemini-2.5-pro", [0, 1, 127, 32769, -2], [128, 200, 32768, -1]),
        ("gemini-2.5-flash", [24577, -5], [0, 1, 24576, -1]),
        ("gemini-2.5-flash-lite", [1, 511, 24577], [0, 512, 24576, -1]),
    ],
)
def test_a_thinking_budget_the_model_does_not_take_is_the_apis_400(
    fake_server: FakeProviderServer, model: str, refused: list[int], taken: list[int]
) -> None:
    for budget in refused:
        response = _post(
            fake_server, {"contents": [{"parts": [{"text": "Hi"}]}], "generationConfig": _budget(budget)}, model=model
        )
        assert response.status_code == 400, (model, budget)
        error = response.json()["error"]
        assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
        expected = "This model only works in thinking mode" if budget == 0 else f"thinking budget ({budget}) is invalid"
        assert expected in error["message"]
    for budget in taken:
        response = _post(
            fake_server, {"contents": [{"parts": [{"text": "Hi"}]}], "generationConfig": _budget(budget)}, model=model
        )
        assert response.status_code == 200, (model, budget, response.text)


def test_google_genai_client_gets_the_400_for_a_budget_of_0_on_2_5_pro(fake_server: FakeProviderServer) -> None:
    from google.genai import errors, types

    client = _client(fake_server, uuid.uuid4().hex)
    config = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(thinking_budget=0))
    with pytest.raises(errors.ClientError) as raised:
        list(client.models.generate_content_stream(model="gemini-2.5-pro", contents="Hi", config=config))
    assert raised.value.code == 400
    assert raised.value.status == "INVALID_ARGUMENT"
    assert "only works in thinking mode" in (raised.value.message or "")


@pytest.mark.parametrize(
    ("model", "budget", "prompt"),
    [
        ("gemini-2.5-pro", 200, "A story [[words=30]] [[think=300]]"),  # asked to think long: its budget stops it
        ("gemini-2.5-flash", 16, "A story [[words=30]]"),  # a budget below what it thinks by default
    ],
)
def test_thinking_never_exceeds_a_positive_budget(
    fake_server: FakeProviderServer, model: str, budget: int, prompt: str
) -> None:
    """Hidden or shown, the thinking stops at the budget (all of it spent here: the prompt asks
    for more), is billed and counted against ``maxOutputTokens`` as before; -1 (dynamic) thinks
    the model's own amount, more than the budget."""
    dynamic, _ = _stream(fake_server, model, prompt=prompt, **_budget(-1))
    assert _usage(dynamic[-1])[2] > budget
    hidden, entry = _stream(fake_server, model, prompt=prompt, **_budget(budget))
    assert not any(p.get("thought") for c in hidden for p in c["candidates"][0]["content"]["parts"])
    assert [_usage(c)[2] for c in hidden] == [budget] * len(hidden)
    assert _text(hidden) == _text(dynamic)  # the same answer, after less thinking
    prompt_tokens, candidates, thoughts, total = _usage(hidden[-1])
    assert total == prompt_tokens + candidates + thoughts
    assert entry.billed_output_tokens == candidates + budget

    shown, entry = _stream(fake_server, model, prompt=prompt, **_budget(budget, shown=True))
    thought_parts = [p for c in shown for p in c["candidates"][0]["content"]["parts"] if p.get("thought")]
    assert thought_parts
    assert _usage(shown[-1])[2] == budget
    assert entry.billed_output_tokens == _usage(shown[-1])[1] + budget

    limited, entry = _stream(fake_server, model, prompt=prompt, maxOutputTokens=budget + 3, **_budget(budget))
    assert limited[-1]["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert _usage(limited[-1])[1:3] == (3, budget)
    assert entry.billed_output_tokens == budget + 3


def test_a_budget_of_0_shows_no_thoughts_where_it_turns_thinking_off(fake_server: FakeProviderServer) -> None:
    """2.5 Flash with thinking turned off has no thoughts to show, asked for them or not."""
    chunks, entry = _stream(fake_server, "gemini-2.5-flash", **_budget(0, shown=True))
    assert not any(p.get("thought") for c in chunks for p in c["candidates"][0]["content"]["parts"])
    assert all("thoughtsTokenCount" not in c["usageMetadata"] for c in chunks)
    assert entry.billed_output_tokens == _usage(chunks[-1])[1]


def test_a_gemini_3_request_with_a_thinking_level_and_a_budget_is_the_apis_400(fake_server: FakeProviderServer) -> None:
    """Gemini 3 docs: ``thinkingLevel`` and the legacy ``thinkingBudget`` are exclusive; either alone is taken."""
    contents = [{"parts": [{"text": "Hi"}]}]
    both = {"thinkingConfig": {"thinkingLevel": "low", "thinkingBudget": 1024}}
    response = _post(fake_server, {"contents": contents, "generationConfig": both}, model="gemini-3-pro-preview")
    assert response.status_code == 400
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"
    for alone in ({"thinkingLevel": "low"}, {"thinkingBudget": 1024}):
        body = {"contents": contents, "generationConfig": {"thinkingConfig": alone}}
        assert _post(fake_server, body, model="gemini-3-pro-preview").status_code == 200
