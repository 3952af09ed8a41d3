"""The healing endpoint's Gemini chunks carry what Gemini's own do besides the parts: the usage's
per-modality and tool-use details, the tokens' ``logprobsResult`` when the request set
``responseLogprobs``, the candidate's ``avgLogprobs`` and ``urlContextMetadata``. Uninterrupted,
each is the upstream's as it sent it (the upstream's answer replayed from the request the attempt
stored); after a break, each is made true of the spliced answer: the details add up to the summed
counts, a logprob entry is only ever one whose token is the text shown at its place, and the
``avgLogprobs`` of no attempt is passed as the spliced answer's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import override_settings
from google.genai import types

from streamrecover.models import Attempt
from streamrecover.proxy.keys import issue_key
from streamrecover.testing.fake.local import local_fake_server
from streamrecover.testing.host import wait_for

from .proxy_helpers import daphne_url, proxy_settings, sweep
from .test_proxy_gemini import MODEL, _providers, answer, raw_chunks

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Tell me about rivers [[words=24]]"
LOGPROBS = {"generationConfig": {"responseLogprobs": True, "logprobs": 2}}
URL_CONTEXT = {"tools": [{"urlContext": {}}]}


@pytest.fixture
def site() -> Iterator[str]:
    configured = proxy_settings(settings.STREAMRECOVER, PROVIDERS=_providers(), PROXY_GEMINI_PROVIDER="fake-gemini")
    with override_settings(STREAMRECOVER=configured):
        yield daphne_url() + "/streamrecover/proxy"


@pytest.fixture
def raw_key(django_user_model: Any) -> str:
    user = django_user_model.objects.create_user("gemini-metadata-user", password="x")
    return issue_key(user)[1]


def run_of(chunks: list[dict[str, Any]]) -> str:
    """The run's id: the endpoint's ``responseId`` is its hex."""
    hexed = chunks[0]["responseId"]
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"


def upstream(run_id: str) -> list[dict[str, Any]]:
    """The chunks the upstream sent the run's one attempt: its stored request asked again of the
    fake, which answers the same request the same way."""
    wait_for(run_id)
    (attempt,) = Attempt.objects.filter(run_id=run_id)
    url = f"{local_fake_server().base_url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    response = httpx.post(url, json=attempt.request["json"], headers={"x-goog-api-key": "k"}, timeout=30)
    return [json.loads(line[6:]) for line in response.text.split("\r\n") if line.startswith("data: ")]


def text_of(chunk: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in chunk["candidates"][0]["content"]["parts"] if not p.get("thought"))


def chosen(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    return list(chunk["candidates"][0]["logprobsResult"].get("chosenCandidates") or [])


def modalities(details: list[dict[str, Any]] | None) -> int:
    return sum(d["tokenCount"] for d in details or ())


def test_an_uninterrupted_answers_usage_details_are_the_upstreams(site: str, raw_key: str) -> None:
    chunks = raw_chunks(site, raw_key, PROMPT, **URL_CONTEXT)
    sent = upstream(run_of(chunks))
    assert chunks[-1]["usageMetadata"] == sent[-1]["usageMetadata"]  # every field, details included
    assert {"promptTokensDetails", "candidatesTokensDetails", "toolUsePromptTokenCount"} <= sent[-1][
        "usageMetadata"
    ].keys()
    # as the SDK reads them
    seen = answer(site, raw_key, PROMPT)
    usage = seen["usage"]
    assert usage.prompt_tokens_details == [
        types.ModalityTokenCount(modality=types.MediaModality.TEXT, token_count=usage.prompt_token_count)
    ]
    assert usage.candidates_tokens_details == [
        types.ModalityTokenCount(modality=types.MediaModality.TEXT, token_count=usage.candidates_token_count)
    ]


def test_after_a_break_the_usage_details_add_up_to_the_summed_counts(site: str, raw_key: str) -> None:
    """Each attempt's request was billed: the prompt-side details are summed per modality as the
    counts are; the output's, of one modality, count what ``candidatesTokenCount`` counts."""
    cuts = (1, 3, 5)
    seen = sweep(lambda faults: raw_chunks(site, raw_key, PROMPT, faults, **URL_CONTEXT), cuts)
    for cut, chunks in zip(cuts, seen, strict=True):
        assert Attempt.objects.filter(run_id=run_of(chunks)).count() == 2, cut
        for chunk in chunks:
            usage = chunk["usageMetadata"]
            assert modalities(usage["promptTokensDetails"]) == usage["promptTokenCount"], (cut, usage)
            assert modalities(usage["candidatesTokensDetails"]) == usage["candidatesTokenCount"], (cut, usage)
            assert modalities(usage["toolUsePromptTokensDetails"]) == usage["toolUsePromptTokenCount"], (cut, usage)
            counted = ("promptTokenCount", "candidatesTokenCount", "thoughtsTokenCount", "toolUsePromptTokenCount")
            assert usage["totalTokenCount"] == sum(usage.get(name, 0) for name in counted), (cut, usage)
        last = chunks[-1]["usageMetadata"]
        assert last["toolUsePromptTokenCount"] > chunks[0]["usageMetadata"]["toolUsePromptTokenCount"], cut


def test_an_uninterrupted_answers_logprobs_and_url_context_are_the_upstreams(site: str, raw_key: str) -> None:
    chunks = raw_chunks(site, raw_key, PROMPT, **LOGPROBS, **URL_CONTEXT)
    sent = upstream(run_of(chunks))
    assert [e for c in chunks for e in chosen(c)] == [e for c in sent for e in chosen(c)]
    tops = [t for c in chunks for t in c["candidates"][0]["logprobsResult"].get("topCandidates", [])]
    assert tops == [t for c in sent for t in c["candidates"][0]["logprobsResult"].get("topCandidates", [])]
    assert len(tops) == len(chosen(chunks[0])) + sum(len(chosen(c)) for c in chunks[1:])
    for chunk in chunks[:-1]:  # each chunk's entries spell its text
        assert "".join(e["token"] for e in chosen(chunk)) == text_of(chunk)
    candidate, own = chunks[-1]["candidates"][0], sent[-1]["candidates"][0]
    assert candidate["avgLogprobs"] == own["avgLogprobs"]
    assert candidate["urlContextMetadata"] == own["urlContextMetadata"]
    # as the SDK reads them
    config = types.GenerateContentConfig(
        response_logprobs=True, logprobs=2, tools=[types.Tool(url_context=types.UrlContext())]
    )
    client_chunks = list(_stream(site, raw_key, config))
    results = [c.candidates[0].logprobs_result for c in client_chunks if c.candidates]
    scored = [r for r in results if r is not None and r.chosen_candidates]
    assert scored
    assert all(len(r.top_candidates or []) == len(r.chosen_candidates or []) for r in scored)
    final = client_chunks[-1].candidates[0]  # type: ignore[index]
    assert final.avg_logprobs is not None
    assert final.avg_logprobs < 0
    assert final.url_context_metadata is not None
    assert [m.url_retrieval_status for m in final.url_context_metadata.url_metadata or []] == [
        types.UrlRetrievalStatus.URL_RETRIEVAL_STATUS_SUCCESS
    ] * 2


def _stream(site: str, key: str, config: types.GenerateContentConfig) -> Iterator[types.GenerateContentResponse]:
    from .test_proxy_gemini import client_for

    client = client_for(site, key)
    yield from client.models.generate_content_stream(model=MODEL, contents=PROMPT, config=config)


@pytest.mark.parametrize("seam", ["repeat", "repeat:4", "restart"])
def test_after_a_break_only_entries_of_the_text_shown_at_their_place_remain(site: str, raw_key: str, seam: str) -> None:
    """The continuation's repeat of the kept text is trimmed: the entries of trimmed tokens, and of a
    token the trim cut in two, are dropped, never moved; the continuation's others reach the client.
    The spliced answer's ``avgLogprobs`` would be no attempt's: it is left out."""
    prompt = f"Tell me about rivers [[words=14]] [[seam={seam}]]"
    clean = raw_chunks(site, raw_key, prompt, **LOGPROBS, **URL_CONTEXT)
    clean_text = "".join(text_of(c) for c in clean)
    assert "avgLogprobs" in clean[-1]["candidates"][0]
    cuts = (2, 3, 4)
    seen = sweep(lambda faults: raw_chunks(site, raw_key, prompt, faults, **LOGPROBS, **URL_CONTEXT), cuts)
    cut_into = 0
    for cut, chunks in zip(cuts, seen, strict=True):
        label = f"seam={seam} cut:events={cut}"
        assert "".join(text_of(c) for c in chunks) == clean_text, label
        assert Attempt.objects.filter(run_id=run_of(chunks)).count() == 2, label
        for chunk in chunks[:-1]:
            spelled, text = "".join(e["token"] for e in chosen(chunk)), text_of(chunk)
            assert text.endswith(spelled), (label, text, spelled)
            cut_into += spelled != text
        after = len(chunks) // 2  # the continuation's text reaches the client with its entries
        assert any(chosen(c) for c in chunks[after:-1]), label
        final = chunks[-1]["candidates"][0]
        assert "avgLogprobs" not in final, label
        assert final["urlContextMetadata"]["urlMetadata"], label  # the last attempt's sources
    assert cut_into > 0 if seam.startswith("repeat") else cut_into == 0, (seam, cut_into)


def test_details_a_spliced_answer_cannot_make_true_are_left_out() -> None:
    """Attempts whose output was of different modalities: no per-modality split of the summed
    ``candidatesTokenCount`` is known, so none is sent; the cache's details are summed as the
    cache counts are, and one attempt's output details pass as they came."""
    from streamrecover.proxy.splice import TextPiece
    from streamrecover.proxy.wire import AttemptMetadata, TurnUsage
    from streamrecover.proxy.wire_gemini import GeminiWriter

    def details(output: str, cached: int) -> dict[str, Any]:
        return {
            "usageDetails": {
                "promptTokensDetails": [
                    {"modality": "TEXT", "tokenCount": 10},
                    {"modality": "IMAGE", "tokenCount": 258},
                ],
                "cacheTokensDetails": [{"modality": "IMAGE", "tokenCount": cached}],
                "candidatesTokensDetails": [{"modality": output, "tokenCount": 5}],
            }
        }

    first, second = AttemptMetadata(details("TEXT", 200), True), AttemptMetadata(details("IMAGE", 258), False)
    usage = TurnUsage(input_tokens=536, output_tokens=12, cache_read_input_tokens=458, attempts=[first, second])
    sent = json.loads(GeminiWriter("r", MODEL).ops([TextPiece(0, "a")], usage).decode()[6:])["usageMetadata"]
    assert sent["promptTokensDetails"] == [
        {"modality": "TEXT", "tokenCount": 20},
        {"modality": "IMAGE", "tokenCount": 516},
    ]
    assert sent["cacheTokensDetails"] == [{"modality": "IMAGE", "tokenCount": 458}]
    assert "candidatesTokensDetails" not in sent
    alone = TurnUsage(input_tokens=268, output_tokens=5, cache_read_input_tokens=258, attempts=[second])
    sent = json.loads(GeminiWriter("r", MODEL).ops([TextPiece(0, "a")], alone).decode()[6:])["usageMetadata"]
    assert sent["candidatesTokensDetails"] == [{"modality": "IMAGE", "tokenCount": 5}]
