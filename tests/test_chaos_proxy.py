"""The chaos proxy: the upstream's response unchanged when no fault is set, broken as told when
one is (seen by raw httpx and by the official ``anthropic`` and ``openai`` clients), and
streamrecover's own engine recovering through it. The fake provider is the upstream."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.core.management import CommandError, call_command

from streamrecover.engine.agent import run_agent
from streamrecover.engine.checkpoint import InMemoryCheckpointStore
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest, ProviderConfig
from streamrecover.engine.sink import CollectingSink
from streamrecover.engine.transport import HttpxTransport
from streamrecover.providers.registry import get_adapter
from streamrecover.testing import ChaosProxy, fake_server
from streamrecover.testing.client import ClientView

from .harness import FAST

ROOT = Path(__file__).resolve().parent.parent
ANTHROPIC_HEADERS = {"x-api-key": "sk-test", "anthropic-version": "2023-06-01"}
OPENAI_HEADERS = {"authorization": "Bearer sk-test"}
PROMPT = "Tell me about rivers [[words=60]]"


def anthropic_body(prompt: str = PROMPT) -> dict:
    return {"model": "claude-x", "max_tokens": 500, "stream": True, "messages": [{"role": "user", "content": prompt}]}


def openai_body(prompt: str = PROMPT) -> dict:
    return {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": prompt}]}


WIRES = [
    pytest.param("/v1/messages", anthropic_body, ANTHROPIC_HEADERS, id="anthropic"),
    pytest.param("/v1/chat/completions", openai_body, OPENAI_HEADERS, id="openai"),
]


@pytest.fixture(scope="module")
def upstream() -> Iterator[object]:
    with fake_server() as server:
        yield server


@pytest.fixture
def proxy(upstream) -> Iterator[ChaosProxy]:
    with ChaosProxy(upstream.base_url) as chaos:
        yield chaos


def ids_out(raw: bytes) -> bytes:
    """``raw`` without the fake's per-request ids (each request gets the next one)."""
    return re.sub(rb"req_fake\d+", b"req_fake", raw)


def events_of(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


def read(url: str, body: dict, headers: dict, *, http2: bool = False) -> tuple[httpx.Response, bytes, Exception | None]:
    """The response and the body bytes received, and the error that ended the body, if any."""
    received = bytearray()
    with (
        httpx.Client(http1=not http2, http2=http2, timeout=30) as client,
        client.stream("POST", url, json=body, headers=headers) as response,
    ):
        try:
            for chunk in response.iter_raw():
                received += chunk
        except httpx.HTTPError as exc:
            return response, bytes(received), exc
    return response, bytes(received), None


@pytest.mark.parametrize(("path", "body", "headers"), WIRES)
@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
def test_no_fault_forwards_the_upstream_response_byte_for_byte(upstream, proxy, path, body, headers, http2):
    direct, expected, error = read(upstream.base_url + path, body(), headers)
    assert error is None
    through, received, error = read(proxy.base_url + path, body(), headers, http2=http2)
    assert error is None
    assert received == expected
    assert through.status_code == direct.status_code == 200
    assert through.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    same = ("content-type", "cache-control")
    assert {k: through.headers[k] for k in same} == {k: direct.headers[k] for k in same}
    assert through.headers["request-id" if "messages" in path else "x-request-id"].startswith("req_fake")
    (entry,) = proxy.log
    assert entry.fault is None
    assert not entry.fault_triggered
    assert entry.bytes_forwarded == len(expected)


def test_errors_and_plain_json_pass_unchanged(upstream, proxy):
    bad = {**anthropic_body(), "stream": False, "max_tokens": "lots"}
    direct = httpx.post(upstream.base_url + "/v1/messages", json=bad, headers=ANTHROPIC_HEADERS)
    through = httpx.post(proxy.base_url + "/v1/messages", json=bad, headers=ANTHROPIC_HEADERS)
    assert through.status_code == direct.status_code >= 400
    assert ids_out(through.content) == ids_out(direct.content)
    whole = {**anthropic_body(), "stream": False}
    direct = httpx.post(upstream.base_url + "/v1/messages", json=whole, headers=ANTHROPIC_HEADERS)
    through = httpx.post(proxy.base_url + "/v1/messages?beta=true", json=whole, headers=ANTHROPIC_HEADERS)
    assert through.status_code == 200
    assert through.json()["content"] == direct.json()["content"]


@pytest.mark.parametrize(("path", "body", "headers"), WIRES)
def test_cuts_stop_exactly_where_told_and_the_client_sees_a_broken_body(upstream, proxy, path, body, headers):
    _, whole, _ = read(upstream.base_url + path, body(), headers)
    events = events_of(whole)

    proxy.set_faults("default", ["cut:events=5"])
    _, received, error = read(proxy.base_url + path, body(), headers)
    assert isinstance(error, httpx.RemoteProtocolError)
    assert received == b"".join(events[:5])

    proxy.set_faults("default", ["cut:events=5,mid"])
    _, received, error = read(proxy.base_url + path, body(), headers)
    assert isinstance(error, httpx.RemoteProtocolError)
    assert received == b"".join(events[:5]) + events[5][: len(events[5]) // 2]

    proxy.set_faults("default", ["cut:bytes=333"])
    _, received, error = read(proxy.base_url + path, body(), headers)
    assert isinstance(error, httpx.RemoteProtocolError)
    assert received == whole[:333]

    proxy.set_faults("default", ["eof:events=4"])
    _, received, error = read(proxy.base_url + path, body(), headers)
    assert error is None  # a clean end, without the terminator
    assert received == b"".join(events[:4])

    proxy.set_faults("default", ["cut:events=100000"])  # beyond the stream: no break
    _, received, error = read(proxy.base_url + path, body(), headers)
    assert error is None
    assert received == whole
    assert [e.fault_triggered for e in proxy.log] == [True, True, True, True, False]


def test_error_event_stall_garbage_status_and_drop(upstream, proxy):
    path, headers = "/v1/messages", ANTHROPIC_HEADERS
    _, whole, _ = read(upstream.base_url + path, anthropic_body(), headers)
    events = events_of(whole)

    proxy.set_faults("default", ["error:events=6,type=overloaded_error"])
    _, received, error = read(proxy.base_url + path, anthropic_body(), headers)
    assert error is None
    assert received.startswith(b"".join(events[:6]))
    assert events_of(received)[-1].startswith(b"event: error\ndata: ")
    assert b"overloaded_error" in events_of(received)[-1]

    proxy.set_faults("default", ["stall:events=3,seconds=0.6,then=continue"])
    started = time.monotonic()
    _, received, error = read(proxy.base_url + path, anthropic_body(), headers)
    assert error is None
    assert received == whole
    assert time.monotonic() - started >= 0.6

    proxy.set_faults("default", ["garbage:events=2"])
    before = len(upstream.log)
    _, received, error = read(proxy.base_url + path, anthropic_body(), headers)
    assert received.startswith(b"".join(events[:2]))
    assert len(events_of(received)) == 3
    assert events_of(received)[2] != events[2]

    calls = len(upstream.log)  # the upstream logged the request when it accepted it
    assert calls == before + 1
    proxy.set_faults("default", ["status:429,retry_after=2", "drop"])
    response = httpx.post(proxy.base_url + path, json=anthropic_body(), headers=headers)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"
    assert response.json()["error"]["type"] == "rate_limit_error"
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(proxy.base_url + path, json=anthropic_body(), headers=headers)
    assert len(upstream.log) == calls  # neither reached the upstream


def data_of(event: bytes) -> dict:
    return json.loads(event.rsplit(b"\ndata: ", 1)[1])


@pytest.mark.parametrize("fault", ["error:events=5", "error:events=0"])
def test_a_responses_error_event_is_numbered_after_the_event_before_it(upstream, proxy, fault):
    # the real Responses API numbers every event, an error too: one past the event before it
    body = {"model": "gpt-4o", "input": PROMPT, "stream": True}
    proxy.set_faults("default", [fault])
    _, received, error = read(proxy.base_url + "/v1/responses", body, OPENAI_HEADERS)
    assert error is None
    *whole, last = events_of(received)
    assert [data_of(event)["sequence_number"] for event in whole] == list(range(len(whole)))
    injected = data_of(last)
    assert (injected["type"], injected["code"]) == ("error", "server_error")
    assert injected["sequence_number"] == len(whole)  # 0 when nothing came before it


@pytest.mark.parametrize(("fault", "number"), [("error:events=2", 11), ("error:events=0", 9)])
def test_a_responses_error_on_a_re_attach_goes_on_from_the_cursor(upstream, proxy, fault, number):
    body = {"model": "gpt-4o", "input": PROMPT, "stream": True, "background": True, "store": True}
    _, created, _ = read(upstream.base_url + "/v1/responses", body, OPENAI_HEADERS)
    rid = data_of(events_of(created)[0])["response"]["id"]
    proxy.set_faults("default", [fault])
    url = f"{proxy.base_url}/v1/responses/{rid}?stream=true&starting_after=8"
    with httpx.Client(timeout=30) as client:
        received = client.get(url, headers=OPENAI_HEADERS).content
    *whole, last = events_of(received)
    assert [data_of(event)["sequence_number"] for event in whole] == list(range(9, number))
    assert (data_of(last)["type"], data_of(last)["sequence_number"]) == ("error", number)


def test_goaway_over_http2_and_a_plain_cut_over_http1(upstream, proxy):
    path, headers = "/v1/messages", ANTHROPIC_HEADERS
    _, whole, _ = read(upstream.base_url + path, anthropic_body(), headers)
    proxy.set_faults("default", ["goaway:events=7", "goaway:events=7"])
    response, received, error = read(proxy.base_url + path, anthropic_body(), headers, http2=True)
    assert response.http_version == "HTTP/2"
    assert error is not None, "the client must see the stream break"
    assert received == b"".join(events_of(whole)[:7])
    _, received, error = read(proxy.base_url + path, anthropic_body(), headers)
    assert isinstance(error, httpx.RemoteProtocolError)


def test_the_official_anthropic_client_through_the_proxy(upstream, proxy):
    anthropic = pytest.importorskip("anthropic")
    request = {"model": "claude-x", "max_tokens": 500, "messages": [{"role": "user", "content": PROMPT}]}
    direct = anthropic.Anthropic(base_url=upstream.base_url, api_key="sk-test", max_retries=0)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key="sk-test", max_retries=0)
    with direct.messages.with_streaming_response.create(stream=True, **request) as response:
        expected = b"".join(response.iter_bytes())
    with client.messages.with_streaming_response.create(stream=True, **request) as response:
        assert b"".join(response.iter_bytes()) == expected
    deltas = [e for e in client.messages.create(stream=True, **request) if e.type == "content_block_delta"]
    assert deltas  # the SDK parses what the proxy forwarded

    proxy.set_faults("default", ["cut:events=6"])
    with pytest.raises(Exception, match=r"incomplete chunked read|peer closed") as broken:
        for _ in client.messages.create(stream=True, **request):
            pass
    assert "RemoteProtocolError" in type(broken.value).__name__ or isinstance(broken.value, anthropic.APIError)

    proxy.set_faults("default", ["error:events=6"])
    with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
        for _ in client.messages.create(stream=True, **request):
            pass


def test_the_official_openai_client_through_the_proxy(upstream, proxy):
    openai = pytest.importorskip("openai")
    request = {"model": "gpt-4o", "messages": [{"role": "user", "content": PROMPT}]}
    direct = openai.OpenAI(base_url=f"{upstream.base_url}/v1", api_key="sk-test", max_retries=0)
    client = openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key="sk-test", max_retries=0)
    with direct.chat.completions.with_streaming_response.create(stream=True, **request) as response:
        expected = b"".join(response.iter_bytes())
    with client.chat.completions.with_streaming_response.create(stream=True, **request) as response:
        assert b"".join(response.iter_bytes()) == expected
    chunks = list(client.chat.completions.create(stream=True, **request))
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason == "stop"

    proxy.set_faults("default", ["cut:bytes=400"])
    with pytest.raises(openai.APIConnectionError):
        for _ in client.chat.completions.create(stream=True, **request):
            pass

    proxy.set_faults("default", ["error:events=3"])
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(stream=True, **request):
            pass


@pytest.mark.parametrize(("wire", "model", "base"), [("anthropic", "claude-x", ""), ("openai", "gpt-4o", "/v1")])
@pytest.mark.parametrize("fault", ["cut:bytes=1500", "stall:events=9,seconds=3", "error:events=12", "goaway:events=10"])
async def test_the_engine_recovers_through_the_proxy(upstream, proxy, wire, model, base, fault):
    async def run(target: str, faults: list[str]) -> tuple[object, CollectingSink]:
        scenario = uuid.uuid4().hex
        proxy.set_faults(scenario, faults)
        config = ProviderConfig(
            name=wire, base_url=target + base, api_key="sk-test", extra_headers={"x-fake-scenario": scenario}
        )
        sink = CollectingSink()
        async with HttpxTransport(http2_prior_knowledge=fault.startswith("goaway")) as transport:
            ctx = RunContext(
                run_id=scenario,
                adapter=get_adapter(config),
                config=FAST,
                sink=sink,
                checkpoints=InMemoryCheckpointStore(),
                transport=transport,
            )
            request = ModelRequest(model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=4096)
            return await run_agent(ctx, request), sink

    reference, _ = await run(upstream.base_url, [])
    result, sink = await run(proxy.base_url, [fault])
    assert result.status == "completed"
    interrupted = [e.fields for e in sink.events if e.name == "llm_stream_interrupted"]
    assert len(interrupted) == 1, sink.names()
    assert result.messages == reference.messages  # continued to exactly the uninterrupted answer
    view = ClientView().apply_all(sink.frames)
    assert [shown for shown, _ in view.turns] == [committed for _, committed in view.turns]


def test_the_proxy_listens_on_loopback_only_and_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="loopback"):
        ChaosProxy("http://127.0.0.1:9", "0.0.0.0")
    with pytest.raises(ValueError, match="from_end"):
        ChaosProxy("http://127.0.0.1:9", faults=["cut:from_end=1"])
    with pytest.raises(CommandError, match="loopback"):
        call_command("streamrecover_chaos_proxy", "--upstream", "http://127.0.0.1:9", "--host", "192.0.2.1")
    with pytest.raises(CommandError, match="--fault"):
        call_command("streamrecover_chaos_proxy", "--upstream", "http://127.0.0.1:9", "--fault", "cut:nonsense=1")
    with pytest.raises(CommandError, match="http"):
        call_command("streamrecover_chaos_proxy", "--upstream", "ftp://example.test")


def test_the_command_serves_the_proxy(upstream):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "manage.py", "streamrecover_chaos_proxy", "--upstream", upstream.base_url]
    command += ["--port", "0", "--fault", "cut:events=3;ok", "--loop"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("Chaos proxy listening on http://127.0.0.1:"), line + process.stderr.read()
        url = line.split()[4]
        assert "cut:events=3; ok (looped)" in process.stdout.readline()
        outcomes = []
        for _ in range(3):
            _, received, error = read(url + "/v1/messages", anthropic_body(), ANTHROPIC_HEADERS)
            outcomes.append((len(events_of(received)), error is None))
        assert outcomes[0] == (3, False)
        assert outcomes[1][1] is True
        assert outcomes[1][0] > 3
        assert outcomes[2] == (3, False)  # --loop: the script started over
    finally:
        process.terminate()
        process.wait(timeout=10)
