"""The ``streamrecover_cancel RUN_ID`` command: stop a run; no continuation follows."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...runs.lifecycle import request_cancel
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
