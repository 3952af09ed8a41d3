"""A run whose provider the executing process cannot reach as configured (its API key missing from a
worker's environment, the provider gone from the settings) fails at once saying why, before any
provider call, instead of being left ``running`` with nobody streaming it until the sweep's claims
ran out (``too_many_claims``); the runs claimed beside it on a worker's loop go on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from streamrecover import starter
from streamrecover.models import Attempt, Run
from streamrecover.runs import lifecycle
from streamrecover.runs.loop import run_on_shared_loop
from streamrecover.tasks import execute_run_task

pytestmark = pytest.mark.django_db(transaction=True)

KEY_ENV = "STREAMRECOVER_TEST_KEY_NOBODY_SETS"
KEYLESS = {
    **settings.STREAMRECOVER,
    "PROVIDERS": {"keyless": {"ADAPTER": "anthropic", "BASE_URL": "https://api.anthropic.com", "API_KEY_ENV": KEY_ENV}},
}


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def _failed_saying_why(run: Run, says: str) -> None:
    run.refresh_from_db()
    assert (run.status, run.error_kind) == (Run.Status.FAILED, "provider_unavailable")
    assert says in run.error_message
    assert run.finished_at is not None
    assert Attempt.objects.filter(run=run).count() == 0  # no provider call


@override_settings(STREAMRECOVER=KEYLESS)
def test_a_run_whose_key_the_worker_lacks_fails_naming_the_variable() -> None:
    # (the web process had the key when it accepted the run; the worker's environment has not)
    run = lifecycle.create_run(prompt="Summarise this contract", provider="keyless", model="claude-sonnet-4-5")
    assert execute_run_task(str(run.pk)) == "failed"
    _failed_saying_why(run, KEY_ENV)


def test_a_run_whose_provider_left_the_settings_fails_naming_it() -> None:
    with override_settings(STREAMRECOVER=KEYLESS):
        run = lifecycle.create_run(prompt="Hello", provider="keyless", model="claude-sonnet-4-5")
    assert execute_run_task(str(run.pk)) == "failed"
    _failed_saying_why(run, "'keyless'")


@override_settings(STREAMRECOVER=KEYLESS)
def test_the_runs_claimed_beside_it_on_a_workers_loop_go_on() -> None:
    keyless = lifecycle.create_run(prompt="Hello", provider="keyless", model="claude-sonnet-4-5")
    fine = lifecycle.create_run(prompt="Hello [[words=20]]", provider="fake", model="fake-claude")

    async def both() -> tuple[Any, ...]:
        runs = (starter.execute_here(str(keyless.pk)), starter.execute_here(str(fine.pk)))
        return await asyncio.gather(*runs, return_exceptions=True)

    results = run_on_shared_loop(both())  # claimed together, as a worker's runs arriving at once are

    assert [getattr(result, "status", result) for result in results] == ["failed", "completed"]
    _failed_saying_why(keyless, KEY_ENV)
    fine.refresh_from_db()
    assert fine.status == Run.Status.COMPLETED
