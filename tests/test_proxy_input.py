"""Malformed and hostile request bodies at the healing endpoint: each is refused in its provider's own
error shape (a 400 naming the field at fault, a 413 for a body over ``PROXY_MAX_BODY_BYTES``), never a
500, and nothing is stored for it; what the database can hold is served and stored exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpResponse
from django.test import Client, override_settings

from streamrecover.models import Message, Run, Thread
from streamrecover.proxy.keys import issue_key
from streamrecover.testing.host import wait_for

from .proxy_helpers import proxy_settings

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = "/streamrecover/proxy/v1/messages"
CHAT = "/streamrecover/proxy/v1/chat/completions"
RESPONSES = "/streamrecover/proxy/v1/responses"
HELLO = [{"role": "user", "content": "Hello [[words=5]]"}]


@pytest.fixture(autouse=True)
def _fake_upstream() -> Iterator[None]:
    """Every format served by the built-in fake."""
    fake = {"ADAPTER": "anthropic", "BASE_URL": "fake://streamrecover", "API_KEY": "sk-provider-4c1d9e"}
    configured = proxy_settings(settings.STREAMRECOVER, PROVIDERS={"fake": fake}, PROXY_RESPONSES_PROVIDER="fake")
    with override_settings(STREAMRECOVER=configured):
        yield


@pytest.fixture
def key(django_user_model: Any) -> str:
    return issue_key(django_user_model.objects.create_user("proxy-input", password="x"))[1]


def post(key: str, path: str, body: bytes) -> HttpResponse:
    """``body`` as sent, with the key both ways the SDKs send it."""
    headers = {"x-api-key": key, "authorization": f"Bearer {key}"}
    response: HttpResponse = Client().post(path, data=body, content_type="application/json", headers=headers)
    return response


def error_of(path: str, response: HttpResponse) -> dict[str, Any]:
    """The error object of a provider-shaped error body (Anthropic's for v1/messages, OpenAI's else)."""
    assert response["content-type"] == "application/json"
    body = response.json()
    if path == MESSAGES:
        assert set(body) == {"type", "error"}
        assert body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}
    else:
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    return error


def anthropic(messages: list[Any], **fields: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 50, "stream": True, "messages": messages, **fields}


def chat(messages: list[Any], **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "stream": True, "messages": [*messages], **fields}


def responses(items: Any, **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "stream": True, "input": items, **fields}


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
ASKED = {"role": "user", "content": "Weather?"}

MALFORMED = {
    "block-a-string": (MESSAGES, anthropic([{"role": "user", "content": ["hi"]}]), "messages[0].content[0]"),
    "block-without-type": (MESSAGES, anthropic([{"role": "user", "content": [{"text": "hi"}]}]), "content[0].type"),
    "text-a-number": (
        MESSAGES,
        anthropic([{"role": "user", "content": [{"type": "text", "text": 5}]}]),
        "messages[0].content[0].text",
    ),
    "tool-use-input-a-list": (
        MESSAGES,
        anthropic(
            [ASKED, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}]}]
        ),
        "messages[1].content[0].input",
    ),
    "tool-result-without-id": (
        MESSAGES,
        anthropic([{"role": "user", "content": [{"type": "tool_result", "content": "r"}]}]),
        "messages[0].content[0].tool_use_id",
    ),
    "tool-result-content-a-number": (
        MESSAGES,
        anthropic([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}]),
        "messages[0].content[0].content",
    ),
    "message-a-string": (MESSAGES, anthropic(["hi"]), "messages[0]"),
    "system-block-text-a-number": (
        MESSAGES,
        anthropic(HELLO, system=[{"type": "text", "text": 1}]),
        "system[0].text",
    ),
    "system-a-number": (MESSAGES, anthropic(HELLO, system=5), "system"),
    "chat-tool-calls-a-string": (CHAT, chat([ASKED, {"role": "assistant", "tool_calls": "abc"}]), "tool_calls"),
    "chat-arguments-an-object": (
        CHAT,
        chat([ASKED, {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}]}]),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "chat-arguments-not-an-object": (
        CHAT,
        chat([ASKED, {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1]"}}]}]),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "chat-call-without-function": (
        CHAT,
        chat([ASKED, {"role": "assistant", "tool_calls": [{"id": "c"}]}]),
        "messages[1].tool_calls[0].function",
    ),
    "chat-tool-without-call-id": (
        CHAT,
        chat([ASKED, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "sunny"}]),
        "messages[2].tool_call_id",
    ),
    "chat-system-part-text-a-number": (
        CHAT,
        chat([{"role": "system", "content": [{"type": "text", "text": 1}]}, ASKED]),
        "messages[0].content[0].text",
    ),
    "chat-user-part-a-string": (CHAT, chat([{"role": "user", "content": ["hi"]}]), "messages[0].content[0]"),
    "responses-arguments-an-object": (
        RESPONSES,
        responses([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]),
        "input[0].arguments",
    ),
    "responses-system-part-a-string": (
        RESPONSES,
        responses([{"role": "system", "content": ["x"]}, {"role": "user", "content": "hi"}]),
        "input[0].content[0]",
    ),
    "anthropic-stream-a-string": (MESSAGES, anthropic([ASKED], stream="false"), "stream"),
    "chat-stream-a-string": (CHAT, chat([ASKED], stream="false"), "stream"),
    "responses-stream-a-string": (RESPONSES, responses("hi", stream="false"), "stream"),
    "responses-output-without-call-id": (
        RESPONSES,
        responses([{"type": "function_call_output", "output": "r"}]),
        "input[0].call_id",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_body_is_a_400_naming_the_field_and_stores_nothing(key: str, case: str) -> None:
    path, body, field = MALFORMED[case]
    response = post(key, path, json.dumps(body).encode())
    assert response.status_code == 400, response.content[:300]
    error = error_of(path, response)
    assert error["type"] == "invalid_request_error"
    assert field in error["message"]
    assert not Run.objects.exists()
    assert not Thread.objects.exists()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


RAW = {
    # too deep for the JSON decoder (RecursionError), too deep for the rest once decoded
    "nested-too-deep-to-decode": (MESSAGES, b"[" * 200_000, "invalid JSON"),
    "nested-too-deep-to-store": (
        CHAT,
        b'{"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}], "metadata": '
        + nested(101).encode()
        + b"}",
        "nested deeper than 100 levels",
    ),
    "nested-arguments": (
        CHAT,
        json.dumps(
            chat(
                [
                    ASKED,
                    {
                        "role": "assistant",
                        "tool_calls": [{**CALL, "function": {"name": "f", "arguments": nested(200)}}],
                    },
                ]
            )
        ).encode(),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "nan": (MESSAGES, b'{"model": "claude-x", "max_tokens": 5, "temperature": NaN, "messages": []}', "invalid JSON"),
    # a lone surrogate escape has no UTF-8 form: it could be neither stored nor sent on
    "surrogate-in-the-users-text": (
        MESSAGES,
        b'{"model": "m", "max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "a\\ud800b"}]}',
        "messages[0].content: not valid Unicode",
    ),
    "surrogate-in-an-assistant-message": (
        CHAT,
        b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"},'
        b' {"role": "assistant", "content": "a\\udc00"}, {"role": "user", "content": "go"}]}',
        "messages[1].content: not valid Unicode",
    ),
    "surrogate-in-a-key": (
        RESPONSES,
        b'{"model": "m", "stream": true, "input": "hi", "metadata": {"\\ud83d": "x"}}',
        "metadata: a key is not valid Unicode",
    ),
    "surrogate-in-a-non-streamed-request": (
        MESSAGES,
        b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "\\ud83d"}]}',
        "not valid Unicode",
    ),
    "surrogate-in-tool-arguments": (
        RESPONSES,
        json.dumps(
            responses([{"type": "function_call", "call_id": "c", "name": "f", "arguments": '{"a": "\\ud800"}'}])
        ).encode(),
        "input[0].arguments.a: not valid Unicode",
    ),
}


@pytest.mark.parametrize("case", list(RAW))
def test_json_that_cannot_be_sent_or_stored_is_a_400_and_stores_nothing(key: str, case: str) -> None:
    path, raw, message = RAW[case]
    response = post(key, path, raw)
    assert response.status_code == 400, response.content[:300]
    assert message in error_of(path, response)["message"]
    assert not Run.objects.exists()
    assert not Thread.objects.exists()


UNSTORABLE = {
    "model-too-long": (MESSAGES, anthropic(HELLO, model="m" * 201), "model: longer than 200 characters"),
    "model-with-nul": (CHAT, chat(HELLO, model="gpt\x00"), "model: cannot contain NUL"),
    "system-with-nul": (MESSAGES, anthropic(HELLO, system="Be\x00brief"), "system: cannot contain NUL"),
    "system-blocks-with-nul": (
        MESSAGES,
        anthropic(HELLO, system=[{"type": "text", "text": "Be\x00brief"}]),
        "system: cannot contain NUL",
    ),
    "chat-system-message-with-nul": (
        CHAT,
        chat([{"role": "system", "content": "Be\x00brief"}, *HELLO]),
        "messages[0].content: cannot contain NUL",
    ),
    "instructions-with-nul": (
        RESPONSES,
        responses("Hi", instructions="Be\x00brief"),
        "instructions: cannot contain NUL",
    ),
    "passed-on-field-with-nul": (
        MESSAGES,
        anthropic(HELLO, metadata={"user_id": "u\x00"}),
        "metadata.user_id: cannot contain NUL",
    ),
    "passed-on-key-with-nul": (CHAT, chat(HELLO, metadata={"k\x00": "v"}), "cannot contain NUL"),
}


@pytest.mark.parametrize("case", list(UNSTORABLE))
def test_what_the_runs_columns_cannot_hold_is_a_400_naming_the_field(key: str, case: str) -> None:
    path, body, message = UNSTORABLE[case]
    response = post(key, path, json.dumps(body).encode())
    assert response.status_code == 400, response.content[:300]
    assert message in error_of(path, response)["message"]
    assert not Run.objects.exists()
    assert not Thread.objects.exists()


def served_run(response: HttpResponse) -> str:
    """The run of a streamed answer, once it has ended (the stream itself is left unread)."""
    assert response.status_code == 200, response.content[:300]
    run_id = response["X-Streamrecover-Run"]
    report = wait_for(run_id)
    assert report.status == "completed", report.error
    return run_id


def test_nul_in_the_conversation_is_served_and_stored_exactly(key: str) -> None:
    """The messages store any string (as they store a model's output with NUL, which a client
    sends back): only the thread's title, a plain column, goes without it."""
    text = "Hello\x00there [[words=5]]"
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "bytes: \x00\x01"}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [result, {"type": "text", "text": text}]},
    ]
    run_id = served_run(post(key, MESSAGES, json.dumps(anthropic(messages)).encode()))
    stored = [m.content for m in Message.objects.filter(run_id=run_id, role="user").order_by("position")]
    assert stored[-1] == [result, {"type": "text", "text": text}]
    assert Thread.objects.get().title == "Hellothere [[words=5]]"


def schema(depth: int) -> dict[str, Any]:
    """A tool's input schema nested to ``depth`` levels of JSON."""
    inner: dict[str, Any] = {"type": "string"}
    for _ in range(depth // 2):
        inner = {"type": "object", "properties": {"a": inner}}
    return inner


def test_nesting_is_refused_past_100_levels_and_served_to_them(key: str) -> None:
    """Far beyond any tool schema, yet within what redaction and storage walk: 100 levels reach
    the provider and the run's options whole, 102 are refused."""
    deep = {"name": "get_weather", "description": "The weather.", "input_schema": schema(98)}
    response = post(key, MESSAGES, json.dumps(anthropic(HELLO, tools=[deep])).encode())
    assert response.status_code == 400
    assert "tools[0].input_schema" in error_of(MESSAGES, response)["message"]
    assert not Run.objects.exists()
    tool = {**deep, "input_schema": schema(96)}
    run_id = served_run(post(key, MESSAGES, json.dumps(anthropic(HELLO, tools=[tool])).encode()))
    assert Run.objects.get(pk=run_id).options["proxy"]["extra"]["tools"] == [tool]


def test_a_body_over_the_endpoints_limit_is_a_413_in_each_format(key: str) -> None:
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "PROXY_MAX_BODY_BYTES": 4096}):
        padding = "x" * 5000
        anthropic_413 = post(key, MESSAGES, json.dumps(anthropic([{"role": "user", "content": padding}])).encode())
        chat_413 = post(key, CHAT, json.dumps(chat([{"role": "user", "content": padding}])).encode())
        responses_413 = post(key, RESPONSES, json.dumps(responses(padding)).encode())
    assert anthropic_413.status_code == chat_413.status_code == responses_413.status_code == 413
    assert error_of(MESSAGES, anthropic_413)["type"] == "request_too_large"
    for path, response in ((CHAT, chat_413), (RESPONSES, responses_413)):
        error = error_of(path, response)
        assert error["code"] == "request_too_large"
        assert "4096 bytes" in error["message"]
    assert not Run.objects.exists()


def test_the_endpoint_reads_bodies_past_djangos_form_limit(key: str) -> None:
    """DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB by default) is for form posts; an image request is
    routinely larger, and the endpoint holds it to PROXY_MAX_BODY_BYTES (32 MiB) instead."""
    body = anthropic([{"role": "user", "content": "Hello [[words=5]] " + "x" * 2000}])
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000):
        served_run(post(key, MESSAGES, json.dumps(body).encode()))
