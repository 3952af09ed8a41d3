"""Recovery analytics: every figure defined once (``DEFINITIONS``) and computed by SQL aggregation.

The population of a window is a *cohort*: the runs created in ``[start, end)`` (optionally of
one provider and model). Every figure counts those runs and their attempts and events,
whenever the attempts and events happened, so rates never mix populations and the time
series adds up to the totals. Groups are the run's ``(provider, model)``.

Nothing here loops over event rows in Python: five ``values().annotate()`` / ``aggregate``
queries with ``Count``/``Sum`` filters answer everything, whatever the number of rows. They
read columns that ``RecoveryEvent.save()`` fills from the payload and from the run's earlier
events (``first_in_run`` counts a run once; a completion event carries its turn's first
break and kept tokens), so no query correlates events row by row. Time-to-recover
percentiles use PostgreSQL's ``percentile_cont`` through ``PercentileCont``; on other
databases (SQLite, the embedded mode) one aggregated query returns the per-recovery
durations and the same interpolated percentile is computed from that list in Python.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.db import connections, router, transaction
from django.db.models import (
    Aggregate,
    Case,
    Count,
    DateTimeField,
    DurationField,
    F,
    Q,
    QuerySet,
    Sum,
    When,
)
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from .engine.errors import InterruptCause
from .engine.plan import PlanKind
from .engine.sink import (
    DISCARDED_PARTIAL_TOOL_USE,
    DISCARDED_THINKING,
    LLM_STREAM_CONTINUATION_COMPLETED,
    LLM_STREAM_INTERRUPTED,
)
from .models import Attempt, RecoveryEvent, Run

# ---- definitions ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figure:
    """One reported figure: its key in every output, a label, a unit and what it counts."""

    key: str
    label: str
    unit: str  # count, ratio (a share, shown as %), average, seconds, bytes, tokens, breakdown
    definition: str


DEFINITIONS: tuple[Figure, ...] = (
    Figure(
        "runs",
        "Runs",
        "count",
        "Runs created in the window (the cohort). Every other figure counts these runs' attempts and "
        "events, whenever those happened.",
    ),
    Figure("attempts", "Attempts", "count", "Provider calls (`Attempt` rows) of the cohort's runs, of every kind."),
    Figure(
        "pre_stream_retries",
        "Pre-stream retries",
        "count",
        "Attempts of kind `pre_stream_retry`: a request sent again before its stream started (nothing generated).",
    ),
    Figure("interrupted_runs", "Interrupted runs", "count", "Runs with at least one `llm_stream_interrupted` event."),
    Figure("interruptions", "Interruptions", "count", "`llm_stream_interrupted` events (a run may break many times)."),
    Figure("interruption_rate", "Interruption rate", "ratio", "interrupted_runs / runs."),
    Figure(
        "interruptions_by_cause",
        "Interruptions by cause",
        "breakdown",
        "interruptions counted by the event's `cause` (connection_reset, idle_stall, goaway, "
        "provider_error_mid_stream, sse_parse, body_decode, unknown).",
    ),
    Figure(
        "interruptions_by_plan",
        "Interruptions by recovery plan",
        "breakdown",
        "interruptions counted by the event's `plan` (continue_text R1, synthesize_tool_use R2, "
        "truncate_before_tool R3, whole_restart R4).",
    ),
    Figure(
        "recovered_runs",
        "Recovered runs",
        "count",
        "Interrupted runs that ended `completed` with at least one `llm_stream_continuation_completed` event.",
    ),
    Figure(
        "exhausted_runs",
        "Exhausted runs",
        "count",
        "Interrupted runs that ended `exhausted` (the continuation budget ran out).",
    ),
    Figure(
        "failed_runs",
        "Failed runs",
        "count",
        "Interrupted runs that ended `failed` (e.g. a permanent error after the break).",
    ),
    Figure(
        "recovery_rate",
        "Recovery rate",
        "ratio",
        "recovered_runs / interrupted_runs (interrupted runs still going, or cancelled, count as not recovered).",
    ),
    Figure(
        "recoveries",
        "Recoveries",
        "count",
        "`llm_stream_continuation_completed` events: turns that a recovery brought to their end.",
    ),
    Figure(
        "continuations_per_recovered_run",
        "Continuation attempts per recovered run",
        "average",
        "Sum of `continuation_attempt` of the recovered runs' `llm_stream_continuation_completed` events "
        "(the continuation attempts each recovery took; an R2 recovery may take none) / recovered_runs.",
    ),
    Figure(
        "time_to_recover_p50_s",
        "Time to recover, p50",
        "seconds",
        "Median, over recoveries, of the seconds from the first `llm_stream_interrupted` of the same run and "
        "turn to the `llm_stream_continuation_completed` event (for a run recovered once: first interruption "
        "to the run's completion event). Continuous percentile (`percentile_cont`).",
    ),
    Figure(
        "time_to_recover_p95_s",
        "Time to recover, p95",
        "seconds",
        "95th percentile of the same durations, interpolated the same way.",
    ),
    Figure(
        "discarded_tool_uses",
        "Discarded partial tool calls",
        "count",
        "`discarded_partial_tool_use` events: tool calls whose arguments never completed.",
    ),
    Figure(
        "partial_tool_use_incidence",
        "Partial tool-call incidence",
        "ratio",
        "discarded_tool_uses / interruptions.",
    ),
    Figure(
        "discarded_tool_bytes",
        "Discarded tool-call bytes",
        "bytes",
        "Sum of `partial_input_bytes` of the `discarded_partial_tool_use` events.",
    ),
    Figure(
        "discarded_thinking_blocks",
        "Discarded thinking blocks",
        "count",
        "`discarded_thinking` events: thinking that could not go back into history.",
    ),
    Figure(
        "discarded_thinking_bytes",
        "Discarded thinking bytes",
        "bytes",
        "Sum of `partial_bytes` of the `discarded_thinking` events.",
    ),
    Figure(
        "output_tokens_billed",
        "Output tokens billed",
        "tokens",
        "Sum of `output_tokens` over all attempts, broken ones included.",
    ),
    Figure(
        "output_tokens_delivered",
        "Output tokens delivered",
        "tokens",
        "Sum of `output_tokens` of completed attempts, plus for each recovery the "
        "`kept_output_tokens_estimate` of the last interruption of its turn (the salvaged output that "
        "became part of the answer; the estimate is cumulative within a turn, so the last one counts it once).",
    ),
    Figure(
        "tokens_saved",
        "Output tokens saved vs. a naive restart",
        "tokens",
        "Sum of `kept_output_tokens_estimate` of the interruptions recovered by a plan other than "
        "`whole_restart`; an interruption is recovered when its run and turn has a "
        "`llm_stream_continuation_completed` event. The output a restart would have generated and paid again.",
    ),
    Figure(
        "continuation_input_tokens",
        "Input tokens of continuations",
        "tokens",
        "Sum of `input_tokens` of `continuation` and `resume` attempts: what continuing cost instead "
        "(the kept prefix is sent as input).",
    ),
)

FIGURES: dict[str, Figure] = {f.key: f for f in DEFINITIONS}
CAUSES: tuple[str, ...] = tuple(c.value for c in InterruptCause)
PLANS: tuple[str, ...] = tuple(p.value for p in PlanKind)
SERIES_FIELDS: tuple[str, ...] = ("runs", "interrupted_runs", "recovered_runs")

# ---- the window -------------------------------------------------------------------------

PRESETS: dict[str, timedelta] = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
HOURLY_UP_TO = timedelta(days=7)
_SPAN = re.compile(r"^\s*(\d+)\s*([hdw])\s*$")
_UNITS = {"h": "hours", "d": "days", "w": "weeks"}


def parse_span(text: str) -> timedelta:
    """``24h``, ``7d``, ``2w`` -> a timedelta; anything else is a ``ValueError``."""
    match = _SPAN.match(text or "")
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"not a window length: {text!r} (use e.g. 24h, 7d, 30d)")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


@dataclass(frozen=True, slots=True)
class Window:
    """Runs created in ``[start, end)``, optionally of one provider and one model."""

    start: datetime
    end: datetime
    provider: str | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError("the window ends before it starts")

    @classmethod
    def last(cls, span: timedelta, *, now: datetime | None = None, **filters: str | None) -> Window:
        end = now or timezone.now()
        return cls(end - span, end, **filters)

    @property
    def bucket(self) -> str:
        """Hourly points up to a week (at most 168), daily beyond."""
        return "hour" if self.end - self.start <= HOURLY_UP_TO else "day"

    def as_dict(self) -> dict[str, Any]:
        return {
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "bucket": self.bucket,
            "provider": self.provider,
            "model": self.model,
        }


# ---- PostgreSQL percentile ----------------------------------------------------------------


class PercentileCont(Aggregate):
    """PostgreSQL's ordered-set aggregate ``percentile_cont(f) WITHIN GROUP (ORDER BY x)``."""

    function = "PERCENTILE_CONT"
    name = "PercentileCont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("fraction must be within [0, 1]")
        super().__init__(expression, fraction=repr(float(fraction)), **extra)


def percentile_cont(values: Iterable[float], fraction: float) -> float | None:
    """What ``percentile_cont`` returns, for the databases that lack it: linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# ---- the queries ----------------------------------------------------------------------------
#
# Five queries at most, whatever the number of rows: runs by (provider, model, bucket);
# events by (provider, model, bucket), joined to their run for the cohort; attempts by
# (provider, model); recovery durations by (provider, model) and in total (skipped when
# there is one group), for the percentiles. Counts and sums are additive (run counts too: a run is
# counted by its ``first_in_run`` event, and belongs to one group and one bucket), so the
# grand total and the series are sums of those few aggregated rows.

# Events and attempts happen after their run is created, so rows older than the window start
# cannot belong to the cohort; the bound (less an hour of clock skew between machines) only
# lets an index skip them.
CLOCK_SKEW = timedelta(hours=1)


def _cohort(window: Window, prefix: str = "", own_time: str | None = None) -> Q:
    """The window's runs, seen from a model whose path to ``Run`` is ``prefix``."""
    q = Q(**{f"{prefix}created__gte": window.start, f"{prefix}created__lt": window.end})
    if own_time:
        q &= Q(**{f"{own_time}__gte": window.start - CLOCK_SKEW})
    if window.provider:
        q &= Q(**{f"{prefix}provider": window.provider})
    if window.model:
        q &= Q(**{f"{prefix}model": window.model})
    return q


def _bucket(window: Window, field: str) -> TruncHour | TruncDay:
    trunc = TruncHour if window.bucket == "hour" else TruncDay
    return trunc(field, tzinfo=timezone.get_current_timezone())


def _local(value: datetime | str) -> datetime:
    """A bucket that came back through ``Case`` (which skips ``Trunc``'s conversion): its digits
    are the wall time in the current time zone, whatever tzinfo the backend attached."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return timezone.make_aware(value.replace(tzinfo=None), timezone.get_current_timezone())


def _run_rows(window: Window) -> QuerySet:
    return (
        Run.objects.filter(_cohort(window))
        .order_by()
        .annotate(bucket=_bucket(window, "created"))
        .values("provider", "model", "bucket")
        .annotate(runs=Count("pk"))
    )


def _counted_run(status: str | None = None, name: str = LLM_STREAM_INTERRUPTED) -> Q:
    """A run counted once, by its first event of ``name``, optionally only if it ended ``status``.

    interrupted_runs: first ``llm_stream_interrupted``; recovered_runs: first
    ``llm_stream_continuation_completed`` of a completed run (a completion only ever follows
    a break, DESIGN §2); exhausted_runs / failed_runs: first interruption of such a run.
    """
    q = Q(name=name, first_in_run=True)
    return q & Q(run__status=status) if status else q


INTERRUPTED_RUN = _counted_run()
RECOVERED_RUN = _counted_run(Run.Status.COMPLETED, LLM_STREAM_CONTINUATION_COMPLETED)
COUNTED_EVENTS = (
    LLM_STREAM_INTERRUPTED,
    LLM_STREAM_CONTINUATION_COMPLETED,
    DISCARDED_PARTIAL_TOOL_USE,
    DISCARDED_THINKING,
)


def _event_rows(window: Window) -> QuerySet:
    """The event figures by (provider, model, bucket), in one pass over the window's events.

    Only the events that count a run (``INTERRUPTED_RUN``, ``RECOVERED_RUN``) get a bucket,
    their run's; the others share a ``None`` bucket. So the rows sum to the group figures,
    and the bucketed rows alone give the series' interrupted and recovered runs, without
    truncating every row's time.
    """
    interrupted = Q(name=LLM_STREAM_INTERRUPTED)
    completed = Q(name=LLM_STREAM_CONTINUATION_COMPLETED)
    figures: dict[str, Any] = {
        "interruptions": Count("name", filter=interrupted),
        "interrupted_runs": Count("name", filter=INTERRUPTED_RUN),
        "recovered_runs": Count("name", filter=RECOVERED_RUN),
        "exhausted_runs": Count("name", filter=_counted_run(Run.Status.EXHAUSTED)),
        "failed_runs": Count("name", filter=_counted_run(Run.Status.FAILED)),
        "recoveries": Count("name", filter=completed),
        "continuations_in_recovered": Sum(
            "continuation", filter=completed & Q(run__status=Run.Status.COMPLETED), default=0
        ),
        "discarded_tool_uses": Count("name", filter=Q(name=DISCARDED_PARTIAL_TOOL_USE)),
        "discarded_tool_bytes": Sum("discarded_bytes", filter=Q(name=DISCARDED_PARTIAL_TOOL_USE), default=0),
        "discarded_thinking_blocks": Count("name", filter=Q(name=DISCARDED_THINKING)),
        "discarded_thinking_bytes": Sum("discarded_bytes", filter=Q(name=DISCARDED_THINKING), default=0),
        "tokens_saved": Sum("saved_tokens", filter=completed, default=0),
        "kept_tokens_delivered": Sum("salvaged_tokens", filter=completed, default=0),
    }
    for field, values in (("cause", CAUSES), ("plan", PLANS)):
        for value in values:
            figures[f"{field}_{value}"] = Count("name", filter=interrupted & Q(**{field: value}))
        figures[f"{field}_{OTHER}"] = Count("name", filter=interrupted & ~Q(**{f"{field}__in": values}))
    bucket = Case(
        When(INTERRUPTED_RUN | RECOVERED_RUN, then=_bucket(window, "run__created")),
        default=None,
        output_field=DateTimeField(),
    )
    return (
        RecoveryEvent.objects.filter(_cohort(window, "run__", own_time="created"), name__in=COUNTED_EVENTS)
        .order_by()
        .annotate(bucket=bucket)
        .values("run__provider", "run__model", "bucket")
        .annotate(**figures)
    )


def _attempt_rows(window: Window) -> QuerySet:
    continuing = Q(kind__in=(Attempt.Kind.CONTINUATION, Attempt.Kind.RESUME))
    return (
        Attempt.objects.filter(_cohort(window, "run__", own_time="started_at"))
        .order_by()
        .values("run__provider", "run__model")
        .annotate(
            attempts=Count("pk"),
            pre_stream_retries=Count("pk", filter=Q(kind=Attempt.Kind.PRE_STREAM_RETRY)),
            output_tokens_billed=Sum("output_tokens", default=0),
            completed_output_tokens=Sum("output_tokens", filter=Q(outcome="completed"), default=0),
            continuation_input_tokens=Sum("input_tokens", filter=continuing, default=0),
        )
    )


def _recoveries(window: Window) -> QuerySet:
    """One row per recovery (completion event) whose turn's first interruption is known."""
    return (
        RecoveryEvent.objects.filter(
            _cohort(window, "run__", own_time="created"),
            name=LLM_STREAM_CONTINUATION_COMPLETED,
            first_break_at__isnull=False,
        )
        .order_by()
        .annotate(duration=F("created") - F("first_break_at"))
    )


def _uses_percentile_cont(queryset: QuerySet) -> bool:
    return connections[router.db_for_read(queryset.model)].vendor == "postgresql"


def _recovery_rows(window: Window, grouped: bool) -> list[dict[str, Any]]:
    """Time-to-recover percentiles per group, or in total."""
    base = _recoveries(window)
    if _uses_percentile_cont(base):
        percentiles = {
            "p50": PercentileCont("duration", 0.5, output_field=DurationField()),
            "p95": PercentileCont("duration", 0.95, output_field=DurationField()),
        }
        if grouped:
            rows = list(base.values("run__provider", "run__model").annotate(**percentiles))
        else:
            rows = [base.aggregate(**percentiles)]
        return [
            {
                **{key: row[key] for key in ("run__provider", "run__model") if key in row},
                "time_to_recover_p50_s": _seconds(row["p50"]),
                "time_to_recover_p95_s": _seconds(row["p95"]),
            }
            for row in rows
        ]
    # No percentile_cont (SQLite): one query returns the per-recovery durations; percentiles here.
    durations: dict[tuple[str, str] | None, list[float]] = {}
    for provider, model, duration in base.values_list("run__provider", "run__model", "duration"):
        durations.setdefault((provider, model) if grouped else None, []).append(_seconds(duration) or 0.0)
    if not grouped:
        durations.setdefault(None, [])
    return [
        {
            **({"run__provider": key[0], "run__model": key[1]} if key else {}),
            "time_to_recover_p50_s": percentile_cont(values, 0.5),
            "time_to_recover_p95_s": percentile_cont(values, 0.95),
        }
        for key, values in durations.items()
    ]


def _buckets(window: Window) -> list[datetime]:
    """Every bucket start from the one holding ``start`` up to ``end``, empty ones included.

    Hours step in UTC (a DST change neither repeats nor skips one); days step on the calendar.
    """
    tz = timezone.get_current_timezone()
    start = timezone.localtime(window.start, tz)
    buckets = []
    if window.bucket == "hour":
        current = start.replace(minute=0, second=0, microsecond=0)
        while current < window.end:
            buckets.append(current)
            current = timezone.localtime(current.astimezone(UTC) + timedelta(hours=1), tz)
        return buckets
    day = start.date()
    while (current := datetime.combine(day, time.min, tzinfo=tz)) < window.end:
        buckets.append(current)
        day += timedelta(days=1)
    return buckets


@contextmanager
def _tuned(using: str) -> Iterator[None]:
    """On PostgreSQL, one transaction whose settings suit a report, and only it.

    JIT compilation costs ~100 ms per query here and buys nothing; the default 4 MB of
    ``work_mem`` makes the grouping of a month of events sort on disk.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL work_mem = '64MB'")
        yield


# ---- assembling the report -----------------------------------------------------------------

OTHER = "other"
_SUMMED = (
    "runs",
    "attempts",
    "pre_stream_retries",
    "interrupted_runs",
    "interruptions",
    "recovered_runs",
    "exhausted_runs",
    "failed_runs",
    "recoveries",
    "continuations_in_recovered",
    "discarded_tool_uses",
    "discarded_tool_bytes",
    "discarded_thinking_blocks",
    "discarded_thinking_bytes",
    "output_tokens_billed",
    "completed_output_tokens",
    "kept_tokens_delivered",
    "tokens_saved",
    "continuation_input_tokens",
)
_BREAKDOWNS = (("cause", CAUSES, "interruptions_by_cause"), ("plan", PLANS, "interruptions_by_plan"))


def _empty() -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(_SUMMED, 0)
    for _, values, key in _BREAKDOWNS:
        row[key] = dict.fromkeys((*values, OTHER), 0)
    row["time_to_recover_p50_s"] = None
    row["time_to_recover_p95_s"] = None
    return row


def _add(target: dict[str, Any], row: Mapping[str, Any]) -> None:
    """Add an aggregated row (flat ``cause_x``/``plan_x`` columns or nested breakdowns) to ``target``."""
    for key in _SUMMED:
        target[key] += row.get(key) or 0
    for field, values, key in _BREAKDOWNS:
        nested = row.get(key, {})
        for value in (*values, OTHER):
            target[key][value] += nested.get(value, 0) or row.get(f"{field}_{value}") or 0


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _seconds(value: timedelta | float | None) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _finish(row: Mapping[str, Any]) -> dict[str, Any]:
    """Derive the ratios and keep exactly the defined figures, in definition order."""
    derived = {
        "interruption_rate": _ratio(row["interrupted_runs"], row["runs"]),
        "recovery_rate": _ratio(row["recovered_runs"], row["interrupted_runs"]),
        "continuations_per_recovered_run": _ratio(row["continuations_in_recovered"], row["recovered_runs"]),
        "partial_tool_use_incidence": _ratio(row["discarded_tool_uses"], row["interruptions"]),
        "output_tokens_delivered": row["completed_output_tokens"] + row["kept_tokens_delivered"],
    }
    merged = {**row, **derived}
    return {figure.key: merged[figure.key] for figure in DEFINITIONS}


def _point(bucket: datetime, row: Mapping[str, Any]) -> dict[str, Any]:
    point: dict[str, Any] = {"bucket": bucket.isoformat(), **{key: row[key] for key in SERIES_FIELDS}}
    point["interruption_rate"] = _ratio(point["interrupted_runs"], point["runs"])
    point["recovery_rate"] = _ratio(point["recovered_runs"], point["interrupted_runs"])
    return point


def build_report(window: Window) -> dict[str, Any]:
    """Every figure per (provider, model), in total, and over time: JSON-ready."""
    using = router.db_for_read(RecoveryEvent)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    series: dict[datetime, dict[str, Any]] = {bucket: _empty() for bucket in _buckets(window)}
    total = _empty()

    def group(provider: str, model: str) -> dict[str, Any]:
        return groups.setdefault((provider, model), _empty())

    with _tuned(using):
        for row in _run_rows(window):
            _add(group(row["provider"], row["model"]), row)
            _add(series.setdefault(row["bucket"], _empty()), row)
        for row in _event_rows(window):
            _add(group(row["run__provider"], row["run__model"]), row)
            if row["bucket"] is not None:
                point = series.setdefault(_local(row["bucket"]), _empty())
                point["interrupted_runs"] += row["interrupted_runs"]
                point["recovered_runs"] += row["recovered_runs"]
        for row in _attempt_rows(window):
            _add(group(row["run__provider"], row["run__model"]), row)
        for row in _recovery_rows(window, grouped=True):
            group(row.pop("run__provider"), row.pop("run__model")).update(row)
        # One group: its percentiles are the total's, no need to ask again.
        [overall] = list(groups.values()) if len(groups) == 1 else _recovery_rows(window, grouped=False)
    for row in groups.values():
        _add(total, row)
    total["time_to_recover_p50_s"] = overall["time_to_recover_p50_s"]
    total["time_to_recover_p95_s"] = overall["time_to_recover_p95_s"]
    return {
        "window": window.as_dict(),
        "definitions": [
            {"key": f.key, "label": f.label, "unit": f.unit, "definition": f.definition} for f in DEFINITIONS
        ],
        "totals": _finish(total),
        "groups": [
            {"provider": provider, "model": model, **_finish(row)} for (provider, model), row in sorted(groups.items())
        ],
        "series": [_point(bucket, row) for bucket, row in sorted(series.items())],
    }


def choices(window: Window) -> dict[str, list[str]]:
    """Providers and models of the window's runs (whatever the provider/model filter), for the page."""
    runs = Run.objects.filter(created__gte=window.start, created__lt=window.end).order_by()
    pairs = list(runs.values_list("provider", "model").distinct())
    return {
        "providers": sorted({provider for provider, _ in pairs}),
        "models": sorted({model for _, model in pairs}),
    }


def definitions_markdown() -> str:
    """The definitions table as markdown (docs/analytics.md carries it)."""
    lines = ["| figure | key | unit | definition |", "|---|---|---|---|"]
    lines += [f"| {f.label} | `{f.key}` | {f.unit} | {f.definition} |" for f in DEFINITIONS]
    return "\n".join(lines) + "\n"


def display(unit: str, value: Any) -> str:
    """A figure's value as the page and the command show it (JSON keeps the raw number)."""
    if value is None:
        return "—"
    if unit == "ratio":
        return f"{value:.1%}"
    if unit == "average":
        return f"{value:,.2f}"
    if unit == "seconds":
        return f"{value:,.1f} s"
    if isinstance(value, int | float):
        return f"{value:,.0f}"
    return str(value)
