"""The healing endpoint, seen by the official ``anthropic`` and ``openai`` clients pointed at it
(Daphne serving the app in a thread), with the built-in fake provider upstream breaking the stream
at every event boundary: the final message equals the uninterrupted one, the SDKs' stream parsers
raise nothing, what the client was shown is what was stored, and tool calls arrive whole."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anthropic
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

from .proxy_helpers import daphne_url, proxy_settings, sweep, upstream_events

pytestmark = pytest.mark.django_db(transaction=True)

PROVIDER_KEY = "sk-provider-secret-4c1d9e"
LONG = "Tell me about rivers [[words=400]]"
TOOLS_ANTHROPIC = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.fixture
def site() -> Iterator[str]:
    """The proxy's prefix on Daphne, both formats served by the fake (with a provider key of its own)."""
    fake = {"ADAPTER": "anthropic", "BASE_URL": "fake://streamrecover", "API_KEY": PROVIDER_KEY}
    configured = proxy_settings(settings.STREAMRECOVER, PROVIDERS={"fake": fake})
    with override_settings(STREAMRECOVER=configured):
        yield daphne_url() + "/streamrecover/proxy"


@pytest.fixture
def raw_key(django_user_model: Any) -> str:
    user = django_user_model.objects.create_user("proxy-user", password="x")
    return issue_key(user)[1]


def stored_assistant(run_id: str) -> list[dict[str, Any]]:
    report = wait_for(run_id)
    assert report.status == "completed", report.error
    return list(Message.objects.filter(run_id=run_id, role="assistant").get().content)


# ---- Anthropic ----------------------------------------------------------------------------


def anthropic_answer(client: anthropic.Anthropic, prompt: str, faults: str = "", **kw: Any) -> dict[str, Any]:
    """One streamed answer through the proxy, checked as a client sees it."""
    with client.messages.stream(
        model="claude-x",
        max_tokens=kw.pop("max_tokens", 400),
        messages=[{"role": "user", "content": prompt}],
        extra_headers={FAULTS_HEADER: faults},
        **kw,
    ) as stream:
        events = [event for event in stream]
        final = stream.get_final_message()
        run_id = stream.response.headers["x-streamrecover-run"]
    kinds = Counter(e.type for e in events)
    assert kinds["message_start"] == kinds["message_delta"] == kinds["message_stop"] == 1, kinds
    starts = [e.index for e in events if e.type == "content_block_start"]
    assert starts == list(range(len(starts))), starts  # contiguous block indexes
    assert [e.index for e in events if e.type == "content_block_stop"] == starts
    texts: dict[int, str] = {}
    for event in events:
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            texts[event.index] = texts.get(event.index, "") + event.delta.text
        if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            json.loads(event.delta.partial_json)  # held back: the whole call's arguments at once
    return {"final": final, "texts": texts, "run_id": run_id, "events": events}


def comparable(message: anthropic.types.Message) -> dict[str, Any]:
    return {"content": [b.model_dump() for b in message.content], "stop_reason": message.stop_reason}


@pytest.mark.parametrize(
    ("prompt", "tools"),
    [
        pytest.param("Tell me about rivers [[words=4]]", None, id="text"),
        pytest.param("Check [[words=2]] [[tool]]", TOOLS_ANTHROPIC, id="text-then-tool"),
    ],
)
def test_anthropic_client_sees_one_uninterrupted_answer_at_every_break(
    site: str, raw_key: str, prompt: str, tools: Any
) -> None:
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    extra = {"tools": tools} if tools else {}
    clean = anthropic_answer(client, prompt, **extra)
    expected = comparable(clean["final"])
    events = upstream_events(
        "/v1/messages",
        {"model": "claude-x", "max_tokens": 400, "messages": [{"role": "user", "content": prompt}], **extra},
    )
    assert events > 8
    cuts = range(1, events)
    for cut, seen in zip(
        cuts, sweep(lambda faults: anthropic_answer(client, prompt, faults, **extra), cuts), strict=True
    ):
        assert comparable(seen["final"]) == expected, f"cut:events={cut}"
        stored = stored_assistant(seen["run_id"])
        stored_text = {i: b["text"] for i, b in enumerate(stored) if b["type"] == "text"}
        assert seen["texts"] == stored_text, f"cut:events={cut}"  # what the client was shown was stored
        attempts = Attempt.objects.filter(run_id=seen["run_id"])
        assert seen["final"].usage.output_tokens == sum(a.output_tokens or 0 for a in attempts)
        assert attempts.count() >= 2 or cut >= events - 2  # the break was real (late cuts lose only the end)


def test_extended_thinking_arrives_whole_with_its_signature(site: str, raw_key: str) -> None:
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    prompt = "Tell me about rivers [[words=6]]"
    thinking = {"type": "enabled", "budget_tokens": 1024}
    expected = comparable(anthropic_answer(client, prompt, thinking=thinking, max_tokens=3000)["final"])
    assert [b["type"] for b in expected["content"]] == ["thinking", "text"]
    assert expected["content"][0]["signature"]
    body = {"model": "claude-x", "max_tokens": 3000, "messages": [{"role": "user", "content": prompt}]}
    events = upstream_events("/v1/messages", {**body, "thinking": thinking})
    cuts = range(3, events, 9)  # in the thinking, in the text, near the end (every boundary: a slow sweep)
    for cut, seen in zip(
        cuts,
        sweep(lambda faults: anthropic_answer(client, prompt, faults, thinking=thinking, max_tokens=3000), cuts),
        strict=True,
    ):
        assert comparable(seen["final"]) == expected, f"cut:events={cut}"
        thinking_deltas = [
            e for e in seen["events"] if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
        ]
        assert len(thinking_deltas) == 1  # held back: whole, then its signature
        stored_assistant(seen["run_id"])


def test_a_clients_own_thinking_fields_reach_the_provider_on_every_call(site: str, raw_key: str) -> None:
    """A client's ``thinking`` object goes to the provider as written (``display`` included), on
    the first call and on the continuation, whose ``budget_tokens`` alone is this call's: kept
    where it fits what is left, else one below what is left, or no thinking at all where not
    even Anthropic's smallest budget (1024) fits."""
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    prompt = "Tell me about rivers [[words=60]]"
    outcomes = []
    for max_tokens, budget in ((3000, 1500), (1300, 1250), (1100, 1050)):
        thinking = {"type": "enabled", "budget_tokens": budget, "display": "omitted"}
        seen = anthropic_answer(client, prompt, "cut:events=12", thinking=thinking, max_tokens=max_tokens)
        sent = [e.request for e in local_fake_server().log if e.scenario == f"run-{seen['run_id']}"]
        assert len(sent) == 2, sent  # the answer and its continuation
        assert sent[0]["thinking"] == thinking  # the first call: as the client wrote it
        left = sent[1]["max_tokens"]
        assert left < max_tokens
        if budget < left:
            outcomes.append("kept")
            assert sent[1]["thinking"] == thinking, sent[1]
        elif left - 1 >= 1024:
            outcomes.append("lowered")
            assert sent[1]["thinking"] == {**thinking, "budget_tokens": left - 1}, sent[1]
        else:
            outcomes.append("none")
            assert "thinking" not in sent[1], sent[1]
        assert comparable(seen["final"])["content"][-1]["type"] == "text"
    assert outcomes == ["kept", "lowered", "none"]  # the cut left what each case needs


def test_the_uninterrupted_answer_is_the_providers_own(site: str, raw_key: str) -> None:
    prompt = "Tell me about rivers [[words=9]]"
    direct = anthropic.Anthropic(base_url=local_fake_server().base_url, api_key="k", max_retries=0)
    with direct.messages.stream(model="claude-x", max_tokens=400, messages=[{"role": "user", "content": prompt}]) as s:
        provider = s.get_final_message()
    seen = anthropic_answer(anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0), prompt)
    proxied = seen["final"]
    assert comparable(proxied) == comparable(provider)
    assert seen["events"][0].message.usage.input_tokens == provider.usage.input_tokens  # message_start has it
    assert proxied.usage.input_tokens == provider.usage.input_tokens
    assert proxied.usage.output_tokens == provider.usage.output_tokens


def test_a_tool_call_cut_half_way_never_reaches_the_client(site: str, raw_key: str) -> None:
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    prompt = "Check the weather [[words=3]] [[tool]] [[no_tool_after_break]]"
    # the cut falls inside the tool call's arguments: the client sees the text, then the answer ends
    events = upstream_events(
        "/v1/messages",
        {
            "model": "claude-x",
            "max_tokens": 400,
            "messages": [{"role": "user", "content": prompt}],
            "tools": TOOLS_ANTHROPIC,
        },
    )
    seen = anthropic_answer(client, prompt, f"cut:events={events - 5}", tools=TOOLS_ANTHROPIC)
    assert not any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in seen["events"])
    assert [b.type for b in seen["final"].content] == ["text"]
    names = list(Run.objects.get(pk=seen["run_id"]).events.values_list("name", flat=True))
    assert "discarded_partial_tool_use" in names


def test_nothing_salvageable_after_text_was_sent_ends_with_the_providers_error_event(site: str, raw_key: str) -> None:
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    with (
        override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "MAX_CONTINUATIONS": 1}),
        pytest.raises(anthropic.APIStatusError) as raised,
    ):
        anthropic_answer(client, "Tell me about rivers [[words=30]]", "cut:events=8;cut:events=6")
    assert raised.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]  # given up on
    assert wait_for(Run.objects.get().pk).status == "exhausted"


@pytest.mark.parametrize(
    ("faults", "reason"),
    [
        pytest.param("cut:events=8;cut:events=6", "exhausted", id="budget-exhausted"),
        pytest.param("error:events=8,type=invalid_request_error", "invalid_request", id="permanent-mid-answer"),
    ],
)
def test_failover_continues_the_answer_on_the_fallback_provider(
    site: str, raw_key: str, faults: str, reason: str
) -> None:
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    prompt = "Tell me about rivers [[words=30]]"
    expected = comparable(anthropic_answer(client, prompt)["final"])
    backup = {"ADAPTER": "anthropic", "BASE_URL": "fake://streamrecover"}
    configured = {
        **settings.STREAMRECOVER,
        "MAX_CONTINUATIONS": 1,
        "PROVIDERS": {**settings.STREAMRECOVER["PROVIDERS"], "fake-backup": backup},
        "PROXY_FAILOVER": {"anthropic": {"PROVIDER": "fake-backup", "MODEL": "claude-backup"}},
    }
    with override_settings(STREAMRECOVER=configured):
        seen = anthropic_answer(client, prompt, faults)
    assert comparable(seen["final"]) == expected  # one stream, the same answer
    stored = stored_assistant(seen["run_id"])
    assert seen["texts"] == {i: b["text"] for i, b in enumerate(stored) if b["type"] == "text"}
    run = Run.objects.get(pk=seen["run_id"])
    failover = run.events.get(name="llm_stream_failover").payload
    assert (failover["reason"], failover["to_provider"], failover["to_model"]) == (
        reason,
        "fake-backup",
        "claude-backup",
    )
    last = Attempt.objects.filter(run=run).order_by("index").last()
    assert last is not None
    assert last.request["json"]["model"] == "claude-backup"


def test_a_permanent_error_mid_answer_ends_with_the_providers_own_error_type(site: str, raw_key: str) -> None:
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as raised:
        anthropic_answer(client, "Tell me about rivers [[words=30]]", "error:events=8,type=invalid_request_error")
    assert raised.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert wait_for(Run.objects.get().pk).status == "failed"


def test_a_failure_before_anything_streamed_is_the_providers_http_error(site: str, raw_key: str) -> None:
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    with pytest.raises(anthropic.BadRequestError):
        anthropic_answer(client, "Hello", "status:400")
    wait_for(Run.objects.get().pk)


# ---- OpenAI -------------------------------------------------------------------------------


def openai_answer(client: openai.OpenAI, prompt: str, faults: str = "", **kw: Any) -> dict[str, Any]:
    raw = client.chat.completions.with_raw_response.create(
        model=kw.pop("model", "gpt-4o"),
        messages=[{"role": "user", "content": prompt}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={FAULTS_HEADER: faults},
        **kw,
    )
    chunks = list(raw.parse())
    ids = {c.id for c in chunks}
    assert len(ids) == 1, ids
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert len(finishes) == 1, finishes
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for ch in c.choices:
            for call in ch.delta.tool_calls or []:
                json.loads(call.function.arguments)  # held back: whole arguments in one chunk
                calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": call.function.arguments}
    usage = [c.usage for c in chunks if c.usage is not None]
    return {
        "final": {"content": text, "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finishes[0]},
        "usage": usage,
        "run_id": raw.headers["x-streamrecover-run"],
    }


@pytest.mark.parametrize(
    ("prompt", "tools"),
    [
        pytest.param("Tell me about rivers [[words=4]]", None, id="text"),
        pytest.param("Check [[words=2]] [[tool]]", TOOLS_OPENAI, id="text-then-tool"),
    ],
)
def test_openai_client_sees_one_uninterrupted_answer_at_every_break(
    site: str, raw_key: str, prompt: str, tools: Any
) -> None:
    client = openai.OpenAI(base_url=site + "/v1", api_key=raw_key, max_retries=0)
    extra = {"tools": tools} if tools else {}
    expected = openai_answer(client, prompt, **extra)["final"]
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": prompt}], **extra}
    events = upstream_events("/v1/chat/completions", body)
    assert events > 8
    cuts = range(1, events)
    for cut, seen in zip(cuts, sweep(lambda faults: openai_answer(client, prompt, faults, **extra), cuts), strict=True):
        assert seen["final"] == expected, f"cut:events={cut}"
        stored = stored_assistant(seen["run_id"])
        assert seen["final"]["content"] == "".join(b["text"] for b in stored if b["type"] == "text")
        attempts = Attempt.objects.filter(run_id=seen["run_id"])
        assert len(seen["usage"]) == 1
        assert seen["usage"][0].completion_tokens == sum(a.output_tokens or 0 for a in attempts)


def test_max_completion_tokens_reaches_the_provider_under_its_own_name(site: str, raw_key: str) -> None:
    # It was sent on as max_tokens, which o-series and gpt-5 models refuse with a 400; and every
    # continuation asks for what is left of it, under the same name
    client = openai.OpenAI(base_url=site + "/v1", api_key=raw_key, max_retries=0)
    seen = openai_answer(client, LONG, "cut:events=20", model="o3", max_completion_tokens=60)
    assert seen["final"]["finish_reason"] == "length"
    sent = [a.request["json"] for a in Attempt.objects.filter(run_id=seen["run_id"]).order_by("index")]
    assert sent[0]["max_completion_tokens"] == 60
    assert 0 < sent[1]["max_completion_tokens"] < 60
    assert all("max_tokens" not in b for b in sent)
    assert seen["usage"][0].completion_tokens <= 60


def test_a_client_that_names_max_tokens_gets_what_the_provider_says_of_it(site: str, raw_key: str) -> None:
    client = openai.OpenAI(base_url=site + "/v1", api_key=raw_key, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="Use 'max_completion_tokens' instead"):
        openai_answer(client, LONG, model="o3", max_tokens=60)
    wait_for(Run.objects.get().pk)


def test_openai_client_usage_counts_what_the_broken_attempt_was_billed(site: str, raw_key: str) -> None:
    # OpenAI sends usage only at the end, so the broken attempt reported none: its estimate is in the sum
    client = openai.OpenAI(base_url=site + "/v1", api_key=raw_key, max_retries=0)
    seen = openai_answer(client, LONG, "cut:events=40")
    stored_assistant(seen["run_id"])
    broken, finished = Attempt.objects.filter(run_id=seen["run_id"]).order_by("index")
    usage = seen["usage"][0]
    assert usage.completion_tokens > (finished.output_tokens or 0)
    assert usage.prompt_tokens > (finished.input_tokens or 0)
    assert usage.completion_tokens == (broken.output_tokens or 0) + (finished.output_tokens or 0)
    assert (broken.outcome, broken.usage_estimated, finished.usage_estimated) == ("interrupted", True, False)


def test_openai_stream_ends_once_with_done(site: str, raw_key: str) -> None:
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Hi [[words=12]]"}]}
    headers = {"authorization": f"Bearer {raw_key}", FAULTS_HEADER: "cut:events=5"}
    response = httpx.post(site + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    lines = [line for line in response.text.splitlines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    assert lines.count("data: [DONE]") == 1
    assert PROVIDER_KEY not in response.text
    wait_for(response.headers["x-streamrecover-run"])


def test_a_break_inside_the_second_of_two_tool_calls_reaches_an_openai_client_as_both_calls_whole(
    site: str, raw_key: str
) -> None:
    """A Chat stream closes its calls only at its end: cut inside the second call, both are asked
    again, so the first must not have been shown yet (the client got an error chunk)."""
    client = openai.OpenAI(base_url=site + "/v1", api_key=raw_key, max_retries=0)
    prompt = "Check [[words=3]] [[tools=2]]"
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": prompt}], "tools": TOOLS_OPENAI}
    clean = openai_answer(client, prompt, tools=TOOLS_OPENAI)["final"]
    cut = f"cut:events={upstream_events('/v1/chat/completions', body) - 4}"
    seen = openai_answer(client, prompt, cut, tools=TOOLS_OPENAI)
    assert seen["final"] == clean
    assert wait_for(seen["run_id"]).status == "completed"


def test_a_restart_that_cannot_be_spliced_ends_with_an_openai_error_chunk(site: str, raw_key: str) -> None:
    client = openai.OpenAI(base_url=site + "/v1", api_key=raw_key, max_retries=0)
    with pytest.raises(openai.APIError) as raised:
        openai_answer(client, "Tell me about rivers [[words=30]] [[seam=restart_new]]", "cut:events=22")
    assert "could not be continued in place" in raised.value.message
    run = Run.objects.get()
    wait_for(run.pk)  # the run itself still completes and is stored


def test_a_client_that_goes_away_leaves_the_run_to_finish_and_be_stored(site: str, raw_key: str) -> None:
    body = {"model": "claude-x", "max_tokens": 2000, "stream": True, "messages": [{"role": "user", "content": LONG}]}
    with httpx.stream("POST", site + "/v1/messages", json=body, headers={"x-api-key": raw_key}, timeout=30) as response:
        run_id = response.headers["x-streamrecover-run"]
        next(response.iter_lines())  # the first line, then the client hangs up
    clean = anthropic_answer(anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0), LONG, max_tokens=2000)
    assert stored_assistant(run_id) == [b.model_dump(exclude_none=True) for b in clean["final"].content]


# ---- keys and limits ----------------------------------------------------------------------


def test_keys_are_checked_as_each_sdk_sends_them(site: str, raw_key: str) -> None:
    from streamrecover.proxy.keys import revoke_key

    message = {"model": "claude-x", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    missing = httpx.post(site + "/v1/messages", json=message)
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    missing = httpx.post(site + "/v1/chat/completions", json={**message, "model": "gpt-4o"})
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"

    def ask_anthropic(key: str) -> None:
        anthropic.Anthropic(base_url=site, api_key=key, max_retries=0).messages.create(**message)

    def ask_openai(key: str) -> None:
        openai.OpenAI(base_url=site + "/v1", api_key=key, max_retries=0).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], stream=True
        )

    with pytest.raises(anthropic.AuthenticationError):
        ask_anthropic("sk-sr-wrong")
    with pytest.raises(openai.AuthenticationError):
        ask_openai("sk-sr-wrong")
    # the OpenAI endpoint takes the key as the OpenAI SDK sends it, not in Anthropic's header
    assert httpx.post(site + "/v1/chat/completions", json=message, headers={"x-api-key": raw_key}).status_code == 401
    revoke_key(raw_key)
    with pytest.raises(anthropic.AuthenticationError):
        ask_anthropic(raw_key)
    with pytest.raises(openai.AuthenticationError):
        ask_openai(raw_key)
    assert not Run.objects.exists()


def test_per_key_limits_answer_in_each_providers_error_format(site: str, django_user_model: Any) -> None:
    from streamrecover.proxy.admission import admit
    from streamrecover.proxy.inbound import parse

    user = django_user_model.objects.create_user("limited", password="x")
    key, raw = issue_key(user, allowed_models=["claude-x*", "gpt-4o"], max_tokens=100, max_concurrent=1)
    client = anthropic.Anthropic(base_url=site, api_key=raw, max_retries=0)
    oa = openai.OpenAI(base_url=site + "/v1", api_key=raw, max_retries=0)
    hello = [{"role": "user", "content": "Hi"}]
    with pytest.raises(anthropic.PermissionDeniedError):
        client.messages.create(model="claude-other", max_tokens=50, messages=hello, stream=True)
    with pytest.raises(openai.PermissionDeniedError):
        oa.chat.completions.create(model="gpt-5", messages=hello, stream=True)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model="claude-x", max_tokens=101, messages=hello, stream=True)
    # one stream open already (a run of this key that has not ended): the second is refused
    admit(
        key,
        parse("anthropic", json.dumps({"model": "claude-x", "max_tokens": 5, "messages": hello}).encode(), 10),
        "fake",
        [],
    )
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(model="claude-x", max_tokens=50, messages=hello, stream=True)
    with pytest.raises(openai.RateLimitError):
        oa.chat.completions.create(model="gpt-4o", messages=hello, stream=True)
    assert Run.objects.count() == 1


def test_the_provider_key_reaches_neither_the_client_nor_storage(site: str, raw_key: str) -> None:
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    seen = anthropic_answer(client, "Tell me about rivers [[words=9]]", "cut:events=6")
    wait_for(seen["run_id"])
    run = Run.objects.get(pk=seen["run_id"])
    stored = json.dumps([list(Attempt.objects.filter(run=run).values()), run.options], default=str)
    assert PROVIDER_KEY not in stored
    assert raw_key not in stored
    received = [e for e in local_fake_server().log if e.scenario == f"run-{run.pk}"]
    assert len(received) == 2  # the answer and its continuation, sent with the provider's key, not the client's


def test_the_clients_own_credentials_reach_the_provider_as_sent(site: str, raw_key: str) -> None:
    """A client's passthrough fields are its own (an MCP server's token): every request of the
    run, the continuation too, carries them as sent, not ``[redacted]``; only the app's key is cut."""
    mcp = [{"type": "url", "url": "https://mcp.example.com/sse", "name": "ex", "authorization_token": "oauth-0a1b2c"}]
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    seen = anthropic_answer(client, "Tell me about rivers [[words=9]]", "cut:events=6", extra_body={"mcp_servers": mcp})
    wait_for(seen["run_id"])
    received = [e.request for e in local_fake_server().log if e.scenario == f"run-{seen['run_id']}"]
    assert len(received) == 2  # the answer and its continuation
    assert [request["mcp_servers"] for request in received] == [mcp, mcp]
    attempts = Attempt.objects.filter(run_id=seen["run_id"]).order_by("index")
    assert [attempt.request["json"]["mcp_servers"] for attempt in attempts] == [mcp, mcp]
    assert {attempt.request["headers"]["x-api-key"] for attempt in attempts} == {"[redacted]"}
    stored = json.dumps([list(attempts.values()), Run.objects.get(pk=seen["run_id"]).options], default=str)
    assert PROVIDER_KEY not in stored


def test_a_non_streamed_request_passes_through_with_pre_stream_retries_only(site: str, raw_key: str) -> None:
    fake = local_fake_server()
    before = len(fake.log_for(DEFAULT_SCENARIO))
    fake.set_faults(DEFAULT_SCENARIO, parse_faults(["status:529", "ok", "status:400"]))
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    hello = [{"role": "user", "content": "Tell me about rivers [[words=9]]"}]
    message = client.messages.create(model="claude-x", max_tokens=400, messages=hello)
    assert message.content[0].type == "text"
    assert message.stop_reason == "end_turn"
    assert len(fake.log_for(DEFAULT_SCENARIO)) - before == 2  # the 529, then the answer
    with pytest.raises(anthropic.BadRequestError):  # a permanent error is the client's at once
        client.messages.create(model="claude-x", max_tokens=400, messages=hello)
    assert len(fake.log_for(DEFAULT_SCENARIO)) - before == 3
    oa = openai.OpenAI(base_url=site + "/v1", api_key=raw_key, max_retries=0)
    completion = oa.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi [[words=4]]"}])
    assert completion.choices[0].message.content
    assert not Run.objects.exists()


def test_openai_clients_receive_thinking_as_reasoning_content_before_the_answer(site: str, raw_key: str) -> None:
    """A reasoning model's thinking reaches a Chat Completions client as ``delta.reasoning_content``
    (as DeepSeek, vLLM and SGLang stream it), whole, before the content and never in it."""
    client = openai.OpenAI(base_url=site + "/v1", api_key=raw_key, max_retries=0)
    prompt = "Tell me about rivers [[words=6]]"

    def reasoned(faults: str) -> tuple[str, str, str]:
        raw = client.chat.completions.with_raw_response.create(
            model="deepseek-reasoner",
            messages=[{"role": "user", "content": prompt}],
            stream=True,
            extra_headers={FAULTS_HEADER: faults},
        )
        order: list[str] = []
        reasoning = content = ""
        for chunk in raw.parse():
            for choice in chunk.choices:
                piece = (choice.delta.model_extra or {}).get("reasoning_content")
                if piece:
                    order.append("reasoning")
                    reasoning += piece
                if choice.delta.content:
                    order.append("content")
                    content += choice.delta.content
        assert order == ["reasoning", *["content"] * (len(order) - 1)], order  # thinking first, whole
        return reasoning, content, raw.headers["x-streamrecover-run"]

    clean_reasoning, clean_content, _ = reasoned("")
    assert clean_reasoning
    assert clean_reasoning not in clean_content
    body = {"model": "deepseek-reasoner", "messages": [{"role": "user", "content": prompt}]}
    events = upstream_events("/v1/chat/completions", body)
    for cut in (2, 5, events - 3):
        reasoning, content, run_id = reasoned(f"cut:events={cut}")
        assert (reasoning, content) == (clean_reasoning, clean_content), f"cut:events={cut}"
        stored = stored_assistant(run_id)
        assert content == "".join(b["text"] for b in stored if b["type"] == "text")
        # DeepSeek's reasoning is unsigned: shown whole, never committed (no provider takes it back)
        assert not [b for b in stored if b["type"] == "thinking"]


def test_citations_reach_the_anthropic_client_with_the_text_they_cite(site: str, raw_key: str) -> None:
    """A cited text block (web search answers) arrives with its ``citations_delta`` events, sent
    after text of the block (a block cut before its text is dropped by the recovery, so nothing
    cited goes out before it is sure to stay): the final message equals the provider's own."""
    prompt = "Tell me about rivers [[words=12]] [[cite]]"
    body = {"model": "claude-x", "max_tokens": 400, "messages": [{"role": "user", "content": prompt}]}
    direct = anthropic.Anthropic(base_url=local_fake_server().base_url, api_key="k", max_retries=0)
    with direct.messages.stream(**body) as s:  # type: ignore[arg-type]
        provider = comparable(s.get_final_message())
    assert len(provider["content"][0]["citations"]) == 2
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    assert comparable(anthropic_answer(client, prompt)["final"]) == provider
    events = upstream_events("/v1/messages", body)
    cuts = range(1, events)
    for cut, seen in zip(cuts, sweep(lambda faults: anthropic_answer(client, prompt, faults), cuts), strict=True):
        assert comparable(seen["final"]) == provider, f"cut:events={cut}"
        kinds = [e.delta.type for e in seen["events"] if e.type == "content_block_delta"]
        assert kinds.index("text_delta") < kinds.index("citations_delta"), f"cut:events={cut}"
        stored = stored_assistant(seen["run_id"])
        assert stored == [b.model_dump(exclude_none=True) for b in seen["final"].content], f"cut:events={cut}"


def test_failover_to_a_provider_of_another_wire_format_translates_the_clients_fields(site: str, raw_key: str) -> None:
    """An Anthropic client's request with a tool, its provider's budget spent mid-answer, goes on at
    an OpenAI Chat provider: the tool definition and choice are written in OpenAI's terms, fields
    with no counterpart are left out (and named in the run), the client gets one Anthropic stream."""
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    prompt = "Check the weather [[words=30]] [[tool]]"
    kw: dict[str, Any] = {"tools": TOOLS_ANTHROPIC, "tool_choice": {"type": "auto"}, "extra_body": {"top_k": 5}}

    def without_ids(message: anthropic.types.Message) -> dict[str, Any]:
        seen = comparable(message)
        for block in seen["content"]:
            block.pop("id", None)  # each provider names its calls
        return seen

    expected = without_ids(anthropic_answer(client, prompt, **kw)["final"])
    assert [b["type"] for b in expected["content"]] == ["text", "tool_use"]
    backup = {"ADAPTER": "openai", "BASE_URL": "fake://streamrecover"}
    configured = {
        **settings.STREAMRECOVER,
        "MAX_CONTINUATIONS": 1,
        "PROVIDERS": {**settings.STREAMRECOVER["PROVIDERS"], "fake-openai": backup},
        "PROXY_FAILOVER": {"anthropic": {"PROVIDER": "fake-openai", "MODEL": "gpt-4o"}},
    }
    with override_settings(STREAMRECOVER=configured):
        seen = anthropic_answer(client, prompt, "cut:events=8;cut:events=6", **kw)
    assert without_ids(seen["final"]) == expected  # one well-formed stream, the same answer
    stored = stored_assistant(seen["run_id"])
    assert seen["texts"] == {i: b["text"] for i, b in enumerate(stored) if b["type"] == "text"}
    run = Run.objects.get(pk=seen["run_id"])
    failover = run.events.get(name="llm_stream_failover").payload
    assert (failover["reason"], failover["to_provider"], failover["to_model"]) == ("exhausted", "fake-openai", "gpt-4o")
    assert run.options["proxy"]["failover"]["dropped"] == ["top_k"]
    last = Attempt.objects.filter(run=run).order_by("index").last()
    assert last is not None
    sent = last.request["json"]
    assert sent["model"] == "gpt-4o"
    assert sent["tools"] == TOOLS_OPENAI
    assert sent["tool_choice"] == "auto"
    assert "top_k" not in sent
    first = Attempt.objects.filter(run=run).order_by("index").first()
    assert first is not None
    assert first.request["json"]["tools"] == TOOLS_ANTHROPIC  # the first provider had them as sent


WEB_SEARCH = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]


def test_a_paused_server_tool_turn_reaches_the_anthropic_client_as_the_provider_paused_it(
    site: str, raw_key: str
) -> None:
    """The healing endpoint answers one turn and the client owns the ``pause_turn`` loop: a paused
    answer reaches it as the provider sent it, its unrun server tool call included, and is not sent
    back here; the client sending it back as it is gets the rest of the turn."""
    prompt = "What happened at sea this week?"
    paused_by = {"tools": WEB_SEARCH, "system": "[[search=1]] [[pause]]"}
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)
    answer = anthropic_answer(client, prompt, **paused_by)
    paused = answer["final"]
    assert paused.stop_reason == "pause_turn"
    assert [b.type for b in paused.content] == ["text", "server_tool_use"]
    sent_back = [b.model_dump(exclude_none=True) for b in paused.content]
    assert stored_assistant(answer["run_id"]) == sent_back  # the run is that one answer
    assert Attempt.objects.filter(run_id=answer["run_id"]).count() == 1  # not sent back by the proxy
    with client.messages.stream(
        model="claude-x",
        max_tokens=400,
        messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": sent_back}],  # type: ignore[typeddict-item]
        **paused_by,  # type: ignore[arg-type]
    ) as stream:
        rest = stream.get_final_message()
    assert rest.stop_reason == "end_turn"
    assert [b.type for b in rest.content] == ["web_search_tool_result", "text"]
    assert rest.content[0].tool_use_id == paused.content[1].id  # type: ignore[union-attr]


def test_a_clients_prefill_goes_on_through_a_break_as_it_would_unbroken(site: str, raw_key: str) -> None:
    """A client that ends its request with its own assistant text (a prefill) gets the rest of
    the answer, not an empty one; cut mid-answer, the rest it gets is still the unbroken one:
    the continuation goes on after the prefill and the text already streamed."""
    prompt = "Tell me about rivers [[words=12]]"
    client = anthropic.Anthropic(base_url=site, api_key=raw_key, max_retries=0)

    def answer(faults: str) -> tuple[anthropic.types.Message, str]:
        with client.messages.stream(
            model="claude-x",
            max_tokens=400,
            messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": "Rivers"}],
            extra_headers={FAULTS_HEADER: faults},
        ) as stream:
            return stream.get_final_message(), stream.response.headers["x-streamrecover-run"]

    clean, _ = answer("")
    clean_text = "".join(b.text for b in clean.content if b.type == "text")
    assert clean_text.strip(), "a prefilled request is answered with the rest of the answer"
    for fault in ("cut:events=5", "cut:events=8,mid"):
        broken, run_id = answer(fault)
        assert comparable(broken) == comparable(clean), fault
        assert Attempt.objects.filter(run_id=run_id).count() == 2, fault  # the break was real
