"""A Responses model's refusal through the healing endpoint, seen by the official ``openai`` client:
it arrives where the API puts it (a ``refusal`` content part, ``response.refusal.delta`` and
``.done`` events), so the SDK reports a refusal and parses no JSON, cut or not; a refusal sent
back in the next request reaches the provider as the assistant's text. A Responses refusal reaches
a Chat client as ``delta.refusal``, and a Chat refusal a Responses client as a refusal part."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from django.conf import settings
from django.test import override_settings
from openai.lib.streaming.chat import ChatCompletionStreamState
from pydantic import BaseModel

from streamrecover.models import Attempt, Message
from streamrecover.proxy.keys import issue_key
from streamrecover.proxy.views import FAULTS_HEADER
from streamrecover.testing.fake.model import REFUSAL_TEXT
from streamrecover.testing.host import wait_for

from .proxy_helpers import daphne_url, fake_providers, proxy_settings
from .test_proxy_responses import check_events

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Explain something forbidden [[refuse]]"
PROVIDERS = fake_providers("sk-provider-responses-refusal")


def configured(**more: Any) -> dict[str, Any]:
    return proxy_settings(
        settings.STREAMRECOVER, PROVIDERS=PROVIDERS, PROXY_RESPONSES_PROVIDER="fake-responses", **more
    )


@pytest.fixture
def site() -> Iterator[str]:
    with override_settings(STREAMRECOVER=configured()):
        yield daphne_url() + "/streamrecover/proxy/v1"


@pytest.fixture
def client(site: str, django_user_model: Any) -> openai.OpenAI:
    user = django_user_model.objects.create_user("responses-refusal-user", password="x")
    return openai.OpenAI(base_url=site, api_key=issue_key(user)[1], max_retries=0)


class Answer(BaseModel):
    summary: str


def refused(client: openai.OpenAI, faults: str = "", **kw: Any) -> tuple[list[Any], Any, str]:
    """The events and final response a Responses client gets for the refusing prompt, and the run's id."""
    with client.responses.stream(
        model="gpt-4o", input=PROMPT, max_output_tokens=400, extra_headers={FAULTS_HEADER: faults}, **kw
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    check_events(events)
    run_id = final.id.removeprefix("resp_")
    wait_for(run_id)
    return events, final, run_id


def refusal_of(final: Any) -> str:
    """The response's one message's one part, which must be a refusal: its text."""
    (message,) = final.output
    (part,) = message.content
    assert part.type == "refusal", part
    return str(part.refusal)


def stored_text(run_id: str) -> str:
    (block,) = Message.objects.filter(run_id=run_id, role="assistant").get().content
    assert block["type"] == "text"  # stored as the answer's text: the run's stop reason says it was a refusal
    return str(block["text"])


def last_model(run_id: str) -> str:
    """The model the run's last attempt asked."""
    last = Attempt.objects.filter(run_id=run_id).order_by("index").last()
    assert last is not None
    return str(last.request["json"]["model"])


def test_a_refusal_reaches_a_responses_client_as_a_refusal_part(client: openai.OpenAI) -> None:
    events, final, run_id = refused(client)
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds
    (added,) = [e for e in events if e.type == "response.content_part.added"]
    assert (added.part.type, added.part.refusal) == ("refusal", "")
    assert "".join(e.delta for e in events if e.type == "response.refusal.delta") == REFUSAL_TEXT
    (done,) = [e for e in events if e.type == "response.refusal.done"]
    assert done.refusal == REFUSAL_TEXT
    assert (done.item_id, done.output_index, done.content_index) == (added.item_id, 0, 0)
    (part_done,) = [e for e in events if e.type == "response.content_part.done"]
    assert (part_done.part.type, part_done.part.refusal) == ("refusal", REFUSAL_TEXT)
    assert kinds.index("response.refusal.done") < kinds.index("response.content_part.done")
    assert refusal_of(final) == REFUSAL_TEXT
    assert final.output_text == ""  # nothing a client would read as the answer
    assert stored_text(run_id) == REFUSAL_TEXT
    assert Attempt.objects.get(run_id=run_id).stop_reason == "refusal"


def test_the_sdks_structured_output_helper_reports_the_refusal_and_parses_nothing(client: openai.OpenAI) -> None:
    _, final, _ = refused(client, text_format=Answer)
    assert refusal_of(final) == REFUSAL_TEXT
    assert final.output_parsed is None


@pytest.mark.parametrize("cut", ["cut:events=6", "cut:events=8,mid", "cut:from_end=6"])
def test_a_refusal_cut_short_is_kept_as_it_arrived_and_shown_as_a_refusal(client: openai.OpenAI, cut: str) -> None:
    events, final, run_id = refused(client, cut)
    shown = "".join(e.delta for e in events if e.type == "response.refusal.delta")
    assert shown, cut
    assert REFUSAL_TEXT.startswith(shown), (cut, shown)
    assert refusal_of(final) == shown
    assert final.status == "completed"
    assert Attempt.objects.filter(run_id=run_id).count() == 1  # a refusal is never continued
    assert stored_text(run_id) == shown  # what the client was shown, byte for byte


def test_a_refusal_part_sent_back_reaches_the_provider_as_the_assistants_text(client: openai.OpenAI) -> None:
    history: Any = [
        {"role": "user", "content": PROMPT},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": REFUSAL_TEXT}]},
        {"role": "user", "content": "Then say hello."},
    ]
    with client.responses.stream(model="gpt-4o", input=history, max_output_tokens=400) as stream:
        list(stream)
        final = stream.get_final_response()
    run_id = final.id.removeprefix("resp_")
    wait_for(run_id)
    sent = Attempt.objects.get(run_id=run_id).request["json"]["input"]
    assert sent[1] == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": REFUSAL_TEXT}],
    }


def test_a_chat_refusal_reaches_a_responses_client_as_a_refusal_part_after_a_failover(client: openai.OpenAI) -> None:
    """The Responses provider's budget is spent before anything streamed; the Chat fallback
    refuses in ``delta.refusal``: the Responses client gets it as a refusal part."""
    failover = {"responses": {"PROVIDER": "fake", "MODEL": "gpt-4o-mini"}}
    with override_settings(STREAMRECOVER=configured(MAX_CONTINUATIONS=1, PROXY_FAILOVER=failover)):
        events, final, run_id = refused(client, "cut:events=2;cut:events=2")
    assert "response.output_text.delta" not in [e.type for e in events]
    assert refusal_of(final) == REFUSAL_TEXT
    assert last_model(run_id) == "gpt-4o-mini"  # the fallback's answer


def test_a_responses_refusal_reaches_a_chat_client_in_delta_refusal(client: openai.OpenAI) -> None:
    """A Chat client whose provider's budget is spent before anything streamed goes on at the
    Responses fallback, which refuses: the client reads it in ``delta.refusal``."""
    failover = {"openai": {"PROVIDER": "fake-responses", "MODEL": "gpt-4o"}}
    with override_settings(STREAMRECOVER=configured(MAX_CONTINUATIONS=1, PROXY_FAILOVER=failover)):
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": PROMPT}],
            stream=True,
            extra_headers={FAULTS_HEADER: "cut:events=0;cut:events=0"},
        )
        chunks = list(raw.parse())
        wait_for(raw.headers["x-streamrecover-run"])
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    message = state.get_final_completion().choices[0].message
    assert (message.refusal, message.content) == (REFUSAL_TEXT, None)
    assert last_model(raw.headers["x-streamrecover-run"]) == "gpt-4o"  # the fallback's answer
