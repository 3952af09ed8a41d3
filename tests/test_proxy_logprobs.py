"""Token logprobs through the healing endpoint, seen by the official ``openai`` client: a Chat client
that asks for them gets the provider's on the chunk of the text they belong to, in the real API's
wire shape, and after a break only those whose token is exactly the text it was shown there."""

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
from .streams import load_recorded

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Tell me about rivers [[words=10]]"
# (the chunk's text, its logprobs.content entries: None where the chunk had no logprobs object)
Scored = list[tuple[str, list[dict[str, Any]] | None]]


@pytest.fixture
def site() -> Iterator[str]:
    configured = proxy_settings(settings.STREAMRECOVER, PROVIDERS=fake_providers("sk-provider-logprobs"))
    with override_settings(STREAMRECOVER=configured):
        yield daphne_url() + "/streamrecover/proxy/v1"


@pytest.fixture
def raw_key(django_user_model: Any) -> str:
    return issue_key(django_user_model.objects.create_user("logprobs-user", password="x"))[1]


@pytest.fixture
def client(site: str, raw_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=site, api_key=raw_key, max_retries=0)


def scored_answer(client: openai.OpenAI, prompt: str, faults: str = "", **kw: Any) -> tuple[Scored, str]:
    """The text chunks a client asking for logprobs (two alternatives each) gets, and the run's id."""
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": prompt}],
        stream=True,
        logprobs=True,
        top_logprobs=2,
        extra_headers={FAULTS_HEADER: faults},
        **kw,
    )
    scored: Scored = []
    for chunk in raw.parse():
        for choice in chunk.choices:
            if choice.delta.content:
                entries = None if choice.logprobs is None else [e.model_dump() for e in choice.logprobs.content or []]
                scored.append((choice.delta.content, entries))
    return scored, raw.headers["x-streamrecover-run"]


def upstream_scored(body: dict[str, Any]) -> Scored:
    """The text chunks the fake sends for ``body`` when called directly, with their logprobs."""
    response = httpx.post(
        local_fake_server().base_url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer k"}
    )
    scored: Scored = []
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:])["choices"]:
            if choice["delta"].get("content"):
                logprobs = choice["logprobs"]
                scored.append((choice["delta"]["content"], None if logprobs is None else logprobs["content"]))
    return scored


def tokens(entries: list[dict[str, Any]] | None) -> str:
    return "".join(entry["token"] for entry in entries or ())


def test_an_unbroken_stream_passes_the_providers_logprobs_chunk_for_chunk(client: openai.OpenAI) -> None:
    seen, run_id = scored_answer(client, PROMPT)
    wait_for(run_id)
    sent = Attempt.objects.get(run_id=run_id).request["json"]
    assert seen == upstream_scored(sent)  # the very entries the provider sent, each with its own text
    assert all(tokens(entries) == text for text, entries in seen)
    assert all(len(entry["top_logprobs"]) == 2 for _, entries in seen for entry in entries or ())
    # a client that does not ask gets none, as from the API
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": PROMPT}], stream=True
    )
    chunks = list(raw.parse())
    wait_for(raw.headers["x-streamrecover-run"])
    assert len(chunks) > 2
    assert all(choice.logprobs is None for chunk in chunks for choice in chunk.choices)


def _shape(value: Any) -> Any:
    """The JSON's keys in order, all the way down (a list by its first item), and its leaves' types."""
    if isinstance(value, dict):
        return [(name, _shape(item)) for name, item in value.items()]
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def _choices(body: str) -> list[dict[str, Any]]:
    return [c for line in body.splitlines() if line.startswith("data: {") for c in json.loads(line[6:])["choices"]]


def test_the_chunks_carry_logprobs_in_the_real_apis_wire_shape(site: str, raw_key: str) -> None:
    """Field for field, in the API's order: the opening chunk's empty list, a text chunk's entry,
    the finishing chunk's null, as in a stream recorded from the API."""
    recorded = _choices(load_recorded("openai_text_logprobs.sse").decode())
    body = {
        "model": "gpt-4o",
        "stream": True,
        "logprobs": True,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    response = httpx.post(
        site + "/chat/completions", json=body, headers={"authorization": f"Bearer {raw_key}"}, timeout=30
    )
    served = _choices(response.text)
    wait_for(response.headers["x-streamrecover-run"])
    assert _shape(served[0]) == _shape(recorded[0])  # role chunk: {"content": [], "refusal": null}
    assert _shape(served[1]) == _shape(recorded[1])  # a text chunk with its one token's entry
    assert _shape(served[-1]) == _shape(recorded[-1])  # finish_reason chunk: logprobs null
    assert served[1]["logprobs"]["content"][0]["bytes"] == list(served[1]["delta"]["content"].encode())


def _check_spliced(seen: Scored, label: str) -> int:
    """Every chunk's entries spell its text, or the end of it where the seam cut into the chunk:
    an entry is only ever one whose token is the text shown at its place. Returns how many chunks
    lost entries at a seam."""
    cut_into = 0
    for text, entries in seen:
        assert entries is not None, label
        spelled = tokens(entries)
        if spelled != text:
            assert text.endswith(spelled), (label, text, entries)
            cut_into += 1
    return cut_into


def test_after_a_clean_break_the_tokens_spell_exactly_the_text_the_client_received(client: openai.OpenAI) -> None:
    clean, _ = scored_answer(client, PROMPT)
    clean_text = "".join(text for text, _ in clean)
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": PROMPT}]}
    cuts = range(3, upstream_events("/v1/chat/completions", body) - 2)
    answers = sweep(lambda faults: _as_dict(scored_answer(client, PROMPT, faults)), cuts)
    for cut, answer in zip(cuts, answers, strict=True):
        seen, label = answer["seen"], f"cut:events={cut}"
        text = "".join(t for t, _ in seen)
        assert text == clean_text, label
        assert "".join(tokens(entries) for _, entries in seen) == text, label
        assert _check_spliced(seen, label) == 0
        assert Attempt.objects.filter(run_id=answer["run"]).count() == 2, label


def _as_dict(answer: tuple[Scored, str]) -> dict[str, Any]:
    return {"seen": answer[0], "run": answer[1]}


@pytest.mark.parametrize(("seam", "cuts_a_token"), [("repeat", True), ("repeat:4", True), ("restart", False)])
def test_entries_of_a_repeat_the_seam_trimmed_are_dropped_never_moved(
    client: openai.OpenAI, seam: str, cuts_a_token: bool
) -> None:
    """A continuation that repeats the end of the kept text (or all of it) has the repeat trimmed:
    the client sees each character once, and the entries of the trimmed tokens, and of a token the
    trim cut in two (a repeat of words that starts inside a token), are not passed on; the kept
    text's and the rest of the continuation's are. A restart repeats whole tokens from the start."""
    prompt = f"Tell me about rivers [[words=14]] [[seam={seam}]]"
    clean, _ = scored_answer(client, prompt)
    clean_text = "".join(text for text, _ in clean)
    lost = 0
    for cut in (8, 11, 14, 17):
        seen, run_id = scored_answer(client, prompt, f"cut:events={cut}")
        label = f"seam={seam} cut:events={cut}"
        assert "".join(text for text, _ in seen) == clean_text, label
        assert Attempt.objects.filter(run_id=run_id).count() == 2, label
        lost += _check_spliced(seen, label)
    assert bool(lost) == cuts_a_token, lost


def test_top_logprobs_without_logprobs_is_refused_as_the_api_refuses_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="'logprobs' must be set to true"):
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": PROMPT}], stream=True, top_logprobs=2
        )


def test_failover_to_a_responses_provider_asks_it_for_logprobs_and_passes_them_on(client: openai.OpenAI) -> None:
    """The Chat provider's budget is spent mid-answer; the Responses provider that goes on is asked
    with ``include: ["message.output_text.logprobs"]`` (and ``top_logprobs``), and its entries reach
    the Chat client in Chat's shape: Responses sends no ``bytes`` on its deltas, so they are null."""
    configured = {
        **proxy_settings(settings.STREAMRECOVER),
        "PROVIDERS": fake_providers("sk-provider-logprobs"),
        "MAX_CONTINUATIONS": 1,
        "PROXY_FAILOVER": {"openai": {"PROVIDER": "fake-responses", "MODEL": "gpt-4o-mini"}},
    }
    with override_settings(STREAMRECOVER=configured):
        seen, run_id = scored_answer(client, "Tell me about rivers [[words=30]]", "cut:events=8;cut:events=6")
    wait_for(run_id)
    assert Run.objects.get(pk=run_id).events.get(name="llm_stream_failover").payload["to_model"] == "gpt-4o-mini"
    last = Attempt.objects.filter(run_id=run_id).order_by("index").last()
    assert last is not None
    assert "message.output_text.logprobs" in last.request["json"]["include"]
    assert last.request["json"]["top_logprobs"] == 2
    assert "logprobs" not in last.request["json"]
    _check_spliced(seen, "failover")
    from_responses = [entry for _, entries in seen for entry in entries or () if entry["bytes"] is None]
    assert len(from_responses) > 5
    assert all(len(entry["top_logprobs"]) == 2 for entry in from_responses)
