"""The fake provider is no kinder than the real APIs: what it refuses and the shape of its bytes.

Each test compares the fake's answer with a fact about the real API: its documented rules, or
the streams recorded from it (read from beside the repository; skipped, saying where it
looked, when they are not there). A fake cleaner than the real thing hides the product's
bugs: a client that only ever sees compact JSON, or prefills that succeed, is not tested.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from streamrecover.engine.sse import SSEDecoder
from streamrecover.providers.anthropic import NO_PREFILL_MODELS
from streamrecover.testing.fake import FakeProviderServer

ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-key", "anthropic-version": "2023-06-01"}
OPENAI_HEADERS = {"authorization": "Bearer sk-openai-key"}
PREFILL_REFUSED = (
    "This model does not support assistant message prefill. The conversation must end with a user message."
)
HTTP = httpx.Client(timeout=10)
TIME_TOOL = {"name": "get_time", "description": "Local time", "input_schema": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProviderServer]:
    with FakeProviderServer() as running:
        yield running


@pytest.fixture(autouse=True)
def _clean(server: FakeProviderServer) -> None:
    server.reset()


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
