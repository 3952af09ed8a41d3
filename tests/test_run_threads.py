"""Waiting for a run executed in a thread of this process waits for the thread too (issue 10):
its last writes come after the terminal status, and a test database flushed under them
deadlocks with them."""

from __future__ import annotations

import threading

import pytest

from streamrecover import starter
from streamrecover.models import Run
from streamrecover.runs import lifecycle
from streamrecover.testing.host import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LINGER = 1.0  # what the run's thread still does after the run's status is terminal


def test_wait_for_returns_once_the_runs_thread_has_ended(monkeypatch):
    settled = threading.Event()
    lingered = threading.Event()
    real_close = starter.close_old_connections

    def after_the_run() -> None:  # start_in_thread's last step, after the terminal status
        settled.set()
        lingered.wait(LINGER)  # never set: the thread lingers LINGER seconds
        real_close()

    monkeypatch.setattr(starter, "close_old_connections", after_the_run)
    run = lifecycle.create_run(prompt="Hi [[words=5]]", provider="fake")
    thread = starter.start_in_thread(str(run.pk))
    assert starter.run_threads(run.pk) == [thread]

    finished = wait_for(run.pk)

    assert finished.status == Run.Status.COMPLETED
    assert settled.is_set()
    assert not thread.is_alive(), "wait_for returned while the run's thread still ran"
    assert starter.run_threads(run.pk) == []
