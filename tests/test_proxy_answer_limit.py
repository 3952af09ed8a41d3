"""A non-streamed request's answer is held whole before it is sent, so it is read with a cap
(``PROXY_MAX_RESPONSE_BYTES``, counted inflated): past it the client gets a 502 in its provider's
shape, and the next request is answered as usual. The provider is asked for an uncompressed
answer; one compressed regardless reaches the client inflated, readable by any SDK."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import anthropic
import httpx
import pytest
from django.conf import settings
from django.test import override_settings

from streamrecover.proxy.keys import issue_key

from .proxy_helpers import daphne_url, proxy_settings
from .scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 65_536
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [{"type": "text", "text": "Hello"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 1},
}


def gzip(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return packer.compress(data) + packer.flush()


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    served = ScriptedUpstream()
    served.headers = {"content-type": "application/json"}
    yield served
    served.close()


@pytest.fixture
def raw_key(django_user_model: Any) -> str:
    return issue_key(django_user_model.objects.create_user("answers", password="x"))[1]


def served_by(upstream: ScriptedUpstream) -> AbstractContextManager[Any]:
    providers = {"claude": {"ADAPTER": "anthropic", "BASE_URL": upstream.url, "API_KEY": "sk-up"}}
    configured = proxy_settings(
        settings.STREAMRECOVER,
        PROVIDERS=providers,
        PROXY_ANTHROPIC_PROVIDER="claude",
        PROXY_MAX_RESPONSE_BYTES=LIMIT,
        MAX_REQUEST_RETRIES=0,
    )
    return override_settings(STREAMRECOVER=configured)


def post(raw_key: str) -> httpx.Response:
    body = {"model": "claude-x", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(daphne_url() + "/streamrecover/proxy/v1/messages", json=body, headers={"x-api-key": raw_key})


def test_an_answer_past_the_cap_is_a_502_and_the_next_one_passes(upstream: ScriptedUpstream, raw_key: str) -> None:
    """1 MiB of JSON inflated from 1 KiB on the wire, the cap 64 KiB: a 502 the SDK reads as an
    API error naming the setting; the next (small) answer passes through as sent."""
    huge = json.dumps({**MESSAGE, "pad": "a" * (1024 * 1024)}).encode()
    upstream.responses = {"/v1/messages": [gzip(huge), json.dumps(MESSAGE).encode()]}
    upstream.headers["content-encoding"] = "gzip"
    with served_by(upstream):
        refused = post(raw_key)
        upstream.headers.pop("content-encoding")
        passed = post(raw_key)
    assert refused.status_code == 502
    error = refused.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "api_error"
    assert "PROXY_MAX_RESPONSE_BYTES (65536 bytes)" in error["error"]["message"]
    assert passed.status_code == 200
    assert passed.json() == MESSAGE


def test_a_plain_answer_past_the_cap_is_a_502_too(upstream: ScriptedUpstream, raw_key: str) -> None:
    upstream.responses = {"/v1/messages": json.dumps({**MESSAGE, "pad": "a" * LIMIT}).encode()}
    with served_by(upstream):
        response = post(raw_key)
    assert response.status_code == 502
    assert "PROXY_MAX_RESPONSE_BYTES" in response.json()["error"]["message"]


def test_the_provider_is_asked_for_identity_and_a_compressed_answer_reaches_the_sdk_inflated(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    upstream.responses = {"/v1/messages": gzip(json.dumps(MESSAGE).encode())}
    upstream.headers["content-encoding"] = "gzip"
    client = anthropic.Anthropic(base_url=daphne_url() + "/streamrecover/proxy", api_key=raw_key, max_retries=0)
    with served_by(upstream):
        raw = client.messages.with_raw_response.create(
            model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        )
    assert "content-encoding" not in raw.headers
    message = raw.parse()
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello"
    sent = {name.lower(): value for name, value in upstream.requests[-1]["headers"].items()}
    assert sent["accept-encoding"] == "identity"
