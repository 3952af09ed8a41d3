"""RecorderSink and redaction: events become rows and log lines with the same fields,
attempts and messages are upserted, and a configured API key reaches none of them."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import pytest
import structlog
from asgiref.sync import sync_to_async
from django.test import override_settings
from structlog.testing import capture_logs

from streamrecover.engine.events import Usage
from streamrecover.engine.sink import (
    LLM_STREAM_CONTINUATION_COMPLETED,
    LLM_STREAM_INTERRUPTED,
    AttemptRecord,
    StructuredEvent,
)
from streamrecover.models import Attempt, Message, RecoveryEvent, Run
from streamrecover.redaction import REDACTED, cut_secrets, json_holds_secret, redact, redact_processor
from streamrecover.runs.recorder import RecorderSink

from .factories import make_run

SECRET = "sk-ant-api03-test-NOT-A-REAL-KEY-0123456789"
PROVIDERS = {"anthropic": {"ADAPTER": "anthropic", "BASE_URL": "https://api.anthropic.com", "API_KEY": SECRET}}


def interrupted(run: Run, **extra: Any) -> StructuredEvent:
    fields = {
        "provider": "fake",
        "model": "fake-model",
        "run_id": str(run.pk),
        "turn_id": 0,
        "attempt": 1,
        "continuation_attempt": 0,
        "error_kind": "sse_transport",
        "error_message": "connection reset by peer",
        "committed_text_blocks": 1,
        "committed_partial_text": True,
        "discarded_partial_tool_uses": 0,
        "discarded_thinking_blocks": 0,
        "usage_flushed": False,
        "plan": "continue_text",
        **extra,
    }
    return StructuredEvent(LLM_STREAM_INTERRUPTED, fields)


def attempt_record(run: Run, **extra: Any) -> AttemptRecord:
    fields: dict[str, Any] = {
        "run_id": str(run.pk),
        "turn": 0,
        "index": 0,
        "kind": "initial",
        "continuation": 0,
        "strategy": None,
        "request": {"method": "POST", "url": "fake://x", "headers": {}, "json": {"max_tokens": 1024}},
        "started_at": time.time(),
    }
    fields.update(extra)
    return AttemptRecord(**fields)


async def new_sink() -> tuple[Run, RecorderSink]:
    run = await sync_to_async(make_run)()
    return run, RecorderSink.for_run(run)


@pytest.mark.django_db(transaction=True)
async def test_event_becomes_a_row_and_a_log_line_with_the_same_fields() -> None:
    run, sink = await new_sink()
    event = interrupted(run)
    with capture_logs() as logs:
        await sink.on_event(event)
        await sink.on_event(StructuredEvent(LLM_STREAM_CONTINUATION_COMPLETED, {**event.fields, "attempt": 2}))
    rows = await sync_to_async(list)(RecoveryEvent.objects.filter(run=run).order_by("id"))
    assert [r.name for r in rows] == [LLM_STREAM_INTERRUPTED, LLM_STREAM_CONTINUATION_COMPLETED]
    assert [line["event"] for line in logs] == [LLM_STREAM_INTERRUPTED, LLM_STREAM_CONTINUATION_COMPLETED]
    first, line = rows[0], logs[0]
    assert first.payload == event.fields
    assert {k: v for k, v in line.items() if k not in ("event", "log_level")} == first.payload
    assert line["log_level"] == "warning"
    assert logs[1]["log_level"] == "info"
    assert (first.attempt, first.turn, first.provider, first.model) == (1, 0, "fake", "fake-model")
    assert rows[1].attempt == 2


@pytest.mark.django_db(transaction=True)
async def test_attempt_is_upserted_and_run_totals_follow() -> None:
    run, sink = await new_sink()
    record = attempt_record(run)
    await sink.on_attempt(record)
    record.status_code = 200
    record.request_id = "req_123"
    record.first_byte_at = record.started_at + 0.2
    record.ended_at = record.started_at + 1.5
    record.usage = Usage(input_tokens=100, output_tokens=40, cache_read_input_tokens=7)
    record.bytes_received = 2048
    record.interrupt_cause = "connection_reset"
    record.error_kind = "sse_transport"
    record.outcome = "interrupted"
    await sink.on_attempt(record)
    await sink.on_attempt(record)  # repeated: still one row
    cont = attempt_record(
        run, index=1, kind="continuation", continuation=1, strategy="prefill", ended_at=time.time(), outcome="completed"
    )
    cont.usage = Usage(input_tokens=140, output_tokens=60)
    await sink.on_attempt(cont)

    rows = await sync_to_async(list)(Attempt.objects.filter(run=run).order_by("index"))
    assert len(rows) == 2
    first = rows[0]
    assert (first.status_code, first.provider_request_id, first.outcome) == (200, "req_123", "interrupted")
    assert (first.input_tokens, first.output_tokens, first.cache_read_input_tokens) == (100, 40, 7)
    assert first.cache_creation_input_tokens is None
    assert first.bytes_received == 2048
    assert first.interrupt_cause == "connection_reset"
    assert first.first_byte_at is not None
    assert first.ended_at is not None
    assert rows[1].strategy == "prefill"
    await sync_to_async(run.refresh_from_db)()
    assert (run.input_tokens, run.output_tokens, run.attempt_count, run.continuation_count) == (240, 100, 2, 1)


@pytest.mark.django_db(transaction=True)
async def test_messages_are_written_once() -> None:
    run, sink = await new_sink()
    message = {"role": "assistant", "content": [{"type": "text", "text": "Hello world"}]}
    await sink.on_message({"role": "user", "content": [{"type": "text", "text": "Hi"}]}, 0)
    await sink.on_message(message, 1)
    await sink.on_message(message, 1)  # a retried write
    with capture_logs() as logs:
        await sink.on_message({"role": "assistant", "content": [{"type": "text", "text": "other"}]}, 1)
    rows = await sync_to_async(list)(Message.objects.filter(thread_id=run.thread_id).order_by("position"))
    assert [(m.position, m.role) for m in rows] == [(0, "user"), (1, "assistant")]
    assert rows[1].content == message["content"]  # never rewritten behind the user's back
    assert rows[1].run_id == run.pk
    assert [line["event"] for line in logs] == ["message_position_conflict"]


@pytest.mark.django_db(transaction=True)
async def test_on_frame_writes_nothing() -> None:
    run, sink = await new_sink()
    await sink.on_frame({"type": "text_delta", "seq": 1, "run_id": str(run.pk), "text": "x"})
    assert await RecoveryEvent.objects.filter(run=run).acount() == 0


@pytest.mark.django_db(transaction=True)
async def test_a_configured_api_key_reaches_no_log_line_row_or_stored_request() -> None:
    run, sink = await new_sink()
    headers = {"x-api-key": SECRET, "Authorization": f"Bearer {SECRET}", "anthropic-version": "2023-06-01"}
    with override_settings(STREAMRECOVER={"PROVIDERS": PROVIDERS}), capture_logs() as logs:
        await sink.on_event(
            interrupted(
                run,
                error_message=f"401 from upstream: invalid x-api-key {SECRET}",
                request_headers=headers,
                detail={"nested": [f"key={SECRET}"], "api_key": SECRET},
            )
        )
        record = attempt_record(
            run,
            request={
                "method": "POST",
                "url": "https://api.anthropic.com/v1/messages",
                "headers": headers,
                "json": {"model": "m", "max_tokens": 1024, "metadata": {"note": SECRET}},
            },
            error_message=f"upstream said: bad key {SECRET}",
            ended_at=time.time(),
        )
        await sink.on_attempt(record)
        await sink.on_message({"role": "assistant", "content": [{"type": "text", "text": f"It is {SECRET}"}]}, 0)

    event = await RecoveryEvent.objects.aget(run=run)
    attempt = await Attempt.objects.aget(run=run)
    message = await Message.objects.aget(thread_id=run.thread_id)
    stored = [
        json.dumps(event.payload),
        json.dumps(attempt.request),
        attempt.error_message,
        json.dumps(message.content),
    ]
    assert logs
    for text in [*stored, *(json.dumps(line) for line in logs)]:
        assert SECRET not in text
    assert event.payload["request_headers"]["x-api-key"] == REDACTED
    assert event.payload["request_headers"]["anthropic-version"] == "2023-06-01"
    assert attempt.request["headers"]["Authorization"] == REDACTED
    assert attempt.request["json"]["max_tokens"] == 1024
    assert REDACTED in attempt.error_message


def test_redact_by_key_by_value_and_keeps_ordinary_fields() -> None:
    data = {
        "x-api-key": SECRET,
        "Authorization": "Bearer abc",
        "client_secret": "s3cr3t",
        "password": "pw",
        "access_token": "tok",
        "max_tokens": 1024,
        "input_tokens": 5,
        "usage_flushed": True,
        "tools": [{"name": "login", "input_schema": {"properties": {"password": {"type": "string"}}}}],
        "message": f"bad key {SECRET} and Bearer abcdefghijklmnopqrstuvwxyz",
    }
    out = redact(data, secrets=[SECRET])
    assert out["x-api-key"] == out["Authorization"] == out["client_secret"] == out["password"] == REDACTED
    assert out["access_token"] == REDACTED
    assert out["max_tokens"] == 1024
    assert out["input_tokens"] == 5
    assert out["usage_flushed"] is True
    assert out["tools"][0]["input_schema"]["properties"]["password"] == {"type": "string"}
    assert SECRET not in out["message"]
    assert "abcdefghijklmnop" not in out["message"]
    assert redact({"password": "pw", "t": SECRET}, by_key=False, secrets=[SECRET]) == {"password": "pw", "t": REDACTED}
    assert data["password"] == "pw"  # a copy, not in place


def test_redact_processor_scrubs_a_rendered_log_line() -> None:
    stream = io.StringIO()
    logger = structlog.wrap_logger(
        structlog.PrintLogger(stream),
        processors=[redact_processor, structlog.processors.JSONRenderer()],
    )
    with override_settings(STREAMRECOVER={"PROVIDERS": PROVIDERS}):
        logger.info("upstream_failed", error=f"401 invalid key {SECRET}", headers={"x-api-key": SECRET})
    line = stream.getvalue()
    assert SECRET not in line
    assert json.loads(line)["headers"]["x-api-key"] == REDACTED


def test_a_key_is_cut_in_every_form_an_error_message_quotes_it_in() -> None:
    """An HTTP client refusing a header quotes the value's bytes ``repr``: a key with a newline
    shows as ``...\\n``, a non-ASCII one as ``\\xc3\\xa9``, in JSON as ``\\u00e9``. Each form
    is cut whole, escapes included, wherever configured keys are cut."""
    for secret in (SECRET + "\n", "clé-0123456789abcdef"):
        for quoted in (repr(secret), repr(secret.encode()), json.dumps(secret), json.dumps(secret, ensure_ascii=False)):
            inner = quoted[quoted.index(quoted[-1]) + 1 : -1]  # between the quotes (after a bytes "b")
            text = f"LocalProtocolError: Illegal header value {quoted}"
            expected = text.replace(inner, REDACTED)
            assert redact(text, secrets=[secret]) == expected
            assert cut_secrets({"m": text}, secrets=[secret]) == {"m": expected}
            assert json_holds_secret(json.dumps({"m": text}), [secret])  # the checkpoint's cue to cut


def test_a_google_key_is_cut_by_its_shape_in_the_apps_text_only() -> None:
    """``AIza`` keys are Google's: cut out of what the app writes even when not configured
    (another process's key), never out of what a user or the model wrote."""
    key = "AIzaSyD-not-configured-0123456789abcdef"
    assert redact(f"GET /v1beta/models/m:streamGenerateContent?key={key} 400", secrets=[]) == (
        f"GET /v1beta/models/m:streamGenerateContent?key={REDACTED} 400"
    )
    assert cut_secrets({"text": f"my key is {key}"}, secrets=[]) == {"text": f"my key is {key}"}


def test_redaction_uses_environment_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "env-key-0123456789abcdef")
    assert redact("leaked env-key-0123456789abcdef here") == f"leaked {REDACTED} here"
