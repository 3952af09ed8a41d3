"""``manage.py streamrecover_run``: the command-line contract, persisted runs, exit codes."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from streamrecover.models import Attempt, Message, RecoveryEvent, Run
from streamrecover.testing.client import ClientView

pytestmark = pytest.mark.django_db(transaction=True)

BASE = ["--provider", "fake", "--model", "fake-claude", "--backoff-scale", "0"]


def run_json(*args: str) -> tuple[dict, int]:
    out = io.StringIO()
    code = 0
    try:
        call_command("streamrecover_run", *BASE, *args, "--json", stdout=out)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return json.loads(out.getvalue()), code


def test_json_output_follows_the_contract_and_is_persisted():
    doc, code = run_json("--prompt", "A tale [[words=80]]", "--fault", "cut:bytes=1200")
    assert code == 0
    assert set(doc) == {"run_id", "status", "messages", "client_events", "events", "attempts", "error"}
    assert doc["status"] == "completed"
    assert doc["error"] is None
    user, assistant = doc["messages"]
    assert user == {"role": "user", "content": [{"type": "text", "text": "A tale [[words=80]]"}]}
    assert assistant["role"] == "assistant"
    assert [b["type"] for b in assistant["content"]] == ["text"]
    # a live client would have rebuilt exactly the committed answer from client_events
    view = ClientView().apply_all(doc["client_events"])
    assert view.turns == [(assistant["content"], assistant["content"])]
    assert all("event" in e for e in doc["events"])
    assert [e["event"] for e in doc["events"]][:2] == ["llm_stream_interrupted", "llm_stream_continuation_started"]
    assert [(a["kind"], a["interrupt_cause"], a["strategy"]) for a in doc["attempts"]] == [
        ("initial", "connection_reset", None),
        ("continuation", None, "prefill"),
    ]
    assert doc["attempts"][1]["usage"]["output_tokens"] > 0
    # the same run is in the database
    run = Run.objects.get(pk=doc["run_id"])
    assert run.status == "completed"
    stored = [m.as_canonical() for m in Message.objects.filter(thread=run.thread).order_by("position")]
    assert stored == doc["messages"]
    assert Attempt.objects.filter(run=run).count() == 2
    assert RecoveryEvent.objects.filter(run=run).count() == len(doc["events"])


def test_failed_run_exits_non_zero_with_the_error():
    doc, code = run_json("--prompt", "x", "--fault", "status:401")
    assert code == 1
    assert doc["status"] == "failed"
    assert doc["error"]["kind"] == "unauthorized"
    assert len(doc["attempts"]) == 1


def test_max_continuations_flag_is_obeyed():
    doc, code = run_json("--prompt", "x [[words=80]]", "--max-continuations", "1", *["--fault", "cut:bytes=900"] * 3)
    assert code == 1
    assert doc["status"] == "exhausted"
    assert len(doc["attempts"]) == 2


def test_tools_run_through_the_command():
    doc, code = run_json("--prompt", "Weather in Oslo? [[tool=get_weather]]", "--demo-tools")
    assert code == 0
    roles = [m["role"] for m in doc["messages"]]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert doc["messages"][2]["content"][0]["type"] == "tool_result"


def test_live_view_shows_the_answer_and_the_recovery():
    out = io.StringIO()
    call_command("streamrecover_run", *BASE, "--prompt", "A tale [[words=40]]", "--fault", "cut:bytes=900", stdout=out)
    text = out.getvalue()
    assert "[stream interrupted: connection_reset" in text
    assert "[continuation 1" in text
    assert "[run completed]" in text
    run = Run.objects.get()
    answer = Message.objects.get(thread=run.thread, role="assistant").content[0]["text"]
    assert answer in text.replace("\n[", "[").replace("]\n", "]") or answer.split()[-1] in text


def test_live_view_announces_each_tool_call_once():
    """Anthropic's stream (the fake's too) opens a tool call with an empty arguments delta after its
    start: the live view said "[calling tool get_weather]" twice for one call."""
    out = io.StringIO()
    call_command("streamrecover_run", *BASE, "--prompt", "Oslo? [[tool=get_weather]]", "--demo-tools", stdout=out)
    text = out.getvalue()
    assert text.count("[calling tool get_weather]") == 1
    assert text.count("[tool result: ") == 1
    assert "[run completed]" in text


def test_fault_flag_needs_the_fake_provider():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="fake provider"):
        call_command(
            "streamrecover_run", "--provider", "anthropic", "--api-key", "k", "--model", "m", "--prompt", "x",
            "--fault", "cut:bytes=1", "--json", stdout=io.StringIO(),
        )  # fmt: skip


def test_a_provider_without_a_key_is_a_clear_error_and_stores_nothing(monkeypatch):
    from django.core.management.base import CommandError

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(CommandError, match="ANTHROPIC_API_KEY"):
        call_command(
            "streamrecover_run", "--provider", "anthropic", "--model", "claude-3", "--prompt", "x", "--json",
            stdout=io.StringIO(),
        )  # fmt: skip
    assert not Run.objects.exists()
