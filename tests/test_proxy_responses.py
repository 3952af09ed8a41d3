"""The healing endpoint's ``v1/responses``, seen by the official ``openai`` client pointed at it (Daphne
serving the app in a thread) with the fake's Responses dialect upstream breaking the stream at every
event boundary: the final response equals the uninterrupted one, the SDK's parser raises nothing,
what the client was shown is what was stored, function calls arrive whole, an unsplicable break ends
with ``response.failed``, and a non-streamed request passes through."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from django.conf import settings
from django.test import override_settings

from streamrecover.models import Attempt, Message, Run
from streamrecover.proxy.keys import issue_key
from streamrecover.proxy.views import FAULTS_HEADER
from streamrecover.testing import DEFAULT_SCENARIO, parse_faults
from streamrecover.testing.fake.local import local_fake_server
from streamrecover.testing.host import wait_for

from .proxy_helpers import daphne_url, fake_providers, proxy_settings, sweep, upstream_events

pytestmark = pytest.mark.django_db(transaction=True)

PROVIDER_KEY = "sk-provider-secret-77e0aa"
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def _providers() -> dict[str, Any]:
    return fake_providers(PROVIDER_KEY)


@pytest.fixture
def site() -> Iterator[str]:
    """The proxy's prefix on Daphne; ``v1/responses`` served by the fake's Responses dialect."""
    configured = proxy_settings(
        settings.STREAMRECOVER, PROVIDERS=_providers(), PROXY_RESPONSES_PROVIDER="fake-responses"
    )
    with override_settings(STREAMRECOVER=configured):
        yield daphne_url() + "/streamrecover/proxy"


@pytest.fixture
def client(site: str, django_user_model: Any) -> openai.OpenAI:
    user = django_user_model.objects.create_user("responses-user", password="x")
    return openai.OpenAI(base_url=site + "/v1", api_key=issue_key(user)[1], max_retries=0)


def stored_assistant(run_id: str) -> list[dict[str, Any]]:
    report = wait_for(run_id)
    assert report.status == "completed", report.error
    return list(Message.objects.filter(run_id=run_id, role="assistant").order_by("position").last().content)  # type: ignore[union-attr]


def check_events(events: list[Any]) -> None:
    """One well-formed Responses stream: one start, increasing sequence numbers, contiguous output indexes."""
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds[:3]
    assert kinds.count("response.created") == kinds.count("response.in_progress") == 1
    terminal = [k for k in kinds if k in ("response.completed", "response.incomplete", "response.failed")]
    assert terminal == [kinds[-1]], kinds[-3:]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert added == list(range(len(added)))
    done = [e.output_index for e in events if e.type == "response.output_item.done"]
    # every item ends, but one that a failed response cut short
    assert done == (added if kinds[-1] != "response.failed" else added[: len(done)])
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
    for event in events:
        if event.type == "response.function_call_arguments.delta":
            json.loads(event.delta)  # held back: the whole call's arguments at once


def answer(client: openai.OpenAI, prompt: Any, faults: str = "", **kw: Any) -> dict[str, Any]:
    """One streamed response through the proxy with ``client.responses.stream``, checked as the client sees it."""
    with client.responses.stream(
        model=kw.pop("model", "gpt-4o"),
        input=prompt,
        max_output_tokens=kw.pop("max_output_tokens", 400),
        extra_headers={FAULTS_HEADER: faults},
        **kw,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    check_events(events)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    return {"final": final, "text": text, "run_id": final.id.removeprefix("resp_"), "events": events}


def comparable(response: Any) -> dict[str, Any]:
    """What a client takes from a response: its items' kinds, text and calls, its status."""
    items = []
    for item in response.output:
        if item.type == "message":
            items.append({"type": "message", "text": "".join(c.text for c in item.content)})
        elif item.type == "function_call":
            items.append({"type": "function_call", "call_id": item.call_id, "name": item.name, "args": item.arguments})
        else:
            items.append({"type": item.type})
    return {"output": items, "status": response.status, "text": response.output_text}


@pytest.mark.parametrize(
    ("prompt", "tools"),
    [
        pytest.param("Tell me about rivers [[words=4]]", None, id="text"),
        pytest.param("Check [[words=2]] [[tool]]", TOOLS, id="text-then-tool"),
    ],
)
def test_responses_client_sees_one_uninterrupted_answer_at_every_break(
    client: openai.OpenAI, prompt: str, tools: Any
) -> None:
    extra = {"tools": tools} if tools else {}
    clean = answer(client, prompt, **extra)
    expected = comparable(clean["final"])
    assert expected["text"]
    if tools:
        assert [i["type"] for i in expected["output"]] == ["message", "function_call"]
        assert json.loads(expected["output"][1]["args"])
    events = upstream_events("/v1/responses", {"model": "gpt-4o", "input": prompt, "max_output_tokens": 400, **extra})
    assert events > 8
    cuts = range(1, events)
    for cut, seen in zip(cuts, sweep(lambda faults: answer(client, prompt, faults, **extra), cuts), strict=True):
        assert comparable(seen["final"]) == expected, f"cut:events={cut}"
        stored = stored_assistant(seen["run_id"])
        assert seen["text"] == "".join(b["text"] for b in stored if b["type"] == "text"), f"cut:events={cut}"
        attempts = Attempt.objects.filter(run_id=seen["run_id"])
        usage = seen["final"].usage
        assert usage is not None
        assert usage.output_tokens == sum(a.output_tokens or 0 for a in attempts)
        assert attempts.count() >= 2 or cut >= events - 2  # the break was real (late cuts lose only the end)


def test_create_stream_and_a_conversation_with_function_call_output(client: openai.OpenAI) -> None:
    """``responses.create(stream=True)`` with a history of items: a function call and its output."""
    history: list[Any] = [
        {"role": "user", "content": "What is the weather in Paris? [[words=5]]"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
    ]
    stream = client.responses.create(
        model="gpt-4o",
        input=history,
        instructions="Answer briefly.",
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
        extra_headers={FAULTS_HEADER: "cut:events=6"},
    )
    events = list(stream)
    check_events(events)
    completed = events[-1]
    assert completed.type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text
    assert completed.response.output_text == text
    run = Run.objects.get()
    stored = stored_assistant(str(run.pk))
    assert text == "".join(b["text"] for b in stored if b["type"] == "text")
    assert run.options["system"] == "Answer briefly."
    first = Attempt.objects.filter(run=run).order_by("index").first()
    assert first is not None
    sent = first.request["json"]
    assert [i.get("type") for i in sent["input"]] == [None, "function_call", "function_call_output"]
    assert sent["tools"] == TOOLS
    assert sent["instructions"] == "Answer briefly."


def test_max_output_tokens_ends_with_response_incomplete(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model="gpt-4o", input="Tell me about rivers [[words=60]]", max_output_tokens=16, stream=True
    )
    events = list(stream)
    check_events(events)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    wait_for(Run.objects.get().pk)


def test_a_restart_that_cannot_be_spliced_ends_with_response_failed(client: openai.OpenAI) -> None:
    with pytest.raises(RuntimeError, match=r"response\.completed"):  # the SDK: no final response
        answer(client, "Tell me about rivers [[words=30]] [[seam=restart_new]]", "cut:events=22")
    with client.responses.stream(
        model="gpt-4o",
        input="Tell me about rivers [[words=30]] [[seam=restart_new]]",
        extra_headers={FAULTS_HEADER: "cut:events=22"},
    ) as stream:
        events = list(stream)
    check_events(events)
    failed = events[-1]
    assert failed.type == "response.failed"
    assert "could not be continued in place" in failed.response.error.message
    for run in Run.objects.all():
        wait_for(run.pk)  # the runs themselves still complete and are stored


def test_a_failure_before_anything_streamed_is_the_providers_http_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        answer(client, "Hello", "status:400")
    wait_for(Run.objects.get().pk)


def test_stateful_requests_are_refused_clearly(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model="gpt-4o", input="Hi", previous_response_id="resp_x", stream=True)
    assert not Run.objects.exists()


def test_a_non_streamed_request_passes_through_with_pre_stream_retries_only(client: openai.OpenAI) -> None:
    fake = local_fake_server()
    before = len(fake.log_for(DEFAULT_SCENARIO))
    fake.set_faults(DEFAULT_SCENARIO, parse_faults(["status:529", "ok"]))
    response = client.responses.create(model="gpt-4o", input="Tell me about rivers [[words=9]]")
    assert response.status == "completed"
    assert response.output_text
    assert len(fake.log_for(DEFAULT_SCENARIO)) - before == 2  # the 529, then the answer
    assert PROVIDER_KEY not in response.model_dump_json()
    assert not Run.objects.exists()


def test_reasoning_arrives_as_a_whole_item_before_the_answer(client: openai.OpenAI) -> None:
    prompt = "Tell me about rivers [[words=6]]"
    clean = answer(client, prompt, reasoning={"effort": "low"})
    assert [i["type"] for i in comparable(clean["final"])["output"]] == ["reasoning", "message"]
    reasoning = clean["final"].output[0]
    assert reasoning.encrypted_content  # as the provider sent it: the client can send it back
    body = {"model": "gpt-4o", "input": prompt, "max_output_tokens": 400, "reasoning": {"effort": "low"}}
    events = upstream_events("/v1/responses", body)
    for cut in (2, 4, events - 3):
        seen = answer(client, prompt, f"cut:events={cut}", reasoning={"effort": "low"})
        assert comparable(seen["final"]) == comparable(clean["final"]), f"cut:events={cut}"
        stored = stored_assistant(seen["run_id"])
        assert [b["type"] for b in stored] == ["reasoning", "text"]
        assert seen["final"].output[0].encrypted_content == stored[0]["encrypted_content"]


def test_another_providers_thinking_arrives_as_a_reasoning_item_with_its_summary_text(
    client: openai.OpenAI,
) -> None:
    """``v1/responses`` served by an OpenAI Chat provider that reasons (DeepSeek's
    ``reasoning_content``): the reasoning reaches the client as a reasoning item whose summary is
    the thinking, before the message; the client's function tool is written in Chat's terms."""
    served_by_chat = {**settings.STREAMRECOVER, "PROXY_RESPONSES_PROVIDER": "fake"}
    prompt = "Tell me about rivers [[words=6]]"
    with override_settings(STREAMRECOVER={**proxy_settings(served_by_chat), "PROVIDERS": _providers()}):
        clean = answer(client, prompt, model="deepseek-reasoner", tools=TOOLS)
        broken = answer(client, prompt, "cut:events=5", model="deepseek-reasoner", tools=TOOLS)
    for seen in (clean, broken):
        final = seen["final"]
        assert [item.type for item in final.output] == ["reasoning", "message"]
        summary = final.output[0].summary
        assert len(summary) == 1
        assert summary[0].text.startswith("Let me think about")
        kinds = [e.type for e in seen["events"]]
        assert kinds.index("response.reasoning_summary_text.delta") < kinds.index("response.output_text.delta")
    assert comparable(broken["final"]) == comparable(clean["final"])
    assert broken["final"].output[0].summary == clean["final"].output[0].summary
    run = Run.objects.get(pk=broken["run_id"])
    first = Attempt.objects.filter(run=run).order_by("index").first()
    assert first is not None
    sent = first.request["json"]
    assert sent["tools"] == [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
    assert "messages" in sent  # Chat Completions, not Responses


def test_a_non_streamed_request_to_a_provider_of_another_api_is_refused(client: openai.OpenAI) -> None:
    served_by_chat = {**proxy_settings(settings.STREAMRECOVER), "PROVIDERS": _providers()}
    with (
        override_settings(STREAMRECOVER={**served_by_chat, "PROXY_RESPONSES_PROVIDER": "fake"}),
        pytest.raises(openai.BadRequestError, match="own API"),
    ):
        client.responses.create(model="gpt-4o", input="Hi")


def test_failover_from_responses_to_a_chat_provider_keeps_one_responses_stream(client: openai.OpenAI) -> None:
    """The Responses provider's budget is spent mid-answer; the answer goes on at a Chat Completions
    provider with the client's function tool written in Chat's terms, in the same Responses stream."""
    prompt = "Check the weather [[words=30]] [[tool]]"
    expected = comparable(answer(client, prompt, tools=TOOLS)["final"])
    for item in expected["output"]:
        item.pop("call_id", None)  # each provider names its calls
    configured = {
        **proxy_settings(settings.STREAMRECOVER),
        "PROVIDERS": _providers(),
        "PROXY_RESPONSES_PROVIDER": "fake-responses",
        "MAX_CONTINUATIONS": 1,
        "PROXY_FAILOVER": {"responses": {"PROVIDER": "fake", "MODEL": "gpt-4o-mini"}},
    }
    with override_settings(STREAMRECOVER=configured):
        seen = answer(client, prompt, "cut:events=8;cut:events=6", tools=TOOLS)
    got = comparable(seen["final"])
    for item in got["output"]:
        item.pop("call_id", None)
    assert got == expected
    run = Run.objects.get(pk=seen["run_id"])
    assert run.events.get(name="llm_stream_failover").payload["to_model"] == "gpt-4o-mini"
    last = Attempt.objects.filter(run=run).order_by("index").last()
    assert last is not None
    assert last.request["json"]["tools"] == [
        {"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}
    ]
    assert seen["text"] == "".join(b["text"] for b in stored_assistant(seen["run_id"]) if b["type"] == "text")


WEB_SEARCH = [{"type": "web_search"}]
SEARCH_EVENTS = [f"response.web_search_call.{stage}" for stage in ("in_progress", "searching", "completed")]


def word_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\S+", text)]


def check_annotations(seen: dict[str, Any], label: str) -> list[Any]:
    """The message's url citations as the client holds them: announced one by one, repeated whole in
    the done events and the final response, each covering whole words of the client's own text (the
    fake cites runs of whole words of each response's own text), the last three when it ends there;
    and stored as the client was shown them."""
    final, events = seen["final"], seen["events"]
    message = final.output[-1]
    text = message.content[0].text
    annotations = message.content[0].annotations
    added = [e for e in events if e.type == "response.output_text.annotation.added"]
    assert [e.annotation_index for e in added] == list(range(len(added))), label
    assert [dict(e.annotation) for e in added] == [a.to_dict() for a in annotations], label
    part_done = next(e for e in events if e.type == "response.content_part.done")
    assert part_done.part.annotations == annotations, label
    assert len({(a.start_index, a.end_index, a.url) for a in annotations}) == len(annotations), label
    words = word_spans(text)
    starts, ends = {s for s, _ in words}, {e for _, e in words}
    for annotation in annotations:
        assert annotation.type == "url_citation", label
        assert annotation.url.startswith("https://example.com/"), label
        assert annotation.start_index in starts, (label, annotation, text)
        assert annotation.end_index in ends, (label, annotation, text)
    last = annotations[-1]
    if last.end_index == words[-1][1]:  # the last three words are cited (unless a short continuation wrote them)
        assert last.start_index == words[-3][0], (label, text[last.start_index :])
    stored = stored_assistant(seen["run_id"])
    cited = [c for b in stored if b["type"] == "text" for c in b.get("citations") or ()]
    assert cited == [a.to_dict() for a in annotations], label
    return list(annotations)


def last_annotation_event(body: dict[str, Any]) -> int:
    """The index of the fake's last ``output_text.annotation.added`` event for ``body``, uninterrupted."""
    headers = {"authorization": "Bearer k"}
    url = local_fake_server().base_url + "/v1/responses"
    response = httpx.post(url, json={**body, "stream": True}, headers=headers)
    kinds = [json.loads(line[5:])["type"] for line in response.text.splitlines() if line.startswith("data:")]
    return max(i for i, kind in enumerate(kinds) if kind == "response.output_text.annotation.added")


def test_a_web_search_answer_keeps_its_search_call_and_annotations_at_every_break(client: openai.OpenAI) -> None:
    """With the hosted web search tool, the client gets the search call with its progress events
    before the text, and url citations that index its own final text: after a break, the
    continuation's annotations are moved past the kept text, so they still cover the words they cite."""
    prompt = "Tell me about rivers [[words=14]] [[cite]]"
    clean = answer(client, prompt, tools=WEB_SEARCH)
    assert [item.type for item in clean["final"].output] == ["web_search_call", "message"]
    search = clean["final"].output[0]
    assert search.status == "completed"
    assert search.action.type == "search"
    first_pages = check_annotations(clean, "clean")
    assert len(first_pages) == 2
    body = {"model": "gpt-4o", "input": prompt, "max_output_tokens": 400, "tools": WEB_SEARCH}
    events = upstream_events("/v1/responses", body)
    # the upstream event after which the first attempt has cited the last words: a cut before it
    # leaves that citation to the continuation, whose offsets count its own text
    last_cited = last_annotation_event(body)
    cuts = range(1, events)
    broken = sweep(lambda faults: answer(client, prompt, faults, tools=WEB_SEARCH), cuts)
    moved = 0  # cuts after which the continuation's citation of the last words was moved onto them
    for cut, seen in zip(cuts, broken, strict=True):
        label = f"cut:events={cut}"
        final = seen["final"]
        assert [item.type for item in final.output] == ["web_search_call", "message"], label
        assert final.output[0].action.query == search.action.query, label
        assert final.output_text == clean["final"].output_text, label
        kinds = [e.type for e in seen["events"]]
        assert [k for k in kinds if k in SEARCH_EVENTS] == SEARCH_EVENTS, label
        assert kinds.index(SEARCH_EVENTS[-1]) < kinds.index("response.output_text.delta"), label
        annotations = check_annotations(seen, label)
        if cut <= last_cited and annotations[-1].end_index == len(final.output_text):
            moved += 1
    # all but the cuts that leave the continuation fewer than four words (it cites none of them)
    assert moved >= last_cited // 2, (moved, last_cited)


@pytest.mark.parametrize("seam", ["repeat:4", "restart"])
def test_annotations_of_a_continuation_that_repeats_itself_index_the_spliced_text(
    client: openai.OpenAI, seam: str
) -> None:
    """A continuation that repeats the end of the kept text (or all of it) has the repeat trimmed at
    the seam: its annotations count the repeat, so they are moved by the kept text less the trim."""
    prompt = f"Tell me about rivers [[words=14]] [[cite]] [[seam={seam}]]"
    clean = answer(client, prompt, tools=WEB_SEARCH)
    for cut in (14, 20, 26):
        seen = answer(client, prompt, f"cut:events={cut}", tools=WEB_SEARCH)
        assert seen["final"].output_text == clean["final"].output_text, cut
        assert Attempt.objects.filter(run_id=seen["run_id"]).count() == 2, cut
        check_annotations(seen, f"seam={seam} cut:events={cut}")


def test_a_web_search_answer_failing_over_to_anthropic_is_joined_at_the_seam(client: openai.OpenAI) -> None:
    """The Responses provider's budget is spent mid-answer and Anthropic goes on in a cited span,
    a text block of its own after the plain kept text (a message item of its own for this client,
    as an Anthropic answer's spans are). At every break the client's text, joined across them, is
    the uninterrupted answer's: the whitespace the prefill left out and Anthropic wrote again at the
    start of its span is not doubled. What was stored is what the client was shown."""
    prompt = "Tell me about rivers [[words=40]] [[cite]]"
    clean = answer(client, prompt, tools=WEB_SEARCH)["final"].output_text
    configured = {
        **proxy_settings(settings.STREAMRECOVER),
        "PROVIDERS": _providers(),
        "PROXY_RESPONSES_PROVIDER": "fake-responses",
        "MAX_CONTINUATIONS": 1,
        "PROXY_FAILOVER": {"responses": {"PROVIDER": "fake", "MODEL": "claude-sonnet-4-5"}},
    }
    body = {"model": "gpt-4o", "input": prompt, "max_output_tokens": 400, "tools": WEB_SEARCH}
    cuts = range(12, upstream_events("/v1/responses", body) - 8)
    with override_settings(STREAMRECOVER=configured):
        broken = sweep(lambda faults: answer(client, prompt, faults + ";cut:events=6", tools=WEB_SEARCH), cuts)
    for cut, seen in zip(cuts, broken, strict=True):
        run = Run.objects.get(pk=seen["run_id"])
        assert run.events.filter(name="llm_stream_failover").exists(), cut
        assert seen["text"] == clean, cut
        assert seen["final"].output_text == clean, cut
        stored = stored_assistant(seen["run_id"])
        assert "".join(b["text"] for b in stored if b["type"] == "text") == clean, cut


def test_an_anthropic_web_search_answer_reaches_a_responses_client_as_url_citations(client: openai.OpenAI) -> None:
    """``v1/responses`` served by Anthropic: each cited span's search results become url citations
    covering the whole message the span is written as, after a break too."""
    served_by_anthropic = {**settings.STREAMRECOVER, "PROXY_RESPONSES_PROVIDER": "fake"}
    prompt = "Tell me about rivers [[words=10]] [[cite]]"
    with override_settings(STREAMRECOVER={**proxy_settings(served_by_anthropic), "PROVIDERS": _providers()}):
        clean = answer(client, prompt, model="claude-sonnet-4-5")
        broken = answer(client, prompt, "cut:events=9", model="claude-sonnet-4-5")
    assert Attempt.objects.filter(run_id=broken["run_id"]).count() == 2
    for seen in (clean, broken):
        message = seen["final"].output[-1]
        text = message.content[0].text
        assert text == clean["final"].output_text
        annotations = message.content[0].annotations
        assert [(a.type, a.start_index, a.end_index) for a in annotations] == [("url_citation", 0, len(text))] * 2
        assert all(a.url.startswith("https://example.com/") and a.title.startswith("Source") for a in annotations)
        added = [e.annotation for e in seen["events"] if e.type == "response.output_text.annotation.added"]
        assert [dict(a) for a in added] == [a.to_dict() for a in annotations]
