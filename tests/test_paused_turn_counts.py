"""A turn the provider paused counts each of its requests against ``MAX_TURNS`` after a resume too.

A run whose first turn searches the web (Anthropic's ``web_search`` server tool, offered on every
request by a host's adapter), paused by the provider after each search, then asks for a client
tool: one assistant message, N+1 requests. Its worker dies after that message is committed (in
the tool call, or once its results are), and the next worker must count those N+1 requests, not
one per message. Through the Django layer (``runs.execution.execute_run``) against the fake.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from streamrecover.conf import app_settings
from streamrecover.engine.agent import Tool, ToolRegistry
from streamrecover.engine.contract import HTTPRequest, ModelRequest
from streamrecover.models import Attempt, Message, Run
from streamrecover.providers.anthropic import AnthropicAdapter
from streamrecover.runs import execution, lifecycle
from streamrecover.testing.fake.local import local_fake_server
from streamrecover.testing.tools import WEATHER_SCHEMA

pytestmark = pytest.mark.django_db(transaction=True)

WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}


class WebSearchingAdapter(AnthropicAdapter):
    """A host's adapter: Anthropic's, with the web_search server tool offered on every request."""

    def build_request(self, request: ModelRequest) -> HTTPRequest:
        http_request = super().build_request(request)
        body = dict(http_request.json)
        body["tools"] = [*body.get("tools", []), WEB_SEARCH]
        return replace(http_request, json=body)


def _searching_provider() -> dict[str, Any]:
    entry = {"ADAPTER": f"{__name__}.WebSearchingAdapter", "BASE_URL": local_fake_server().base_url, "API_KEY": "k"}
    return {**settings.STREAMRECOVER, "PROVIDERS": {**app_settings.PROVIDERS, "searching": entry}}


def _provider_calls() -> int:
    return len(local_fake_server().log)


def _roles(run: Run) -> list[str]:
    return [m["role"] for m in Message.objects.of_thread(run.thread_id).canonical()]


def _stale(run: Run, **fields: Any) -> None:
    """Its worker gone: the run's heartbeat long stale, so another worker may claim it."""
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=10), **fields)


def _dies_at_the_call(arguments: dict[str, Any]) -> str:
    raise asyncio.CancelledError("the worker died during the tool call")


def _release_orm_thread() -> None:
    """The async ORM's thread holds connections the test database cannot be dropped with."""
    asyncio.run(sync_to_async(connections.close_all)())


@pytest.mark.parametrize("searches", [1, 3])
@pytest.mark.parametrize("died", ["at_the_tool_call", "after_the_tool_results"])
def test_a_turn_paused_then_committed_counts_each_request_after_a_resume(searches, died):
    max_turns = searches + 1  # the paused turn's requests: one worker stops once its tool has run
    prompt = f"What happened at sea, and the weather in Paris? [[search={searches}]] [[pause]] [[tool=get_weather]]"
    with override_settings(STREAMRECOVER=_searching_provider()):
        run = lifecycle.create_run(
            prompt=prompt, provider="searching", model="claude-3-7-sonnet", demo_tools=True,
            engine={"max_turns": max_turns},
        )  # fmt: skip
        calls = _provider_calls()
        if died == "at_the_tool_call":
            dying = ToolRegistry([Tool("get_weather", "Weather.", WEATHER_SCHEMA, _dies_at_the_call)])
            with pytest.raises(asyncio.CancelledError):
                asyncio.run(execution.execute_run(str(run.pk), tools=dying))
            _release_orm_thread()
            assert _roles(run) == ["user", "assistant"]
            _stale(run)
        else:
            result = asyncio.run(execution.execute_run(str(run.pk)))
            assert result is not None
            assert (result.status, (result.error or {}).get("kind")) == (Run.Status.FAILED, "max_turns")
            assert _roles(run) == ["user", "assistant", "user"]
            # as if it had died there, before settling the run's end
            _stale(run, status=Run.Status.RUNNING, worker="gone:1", finished_at=None, claims=1)
        assert _provider_calls() - calls == max_turns
        paused = Attempt.objects.filter(run=run, stop_reason="pause_turn")
        assert paused.count() == searches
        assert {a.turn for a in paused} == {0}
        answer = Message.objects.of_thread(run.thread_id).canonical()[1]["content"]
        assert [b["type"] for b in answer][-1] == "tool_use"  # the paused turn: one message

        again = asyncio.run(execution.execute_run(str(run.pk), worker="next:2"))
        _release_orm_thread()

    assert again is not None
    assert (again.status, (again.error or {}).get("kind")) == (Run.Status.FAILED, "max_turns")
    assert _provider_calls() - calls == max_turns  # asked max_turns times in all: no turn after the resume
    assert _roles(run) == ["user", "assistant", "user"]  # the tool's results, and no answer after them
