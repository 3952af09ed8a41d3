"""A refusal through the healing endpoint when the client's format is not the upstream's, seen by
the official SDKs: each client is told the answer was declined in the one signal its API has for
it. Anthropic's ``stop_reason: "refusal"`` comes after its text, so a Chat client gets
``finish_reason: "content_filter"`` and a Responses client an ``incomplete`` response whose reason
is ``content_filter``; an OpenAI refusal or content filter reaches an Anthropic client as
``stop_reason: "refusal"``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from django.conf import settings
from django.test import override_settings

from streamrecover.models import Attempt, Run
from streamrecover.proxy.keys import issue_key
from streamrecover.proxy.views import FAULTS_HEADER
from streamrecover.testing.fake.model import REFUSAL_TEXT
from streamrecover.testing.host import wait_for

from .proxy_helpers import daphne_url, fake_providers, proxy_settings
from .scripted_upstream import ScriptedUpstream, sse
from .streams import load_recorded
from .test_proxy_responses import check_events

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Explain something forbidden [[refuse]]"
CLAUDE = "claude-sonnet-4-5"  # the fake answers a model of this name in Anthropic's format
PROVIDERS = fake_providers("sk-provider-refusal-formats")


def configured(**more: Any) -> dict[str, Any]:
    endpoints = {"PROVIDERS": PROVIDERS, "PROXY_RESPONSES_PROVIDER": "fake", **more}
    return proxy_settings(settings.STREAMRECOVER, **endpoints)


@pytest.fixture
def raw_key(django_user_model: Any) -> str:
    return issue_key(django_user_model.objects.create_user("refusal-formats", password="x"))[1]


@pytest.fixture
def site() -> Iterator[str]:
    with override_settings(STREAMRECOVER=configured()):
        yield daphne_url() + "/streamrecover/proxy"


def openai_client(site: str, raw_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=site + "/v1", api_key=raw_key, max_retries=0)


def chat(client: openai.OpenAI, model: str, faults: str = "") -> tuple[dict[str, Any], str]:
    """What a Chat client reads from a stream of the refusing prompt (its ``content``, ``refusal``
    and ``finish_reason``, joined from the chunks), and the run's id."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], stream=True, extra_headers={FAULTS_HEADER: faults}
    )
    chunks = list(raw.parse())
    run_id = raw.headers["x-streamrecover-run"]
    wait_for(run_id)
    choices = [c for chunk in chunks for c in chunk.choices]
    finishes = [c.finish_reason for c in choices if c.finish_reason]
    assert len(finishes) == 1  # one finish chunk, the last
    seen = {
        "content": "".join(c.delta.content or "" for c in choices),
        "refusal": "".join(c.delta.refusal or "" for c in choices),
        "finish_reason": finishes[0],
    }
    return seen, run_id


def responses(client: openai.OpenAI, model: str) -> tuple[list[Any], Any]:
    """The events of a Responses stream of the refusing prompt, and the response its last one carries
    (``create``: the SDK's ``stream()`` helper has a final response only for a completed one)."""
    events = list(client.responses.create(model=model, input=PROMPT, max_output_tokens=400, stream=True))
    check_events(events)
    final = events[-1].response
    wait_for(final.id.removeprefix("resp_"))
    return events, final


def anthropic_final(raw_key: str, model: str, prompt: str, max_tokens: int) -> Any:
    """An Anthropic SDK client's streamed answer through the endpoint, once its run has settled."""
    client = anthropic.Anthropic(base_url=daphne_url() + "/streamrecover/proxy", api_key=raw_key, max_retries=0)
    with client.messages.stream(
        model=model, max_tokens=max_tokens, messages=[{"role": "user", "content": prompt}]
    ) as stream:
        final = stream.get_final_message()
    wait_for(final.id.removeprefix("msg_"))
    return final


def last_stop(run_id: str) -> str:
    last = Attempt.objects.filter(run_id=run_id).order_by("index").last()
    assert last is not None
    return str(last.stop_reason)


# ---- Anthropic's refusal, to OpenAI clients ----------------------------------------------------


def test_an_anthropic_refusal_reaches_a_chat_client_as_a_content_filter(site: str, raw_key: str) -> None:
    client = openai_client(site, raw_key)
    seen, run_id = chat(client, CLAUDE)
    assert seen["content"] == REFUSAL_TEXT  # streamed as the answer before the stop reason came
    assert seen["finish_reason"] == "content_filter"  # not "stop": the client can tell it was declined
    assert last_stop(run_id) == "refusal"
    # the SDK's helpers treat it as they treat OpenAI's own content filter: no completion to parse
    with client.chat.completions.stream(model=CLAUDE, messages=[{"role": "user", "content": PROMPT}]) as stream:
        events = list(stream)
        with pytest.raises(openai.ContentFilterFinishReasonError):
            stream.get_final_completion()
    assert "".join(e.delta for e in events if e.type == "content.delta") == REFUSAL_TEXT
    wait_for(str(uuid.UUID(events[0].chunk.id.removeprefix("chatcmpl-"))))  # the endpoint's id is the run's


def test_an_anthropic_refusal_after_a_failover_reaches_the_chat_client_as_a_content_filter(
    site: str, raw_key: str
) -> None:
    """The Chat provider's budget is spent before anything streamed; the Anthropic fallback refuses."""
    failover = {"openai": {"PROVIDER": "fake", "MODEL": CLAUDE}}
    with override_settings(STREAMRECOVER=configured(MAX_CONTINUATIONS=1, PROXY_FAILOVER=failover)):
        seen, run_id = chat(openai_client(site, raw_key), "gpt-4o", "cut:events=0;cut:events=0")
    assert Run.objects.get(pk=run_id).events.filter(name="llm_stream_failover").exists()
    assert seen == {"content": REFUSAL_TEXT, "refusal": "", "finish_reason": "content_filter"}


def test_an_anthropic_refusal_reaches_a_responses_client_as_incomplete_for_a_content_filter(
    site: str, raw_key: str
) -> None:
    events, final = responses(openai_client(site, raw_key), CLAUDE)
    assert final.output_text == REFUSAL_TEXT
    assert (final.status, final.incomplete_details.reason) == ("incomplete", "content_filter")
    assert events[-1].type == "response.incomplete"


# ---- OpenAI's refusal, to Anthropic clients ----------------------------------------------------


@pytest.mark.parametrize("upstream", ["chat", "responses"])
def test_an_openai_refusal_reaches_an_anthropic_client_as_a_refusal_stop(raw_key: str, upstream: str) -> None:
    """A Chat model's ``delta.refusal`` (a Responses model's ``refusal`` part): the Anthropic client
    gets its text as the answer and ``stop_reason: "refusal"``, as Anthropic ends a refusal. (This
    held before the content filter mapping: it guards the case, which no test covered.)"""
    provider = {"chat": "fake", "responses": "fake-responses"}[upstream]
    with override_settings(STREAMRECOVER=configured(PROXY_ANTHROPIC_PROVIDER=provider)):
        final = anthropic_final(raw_key, "gpt-4o", PROMPT, 400)
    assert [(b.type, getattr(b, "text", None)) for b in final.content] == [("text", REFUSAL_TEXT)]
    assert final.stop_reason == "refusal"


# ---- real upstream streams, served as recorded --------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    served = ScriptedUpstream()
    yield served
    served.close()


def served_by(upstream: ScriptedUpstream, adapter: str) -> Any:
    base = upstream.url + ("/v1" if adapter == "openai" else "")
    providers = {"up": {"ADAPTER": adapter, "BASE_URL": base, "API_KEY": "sk-up"}}
    endpoints = {f"PROXY_{f}_PROVIDER": "up" for f in ("ANTHROPIC", "OPENAI", "RESPONSES")}
    return override_settings(
        STREAMRECOVER=proxy_settings(settings.STREAMRECOVER, PROVIDERS=providers, DEFAULT_PROVIDER="up", **endpoints)
    )


def test_a_recorded_anthropic_refusal_with_no_text_is_a_content_filter_for_openai_clients(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    """Anthropic's API refusing before any text (``stop_details`` naming the policy, no content
    block): a Chat client would otherwise get an empty answer that ended with "stop"."""
    upstream.responses = {"/v1/messages": load_recorded("anthropic_refusal_stop_details.sse")}
    client = openai_client(daphne_url() + "/streamrecover/proxy", raw_key)
    with served_by(upstream, "anthropic"):
        seen, run_id = chat(client, "claude-x")
        _, final = responses(client, "claude-x")
    assert seen == {"content": "", "refusal": "", "finish_reason": "content_filter"}
    assert last_stop(run_id) == "refusal"
    assert (final.status, final.incomplete_details.reason, final.output) == ("incomplete", "content_filter", [])


def test_a_chat_content_filter_reaches_an_anthropic_client_as_a_refusal_stop(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    """A Chat provider's ``finish_reason: "content_filter"`` (Azure's content filter): Anthropic's
    API has no such stop reason; the Anthropic client is told ``refusal``."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}
    upstream.responses = {
        "/v1/chat/completions": sse(
            [
                (None, {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
                (None, {**head, "choices": [{"index": 0, "delta": {"content": "Once upon"}, "finish_reason": None}]}),
                (None, {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}),
                (None, "[DONE]"),
            ]
        )
    }
    with served_by(upstream, "openai"):
        final = anthropic_final(raw_key, "gpt-x", "hi", 50)
    assert [(b.type, getattr(b, "text", None)) for b in final.content] == [("text", "Once upon")]
    assert final.stop_reason == "refusal"


def test_a_gemini_safety_stop_reaches_an_anthropic_client_as_a_refusal_stop(raw_key: str) -> None:
    """A Gemini model blocked for safety (``finishReason: "SAFETY"``, no content) answering an
    Anthropic client: its stop is ``refusal``, a value the SDK knows, not ``content_filter``."""
    gemini = {"ADAPTER": "gemini", "BASE_URL": "fake://streamrecover", "API_KEY": "sk-provider-gemini"}
    providers = {**PROVIDERS, "fake-gemini": gemini}
    with override_settings(STREAMRECOVER=configured(PROVIDERS=providers, PROXY_ANTHROPIC_PROVIDER="fake-gemini")):
        final = anthropic_final(raw_key, "gemini-2.5-flash", PROMPT, 400)
    assert final.content == []
    assert final.stop_reason == "refusal"
