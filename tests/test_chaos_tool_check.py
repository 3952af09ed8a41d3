"""The chaos harness's "no tool executed twice" check: which repeats of a call are the window no
store can close (the worker killed after the call, before its result was stored), and which are
failures."""

from __future__ import annotations

import uuid
from typing import Any

from project.chaos.checks import check_tools
from streamrecover.models import Run

ARGS = {"city": "Oslo"}
WORKER_GROUP = 4242


def _thread() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": ARGS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
    ]


def _line(run: Run, started: float, pgid: int = WORKER_GROUP) -> dict[str, Any]:
    return {
        "run_id": str(run.pk),
        "args": ARGS,
        "pid": pgid + 1,
        "pgid": pgid,
        "started": started,
        "ended": started + 3.0,
    }


def _check(lines: list[dict[str, Any]], kills: list[tuple[float, str, int]], stored_at: float | None, run: Run) -> Any:
    stored = {} if stored_at is None else {(str(run.pk), "toolu_1"): stored_at}
    return check_tools({"r": run}, {"r": _thread()}, lines, kills, stored)


def test_a_call_made_once_holds_without_a_note() -> None:
    run = Run(pk=uuid.uuid4())
    check = _check([_line(run, 100.0)], [], 103.1, run)
    assert (check.ok, check.checked, check.notes) == (True, 1, [])


def test_a_call_made_again_after_its_worker_was_killed_before_storing_the_result_is_a_note() -> None:
    run = Run(pk=uuid.uuid4())
    lines = [_line(run, 100.0), _line(run, 110.0, pgid=5555)]
    check = _check(lines, [(104.0, "worker0", WORKER_GROUP)], 113.1, run)
    assert check.ok, check.failures
    (note,) = check.notes
    assert "killed after the call ended, before its result was stored" in note


def test_a_call_made_again_although_its_result_was_stored_fails() -> None:
    run = Run(pk=uuid.uuid4())
    lines = [_line(run, 100.0), _line(run, 110.0, pgid=5555)]
    check = _check(lines, [(104.0, "worker0", WORKER_GROUP)], 103.1, run)
    assert not check.ok
    assert "2 executions for 1 committed calls" in check.failures[0]


def test_a_call_made_again_with_no_kill_of_the_worker_that_made_it_fails() -> None:
    run = Run(pk=uuid.uuid4())
    lines = [_line(run, 100.0), _line(run, 110.0, pgid=5555)]
    assert not _check(lines, [], 113.1, run).ok
    # a kill of another worker's group, or of the same one after the repeat began, excuses nothing
    assert not _check(lines, [(104.0, "worker1", 9999)], 113.1, run).ok
    assert not _check(lines, [(111.0, "worker0", WORKER_GROUP)], 113.1, run).ok


def test_a_third_execution_is_judged_on_its_own() -> None:
    run = Run(pk=uuid.uuid4())
    lines = [_line(run, 100.0), _line(run, 110.0, pgid=5555), _line(run, 120.0, pgid=6666)]
    # the first repeat follows a kill; the second follows none of 5555's group
    check = _check(lines, [(104.0, "worker0", WORKER_GROUP)], 123.1, run)
    assert not check.ok
    check = _check(lines, [(104.0, "worker0", WORKER_GROUP), (114.0, "worker1", 5555)], 123.1, run)
    assert check.ok, check.failures
