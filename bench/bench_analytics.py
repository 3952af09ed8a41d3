"""Analytics at scale: a recorded history of over a million ``RecoveryEvent`` rows in PostgreSQL,
then the query layer, the JSON endpoint and the stats command timed on it.

The history is synthetic but shaped like the engine's output (its structured events): per run, the
attempts and the events of one of a dozen outcomes (clean, pre-stream retry, R1 once or
twice, R2, R3 with a discarded tool call, R4, discarded thinking, exhausted, failed after a
break, cancelled, failed before streaming), spread over 90 days and five provider/model
pairs. Rows go in with ``COPY`` in batches; event columns are filled by
``RecoveryEvent.from_payload``, the same code ``save()`` runs.

It uses its own database (``streamrecover_analytics_bench``, created when missing, never the test
database) and keeps the data between runs; ``--regenerate`` starts again. Figures go to the
analytics section of ``BENCHMARKS.md`` (``make bench-analytics``); ``--explain`` adds the query
plans (EXPLAIN ANALYZE).

Run: ``.venv/bin/python -m bench.bench_analytics`` (``--help`` for sizes).
No assertion on speed here or in the tests.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

BENCH_DB = "streamrecover_analytics_bench"  # its own: other benchmarks use streamrecover_bench
PG_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432")
# Read back by ``bench.report`` into the analytics section of BENCHMARKS.md.
RESULTS = Path(tempfile.gettempdir()) / "streamrecover-analytics-results.md"
SPAN_DAYS = 90

PAIRS = (
    ("anthropic", "claude-sonnet-4-5", 0.35),
    ("anthropic", "claude-opus-4-1", 0.15),
    ("openai", "gpt-4.1", 0.25),
    ("openai", "gpt-4o-mini", 0.15),
    ("fake", "fake-model", 0.10),
)
SCENARIOS = (
    ("clean", 0.52),
    ("clean_retry", 0.06),
    ("r1", 0.16),
    ("r1_twice", 0.04),
    ("r3", 0.05),
    ("r2", 0.04),
    ("r4", 0.04),
    ("thinking", 0.03),
    ("exhausted", 0.025),
    ("failed", 0.02),
    ("cancelled", 0.015),
    ("failed_prestream", 0.01),
)
CAUSES = ("connection_reset", "idle_stall", "goaway", "provider_error_mid_stream", "sse_parse", "body_decode")
CAUSE_WEIGHTS = (0.45, 0.2, 0.1, 0.2, 0.03, 0.02)
ERROR_KINDS = {
    "connection_reset": "sse_transport",
    "goaway": "sse_transport",
    "idle_stall": "idle_stall",
    "provider_error_mid_stream": "provider_error",
    "sse_parse": "sse_parse",
    "body_decode": "body_decode",
}

RUN_COLUMNS = [
    "id",
    "thread_id",
    "status",
    "provider",
    "model",
    "options",
    "cancel_requested",
    "cancel_reason",
    "claims",
    "claim_epoch",
    "worker",
    "error_kind",
    "error_message",
    "input_tokens",
    "output_tokens",
    "attempt_count",
    "continuation_count",
    "created",
    "started_at",
    "finished_at",
    "analytics_folded",
]
ATTEMPT_COLUMNS = [
    "run_id",
    "turn",
    "index",
    "kind",
    "continuation",
    "strategy",
    "status_code",
    "provider_request_id",
    "started_at",
    "first_byte_at",
    "ended_at",
    "input_tokens",
    "output_tokens",
    "bytes_received",
    "interrupt_cause",
    "error_kind",
    "error_message",
    "stop_reason",
    "outcome",
    "request",
    "usage_estimated",
]
EVENT_COLUMNS = [
    "run_id",
    "attempt",
    "turn",
    "name",
    "provider",
    "model",
    "payload",
    "created",
    "cause",
    "plan",
    "continuation",
    "kept_tokens",
    "discarded_bytes",
    "first_in_run",
    "first_break_at",
    "salvaged_tokens",
    "saved_tokens",
]


def setup_django(database: str = BENCH_DB) -> None:
    """The demo project's settings on the bench database (created when missing)."""
    import psycopg

    with psycopg.connect(f"{PG_URL}/postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')
    os.environ["DATABASE_URL"] = f"{PG_URL}/{database}"
    os.environ.pop("REDIS_URL", None)
    os.environ["DJANGO_DEBUG"] = "0"  # no query log in memory
    os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver,localhost"
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


# ---- the synthetic history ----------------------------------------------------------------


@dataclass(slots=True)
class Rows:
    runs: list[tuple[Any, ...]] = field(default_factory=list)
    attempts: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)


class RunBuilder:
    """One run's attempts and events, times relative to its creation."""

    def __init__(self, rows: Rows, rng: random.Random, run_id: uuid.UUID, provider: str, model: str, t0: datetime):
        self.rows, self.rng, self.run_id, self.provider, self.model = rows, rng, run_id, provider, model
        self.t = t0 + timedelta(milliseconds=rng.randint(50, 400))
        self.index = -1
        self.continuation = 0
        self.input_base = rng.randint(300, 6000)
        self.totals = [0, 0, 0, 0]  # input, output, attempts, continuation attempts
        self.earlier: list[Any] = []  # EarlierEvent of the run's recorded events

    def later(self, low: float, high: float) -> datetime:
        self.t += timedelta(seconds=self.rng.uniform(low, high))
        return self.t

    def attempt(
        self, kind: str, outcome: str, *, output: int | None, input_extra: int = 0, cause: str = "", **extra: Any
    ) -> None:
        self.index += 1
        started = self.later(0.05, 0.3)
        first_byte = (
            started + timedelta(milliseconds=self.rng.randint(200, 1500)) if outcome != "request_failed" else None
        )
        ended = self.later(1.0, 40.0) if outcome != "request_failed" else self.later(0.05, 0.5)
        input_tokens = None if outcome == "request_failed" else self.input_base + input_extra
        self.rows.attempts.append(
            (
                self.run_id,
                0,
                self.index,
                kind,
                self.continuation,
                extra.get("strategy", ""),
                extra.get("status_code", 200),
                f"req_{self.rng.getrandbits(64):016x}",
                started,
                first_byte,
                ended,
                input_tokens,
                output,
                (output or 0) * 4,
                cause,
                extra.get("error_kind", ERROR_KINDS.get(cause, "")),
                extra.get("error_message", ""),
                "end_turn" if outcome == "completed" else "",
                outcome,
                "{}",
                outcome == "interrupted",  # a broken attempt's usage is the engine's estimate
            )
        )
        self.totals[0] += input_tokens or 0
        self.totals[1] += output or 0
        self.totals[2] += 1
        self.totals[3] += kind == "continuation"

    def event(self, name: str, **payload: Any) -> None:
        from streamrecover.models import RecoveryEvent

        created = self.later(0.001, 0.05)
        body = {
            "provider": self.provider,
            "model": self.model,
            "run_id": str(self.run_id),
            "turn_id": f"{self.run_id}:0",
            "attempt": self.index,
            **payload,
        }
        row = RecoveryEvent.from_payload(
            run_id=self.run_id,
            name=name,
            payload=body,
            earlier=self.earlier,
            provider=self.provider,
            model=self.model,
            created=created,
        )
        self.earlier.append(row.as_earlier())
        self.rows.events.append(
            (
                row.run_id,
                row.attempt,
                row.turn,
                name,
                self.provider,
                self.model,
                json.dumps(body, separators=(",", ":")),
                *(getattr(row, column) for column in EVENT_COLUMNS[7:]),
            )
        )

    def interrupt(self, plan: str, kept_chars: int, cause: str | None = None, **counts: int) -> str:
        cause = cause or self.rng.choices(CAUSES, CAUSE_WEIGHTS)[0]
        self.event(
            "llm_stream_interrupted",
            continuation_attempt=self.continuation,
            cause=cause,
            error_kind=ERROR_KINDS[cause],
            error_message="stream broke",
            committed_text_blocks=1 if kept_chars else 0,
            committed_partial_text=bool(kept_chars),
            discarded_partial_tool_uses=counts.get("tools", 0),
            discarded_thinking_blocks=counts.get("thinking", 0),
            usage_flushed=False,
            plan=plan,
            kept_text_chars=kept_chars,
            kept_output_tokens_estimate=-(-kept_chars // 4),
        )
        return cause

    def start_continuation(self, plan: str, kept_chars: int) -> None:
        self.continuation += 1
        backoff = [1, 2, 4, 8, 16][min(self.continuation, 5) - 1]
        self.later(backoff, backoff + 0.5)
        self.event(
            "llm_stream_continuation_started",
            continuation_attempt=self.continuation,
            backoff_s=backoff,
            committed={"text_blocks": 1, "text_chars": kept_chars, "tool_calls": 0, "thinking_blocks": 0},
            strategy="prefill" if self.provider == "anthropic" else "continue_message",
            plan=plan,
        )

    def complete(self, **extra: Any) -> None:
        self.event(
            "llm_stream_continuation_completed",
            continuation_attempt=self.continuation,
            completion_reason="end_turn",
            **extra,
        )

    def finish(self, status: str, t0: datetime, thread_id: int, error_kind: str = "") -> None:
        self.rows.runs.append(
            (
                self.run_id,
                thread_id,
                status,
                self.provider,
                self.model,
                "{}",
                status == "cancelled",
                "user" if status == "cancelled" else "",
                1,
                1,  # claim_epoch: claimed once
                "bench-worker",
                error_kind,
                "",
                self.totals[0],
                self.totals[1],
                self.totals[2],
                self.totals[3],
                t0,
                t0 + timedelta(milliseconds=50),
                self.later(0.01, 0.2),
                False,  # folded into the rollup after the COPY, as `streamrecover_rollup` does
            )
        )


def play(b: RunBuilder, scenario: str) -> tuple[str, str]:
    """Record one scenario; returns the run's final status and error kind."""
    rng = b.rng
    out = rng.randint(150, 2500)
    kept = rng.randint(200, 6000)
    kept_tokens = -(-kept // 4)
    strategy = "prefill" if b.provider == "anthropic" else "continue_message"
    if scenario in ("clean", "clean_retry"):
        if scenario == "clean_retry":
            b.attempt("initial", "request_failed", output=None, status_code=529, error_kind="overloaded")
            b.event("llm_request_retry", status=529, error_kind="overloaded", retry_after_s=None, delay_s=1, retry=1)
            b.attempt("pre_stream_retry", "completed", output=out)
        else:
            b.attempt("initial", "completed", output=out)
        return "completed", ""
    if scenario == "failed_prestream":
        b.attempt("initial", "request_failed", output=None, status_code=401, error_kind="unauthorized")
        return "failed", "unauthorized"
    if scenario == "r2":
        b.attempt("initial", "interrupted", output=kept_tokens + 40, cause="connection_reset")
        tools = rng.random() < 0.5
        b.interrupt("synthesize_tool_use", kept, tools=int(tools))
        if tools:
            b.event(
                "discarded_partial_tool_use",
                tool_name="search",
                tool_call_id=f"toolu_{rng.getrandbits(48):x}",
                partial_input_bytes=rng.randint(10, 400),
                reason="incomplete_arguments",
            )
        b.complete(plan="synthesize_tool_use")
        return "completed", ""
    if scenario == "r4":
        b.attempt("initial", "interrupted", output=rng.randint(0, 30), cause="idle_stall")
        b.interrupt("whole_restart", 0)
        b.start_continuation("whole_restart", 0)
        b.attempt("restart", "completed", output=out)
        b.complete()
        return "completed", ""
    if scenario == "exhausted":
        b.attempt("initial", "interrupted", output=kept_tokens)
        cause = b.interrupt("continue_text", kept)
        for _ in range(5):
            b.start_continuation("continue_text", kept)
            grown = rng.randint(0, 400)
            b.attempt("continuation", "interrupted", output=grown // 4, input_extra=-(-kept // 4), strategy=strategy)
            kept += grown
            cause = b.interrupt("continue_text", kept, cause=cause)
        b.event("llm_stream_continuation_exhausted", attempts=5, final_reason=ERROR_KINDS[cause])
        return "exhausted", "exhausted"
    if scenario == "failed":
        b.attempt("initial", "interrupted", output=kept_tokens, cause="provider_error_mid_stream")
        b.interrupt("continue_text", kept, cause="provider_error_mid_stream")
        b.start_continuation("continue_text", kept)
        b.attempt("continuation", "request_failed", output=None, status_code=400, error_kind="invalid_request")
        b.event(
            "llm_stream_continuation_failed", continuation_attempt=1, error_kind="invalid_request", error_message=""
        )
        return "failed", "invalid_request"
    if scenario == "cancelled":
        b.attempt("initial", "interrupted", output=kept_tokens)
        b.interrupt("continue_text", kept)
        return "cancelled", ""
    # r1, r1_twice, r3, thinking: text kept, continued, completed
    plan = "truncate_before_tool" if scenario == "r3" else "continue_text"
    b.attempt("initial", "interrupted", output=kept_tokens + 20)
    b.interrupt(plan, kept, tools=int(scenario == "r3"), thinking=int(scenario == "thinking"))
    if scenario == "r3":
        b.event(
            "discarded_partial_tool_use",
            tool_name="get_weather",
            tool_call_id=f"toolu_{rng.getrandbits(48):x}",
            partial_input_bytes=rng.randint(10, 400),
            reason="incomplete_arguments",
        )
    if scenario == "thinking":
        b.event("discarded_thinking", kind="thinking", partial_bytes=rng.randint(100, 4000), reason="unsigned")
    b.start_continuation(plan, kept)
    if scenario == "r1_twice":
        grown = rng.randint(50, 800)
        b.attempt("continuation", "interrupted", output=grown // 4, input_extra=kept_tokens, strategy=strategy)
        kept += grown
        b.interrupt("continue_text", kept)
        b.start_continuation("continue_text", kept)
    b.attempt("continuation", "completed", output=out, input_extra=-(-kept // 4), strategy=strategy)
    b.complete()
    return "completed", ""


def generate(runs: int, seed: int, end: datetime, batch: int = 40_000) -> dict[str, int]:
    """COPY ``runs`` runs (and their threads, attempts and events) in batches."""
    from django.db import connection

    rng = random.Random(seed)
    start = end - timedelta(days=SPAN_DAYS)
    span_s = SPAN_DAYS * 86400
    pair_weights = [w for *_, w in PAIRS]
    scenario_names = [s for s, _ in SCENARIOS]
    scenario_weights = [w for _, w in SCENARIOS]
    counts = {"runs": 0, "attempts": 0, "events": 0, "threads": 0}
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE streamrecover_recoveryevent, streamrecover_attempt, streamrecover_message, "
            "streamrecover_streamcheckpoint, streamrecover_run, streamrecover_thread, "
            "streamrecover_analyticsrollup RESTART IDENTITY CASCADE"
        )
    raw = connection.connection  # psycopg 3 connection
    with raw.cursor() as cur:
        # The rows are consistent by construction: skip the per-row foreign key triggers.
        cur.execute("SET session_replication_role = replica")
    threads_per_run = 8
    for offset in range(0, runs, batch):
        n = min(batch, runs - offset)
        rows = Rows()
        thread_ids = range(offset // threads_per_run + 1, (offset + n - 1) // threads_per_run + 2)
        pairs = rng.choices(PAIRS, pair_weights, k=n)
        scenarios = rng.choices(scenario_names, scenario_weights, k=n)
        for i in range(n):
            provider, model, _ = pairs[i]
            # Runs arrive in time order, as in a real table (its heap is then in time order too).
            t0 = start + timedelta(seconds=(offset + i + rng.random()) * span_s / runs)
            run_id = uuid.UUID(int=rng.getrandbits(128), version=4)
            builder = RunBuilder(rows, rng, run_id, provider, model, t0)
            status, error_kind = play(builder, scenarios[i])
            builder.finish(status, t0, (offset + i) // threads_per_run + 1, error_kind)
        with raw.cursor() as cur:
            with cur.copy("COPY streamrecover_thread (id, title, created, pending_notices) FROM STDIN") as copy:
                for tid in thread_ids:
                    if tid > counts["threads"]:
                        copy.write_row((tid, f"bench thread {tid}", start, "[]"))
                        counts["threads"] = tid
            for table, columns, data in (
                ("streamrecover_run", RUN_COLUMNS, rows.runs),
                ("streamrecover_attempt", ATTEMPT_COLUMNS, rows.attempts),
                ("streamrecover_recoveryevent", EVENT_COLUMNS, rows.events),
            ):
                with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in data:
                        copy.write_row(row)
        raw.commit()
        counts["runs"] += len(rows.runs)
        counts["attempts"] += len(rows.attempts)
        counts["events"] += len(rows.events)
        print(
            f"  {counts['runs']:>9,} runs {counts['attempts']:>10,} attempts {counts['events']:>10,} events", flush=True
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval('streamrecover_thread_id_seq', %s)", [counts["threads"]])
    return counts


def vacuum_analyze(database: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_URL}/{database}", autocommit=True) as conn:
        for table in ("streamrecover_run", "streamrecover_attempt", "streamrecover_recoveryevent"):
            conn.execute(f"VACUUM (ANALYZE) {table}")


# ---- timing -----------------------------------------------------------------------------------


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, float]:
    """(first, best, median) wall seconds over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times[0], min(times), statistics.median(times)


def explain(queryset: Any) -> str:
    return queryset.explain(analyze=True, buffers=True)


def query_parts(window: Any) -> Iterator[tuple[str, Callable[[], Any], Any]]:
    """Each query of one report: its name, a call that runs it, and a queryset to EXPLAIN."""
    from streamrecover.analytics import queries as q

    plan = q.Plan.of(window).pinned()  # as build_report does, in its transaction
    yield "runs read row by row: their ids", lambda: q.Plan.of(window).pinned(), None
    yield "rollup by group and bucket", lambda: list(q.rollup_rows(window, plan)), q.rollup_rows(window, plan)
    runs = q.run_rows(window, plan.rows)
    yield "runs row by row (edges, unfolded)", lambda: list(q.run_rows(window, plan.rows)), runs
    yield "events row by row", lambda: list(q.event_rows(window, plan.rows)), q.event_rows(window, plan.rows)
    yield "attempts row by row", lambda: list(q.attempt_rows(plan.rows)), q.attempt_rows(plan.rows)
    yield "percentiles over both parts", lambda: q.percentile_rows(window, plan, "default"), None


def fold_history(batch: int) -> tuple[int, float]:
    """Fold every settled run (what ``manage.py streamrecover_rollup`` does on an existing history)."""
    from streamrecover.analytics import rollup

    t = time.perf_counter()
    folded = rollup.fold_all(batch=batch)
    return folded, time.perf_counter() - t


def time_single_folds(count: int) -> tuple[float, float]:
    """(median unfold, median fold) seconds for one run at a time: the worker's cost as a run settles."""
    from streamrecover.analytics import rollup
    from streamrecover.models import Run

    ids = list(Run.objects.filter(analytics_folded=True).order_by("-created").values_list("pk", flat=True)[:count])
    unfolds, folds = [], []
    for run_id in ids:
        t = time.perf_counter()
        rollup.unfold_run(run_id)
        unfolds.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert rollup.fold_runs([run_id]) == 1
        folds.append(time.perf_counter() - t)
    return statistics.median(unfolds), statistics.median(folds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=640_000, help="runs to generate (≈1.6 events each)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--regenerate", action="store_true", help="drop the stored history and make a new one")
    parser.add_argument("--explain", action="store_true", help="add EXPLAIN ANALYZE of each query (30d window)")
    parser.add_argument("--fold-batch", type=int, default=2000, help="runs per fold transaction")
    parser.add_argument("--database", default=BENCH_DB, help="the PostgreSQL database of the history")
    parser.add_argument(
        "--min-events", type=int, default=1_000_000, help="a smaller history is generated again (smoke runs: less)"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the section for BENCHMARKS.md goes")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    setup_django(args.database)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db.models import Max
    from django.test import Client

    from streamrecover.analytics import queries
    from streamrecover.analytics.report import build_report
    from streamrecover.analytics.windows import Window
    from streamrecover.models import AnalyticsRollup, Attempt, RecoveryEvent, Run

    have = RecoveryEvent.objects.count()
    generated = None
    if args.regenerate or have < args.min_events:
        print(f"generating {args.runs:,} runs into {args.database} ...", flush=True)
        t = time.perf_counter()
        counts = generate(args.runs, args.seed, datetime.now(UTC).replace(microsecond=0))
        t_copy = time.perf_counter() - t
        t = time.perf_counter()
        vacuum_analyze(args.database)
        generated = (counts, t_copy, time.perf_counter() - t)
    sizes = {
        "runs": Run.objects.count(),
        "attempts": Attempt.objects.count(),
        "events": RecoveryEvent.objects.count(),
    }
    if sizes["events"] < args.min_events:
        print(f"only {sizes['events']:,} events: raise --runs", file=sys.stderr)
        return 1
    end = Run.objects.aggregate(last=Max("created"))["last"] + timedelta(seconds=1)
    print(f"history: {sizes['runs']:,} runs, {sizes['attempts']:,} attempts, {sizes['events']:,} events", flush=True)
    folding = None
    if Run.objects.filter(analytics_folded=False).exists():
        print("folding the history into the rollup ...", flush=True)
        folded, t_fold = fold_history(args.fold_batch)
        vacuum_analyze(args.database)
        folding = (folded, t_fold)
        print(f"  folded {folded:,} runs in {t_fold:,.1f} s", flush=True)
    single = time_single_folds(200)
    sizes["rollup_rows"] = AnalyticsRollup.objects.count()

    windows = [("24h", timedelta(hours=24)), ("7d", timedelta(days=7)), ("30d", timedelta(days=30))]
    windows.append((f"{SPAN_DAYS}d (everything)", timedelta(days=SPAN_DAYS, hours=1)))
    rows: list[tuple[str, str, float, float, float, int]] = []

    def cohort(w: Window) -> int:
        return Run.objects.filter(queries.cohort(w)).count()

    for label, span in windows:
        for filters in ({}, {"provider": "anthropic", "model": "claude-sonnet-4-5"}):
            window = Window(end - span, end, **filters)
            name = label + (" · anthropic/claude-sonnet-4-5" if filters else "")
            first, best, median = timed(partial(build_report, window), args.repeat)
            rows.append(("build_report", name, first, best, median, cohort(window)))
            print(f"  build_report {name:<45} median {median * 1000:8.1f} ms", flush=True)
    raw_rows = []
    for label, span in windows[2:]:  # what the rollup saves: the same reports, every row read
        window = Window(end - span, end)
        first, best, median = timed(partial(build_report, window, rollup=False), 3)
        raw_rows.append((label, first, best, median))
        print(f"  build_report(rollup=False) {label:<30} median {median * 1000:8.1f} ms", flush=True)

    staff, _ = get_user_model().objects.get_or_create(username="bench-staff", defaults={"is_staff": True})
    client = Client()
    client.force_login(staff)
    endpoint_rows = []
    for label, span in windows:
        params = {"window": "custom", "start": (end - span).isoformat(), "end": end.isoformat()}

        def fetch(params: dict[str, str] = params) -> None:
            response = client.get("/streamrecover/analytics.json", params)
            assert response.status_code == 200, response.status_code

        first, best, median = timed(fetch, args.repeat)
        endpoint_rows.append(("GET /streamrecover/analytics.json", label, first, best, median))
        print(f"  endpoint {label:<10} median {median * 1000:8.1f} ms", flush=True)
        page_first, page_best, page_median = timed(
            partial(client.get, "/streamrecover/analytics/", params), args.repeat
        )
        endpoint_rows.append(("GET /streamrecover/analytics/ (page)", label, page_first, page_best, page_median))

        def command(span: timedelta = span) -> None:
            call_command(
                "streamrecover_stats",
                "--since",
                (end - span).isoformat(),
                "--until",
                end.isoformat(),
                "--json",
                stdout=io.StringIO(),
            )

        first, best, median = timed(command, args.repeat)
        endpoint_rows.append(("streamrecover_stats --json", label, first, best, median))
        print(f"  command  {label:<10} median {median * 1000:8.1f} ms", flush=True)

    window30 = Window(end - timedelta(days=30), end)
    part_rows = []
    plans: list[tuple[str, str]] = []
    with queries.tuned("default"):
        parts = list(query_parts(window30))
    for name, fn, queryset in parts:
        with queries.tuned("default"):  # as build_report runs them
            first, best, median = timed(fn, args.repeat)
            if args.explain and queryset is not None:
                plans.append((name, explain(queryset)))
        part_rows.append((name, first, best, median))

    load = (load_before, os.getloadavg())
    write_results(sizes, generated, rows, endpoint_rows, part_rows, plans, args, load, folding, single, raw_rows)
    print(f"wrote {args.results}")
    return 0


def write_results(
    sizes: dict[str, int],
    generated: tuple[dict[str, int], float, float] | None,
    rows: list[tuple[str, str, float, float, float, int]],
    endpoint_rows: list[tuple[str, str, float, float, float]],
    part_rows: list[tuple[str, float, float, float]],
    plans: list[tuple[str, str]],
    args: argparse.Namespace,
    load: tuple[tuple[float, ...], tuple[float, ...]],
    folding: tuple[int, float] | None,
    single: tuple[float, float],
    raw_rows: list[tuple[str, float, float, float]],
) -> None:
    from django.db import connection

    def ms(value: float) -> str:
        return f"{value * 1000:,.0f}"

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg_version = cursor.fetchone()[0]
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('streamrecover_recoveryevent'))")
        event_size = cursor.fetchone()[0]
    lines = [
        "# Analytics benchmark",
        "",
        "Produced by `.venv/bin/python -m bench.bench_analytics` (see its docstring). Times are wall clock",
        f"in milliseconds over {args.repeat} calls: the first call, the best and the median.",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"PostgreSQL {pg_version} (default settings: shared_buffers 128MB, work_mem 4MB)",
        f"- load average (1, 5, 15 min) at the start {', '.join(f'{x:.1f}' for x in load[0])}, "
        f"at the end {', '.join(f'{x:.1f}' for x in load[1])}: the machine is shared, figures vary with it",
        f"- history: {sizes['runs']:,} runs, {sizes['attempts']:,} attempts, **{sizes['events']:,} events** "
        f"over {SPAN_DAYS} days, 5 provider/model pairs (event table with indexes: {event_size})",
    ]
    if generated:
        counts, t_copy, t_vacuum = generated
        lines.append(
            f"- generated with COPY in {t_copy:,.1f} s "
            f"({(counts['runs'] + counts['attempts'] + counts['events']) / t_copy:,.0f} rows/s), "
            f"VACUUM ANALYZE {t_vacuum:,.1f} s"
        )
    if folding:
        folded, t_fold = folding
        lines.append(
            f"- folded into the rollup (`rollup.fold_all(batch={args.fold_batch})`, what `manage.py "
            f"streamrecover_rollup` does on an existing history): {folded:,} runs in {t_fold:,.1f} s "
            f"({folded / t_fold:,.0f} runs/s)"
        )
    lines += [
        f"- rollup: {sizes['rollup_rows']:,} rows (15-minute slots x provider/model)",
        f"- one run at a time, as a worker folds the run it just finished (median of 200): fold "
        f"{ms(single[1])} ms, unfold (re-queue) {ms(single[0])} ms",
        "",
        "## The query layer: `build_report(window)`",
        "",
        "Every figure, per provider/model and in total, plus the time series (6 queries). Windows end at",
        "the newest run (not on a slot boundary), so both edges are read row by row.",
        "",
        "| window | runs in cohort | first | best | median |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {name} | {n:,} | {ms(f)} | {ms(b)} | {ms(m)} |" for _, name, f, b, m, n in rows]
    lines += [
        "",
        "Without the rollup (`build_report(window, rollup=False)`: every row of the window read, 3 calls):",
        "",
        "| window | first | best | median |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {label} | {ms(f)} | {ms(b)} | {ms(m)} |" for label, f, b, m in raw_rows]
    lines += [
        "",
        "## The JSON endpoint, the page and the stats command",
        "",
        "Through Django's test client (a logged-in staff user; the whole request cycle, JSON encoding",
        "included) and `call_command`.",
        "",
        "| what | window | first | best | median |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [f"| {what} | {label} | {ms(f)} | {ms(b)} | {ms(m)} |" for what, label, f, b, m in endpoint_rows]
    lines += ["", "## One report's queries (30-day window, all providers)", ""]
    lines += ["As `build_report` runs them: one transaction, `jit = off`, `work_mem = 64MB`.", ""]
    lines += ["| query | first | best | median |"]
    lines += ["|---|---:|---:|---:|"]
    lines += [f"| {name} | {ms(f)} | {ms(b)} | {ms(m)} |" for name, f, b, m in part_rows]
    if plans:
        lines += ["", "## Query plans (EXPLAIN ANALYZE, 30-day window, the report's settings)", ""]
        for name, text in plans:
            lines += [f"### {name}", "", "```", text, "```", ""]
    args.results.write_text("\n".join(lines).rstrip() + "\n")


if __name__ == "__main__":
    sys.exit(main())
