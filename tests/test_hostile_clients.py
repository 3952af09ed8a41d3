"""Hostile and broken input from clients: malformed, oversized and deeply nested WebSocket
messages and API bodies, ``after=`` from the future. Each gets a clear error (an ``error``
frame, a 400 JSON), the consumer keeps serving the socket, and no frame is missed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from streamrecover.live.buffer import reader_buffer
from streamrecover.models import Run, Thread
from streamrecover.testing.client import ClientView

from . import test_live_consumer as live
from .factories import make_user
from .test_live_consumer import close, new_run, receive, socket

pytestmark = pytest.mark.django_db(transaction=True)
frames_out = live.frames_out  # the live tests' fixture: frames through a real publisher

RUNS = "/streamrecover/api/runs/"
DEEP = "[" * 100_000  # json.loads raises RecursionError (not ValueError) on this
DEEP_WS = "[" * 4000  # under the message bound, still too deep for json.loads
DEEP_OBJECT = '{"type": ' + "[" * 500 + "]" * 500 + "}"  # valid, deep, not a command


@pytest.fixture
async def owner() -> Any:
    return await sync_to_async(make_user)()


# ---- the WebSocket ---------------------------------------------------------------------------


BAD_MESSAGES = [
    (DEEP_WS, "bad_json"),
    (DEEP, "too_large"),
    (DEEP_OBJECT, "unknown_type"),
    (json.dumps({"type": "resync", "padding": "x" * 200_000}), "too_large"),
    ("x" * 1_000_000, "too_large"),
    ("[1, 2]", "unknown_type"),
    ('"cancel"', "unknown_type"),
    ('{"type": {"cancel": true}}', "unknown_type"),
    ('{"type": null}', "unknown_type"),
    ("\ud800", "bad_json"),
    ("{", "bad_json"),
]


async def test_bad_client_messages_get_error_frames_and_the_socket_keeps_working(owner: Any, frames_out: Any) -> None:
    run = await new_run(owner)
    await frames_out(run, {"type": "run_status", "status": "running"})
    ws = await socket(run.pk, owner)
    assert (await receive(ws))["type"] == "snapshot"
    for number, (message, code) in enumerate(BAD_MESSAGES):
        await ws.send_to(text_data=message)
        error = await receive(ws)
        assert (error["type"], error["code"]) == ("error", code), message[:40]
        assert error["message"]
        # the consumer is alive: live frames still arrive
        await frames_out(run, {"type": "text_delta", "block": 0, "text": f"{number} "})
        frame = await receive(ws)
        assert (frame["type"], frame["text"]) == ("text_delta", f"{number} ")
    await ws.send_to(bytes_data=b"\x00\xff" * 10_000)
    assert (await receive(ws))["code"] == "bad_message"
    await ws.send_json_to({"type": "resync"})
    snapshot = await receive(ws)
    assert snapshot["type"] == "snapshot"
    assert snapshot["partial"][0]["content"]["text"] == "".join(f"{n} " for n in range(len(BAD_MESSAGES)))
    await close(ws)
    await reader_buffer().discard(str(run.pk))


async def test_after_from_the_future_or_nonsense_gets_a_snapshot_and_misses_nothing(
    owner: Any, frames_out: Any
) -> None:
    run = await new_run(owner)
    await frames_out(run, {"type": "run_status", "status": "running"})
    words = ["one ", "two ", "three "]
    for word in words:
        await frames_out(run, {"type": "text_delta", "block": 0, "text": word})
    for after in ["99", str(10**40), "-5", "abc", "1e3", "", "%00"]:
        ws = await socket(run.pk, owner, after=after)  # type: ignore[arg-type]
        view = ClientView()
        first = await receive(ws)
        assert (first["type"], first["seq"]) == ("snapshot", len(words) + 1), after
        view.apply(first)
        words.append(f"after={after} ")
        await frames_out(run, {"type": "text_delta", "block": 0, "text": words[-1]})
        view.apply(await receive(ws))
        assert view.gaps == 0
        assert view.text() == "".join(words)
        await close(ws)
    # repeated: the last value counts, as for any query parameter (here a replay)
    ws = await socket(run.pk, owner, after="4&after=2")  # type: ignore[arg-type]
    first = await receive(ws)
    assert [first["seq"], first["text"]] == [3, "two "]
    await close(ws)
    await reader_buffer().discard(str(run.pk))


# ---- the JSON API ------------------------------------------------------------------------------


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (DEEP.encode(), "not valid JSON"),
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
        (b'{"prompt": "\xff\xfe"}', "not valid JSON"),
        (json.dumps({"prompt": "x" * 3_000_000}).encode(), "too large"),
        (b'{"prompt": "Hi", "max_tokens": 1e400}', "'max_tokens' must be an integer"),
        (b'{"prompt": "Hi", "max_tokens": NaN}', "'max_tokens' must be an integer"),
        (json.dumps({"prompt": "Hi", "max_tokens": 10**30}).encode(), "'max_tokens' is too large"),
        (json.dumps({"prompt": "Hi", "thinking_budget": 10**30}).encode(), "'thinking_budget' is too large"),
        (json.dumps({"prompt": "Hi", "thread_id": 10**30}).encode(), "'thread_id' is too large"),
        (json.dumps({"prompt": "Hi", "thread_id": -1}).encode(), "No thread -1 of yours"),
        (json.dumps({"prompt": "Hi\x00there"}).encode(), "NUL"),
        (b'{"prompt": "half an emoji \\ud83d"}', "lone surrogate"),
        (json.dumps({"prompt": "Hi", "model": "m" * 201}).encode(), "'model' is longer than 200 characters"),
        (b'{"prompt": "Hi", "model": "claude\\ud83d"}', "'model' is not valid Unicode"),
        (b'{"prompt": "Hi", "provider": "\\udc00"}', "'provider' is not valid Unicode"),
    ],
)
@pytest.mark.django_db  # no transaction needed: a plain test database is faster
def test_a_bad_api_body_is_a_400_json_with_a_clear_message(db: Any, body: bytes, message: str) -> None:
    user = make_user()
    response = _client(user).post(RUNS, data=body, content_type="application/json")
    assert response.status_code in (400, 404), response.content[:300]
    assert response["content-type"] == "application/json"
    assert message in response.json()["error"]
    assert not Run.objects.exists()
    assert not Thread.objects.exists()


@pytest.mark.parametrize("path", ["/streamrecover/api/runs/{big}/", "/streamrecover/api/threads/{big}/"])
@pytest.mark.django_db
def test_huge_or_odd_ids_in_urls_are_a_404_json(db: Any, path: str) -> None:
    user = make_user()
    response = _client(user).get(path.format(big=10**30))
    assert response.status_code == 404
