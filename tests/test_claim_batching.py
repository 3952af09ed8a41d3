"""Runs that arrive together on a worker's loop are claimed together, and each run is still claimed once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connections
from django.utils import timezone

from streamrecover.models import Attempt, Run
from streamrecover.runs import lifecycle
from streamrecover.runs.claims import MAX_BATCH, Inputs, RunClaims

from .factories import make_attempt, make_message, make_run, make_thread
from .orm_loop import gather_on_one_loop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]


def _run_with_question(question: str, **fields: Any) -> Run:
    thread = make_thread()
    make_message(thread, content=[{"type": "text", "text": question}])
    return make_run(thread=thread, **fields)


def _claim_all(claims: RunClaims, run_ids: list[str]) -> Coroutine[Any, Any, list[Any]]:
    return gather_on_one_loop(*(claims.claim(run_id, "w1") for run_id in run_ids))


def test_runs_arriving_together_are_claimed_in_batches_and_each_gets_its_own_thread() -> None:
    runs = [_run_with_question(f"question {i}") for i in range(20)]
    busy = _run_with_question("busy", status=Run.Status.RUNNING, worker="w2", heartbeat_at=timezone.now())
    done = _run_with_question("done", status=Run.Status.COMPLETED)
    cancelled = _run_with_question("cancel me", cancel_requested=True)
    ids = [str(run.pk) for run in runs]
    ids[5:5] = [str(busy.pk), str(done.pk), str(cancelled.pk)]
    claims = RunClaims()

    outcomes = asyncio.run(_claim_all(claims, ids))

    assert claims.batches == -(-len(ids) // MAX_BATCH)
    assert outcomes[5:8] == [None, None, None]  # running elsewhere, finished, cancelled
    claimed = outcomes[:5] + outcomes[8:]
    assert all(isinstance(inputs, Inputs) for inputs in claimed)
    for i, (run, inputs) in enumerate(zip(runs, claimed, strict=True)):
        assert inputs.run.pk == run.pk
        assert inputs.run.claim_epoch == 1
        assert inputs.messages == [{"role": "user", "content": [{"type": "text", "text": f"question {i}"}]}]
        stored = Run.objects.get(pk=run.pk)
        assert (stored.status, stored.worker, stored.claims, stored.claim_epoch) == (Run.Status.RUNNING, "w1", 1, 1)
        assert stored.started_at is not None
    assert Run.objects.get(pk=busy.pk).worker == "w2"  # untouched
    assert Run.objects.get(pk=busy.pk).claim_epoch == 0
    assert Run.objects.get(pk=cancelled.pk).status == Run.Status.CANCELLED
    assert Run.objects.get(pk=done.pk).claims == 0


@pytest.mark.parametrize("stale_after", [30, 0], ids=["a live claim", "a claim stale at once"])
def test_a_message_delivered_twice_into_one_batch_runs_its_run_once(settings: Any, stale_after: int) -> None:
    # Even where a claim counts as stale the moment it is made (so a later message may take the
    # run over, with a newer epoch), one batch never hands the same claim to two callers.
    settings.STREAMRECOVER = {**settings.STREAMRECOVER, "STALE_AFTER_SECONDS": stale_after}
    run = _run_with_question("once")
    outcomes = asyncio.run(_claim_all(RunClaims(), [str(run.pk), str(run.pk)]))

    assert [type(o) for o in outcomes] == [Inputs, type(None)]
    stored = Run.objects.get(pk=run.pk)
    assert (stored.claims, stored.claim_epoch) == (1, 1)


def test_an_id_that_is_no_run_key_fails_its_caller_only() -> None:
    runs = [_run_with_question(f"q{i}") for i in range(3)]
    ids = [str(runs[0].pk), "not-a-run-id", str(runs[1].pk), str(runs[2].pk)]
    outcomes = asyncio.run(_claim_all(RunClaims(), ids))

    assert isinstance(outcomes[1], ValidationError)
    assert [o.run.pk for o in outcomes if isinstance(o, Inputs)] == [run.pk for run in runs]


def test_a_resumed_run_claimed_in_a_batch_ends_the_attempts_its_dead_worker_left_open() -> None:
    stale = timezone.now() - timedelta(hours=1)
    dead = _run_with_question("resume me", status=Run.Status.RUNNING, worker="gone", heartbeat_at=stale, claims=1)
    Run.objects.filter(pk=dead.pk).update(claim_epoch=1)
    make_attempt(dead, outcome="pending")
    fresh = _run_with_question("new")
    make_attempt(fresh, outcome="pending")  # not an earlier claim's: a first claim leaves it

    outcomes = asyncio.run(_claim_all(RunClaims(), [str(dead.pk), str(fresh.pk)]))

    assert [o.run.claim_epoch for o in outcomes] == [2, 1]
    assert outcomes[0].consumed == 1  # its earlier claim's attempt is counted, not replayed
    assert Attempt.objects.get(run=dead).outcome == "interrupted"
    assert Attempt.objects.get(run=dead).error_kind == "worker_lost"
    assert Attempt.objects.get(run=fresh).outcome == "pending"


def test_two_workers_claiming_the_same_runs_at_once_claim_each_run_exactly_once() -> None:
    runs = [_run_with_question(f"q{i}") for i in range(40)]
    ids = [str(run.pk) for run in runs]
    won: dict[str, list[str]] = {"a": [], "b": []}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def worker(name: str, order: list[str]) -> None:
        try:
            start.wait()
            for first in range(0, len(order), MAX_BATCH):
                batch = order[first : first + MAX_BATCH]
                claimed = lifecycle.claim_runs(batch, worker=name)
                won[name] += [str(run.pk) for run in claimed if run is not None]
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    # The other worker goes through the runs in reverse, its batches overlapping the first's
    threads = [
        threading.Thread(target=worker, args=("a", ids)),
        threading.Thread(target=worker, args=("b", ids[::-1])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert errors == []  # no deadlock between the two: both lock in key order
    assert sorted(won["a"] + won["b"]) == sorted(ids)  # every run claimed, none twice
    for run in Run.objects.filter(pk__in=ids):
        assert run.claims == 1
        assert run.worker == ("a" if str(run.pk) in won["a"] else "b")
