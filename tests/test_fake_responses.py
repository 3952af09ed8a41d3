"""The fake provider's OpenAI Responses dialect: the official client reads it, the engine
recovers across its faults, background responses re-attach, Azure paths answer."""

from __future__ import annotations

import json
import uuid

import httpx
import openai
import pytest

from streamrecover.engine.sse import SSEDecoder
from streamrecover.testing.fake import FakeProviderServer
from streamrecover.testing.fake.model import REFUSAL_TEXT
from streamrecover.testing.tools import demo_registry

from .harness import assert_invariants, run

PROMPT = "Tell me about rivers [[words=40]]"
TOOL_PROMPT = "Weather? [[words=12]] [[tool=get_weather]]"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def client(server: FakeProviderServer, scenario: str) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="sk-fake", base_url=f"{server.base_url}/v1", default_headers={"x-fake-scenario": scenario}
    )


def events_of(raw: bytes) -> list[dict]:
    decoder = SSEDecoder()
    return [json.loads(e.data) for e in decoder.feed(raw) + decoder.close()]


def test_official_client_streams_text_and_a_tool_call(fake_server):
    api = client(fake_server, uuid.uuid4().hex)
    seen = list(api.responses.create(model="gpt-4o", input=PROMPT, stream=True))
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    assert seen[0].type == "response.created"
    assert seen[-1].type == "response.completed"
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert seen[-1].response.output_text == text
    assert seen[-1].response.usage.output_tokens > 0

    with api.responses.stream(model="gpt-4o", input=TOOL_PROMPT, tools=[WEATHER]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    message, call = final.output
    assert message.type == "message"
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Weather?"}


def test_the_stream_has_the_recorded_shape(fake_server):
    response = httpx.post(
        f"{fake_server.base_url}/v1/responses",
        json={"model": "gpt-4o", "input": PROMPT, "stream": True, "background": True, "store": True},
        headers={"authorization": "Bearer k", "x-fake-scenario": uuid.uuid4().hex},
    )
    lines = response.text.split("\n")
    assert lines[0] == "event: response.created"
    assert lines[1].startswith('data: {"type":"response.created","response":{"id":"resp_')
    events = events_of(response.content)
    assert [e["type"] for e in events[:4]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_item.added",
    ]
    assert events[0]["response"]["status"] == "queued"
    assert events[0]["response"]["background"] is True
    assert "[DONE]" not in response.text


def test_a_refusal_streams_as_a_refusal_part_as_the_api_sends_it(fake_server):
    """``[[refuse]]``: the message's one part is a refusal, streamed in refusal events (no
    logprobs, even when asked), carried whole by the done events and the completed response; the
    same bytes every time; the official client reads every event."""
    body = {"model": "gpt-4o", "input": "Do it [[refuse]]", "stream": True}
    body |= {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    headers = {"authorization": "Bearer k", "x-fake-scenario": uuid.uuid4().hex}
    raw = httpx.post(f"{fake_server.base_url}/v1/responses", json=body, headers=headers).content
    assert httpx.post(f"{fake_server.base_url}/v1/responses", json=body, headers=headers).content == raw
    events = events_of(raw)
    kinds = [e["type"] for e in events]
    deltas = [e for e in events if e["type"] == "response.refusal.delta"]
    assert len(deltas) > 1
    assert kinds == [
        *("response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"),
        *["response.refusal.delta"] * len(deltas),
        *("response.refusal.done", "response.content_part.done", "response.output_item.done", "response.completed"),
    ]
    assert "output_text" not in raw.decode()
    item_id = events[2]["item"]["id"]
    at = {"item_id": item_id, "content_index": 0, "output_index": 0}
    assert events[3] == {"type": "response.content_part.added", **at, "sequence_number": 3} | {
        "part": {"type": "refusal", "refusal": ""}
    }
    assert list(deltas[0]) == ["type", "delta", "item_id", "content_index", "output_index", "sequence_number"]
    text = "".join(d["delta"] for d in deltas)
    assert text == REFUSAL_TEXT
    done = events[kinds.index("response.refusal.done")]
    assert done == {"type": "response.refusal.done", "refusal": text, **at, "sequence_number": done["sequence_number"]}
    part = {"type": "refusal", "refusal": text}
    assert events[-3]["part"] == part
    assert events[-2]["item"]["content"] == [part]
    assert events[-1]["response"]["output"] == [events[-2]["item"]]
    stream = client(fake_server, uuid.uuid4().hex).responses.create(
        model="gpt-4o", input="Do it [[refuse]]", stream=True
    )
    final = list(stream)[-1]
    assert final.response.output[0].content[0].refusal == REFUSAL_TEXT


def test_reattach_serves_the_events_after_the_cursor_and_bills_nothing(fake_server):
    scenario = uuid.uuid4().hex
    headers = {"authorization": "Bearer k", "x-fake-scenario": scenario}
    fake_server.set_faults(scenario, ["cut:events=9"])
    body = {"model": "gpt-4o", "input": PROMPT, "stream": True, "background": True, "store": True}
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(f"{fake_server.base_url}/v1/responses", json=body, headers=headers)
    whole = client(fake_server, uuid.uuid4().hex)
    reference = list(whole.responses.create(**body))  # the same response, uninterrupted
    rid = reference[0].response.id
    resumed = httpx.get(f"{fake_server.base_url}/v1/responses/{rid}?stream=true&starting_after=8", headers=headers)
    assert resumed.status_code == 200
    tail = events_of(resumed.content)
    assert tail[0]["sequence_number"] == 9
    assert tail[-1]["type"] == "response.completed"
    post, get = fake_server.log_for(scenario)
    assert (get.method, get.billed_output_tokens, get.understood_as) == ("GET", 0, "resume")
    assert post.billed_output_tokens == post.output_tokens  # the whole generation, once
    gone = httpx.get(f"{fake_server.base_url}/v1/responses/resp_nope?stream=true&starting_after=0", headers=headers)
    assert gone.status_code == 404
    assert "not found" in gone.json()["error"]["message"]


def test_a_background_response_is_billed_as_generated_until_cancelled():
    """The model goes on whether anyone reads or not; a cancel stops it where it is (billed up to
    there, not re-attachable), and a response that had ended is answered as it is."""
    from streamrecover.testing.fake.background import BackgroundResponse
    from streamrecover.testing.fake.wire import WireEvent

    events = [WireEvent(b"e", 1, word) for word in ("one ", "two ", "three")]
    slow = BackgroundResponse(events, pace=60.0)  # one event a minute: the second is not made yet
    assert (slow.status(), slow.billed()) == ("in_progress", (1, ["one "]))
    assert slow.cancel() == "cancelled"
    assert slow.generated(slow.started + 600) == 1  # nothing made after the cancel
    assert (slow.cancel(), slow.billed()) == ("cancelled", (1, ["one "]))
    made = BackgroundResponse(events)  # no pace: generated whole at once
    assert (made.cancel(), made.billed()) == ("completed", (3, ["one ", "two ", "three"]))


def test_background_needs_store(fake_server):
    body = {"model": "gpt-4o", "input": "x", "stream": True, "background": True, "store": False}
    response = httpx.post(f"{fake_server.base_url}/v1/responses", json=body, headers={"authorization": "Bearer k"})
    assert response.status_code == 400


@pytest.mark.parametrize(
    ("prompt", "fault"),
    [
        (PROMPT, "cut:events=12"),
        (PROMPT, "error:events=10"),
        (TOOL_PROMPT, "cut:events=20"),
        (TOOL_PROMPT, "cut:from_end=1"),
    ],
)
async def test_engine_recovers_with_a_continue_message(fake_server, prompt, fault):
    async def once(faults):
        return await run(
            fake_server, prompt, faults=faults, wire="openai-responses", model="gpt-4o", tools=demo_registry()
        )

    reference = await once([])
    outcome = await once([fault])
    assert_invariants(outcome, reference)
    assert outcome.log[0].provider == "openai-responses"
    continued = [e for e in outcome.log if e.prefix_chars]
    assert all(e.understood_as == "continue_message" and e.prefix_matched for e in continued)
    if fault.startswith("cut:events"):
        assert continued, "the break was not continued"


async def test_an_error_event_with_a_null_code_is_continued_to_the_uninterrupted_answer(fake_server):
    async def once(faults):
        return await run(fake_server, PROMPT, faults=faults, wire="openai-responses", model="gpt-4o")

    reference = await once([])
    outcome = await once(["error:events=10,type=null"])
    assert_invariants(outcome, reference)
    assert len(outcome.log) == 2  # the error was worth one continuation, not the end of the run
    (interrupted,) = outcome.events("llm_stream_interrupted")
    assert interrupted["cause"] == "provider_error_mid_stream"


def test_the_error_fault_can_send_a_null_code(fake_server):
    scenario = uuid.uuid4().hex
    fake_server.set_faults(scenario, ["error:events=3,type=null"])
    body = {"model": "gpt-4o", "input": PROMPT, "stream": True}
    headers = {"authorization": "Bearer k", "x-fake-scenario": scenario}
    sent = events_of(httpx.post(f"{fake_server.base_url}/v1/responses", json=body, headers=headers).content)
    assert sent[-1] == {
        "type": "error",
        "code": None,
        "message": sent[-1]["message"],
        "param": None,
        "sequence_number": 3,
    }
    assert sent[-1]["message"]


async def test_reasoning_items_go_back_verified(fake_server):
    """With reasoning on, the reasoning item is kept and sent back in the next turn (after the
    tool result) exactly as it came: the fake verifies its encrypted content."""
    outcome = await run(
        fake_server,
        TOOL_PROMPT,
        wire="openai-responses",
        model="gpt-5",
        tools=demo_registry(),
        extra={"reasoning": {"effort": "low"}},
    )
    assert outcome.status == "completed", outcome.result.error
    first = outcome.assistant[0]["content"]
    assert first[0]["type"] == "reasoning"
    second_request = outcome.log[1].request
    sent = [i for i in second_request["input"] if i.get("type") == "reasoning"]
    assert sent == [{k: first[0][k] for k in ("type", "id", "summary", "encrypted_content")}]


@pytest.mark.parametrize(
    ("wire", "azure", "path"),
    [
        ("openai-responses", {}, "/openai/v1/responses"),
        ("openai-responses", {"azure_api_version": "2025-04-01-preview"}, "/openai/responses"),
        ("openai", {"azure_api_version": "2024-10-21"}, "/openai/deployments/prod-4o/chat/completions"),
        ("openai", {}, "/openai/v1/chat/completions"),
    ],
)
async def test_azure_shaped_paths_with_the_api_key_header(fake_server, wire, azure, path):
    """A provider set up for Azure reaches the fake at Azure's paths with ``api-key`` (the fake
    refuses a Bearer token there), the deployment in place of the model; the key is stored nowhere."""
    kw = {"base_url": fake_server.base_url, "azure": True, "azure_deployment": "prod-4o", **azure}
    outcome = await run(fake_server, PROMPT, faults=["cut:events=9"], wire=wire, model="gpt-4o", provider_kw=kw)
    reference = await run(fake_server, PROMPT, wire=wire, model="gpt-4o")
    assert_invariants(outcome, reference)
    assert [e.path for e in outcome.log] == [path, path]
    assert outcome.log[0].request["model"] == "prod-4o"
    for attempt in outcome.sink.attempts:
        assert attempt.request["headers"]["api-key"] == "[redacted]"
        assert "sk-test-secret" not in json.dumps(attempt.request)
    assert all("api-key" not in e.headers and "sk-test-secret" not in json.dumps(e.headers) for e in outcome.log)


@pytest.mark.parametrize("tool", ["web_search", "web_search_preview"])
def test_a_cited_answer_with_the_web_search_tool_searches_then_annotates_its_text(fake_server, tool):
    """As the real API answers with its hosted search: a ``web_search_call`` item with its progress
    events, then a message whose ``url_citation`` annotations index characters of its text, the
    same in the streamed and the non-streamed answer; without the tool, no search and no annotation."""
    oai = client(fake_server, str(uuid.uuid4()))
    prompt = "Tell me about rivers [[words=20]] [[cite]]"
    with oai.responses.stream(model="gpt-4o", input=prompt, tools=[{"type": tool}]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    searching = [f"response.web_search_call.{s}" for s in ("in_progress", "searching", "completed")]
    assert [k for k in kinds if k.startswith("response.web_search_call.")] == searching
    assert kinds.count("response.output_text.annotation.added") == 2
    assert [item.type for item in final.output] == ["web_search_call", "message"]
    text = final.output_text
    words = text.split()
    annotations = final.output[1].content[0].annotations
    assert [text[a.start_index : a.end_index] for a in annotations] == [" ".join(words[1:5]), " ".join(words[-3:])]
    whole = oai.responses.create(model="gpt-4o", input=prompt, tools=[{"type": tool}])
    assert [item.type for item in whole.output] == ["web_search_call", "message"]
    assert whole.output[1].content[0].annotations == annotations
    plain = oai.responses.create(model="gpt-4o", input=prompt)
    assert [item.type for item in plain.output] == ["message"]
    assert plain.output[0].content[0].annotations == []


def test_logprobs_only_when_include_asks_the_same_for_the_same_request(fake_server):
    """``include: ["message.output_text.logprobs"]``: each delta's one token with as many
    ``top_logprobs`` as asked, all of them on ``output_text.done`` and, with ``bytes``, in the
    finished part and the non-streamed response; not asked, ``[]`` everywhere."""
    api = client(fake_server, uuid.uuid4().hex)
    asked = {"include": ["message.output_text.logprobs"], "top_logprobs": 3}

    def streamed(**kw):
        events = list(api.responses.create(model="gpt-4o", input=PROMPT, stream=True, **kw))
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        (done,) = [e for e in events if e.type == "response.output_text.done"]
        return deltas, done, events[-1].response.output[0].content[0]

    deltas, done, part = streamed(**asked)
    assert all([x.token for x in d.logprobs] == [d.delta] for d in deltas)
    assert all(len(x.top_logprobs) == 3 for d in deltas for x in d.logprobs)
    assert [x.model_dump() for x in done.logprobs] == [x.model_dump() for d in deltas for x in d.logprobs]
    assert [(x.token, x.logprob, x.bytes) for x in part.logprobs] == [
        (x.token, x.logprob, list(x.token.encode())) for x in done.logprobs
    ]
    again = streamed(**asked)
    assert [d.logprobs for d in again[0]] == [d.logprobs for d in deltas]
    whole = api.responses.create(model="gpt-4o", input=PROMPT, **asked).output[0].content[0]
    assert "".join(x.token for x in whole.logprobs) == whole.text
    assert all(x.bytes == list(x.token.encode()) and len(x.top_logprobs) == 3 for x in whole.logprobs)

    deltas, done, part = streamed()
    assert [d.logprobs for d in deltas] == [[]] * len(deltas)
    assert (done.logprobs, part.logprobs) == ([], [])


@pytest.mark.parametrize(
    ("top", "code"),
    [(21, "integer_above_max_value"), (-1, "integer_below_min_value"), ("3", "invalid_type"), (2.5, "invalid_type")],
)
def test_top_logprobs_out_of_range_or_not_an_integer_is_refused_as_the_api_does(fake_server, top, code):
    """``top_logprobs`` is an integer from 0 to 20: anything else is a 400 naming the field,
    before a byte of answer is streamed (0 and 20 are taken)."""
    api = client(fake_server, uuid.uuid4().hex)
    asked = {"include": ["message.output_text.logprobs"]}
    with pytest.raises(openai.BadRequestError) as refused:
        api.responses.create(model="gpt-4o", input=PROMPT, stream=True, top_logprobs=top, **asked)
    error = refused.value.body
    assert isinstance(error, dict)
    assert (refused.value.status_code, error["type"], error["param"], error["code"]) == (
        400,
        "invalid_request_error",
        "top_logprobs",
        code,
    )
    assert "'top_logprobs'" in error["message"]
    for bound in (0, 20):
        scored = api.responses.create(model="gpt-4o", input=PROMPT, top_logprobs=bound, **asked).output[0].content[0]
        assert scored.logprobs
        assert all(len(x.top_logprobs) <= bound for x in scored.logprobs)
