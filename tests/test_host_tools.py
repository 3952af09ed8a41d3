"""A host project's own tools (``STREAMRECOVER['TOOLS']``) are offered on every path that executes a
run: a run whose worker died during the tool's call is resumed by the sweep or by the Celery task
with them, and a resumed run whose tool is gone fails clearly instead of telling the model the tool
is unknown."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from streamrecover.checks import check_tools
from streamrecover.conf import app_settings
from streamrecover.engine.agent import Tool, ToolRegistry
from streamrecover.engine.toolresults import ToolCallContext
from streamrecover.models import Attempt, Message, Run
from streamrecover.runs import execution, lifecycle
from streamrecover.runs.tools import tools_for_run
from streamrecover.tasks import execute_run_task

from .factories import tool_results

pytestmark = pytest.mark.django_db(transaction=True)

BOOK = "Book a table for two [[words=12]] [[tool=book_table]]"
SCHEMA = {"type": "object", "properties": {"restaurant": {"type": "string"}}}


class WorkerDied(BaseException):
    """Where the test kills the worker: nothing after it runs (a BaseException, like a kill)."""


class Bookings:
    """The host's side effect: one booking per call that returns."""

    def __init__(self) -> None:
        self.made = 0
        self.die_next = False

    def book_table(self, args: dict[str, Any], context: ToolCallContext) -> dict[str, Any]:
        if self.die_next:
            self.die_next = False
            raise WorkerDied("the worker died during the call")
        self.made += 1
        return {"booked": True, "key": context.idempotency_key}


BOOKINGS = Bookings()


def host_tools(run: Run) -> ToolRegistry:
    """What a host's ``TOOLS`` names: a function of the run."""
    return ToolRegistry([Tool("book_table", "Book a table", SCHEMA, BOOKINGS.book_table)])


# A host whose registry no longer has ``book_table`` (a deploy renamed it): a registry, not a function.
OTHER_TOOLS = ToolRegistry([Tool("find_parking", "Find parking", SCHEMA, lambda args: "none")])

HOST = {**settings.STREAMRECOVER, "TOOLS": "tests.test_host_tools.host_tools"}
OTHER = {**settings.STREAMRECOVER, "TOOLS": "tests.test_host_tools.OTHER_TOOLS"}


@pytest.fixture(autouse=True)
def _fresh_bookings() -> None:
    BOOKINGS.made, BOOKINGS.die_next = 0, False


def _release_orm_thread() -> None:
    asyncio.run(sync_to_async(connections.close_all)())


def _died_during_the_tool() -> Run:
    """A run whose worker (a thread of the web process) died while the host's tool ran, left
    ``running`` with a heartbeat long stale."""
    BOOKINGS.die_next = True
    run = lifecycle.create_run(prompt=BOOK, provider="fake", model="fake-claude")
    with pytest.raises(WorkerDied):
        asyncio.run(execution.execute_run(str(run.pk), worker="old-server:1"))
    _release_orm_thread()
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert BOOKINGS.made == 0
    return run


def _booked(run: Run) -> None:
    """The host's tool was called once more and its result stored and sent on: the run completed."""
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, (run.error_kind, run.error_message)
    assert BOOKINGS.made == 1
    (result,) = tool_results(run)
    assert result["is_error"] is False, result
    assert '"booked": true' in result["content"]
    roles = [m["role"] for m in Message.objects.of_thread(run.thread_id).canonical()]
    assert roles == ["user", "assistant", "user", "assistant"]


@override_settings(STREAMRECOVER=HOST)
def test_a_run_resumed_by_the_sweep_calls_the_hosts_tool() -> None:
    run = _died_during_the_tool()
    out = StringIO()
    call_command("streamrecover_sweep", stdout=out, stderr=StringIO())
    assert f"{run.pk}: completed" in out.getvalue()
    _booked(run)


@override_settings(STREAMRECOVER=HOST)
def test_a_run_resumed_by_the_celery_task_calls_the_hosts_tool() -> None:
    run = _died_during_the_tool()
    assert lifecycle.sweep_stale_runs() == [str(run.pk)]  # what the beat's sweep hands to a worker
    assert execute_run_task(str(run.pk)) == "completed"
    _booked(run)


@override_settings(STREAMRECOVER=HOST)
def test_a_run_started_by_the_celery_task_offers_the_hosts_tool() -> None:
    run = lifecycle.create_run(prompt=BOOK, provider="fake", model="fake-claude")
    assert execute_run_task(str(run.pk)) == "completed"
    _booked(run)


def test_a_resumed_run_whose_tool_is_gone_fails_naming_it_before_asking_the_model() -> None:
    with override_settings(STREAMRECOVER=HOST):
        run = _died_during_the_tool()
        attempts = Attempt.objects.filter(run=run).count()
        messages = Message.objects.filter(thread=run.thread).count()
    with override_settings(STREAMRECOVER=OTHER):
        out = StringIO()
        call_command("streamrecover_sweep", stdout=out, stderr=StringIO())
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert run.error_kind == "tool_unavailable"
    assert "'book_table'" in run.error_message
    assert tool_results(run) == []  # the model was never told the tool is unknown
    assert Message.objects.filter(thread=run.thread).count() == messages
    assert Attempt.objects.filter(run=run).count() == attempts  # no provider call
    assert BOOKINGS.made == 0


@override_settings(STREAMRECOVER=OTHER)
def test_an_explicit_registry_wins_over_the_setting() -> None:
    run = lifecycle.create_run(prompt=BOOK, provider="fake", model="fake-claude")
    result = asyncio.run(execution.execute_run(str(run.pk), worker="here:1", tools=host_tools(run)))
    _release_orm_thread()
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    _booked(run)


@override_settings(STREAMRECOVER=OTHER)
def test_a_tool_the_model_made_up_is_still_told_unknown() -> None:
    """A call of a tool the run was never offered is the model's mistake, and the model is told."""
    run = lifecycle.create_run(prompt=BOOK, provider="fake", model="fake-claude")
    result = asyncio.run(execution.execute_run(str(run.pk), worker="here:1"))
    _release_orm_thread()
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    (told,) = tool_results(run)
    assert told["is_error"] is True
    assert "unknown tool 'book_table'" in told["content"]


def test_the_default_offers_the_sample_tools_to_a_demo_tools_run() -> None:
    run = lifecycle.create_run(prompt="Weather? [[words=5]] [[tool=get_weather]]", demo_tools=True)
    result = asyncio.run(execution.execute_run(str(run.pk), worker="here:1"))
    _release_orm_thread()
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    (told,) = tool_results(run)
    assert told["is_error"] is False, told


@pytest.mark.parametrize(
    ("path", "says"),
    [("tests.test_host_tools.no_such_thing", "does not import"), ("tests.test_host_tools.BOOK", "must name")],
)
def test_a_tools_setting_that_names_no_tools_is_a_check_error(path: str, says: str) -> None:
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "TOOLS": path}):
        (error,) = check_tools()
        assert error.id == "streamrecover.E005"
        assert path in error.msg
        assert says in error.msg


def test_a_tools_setting_that_is_no_path_is_refused() -> None:
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "TOOLS": 3}), pytest.raises(ImproperlyConfigured):
        app_settings.TOOLS  # noqa: B018


@pytest.mark.parametrize("path", [None, "tests.test_host_tools.host_tools", "tests.test_host_tools.OTHER_TOOLS"])
def test_a_tools_setting_that_names_tools_passes_the_check(path: str | None) -> None:
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "TOOLS": path}):
        assert check_tools() == []


def failing_tools(run: Run) -> ToolRegistry:
    raise RuntimeError("the tools database is down")


def listed_tools(run: Run) -> list[ToolRegistry]:
    """A host's mistake: a list holding the registry, not the registry."""
    return [host_tools(run)]


def test_a_proxied_run_is_never_given_the_hosts_tools() -> None:
    # its tools are its client's: the host's were sent upstream with every proxied request, and
    # a host function that raised failed every proxied request
    run = lifecycle.create_run(prompt=BOOK, provider="fake", model="fake-claude")
    Run.objects.filter(pk=run.pk).update(options={**run.options, "proxy": {"format": "anthropic"}})
    run.refresh_from_db()
    with override_settings(STREAMRECOVER=HOST):
        assert not tools_for_run(run).specs()
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "TOOLS": "tests.test_host_tools.failing_tools"}):
        assert not tools_for_run(run).specs()


def test_a_tools_function_that_gives_no_registry_fails_its_run_clearly() -> None:
    # it raised out of the worker and left the run running until the sweep, which crashed again
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "TOOLS": "tests.test_host_tools.listed_tools"}):
        run = lifecycle.create_run(prompt=BOOK, provider="fake", model="fake-claude")
        assert execute_run_task(str(run.pk)) == "failed"
    run.refresh_from_db()
    assert run.error_kind == "tool_unavailable"
    assert "not a ToolRegistry" in run.error_message


def test_a_run_failed_for_a_missing_tool_is_requeued_and_calls_it_once_the_tool_is_back() -> None:
    """The admin's "Re-queue failed runs" after a deploy brought the tool back: the thread ends with
    the run's own assistant message, but its tool call waits for a result, so the run is no answered
    one (that one is left as it ended): it is re-queued, calls the tool and completes."""
    with override_settings(STREAMRECOVER=HOST):
        run = _died_during_the_tool()
    with override_settings(STREAMRECOVER=OTHER):
        call_command("streamrecover_sweep", stdout=StringIO(), stderr=StringIO())
    run.refresh_from_db()
    assert run.error_kind == "tool_unavailable"
    with override_settings(STREAMRECOVER=HOST):
        assert lifecycle.requeue_run(run.pk)  # what the admin's action does before it starts the run
        asyncio.run(execution.execute_run(str(run.pk)))
        _release_orm_thread()
    _booked(run)
