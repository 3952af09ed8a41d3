"""A committed message is stored, or the run stops: a thread never gets a hole.

Found by the chaos harness (a tool run stored 3 messages where its answer has 4): the
PostgreSQL connection of the run's ORM thread was terminated between the tool's result and
the tool-results message; the message's write failed, the failure was logged and swallowed
like any sink's, the run went on from the message it had in memory and stored its final
answer at position 3 after a hole at 2. A fenced write whose connection broke is now made
again on a fresh connection, and a message the store still cannot write stops the run (the
next claim goes on from what is stored).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections

from streamrecover.engine.sink import CollectingSink, FanOutSink
from streamrecover.models import Message, Run
from streamrecover.runs import execution, lifecycle
from streamrecover.runs.toolresults import DjangoToolResultStore

from .pg_admin import pg_terminate

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER = "Weather in Lisbon? [[words=20]] [[tool=get_weather]]"


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return int(pid)


def _terminate(pid: int) -> None:
    pg_terminate("pid = %s", (pid,))


def test_a_connection_terminated_between_the_tool_result_and_its_message_leaves_no_hole(monkeypatch):
    class ConnectionKilledAfterStoring(DjangoToolResultStore):
        async def put(self, run_id: str, position: int, tool_call_id: str, result: dict[str, Any]) -> None:
            await super().put(run_id, position, tool_call_id, result)
            # what the chaos harness's pg_terminate_backend does to the run's ORM thread
            await sync_to_async(_terminate)(await sync_to_async(_backend_pid)())

    run = lifecycle.create_run(prompt=WEATHER, demo_tools=True)
    monkeypatch.setattr(execution, "DjangoToolResultStore", ConnectionKilledAfterStoring)
    result = asyncio.run(execution.execute_run(str(run.pk), worker="w:1"))
    asyncio.run(sync_to_async(connections.close_all)())
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    stored = list(Message.objects.filter(thread_id=run.thread_id).order_by("position"))
    assert [m.position for m in stored] == [0, 1, 2, 3]  # not 0, 1, 3
    assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]
    assert Message.objects.of_thread(run.thread_id).canonical() == result.messages


def test_a_message_the_store_cannot_write_stops_the_run_and_the_others_do_not_hear_of_it():
    class BrokenStore(CollectingSink):
        async def on_message(self, message: dict[str, Any], position: int) -> None:
            raise RuntimeError("the database is gone")

    class BrokenOther(CollectingSink):
        async def on_message(self, message: dict[str, Any], position: int) -> None:
            raise RuntimeError("a live channel hiccup")

    live = CollectingSink()
    sink = FanOutSink(BrokenOther(), live, store=BrokenStore())
    with pytest.raises(RuntimeError, match="the database is gone"):
        asyncio.run(sink.on_message({"role": "user", "content": []}, 2))
    assert live.messages == []  # nobody was told of a message that is not stored
    # any other sink's failure, or the store's failure of anything else, is logged only
    asyncio.run(FanOutSink(BrokenOther(), live, store=CollectingSink()).on_message({"role": "user", "content": []}, 2))
    assert len(live.messages) == 1


def test_a_connection_terminated_as_the_run_settles_still_settles_it_with_its_answer(monkeypatch):
    finish = lifecycle.finish_end
    calls: list[int] = []

    def terminated_first(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            _terminate(_backend_pid())  # the connection the settlement is about to use
        finish(*args, **kwargs)

    run = lifecycle.create_run(prompt="Tell me a story [[words=20]]")
    monkeypatch.setattr(lifecycle, "finish_end", terminated_first)
    result = asyncio.run(execution.execute_run(str(run.pk), worker="w:1"))
    asyncio.run(sync_to_async(connections.close_all)())
    assert len(calls) == 2
    assert result is not None
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    assert Message.objects.of_thread(run.thread_id).canonical() == result.messages
    assert [m["role"] for m in result.messages] == ["user", "assistant"]
