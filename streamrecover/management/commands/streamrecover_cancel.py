"""The ``streamrecover_cancel RUN_ID`` command: stop a run; no continuation follows.

A queued run cancelled after it had started (its worker died) must be claimed once more, so
that what its client was shown is committed: the thread that does it is this command's (in
every mode), and a thread dies with its process, so the command waits for it.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...models import Run
from ...runs.lifecycle import request_cancel
from ...starter import run_threads
from ..arguments import run_id


class Command(BaseCommand):
    help = "Cancel a queued or running run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", type=run_id, help="the run's id (a UUID)")
        parser.add_argument(
            "--reason",
            default="cancelled from the command line",
            help="recorded with the cancellation (default: 'cancelled from the command line')",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if not request_cancel(opts["run_id"], opts["reason"]):
            raise CommandError(f"run {opts['run_id']} does not exist or has already ended")
        self.stdout.write(f"cancel requested for {opts['run_id']}")
        threads = run_threads(opts["run_id"])  # started here to end the run (a queued run that had started)
        if threads:
            self.stdout.write("waiting for the run to commit what its client was shown")
            for thread in threads:
                thread.join()
            status = Run.objects.filter(pk=opts["run_id"]).values_list("status", flat=True).first()
            self.stdout.write(f"{opts['run_id']}: {status}")
