"""Analytics figures against values computed by hand on a small recorded history.

``record_history`` records, with the factories and the engine's event payloads, one run of
every kind of outcome: clean, pre-stream retries, R1 (once, twice, resumed, and in two
turns), R2, R3 with a discarded tool call, R4, discarded thinking, exhausted, failed after a
break, cancelled, failed before streaming, and one interrupted run outside the window. The
expected numbers below are worked out in the comments, not by running the code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from streamrecover.analytics import definitions, queries, rollup
from streamrecover.analytics.queries import percentile_cont
from streamrecover.analytics.report import build_report
from streamrecover.analytics.windows import Window, parse_span
from streamrecover.models import Attempt, RecoveryEvent, Run

from .factories import make_attempt, make_event, make_run

pytestmark = pytest.mark.django_db

A = ("anthropic", "claude-x")
O = ("openai", "gpt-x")  # noqa: E741


@dataclass
class History:
    start: datetime  # the hour the window's runs start in
    runs: dict[str, Run]

    def window(self, **filters: str) -> Window:
        """Four hours around the runs: hourly buckets, the outside run left out."""
        return Window(self.start - timedelta(hours=1), self.start + timedelta(hours=3), **filters)


class _Recorder:
    """Writes one run's attempts and events the way the engine does, times relative to the run."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.turn = 0

    def at(self, seconds: float) -> datetime:
        return self.run.created + timedelta(seconds=seconds)

    def attempt(self, kind: str, outcome: str, input_tokens: int | None, output_tokens: int | None, **fields: Any):
        return make_attempt(
            self.run,
            kind=kind,
            outcome=outcome,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            turn=self.turn,
            started_at=self.run.created + timedelta(milliseconds=10 * (self.run.attempts.count() + 1)),
            **fields,
        )

    def event(self, name: str, seconds: float, **payload: Any) -> RecoveryEvent:
        run = self.run
        body = {
            "provider": run.provider,
            "model": run.model,
            "run_id": str(run.pk),
            "turn_id": f"{run.pk}:{self.turn}",
            "attempt": run.attempts.count() - 1,
            **payload,
        }
        return make_event(run, name, payload=body, created=self.at(seconds))

    def interrupted(self, seconds: float, cause: str, plan: str, kept_chars: int, cont: int = 0, **extra: Any):
        return self.event(
            "llm_stream_interrupted",
            seconds,
            continuation_attempt=cont,
            cause=cause,
            error_kind="sse_transport",
            error_message="broken",
            committed_text_blocks=1 if kept_chars else 0,
            committed_partial_text=bool(kept_chars),
            discarded_partial_tool_uses=extra.get("tools", 0),
            discarded_thinking_blocks=extra.get("thinking", 0),
            usage_flushed=False,
            plan=plan,
            kept_text_chars=kept_chars,
            kept_output_tokens_estimate=math.ceil(kept_chars / 4),
        )

    def started(self, seconds: float, cont: int, plan: str = "continue_text") -> RecoveryEvent:
        committed = {"text_blocks": 1, "text_chars": 0, "tool_calls": 0, "thinking_blocks": 0}
        return self.event(
            "llm_stream_continuation_started",
            seconds,
            continuation_attempt=cont,
            backoff_s=1,
            committed=committed,
            strategy="prefill",
            plan=plan,
        )

    def completed(self, seconds: float, cont: int, **extra: Any) -> RecoveryEvent:
        return self.event(
            "llm_stream_continuation_completed",
            seconds,
            continuation_attempt=cont,
            completion_reason="end_turn",
            **extra,
        )


def record_history(start: datetime | None = None) -> History:
    """The runs (A = anthropic/claude-x, O = openai/gpt-x); times are seconds after each run's creation."""
    if start is None:
        start = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    runs: dict[str, Run] = {}

    def run(key: str, n: int, group: tuple[str, str], status: str) -> _Recorder:
        # runs 1-8 in the first hour, 9-15 in the second
        created = start + timedelta(hours=0 if n <= 8 else 1, minutes=n)
        runs[key] = make_run(provider=group[0], model=group[1], status=status, created=created)
        return _Recorder(runs[key])

    # 1 clean (A)
    r = run("clean", 1, A, "completed")
    r.attempt("initial", "completed", 100, 50)

    # 2 two pre-stream retries, then streamed cleanly (A)
    r = run("retried", 2, A, "completed")
    r.attempt("initial", "request_failed", None, None, status_code=529)
    r.event("llm_request_retry", 0.1, status=529, error_kind="overloaded", retry_after_s=None, delay_s=0.1, retry=1)
    r.attempt("pre_stream_retry", "request_failed", None, None, status_code=529)
    r.event("llm_request_retry", 0.3, status=529, error_kind="overloaded", retry_after_s=None, delay_s=0.2, retry=2)
    r.attempt("pre_stream_retry", "completed", 100, 40)

    # 3 R1 once: kept 120 chars (30 tokens), recovered 10 s after the break (A)
    r = run("r1", 3, A, "completed")
    r.attempt("initial", "interrupted", 100, 30, interrupt_cause="connection_reset")
    r.interrupted(10, "connection_reset", "continue_text", 120)
    r.started(11, 1)
    r.attempt("continuation", "completed", 130, 70, continuation=1, strategy="prefill")
    r.completed(20, 1)

    # 4 R1 twice in one turn: kept 80 chars (20) then 160 (40); recovered 30 s after the first break (A)
    r = run("r1_twice", 4, A, "completed")
    r.attempt("initial", "interrupted", 100, 20, interrupt_cause="connection_reset")
    r.interrupted(5, "connection_reset", "continue_text", 80)
    r.started(6, 1)
    r.attempt("continuation", "interrupted", 120, 10, continuation=1, interrupt_cause="idle_stall")
    r.interrupted(15, "idle_stall", "continue_text", 160, cont=1)
    r.started(17, 2)
    r.attempt("continuation", "completed", 140, 60, continuation=2)
    r.completed(35, 2)

    # 5 R2: a complete tool call kept, a partial one (25 bytes) dropped; 40 chars (10) of text (A)
    r = run("r2", 5, A, "completed")
    r.attempt("initial", "interrupted", 100, 45, interrupt_cause="goaway")
    r.interrupted(8, "goaway", "synthesize_tool_use", 40, tools=1)
    r.event(
        "discarded_partial_tool_use",
        8,
        tool_name="search",
        tool_call_id="toolu_1",
        partial_input_bytes=25,
        reason="incomplete_arguments",
    )
    r.completed(8.5, 0, plan="synthesize_tool_use")

    # 6 R3: text kept (200 chars, 50), partial tool call (33 bytes) dropped, continued (O)
    r = run("r3", 6, O, "completed")
    r.attempt("initial", "interrupted", 200, 60, interrupt_cause="provider_error_mid_stream")
    r.interrupted(4, "provider_error_mid_stream", "truncate_before_tool", 200, tools=1)
    r.event(
        "discarded_partial_tool_use",
        4,
        tool_name="get_weather",
        tool_call_id="call_1",
        partial_input_bytes=33,
        reason="incomplete_arguments",
    )
    r.started(5, 1, "truncate_before_tool")
    r.attempt("continuation", "completed", 260, 90, continuation=1, strategy="continue_message")
    r.completed(12, 1)

    # 7 R4: nothing salvageable, the turn restarted (O)
    r = run("r4", 7, O, "completed")
    r.attempt("initial", "interrupted", 200, 5, interrupt_cause="idle_stall")
    r.interrupted(6, "idle_stall", "whole_restart", 0)
    r.started(7, 1, "whole_restart")
    r.attempt("restart", "completed", 200, 80, continuation=1)
    r.completed(26, 1)

    # 8 R1 with an unsigned thinking block (300 bytes) discarded; kept 100 chars (25) (A)
    r = run("thinking", 8, A, "completed")
    r.attempt("initial", "interrupted", 100, 40, interrupt_cause="sse_parse")
    r.interrupted(3, "sse_parse", "continue_text", 100, thinking=1)
    r.event("discarded_thinking", 3, kind="thinking", partial_bytes=300, reason="unsigned_partial_thinking")
    r.started(4, 1)
    r.attempt("continuation", "completed", 150, 30, continuation=1)
    r.completed(9, 1)

    # 9 exhausted after two continuations that broke again (A)
    r = run("exhausted", 9, A, "exhausted")
    r.attempt("initial", "interrupted", 100, 10, interrupt_cause="connection_reset")
    r.interrupted(2, "connection_reset", "continue_text", 40)
    r.started(3, 1)
    r.attempt("continuation", "interrupted", 110, 5, continuation=1, interrupt_cause="connection_reset")
    r.interrupted(6, "connection_reset", "continue_text", 60, cont=1)
    r.started(8, 2)
    r.attempt("continuation", "interrupted", 110, 5, continuation=2, interrupt_cause="connection_reset")
    r.interrupted(12, "connection_reset", "continue_text", 80, cont=2)
    r.event("llm_stream_continuation_exhausted", 12, attempts=2, final_reason="sse_transport")

    # 10 a permanent provider error after the break: failed, never continued (O)
    r = run("failed", 10, O, "failed")
    r.attempt("initial", "interrupted", 200, 20, interrupt_cause="provider_error_mid_stream")
    r.interrupted(2, "provider_error_mid_stream", "continue_text", 60)

    # 11 cancelled by the user during the backoff (A)
    r = run("cancelled", 11, A, "cancelled")
    r.attempt("initial", "interrupted", 100, 15, interrupt_cause="body_decode")
    r.interrupted(2, "body_decode", "continue_text", 20)

    # 12 failed before streaming (401): no event at all (A)
    r = run("failed_prestream", 12, A, "failed")
    r.attempt("initial", "request_failed", None, None, status_code=401)

    # 13 interrupted and recovered, but two days before the window (A): never counted
    r = _Recorder(make_run(provider=A[0], model=A[1], status="completed", created=start - timedelta(days=2)))
    runs["outside"] = r.run
    r.attempt("initial", "interrupted", 100, 10)
    r.interrupted(1, "connection_reset", "continue_text", 400)
    r.started(2, 1)
    r.attempt("continuation", "completed", 200, 100, continuation=1)
    r.completed(3, 1)

    # 14 two turns, each broken once and recovered: 40 chars (10) then 48 chars (12) (A)
    r = run("two_turns", 14, A, "completed")
    r.attempt("initial", "interrupted", 100, 10, interrupt_cause="connection_reset")
    r.interrupted(1, "connection_reset", "continue_text", 40)
    r.started(2, 1)
    r.attempt("continuation", "completed", 110, 20, continuation=1)
    r.completed(5, 1)
    r.turn = 1
    r.attempt("initial", "interrupted", 300, 12, interrupt_cause="goaway")
    r.interrupted(20, "goaway", "continue_text", 48)
    r.started(21, 1)
    r.attempt("continuation", "completed", 320, 25, continuation=1)
    r.completed(24, 1)

    # 15 the worker died during the continuation; another resumed from the checkpoint (A)
    r = run("resumed", 15, A, "completed")
    r.attempt("initial", "interrupted", 100, 16, interrupt_cause="connection_reset")
    r.interrupted(2, "connection_reset", "continue_text", 64)
    r.started(3, 1)
    r.attempt("continuation", "pending", None, None, continuation=1)
    r.event("llm_run_resumed", 40, plan="continue_text", committed={}, checkpoint_attempt=1, checkpoint_continuation=1)
    r.attempt("resume", "completed", 116, 30, continuation=1)
    r.completed(50, 1)

    return History(start, runs)


@pytest.fixture(params=["rows", "rollup"])
def history(request: pytest.FixtureRequest) -> History:
    """Every figure test twice: read row by row, and with the settled runs folded into the rollup."""
    recorded = record_history()
    if request.param == "rollup":
        assert rollup.fold_all() == Run.objects.count()  # every run of the history is settled
    return recorded


# ---- the expected figures, by hand ------------------------------------------------------------
#
# A (anthropic/claude-x): runs 1,2,3,4,5,8,9,11,12,14,15 = 11; O (openai/gpt-x): 6,7,10 = 3.

EXPECTED_A = {
    "runs": 11,
    "attempts": 24,  # 1+3+2+3+1+2+3+1+1+4+3
    "pre_stream_retries": 2,  # run 2
    "interrupted_runs": 8,  # 3,4,5,8,9,11,14,15
    "interruptions": 12,  # 1+2+1+1+3+1+2+1
    "interruption_rate": 8 / 11,
    "recovered_runs": 6,  # 3,4,5,8,14,15
    "exhausted_runs": 1,  # 9
    "failed_runs": 0,  # 12 failed without a break
    "recovery_rate": 6 / 8,
    "recoveries": 7,  # one completion each, two in run 14
    "continuations_per_recovered_run": 7 / 6,  # 1+2+0+1+(1+1)+1
    "time_to_recover_p50_s": 6.0,  # [0.5, 4, 4, 6, 10, 30, 48]: the 4th
    "time_to_recover_p95_s": 42.6,  # position 5.7: 30 + 0.7 * 18
    "discarded_tool_uses": 1,
    "partial_tool_use_incidence": 1 / 12,
    "discarded_tool_bytes": 25,
    "discarded_thinking_blocks": 1,
    "discarded_thinking_bytes": 300,
    "output_tokens_billed": 543,  # 50+40+100+90+45+70+20+15+0+67+46
    "output_tokens_delivered": 468,  # completed attempts 325 + salvaged 30+40+10+25+(10+12)+16 = 143
    "tokens_saved": 163,  # 30+(20+40)+10+25+(10+12)+16
    "continuation_input_tokens": 1306,  # 130+(120+140)+150+(110+110)+(110+320)+116
}
EXPECTED_O = {
    "runs": 3,
    "attempts": 5,
    "pre_stream_retries": 0,
    "interrupted_runs": 3,
    "interruptions": 3,
    "interruption_rate": 1.0,
    "recovered_runs": 2,  # 6, 7
    "exhausted_runs": 0,
    "failed_runs": 1,  # 10
    "recovery_rate": 2 / 3,
    "recoveries": 2,
    "continuations_per_recovered_run": 1.0,
    "time_to_recover_p50_s": 14.0,  # [8, 20]
    "time_to_recover_p95_s": 19.4,  # 8 + 0.95 * 12
    "discarded_tool_uses": 1,
    "partial_tool_use_incidence": 1 / 3,
    "discarded_tool_bytes": 33,
    "discarded_thinking_blocks": 0,
    "discarded_thinking_bytes": 0,
    "output_tokens_billed": 255,  # 150+85+20
    "output_tokens_delivered": 220,  # completed 90+80, salvaged 50 (R3) + 0 (R4)
    "tokens_saved": 50,  # R4 saves nothing
    "continuation_input_tokens": 260,  # a restart is not a continuation
}
EXPECTED_TOTAL = {
    "runs": 14,
    "attempts": 29,
    "pre_stream_retries": 2,
    "interrupted_runs": 11,
    "interruptions": 15,
    "interruption_rate": 11 / 14,
    "recovered_runs": 8,
    "exhausted_runs": 1,
    "failed_runs": 1,
    "recovery_rate": 8 / 11,
    "recoveries": 9,
    "continuations_per_recovered_run": 9 / 8,
    "time_to_recover_p50_s": 8.0,  # [0.5, 4, 4, 6, 8, 10, 20, 30, 48]: the 5th
    "time_to_recover_p95_s": 40.8,  # position 7.6: 30 + 0.6 * 18
    "discarded_tool_uses": 2,
    "partial_tool_use_incidence": 2 / 15,
    "discarded_tool_bytes": 58,
    "discarded_thinking_blocks": 1,
    "discarded_thinking_bytes": 300,
    "output_tokens_billed": 798,
    "output_tokens_delivered": 688,
    "tokens_saved": 213,
    "continuation_input_tokens": 1566,
}
CAUSES_TOTAL = {
    "connection_reset": 7,  # 3, 4, 9 x3, 14, 15
    "idle_stall": 2,  # 4, 7
    "goaway": 2,  # 5, 14
    "provider_error_mid_stream": 2,  # 6, 10
    "sse_parse": 1,
    "body_decode": 1,
    "stream_deadline": 0,
    "max_tokens_exceeded": 0,
    "unknown": 0,
    "other": 0,
}
PLANS_TOTAL = {
    "continue_text": 12,
    "synthesize_tool_use": 1,
    "truncate_before_tool": 1,
    "whole_restart": 1,
    "native_resume": 0,
    "other": 0,
}


def _assert_figures(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    for key, value in expected.items():
        if isinstance(value, float):
            assert actual[key] == pytest.approx(value), key
        else:
            assert actual[key] == value, key


def test_totals_match_the_hand_computed_values(history: History) -> None:
    report = build_report(history.window())
    _assert_figures(report["totals"], EXPECTED_TOTAL)
    assert report["totals"]["interruptions_by_cause"] == CAUSES_TOTAL
    assert report["totals"]["interruptions_by_plan"] == PLANS_TOTAL


def test_each_provider_and_model(history: History) -> None:
    report = build_report(history.window())
    groups = {(g["provider"], g["model"]): g for g in report["groups"]}
    assert set(groups) == {A, O}
    _assert_figures(groups[A], EXPECTED_A)
    _assert_figures(groups[O], EXPECTED_O)
    assert groups[O]["interruptions_by_cause"]["provider_error_mid_stream"] == 2
    assert groups[O]["interruptions_by_plan"] == {
        "continue_text": 1,
        "synthesize_tool_use": 0,
        "truncate_before_tool": 1,
        "whole_restart": 1,
        "native_resume": 0,
        "other": 0,
    }


def test_provider_and_model_filters(history: History) -> None:
    report = build_report(history.window(provider="openai"))
    assert [(g["provider"], g["model"]) for g in report["groups"]] == [O]
    _assert_figures(report["totals"], EXPECTED_O)
    report = build_report(history.window(provider="anthropic", model="claude-x"))
    _assert_figures(report["totals"], EXPECTED_A)
    assert build_report(history.window(model="nope"))["totals"]["runs"] == 0


def test_series_is_hourly_and_adds_up_to_the_totals(history: History) -> None:
    report = build_report(history.window())
    assert report["window"]["bucket"] == "hour"
    points = report["series"]
    assert [p["bucket"] for p in points] == [(history.start + timedelta(hours=h)).isoformat() for h in (-1, 0, 1, 2)]
    assert [(p["runs"], p["interrupted_runs"], p["recovered_runs"]) for p in points] == [
        (0, 0, 0),
        (8, 6, 6),  # runs 1-8: 3,4,5,6,7,8 broke, all recovered
        (6, 5, 2),  # runs 9-12, 14, 15: 9,10,11,14,15 broke; 14, 15 recovered
        (0, 0, 0),
    ]
    assert points[1]["interruption_rate"] == pytest.approx(6 / 8)
    assert points[0]["interruption_rate"] is None
    for key in ("runs", "interrupted_runs", "recovered_runs"):
        assert sum(p[key] for p in points) == report["totals"][key]


def test_buckets_follow_the_current_time_zone(history: History) -> None:
    """Asia/Kolkata is UTC+05:30: local hours start at half past a UTC hour."""
    with override_settings(TIME_ZONE="Asia/Kolkata"):
        report = build_report(history.window())
    points = [p for p in report["series"] if p["runs"]]
    assert all(p["bucket"].endswith(":00:00+05:30") for p in report["series"])
    assert [datetime.fromisoformat(p["bucket"]).astimezone(UTC).minute for p in points] == [30, 30]
    assert [(p["runs"], p["interrupted_runs"], p["recovered_runs"]) for p in points] == [(8, 6, 6), (6, 5, 2)]
    with override_settings(TIME_ZONE="Asia/Kolkata"):
        daily = build_report(Window(history.start - timedelta(days=8), history.start + timedelta(hours=3)))
    assert all(p["bucket"].endswith("T00:00:00+05:30") for p in daily["series"])
    assert sum(p["interrupted_runs"] for p in daily["series"]) == daily["totals"]["interrupted_runs"] == 12


def test_long_windows_have_daily_points(history: History) -> None:
    window = Window(history.start - timedelta(days=9), history.start + timedelta(days=1))
    report = build_report(window)
    assert report["window"]["bucket"] == "day"
    assert len(report["series"]) in (10, 11)
    assert sum(p["runs"] for p in report["series"]) == 15  # the outside run is in this window


def test_an_empty_window_has_no_ratios() -> None:
    report = build_report(Window.last(timedelta(hours=24)))
    totals = report["totals"]
    assert totals["runs"] == 0
    assert totals["interruption_rate"] is None
    assert totals["recovery_rate"] is None
    assert totals["time_to_recover_p50_s"] is None
    assert report["groups"] == []
    assert len(report["series"]) in (24, 25)


def test_percentiles_without_percentile_cont_match(history: History, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite path (durations list, percentiles in Python) gives PostgreSQL's numbers."""
    in_db = build_report(history.window())
    monkeypatch.setattr(queries, "_uses_percentile_cont", lambda queryset: False)
    in_python = build_report(history.window())
    for section in ("totals", *range(len(in_db["groups"]))):
        db = in_db["totals"] if section == "totals" else in_db["groups"][section]
        py = in_python["totals"] if section == "totals" else in_python["groups"][section]
        for key in ("time_to_recover_p50_s", "time_to_recover_p95_s"):
            assert py[key] == pytest.approx(db[key]), (section, key)
    _assert_figures(in_python["totals"], EXPECTED_TOTAL)


def test_percentile_cont_interpolates_like_postgresql() -> None:
    assert percentile_cont([], 0.5) is None
    assert percentile_cont([7.0], 0.95) == 7.0
    assert percentile_cont([8, 20], 0.5) == 14
    assert percentile_cont([30, 0.5, 4, 10, 6, 4, 48], 0.95) == pytest.approx(42.6)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY x) FROM unnest(%s::float8[]) x",
            [[30.0, 0.5, 4.0, 10.0, 6.0, 4.0, 48.0]],
        )
        assert cursor.fetchone()[0] == pytest.approx(42.6)


def test_the_number_of_queries_does_not_grow_with_the_history(history: History) -> None:
    """Whatever the rows: with the rollup, runs not yet folded add their three row-by-row queries."""
    with CaptureQueriesContext(connection) as small:
        build_report(history.window())
    record_history(history.start)  # twice the rows (not folded)
    with CaptureQueriesContext(connection) as large:
        report = build_report(history.window())
    record_history(history.start)
    with CaptureQueriesContext(connection) as larger:
        build_report(history.window())
    assert report["totals"]["runs"] == 28
    assert len(larger.captured_queries) == len(large.captured_queries) <= 10
    assert len(small.captured_queries) <= len(large.captured_queries)


def test_every_figure_is_defined_once_and_reported() -> None:
    keys = [f.key for f in definitions.DEFINITIONS]
    assert len(keys) == len(set(keys))
    report = build_report(Window.last(timedelta(hours=1)))
    assert list(report["totals"]) == keys
    assert [d["key"] for d in report["definitions"]] == keys
    assert all(f.definition and f.label for f in definitions.DEFINITIONS)


def test_docs_carry_the_definitions_table() -> None:
    docs = Path(__file__).resolve().parents[1] / "docs" / "analytics.md"
    assert definitions.definitions_markdown() in docs.read_text()


def test_windows_and_spans() -> None:
    assert parse_span("24h") == timedelta(hours=24)
    assert parse_span(" 7d ") == timedelta(days=7)
    assert parse_span("2w") == timedelta(weeks=2)
    for bad in ("", "0d", "7", "1y", "-1d"):
        with pytest.raises(ValueError, match="window"):
            parse_span(bad)
    now = timezone.now()
    with pytest.raises(ValueError, match="before"):
        Window(now, now)
    assert Window.last(timedelta(days=7), now=now).bucket == "hour"
    assert Window.last(timedelta(days=8), now=now).bucket == "day"


# ---- the columns analytics reads ------------------------------------------------------------------


def test_event_columns_come_from_the_payload_and_the_runs_history(history: History) -> None:
    run = history.runs["r1_twice"]
    first, second = RecoveryEvent.objects.filter(run=run, name="llm_stream_interrupted").order_by("created")
    assert (first.cause, first.plan, first.kept_tokens, first.continuation, first.turn) == (
        "connection_reset",
        "continue_text",
        20,
        0,
        0,
    )
    assert first.first_in_run
    assert not second.first_in_run
    assert (second.cause, second.kept_tokens, second.continuation) == ("idle_stall", 40, 1)
    completion = RecoveryEvent.objects.get(run=run, name="llm_stream_continuation_completed")
    assert completion.first_break_at == first.created
    assert (completion.salvaged_tokens, completion.saved_tokens, completion.continuation) == (40, 60, 2)
    tool = RecoveryEvent.objects.get(run=history.runs["r2"], name="discarded_partial_tool_use")
    assert tool.discarded_bytes == 25
    thinking = RecoveryEvent.objects.get(run=history.runs["thinking"], name="discarded_thinking")
    assert thinking.discarded_bytes == 300
    restart = RecoveryEvent.objects.get(run=history.runs["r4"], name="llm_stream_continuation_completed")
    assert (restart.salvaged_tokens, restart.saved_tokens) == (0, 0)


def test_second_turn_links_to_its_own_break(history: History) -> None:
    completions = RecoveryEvent.objects.filter(
        run=history.runs["two_turns"], name="llm_stream_continuation_completed"
    ).order_by("created")
    assert [(c.turn, c.salvaged_tokens, c.first_in_run) for c in completions] == [(0, 10, True), (1, 12, False)]
    assert [(c.created - c.first_break_at).total_seconds() for c in completions] == [4.0, 4.0]


def test_from_payload_fills_what_save_fills(history: History) -> None:
    """bulk_create skips save(): from_payload with the earlier events gives the same row."""
    run = history.runs["r1_twice"]
    saved = list(RecoveryEvent.objects.filter(run=run).order_by("created", "id"))
    earlier: list[Any] = []
    columns = ("turn", "attempt", "cause", "plan", "continuation", "kept_tokens", "discarded_bytes")
    columns += ("first_in_run", "first_break_at", "salvaged_tokens", "saved_tokens")
    for row in saved:
        built = RecoveryEvent.from_payload(
            run_id=run.pk, name=row.name, payload=row.payload, earlier=earlier, created=row.created
        )
        assert [getattr(built, c) for c in columns] == [getattr(row, c) for c in columns]
        earlier.append(built.as_earlier())


def test_events_created_the_old_way_still_work() -> None:
    """RecoveryEvent.objects.create(run=..., name=..., payload=...) as the recorder calls it."""
    run = make_run()
    event = RecoveryEvent.objects.create(
        run=run, name="llm_stream_interrupted", payload={"cause": "goaway", "turn_id": f"{run.pk}:3"}
    )
    assert (event.cause, event.turn, event.first_in_run, event.plan, event.kept_tokens) == ("goaway", 3, True, "", None)
    explicit = RecoveryEvent.objects.create(run=run, name="discarded_thinking", turn=1, payload={"turn_id": "x:4"})
    assert explicit.turn == 1
    with pytest.raises(ValueError, match="append-only"):
        event.save()


def test_attempt_rows_are_not_touched(history: History) -> None:
    # Analytics reads; it never writes (a report twice gives the same answer).
    before = list(Attempt.objects.order_by("pk").values_list("pk", "outcome"))
    assert build_report(history.window()) == build_report(history.window())
    assert list(Attempt.objects.order_by("pk").values_list("pk", "outcome")) == before
