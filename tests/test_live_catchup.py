"""The process's catch-up check: the sockets of one event loop are checked together, one status
read and one buffer read for all their runs per interval, and only while their runs go on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.test import override_settings

from streamrecover.live import catchup
from streamrecover.live.buffer import reader_buffer
from streamrecover.runs import lifecycle

from .test_live_consumer import close, frames_out, new_run, owner, receive, socket  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

CHECK_S = 0.2


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The run ids of every status read the check makes (the real read still runs)."""
    calls: list[list[str]] = []
    real = catchup._statuses

    def spy(run_ids: list[str]) -> dict[str, str]:
        calls.append(list(run_ids))
        return real(run_ids)

    monkeypatch.setattr(catchup, "_statuses", spy)
    return calls


async def test_many_sockets_cost_one_status_read_per_interval(
    owner: Any,  # noqa: F811
    frames_out: Any,  # noqa: F811
    reads: list[list[str]],
) -> None:
    runs = [await new_run(owner, f"Story {i}") for i in range(5)]
    for run in runs:
        await frames_out(run, {"type": "run_status", "status": "running"})
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "LIVE_CHECK_SECONDS": CHECK_S}):
        sockets = [await socket(run.pk, owner) for run in runs]
        sockets.append(await socket(runs[0].pk, owner))  # a second tab on the same run
        for ws in sockets:
            assert (await receive(ws))["type"] == "snapshot"
        connected = len(reads)
        while len(reads) < connected + 3:
            await asyncio.sleep(CHECK_S / 4)
        # each interval: one read for all six sockets, asking about each of the five runs once
        assert [sorted(ids) for ids in reads[connected:]] == [sorted(str(run.pk) for run in runs)] * 3
        for ws in sockets:
            assert await ws.receive_nothing(timeout=0.05)  # nobody was behind: nothing sent
            await close(ws)
        await asyncio.sleep(0.05)
        closed = len(reads)
        await asyncio.sleep(3 * CHECK_S)
        assert len(reads) == closed  # no socket left: no more reads
        assert not catchup.catch_up_check().watching_any()


async def test_a_socket_stops_being_checked_once_its_client_has_the_end(
    owner: Any,  # noqa: F811
    frames_out: Any,  # noqa: F811
    reads: list[list[str]],
) -> None:
    going, ending = await new_run(owner, "Going"), await new_run(owner, "Ending")
    for run in (going, ending):
        await frames_out(run, {"type": "run_status", "status": "running"})
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "LIVE_CHECK_SECONDS": CHECK_S}):
        ws_going, ws_ending = await socket(going.pk, owner), await socket(ending.pk, owner)
        for ws in (ws_going, ws_ending):
            await receive(ws)
        answer = {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}
        await sync_to_async(lifecycle.finish)(str(ending.pk), "completed", message=answer, position=1)
        await frames_out(ending, {"type": "run_status", "status": "completed"})
        assert (await receive(ws_ending))["status"] == "completed"
        ended = len(reads)
        while len(reads) < ended + 3:
            await asyncio.sleep(CHECK_S / 4)
        assert reads[-1] == [str(going.pk)]  # the ended run's client has its end: no longer read
        assert await ws_ending.receive_nothing(timeout=0.05)  # and it was sent nothing more
        await close(ws_going)
        await close(ws_ending)


async def test_a_client_behind_on_two_runs_gets_each_runs_missed_frames(
    owner: Any,  # noqa: F811
    frames_out: Any,  # noqa: F811
) -> None:
    """Frames that reached the buffer but not the sockets (their subscription lost with Redis):
    one check finds both clients behind, the next catches each up on its own run."""
    runs = [await new_run(owner, "One"), await new_run(owner, "Two")]
    for run in runs:
        await frames_out(run, {"type": "run_status", "status": "running"})
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "LIVE_CHECK_SECONDS": CHECK_S}):
        sockets = [await socket(run.pk, owner) for run in runs]
        for ws in sockets:
            assert (await receive(ws))["seq"] == 1
        for run, text in zip(runs, ("first", "second"), strict=True):
            frame = {"type": "text_delta", "run_id": str(run.pk), "seq": 2, "block": 0, "text": text}
            await reader_buffer().append(str(run.pk), frame)
        got = [await receive(ws) for ws in sockets]
        assert [(f["run_id"], f["seq"], f["text"]) for f in got] == [
            (str(runs[0].pk), 2, "first"),
            (str(runs[1].pk), 2, "second"),
        ]
        for ws in sockets:
            await close(ws)


async def test_no_check_runs_when_the_interval_is_zero(
    owner: Any,  # noqa: F811
    frames_out: Any,  # noqa: F811
    reads: list[list[str]],
) -> None:
    run = await new_run(owner)
    await frames_out(run, {"type": "run_status", "status": "running"})
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "LIVE_CHECK_SECONDS": 0}):
        ws = await socket(run.pk, owner)
        await receive(ws)
        await asyncio.sleep(0.3)
        assert reads == []
        assert not catchup.catch_up_check().watching_any()
        await close(ws)
