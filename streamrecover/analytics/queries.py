"""The SQL of recovery analytics: which runs a report reads, and their figures aggregated in the database.

The population of a window is a *cohort*: the runs created in ``[start, end)`` (optionally of
one provider and model). Every figure counts those runs and their attempts and events,
whenever the attempts and events happened, so rates never mix populations and the time
series adds up to the totals. Groups are the run's ``(provider, model)``.

Nothing here loops over event rows in Python: a handful of ``values().annotate()`` queries
with ``Count``/``Sum`` filters answer everything, whatever the number of rows. Settled runs
are read from ``AnalyticsRollup`` (their figures summed per 15-minute slot when they
settled, by ``analytics.rollup``); the others, and the partial slots at a window's edges,
row by row from columns that ``RecoveryEvent.save()`` fills from the payload and from the
run's earlier events (``first_in_run`` counts a run once; a completion event carries its
turn's first break and kept tokens), so no query correlates events row by row.
Time-to-recover percentiles are exact: the rollup keeps every duration, and PostgreSQL's
``percentile_cont`` runs over both parts in one query; on other databases (SQLite, the
embedded mode) the durations come back and the same interpolation runs in Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

from django.core.exceptions import EmptyResultSet
from django.db import connections, router, transaction
from django.db.models import (
    Case,
    Count,
    DateTimeField,
    F,
    FloatField,
    Func,
    Q,
    QuerySet,
    Sum,
    When,
)
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from ..engine.sink import (
    DISCARDED_PARTIAL_TOOL_USE,
    DISCARDED_THINKING,
    LLM_STREAM_CONTINUATION_COMPLETED,
    LLM_STREAM_INTERRUPTED,
)
from ..models import AnalyticsRollup, Attempt, RecoveryEvent, Run
from .definitions import CAUSES, OTHER, PLANS, ROLLUP_COUNTERS
from .windows import Window, slot_ceil, slot_floor

# ---- percentiles ---------------------------------------------------------------------------


def percentile_cont(values: Iterable[float], fraction: float) -> float | None:
    """What ``percentile_cont`` returns, for the databases that lack it: linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# ---- what a report reads ---------------------------------------------------------------------
#
# A report adds two parts. The *rollup*: ``AnalyticsRollup`` rows, the figures of the settled
# runs created in whole 15-minute slots inside the window, already summed (a few thousand
# rows for 90 days). The *rows*: everything else, read row by row from runs, events and
# attempts: the runs not folded into the rollup (still going, or settled a moment ago) and
# every run created in the partial slots at the window's edges. A run is in exactly one part
# (``Run.analytics_folded`` says which, and flips in the same transaction that adds or
# removes its counts), so the parts add up to the cohort whatever the folder has done yet.
#
# Queries, whatever the number of rows: rollup by (provider, model, bucket); the ids of the
# runs read row by row (``Plan.pinned``); those runs by (provider, model, bucket); their events
# by (provider, model, bucket); their attempts by (provider, model); and one for the
# time-to-recover percentiles over both parts. Every count is additive (a run is counted by
# its ``first_in_run`` event and belongs to one group and one bucket), so the grand total and
# the series are sums of those aggregated rows.

PIN_UP_TO = 10_000  # runs read row by row that a report names by id (see ``Plan.pinned``)
# Events and attempts happen after their run is created, so rows older than the window start
# cannot belong to the cohort; the bound (less an hour of clock skew between machines) only
# lets an index skip them when a report reads a whole window row by row.
CLOCK_SKEW = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Scope:
    """Which runs the row-by-row queries read: a filter on ``Run``, and optionally a lower bound
    on their attempts' and events' own time (only there to let an index skip older rows)."""

    runs: Q
    since: datetime | None = None

    def on(self, prefix: str, own_time: str | None = None) -> Q:
        """The filter seen from a model whose path to ``Run`` is ``prefix``."""
        q = _prefixed(self.runs, prefix)
        if own_time and self.since is not None:
            q &= Q(**{f"{own_time}__gte": self.since})
        return q


def _prefixed(q: Q, prefix: str) -> Q:
    if not prefix:
        return q
    children: list[Q | tuple[str, Any]] = []
    for child in q.children:
        if isinstance(child, Q):
            children.append(_prefixed(child, prefix))
        else:  # a Q's other children are (lookup, value) pairs
            lookup, value = cast(tuple[str, Any], child)
            children.append((f"{prefix}{lookup}", value))
    return Q(*children, _connector=q.connector, _negated=q.negated)


def cohort(window: Window) -> Q:
    """The window's runs, as a filter on ``Run``."""
    q = Q(created__gte=window.start, created__lt=window.end)
    if window.provider:
        q &= Q(provider=window.provider)
    if window.model:
        q &= Q(model=window.model)
    return q


@dataclass(frozen=True, slots=True)
class Plan:
    """How a report splits its window: rollup slots ``[slots_start, slots_end)`` and the rest."""

    rows: Scope
    slots_start: datetime | None = None
    slots_end: datetime | None = None

    @classmethod
    def of(cls, window: Window, rollup: bool = True) -> Plan:
        runs = cohort(window)
        start, end = slot_ceil(window.start), slot_floor(window.end)
        if not rollup or start >= end:
            return cls(Scope(runs, since=window.start - CLOCK_SKEW))
        rest = Q(created__lt=start) | Q(created__gte=end) | Q(analytics_folded=False)
        # Unfolded runs may be old (a run that never ended): no time bound on their rows.
        return cls(Scope(runs & rest), start, end)

    @property
    def uses_rollup(self) -> bool:
        return self.slots_start is not None

    def pinned(self) -> Plan:
        """The rows part as the list of its runs' ids, when it is small (it is, by design).

        PostgreSQL misjudges how many runs the edges-or-unfolded filter matches (by a factor of
        a thousand), and so scans every event and attempt to join them; with the ids spelled
        out it probes their indexes for those runs only. One cheap query, in the report's snapshot.
        """
        if not self.uses_rollup:
            return self
        ids = list(Run.objects.filter(self.rows.runs).order_by().values_list("pk", flat=True)[: PIN_UP_TO + 1])
        if len(ids) > PIN_UP_TO:  # a backlog of unfolded runs: let the planner join
            return self
        return replace(self, rows=Scope(Q(pk__in=ids)))


def _bucket(window: Window, field: str) -> TruncHour | TruncDay:
    trunc = TruncHour if window.bucket == "hour" else TruncDay
    return trunc(field, tzinfo=timezone.get_current_timezone())


def rollup_slots(window: Window, plan: Plan) -> QuerySet:
    q = Q(slot__gte=plan.slots_start, slot__lt=plan.slots_end)
    if window.provider:
        q &= Q(provider=window.provider)
    if window.model:
        q &= Q(model=window.model)
    return AnalyticsRollup.objects.filter(q).order_by()


def rollup_rows(window: Window, plan: Plan) -> QuerySet:
    return (
        rollup_slots(window, plan)
        .annotate(bucket=_bucket(window, "slot"))
        .values("provider", "model", "bucket")
        .annotate(**{column: Sum(column) for column in ROLLUP_COUNTERS})
    )


def run_rows(window: Window, scope: Scope) -> QuerySet:
    return (
        Run.objects.filter(scope.runs)
        .order_by()
        .annotate(bucket=_bucket(window, "created"))
        .values("provider", "model", "bucket")
        .annotate(runs=Count("pk"))
    )


def _counted_run(status: Any = None, name: str = LLM_STREAM_INTERRUPTED) -> Q:
    # ``status``: a ``Run.Status`` member (a str; typed by its (value, label) assignment without Django stubs).
    """A run counted once, by its first event of ``name``, optionally only if it ended ``status``.

    interrupted_runs: first ``llm_stream_interrupted``; recovered_runs: first
    ``llm_stream_continuation_completed`` of a completed run (a completion only ever follows
    a break); exhausted_runs / failed_runs: first interruption of such a run.
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


def _event_figures() -> dict[str, Any]:
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
    return figures


def _events(scope: Scope) -> QuerySet:
    return RecoveryEvent.objects.filter(scope.on("run__", own_time="created"), name__in=COUNTED_EVENTS).order_by()


def event_rows(window: Window, scope: Scope) -> QuerySet:
    """The event figures by (provider, model, bucket), in one pass over the scope's events.

    Only the events that count a run (``INTERRUPTED_RUN``, ``RECOVERED_RUN``) get a bucket,
    their run's; the others share a ``None`` bucket. So the rows sum to the group figures,
    and the bucketed rows alone give the series' interrupted and recovered runs, without
    truncating every row's time.
    """
    bucket = Case(
        When(INTERRUPTED_RUN | RECOVERED_RUN, then=_bucket(window, "run__created")),
        default=None,
        output_field=DateTimeField(),
    )
    return (
        _events(scope)
        .annotate(bucket=bucket)
        .values("run__provider", "run__model", "bucket")
        .annotate(**_event_figures())
    )


def event_rows_by_run(scope: Scope) -> QuerySet:
    """The event figures of each run of the scope (what the rollup folds in)."""
    return _events(scope).values("run_id").annotate(**_event_figures())


def _attempt_figures() -> dict[str, Any]:
    continuing = Q(kind__in=(Attempt.Kind.CONTINUATION, Attempt.Kind.RESUME))
    return {
        "attempts": Count("pk"),
        "pre_stream_retries": Count("pk", filter=Q(kind=Attempt.Kind.PRE_STREAM_RETRY)),
        "output_tokens_billed": Sum("output_tokens", default=0),
        "completed_output_tokens": Sum("output_tokens", filter=Q(outcome="completed"), default=0),
        "continuation_input_tokens": Sum("input_tokens", filter=continuing, default=0),
    }


def _attempts(scope: Scope) -> QuerySet:
    return Attempt.objects.filter(scope.on("run__", own_time="started_at")).order_by()


def attempt_rows(scope: Scope) -> QuerySet:
    return _attempts(scope).values("run__provider", "run__model").annotate(**_attempt_figures())


def attempt_rows_by_run(scope: Scope) -> QuerySet:
    return _attempts(scope).values("run_id").annotate(**_attempt_figures())


def recoveries(scope: Scope) -> QuerySet:
    """One row per recovery (completion event) whose turn's first interruption is known."""
    return (
        RecoveryEvent.objects.filter(
            scope.on("run__", own_time="created"),
            name=LLM_STREAM_CONTINUATION_COMPLETED,
            first_break_at__isnull=False,
        )
        .order_by()
        .annotate(duration=F("created") - F("first_break_at"))
    )


class _Epoch(Func):
    """PostgreSQL: an interval in seconds, as a float."""

    template = "EXTRACT(EPOCH FROM %(expressions)s)::float8"
    output_field = FloatField()


def _percentiles_in_postgresql(window: Window, plan: Plan) -> list[dict[str, Any]]:
    """Percentiles per group and in total (``GROUPING SETS``) over both parts, in one query:
    the rollup's kept durations (``jsonb_array_elements_text``) and the rows' own."""
    rows = (
        recoveries(plan.rows).annotate(seconds=_Epoch("duration")).values_list("run__provider", "run__model", "seconds")
    )
    parts, params = [], []
    try:
        rows_sql, rows_params = rows.query.sql_with_params()
    except EmptyResultSet:  # no run is read row by row
        pass
    else:
        parts.append(f"SELECT * FROM ({rows_sql}) AS row_part (provider, model, seconds)")
        params += rows_params
    if plan.uses_rollup:
        qn = connections[router.db_for_read(AnalyticsRollup)].ops.quote_name
        filters = ["r.slot >= %s", "r.slot < %s"]
        params += [plan.slots_start, plan.slots_end]
        for field in ("provider", "model"):
            if getattr(window, field):
                filters.append(f"r.{qn(field)} = %s")
                params.append(getattr(window, field))
        parts.append(
            f"SELECT r.provider, r.model, v.value::float8 AS seconds FROM {qn(AnalyticsRollup._meta.db_table)} r "
            f"CROSS JOIN LATERAL jsonb_array_elements_text(r.recover_seconds) v WHERE {' AND '.join(filters)}"
        )
    if not parts:
        return [{"group": None, "time_to_recover_p50_s": None, "time_to_recover_p95_s": None}]
    sql = (
        "SELECT d.provider, d.model, GROUPING(d.provider, d.model), "
        "percentile_cont(0.5) WITHIN GROUP (ORDER BY d.seconds), "
        "percentile_cont(0.95) WITHIN GROUP (ORDER BY d.seconds) "
        f"FROM ({' UNION ALL '.join(parts)}) d GROUP BY GROUPING SETS ((d.provider, d.model), ())"
    )
    with connections[router.db_for_read(RecoveryEvent)].cursor() as cursor:
        cursor.execute(sql, params)
        return [
            {
                "group": None if grouping else (provider, model),
                "time_to_recover_p50_s": p50,
                "time_to_recover_p95_s": p95,
            }
            for provider, model, grouping, p50, p95 in cursor.fetchall()
        ]


def _percentiles_in_python(window: Window, plan: Plan) -> list[dict[str, Any]]:
    """Other databases (SQLite, the embedded mode): the durations come back, percentiles here."""
    durations: dict[tuple[str, str], list[float]] = {}
    for provider, model, duration in recoveries(plan.rows).values_list("run__provider", "run__model", "duration"):
        durations.setdefault((provider, model), []).append(seconds(duration) or 0.0)
    if plan.uses_rollup:
        for provider, model, kept in rollup_slots(window, plan).values_list("provider", "model", "recover_seconds"):
            durations.setdefault((provider, model), []).extend(kept or ())
    everything = [value for values in durations.values() for value in values]
    return [
        {
            "group": key,
            "time_to_recover_p50_s": percentile_cont(values, 0.5),
            "time_to_recover_p95_s": percentile_cont(values, 0.95),
        }
        for key, values in [*durations.items(), (None, everything)]
    ]


def _uses_percentile_cont(using: str) -> bool:
    return connections[using].vendor == "postgresql"


def percentile_rows(window: Window, plan: Plan, using: str) -> list[dict[str, Any]]:
    if _uses_percentile_cont(using):
        return _percentiles_in_postgresql(window, plan)
    return _percentiles_in_python(window, plan)


@contextmanager
def tuned(using: str) -> Iterator[None]:
    """On PostgreSQL, one transaction whose settings suit a report, and only it.

    One snapshot for all the queries (``REPEATABLE READ``, when the report opens the
    transaction): a run folded into the rollup between two queries is then neither counted
    twice nor missed. JIT compilation costs ~100 ms per query here and buys nothing; the
    default 4 MB of ``work_mem`` makes the grouping of a month of rows sort on disk.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        with transaction.atomic(using=using):  # one snapshot on SQLite too
            yield
        return
    outermost = not connection.in_atomic_block
    with transaction.atomic(using=using), connection.cursor() as cursor:
        if outermost:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL work_mem = '64MB'")
        yield


def seconds(value: timedelta | float | None) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
