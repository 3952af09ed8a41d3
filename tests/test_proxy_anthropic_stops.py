"""How an Anthropic client's answer ends through the healing endpoint, read by the official SDK:
an Anthropic upstream's own stop (its ``stop_reason`` as written, a refusal's ``stop_details``)
reaches it as sent, uncut or continued after a break; another provider's stop is one of the
values of Anthropic's ``StopReason``, never the app's own name or a foreign one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import anthropic
import pytest
from django.conf import settings
from django.test import override_settings

from streamrecover.models import Attempt, Run
from streamrecover.proxy.keys import issue_key
from streamrecover.proxy.views import FAULTS_HEADER
from streamrecover.testing.fake.model import REFUSAL_TEXT
from streamrecover.testing.host import wait_for

from .proxy_helpers import daphne_url, fake_providers, proxy_settings
from .scripted_upstream import ScriptedUpstream, anthropic_stream, sse
from .streams import load_recorded

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = [{"role": "user", "content": "hi"}]
KEPT = "Let me think about"  # what an upstream sent before its stream broke

# a Messages stream cut after its first text: no message_delta, no message_stop
BROKEN_ANTHROPIC = sse(
    [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-x",
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 10, "output_tokens": 1},
                },
            },
        ),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": KEPT}},
        ),
    ]
)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    served = ScriptedUpstream()
    yield served
    served.close()


@pytest.fixture
def raw_key(django_user_model: Any) -> str:
    return issue_key(django_user_model.objects.create_user("anthropic-stops", password="x"))[1]


def served_by(upstream: ScriptedUpstream, adapter: str) -> AbstractContextManager[Any]:
    """The Anthropic endpoint served by the scripted upstream speaking ``adapter``'s API."""
    providers = {"up": {"ADAPTER": adapter, "BASE_URL": upstream.url, "API_KEY": "sk-up"}}
    configured = proxy_settings(
        settings.STREAMRECOVER, PROVIDERS=providers, DEFAULT_PROVIDER="up", PROXY_ANTHROPIC_PROVIDER="up"
    )
    return override_settings(STREAMRECOVER=configured)


def client(raw_key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daphne_url() + "/streamrecover/proxy", api_key=raw_key, max_retries=0)


def answer(raw_key: str, content: str = "hi", faults: str = "") -> tuple[anthropic.types.Message, dict[str, Any]]:
    """The SDK's final message and the raw ``delta`` of the stream's ``message_delta`` event."""
    messages = [{"role": "user", "content": content}]
    headers = {FAULTS_HEADER: faults} if faults else {}
    with client(raw_key).messages.stream(
        model="claude-x", max_tokens=400, messages=messages, extra_headers=headers
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()
    wait_for(final.id.removeprefix("msg_"))
    assert len(deltas) == 1
    return final, deltas[0].model_dump(exclude_unset=True)


def recorded_stop_details() -> dict[str, Any]:
    """The ``stop_details`` of the recorded refusal's ``message_delta``, as Anthropic's API sent them."""
    for line in load_recorded("anthropic_refusal_stop_details.sse").decode().splitlines():
        if line.startswith("data:") and '"message_delta"' in line:
            details: dict[str, Any] = json.loads(line.removeprefix("data:"))["delta"]["stop_details"]
            return details
    raise AssertionError("the recording has no message_delta")


# ---- stop_details -------------------------------------------------------------------------------


@pytest.mark.parametrize("faults", ["", "cut:events=0"], ids=["uncut", "broken-then-retried"])
def test_an_anthropic_refusal_reaches_the_anthropic_client_with_its_stop_details(raw_key: str, faults: str) -> None:
    """The fake refuses as the API does, ``stop_details: {"type": "refusal", ...}`` on its
    ``message_delta``: the SDK's ``message.stop_details`` says it was a refusal."""
    providers = fake_providers("sk-provider-anthropic-stops")
    with override_settings(STREAMRECOVER=proxy_settings(settings.STREAMRECOVER, PROVIDERS=providers)):
        final, delta = answer(raw_key, "Explain something forbidden [[refuse]]", faults)
    assert final.stop_reason == "refusal"
    assert [getattr(b, "text", None) for b in final.content] == [REFUSAL_TEXT]
    assert final.stop_details is not None
    assert final.stop_details.model_dump() == {"type": "refusal", "category": None, "explanation": None}
    assert delta["stop_details"] == {"type": "refusal", "category": None, "explanation": None}


def test_a_recorded_refusals_stop_details_reach_the_anthropic_client_as_sent(
    upstream: ScriptedUpstream, raw_key: str
) -> None:
    """Anthropic's API refusing before any text, naming the policy: the client reads the category
    and the explanation the API wrote (skipped, saying so, without the recorded streams)."""
    upstream.responses = {"/v1/messages": load_recorded("anthropic_refusal_stop_details.sse")}
    with served_by(upstream, "anthropic"):
        final, delta = answer(raw_key)
    sent = recorded_stop_details()
    assert delta == {"stop_reason": "refusal", "stop_sequence": None, "stop_details": sent}
    assert final.stop_details is not None
    assert final.stop_details.category == "reasoning_extraction" == sent["category"]
    assert final.stop_details.explanation == sent["explanation"]
    assert (final.stop_reason, final.content) == ("refusal", [])


def test_a_continuations_recorded_refusal_keeps_its_stop_details(upstream: ScriptedUpstream, raw_key: str) -> None:
    """The stream breaks after some text; its continuation is refused: the answer's end came from
    the continuation, whose ``stop_details`` the client gets."""
    upstream.responses = {"/v1/messages": [BROKEN_ANTHROPIC, load_recorded("anthropic_refusal_stop_details.sse")]}
    with served_by(upstream, "anthropic"):
        final, delta = answer(raw_key)
    assert Attempt.objects.count() == 2  # the break was real
    assert [getattr(b, "text", None) for b in final.content] == [KEPT]
    assert final.stop_reason == "refusal"
    assert delta["stop_details"] == recorded_stop_details()


def test_the_null_stop_details_of_an_ordinary_stop_pass_as_sent(upstream: ScriptedUpstream, raw_key: str) -> None:
    """The API's newer streams say ``"stop_details": null`` on every ``message_delta``: so does the endpoint."""
    body = anthropic_stream("Hello").replace(b'"stop_sequence": null}', b'"stop_sequence": null, "stop_details": null}')
    assert b'"stop_details": null' in body
    upstream.responses = {"/v1/messages": body}
    with served_by(upstream, "anthropic"):
        final, delta = answer(raw_key)
    assert delta == {"stop_reason": "end_turn", "stop_sequence": None, "stop_details": None}
    assert final.stop_reason == "end_turn"


# ---- Anthropic's own stop reasons, written back as its own ----------------------------------------


@pytest.mark.parametrize("broken", [False, True], ids=["uncut", "continued"])
def test_a_full_context_window_reaches_the_anthropic_client_as_anthropics_own_stop(
    upstream: ScriptedUpstream, raw_key: str, broken: bool
) -> None:
    """``model_context_window_exceeded``, not the app's internal ``context_overflow``."""
    last = anthropic_stream(" more", stop_reason="model_context_window_exceeded")
    upstream.responses = {"/v1/messages": [BROKEN_ANTHROPIC, last] if broken else last}
    with served_by(upstream, "anthropic"):
        final, delta = answer(raw_key)
    assert Attempt.objects.count() == (2 if broken else 1)
    assert final.stop_reason == "model_context_window_exceeded"
    assert delta["stop_reason"] == "model_context_window_exceeded"


# ---- another provider's stop reasons, as Anthropic's ----------------------------------------------


def gemini_chunk(text: str, finish: str | None) -> bytes:
    candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 2, "totalTokenCount": 12}
    return sse([(None, {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "gemini-x"})])


@pytest.mark.parametrize("finish", ["OTHER", "MALFORMED_FUNCTION_CALL", "FINISH_REASON_UNSPECIFIED"])
@pytest.mark.parametrize("broken", [False, True], ids=["uncut", "continued"])
def test_a_gemini_stop_anthropic_has_no_name_for_reaches_the_anthropic_client_as_end_turn(
    upstream: ScriptedUpstream, raw_key: str, finish: str, broken: bool
) -> None:
    """Gemini's ``OTHER`` and ``MALFORMED_FUNCTION_CALL`` are the app's ``other`` and
    ``malformed_function_call``, values the Anthropic SDK's ``StopReason`` does not have: the
    client is told ``end_turn``, as widely used translators end a reason they cannot map."""
    last = gemini_chunk(" there", finish)
    upstream.responses = {"/v1beta/models/": [gemini_chunk("Hello", None), last] if broken else last}
    with served_by(upstream, "gemini"):
        final, delta = answer(raw_key)
    run = Run.objects.get()
    assert Attempt.objects.filter(run=run).count() == (2 if broken else 1)
    assert final.stop_reason == "end_turn"
    assert delta == {"stop_reason": "end_turn", "stop_sequence": None}  # no stop_details: Gemini sent none
    assert "".join(getattr(b, "text", "") for b in final.content).endswith("there")
