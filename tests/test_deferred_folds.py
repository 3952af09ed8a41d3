"""A worker folds a settled run into the analytics after its clients have the run's end, and
the runs of one loop that end together in few folds (``runs.deferred``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from streamrecover.analytics import rollup
from streamrecover.models import AnalyticsRollup, Run
from streamrecover.runs import execution, lifecycle

from .test_runs_layers import RecordingLive

pytestmark = pytest.mark.django_db(transaction=True)


class FoldLog:
    """Wraps ``rollup.fold_runs``: which runs each call folded, noted in a shared log too."""

    def __init__(self, log: list[str], first_call_seconds: float = 0.0) -> None:
        self.log = log
        self.calls: list[list[str]] = []
        self.first_call_seconds = first_call_seconds
        self.real = rollup.fold_runs

    def __call__(self, run_ids: Any = None, **kwargs: Any) -> int:
        ids = sorted(str(run_id) for run_id in run_ids or [])
        if not self.calls and self.first_call_seconds:
            time.sleep(self.first_call_seconds)  # a slow fold: the runs ending meanwhile queue up
        self.calls.append(ids)
        self.log.extend(f"fold:{run_id}" for run_id in ids)
        return self.real(run_ids, **kwargs)


class SharedLive(RecordingLive):
    """Several runs' channels noting their closes in one log, by run id."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def open(self, run_id: str) -> Any:
        inner = super().open(run_id)

        class _Named:
            async def __aenter__(_self) -> SharedLive:
                await inner.__aenter__()
                return self

            async def __aexit__(_self, *exc: Any) -> None:
                await inner.__aexit__(*exc)
                self.log.append(f"closed:{run_id}")

        return _Named()


def test_a_runs_end_reaches_its_live_channel_before_its_fold(monkeypatch) -> None:
    live = RecordingLive()
    folds = FoldLog(live.log)
    monkeypatch.setattr(rollup, "fold_runs", folds)
    run = lifecycle.create_run(prompt="Tell me a story [[words=40]]", faults=["cut:bytes=400"])
    result = asyncio.run(execution.execute_run(str(run.pk), live=live.open))
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    # the channel is closed (its last frame, the run's end, sent) before the fold begins;
    # the fold is done by the time execute_run returns
    assert live.log == ["open:running", "close:completed", f"fold:{run.pk}"]
    assert Run.objects.get(pk=run.pk).analytics_folded
    row = AnalyticsRollup.objects.get()
    assert (row.runs, row.interrupted_runs, row.recovered_runs) == (1, 1, 1)


def test_runs_ending_together_on_one_loop_are_folded_together(monkeypatch) -> None:
    log: list[str] = []
    folds = FoldLog(log, first_call_seconds=1.0)
    monkeypatch.setattr(rollup, "fold_runs", folds)
    runs = [lifecycle.create_run(prompt=f"Story {i} [[words=30]]") for i in range(6)]
    live = SharedLive(log)

    async def all_runs() -> list[Any]:
        return await asyncio.gather(*(execution.execute_run(str(run.pk), live=live.open) for run in runs))

    results = asyncio.run(all_runs())
    assert [r.status for r in results] == [Run.Status.COMPLETED] * 6
    ids = sorted(str(run.pk) for run in runs)
    assert sorted(i for call in folds.calls for i in call) == ids  # each run folded once
    assert len(folds.calls) < len(runs)  # runs waiting while a fold ran were folded in one call
    assert max(len(call) for call in folds.calls) > 1
    for run_id in ids:
        assert log.index(f"closed:{run_id}") < log.index(f"fold:{run_id}")
    assert Run.objects.filter(analytics_folded=True).count() == 6
    assert AnalyticsRollup.objects.get().runs == 6


def test_a_fold_that_fails_leaves_the_run_to_the_periodic_fold(monkeypatch) -> None:
    from streamrecover.tasks import fold_analytics_task

    def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("the rollup table is locked")

    monkeypatch.setattr(rollup, "fold_runs", broken)
    run = lifecycle.create_run(prompt="Tell me a story [[words=20]]")
    result = asyncio.run(execution.execute_run(str(run.pk), live=RecordingLive().open))
    assert result is not None
    assert result.status == Run.Status.COMPLETED  # the run is not failed by it
    assert not Run.objects.get(pk=run.pk).analytics_folded
    monkeypatch.undo()
    assert fold_analytics_task() == 1
    assert Run.objects.get(pk=run.pk).analytics_folded
