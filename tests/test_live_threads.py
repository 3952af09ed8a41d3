"""The thread's WebSocket (``live/threads.py``) on the real Redis layer and PostgreSQL: its owner's
sockets hear of each run started in the thread; anyone else's hear nothing."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission

from project.asgi import application
from streamrecover.models import Run

from .factories import make_user
from .test_live_consumer import TIMEOUT, _session_cookie, close, new_run, receive

pytestmark = pytest.mark.django_db(transaction=True)

QUIET_S = 1.0  # long enough for an announcement through Redis to arrive (it takes milliseconds)


async def thread_socket(thread_id: int, user: Any = None) -> WebsocketCommunicator:
    """A connected client of the project's ASGI application (origin check, session auth)."""
    headers = [(b"origin", b"http://testserver")]
    if user is not None:
        headers.append((b"cookie", f"sessionid={await sync_to_async(_session_cookie)(user)}".encode()))
    communicator = WebsocketCommunicator(application, f"/ws/streamrecover/threads/{thread_id}/", headers=headers)
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert connected
    return communicator


async def test_the_owners_sockets_hear_of_a_run_started_in_the_thread_after_they_opened() -> None:
    owner = await sync_to_async(make_user)()
    first = await new_run(owner)
    tabs = [await thread_socket(first.thread_id, owner) for _ in range(2)]
    for tab in tabs:  # on connect: the thread's latest run
        assert await receive(tab) == {"type": "run_started", "thread_id": first.thread_id, "run_id": str(first.pk)}
    await sync_to_async(Run.objects.filter(pk=first.pk).update)(status=Run.Status.COMPLETED)

    second = await new_run(owner, thread=first.thread)

    for tab in tabs:
        assert await receive(tab) == {"type": "run_started", "thread_id": first.thread_id, "run_id": str(second.pk)}
        assert await tab.receive_nothing(QUIET_S)
        await close(tab)


@pytest.mark.parametrize("who", ["other user", "staff who may view runs", "anonymous"])
async def test_no_one_else_hears_of_the_threads_runs(who: str) -> None:
    """A stranger's socket on the thread is refused (4403, as the run's socket refuses) and hears of
    no run started after; their socket on their own thread hears nothing of the owner's either.
    The admin's view permission opens someone else's run by its id, not their thread's socket."""
    owner = await sync_to_async(make_user)()
    stranger = None
    if who != "anonymous":
        stranger = await sync_to_async(make_user)(is_staff=who.startswith("staff"))
        if stranger.is_staff:
            await stranger.user_permissions.aadd(await Permission.objects.aget(codename="view_run"))
    first = await new_run(owner)
    ws = await thread_socket(first.thread_id, stranger)
    error = await receive(ws)
    assert error == {
        "type": "error",
        "thread_id": first.thread_id,
        "code": "forbidden",
        "message": "You may not watch this thread.",
    }
    assert await ws.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4403}
    own = None
    if stranger is not None:
        theirs = await new_run(stranger)
        own = await thread_socket(theirs.thread_id, stranger)
        assert (await receive(own))["run_id"] == str(theirs.pk)
    owners = await thread_socket(first.thread_id, owner)
    assert (await receive(owners))["run_id"] == str(first.pk)
    await sync_to_async(Run.objects.filter(pk=first.pk).update)(status=Run.Status.COMPLETED)

    second = await new_run(owner, thread=first.thread)

    assert (await receive(owners))["run_id"] == str(second.pk)  # announced: and only to the owner
    assert await ws.receive_nothing(QUIET_S)
    if own is not None:
        assert await own.receive_nothing(QUIET_S)
        await close(own)
    await close(owners)


async def test_an_unknown_thread_is_refused_as_someone_elses_is() -> None:
    owner = await sync_to_async(make_user)()
    ws = await thread_socket(987654321, owner)
    assert (await receive(ws))["code"] == "forbidden"
    assert await ws.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4403}
