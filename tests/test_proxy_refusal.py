"""A Chat model's refusal through the healing endpoint, seen by the official ``openai`` client: it
arrives where the API puts it (``delta.refusal``, its logprobs under ``logprobs.refusal``), so the
SDK's accumulated message has ``refusal`` set and no ``content`` to parse, cut or not."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from django.conf import settings
from django.test import override_settings
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk, ParsedChoice
from pydantic import BaseModel

from streamrecover.models import Attempt, Message
from streamrecover.proxy.keys import issue_key
from streamrecover.proxy.views import FAULTS_HEADER
from streamrecover.testing.fake.model import REFUSAL_TEXT
from streamrecover.testing.host import wait_for

from .proxy_helpers import daphne_url, fake_providers, proxy_settings
from .streams import load_recorded, load_text

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Explain something forbidden [[refuse]]"


@pytest.fixture
def site() -> Iterator[str]:
    configured = proxy_settings(settings.STREAMRECOVER, PROVIDERS=fake_providers("sk-provider-refusal"))
    with override_settings(STREAMRECOVER=configured):
        yield daphne_url() + "/streamrecover/proxy/v1"


@pytest.fixture
def raw_key(django_user_model: Any) -> str:
    return issue_key(django_user_model.objects.create_user("refusal-user", password="x"))[1]


@pytest.fixture
def client(site: str, raw_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=site, api_key=raw_key, max_retries=0)


def streamed(client: openai.OpenAI, faults: str = "", **kw: Any) -> tuple[list[ChatCompletionChunk], str]:
    """Every chunk a Chat client gets for the refusing prompt, and the run's id (once it ended)."""
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        extra_headers={FAULTS_HEADER: faults},
        **kw,
    )
    chunks = list(raw.parse())
    run_id = raw.headers["x-streamrecover-run"]
    wait_for(run_id)
    return chunks, run_id


def accumulated(chunks: list[ChatCompletionChunk]) -> ParsedChoice[None]:
    """The message the SDK's own accumulator builds from the chunks (what ``.stream()`` returns)."""
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    return state.get_final_completion().choices[0]


def stored_text(run_id: str) -> str:
    (block,) = Message.objects.filter(run_id=run_id, role="assistant").get().content
    assert block["type"] == "text"  # stored as the answer's text: the run's stop reason says it was a refusal
    return str(block["text"])


def test_a_refusal_reaches_the_client_in_delta_refusal(client: openai.OpenAI) -> None:
    chunks, run_id = streamed(client)
    deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
    assert "".join(d.refusal or "" for d in deltas) == REFUSAL_TEXT
    assert all(not d.content for d in deltas)  # nothing a client would try to parse as the answer
    choice = accumulated(chunks)
    assert choice.message.refusal == REFUSAL_TEXT
    assert choice.message.content is None
    assert choice.finish_reason == "stop"  # as the API ends a refusal
    assert stored_text(run_id) == REFUSAL_TEXT
    assert Attempt.objects.get(run_id=run_id).stop_reason == "refusal"


class Answer(BaseModel):
    summary: str


def test_the_sdks_structured_output_helper_reports_the_refusal(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model="gpt-4o", messages=[{"role": "user", "content": PROMPT}], response_format=Answer
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    wait_for(str(uuid.UUID(final.id.removeprefix("chatcmpl-"))))  # the endpoint's id is the run's
    assert [e.type for e in events].count("refusal.done") == 1
    assert "content.done" not in [e.type for e in events]
    message = final.choices[0].message
    assert (message.refusal, message.content, message.parsed) == (REFUSAL_TEXT, None, None)


def test_a_refusals_logprobs_are_under_logprobs_refusal(client: openai.OpenAI) -> None:
    chunks, _ = streamed(client, logprobs=True, top_logprobs=2)
    scored = [choice for chunk in chunks for choice in chunk.choices if choice.delta.refusal]
    assert "".join(choice.delta.refusal or "" for choice in scored) == REFUSAL_TEXT
    for choice in scored:
        assert choice.logprobs is not None
        assert choice.logprobs.content is None
        entries = choice.logprobs.refusal or []
        assert "".join(entry.token for entry in entries) == choice.delta.refusal
        assert all(len(entry.top_logprobs) == 2 for entry in entries)
    assert accumulated(chunks).logprobs.content is None


@pytest.mark.parametrize("cut", ["cut:events=3", "cut:events=6,mid", "cut:from_end=3"])
def test_a_refusal_cut_short_is_kept_as_it_arrived_and_shown_as_a_refusal(client: openai.OpenAI, cut: str) -> None:
    chunks, run_id = streamed(client, cut)
    choice = accumulated(chunks)
    assert choice.message.content is None
    refusal = choice.message.refusal
    assert refusal, cut
    assert REFUSAL_TEXT.startswith(refusal), (cut, refusal)
    assert choice.finish_reason == "stop"
    assert Attempt.objects.filter(run_id=run_id).count() == 1  # a refusal is never continued
    assert stored_text(run_id) == refusal  # what the client was shown, byte for byte


def _choices(body: str) -> list[dict[str, Any]]:
    return [c for line in body.splitlines() if line.startswith("data: {") for c in json.loads(line[6:])["choices"]]


def _shape(value: Any) -> Any:
    """The JSON's keys in order, all the way down (a list by its first item), and its leaves' types."""
    if isinstance(value, dict):
        return [(name, _shape(item)) for name, item in value.items()]
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


@pytest.mark.parametrize(
    ("recorded", "logprobs"),
    [
        (lambda: load_recorded("openai_refusal_logprobs.sse").decode(), True),
        (lambda: load_text("openai_chat_refusal.sse"), False),
    ],
    ids=["logprobs", "plain"],
)
def test_the_refusal_chunks_are_the_real_apis(site: str, raw_key: str, recorded: Any, logprobs: bool) -> None:
    """The opening chunk and the finishing chunk as the API writes them, byte for byte, and each
    refusal chunk field for field, as in streams recorded from the API."""
    expected = _choices(recorded())
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    if logprobs:
        body["logprobs"] = True
    response = httpx.post(
        site + "/chat/completions", json=body, headers={"authorization": f"Bearer {raw_key}"}, timeout=30
    )
    served = _choices(response.text)
    wait_for(response.headers["x-streamrecover-run"])
    assert json.dumps(served[0]) == json.dumps(expected[0])  # {"role": "assistant", "content": null, "refusal": ""}
    assert _shape(served[1]) == _shape(expected[1])  # {"refusal": "I'm"}, its entry under logprobs.refusal
    assert json.dumps(served[-1]) == json.dumps(expected[-1])  # delta {}, logprobs null, finish_reason "stop"


@pytest.mark.parametrize(
    "sent_back",
    [
        {"role": "assistant", "content": None, "refusal": REFUSAL_TEXT},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": REFUSAL_TEXT}]},
    ],
    ids=["refusal-field", "refusal-part"],
)
def test_a_refusal_sent_back_in_the_history_reaches_the_provider_as_the_assistants_text(
    client: openai.OpenAI, sent_back: dict[str, Any]
) -> None:
    """The client's next request holds the refusal as the API's message has it (``refusal`` set,
    ``content`` null, or a ``refusal`` part): it goes on as the assistant's text, as the endpoint
    stores a refusal, never as an empty assistant message."""
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": PROMPT}, sent_back, {"role": "user", "content": "Then say hello."}],  # type: ignore[list-item]
        stream=True,
    )
    list(raw.parse())
    run_id = raw.headers["x-streamrecover-run"]
    wait_for(run_id)
    sent = Attempt.objects.get(run_id=run_id).request["json"]["messages"]
    assert sent[1] == {"role": "assistant", "content": REFUSAL_TEXT}
