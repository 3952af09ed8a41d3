"""Token logprobs through the healing endpoint's ``v1/responses``, seen by the official ``openai``
client: a Responses client whose ``include`` asks for them gets the provider's on each
``output_text.delta`` of the text they belong to, all of them on ``output_text.done`` and in the
finished output text part (with ``bytes`` there), and after a break only those whose token is
exactly the text it was shown; a client that does not ask gets ``[]``, as from the API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from django.conf import settings
from django.test import override_settings

from streamrecover.models import Attempt, Run
from streamrecover.proxy.keys import issue_key
from streamrecover.proxy.views import FAULTS_HEADER
from streamrecover.testing.fake.local import local_fake_server
from streamrecover.testing.host import wait_for

from .proxy_helpers import daphne_url, fake_providers, proxy_settings, sweep, upstream_events

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Tell me about rivers [[words=10]]"
LOGPROBS = "message.output_text.logprobs"
# (a delta's text, its logprobs entries as JSON)
Scored = list[tuple[str, list[dict[str, Any]]]]


def _providers() -> dict[str, Any]:
    return fake_providers("sk-provider-resp-logprobs")


@pytest.fixture
def site() -> Iterator[str]:
    configured = proxy_settings(
        settings.STREAMRECOVER, PROVIDERS=_providers(), PROXY_RESPONSES_PROVIDER="fake-responses"
    )
    with override_settings(STREAMRECOVER=configured):
        yield daphne_url() + "/streamrecover/proxy/v1"


@pytest.fixture
def client(site: str, django_user_model: Any) -> openai.OpenAI:
    user = django_user_model.objects.create_user("responses-logprobs-user", password="x")
    return openai.OpenAI(base_url=site, api_key=issue_key(user)[1], max_retries=0)


def scored_answer(client: openai.OpenAI, prompt: str, faults: str = "", **kw: Any) -> dict[str, Any]:
    """What a client asking for logprobs (two alternatives each) gets: each delta's text and
    entries, the done event's entries, the final response's text part, and the run's id."""
    with client.responses.stream(
        model="gpt-4o",
        input=prompt,
        include=[LOGPROBS],
        top_logprobs=2,
        extra_headers={FAULTS_HEADER: faults},
        **kw,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [(e.delta, [x.model_dump() for x in e.logprobs]) for e in events if e.type == "response.output_text.delta"]
    done = [[x.model_dump() for x in e.logprobs] for e in events if e.type == "response.output_text.done"]
    (part,) = [c for item in final.output if item.type == "message" for c in item.content]
    assert part.type == "output_text"
    run_id = final.id.removeprefix("resp_")
    return {"deltas": deltas, "done": done, "part": part.model_dump()["logprobs"], "run": run_id}


def upstream(body: dict[str, Any]) -> dict[str, Any]:
    """The fake's deltas (text, entries) and its finished part's entries for ``body``, called directly."""
    response = httpx.post(
        local_fake_server().base_url + "/v1/responses", json=body, headers={"authorization": "Bearer k"}
    )
    payloads = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    deltas = [(p["delta"], p["logprobs"]) for p in payloads if p["type"] == "response.output_text.delta"]
    (part,) = [p["part"] for p in payloads if p["type"] == "response.content_part.done"]
    return {"deltas": deltas, "part": part["logprobs"]}


def tokens(entries: list[dict[str, Any]]) -> str:
    return "".join(entry["token"] for entry in entries)


def test_an_unbroken_stream_passes_the_providers_logprobs_delta_for_delta(client: openai.OpenAI) -> None:
    """The provider's entries on the delta of their text, all on the done event and in the part,
    when the client's ``include`` asks (the upstream asked too); ``[]`` everywhere when not."""
    seen = scored_answer(client, PROMPT)
    wait_for(seen["run"])
    sent = Attempt.objects.get(run_id=seen["run"]).request["json"]
    assert LOGPROBS in sent["include"]
    assert "reasoning.encrypted_content" in sent["include"]
    expected = upstream(sent)
    assert [e for _, e in expected["deltas"]]  # the fake did send some
    # the very entries the provider sent, each with its own text, in the shape of the delta event
    assert seen["deltas"] == expected["deltas"]
    assert all(tokens(entries) == text for text, entries in seen["deltas"])
    assert all(len(entry["top_logprobs"]) == 2 for _, entries in seen["deltas"] for entry in entries)
    # the done event has them all; the finished part has them with their bytes, as the API writes it
    assert seen["done"] == [[entry for _, entries in seen["deltas"] for entry in entries]]
    assert seen["part"] == expected["part"]
    assert all(entry["bytes"] == list(entry["token"].encode()) for entry in seen["part"])
    # a client that does not ask gets empty lists, as from the API
    stream = client.responses.create(model="gpt-4o", input=PROMPT, stream=True)
    events = list(stream)
    text_events = [e for e in events if e.type in ("response.output_text.delta", "response.output_text.done")]
    assert len(text_events) > 2
    assert all(e.logprobs == [] for e in text_events)
    (completed,) = [e for e in events if e.type == "response.completed"]
    wait_for(completed.response.id.removeprefix("resp_"))
    assert [c.logprobs for item in completed.response.output for c in item.content] == [[]]  # type: ignore[union-attr]


def test_the_events_carry_logprobs_in_the_apis_two_shapes(site: str, client: openai.OpenAI) -> None:
    """On the delta and done events an entry has no ``bytes`` (``token``, ``logprob``,
    ``top_logprobs`` of ``token`` and ``logprob``); in the output text part it has them, in the
    API's field order, its alternatives too."""
    body = {"model": "gpt-4o", "stream": True, "input": PROMPT, "include": [LOGPROBS], "top_logprobs": 1}
    key = client.api_key
    response = httpx.post(site + "/responses", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30)
    wait_for(response.headers["x-streamrecover-run"])
    payloads = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    delta = next(p for p in payloads if p["type"] == "response.output_text.delta")
    (done,) = [p for p in payloads if p["type"] == "response.output_text.done"]
    (completed,) = [p for p in payloads if p["type"] == "response.completed"]
    part = completed["response"]["output"][0]["content"][0]
    for entry in [*delta["logprobs"], *done["logprobs"]]:
        assert list(entry) == ["token", "logprob", "top_logprobs"]
        assert [list(top) for top in entry["top_logprobs"]] == [["token", "logprob"]]
    assert part["logprobs"]
    for entry in part["logprobs"]:
        assert list(entry) == ["token", "bytes", "logprob", "top_logprobs"]
        assert [list(top) for top in entry["top_logprobs"]] == [["token", "bytes", "logprob"]]
    assert [e["token"] for e in part["logprobs"]] == [e["token"] for e in done["logprobs"]]


def _check_spliced(deltas: Scored, label: str) -> int:
    """Every delta's entries spell its text, or the end of it where the seam cut into the delta
    (one delta at most: the first the seam released). Returns how many deltas lost entries (0 or 1)."""
    cut_into = 0
    for text, entries in deltas:
        spelled = tokens(entries)
        if spelled != text:
            assert text.endswith(spelled), (label, text, entries)
            cut_into += 1
    assert cut_into <= 1, (label, deltas)
    return cut_into


def _check_whole(seen: dict[str, Any], label: str) -> None:
    """The done event and the finished part have exactly the entries the deltas had."""
    entries = [entry for _, delta in seen["deltas"] for entry in delta]
    assert seen["done"] == [entries], label
    assert [(e["token"], e["logprob"]) for e in seen["part"]] == [(e["token"], e["logprob"]) for e in entries], label


def test_after_a_clean_break_the_tokens_spell_exactly_the_text_the_client_received(client: openai.OpenAI) -> None:
    clean = scored_answer(client, PROMPT)
    clean_text = "".join(text for text, _ in clean["deltas"])
    body = {"model": "gpt-4o", "input": PROMPT, "include": [LOGPROBS]}
    cuts = range(3, upstream_events("/v1/responses", body) - 2)
    answers = sweep(lambda faults: scored_answer(client, PROMPT, faults), cuts)
    recovered = 0
    for cut, seen in zip(cuts, answers, strict=True):
        label = f"cut:events={cut}"
        text = "".join(t for t, _ in seen["deltas"])
        assert text == clean_text, label
        assert "".join(tokens(entries) for _, entries in seen["deltas"]) == text, label
        _check_whole(seen, label)
        recovered += Attempt.objects.filter(run_id=seen["run"]).count() == 2
    assert recovered >= len(cuts) // 2  # most cuts land mid-answer and are continued


@pytest.mark.parametrize(("seam", "cuts_a_token"), [("repeat", True), ("restart", False)])
def test_entries_of_a_repeat_the_seam_trimmed_are_dropped_never_moved(
    client: openai.OpenAI, seam: str, cuts_a_token: bool
) -> None:
    """A continuation that repeats the end of the kept text (or all of it) has the repeat trimmed:
    the entries of the trimmed tokens, and of a token the trim cut in two, are not passed on."""
    prompt = f"Tell me about rivers [[words=14]] [[seam={seam}]]"
    clean = scored_answer(client, prompt)
    clean_text = "".join(text for text, _ in clean["deltas"])
    lost = 0
    for cut in (10, 13, 16, 19):
        seen = scored_answer(client, prompt, f"cut:events={cut}")
        label = f"seam={seam} cut:events={cut}"
        assert "".join(text for text, _ in seen["deltas"]) == clean_text, label
        assert Attempt.objects.filter(run_id=seen["run"]).count() == 2, label
        lost += _check_spliced(seen["deltas"], label)
        _check_whole(seen, label)
    assert bool(lost) == cuts_a_token, lost


def test_failover_to_a_chat_provider_asks_it_for_logprobs_and_passes_them_on(client: openai.OpenAI) -> None:
    """The Responses provider's budget is spent mid-answer; the Chat provider that goes on is asked
    with ``logprobs: true`` and its entries reach the Responses client in Responses' shapes."""
    prompt = "Tell me about rivers [[words=30]]"
    configured = {
        **proxy_settings(settings.STREAMRECOVER),
        "PROVIDERS": _providers(),
        "PROXY_RESPONSES_PROVIDER": "fake-responses",
        "MAX_CONTINUATIONS": 1,
        "PROXY_FAILOVER": {"responses": {"PROVIDER": "fake", "MODEL": "gpt-4o-mini"}},
    }
    with override_settings(STREAMRECOVER=configured):
        seen = scored_answer(client, prompt, "cut:events=8;cut:events=6")
    wait_for(seen["run"])
    assert Run.objects.get(pk=seen["run"]).events.get(name="llm_stream_failover").payload["to_model"] == "gpt-4o-mini"
    last = Attempt.objects.filter(run_id=seen["run"]).order_by("index").last()
    assert last is not None
    assert last.request["json"]["logprobs"] is True
    assert last.request["json"]["top_logprobs"] == 2
    assert "include" not in last.request["json"]
    scored = [(text, entries) for text, entries in seen["deltas"] if entries]
    assert len(scored) > 5  # the Chat provider's deltas have theirs
    _check_spliced(seen["deltas"], "failover")
    _check_whole(seen, "failover")
    # a Chat provider sends each token's bytes: the part has them as sent
    assert all(entry["bytes"] == list(entry["token"].encode()) for entry in seen["part"])
