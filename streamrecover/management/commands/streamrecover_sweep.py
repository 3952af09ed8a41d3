"""The ``streamrecover_sweep`` command: hand back runs nobody executes, and delete leftover checkpoints.

With ``EXECUTION = "celery"`` the swept runs go to the workers. In the one-process mode there
is no worker that outlives this command (a thread started here would die with it), so the
command executes the swept runs itself, to their end, before it exits.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ...conf import app_settings
from ...dispatch import sweep_stale_runs
from ...models import Run
from ...runs import lifecycle
from ...starter import execute_here
from ..arguments import non_negative_float


async def _execute_all(run_ids: list[str]) -> list[Any]:
    return await asyncio.gather(*(execute_here(run_id) for run_id in run_ids), return_exceptions=True)


class Command(BaseCommand):
    help = (
        "Hand back runs nobody executes: running runs whose heartbeat is older than STALE_AFTER_SECONDS "
        "(or --seconds), queued runs older than QUEUED_STALE_AFTER_SECONDS (or --queued-seconds). With "
        "EXECUTION='celery' they go to the workers; in the one-process mode this command executes them to "
        "their end before it exits. Deletes the checkpoints of settled runs a failed delete left behind."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--seconds",
            type=non_negative_float,
            help=(
                "staleness of a running run (default: STALE_AFTER_SECONDS); a shorter one may take a live "
                "worker's run mid-answer (0: every running run): only when no process executes runs"
            ),
        )
        parser.add_argument(
            "--queued-seconds",
            type=non_negative_float,
            help="age of a queued run (default: QUEUED_STALE_AFTER_SECONDS)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if app_settings.EXECUTION == "celery":
            swept = sweep_stale_runs(opts["seconds"], opts["queued_seconds"])
            for run_id in swept:
                self.stdout.write(f"re-queued {run_id}")
            self.stdout.write(f"{len(swept)} run(s) handed to the workers")
            return
        swept = lifecycle.sweep_stale_runs(opts["seconds"], opts["queued_seconds"])
        if not swept:
            self.stdout.write("0 runs to execute")
            return
        self.stdout.write(f"executing {len(swept)} run(s) in this process (EXECUTION is 'inprocess')")
        outcomes = asyncio.run(_execute_all(swept))
        for run_id, outcome in zip(swept, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self.stderr.write(f"{run_id}: {type(outcome).__name__}: {outcome}")
            status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
            self.stdout.write(f"{run_id}: {status}")
