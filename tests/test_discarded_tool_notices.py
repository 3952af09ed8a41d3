"""NOTIFY_MODEL_OF_DISCARDED_TOOLS across runs: a tool call cut off in a turn that then ended
(R3, and the model did not call again) is told to the model in the thread's next user
message, persisted there for anyone to read, and told once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.test import override_settings

from streamrecover import starter
from streamrecover.models import Attempt, Message, RecoveryEvent, Thread
from streamrecover.runs import lifecycle
from streamrecover.testing.tools import demo_registry

from .harness import events_until, run

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Weather in Paris? [[tool]] [[no_tool_after_break]]"
MODEL = "claude-3-7-sonnet"


def _providers(fake_server: Any, scenario: str) -> dict[str, Any]:
    return {
        "fake": {
            "ADAPTER": "anthropic",
            "BASE_URL": fake_server.base_url,
            "API_KEY": "sk-test-notices",
            "EXTRA_HEADERS": {"x-fake-scenario": scenario},
        }
    }


def _cut_inside_the_tool_call(fake_server: Any) -> str:
    reference = asyncio.run(run(fake_server, PROMPT, tools=demo_registry(), model=MODEL))
    return f"cut:events={asyncio.run(events_until(fake_server, reference, 'tool')) - 2}"


@pytest.mark.parametrize("notify", [True, False])
def test_the_next_user_message_tells_the_model_about_a_cut_off_tool_call(fake_server, settings, notify) -> None:
    scenario = f"notices-{notify}"
    fake_server.set_faults(scenario, [_cut_inside_the_tool_call(fake_server)])
    conf = {
        **settings.STREAMRECOVER,
        "PROVIDERS": _providers(fake_server, scenario),
        "NOTIFY_MODEL_OF_DISCARDED_TOOLS": notify,
    }
    with override_settings(STREAMRECOVER=conf):
        first = lifecycle.create_run(prompt=PROMPT, provider="fake", model=MODEL, demo_tools=True)
        result = asyncio.run(starter.execute_here(str(first.pk)))
        assert result is not None
        assert result.status == "completed"
        discarded = RecoveryEvent.objects.get(run=first, name="discarded_partial_tool_use")
        thread = Thread.objects.get(pk=first.thread_id)
        if notify:
            assert thread.pending_notices == [
                {"id": discarded.payload["tool_call_id"], "name": "get_weather", "reason": discarded.payload["reason"]}
            ]
        else:
            assert thread.pending_notices == []

        second = lifecycle.create_run(prompt="And in Rome?", provider="fake", model=MODEL, thread=thread)
        user = Message.objects.get(run=second, role="user")
        texts = [block["text"] for block in user.content]
        assert texts[-1] == "And in Rome?"
        if notify:
            assert len(texts) == 2
            assert "get_weather" in texts[0]
            assert discarded.payload["tool_call_id"] in texts[0]
            assert "was not executed" in texts[0]
        else:
            assert len(texts) == 1
        assert Thread.objects.get(pk=thread.pk).pending_notices == []  # told once

        assert asyncio.run(starter.execute_here(str(second.pk))).status == "completed"
        sent = Attempt.objects.get(run=second).request
        last_user = [m for m in sent["json"]["messages"] if m["role"] == "user"][-1]
        assert any("was not executed" in str(block) for block in last_user["content"]) is notify

        third = lifecycle.create_run(prompt="Thanks", provider="fake", model=MODEL, thread=thread)
        assert [b["text"] for b in Message.objects.get(run=third, role="user").content] == ["Thanks"]


class WorkerDied(BaseException):
    """Where the test kills the worker: nothing after it runs."""


def test_a_notice_survives_a_worker_dying_as_the_run_settles(fake_server, settings, monkeypatch) -> None:
    """The notice is stored with the run's end and its answer, in one step: a worker dying
    between the answer and the run's end loses neither; the next worker settles both."""
    from datetime import timedelta

    from django.utils import timezone

    from streamrecover.models import Run

    scenario = "notices-dying"
    fake_server.set_faults(scenario, [_cut_inside_the_tool_call(fake_server)])
    conf = {
        **settings.STREAMRECOVER,
        "PROVIDERS": _providers(fake_server, scenario),
        "NOTIFY_MODEL_OF_DISCARDED_TOOLS": True,
    }
    real_write = lifecycle.write_messages

    def dies_after_writing(*args: Any) -> None:
        real_write(*args)
        raise WorkerDied("the worker died between the answer and the run's end")

    with override_settings(STREAMRECOVER=conf):
        run_ = lifecycle.create_run(prompt=PROMPT, provider="fake", model=MODEL, demo_tools=True)
        monkeypatch.setattr(lifecycle, "write_messages", dies_after_writing)
        with pytest.raises(WorkerDied):
            asyncio.run(starter.execute_here(str(run_.pk)))
        monkeypatch.setattr(lifecycle, "write_messages", real_write)
        thread = Thread.objects.get(pk=run_.thread_id)
        assert thread.pending_notices == []
        assert [m.role for m in Message.objects.filter(thread=thread)] == ["user"]
        Run.objects.filter(pk=run_.pk).update(
            status=Run.Status.QUEUED, worker="", heartbeat_at=timezone.now() - timedelta(minutes=10)
        )

        result = asyncio.run(starter.execute_here(str(run_.pk)))
        assert result is not None
        assert result.status == "completed"
        discarded = RecoveryEvent.objects.get(run=run_, name="discarded_partial_tool_use")
        assert Thread.objects.get(pk=thread.pk).pending_notices == [
            {"id": discarded.payload["tool_call_id"], "name": "get_weather", "reason": discarded.payload["reason"]}
        ]
        assert [m.role for m in Message.objects.filter(thread=thread)] == ["user", "assistant"]
