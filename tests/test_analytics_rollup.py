"""The analytics rollup: folded runs are counted from ``AnalyticsRollup``, the rest row by row,
and the two parts always add up to what reading every row gives.

``build_report(window, rollup=False)`` reads every run of the window row by row (the
definition); each test compares the report a user sees with it, after folding, after
re-queueing, after deleting, on windows that cut slots in two, and with folders racing.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import close_old_connections, connection
from django.test.utils import CaptureQueriesContext

from streamrecover import dispatch, starter
from streamrecover.analytics import rollup
from streamrecover.analytics.definitions import ROLLUP_COUNTERS
from streamrecover.analytics.queries import Plan
from streamrecover.analytics.report import build_report
from streamrecover.analytics.windows import Window, slot_ceil, slot_floor
from streamrecover.models import AnalyticsRollup, RecoveryEvent, Run
from streamrecover.runs import lifecycle

from .factories import make_event, make_run
from .test_analytics import EXPECTED_TOTAL, A, History, _assert_figures, record_history

pytestmark = pytest.mark.django_db


def _same(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    """Two reports agree on every figure of every section and every point of the series."""
    assert actual["window"] == expected["window"]
    for section in ("totals", "groups", "series"):
        a, e = actual[section], expected[section]
        if section == "totals":
            a, e = [a], [e]
        assert len(a) == len(e), section
        for row_a, row_e in zip(a, e, strict=True):
            assert set(row_a) == set(row_e)
            for key, value in row_e.items():
                if isinstance(value, float):
                    assert row_a[key] == pytest.approx(value), (section, key)
                else:
                    assert row_a[key] == value, (section, key)


def _windows(history: History) -> list[Window]:
    start = history.start
    return [
        history.window(),  # whole slots: everything from the rollup
        Window(start + timedelta(minutes=7), start + timedelta(minutes=97)),  # cuts runs 7/8 and 12+ off
        Window(start + timedelta(minutes=3, seconds=30), start + timedelta(hours=1, minutes=10)),
        Window(start + timedelta(minutes=1), start + timedelta(minutes=11)),  # inside one slot and a bit
        history.window(provider="openai"),
        history.window(provider="anthropic", model="claude-x"),
        Window(start - timedelta(days=8, minutes=5), start + timedelta(hours=5)),  # daily points
    ]


def test_folded_reports_equal_reading_every_row() -> None:
    history = record_history()
    before = [build_report(w) for w in _windows(history)]  # nothing folded yet: all rows
    assert not AnalyticsRollup.objects.exists()
    assert rollup.fold_all() == Run.objects.count()
    assert AnalyticsRollup.objects.exists()
    for window, unfolded in zip(_windows(history), before, strict=True):
        _same(build_report(window), unfolded)
        _same(build_report(window), build_report(window, rollup=False))


def test_reports_read_the_rollup_for_whole_slots_and_rows_at_the_edges() -> None:
    """Proof of where figures come from: events deleted behind the rollup's back still count
    in whole slots (the rollup was read) and no longer in the edges (rows were read)."""
    history = record_history()
    rollup.fold_all()
    whole = history.window()
    _assert_figures(build_report(whole)["totals"], EXPECTED_TOTAL)
    RecoveryEvent.objects.all().delete()  # not how events ever go; the rollup is not told
    assert build_report(whole)["totals"]["interruptions"] == EXPECTED_TOTAL["interruptions"]
    assert build_report(whole, rollup=False)["totals"]["interruptions"] == 0
    # Runs 1-8 are created at start + 1..8 min: a window from +7 min reads slot [0, 15) row by row.
    edge = Window(history.start + timedelta(minutes=7), history.start + timedelta(minutes=15))
    assert build_report(edge)["totals"]["runs"] == 2
    assert build_report(edge)["totals"]["interruptions"] == 0


def test_slots_and_the_plan() -> None:
    moment = datetime(2026, 11, 29, 10, 7, 30, tzinfo=UTC)
    assert slot_floor(moment) == datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert slot_ceil(moment) == datetime(2026, 11, 29, 10, 15, tzinfo=UTC)
    on_edge = datetime(2026, 11, 29, 10, 45, tzinfo=UTC)
    assert slot_floor(on_edge) == slot_ceil(on_edge) == on_edge
    plan = Plan.of(Window(moment, moment + timedelta(hours=2)))
    assert (plan.slots_start, plan.slots_end) == (slot_ceil(moment), datetime(2026, 11, 29, 12, 0, tzinfo=UTC))
    assert not Plan.of(Window(moment, moment + timedelta(minutes=10))).uses_rollup  # no whole slot
    assert not Plan.of(Window(moment, moment + timedelta(hours=2)), rollup=False).uses_rollup


def test_the_rollup_has_a_column_for_every_additive_figure() -> None:
    """A new cause or plan needs its column (and a migration), or the rollup would file it under 'other'."""
    columns = {f.name for f in AnalyticsRollup._meta.concrete_fields} - {"id", "slot", "provider", "model"}
    assert columns == {*ROLLUP_COUNTERS, "recover_seconds"}


def test_folding_is_idempotent_and_leaves_going_runs_alone() -> None:
    history = record_history()
    going = make_run(provider=A[0], model=A[1], status="running", created=history.start + timedelta(minutes=20))
    make_event(going, "llm_stream_interrupted", payload={"cause": "idle_stall", "plan": "continue_text"})
    folded = rollup.fold_all()
    assert folded == Run.objects.count() - 1
    assert rollup.fold_all() == 0
    assert rollup.fold_runs([going.pk]) == 0
    going.refresh_from_db()
    assert not going.analytics_folded
    report = build_report(history.window())
    assert report["totals"]["runs"] == EXPECTED_TOTAL["runs"] + 1
    assert report["totals"]["interruptions"] == EXPECTED_TOTAL["interruptions"] + 1  # counted live
    _same(report, build_report(history.window(), rollup=False))
    # It ends: folded once, counted once.
    Run.objects.filter(pk=going.pk).update(status="failed")
    assert rollup.fold_runs([going.pk]) == 1
    after = build_report(history.window())
    assert after["totals"]["failed_runs"] == EXPECTED_TOTAL["failed_runs"] + 1
    assert after["totals"]["interruptions"] == report["totals"]["interruptions"]
    _same(after, build_report(history.window(), rollup=False))


def test_a_requeued_run_leaves_the_rollup_and_its_figures_follow_it() -> None:
    history = record_history()
    rollup.fold_all()
    exhausted = history.runs[next(k for k, r in history.runs.items() if r.status == "exhausted")]
    assert build_report(history.window())["totals"]["exhausted_runs"] == 1
    assert dispatch.requeue_run(exhausted.pk)
    exhausted.refresh_from_db()
    assert exhausted.status == "queued"
    assert not exhausted.analytics_folded
    report = build_report(history.window())
    assert report["totals"]["exhausted_runs"] == 0
    assert report["totals"]["interruptions"] == EXPECTED_TOTAL["interruptions"]  # its breaks still count, live
    _same(report, build_report(history.window(), rollup=False))


def test_a_deleted_run_leaves_the_rollup() -> None:
    history = record_history()
    rollup.fold_all()
    history.runs["clean"].delete()
    history.runs[next(iter(k for k in history.runs if k != "clean"))].thread.delete()  # cascades to its run
    report = build_report(history.window())
    assert report["totals"]["runs"] == EXPECTED_TOTAL["runs"] - 2
    _same(report, build_report(history.window(), rollup=False))


def test_a_stale_instance_saved_after_the_fold_does_not_unfold_the_run() -> None:
    run = make_run(status="completed")
    stale = Run.objects.get(pk=run.pk)
    rollup.fold_runs([run.pk])
    stale.error_message = "edited"
    stale.save()
    run.refresh_from_db()
    assert run.analytics_folded
    assert run.error_message == "edited"
    assert AnalyticsRollup.objects.get().runs == 1


def test_the_number_of_queries_stays_small_with_both_parts(history_both: History) -> None:
    window = Window(history_both.start + timedelta(minutes=7), history_both.start + timedelta(hours=3))
    with CaptureQueriesContext(connection) as queries:
        build_report(window)
    selects = [q for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(("SELECT", "WITH"))]
    assert len(selects) == 6  # rollup, the ids read row by row, runs, events, attempts, percentiles


@pytest.fixture
def history_both() -> History:
    history = record_history()
    rollup.fold_all()
    return history


def test_rollup_command_folds_and_rebuilds() -> None:
    history = record_history()
    expected = build_report(history.window(), rollup=False)
    out = _call("streamrecover_rollup")
    assert f"folded {Run.objects.count()} run(s)" in out
    assert "0 run(s) still counted row by row" in out
    rows = AnalyticsRollup.objects.count()
    _same(build_report(history.window()), expected)
    out = _call("streamrecover_rollup", "--rebuild")
    assert f"folded {Run.objects.count()} run(s)" in out
    assert f"{rows} rollup row(s)" in out
    _same(build_report(history.window()), expected)


def _call(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_folders_racing_fold_each_run_once() -> None:
    """Four folders at once (PostgreSQL, SKIP LOCKED): every run folded exactly once."""
    history = record_history()
    for _ in range(3):
        record_history(history.start)
    expected = build_report(history.window(), rollup=False)
    counts: list[int] = []
    errors: list[BaseException] = []

    def fold() -> None:
        try:
            counts.append(rollup.fold_all(batch=3))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=fold) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert sum(counts) == Run.objects.count()
    assert not Run.objects.filter(analytics_folded=False).exists()
    assert sum(AnalyticsRollup.objects.values_list("runs", flat=True)) == Run.objects.count()
    _same(build_report(history.window()), expected)


@pytest.mark.django_db(transaction=True)
def test_a_run_the_worker_finishes_is_folded_as_it_settles() -> None:
    """The real path: a run broken mid-stream by the fake provider, recovered, finished, folded."""
    run = lifecycle.create_run(prompt="Tell me a story [[words=120]]", faults=["cut:bytes=1200"])
    result = asyncio.run(starter.execute_here(str(run.pk)))
    assert result is not None
    assert result.status == "completed"
    run.refresh_from_db()
    assert run.analytics_folded
    row = AnalyticsRollup.objects.get()
    assert (row.runs, row.interrupted_runs, row.recovered_runs, row.recoveries) == (1, 1, 1, 1)
    assert row.cause_connection_reset == 1
    assert row.plan_continue_text == 1
    assert len(row.recover_seconds) == 1
    assert row.recover_seconds[0] >= 0
    window = Window(slot_floor(run.created) - timedelta(hours=1), slot_floor(run.created) + timedelta(hours=1))
    report = build_report(window)
    assert report["totals"]["recovered_runs"] == 1
    assert report["totals"]["tokens_saved"] > 0
    _same(report, build_report(window, rollup=False))


@pytest.mark.django_db(transaction=True)  # the task closes stale connections, as Celery tasks must
def test_the_periodic_task_folds_what_the_workers_did_not() -> None:
    """Runs settled without a fold (a history from before the rollup, a fold that failed): the beat task."""
    from streamrecover.tasks import fold_analytics_task

    history = record_history()
    queued = make_run(provider=A[0], model=A[1], created=history.start + timedelta(minutes=30))
    Run.objects.filter(pk=queued.pk).update(status="cancelled")  # as MAX_CLAIMS or a crash may leave it
    assert fold_analytics_task(limit=5) == 5
    assert fold_analytics_task() == Run.objects.count() - 5
    assert fold_analytics_task() == 0
    assert Run.objects.get(pk=queued.pk).analytics_folded
    _same(build_report(history.window()), build_report(history.window(), rollup=False))


@pytest.mark.django_db(transaction=True)
def test_a_run_cancelled_while_queued_is_folded_once_the_cancel_commits() -> None:
    queued = make_run(provider=A[0], model=A[1])
    assert lifecycle.request_cancel(queued.pk)
    queued.refresh_from_db()
    assert queued.status == "cancelled"
    assert queued.analytics_folded
    assert AnalyticsRollup.objects.get().runs == 1
