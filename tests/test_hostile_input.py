"""Hostile and broken provider input, end to end against the fake provider: every kind gets a
clear, classified error or is handled, nothing raises out of the engine, nothing committed is
lost. (Cut, stalled, truncated-JSON and bad-UTF-8 streams are in test_engine_recovery.)"""

from __future__ import annotations

import time

import pytest

from streamrecover.engine.errors import BodyDecodeError, SSEError
from streamrecover.engine.retry import backoff_delay, parse_retry_after
from streamrecover.engine.sse import SSEDecoder
from streamrecover.testing.tools import demo_registry

from .harness import assert_invariants, run, user, with_config

STORY = "Tell me a story about the sea [[words=120]]"
WEATHER = "What is the weather in Paris? [[tool=get_weather]]"
WIRES = [("anthropic", "claude-3-7-sonnet"), ("openai", "gpt-4o")]


def _history() -> list[dict[str, object]]:
    """A thread with a committed exchange before the turn the hostile input hits."""
    return [
        user("Hello [[words=5]]"),
        {"role": "assistant", "content": [{"type": "text", "text": "Hello there, how are you?"}]},
        user(STORY),
    ]


@pytest.mark.parametrize(("wire", "model"), WIRES)
@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("html", "text/html"),
        ("html:content_type=text/plain", "<!DOCTYPE html>"),
        ("html:content_type=text/event-stream", "not an event stream"),
        ("mislabel", "application/json"),
        ("mislabel:content_type=text/plain", "text/plain"),
    ],
)
async def test_a_page_that_is_not_an_event_stream_fails_clearly_and_keeps_the_thread(
    fake_server, wire, model, fault, message
):
    history = _history()
    out = await run(fake_server, wire=wire, model=model, messages=[dict(m) for m in history], faults=[fault])
    assert out.status == "failed"
    assert out.result.error is not None
    assert out.result.error["kind"] == "bad_content_type"
    assert message in out.result.error["message"]
    # permanent: one request, not retried (the fake logs a request when it accepts it, so the
    # client hanging up at the headers leaves it there too)
    assert len(out.sink.attempts) == 1
    assert len(out.log) == 1
    assert out.result.messages == history  # what was committed before is all there, unchanged


@pytest.mark.parametrize(("wire", "model"), WIRES)
async def test_an_html_page_on_a_continuation_keeps_what_the_turn_had(fake_server, wire, model):
    """The first response breaks, its continuation gets a proxy's HTML page: the run fails
    with a clear error; the client was shown the partial answer and told the run failed."""
    out = await run(fake_server, STORY, wire=wire, model=model, faults=["cut:bytes=1200", "html"])
    assert out.status == "failed"
    assert out.result.error is not None
    assert out.result.error["kind"] == "bad_content_type"
    assert [a.outcome for a in out.sink.attempts] == ["interrupted", "request_failed"]


@pytest.mark.parametrize(("wire", "model"), WIRES)
async def test_an_unknown_event_type_is_ignored(fake_server, wire, model):
    reference = await run(fake_server, STORY, wire=wire, model=model)
    out = await run(fake_server, STORY, wire=wire, model=model, faults=["unknown:events=4"])
    assert_invariants(out, reference)
    assert out.assistant == reference.assistant
    assert out.events("llm_stream_interrupted") == []
    assert out.log[0].fault_triggered


@pytest.mark.parametrize(("wire", "model"), WIRES)
async def test_an_oversized_line_is_a_classified_break_and_recovered(fake_server, wire, model):
    reference = await run(fake_server, STORY, wire=wire, model=model)
    config = with_config(max_line_bytes=4096)
    out = await run(fake_server, STORY, wire=wire, model=model, faults=["long_line:events=8,size=50000"], config=config)
    assert_invariants(out, reference)
    assert out.assistant == reference.assistant
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["cause"] == "sse_parse"
    assert "exceeds 4096" in (out.sink.attempts[0].error_message or "")


def test_an_event_of_many_short_data_lines_is_bounded_like_a_line() -> None:
    decoder = SSEDecoder(max_line_bytes=1000)
    for _ in range(62):  # 992 characters, never a blank line: one event that never ends
        decoder.feed(b"data: xxxxxxxxxx\n")
    with pytest.raises(SSEError, match="event exceeds 1000"):
        decoder.feed(b"data: xxxxxxxxxx\n")
    # an event just under the bound is fine, and the count starts over at each event
    decoder = SSEDecoder(max_line_bytes=1000)
    for _ in range(20):
        assert len(decoder.feed(b"data: 0123456789\n" * 50 + b"\n")) == 1


@pytest.mark.parametrize("body", [b"\xff\xfe\x00garbage\n\n", b"data: \xc3\x28\n\n", b"\x80" * 64 + b"\n"])
def test_a_body_that_is_not_utf8_raises_body_decode_error(body: bytes) -> None:
    with pytest.raises(BodyDecodeError, match="not valid UTF-8"):
        SSEDecoder().feed(body)


@pytest.mark.parametrize(("wire", "model"), WIRES)
async def test_a_stream_of_keepalives_that_never_ends_is_cut_by_the_stream_deadline(fake_server, wire, model):
    reference = await run(fake_server, STORY, wire=wire, model=model)
    config = with_config(max_stream_seconds=0.6, idle_timeout_s=5.0)
    started = time.monotonic()
    out = await run(fake_server, STORY, wire=wire, model=model, faults=["endless:events=6,seconds=0.05"], config=config)
    assert time.monotonic() - started < 5  # not the idle timeout: bytes kept coming
    assert_invariants(out, reference)
    assert out.assistant == reference.assistant
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["cause"] == "stream_deadline"
    assert "0.6" in (out.sink.attempts[0].error_message or "")


@pytest.mark.parametrize(("wire", "model"), WIRES)
async def test_a_stream_that_writes_past_max_tokens_is_stopped_at_the_budget(fake_server, wire, model):
    """A runaway provider keeps streaming text past the request's ``max_tokens``: the turn
    ends at its budget with ``max_tokens``, as a well-behaved provider would have ended it."""
    config = with_config(max_stream_seconds=30.0)
    started = time.monotonic()
    out = await run(
        fake_server,
        STORY,
        wire=wire,
        model=model,
        max_tokens=60,
        faults=["endless:events=6,seconds=0.001,text"],
        config=config,
    )
    assert time.monotonic() - started < 10
    assert out.status == "completed", out.result.error
    ((reconstructed, committed),) = out.view.turns
    assert reconstructed == committed
    (interrupted,) = out.events("llm_stream_interrupted")
    assert interrupted["cause"] == "max_tokens_exceeded"
    assert interrupted["turn_output_tokens"] >= 60
    text = "".join(block.get("text", "") for block in out.assistant[0]["content"])
    assert text.count("la ") <= 60  # never more deltas (tokens at least) than the budget
    # the stream was cut at the budget; a continuation (where the provider's own count says
    # budget is left) asks only for what is left, and the runaway does not happen again
    sent = [
        a.request["json"].get("max_tokens") or a.request["json"].get("max_completion_tokens") for a in out.sink.attempts
    ]
    assert sent[0] == 60
    assert all(later < 60 for later in sent[1:])
    assert len(out.log) <= 2


@pytest.mark.parametrize(("wire", "model"), WIRES)
async def test_a_tool_call_with_an_empty_name_is_never_run_or_committed(fake_server, wire, model):
    tools = demo_registry()
    history = [user("Hello [[words=5]]"), {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]}]
    messages = [*history, user(WEATHER)]
    out = await run(fake_server, wire=wire, model=model, tools=tools, messages=messages, faults=["noname"] * 6)
    assert out.status in ("exhausted", "failed")
    assert tools.calls == []
    assert out.result.messages[: len(messages)] == messages
    for message in out.result.messages:
        for block in message["content"] if isinstance(message["content"], list) else []:
            assert not (block.get("type") == "tool_use" and not block.get("name"))
    causes = {a.interrupt_cause for a in out.sink.attempts if a.interrupt_cause}
    assert causes == {"sse_parse"}
    assert "empty name" in (out.sink.attempts[0].error_message or "")


@pytest.mark.parametrize(("wire", "model"), WIRES)
async def test_an_empty_name_once_is_recovered_by_the_continuation(fake_server, wire, model):
    tools = demo_registry()
    reference = await run(fake_server, WEATHER, wire=wire, model=model, tools=demo_registry())
    out = await run(fake_server, WEATHER, wire=wire, model=model, tools=tools, faults=["noname"])
    assert out.status == "completed", out.result.error
    for reconstructed, committed in out.view.turns:
        assert reconstructed == committed
    assert [name for name, _ in tools.calls] == [name for name, _ in reference_calls(reference)]


def reference_calls(reference) -> list[tuple[str, object]]:
    return [
        (block["name"], block["input"])
        for message in reference.assistant
        for block in message["content"]
        if block["type"] == "tool_use"
    ]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "-5"}, None),
        ({"retry-after": "0"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "banana"}, None),
        ({"retry-after-ms": "-1000"}, None),
        ({"retry-after-ms": "-1000", "retry-after": "2"}, 2.0),
        ({"retry-after": "Mon, 01 Jan 1990 00:00:00 GMT"}, None),  # in the past
    ],
)
def test_negative_or_nonsense_retry_after_is_ignored(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


@pytest.mark.parametrize("raw", ["1e308", "inf", "99999999999", "Fri, 31 Dec 9999 23:59:59 GMT"])
def test_absurd_retry_after_is_clamped(raw: str) -> None:
    parsed = parse_retry_after({"retry-after": raw})
    assert parsed is not None
    assert backoff_delay(1, (1.0,), retry_after_s=parsed, max_retry_after_s=60.0) == 60.0


@pytest.mark.parametrize("fault", ["status:429,retry_after=1e9", "status:529,retry_after=-30"])
async def test_absurd_or_negative_retry_after_does_not_stall_a_run(fake_server, fault):
    config = with_config(max_retry_after_s=0.2)
    started = time.monotonic()
    out = await run(fake_server, STORY, faults=[fault], config=config)
    assert time.monotonic() - started < 5
    assert out.status == "completed"
    (retry,) = out.events("llm_request_retry")
    assert 0 <= retry["delay_s"] <= 0.2
