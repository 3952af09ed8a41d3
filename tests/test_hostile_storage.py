"""Model output that the database would refuse as it is (U+0000, which PostgreSQL's jsonb does
not store) is committed exactly as streamed, in the message, the stored request and the events,
and read back the same; a lone surrogate escape (no UTF-8 form) is decoded to U+FFFD, for the
client and the database alike. The run is never reported completed with its answer missing."""

from __future__ import annotations

import asyncio

import pytest
from django.test import Client, override_settings

from streamrecover import starter
from streamrecover.fields import ESCAPE, escape_text, unescape_text
from streamrecover.models import Attempt, Message, RecoveryEvent
from streamrecover.runs import lifecycle

from .factories import make_user
from .recorded_reading import _text, anthropic_stream

pytestmark = pytest.mark.django_db(transaction=True)

ODD = ["Binary reads a\x00b, ", "a lone \ud83d half, ", f"a private {ESCAPE} char, ", f"{ESCAPE}0 and {ESCAPE}u0041."]
ANSWER = "".join(ODD).replace("\ud83d", "\ufffd")  # a lone surrogate decodes to U+FFFD


@pytest.mark.parametrize(
    "text", ["", "plain", "\x00", ESCAPE, ESCAPE + "0", ESCAPE * 3 + "\x00", "\ud800\udfff", "a\x00\ue000u0041\ud83d"]
)
def test_escaping_round_trips_and_leaves_no_nul_or_surrogate(text: str) -> None:
    escaped = escape_text(text)
    assert unescape_text(escaped) == text
    assert "\x00" not in escaped
    escaped.encode("utf-8")  # no lone surrogate left


def test_output_the_database_would_refuse_is_committed_as_streamed(fake_server, settings) -> None:
    # JSON escapes on the wire, as a provider sends them (a lone surrogate has no UTF-8 form)
    raw = anthropic_stream([({"type": "text", "text": ""}, _text(*(p.replace("\ud83d", "LONE") for p in ODD)))])
    fake_server.set_recording("odd-output", raw.replace(b"LONE", b"\\ud83d"))
    fake_server.set_faults("odd-output", ["cut:events=3"])  # NUL in the checkpoint and the continuation's prefix
    providers = {
        "fake": {
            "ADAPTER": "anthropic",
            "BASE_URL": fake_server.base_url,
            "API_KEY": "sk-test",
            "EXTRA_HEADERS": {"x-fake-scenario": "odd-output"},
        }
    }
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "PROVIDERS": providers}):
        owner = make_user()
        run = lifecycle.create_run(prompt="Show me the bytes", owner=owner, provider="fake", model="claude-3")
        result = asyncio.run(starter.execute_here(str(run.pk)))
    assert result is not None
    assert result.status == "completed"
    user, assistant = Message.objects.filter(thread_id=run.thread_id).order_by("position")
    assert assistant.content == [{"type": "text", "text": ANSWER}]
    assert user.content == [{"type": "text", "text": "Show me the bytes"}]
    # the continuation's stored request carries the prefix as sent, NUL included
    requests = [a.request for a in Attempt.objects.filter(run=run).order_by("index")]
    assert len(requests) == 2
    assert requests[1]["json"]["messages"][-1]["content"][0]["text"] == "Binary reads a\x00b,"  # as sent (prefill)
    assert RecoveryEvent.objects.filter(run=run, name="llm_stream_interrupted").exists()
    client = Client()
    client.force_login(owner)
    shown = client.get(f"/streamrecover/api/threads/{run.thread_id}/").json()["messages"]
    assert shown[-1]["content"] == [{"type": "text", "text": ANSWER}]


def test_a_tool_calls_input_keeps_the_key_order_the_model_wrote(fake_server) -> None:
    """The database gives back the object the model streamed: PostgreSQL's jsonb would hand the
    keys back shortest first (``unit`` before ``location``), another object than the model's."""
    from django.db import connection

    owner = make_user()
    run = lifecycle.create_run(prompt="Weather? [[tool=get_weather]]", owner=owner, demo_tools=True)
    written = {"location": "Zürich", "unit": "celsius", "days": [{"zz": 1, "a": 2}], "": "empty"}
    message = Message.objects.create(
        thread_id=run.thread_id,
        run=run,
        position=1,
        role=Message.Role.ASSISTANT,
        content=[{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": written}],
    )
    stored = Message.objects.get(pk=message.pk).content[0]["input"]
    assert stored == written
    assert list(stored) == list(written)
    assert list(stored["days"][0]) == ["zz", "a"]
    with connection.cursor() as cursor:  # the column holds the JSON as written, UTF-8 included
        cursor.execute("SELECT content FROM streamrecover_message WHERE id = %s", [message.pk])
        (raw,) = cursor.fetchone()
    assert '"location": "Zürich", "unit": "celsius"' in raw
