"""The healing endpoint says what the provider said, in the client's own API: the usage (each API
counts cached input tokens its own way; the reasoning tokens of every attempt), the stop sequence
that ended the answer, and the client's ``anthropic-beta`` flags reaching an Anthropic provider. A
scripted provider upstream (the official clients downstream) reports what the built-in fake does not."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import anthropic
import httpx
import openai
import pytest
from django.conf import settings
from django.test import override_settings

from streamrecover.models import Attempt, Run
from streamrecover.proxy.keys import issue_key
from streamrecover.testing.host import wait_for

from .proxy_helpers import daphne_url, proxy_settings
from .scripted_upstream import ScriptedUpstream, anthropic_stream, chat_stream, gemini_stream

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    served = ScriptedUpstream()
    yield served
    served.close()


@pytest.fixture
def raw_key(django_user_model: Any) -> str:
    return issue_key(django_user_model.objects.create_user("fidelity", password="x"))[1]


def served_by(upstream: ScriptedUpstream, provider: str, **anthropic_entry: Any) -> AbstractContextManager[Any]:
    """Every endpoint served by ``provider``: ``"claude"`` (Anthropic), ``"gpt"`` (OpenAI Chat) or
    ``"gemini"``."""
    providers = {
        "claude": {"ADAPTER": "anthropic", "BASE_URL": upstream.url, "API_KEY": "sk-up", **anthropic_entry},
        "gpt": {"ADAPTER": "openai", "BASE_URL": upstream.url + "/v1", "API_KEY": "sk-up"},
        "gemini": {"ADAPTER": "gemini", "BASE_URL": upstream.url, "API_KEY": "sk-up"},
    }
    endpoints = {f"PROXY_{f}_PROVIDER": provider for f in ("ANTHROPIC", "OPENAI", "RESPONSES")}
    configured = proxy_settings(settings.STREAMRECOVER, PROVIDERS=providers, DEFAULT_PROVIDER=provider, **endpoints)
    return override_settings(STREAMRECOVER=configured)


def anthropic_client(raw_key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daphne_url() + "/streamrecover/proxy", api_key=raw_key, max_retries=0)


def openai_client(raw_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=daphne_url() + "/streamrecover/proxy/v1", api_key=raw_key, max_retries=0)


def anthropic_final(raw_key: str, **kw: Any) -> anthropic.types.Message:
    with anthropic_client(raw_key).messages.stream(model="m", max_tokens=50, messages=MESSAGES, **kw) as stream:
        final = stream.get_final_message()
    wait_for(Run.objects.get().pk)
    return final


def chat_usage(raw_key: str) -> Any:
    chunks = openai_client(raw_key).chat.completions.create(
        model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    usage = [c.usage for c in chunks if c.usage is not None]
    wait_for(Run.objects.get().pk)
    assert len(usage) == 1
    return usage[0]


# ---- usage: each API's own meaning of input tokens ------------------------------------------


def test_an_anthropic_client_of_a_chat_provider_sees_cached_tokens_apart_from_its_input_tokens(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    upstream.responses = {"/v1/chat/completions": chat_stream(prompt_tokens=100, cached=80)}
    with served_by(upstream, "gpt"):
        usage = anthropic_final(raw_key).usage
    # Anthropic's input_tokens leave out the cache reads: 100 in all, never 180
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (20, 80, 5)


def test_a_chat_client_of_an_anthropic_provider_sees_cached_tokens_in_its_prompt_tokens(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    upstream.responses = {"/v1/messages": anthropic_stream(input_tokens=10, cache_read=1000, cache_creation=6)}
    with served_by(upstream, "claude"):
        usage = chat_usage(raw_key)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (1016, 5, 1021)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 1000
    # stored as the run's figures count them: every input token of the attempt
    assert Attempt.objects.get().input_tokens == 1016


def test_a_chat_client_of_a_chat_provider_keeps_its_cached_tokens(upstream: ScriptedUpstream, raw_key: str) -> None:
    upstream.responses = {"/v1/chat/completions": chat_stream(prompt_tokens=100, cached=80)}
    with served_by(upstream, "gpt"):
        usage = chat_usage(raw_key)
    assert (usage.prompt_tokens, usage.total_tokens) == (100, 105)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 80


def test_a_responses_client_of_an_anthropic_provider_sees_cached_tokens_in_its_input_tokens(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    upstream.responses = {"/v1/messages": anthropic_stream(input_tokens=10, cache_read=1000)}
    with served_by(upstream, "claude"):
        with openai_client(raw_key).responses.stream(model="m", input="hi") as stream:
            usage = stream.get_final_response().usage
        wait_for(Run.objects.get().pk)
    assert usage is not None
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.total_tokens) == (1010, 1000, 1015)


# ---- usage: reasoning tokens, part of the output tokens and shown apart ---------------------

# Gemini reports usage on every chunk, so a broken attempt's thinking is counted too: 7 thought
# and 3 answer tokens before the break, 4 and 2 in the continuation
BROKEN_THEN_CONTINUED = [
    gemini_stream("Hello", thoughts=7, candidates=3, finished=False),
    gemini_stream(" there", thoughts=4, candidates=2),
]


def test_a_chat_client_of_a_chat_provider_sees_its_reasoning_tokens(upstream: ScriptedUpstream, raw_key: str) -> None:
    upstream.responses = {"/v1/chat/completions": chat_stream(completion_tokens=50, reasoning_tokens=40)}
    with served_by(upstream, "gpt"):
        usage = chat_usage(raw_key)
    assert usage.completion_tokens == 50
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 40
    assert Attempt.objects.get().reasoning_tokens == 40


def test_a_chat_client_sees_the_reasoning_tokens_of_every_attempt_of_a_continued_answer(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    upstream.responses = {"/v1beta/models/": list(BROKEN_THEN_CONTINUED)}
    with served_by(upstream, "gemini"):
        usage = chat_usage(raw_key)
    assert Attempt.objects.count() == 2  # the break was real
    # thinking is billed as output: both attempts' thoughts are in completion_tokens, and shown apart
    assert usage.completion_tokens == 7 + 3 + 4 + 2
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 7 + 4
    assert sorted(a.reasoning_tokens for a in Attempt.objects.all()) == [4, 7]


def test_a_responses_client_sees_the_reasoning_tokens_of_every_attempt_of_a_continued_answer(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    upstream.responses = {"/v1beta/models/": list(BROKEN_THEN_CONTINUED)}
    with served_by(upstream, "gemini"):
        with openai_client(raw_key).responses.stream(model="m", input="hi") as stream:
            usage = stream.get_final_response().usage
        wait_for(Run.objects.get().pk)
    assert Attempt.objects.count() == 2
    assert usage is not None
    assert usage.output_tokens == 7 + 3 + 4 + 2
    assert usage.output_tokens_details.reasoning_tokens == 7 + 4


def test_an_anthropic_client_of_an_anthropic_provider_sees_the_providers_own_usage(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    upstream.responses = {"/v1/messages": anthropic_stream(input_tokens=10, cache_read=1000, cache_creation=6)}
    with served_by(upstream, "claude"):
        usage = anthropic_final(raw_key).usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (10, 1000, 6)


# ---- the stop sequence ----------------------------------------------------------------------


def test_the_stop_sequence_that_ended_the_answer_reaches_the_anthropic_client(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    upstream.responses = {"/v1/messages": anthropic_stream(stop_reason="stop_sequence", stop_sequence="END")}
    with served_by(upstream, "claude"):
        final = anthropic_final(raw_key, stop_sequences=["END"])
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")


# ---- the client's beta flags ----------------------------------------------------------------


def test_the_clients_beta_flags_reach_an_anthropic_provider_with_the_providers_own(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    upstream.responses = {"/v1/messages": anthropic_stream()}
    mcp = [{"type": "url", "url": "https://mcp.example.com/sse", "name": "ex"}]
    configured = {"EXTRA_HEADERS": {"anthropic-beta": "context-1m-2025-08-07"}}
    with served_by(upstream, "claude", **configured):
        anthropic_final(
            raw_key,
            extra_body={"mcp_servers": mcp},
            extra_headers={"anthropic-beta": "mcp-client-2025-04-04, context-1m-2025-08-07"},
        )
    sent = upstream.requests[-1]
    assert sent["body"]["mcp_servers"] == mcp
    assert sent["headers"]["anthropic-beta"] == "context-1m-2025-08-07,mcp-client-2025-04-04"


def test_a_non_streamed_request_takes_the_clients_beta_flags_too(upstream: ScriptedUpstream, raw_key: str) -> None:
    upstream.responses = {"/v1/messages": b"{}"}
    body = {"model": "m", "max_tokens": 50, "messages": MESSAGES}
    headers = {"x-api-key": raw_key, "anthropic-beta": "mcp-client-2025-04-04"}
    with served_by(upstream, "claude"):
        response = httpx.post(daphne_url() + "/streamrecover/proxy/v1/messages", json=body, headers=headers)
    assert response.status_code == 200
    assert upstream.requests[-1]["headers"]["anthropic-beta"] == "mcp-client-2025-04-04"
