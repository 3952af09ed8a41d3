"""The analytics report: ``build_report`` assembles the queries' rows into totals, groups and a series.

Also what the page and the command show around it: the filter ``choices`` and ``display``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import router
from django.utils import timezone

from ..models import RecoveryEvent, Run
from .definitions import BREAKDOWNS, DEFINITIONS, OTHER, SERIES_FIELDS, SUMMED
from .queries import (
    Plan,
    attempt_rows,
    event_rows,
    percentile_rows,
    rollup_rows,
    rollup_slots,
    run_rows,
    tuned,
)
from .windows import Window, buckets


def _local(value: datetime | str) -> datetime:
    """A bucket that came back through ``Case`` (which skips ``Trunc``'s conversion): its digits
    are the wall time in the current time zone, whatever tzinfo the backend attached."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return timezone.make_aware(value.replace(tzinfo=None), timezone.get_current_timezone())


def _empty() -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(SUMMED, 0)
    for _, values, key in BREAKDOWNS:
        row[key] = dict.fromkeys((*values, OTHER), 0)
    row["time_to_recover_p50_s"] = None
    row["time_to_recover_p95_s"] = None
    return row


def _add(target: dict[str, Any], row: Mapping[str, Any]) -> None:
    """Add an aggregated row (flat ``cause_x``/``plan_x`` columns or nested breakdowns) to ``target``."""
    for key in SUMMED:
        target[key] += row.get(key) or 0
    for field, values, key in BREAKDOWNS:
        nested = row.get(key, {})
        for value in (*values, OTHER):
            target[key][value] += nested.get(value, 0) or row.get(f"{field}_{value}") or 0


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


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


def build_report(window: Window, *, rollup: bool = True) -> dict[str, Any]:
    """Every figure per (provider, model), in total, and over time: JSON-ready.

    ``rollup=False`` reads every run of the window row by row (what the rollup must agree
    with; the benchmark compares the two).
    """
    using = router.db_for_read(RecoveryEvent)
    plan = Plan.of(window, rollup)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    series: dict[datetime, dict[str, Any]] = {bucket: _empty() for bucket in buckets(window)}
    total = _empty()

    def group(provider: str, model: str) -> dict[str, Any]:
        return groups.setdefault((provider, model), _empty())

    with tuned(using):
        plan = plan.pinned()
        if plan.uses_rollup:
            for row in rollup_rows(window, plan):
                _add(group(row["provider"], row["model"]), row)
                _add(series.setdefault(row["bucket"], _empty()), row)
        for row in run_rows(window, plan.rows):
            _add(group(row["provider"], row["model"]), row)
            _add(series.setdefault(row["bucket"], _empty()), row)
        for row in event_rows(window, plan.rows):
            _add(group(row["run__provider"], row["run__model"]), row)
            if row["bucket"] is not None:
                point = series.setdefault(_local(row["bucket"]), _empty())
                point["interrupted_runs"] += row["interrupted_runs"]
                point["recovered_runs"] += row["recovered_runs"]
        for row in attempt_rows(plan.rows):
            _add(group(row["run__provider"], row["run__model"]), row)
        for row in percentile_rows(window, plan, using):
            key = row.pop("group")
            (group(*key) if key else total).update(row)
    for row in groups.values():
        _add(total, row)  # the sums; the total's percentiles came from their own query above
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
    unfiltered = Window(window.start, window.end)
    plan = Plan.of(unfiltered)
    pairs = set(Run.objects.filter(plan.rows.runs).order_by().values_list("provider", "model").distinct())
    if plan.uses_rollup:
        rolled = rollup_slots(unfiltered, plan).filter(runs__gt=0)
        pairs |= set(rolled.values_list("provider", "model").distinct())
    return {
        "providers": sorted({provider for provider, _ in pairs}),
        "models": sorted({model for _, model in pairs}),
    }


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
