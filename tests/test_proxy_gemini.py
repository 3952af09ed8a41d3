"""The healing endpoint's Gemini surface (``v1beta/models/{model}:streamGenerateContent``), seen by the
official ``google-genai`` client pointed at it (Daphne serving the app in a thread) with the fake's
Gemini dialect upstream breaking the stream at every event boundary: the client's text and function
calls equal the uninterrupted answer, one finish reason and the usage of every upstream call on the
last chunk (every chunk carrying the usage so far, never less than the one before), the candidate's
finish message, safety ratings, grounding and citations on the last chunk (the offset-bearing ones
dropped once a break spliced the text), what the client was shown is what was stored; the key's
limits and the provider's errors reach the client as the SDK's own exceptions, and a non-streamed
request passes through."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import override_settings
from google import genai
from google.genai import errors, types

from streamrecover import checks
from streamrecover.models import Attempt, Message, Run
from streamrecover.proxy.keys import issue_key
from streamrecover.proxy.views import FAULTS_HEADER
from streamrecover.testing import DEFAULT_SCENARIO, parse_faults
from streamrecover.testing.fake.local import local_fake_server
from streamrecover.testing.host import wait_for

from .proxy_helpers import daphne_url, proxy_settings, sweep

pytestmark = pytest.mark.django_db(transaction=True)

PROVIDER_KEY = "AIza-provider-secret-51c0d7"
MODEL = "gemini-2.5-flash"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _providers() -> dict[str, Any]:
    return {"fake-gemini": {"ADAPTER": "gemini", "BASE_URL": "fake://streamrecover", "API_KEY": PROVIDER_KEY}}


@pytest.fixture
def site() -> Iterator[str]:
    """The proxy's prefix on Daphne; the Gemini surface served by the fake's Gemini dialect."""
    configured = proxy_settings(settings.STREAMRECOVER, PROVIDERS=_providers(), PROXY_GEMINI_PROVIDER="fake-gemini")
    with override_settings(STREAMRECOVER=configured):
        yield daphne_url() + "/streamrecover/proxy"


@pytest.fixture
def raw_key(django_user_model: Any) -> str:
    user = django_user_model.objects.create_user("gemini-user", password="x")
    return issue_key(user)[1]


def client_for(site: str, key: str, faults: str = "") -> genai.Client:
    headers = {FAULTS_HEADER: faults} if faults else {}
    return genai.Client(api_key=key, http_options=types.HttpOptions(base_url=site, headers=headers))


def tool_config(**more: Any) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**WEATHER)])],  # type: ignore[arg-type]
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        **more,
    )


def answer(site: str, key: str, prompt: Any, faults: str = "", **config: Any) -> dict[str, Any]:
    """One streamed answer through the proxy with ``generate_content_stream``, checked as the client sees it."""
    client = client_for(site, key, faults)  # held: a client closes its connections when collected
    chunks = list(
        client.models.generate_content_stream(
            model=MODEL, contents=prompt, config=config.pop("config", None) or types.GenerateContentConfig(**config)
        )
    )
    assert chunks
    ids = {c.response_id for c in chunks}
    assert len(ids) == 1, ids
    finishes = [c.candidates[0].finish_reason for c in chunks if c.candidates and c.candidates[0].finish_reason]
    assert len(finishes) == 1, finishes
    assert chunks[-1].candidates
    assert chunks[-1].candidates[0].finish_reason  # on the last chunk
    usages = [_counts(c.usage_metadata) for c in chunks]  # on every chunk, as Gemini's own
    for earlier, later in itertools.pairwise(usages):
        assert all(a <= b for a, b in zip(earlier, later, strict=True)), usages  # never less than before
    for prompt_tokens, candidates, thoughts, total in usages:
        assert total == prompt_tokens + candidates + thoughts, usages
    parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]  # type: ignore[union-attr,index]
    headers = {k.lower(): v for k, v in (chunks[0].sdk_http_response.headers or {}).items()}  # type: ignore[union-attr]
    run_id = headers["x-streamrecover-run"]
    assert ids == {run_id.replace("-", "")}
    return {
        "text": "".join(p.text for p in parts if p.text and not p.thought),
        "thoughts": [p.text for p in parts if p.thought],
        "calls": [(p.function_call.name, p.function_call.args) for p in parts if p.function_call],
        "finish": finishes[0],
        "usage": chunks[-1].usage_metadata,
        "usages": usages,
        "candidate": chunks[-1].candidates[0],
        "run_id": run_id,
    }


def _counts(usage: types.GenerateContentResponseUsageMetadata | None) -> tuple[int, int, int, int]:
    """(prompt, candidates, thoughts, total) of a chunk's usage (a count Gemini leaves out is 0)."""
    assert usage is not None
    assert usage.prompt_token_count
    assert usage.total_token_count
    counts = (usage.candidates_token_count, usage.thoughts_token_count, usage.total_token_count)
    return (usage.prompt_token_count, *(count or 0 for count in counts))  # type: ignore[return-value]


def _direct_counts(chunk: dict[str, Any]) -> tuple[int, int, int, int]:
    usage = chunk["usageMetadata"]
    fields = ("promptTokenCount", "candidatesTokenCount", "thoughtsTokenCount", "totalTokenCount")
    return tuple(usage.get(name, 0) for name in fields)  # type: ignore[return-value]


def direct(prompt: str, **body: Any) -> list[dict[str, Any]]:
    """The fake's own chunks for ``prompt``, uninterrupted (each is a boundary to cut at)."""
    url = f"{local_fake_server().base_url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    contents = [{"role": "user", "parts": [{"text": prompt}]}]
    response = httpx.post(url, json={"contents": contents, **body}, headers={"x-goog-api-key": "k"})
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def stored_assistant(run_id: str) -> list[dict[str, Any]]:
    report = wait_for(run_id)
    assert report.status == "completed", report.error
    answer = Message.objects.filter(run_id=run_id, role="assistant").order_by("position").last()  # the history's before
    assert answer is not None
    return list(answer.content)


@pytest.mark.parametrize(
    ("prompt", "tools"),
    [
        pytest.param("Tell me about rivers [[words=30]]", False, id="text"),
        pytest.param("Check the weather [[words=24]] [[tool]]", True, id="text-then-call"),
    ],
)
def test_gemini_client_sees_one_uninterrupted_answer_at_every_break(
    site: str, raw_key: str, prompt: str, tools: bool
) -> None:
    config = {"config": tool_config()} if tools else {}
    body = {"tools": [{"functionDeclarations": [WEATHER]}]} if tools else {}
    chunks = direct(prompt, **body)
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    clean = answer(site, raw_key, prompt, **config)
    # the uninterrupted answer through the endpoint is the provider's own
    assert clean["text"] == "".join(p.get("text", "") for p in parts)
    assert clean["calls"] == [
        (p["functionCall"]["name"], p["functionCall"]["args"]) for p in parts if "functionCall" in p
    ]
    assert bool(clean["calls"]) == tools
    assert clean["finish"] == types.FinishReason.STOP
    # chunk by chunk the usage the provider's own chunks carried (the last one is the finish chunk)
    assert clean["usages"][:-1] == [_direct_counts(c) for c in chunks]
    assert clean["usages"][-1] == _direct_counts(chunks[-1])
    events = len(chunks)
    assert events > 6
    cuts = range(1, events)
    for cut, seen in zip(
        cuts, sweep(lambda faults: answer(site, raw_key, prompt, faults, **config), cuts), strict=True
    ):
        at = f"cut:events={cut}"
        assert (seen["text"], seen["calls"], seen["finish"]) == (clean["text"], clean["calls"], clean["finish"]), at
        stored = stored_assistant(seen["run_id"])
        assert seen["text"] == "".join(b["text"] for b in stored if b["type"] == "text"), at
        attempts = Attempt.objects.filter(run_id=seen["run_id"])
        usage = seen["usage"]
        assert usage.prompt_token_count == sum(a.input_tokens or 0 for a in attempts), at
        # the model thinks, unseen, in every attempt: billed as output, left out of the candidates
        thoughts = usage.thoughts_token_count or 0
        assert thoughts == sum(a.reasoning_tokens or 0 for a in attempts), at
        assert usage.candidates_token_count + thoughts == sum(a.output_tokens or 0 for a in attempts), at
        assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count + thoughts, at
        assert seen["usages"][-1] == max(seen["usages"]), at  # the sum, never below a running count
        assert len(set(seen["usages"])) > 2, at  # counts that grow as the answer streams
        names = set(Run.objects.get(pk=seen["run_id"]).events.values_list("name", flat=True))
        assert attempts.count() >= 2, at  # every cut loses a chunk: the last one carries the finish reason
        assert {"llm_stream_interrupted", "llm_stream_continuation_started"} <= names, at


def test_thoughts_arrive_whole_before_the_answer_and_usage_counts_them(site: str, raw_key: str) -> None:
    prompt = "Tell me about rivers [[words=16]]"
    thinking = types.ThinkingConfig(include_thoughts=True, thinking_budget=1024)
    clean = answer(site, raw_key, prompt, thinking_config=thinking)
    assert len(clean["thoughts"]) == 1  # the provider's eight thought chunks, whole, once the text started
    assert all(thoughts for _, _, thoughts, _ in clean["usages"])  # counted from the chunk that shows them
    assert clean["thoughts"][0].startswith("Let me think about")
    for cut in (2, 5, 10, 13):  # inside the thoughts, then inside the text
        seen = answer(site, raw_key, prompt, f"cut:events={cut}", thinking_config=thinking)
        assert seen["text"] == clean["text"], f"cut:events={cut}"
        assert seen["thoughts"] == clean["thoughts"], f"cut:events={cut}"  # one whole part, never a piece of one
        attempts = Attempt.objects.filter(run_id=seen["run_id"])
        usage = seen["usage"]
        output = sum(a.output_tokens or 0 for a in attempts)
        assert usage.thoughts_token_count
        assert usage.candidates_token_count + usage.thoughts_token_count == output
        assert all(thoughts for _, _, thoughts, _ in seen["usages"]), f"cut:events={cut}"


def raw_chunks(site: str, key: str, prompt: str, faults: str = "", **body: Any) -> list[dict[str, Any]]:
    """The endpoint's chunks as JSON, read off the wire (google-genai 3.6's reader of the Gemini API
    drops ``finishMessage``: a client sees it only there)."""
    url = f"{site}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    headers = {"x-goog-api-key": key, **({FAULTS_HEADER: faults} if faults else {})}
    contents = [{"role": "user", "parts": [{"text": prompt}]}]
    response = httpx.post(url, json={"contents": contents, **body}, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return [json.loads(line[6:]) for line in response.text.split("\r\n") if line.startswith("data: ")]


def test_the_finish_message_reaches_the_client_after_every_break(site: str, raw_key: str) -> None:
    prompt = "Check the weather [[words=24]] [[tool]]"
    body = {"tools": [{"functionDeclarations": [WEATHER]}]}
    upstream = direct(prompt, **body)
    message = upstream[-1]["candidates"][0]["finishMessage"]  # Gemini explains a stop at function calls
    for cut in (0, 2, len(upstream) - 1):
        chunks = raw_chunks(site, raw_key, prompt, f"cut:events={cut}" if cut else "", **body)
        finishing = [c["candidates"][0] for c in chunks if "finishReason" in c["candidates"][0]]
        assert [c.get("finishMessage") for c in finishing] == [message], cut  # once, on the last chunk
        assert chunks[-1]["candidates"][0] is finishing[0], cut
        assert all("finishMessage" not in c["candidates"][0] for c in chunks[:-1]), cut
    plain = raw_chunks(site, raw_key, "Tell me about rivers [[words=12]]", "cut:events=2")
    assert "finishMessage" not in plain[-1]["candidates"][0]  # none where Gemini gave none


def test_grounding_and_citations_reach_the_client_and_lose_their_offsets_once_a_break_splices_the_text(
    site: str, raw_key: str
) -> None:
    prompt = "Tell me about rivers [[words=30]] [[cite]]"
    chunks = direct(prompt)
    upstream = chunks[-1]["candidates"][0]
    clean = answer(site, raw_key, prompt)
    grounding, citations = clean["candidate"].grounding_metadata, clean["candidate"].citation_metadata
    assert grounding is not None  # on the last chunk, where Gemini puts them
    assert citations is not None
    assert [c.web.uri for c in grounding.grounding_chunks] == [
        c["web"]["uri"] for c in upstream["groundingMetadata"]["groundingChunks"]
    ]
    assert grounding.web_search_queries == upstream["groundingMetadata"]["webSearchQueries"]
    assert grounding.search_entry_point.rendered_content  # Google asks for it to be shown
    # an uninterrupted answer's offsets point into the text the client got (UTF-8 bytes)
    text = clean["text"].encode()
    assert len(grounding.grounding_supports) == 2
    for support in grounding.grounding_supports:
        segment = support.segment
        assert text[segment.start_index or 0 : segment.end_index].decode() == segment.text
    assert [(c.uri, c.end_index) for c in citations.citations] == [
        (c["uri"], c["endIndex"]) for c in upstream["citationMetadata"]["citationSources"]
    ]
    cuts = range(1, len(chunks))
    for cut, seen in zip(cuts, sweep(lambda faults: answer(site, raw_key, prompt, faults), cuts), strict=True):
        assert seen["text"] == clean["text"], cut
        grounding = seen["candidate"].grounding_metadata
        # the continuation's own search: its sources and queries pass on, but its offsets count
        # from its own text, which the client got after the kept text: they are dropped
        assert grounding is not None, cut
        assert grounding.grounding_chunks, cut
        assert grounding.web_search_queries, cut
        assert grounding.search_entry_point, cut
        assert grounding.grounding_supports is None, cut
        assert seen["candidate"].citation_metadata is None, cut


def test_safety_ratings_and_a_content_stop_after_a_break_reach_the_client(site: str, raw_key: str) -> None:
    prompt = "Tell me about rivers [[words=40]]"
    refused = answer(site, raw_key, "Tell me about rivers [[refuse]]")
    assert refused["finish"] == types.FinishReason.SAFETY
    blocked = [(r.category, r.probability, r.blocked) for r in refused["candidate"].safety_ratings or []]
    assert (types.HarmCategory.HARM_CATEGORY_DANGEROUS_CONTENT, types.HarmProbability.HIGH, True) in blocked
    # the continuation after a break is the one stopped for safety: the answer ends there, rated
    seen = answer(site, raw_key, prompt, "cut:events=3;error:events=3,type=SAFETY")
    assert seen["finish"] == types.FinishReason.SAFETY
    assert seen["text"]
    assert [(r.category, r.probability, r.blocked) for r in seen["candidate"].safety_ratings or []] == blocked
    assert Attempt.objects.filter(run_id=seen["run_id"]).count() == 2


def test_an_answer_spliced_from_attempts_is_rated_by_the_worst_of_them() -> None:
    """Each attempt rated the text it produced and the client's answer holds all of it: per category the
    highest probability, blocked if any attempt blocked; the finish message is the last attempt's."""
    from streamrecover.proxy.gemini_metadata import spliced_metadata
    from streamrecover.proxy.wire import AttemptMetadata

    first = {
        "finishMessage": "cut",
        "safetyRatings": [
            {"category": "HARM_CATEGORY_HARASSMENT", "probability": "MEDIUM"},
            {"category": "HARM_CATEGORY_HATE_SPEECH", "probability": "LOW", "blocked": True},
        ],
    }
    last = {
        "safetyRatings": [
            {"category": "HARM_CATEGORY_HARASSMENT", "probability": "LOW"},
            {"category": "HARM_CATEGORY_HATE_SPEECH", "probability": "HIGH"},
        ],
    }
    shown = spliced_metadata([AttemptMetadata(first, interrupted=True), AttemptMetadata(last, interrupted=False)])
    assert shown.get("safetyRatings") == [
        {"category": "HARM_CATEGORY_HARASSMENT", "probability": "MEDIUM"},
        {"category": "HARM_CATEGORY_HATE_SPEECH", "probability": "HIGH", "blocked": True},
    ]
    assert "finishMessage" not in shown  # the first attempt's said why it stopped, not why the answer did


def test_a_chunks_usage_never_shows_less_than_an_earlier_chunks() -> None:
    """Were the turn's summed count ever revised down (an attempt's estimate withdrawn), the client
    would still see counts that only grow, the last chunk's the highest."""
    from streamrecover.proxy.splice import TextPiece
    from streamrecover.proxy.wire import TurnUsage
    from streamrecover.proxy.wire_gemini import GeminiWriter

    def usage_of(chunk: bytes) -> dict[str, int]:
        return dict(json.loads(chunk.decode().removeprefix("data: "))["usageMetadata"])

    writer = GeminiWriter("response", MODEL)
    high = usage_of(writer.ops([TextPiece(0, "a")], TurnUsage(input_tokens=10, output_tokens=8, reasoning_tokens=3)))
    low = usage_of(writer.ops([TextPiece(0, "b")], TurnUsage(input_tokens=9, output_tokens=6, reasoning_tokens=2)))
    assert high == {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 18, "thoughtsTokenCount": 3}
    assert low == high
    last = usage_of(writer.end("end_turn", TurnUsage(input_tokens=12, output_tokens=9, reasoning_tokens=2)))
    assert last == {"promptTokenCount": 12, "candidatesTokenCount": 6, "totalTokenCount": 21, "thoughtsTokenCount": 3}


def test_a_conversation_with_a_function_response_reaches_the_provider_as_sent(site: str, raw_key: str) -> None:
    """History with a model turn's call and the user's function response, a system instruction and
    the client's generation settings: every request of the run (the continuation too) carries them."""
    history = [
        types.Content(role="user", parts=[types.Part(text="What is the weather in Paris? [[words=20]]")]),
        types.Content(
            role="model",
            parts=[types.Part(function_call=types.FunctionCall(name="get_weather", args={"city": "Paris"}))],
        ),
        types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(name="get_weather", response={"sky": "sunny", "c": 21})
                )
            ],
        ),
    ]
    config = tool_config(system_instruction="Answer briefly.", temperature=0.25, top_k=7)
    seen = answer(site, raw_key, history, "cut:events=3", config=config)
    assert seen["text"]
    run = Run.objects.get(pk=seen["run_id"])
    assert run.options["system"] == "Answer briefly."
    sent = [a.request["json"] for a in Attempt.objects.filter(run=run).order_by("index")]
    assert len(sent) == 2
    for body in sent:
        assert body["contents"][1]["parts"] == [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]
        assert body["contents"][2]["parts"] == [
            {"functionResponse": {"name": "get_weather", "response": {"sky": "sunny", "c": 21}}}
        ]
        assert body["systemInstruction"]["parts"] == [{"text": "Answer briefly."}]
        assert body["generationConfig"]["temperature"] == 0.25
        assert body["generationConfig"]["topK"] == 7
        assert [d["name"] for d in body["tools"][0]["functionDeclarations"]] == ["get_weather"]
    assert sent[0]["generationConfig"]["maxOutputTokens"] == 4096  # PROXY_DEFAULT_MAX_TOKENS
    assert sent[1]["generationConfig"]["maxOutputTokens"] < 4096  # what is left of it
    assert seen["text"] == "".join(b["text"] for b in stored_assistant(seen["run_id"]) if b["type"] == "text")


def test_nothing_salvageable_after_text_was_sent_raises_the_sdks_server_error(site: str, raw_key: str) -> None:
    with pytest.raises(errors.ServerError) as raised:
        answer(site, raw_key, "Tell me about rivers [[words=40]] [[seam=restart_new]]", "cut:events=6")
    assert raised.value.code == 500
    assert "could not be continued in place" in (raised.value.message or "")
    wait_for(Run.objects.get().pk)  # the run itself still completes and is stored


def test_a_permanent_error_mid_answer_raises_the_sdks_client_error_with_its_status(site: str, raw_key: str) -> None:
    with pytest.raises(errors.ClientError) as raised:
        answer(site, raw_key, "Tell me about rivers [[words=40]]", "error:events=5,type=INVALID_ARGUMENT")
    assert (raised.value.code, raised.value.status) == (400, "INVALID_ARGUMENT")
    assert wait_for(Run.objects.get().pk).status == "failed"


def test_a_permanent_error_before_anything_streamed_is_the_providers_http_error(site: str, raw_key: str) -> None:
    with pytest.raises(errors.ClientError) as raised:
        answer(site, raw_key, "Hello", "status:400")
    assert raised.value.code == 400
    assert raised.value.status == "INVALID_ARGUMENT"
    wait_for(Run.objects.get().pk)


def test_keys_and_limits_answer_as_the_sdk_raises_them(site: str, raw_key: str, django_user_model: Any) -> None:
    from streamrecover.proxy.admission import admit
    from streamrecover.proxy.inbound_gemini import parse_gemini
    from streamrecover.proxy.keys import revoke_key

    def ask(key: str, model: str = MODEL, **config: Any) -> None:
        client = client_for(site, key)
        list(
            client.models.generate_content_stream(
                model=model, contents="Hi", config=types.GenerateContentConfig(**config)
            )
        )

    for key in ("sk-sr-wrong", ""):
        url = f"{site}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
        refused = httpx.post(url, json={"contents": [{"parts": [{"text": "Hi"}]}]}, headers={"x-goog-api-key": key})
        assert refused.status_code == 401
        assert refused.json()["error"]["status"] == "UNAUTHENTICATED"
    with pytest.raises(errors.ClientError) as raised:
        ask("sk-sr-wrong")
    assert raised.value.code == 401
    # the key is taken as google-genai sends it, not in another SDK's header
    bearer = httpx.post(
        f"{site}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse",
        json={"contents": [{"parts": [{"text": "Hi"}]}]},
        headers={"authorization": f"Bearer {raw_key}"},
    )
    assert bearer.status_code == 401
    revoke_key(raw_key)
    with pytest.raises(errors.ClientError, match="401"):
        ask(raw_key)

    user = django_user_model.objects.create_user("limited", password="x")
    key, raw = issue_key(user, allowed_models=["gemini-2.5-*"], max_tokens=100, max_concurrent=1)
    with pytest.raises(errors.ClientError) as raised:
        ask(raw, model="gemini-2.0-pro")
    assert (raised.value.code, raised.value.status) == (403, "PERMISSION_DENIED")
    with pytest.raises(errors.ClientError) as raised:
        ask(raw, max_output_tokens=101)
    assert (raised.value.code, raised.value.status) == (400, "INVALID_ARGUMENT")
    assert "generationConfig.maxOutputTokens" in (raised.value.message or "")
    with pytest.raises(errors.ClientError, match="one candidate"):
        ask(raw, candidate_count=2)
    # one stream open already (a run of this key that has not ended): the second is refused
    body = json.dumps({"contents": [{"parts": [{"text": "Hi"}]}]}).encode()
    admit(key, parse_gemini(body, MODEL, True, 10), "fake-gemini", [])
    with pytest.raises(errors.ClientError) as raised:
        ask(raw)
    assert (raised.value.code, raised.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert Run.objects.count() == 1


def test_a_request_without_max_output_tokens_asks_for_the_keys_lower_limit(site: str, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("capped", password="x")
    raw = issue_key(user, max_tokens=300)[1]
    seen = answer(site, raw, "Tell me about rivers [[words=6]]")
    first = Attempt.objects.filter(run_id=seen["run_id"]).get()
    assert first.request["json"]["generationConfig"]["maxOutputTokens"] == 300


def test_a_non_streamed_request_passes_through_with_pre_stream_retries_only(site: str, raw_key: str) -> None:
    fake = local_fake_server()
    before = len(fake.log_for(DEFAULT_SCENARIO))
    fake.set_faults(DEFAULT_SCENARIO, parse_faults(["status:503", "ok", "status:400"]))
    client = client_for(site, raw_key)
    whole = client.models.generate_content(model=MODEL, contents="Tell me about rivers [[words=9]]")
    assert whole.text
    assert whole.candidates[0].finish_reason == types.FinishReason.STOP  # type: ignore[index]
    received = fake.log_for(DEFAULT_SCENARIO)[before:]
    assert len(received) == 2  # the 503, then the answer
    assert received[-1].request["generationConfig"]["maxOutputTokens"] == 4096  # PROXY_DEFAULT_MAX_TOKENS
    with pytest.raises(errors.ClientError) as raised:  # a permanent error is the client's at once
        client.models.generate_content(model=MODEL, contents="Tell me about rivers [[words=9]]")
    assert raised.value.code == 400
    assert PROVIDER_KEY not in whole.model_dump_json()
    assert not Run.objects.exists()


def test_a_gemini_request_to_a_provider_of_another_api_is_refused(site: str, raw_key: str) -> None:
    other = {**proxy_settings(settings.STREAMRECOVER, PROVIDERS=_providers()), "PROXY_GEMINI_PROVIDER": "fake"}
    with override_settings(STREAMRECOVER=other):
        with pytest.raises(errors.ClientError, match="Gemini provider"):
            answer(site, raw_key, "Hi")
        client = client_for(site, raw_key)
        with pytest.raises(errors.ClientError, match="Gemini provider"):
            client.models.generate_content(model=MODEL, contents="Hi")
    assert not Run.objects.exists()


def test_failover_continues_a_gemini_answer_on_another_gemini_provider(site: str, raw_key: str) -> None:
    prompt = "Tell me about rivers [[words=30]]"
    expected = answer(site, raw_key, prompt)["text"]
    backup = {"ADAPTER": "gemini", "BASE_URL": "fake://streamrecover"}
    configured = {
        **settings.STREAMRECOVER,
        "MAX_CONTINUATIONS": 1,
        "PROVIDERS": {**settings.STREAMRECOVER["PROVIDERS"], "fake-gemini-backup": backup},
        "PROXY_FAILOVER": {"gemini": {"PROVIDER": "fake-gemini-backup", "MODEL": "gemini-2.5-pro"}},
    }
    with override_settings(STREAMRECOVER=configured):
        seen = answer(site, raw_key, prompt, "cut:events=4;cut:events=3")
    assert seen["text"] == expected  # one stream, the same answer
    assert seen["text"] == "".join(b["text"] for b in stored_assistant(seen["run_id"]) if b["type"] == "text")
    run = Run.objects.get(pk=seen["run_id"])
    failover = run.events.get(name="llm_stream_failover").payload
    assert (failover["to_provider"], failover["to_model"]) == ("fake-gemini-backup", "gemini-2.5-pro")
    last = Attempt.objects.filter(run=run).order_by("index").last()
    assert last is not None
    assert "/models/gemini-2.5-pro:streamGenerateContent" in last.request["url"]


def test_gemini_settings_name_a_provider_and_fail_over_only_to_gemini() -> None:
    from streamrecover.conf import validate

    assert validate({"PROXY_GEMINI_PROVIDER": "gemini"}) == []  # the default, a key of its own
    assert [p for p in validate({"PROXY_GEMINI_PROVIDER": "nowhere"}) if "'nowhere', which is not in PROVIDERS" in p]
    to_gemini = {"PROXY_FAILOVER": {"gemini": {"PROVIDER": "gemini", "MODEL": "gemini-2.5-pro"}}}
    assert validate(to_gemini) == []
    with override_settings(STREAMRECOVER=to_gemini):
        assert checks.check_proxy_failover() == []  # no E003: the fields go as they are
    to_claude = {"PROXY_FAILOVER": {"gemini": {"PROVIDER": "anthropic", "MODEL": "claude-sonnet-4-5"}}}
    assert [p for p in validate(to_claude) if "not a Gemini provider" in p]


def test_a_gemini_3_call_goes_back_with_its_signature_as_the_sdk_re_encodes_it(site: str, raw_key: str) -> None:
    """google-genai keeps a thought signature as bytes and sends it back URL-safe base64 encoded
    (``-`` and ``_``), which the real API reads as it reads the standard alphabet: the second
    request of a function-calling turn, the model's call sent back as the SDK received it, is
    answered, not refused as an invalid signature."""
    client = client_for(site, raw_key)
    model = "gemini-3-pro-preview"
    ask = types.Content(role="user", parts=[types.Part(text="Check the weather [[words=12]] [[tool]]")])
    chunks = list(client.models.generate_content_stream(model=model, contents=[ask], config=tool_config()))
    parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]  # type: ignore[union-attr,index]
    call = next(p for p in parts if p.function_call)
    assert call.thought_signature
    sent = call.model_dump(mode="json", exclude_none=True, by_alias=True)["thoughtSignature"]
    assert {"-", "_"} & set(sent), sent  # what the SDK sends differs from what the API sent
    result = types.Part(
        function_response=types.FunctionResponse(name="get_weather", response={"sky": "sunny", "c": 21})
    )
    history = [ask, types.Content(role="model", parts=parts), types.Content(role="user", parts=[result])]
    follow = list(client.models.generate_content_stream(model=model, contents=history, config=tool_config()))
    text = "".join(p.text or "" for c in follow for p in (c.candidates[0].content.parts or []))  # type: ignore[union-attr,index]
    assert text.strip()
    assert follow[-1].candidates[0].finish_reason == types.FinishReason.STOP  # type: ignore[index]


def sent_configs(site: str, key: str, model: str, config: dict[str, Any], faults: str) -> list[dict[str, Any]]:
    """The ``generationConfig`` of every call of the run that served one streamed answer (the
    client's body, ``config`` as its ``generationConfig``), in order, as the provider got them."""
    url = f"{site}/v1beta/models/{model}:streamGenerateContent?alt=sse"
    headers = {"x-goog-api-key": key, FAULTS_HEADER: faults}
    contents = [{"role": "user", "parts": [{"text": "Tell me about rivers [[think=400]] [[words=300]]"}]}]
    response = httpx.post(url, json={"contents": contents, "generationConfig": config}, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    run_id = response.headers["x-streamrecover-run"]
    wait_for(run_id)
    received = [e.request for e in local_fake_server().log if e.scenario == f"run-{run_id}"]
    return [request["generationConfig"] for request in received]


@pytest.mark.parametrize(
    ("model", "spelling", "minimum"),
    [
        pytest.param(MODEL, ("thinkingConfig", "thinkingBudget", "includeThoughts"), 1, id="flash"),
        # 2.5 Pro takes 128 or more; the client's fields in snake_case, as proto JSON takes them
        pytest.param("gemini-2.5-pro", ("thinking_config", "thinking_budget", "include_thoughts"), 128, id="pro"),
    ],
)
def test_a_continuation_lowers_the_clients_own_thinking_budget_to_what_is_left(
    site: str, raw_key: str, model: str, spelling: tuple[str, str, str], minimum: int
) -> None:
    """A client's ``maxOutputTokens`` is the turn's budget, and its ``thinkingBudget`` was sent
    unchanged on a continuation asking for less, so the model could think away all that was
    left: the continuation's budget is now one below what is left, never under the model's
    smallest, in the client's own spelling, its other thinking fields as sent."""
    config_name, budget_name, shown_name = spelling
    floors = []
    # shown thoughts stream (cut inside the thinking); hidden ones are billed at once (cut in the text)
    for shown, cut in ((True, 9000), (False, 2000)):
        thinking = {budget_name: 200, shown_name: shown}
        config = {"maxOutputTokens": 250, config_name: thinking}
        sent = sent_configs(site, raw_key, model, config, f"cut:bytes={cut}")
        assert len(sent) == 2, sent  # the answer and its continuation
        assert sent[0] == config  # the first call: as the client sent it
        left = sent[1]["maxOutputTokens"]
        assert left <= 200, sent  # the break came late enough: no more is left than the budget
        lowered = {budget_name: max(left - 1, minimum), shown_name: shown}
        assert sent[1] == {"maxOutputTokens": left, config_name: lowered}, sent
        floors.append(left - 1 < minimum)
    assert any(floors) == (minimum > 1)  # 2.5 Pro's minimum, where one below what is left is less
    # a budget the model fits on its own (dynamic, off) or a level is no budget to lower
    unchanged: list[tuple[str, dict[str, Any]]] = [
        (MODEL, {"thinkingBudget": -1, "includeThoughts": True}),
        (MODEL, {"thinkingBudget": 0}),
        ("gemini-3-pro-preview", {"thinkingLevel": "low", "includeThoughts": True}),
    ]
    for model_name, kept in unchanged:
        config = {"maxOutputTokens": 250, "thinkingConfig": kept}
        sent = sent_configs(site, raw_key, model_name, config, "cut:bytes=9000")
        assert len(sent) == 2, sent
        assert sent[1]["maxOutputTokens"] < 250, sent
        assert [c["thinkingConfig"] for c in sent] == [kept, kept], sent


def test_google_genai_thinking_config_is_lowered_on_a_continuation(site: str, raw_key: str) -> None:
    """The official client's ``ThinkingConfig`` (as it writes it) gets the same: its budget lowered
    to one below what the continuation asks for, its thoughts shown to the client as asked."""
    thinking = types.ThinkingConfig(include_thoughts=True, thinking_budget=200)
    prompt = "Tell me about rivers [[think=400]] [[words=300]]"
    seen = answer(site, raw_key, prompt, "cut:bytes=9000", max_output_tokens=250, thinking_config=thinking)
    assert seen["thoughts"]
    received = [e.request["generationConfig"] for e in local_fake_server().log if e.scenario == f"run-{seen['run_id']}"]
    assert len(received) == 2, received
    name = next(n for n in ("thinkingConfig", "thinking_config") if n in received[0])
    budget = next(n for n in ("thinkingBudget", "thinking_budget") if n in received[0][name])
    assert received[0][name][budget] == 200
    left = received[1]["maxOutputTokens"]
    assert left < 200, received
    assert received[1][name] == {**received[0][name], budget: left - 1}, received
