"""Every fault of the fake provider produces what a real client sees, and bills honestly.

Plain httpx against the real loopback server: a cut is a ``RemoteProtocolError``, a clean
EOF is no error at all, a stall is a ``ReadTimeout``, a mid-stream error arrives in a 200.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from streamrecover.engine.contract import CONTINUE_INSTRUCTION
from streamrecover.engine.sse import SSEDecoder, SSEEvent
from streamrecover.testing.fake import FakeProviderServer, Fault, FaultKind, parse_script
from streamrecover.testing.fake.faults import plan_delivery
from streamrecover.testing.fake.wire import WireEvent

HTTP = httpx.Client(timeout=10)  # one client: building one per request costs ~50 ms (TLS context)
PROMPT = "Tell me about bridges [[words=40]]"
HEADERS = {
    "anthropic": {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"},
    "openai": {"authorization": "Bearer sk-test"},
}
PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}


@dataclass
class Received:
    status: int
    headers: httpx.Headers
    body: bytes
    error: Exception | None


@pytest.fixture(scope="module")
def server() -> Any:
    with FakeProviderServer() as running:
        yield running


@pytest.fixture(autouse=True)
def _clean(server: FakeProviderServer) -> None:
    server.reset()


def request_body(provider: str, messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    messages = messages or [{"role": "user", "content": PROMPT}]
    if provider == "anthropic":
        return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": True, "messages": messages}
    return {"model": "gpt-4o", "stream": True, "messages": messages, "stream_options": {"include_usage": True}}


def fetch(
    server: FakeProviderServer,
    provider: str = "anthropic",
    *,
    scenario: str | None = None,
    timeout: httpx.Timeout | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> Received:
    """POST a streaming request and read the raw body until it ends or breaks."""
    headers = dict(HEADERS[provider], **({"x-fake-scenario": scenario} if scenario else {}))
    url = server.base_url + PATHS[provider]
    chunks: list[bytes] = []
    error: Exception | None = None
    with HTTP.stream("POST", url, json=request_body(provider, messages), headers=headers, timeout=timeout) as response:
        try:
            for part in response.iter_raw():
                chunks.append(part)
        except httpx.TransportError as exc:
            error = exc
    return Received(response.status_code, response.headers, b"".join(chunks), error)


def events(raw: bytes) -> list[SSEEvent]:
    """The events a client can use: complete ones only (an unterminated one is dropped)."""
    decoder = SSEDecoder()
    return decoder.feed(raw) + decoder.close()


def delivered_text(raw: bytes) -> tuple[str, int]:
    """Text and content-delta count of the complete events in ``raw`` (either format)."""
    text, deltas = "", 0
    for event in events(raw):
        if event.data == "[DONE]":
            continue
        data = json.loads(event.data)
        if event.event == "content_block_delta" and data["delta"].get("text"):
            text, deltas = text + data["delta"]["text"], deltas + 1
        for choice in data.get("choices", []) if event.event == "message" else []:
            if choice["delta"].get("content"):
                text, deltas = text + choice["delta"]["content"], deltas + 1
    return text, deltas


def event_boundaries(raw: bytes) -> list[int]:
    return [i + 2 for i in range(len(raw)) if raw[i : i + 2] == b"\n\n"]


# -- fault specs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "ok",
        "drop",
        "cut:bytes=900",
        "cut:events=12",
        "cut:events=12,mid=true",
        "eof:events=12",
        "cut:from_end=1",
        "stall:events=5,seconds=3",
        "stall:bytes=10,seconds=0.5,then=continue",
        "error:events=8,type=overloaded_error",
        "error:events=2,type=api_error,message=Internal server error",
        "garbage:events=3",
        "bad_utf8:events=3",
        "status:429,retry_after=2",
        "status:529,retry_after_ms=1500,should_retry=false",
        "status:429,retry_after_date=5",
        "status:429,quota=true",
        "stall_headers:seconds=30",
        "goaway:events=12",
        "goaway:bytes=900",
    ],
)
def test_fault_forms_round_trip(text: str) -> None:
    fault = Fault.parse(text)
    assert str(fault) == text
    assert Fault.from_dict(fault.to_dict()) == fault
    assert Fault.from_dict(json.loads(json.dumps(fault.to_dict()))) == fault


def test_fault_short_forms_and_scripts() -> None:
    assert Fault.parse("cut:12,mid") == Fault(FaultKind.CUT, events=12, mid=True)
    assert Fault.parse("status:503") == Fault("status", code=503)
    assert Fault.parse(" status : 429 , quota ") == Fault("status", code=429, quota=True)
    assert Fault.from_dict({"kind": "cut", "bytes": "900"}) == Fault("cut", byte_offset=900)
    assert Fault.parse("error:events=1,type=api_error").to_dict() == {"kind": "error", "events": 1, "type": "api_error"}
    script = parse_script("ok; cut:bytes=10 ;\nstatus:500;")
    assert [f.kind for f in script] == [FaultKind.OK, FaultKind.CUT, FaultKind.STATUS]


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("explode", "unknown fault kind"),
        ("cut", "exactly one of events=, bytes= or from_end="),
        ("cut:events=1,bytes=2", "exactly one of events=, bytes= or from_end="),
        ("cut:bytes=-1", "cannot be negative"),
        ("cut:colour=red", "unknown fault parameter 'colour'"),
        ("eof:events=x", "bad value for events"),
        ("stall:events=1", "needs seconds="),
        ("stall:events=1,seconds=1,then=later", "then= must be one of"),
        ("error:bytes=3", "takes no bytes"),
        ("error:type=api_error", "needs events="),
        ("status", "needs a code"),
        ("status:200", "needs a code"),
        ("status:429,retry_after=1,retry_after_date=2", "choose one"),
        ("drop:events=1", "takes no events"),
        ("cut:bytes=3,mid", "mid needs events="),
        ("stall_headers", "needs seconds="),
        ("stall_headers:seconds=1,events=2", "takes no events"),
        ("goaway", "exactly one of events=, bytes= or from_end="),
    ],
)
def test_invalid_faults_are_refused(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=re.escape(complaint)):
        Fault.parse(text)


def test_delivery_splits_at_the_exact_byte_and_bills_whole_events_only() -> None:
    stream = [WireEvent(b"aaaa", 1, "a"), WireEvent(b"bbbb", 1, "b"), WireEvent(b"cc")]

    cut = plan_delivery(stream, Fault("cut", byte_offset=6))
    assert [(p.data, p.tokens) for p in cut.pieces] == [(b"aaaa", 1), (b"bb", 0)]
    assert (cut.clean_end, cut.triggered, cut.complete) == (False, True, False)

    stall = plan_delivery(stream, Fault("stall", byte_offset=6, seconds=1, then="continue"))
    assert [(p.data, p.tokens) for p in stall.pieces] == [(b"aaaa", 1), (b"bb", 0), (b"bb", 1), (b"cc", 0)]
    assert (stall.stall_before, stall.clean_end, stall.complete) == (2, True, True)

    mid = plan_delivery(stream, Fault("eof", events=1, mid=True))
    assert [p.data for p in mid.pieces] == [b"aaaa", b"bb"]
    assert mid.clean_end

    assert not plan_delivery(stream, Fault("cut", byte_offset=11)).triggered
    assert plan_delivery(stream, Fault("cut", byte_offset=10)).triggered  # all bytes, but no last chunk
    assert not plan_delivery(stream, Fault("eof", events=3)).triggered
    assert not plan_delivery(stream, Fault("garbage", events=3)).triggered

    # counted back from the end: only the last event (the terminator) is lost
    last = plan_delivery(stream, Fault("cut", from_end=1))
    assert [p.data for p in last.pieces] == [b"aaaa", b"bbbb"]
    assert (last.clean_end, last.triggered, last.complete) == (False, True, False)
    assert not plan_delivery(stream, Fault("cut", from_end=4)).triggered


# -- what a client sees -------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_cut_is_an_incomplete_chunked_read_and_bills_only_whole_deltas(
    server: FakeProviderServer, provider: str
) -> None:
    full = fetch(server, provider).body
    full_text, full_deltas = delivered_text(full)
    assert server.log[-1].billed_output_tokens == full_deltas
    inside_a_character = full.index("日".encode()) + 1
    for offset in (1, 300, 301, 302, 777, inside_a_character, len(full) - 20, len(full)):
        server.set_faults("default", [Fault("cut", byte_offset=offset)])
        received = fetch(server, provider)
        assert isinstance(received.error, httpx.RemoteProtocolError)
        assert "incomplete chunked read" in str(received.error)
        assert received.body == full[:offset]
        entry = server.log[-1]
        assert (entry.fault, entry.fault_triggered, entry.bytes_sent) == (
            {"kind": "cut", "bytes": offset},
            True,
            offset,
        )
        text, deltas = delivered_text(received.body)
        assert (entry.billed_text, entry.billed_output_tokens) == (text, deltas)
        assert full_text.startswith(text)
        assert entry.completed is (offset == len(full))
    with pytest.raises(UnicodeDecodeError):
        full[:inside_a_character].decode()


def test_cut_after_whole_events_or_inside_one(server: FakeProviderServer) -> None:
    full = fetch(server).body
    ends = event_boundaries(full)
    server.set_faults("default", ["cut:events=5", "cut:events=5,mid"])
    whole = fetch(server)
    assert whole.body == full[: ends[4]]
    assert isinstance(whole.error, httpx.RemoteProtocolError)
    middle = fetch(server)
    assert middle.body == full[: ends[4] + (ends[5] - ends[4]) // 2]
    assert isinstance(middle.error, httpx.RemoteProtocolError)
    assert len(events(middle.body)) == 5


@pytest.mark.parametrize(("provider", "terminator"), [("anthropic", b"message_stop"), ("openai", b"[DONE]")])
def test_eof_ends_cleanly_without_the_terminator(server: FakeProviderServer, provider: str, terminator: bytes) -> None:
    full = fetch(server, provider).body
    assert terminator in full
    server.set_faults("default", ["eof:events=12"])
    received = fetch(server, provider)
    assert received.error is None  # httpx, like the SDKs, sees a normal end
    assert received.body == full[: event_boundaries(full)[11]]
    assert terminator not in received.body
    entry = server.log[-1]
    assert (entry.fault_triggered, entry.completed) == (True, False)


def test_stall_longer_than_the_read_timeout_is_a_read_timeout(server: FakeProviderServer) -> None:
    full = fetch(server).body
    server.set_faults("default", ["stall:events=5,seconds=0.4"])
    received = fetch(server, timeout=httpx.Timeout(5, read=0.15))
    assert isinstance(received.error, httpx.ReadTimeout)
    assert received.body == full[: event_boundaries(full)[4]]

    server.set_faults("default", ["stall:events=5,seconds=0.3,then=continue", "stall:events=3,seconds=0.2,then=eof"])
    started = time.monotonic()
    resumed = fetch(server)
    assert time.monotonic() - started >= 0.3
    assert (resumed.error, resumed.body) == (None, full)
    assert server.log[-1].completed
    ended = fetch(server)
    assert (ended.error, ended.body) == (None, full[: event_boundaries(full)[2]])


def test_anthropic_error_event_arrives_in_a_200(server: FakeProviderServer) -> None:
    server.set_faults("default", ["error:events=8", "error:events=4,type=api_error,message=Internal server error"])
    received = fetch(server)
    assert (received.status, received.error) == (200, None)
    assert received.body.endswith(
        b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n'
    )
    assert [e.event for e in events(received.body)][-1] == "error"
    assert len(events(received.body)) == 9
    assert b"message_stop" not in received.body
    custom = events(fetch(server).body)[-1]
    assert json.loads(custom.data)["error"] == {"type": "api_error", "message": "Internal server error"}


def test_openai_error_chunk_arrives_in_a_200(server: FakeProviderServer) -> None:
    server.set_faults("default", ["error:events=3"])
    received = fetch(server, "openai")
    assert (received.status, received.error) == (200, None)
    last = json.loads(events(received.body)[-1].data)
    assert last["error"]["type"] == "server_error"
    assert set(last["error"]) == {"message", "type", "param", "code"}
    assert b"[DONE]" not in received.body


@pytest.mark.parametrize(
    ("provider", "fault", "status", "headers", "error"),
    [
        ("anthropic", "status:429,retry_after=2", 429, {"retry-after": "2"}, {"type": "rate_limit_error"}),
        ("anthropic", "status:529,retry_after_ms=1500", 529, {"retry-after-ms": "1500"}, {"type": "overloaded_error"}),
        ("anthropic", "status:500,should_retry=false", 500, {"x-should-retry": "false"}, {"type": "api_error"}),
        ("anthropic", "status:401", 401, {}, {"type": "authentication_error"}),
        (
            "anthropic",
            "status:400,message=You have reached your specified API usage limits",
            400,
            {},
            {"type": "invalid_request_error", "message": "You have reached your specified API usage limits"},
        ),
        (
            "anthropic",
            "status:429,quota",
            429,
            {},
            {"type": "rate_limit_error", "details": {"error_code": "enforced_spend_limit_reached"}},
        ),
        (
            "openai",
            "status:429,retry_after=1",
            429,
            {"retry-after": "1"},
            {"type": "requests", "code": "rate_limit_exceeded"},
        ),
        ("openai", "status:429,quota", 429, {}, {"type": "insufficient_quota", "code": "insufficient_quota"}),
        ("openai", "status:503", 503, {}, {"type": "server_error"}),
        ("openai", "status:500,type=server_error", 500, {}, {"type": "server_error"}),
    ],
)
def test_status_faults_answer_before_any_stream(
    server: FakeProviderServer, provider: str, fault: str, status: int, headers: dict[str, str], error: dict[str, Any]
) -> None:
    server.set_faults("default", [fault])
    received = fetch(server, provider)
    assert received.status == status
    assert received.headers["content-type"] == "application/json"
    for name, value in headers.items():
        assert received.headers[name] == value
    if "quota" in fault:
        assert "retry-after" not in received.headers
    body = json.loads(received.body)
    if provider == "anthropic":
        assert body["type"] == "error"
        assert body["request_id"] == received.headers["request-id"]
    assert error.items() <= body["error"].items()
    entry = server.log[-1]
    assert (entry.status, entry.fault_triggered, entry.billed_output_tokens) == (status, True, 0)


def test_retry_after_as_an_http_date(server: FakeProviderServer) -> None:
    server.set_faults("default", ["status:529,retry_after_date=5"])
    received = fetch(server)
    when = email.utils.parsedate_to_datetime(received.headers["retry-after"])
    assert 3 <= (when - datetime.now(UTC)).total_seconds() <= 6


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_garbage_and_bad_utf8_after_n_events(server: FakeProviderServer, provider: str) -> None:
    full = fetch(server, provider).body
    ends = event_boundaries(full)
    server.set_faults("default", ["garbage:events=6", "bad_utf8:events=6"])

    garbage = fetch(server, provider)
    assert garbage.error is None
    assert garbage.body.startswith(full[: ends[5]])
    broken = events(garbage.body)[6]
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken.data)

    bad = fetch(server, provider)
    assert bad.body.startswith(full[: ends[5]])
    with pytest.raises(UnicodeDecodeError):
        bad.body[ends[5] :].decode()
    assert [e.billed_output_tokens for e in server.log[-2:]] == [delivered_text(full[: ends[5]])[1]] * 2


def test_stall_headers_sends_nothing_then_answers(server: FakeProviderServer) -> None:
    full = fetch(server).body
    server.set_faults("default", ["stall_headers:seconds=0.4", "stall_headers:seconds=0.2"])
    with pytest.raises(httpx.ReadTimeout):
        fetch(server, timeout=httpx.Timeout(5, read=0.15))  # not even the status line came
    started = time.monotonic()
    assert fetch(server).body == full
    assert time.monotonic() - started >= 0.2
    deadline = time.monotonic() + 5
    while len(server.log) < 3 and time.monotonic() < deadline:  # the abandoned request ends too
        time.sleep(0.05)
    assert [e.fault["kind"] if e.fault else None for e in server.log] == [None, "stall_headers", "stall_headers"]


def test_a_client_that_hangs_up_after_the_headers_is_in_the_log_at_once(server: FakeProviderServer) -> None:
    """The real provider has seen (and may bill) a request whose client left at the headers; the
    fake's log holds it from then on, not only once the fake is done with it."""
    server.set_faults("default", ["stall:events=0,seconds=0.6"])  # the body waits: the hang-up comes first
    url = server.base_url + PATHS["anthropic"]
    with HTTP.stream("POST", url, json=request_body("anthropic"), headers=HEADERS["anthropic"]) as response:
        assert response.status_code == 200
    # hung up before any body byte, while the fake still waits to write one
    (entry,) = server.log
    assert (entry.status, entry.bytes_sent, entry.billed_output_tokens, entry.finished) == (200, 0, 0, False)
    deadline = time.monotonic() + 5
    while not server.log[0].finished and time.monotonic() < deadline:
        time.sleep(0.02)
    (entry,) = server.log  # the same entry, now final
    assert (entry.finished, entry.fault_triggered, entry.completed) == (True, True, False)
    assert (entry.status, entry.bytes_sent, entry.billed_output_tokens) == (200, 0, 0)


def test_goaway_over_http1_is_a_plain_cut(server: FakeProviderServer) -> None:
    full = fetch(server).body
    server.set_faults("default", ["goaway:events=5"])
    received = fetch(server)
    assert isinstance(received.error, httpx.RemoteProtocolError)
    assert received.body == full[: event_boundaries(full)[4]]
    assert server.log[-1].fault_triggered
    assert not server.log[-1].completed


def test_drop_closes_before_any_response(server: FakeProviderServer) -> None:
    server.set_faults("default", ["drop"])
    with pytest.raises(httpx.RemoteProtocolError, match="Server disconnected without sending a response"):
        fetch(server)
    entry = server.log[-1]
    assert (entry.status, entry.fault, entry.bytes_sent) == (0, {"kind": "drop"}, 0)


# -- scripts and scenarios --------------------------------------------------------------------


def test_scripts_are_consumed_in_order_per_scenario(server: FakeProviderServer) -> None:
    server.set_faults("a", ["status:500", "ok", Fault("cut", byte_offset=10)])
    server.set_faults("b", [{"kind": "status", "code": 429}])
    outcomes = [
        (scenario, fetch(server, scenario=scenario))
        for scenario in ("a", "b", "a", None, "b", "a", "a")  # None: no header, the "default" scenario
    ]
    assert [(s, r.status, type(r.error).__name__) for s, r in outcomes] == [
        ("a", 500, "NoneType"),
        ("b", 429, "NoneType"),
        ("a", 200, "NoneType"),
        (None, 200, "NoneType"),
        ("b", 200, "NoneType"),
        ("a", 200, "RemoteProtocolError"),
        ("a", 200, "NoneType"),
    ]
    assert [e.scenario for e in server.log] == ["a", "b", "a", "default", "b", "a", "a"]
    assert [e.fault["kind"] if e.fault else None for e in server.log_for("a")] == ["status", "ok", "cut", None]
    assert server.pending_faults("a") == []


def test_faults_set_over_http_with_the_compact_form(server: FakeProviderServer) -> None:
    answer = HTTP.post(
        server.base_url + "/_fake/faults", json={"scenario": "demo", "faults": "status:503;eof:events=4"}
    )
    assert answer.json()["faults"] == [{"kind": "status", "code": 503}, {"kind": "eof", "events": 4}]
    assert fetch(server, scenario="demo").status == 503
    assert len(events(fetch(server, scenario="demo").body)) == 4
    assert fetch(server, scenario="demo").body.rstrip(b" }\n").endswith(b'"message_stop"')


# -- the invariant the product is tested against ---------------------------------------------------


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_interrupted_then_continued_bills_each_token_once(server: FakeProviderServer, provider: str) -> None:
    full = fetch(server, provider).body
    full_text, full_deltas = delivered_text(full)
    for offset in (len(full) // 4, len(full) // 2 + 1, len(full) - 300):
        server.set_faults("default", [Fault("cut", byte_offset=offset)])
        first = fetch(server, provider)
        prefix, _ = delivered_text(first.body)
        assert prefix
        messages = [
            {"role": "user", "content": PROMPT},
            {"role": "assistant", "content": prefix},
            {"role": "user", "content": CONTINUE_INSTRUCTION},
        ]
        second = fetch(server, provider, messages=messages)
        assert prefix + delivered_text(second.body)[0] == full_text
        cut, continued = server.log[-2:]
        assert cut.billed_text + continued.billed_text == full_text
        assert cut.billed_output_tokens + continued.billed_output_tokens == full_deltas
        assert (continued.understood_as, continued.prefix_matched) == ("continue_message", True)
