"""A worker process outlives a lost database connection: PostgreSQL restarted, a failover, an
idle connection closed by a pooler or ``pg_terminate_backend`` (the chaos harness does that).

The run task executes the run's async code, whose ORM calls run in asgiref's one
thread-sensitive thread: that thread's connection lives from task to task, so closing the
task thread's own connection is not enough. Found by the chaos harness: once a worker's
connection was terminated, every later run on that worker failed with "the connection is
lost" and the runs went round the sweeper for ever.
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from streamrecover.models import Run
from streamrecover.runs import lifecycle
from streamrecover.runs.fence import Fence
from streamrecover.tasks import execute_run_task

from .pg_admin import pg_terminate

pytestmark = pytest.mark.django_db(transaction=True)


def _terminate_other_connections() -> int:
    """Every backend of the test database but this thread's own."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (mine,) = cursor.fetchone()
    return pg_terminate("datname = %s AND pid <> %s", (connection.settings_dict["NAME"], mine))


def _connect_in_the_run_thread() -> None:
    """What a run that crashed (its connection broke under it) leaves behind: an open connection
    in the thread the next run's ORM calls use."""

    def connect() -> None:
        connection.ensure_connection()

    asyncio.run(sync_to_async(connect)())


def test_a_run_on_a_worker_whose_connection_was_terminated_completes():
    _connect_in_the_run_thread()
    assert _terminate_other_connections() >= 1  # PostgreSQL restarted, or the chaos harness

    run = lifecycle.create_run(prompt="A short one [[words=8]]", provider="fake", model="fake-claude")
    assert execute_run_task(str(run.pk)) == "completed"
    assert Run.objects.get(pk=run.pk).status == "completed"


def test_a_heartbeat_on_a_terminated_connection_is_made_on_a_fresh_one():
    """Past its lease a run's next frame renews the claim first (``Fence.ensure``). Found by the
    chaos harness: that heartbeat met the ORM thread's connection terminated, raised, failed the
    frame and with it the provider's stream, and the run continued with a second request that
    billed the rest again. The heartbeat is now made once more on a fresh connection."""
    run = lifecycle.create_run(prompt="A short one [[words=8]]", provider="fake", model="fake-claude")
    Run.objects.filter(pk=run.pk).update(status="running", claim_epoch=3, heartbeat_at=None)
    fence = Fence(str(run.pk), epoch=3, lease_s=0.5)
    _connect_in_the_run_thread()
    assert _terminate_other_connections() >= 1

    asyncio.run(fence.beat())
    assert Run.objects.get(pk=run.pk).heartbeat_at is not None
    assert fence.lost is False
