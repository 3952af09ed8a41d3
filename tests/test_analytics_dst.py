"""Hourly points across daylight-saving changes: local wall-clock hours, each run counted once.

A run is created in every 15-minute slot of a window across a change, in Australia/Lord_Howe
(a 30-minute change), Europe/Berlin (a 1-hour change) and Asia/Kathmandu (UTC+05:45, no
change). Half the runs are folded into the rollup, so both parts of a report are read. The
points a user gets (the JSON endpoint the page's charts draw) must be exactly the wall-clock
hours written out below: labelled on the hour, none missing or doubled, each holding the
runs created in that wall-clock hour (a repeated half hour or hour joins its wall-clock hour;
a skipped one has no point, and an hour half skipped has a point for the half that exists).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.test import Client, override_settings

from streamrecover.analytics import rollup
from streamrecover.analytics.report import build_report
from streamrecover.analytics.windows import SLOT, Window, buckets
from streamrecover.models import Run

from .factories import make_event, make_run, make_user

pytestmark = pytest.mark.django_db

JSON_URL = "/streamrecover/analytics.json"


@dataclass(frozen=True)
class Case:
    zone: str
    start: datetime  # UTC, on a slot
    end: datetime
    points: list[tuple[str, int]]  # the bucket labels a user sees, and the runs in each


CASES = [
    # Lord Howe, 5 April 2026: 02:00 +11:00 becomes 01:30 +10:30, so 01:30-02:00 happens twice
    # and the 01:00 hour lasts 90 minutes (six slots).
    Case(
        "Australia/Lord_Howe",
        datetime(2026, 4, 4, 12, 0, tzinfo=UTC),  # 23:00 +11:00
        datetime(2026, 4, 4, 17, 30, tzinfo=UTC),  # 04:00 +10:30
        [
            ("2026-04-04T23:00:00+11:00", 4),
            ("2026-04-05T00:00:00+11:00", 4),
            ("2026-04-05T01:00:00+11:00", 6),
            ("2026-04-05T02:00:00+10:30", 4),
            ("2026-04-05T03:00:00+10:30", 4),
        ],
    ),
    # Lord Howe, 4 October 2026: 02:00 +10:30 becomes 02:30 +11:00, so 02:00-02:30 never
    # happens and the 02:00 hour lasts 30 minutes (two slots, 02:30-03:00 +11:00).
    Case(
        "Australia/Lord_Howe",
        datetime(2026, 10, 3, 12, 30, tzinfo=UTC),  # 23:00 +10:30
        datetime(2026, 10, 3, 17, 0, tzinfo=UTC),  # 04:00 +11:00
        [
            ("2026-10-03T23:00:00+10:30", 4),
            ("2026-10-04T00:00:00+10:30", 4),
            ("2026-10-04T01:00:00+10:30", 4),
            ("2026-10-04T02:00:00+10:30", 2),
            ("2026-10-04T03:00:00+11:00", 4),
        ],
    ),
    # Berlin, 29 March 2026: 02:00 +01:00 becomes 03:00 +02:00; there is no 02:00 hour.
    Case(
        "Europe/Berlin",
        datetime(2026, 3, 28, 23, 0, tzinfo=UTC),  # 00:00 +01:00
        datetime(2026, 3, 29, 3, 0, tzinfo=UTC),  # 05:00 +02:00
        [
            ("2026-03-29T00:00:00+01:00", 4),
            ("2026-03-29T01:00:00+01:00", 4),
            ("2026-03-29T03:00:00+02:00", 4),
            ("2026-03-29T04:00:00+02:00", 4),
        ],
    ),
    # Berlin, 25 October 2026: 03:00 +02:00 becomes 02:00 +01:00; the 02:00 hour lasts two hours.
    Case(
        "Europe/Berlin",
        datetime(2026, 10, 24, 22, 0, tzinfo=UTC),  # 00:00 +02:00
        datetime(2026, 10, 25, 4, 0, tzinfo=UTC),  # 05:00 +01:00
        [
            ("2026-10-25T00:00:00+02:00", 4),
            ("2026-10-25T01:00:00+02:00", 4),
            ("2026-10-25T02:00:00+02:00", 8),
            ("2026-10-25T03:00:00+01:00", 4),
            ("2026-10-25T04:00:00+01:00", 4),
        ],
    ),
    # Kathmandu, UTC+05:45 all year: hours on the local hour, a quarter past in UTC.
    Case(
        "Asia/Kathmandu",
        datetime(2026, 4, 4, 18, 15, tzinfo=UTC),  # 00:00 +05:45
        datetime(2026, 4, 4, 22, 15, tzinfo=UTC),  # 04:00 +05:45
        [
            ("2026-04-05T00:00:00+05:45", 4),
            ("2026-04-05T01:00:00+05:45", 4),
            ("2026-04-05T02:00:00+05:45", 4),
            ("2026-04-05T03:00:00+05:45", 4),
        ],
    ),
]


def _record(case: Case) -> None:
    """One interrupted run 7 minutes into every slot of the window; every other one folded."""
    moment, folded = case.start, []
    while moment < case.end:
        run = make_run(provider="anthropic", model="claude-x", status="failed", created=moment + timedelta(minutes=7))
        make_event(run, "llm_stream_interrupted", payload={"cause": "idle_stall", "plan": "continue_text"})
        if len(folded) % 2 == 0:
            folded.append(run.pk)
        else:
            folded.append(None)
        moment += SLOT
    rollup.fold_runs([pk for pk in folded if pk is not None])
    assert Run.objects.filter(analytics_folded=True).exists()
    assert Run.objects.filter(analytics_folded=False).exists()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.zone}-{c.start:%m-%d}")
def test_hourly_points_are_the_local_wall_clock_hours(case: Case) -> None:
    _record(case)
    client = Client()
    client.force_login(make_user(is_staff=True))
    query = {"window": "custom", "start": case.start.isoformat(), "end": case.end.isoformat()}
    with override_settings(TIME_ZONE=case.zone):
        data = client.get(JSON_URL, query).json()
        unfolded = build_report(Window(case.start, case.end), rollup=False)
    assert data["window"]["bucket"] == "hour"
    assert [(p["bucket"], p["runs"]) for p in data["series"]] == case.points
    assert [(p["bucket"], p["interrupted_runs"]) for p in data["series"]] == case.points
    assert data["totals"]["runs"] == sum(runs for _, runs in case.points) == (case.end - case.start) / SLOT
    assert [(p["bucket"], p["runs"]) for p in unfolded["series"]] == case.points  # rollup or rows: the same


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.zone}-{c.start:%m-%d}")
def test_an_empty_window_has_the_same_grid(case: Case) -> None:
    with override_settings(TIME_ZONE=case.zone):
        grid = [b.isoformat() for b in buckets(Window(case.start, case.end))]
    assert grid == [label for label, _ in case.points]


def test_a_window_starting_mid_hour_starts_at_its_wall_clock_hour() -> None:
    """01:40 +10:30 on 5 April at Lord Howe is in the second 01:30-02:00: the 01:00 hour."""
    start = datetime(2026, 4, 4, 15, 10, tzinfo=UTC)
    assert start.astimezone(ZoneInfo("Australia/Lord_Howe")).isoformat() == "2026-04-05T01:40:00+10:30"
    with override_settings(TIME_ZONE="Australia/Lord_Howe"):
        grid = [b.isoformat() for b in buckets(Window(start, start + timedelta(hours=2)))]
    assert grid == ["2026-04-05T01:00:00+11:00", "2026-04-05T02:00:00+10:30", "2026-04-05T03:00:00+10:30"]
