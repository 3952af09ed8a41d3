"""The analytics rollup: settled runs folded into ``AnalyticsRollup``, so that reports read slots, not events.

A run is *folded* once it is terminal: its figures, computed by the very queries a report
runs row by row (``queries.event_rows_by_run`` and friends), are added to the row of its
15-minute slot and provider/model, and ``Run.analytics_folded`` is set, in one transaction.
A report counts a folded run from the rollup and an unfolded one from its rows, so folding
late (or never) only costs speed, never correctness.

- ``fold_runs`` folds settled runs (the worker folds its run as it finishes it; the
  ``streamrecover.fold_analytics`` task and ``manage.py streamrecover_rollup`` fold whatever
  is left, in batches). Runs being folded are locked with ``SKIP LOCKED``, so folders never
  wait on each other and never fold a run twice.
- ``unfold_run`` takes a run's figures back out: before a re-queue (its facts will change)
  and before a folded run is deleted.
- ``rebuild`` starts again from the rows (after restoring a backup, say).

Slot rows are locked in one order (slot, provider, model), so concurrent folders cannot
deadlock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog
from django.db import router, transaction
from django.db.models import Q

from ..models import AnalyticsRollup, Run
from . import queries
from .definitions import ROLLUP_COUNTERS
from .windows import slot_floor

log = structlog.get_logger("streamrecover.rollup")

BATCH = 500
_TOLERANCE = 1e-6  # seconds: a duration read back from JSON is the one that went in


@dataclass(slots=True)
class Contribution:
    """What some runs add to one rollup row: the counters and the recovery durations."""

    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLLUP_COUNTERS, 0))
    recover_seconds: list[float] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        for key in ROLLUP_COUNTERS:
            self.counters[key] += row.get(key) or 0


Key = tuple[datetime, str, str]  # slot, provider, model


def contributions(runs: Q) -> dict[Key, Contribution]:
    """The rollup rows' worth of the runs matching ``runs``, by slot and provider/model."""
    scope = queries.Scope(runs)
    keys: dict[Any, Key] = {}
    found: dict[Key, Contribution] = {}
    for pk, provider, model, created in (
        Run.objects.filter(runs).order_by().values_list("pk", "provider", "model", "created")
    ):
        keys[pk] = (slot_floor(created), provider, model)
        found.setdefault(keys[pk], Contribution()).counters["runs"] += 1
    for row in queries.event_rows_by_run(scope):
        found[keys[row["run_id"]]].add(row)
    for row in queries.attempt_rows_by_run(scope):
        found[keys[row["run_id"]]].add(row)
    for run_id, duration in queries.recoveries(scope).values_list("run_id", "duration"):
        found[keys[run_id]].recover_seconds.append(queries.seconds(duration) or 0.0)
    return found


def _apply(key: Key, contribution: Contribution, sign: int) -> None:
    """Add (``sign`` 1) or take back (-1) a contribution, holding the slot row's lock."""
    slot, provider, model = key
    row, _ = AnalyticsRollup.objects.get_or_create(slot=slot, provider=provider, model=model)
    row = AnalyticsRollup.objects.select_for_update().get(pk=row.pk)
    for name, value in contribution.counters.items():
        setattr(row, name, getattr(row, name) + sign * value)
    if sign > 0:
        row.recover_seconds = [*row.recover_seconds, *contribution.recover_seconds]
    else:
        row.recover_seconds = _without(row.recover_seconds, contribution.recover_seconds)
    if row.runs <= 0:  # nothing left in the slot: no empty rows
        row.delete()
    else:
        row.save()


def _without(values: list[float], removed: Iterable[float]) -> list[float]:
    """``values`` less one occurrence of each of ``removed`` (a multiset difference)."""
    remaining = list(values)
    for value in removed:
        for index, kept in enumerate(remaining):
            if math.isclose(kept, value, rel_tol=0.0, abs_tol=_TOLERANCE):
                del remaining[index]
                break
    return remaining


def fold_runs(run_ids: Iterable[Any] | None = None, *, batch: int = BATCH) -> int:
    """Fold up to ``batch`` settled, unfolded runs (of ``run_ids``, or any); returns how many."""
    using = router.db_for_write(AnalyticsRollup)
    with transaction.atomic(using=using):
        settled = Run.objects.filter(status__in=Run.TERMINAL_STATUSES, analytics_folded=False)
        if run_ids is not None:
            settled = settled.filter(pk__in=list(run_ids))
        locked = settled.order_by("created", "pk").select_for_update(skip_locked=True)
        ids = list(locked.values_list("pk", flat=True)[:batch])
        if not ids:
            return 0
        for key, contribution in sorted(contributions(Q(pk__in=ids)).items()):
            _apply(key, contribution, +1)
        Run.objects.filter(pk__in=ids).update(analytics_folded=True)
    return len(ids)


def fold_all(*, batch: int = BATCH, limit: int | None = None) -> int:
    """Fold every settled run (or ``limit`` of them) in batches of ``batch``; returns how many."""
    total = 0
    while limit is None or total < limit:
        folded = fold_runs(batch=batch if limit is None else min(batch, limit - total))
        if not folded:
            break
        total += folded
    return total


def fold_settled(run_ids: list[Any]) -> None:
    """After runs settle: fold them now, so reports find them in the rollup at once.

    Best effort: a failure is logged and the periodic fold picks the runs up later (they are
    counted row by row meanwhile, so reports stay right).
    """
    try:
        for start in range(0, len(run_ids), BATCH):
            fold_runs(run_ids[start : start + BATCH])
    except Exception:
        log.exception("analytics_fold_failed", run_ids=[str(run_id) for run_id in run_ids])


def unfold_run(run_id: Any) -> bool:
    """Take a folded run's figures back out of the rollup (before its facts change)."""
    using = router.db_for_write(AnalyticsRollup)
    with transaction.atomic(using=using):
        run = Run.objects.select_for_update().filter(pk=run_id, analytics_folded=True).first()
        if run is None:
            return False
        for key, contribution in sorted(contributions(Q(pk=run.pk)).items()):
            _apply(key, contribution, -1)
        Run.objects.filter(pk=run.pk).update(analytics_folded=False)
    return True


def rebuild(*, batch: int = BATCH) -> int:
    """Empty the rollup and fold every settled run again, from the rows."""
    using = router.db_for_write(AnalyticsRollup)
    with transaction.atomic(using=using):
        AnalyticsRollup.objects.all().delete()
        Run.objects.filter(analytics_folded=True).update(analytics_folded=False)
    return fold_all(batch=batch)
