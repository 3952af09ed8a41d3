"""A worker's id is the executing process's: a prefork pool imports the app once and forks, so
an id computed at import would be shared by every child (issue 10)."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable

import pytest
from django.db import connections

from streamrecover.models import Run
from streamrecover.runs import lifecycle

from .factories import make_run

CHILD_DEADLINE = 60.0


def _in_child(work: Callable[[int], None]) -> tuple[int, str]:
    """Fork; the child runs ``work(write_fd)`` and exits at once (never back into pytest).

    Returns the child's pid and what it wrote, once it ended (killed past a generous deadline).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(read_fd)
            work(write_fd)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as reading:
        deadline = time.monotonic() + CHILD_DEADLINE
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child did not finish")
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(status) == 0, "the forked child failed"
        return pid, reading.read()


def test_a_forked_child_computes_its_own_worker_id():
    parent = lifecycle.worker_id()
    assert parent == f"{socket.gethostname()}:{os.getpid()}"

    def work(fd: int) -> None:
        os.write(fd, lifecycle.worker_id().encode())

    child_pid, child = _in_child(work)
    assert child == f"{socket.gethostname()}:{child_pid}"
    assert child != parent
    assert lifecycle.worker_id() == parent  # the parent's is unchanged


@pytest.mark.django_db(transaction=True)
def test_the_claim_records_the_executing_process():
    run = make_run()

    def work(fd: int) -> None:
        # The child must not speak on the parent's database connection: forget it, open its own.
        for conn in connections.all(initialized_only=True):
            conn.connection = None
        claimed = lifecycle.claim_run(str(run.pk))
        os.write(fd, b"claimed" if claimed is not None else b"refused")
        connections.close_all()

    child_pid, said = _in_child(work)
    assert said == "claimed"
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    assert run.worker == f"{socket.gethostname()}:{child_pid}"
    assert run.worker != lifecycle.worker_id()
