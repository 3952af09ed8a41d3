"""The ``streamrecover_sweep`` command: re-queue (and start) runs whose worker stopped beating."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ...dispatch import sweep_stale_runs


class Command(BaseCommand):
    help = "Re-queue runs whose worker's heartbeat is older than STALE_AFTER_SECONDS (or --seconds)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, help="staleness threshold (default: STALE_AFTER_SECONDS)")

    def handle(self, *args: Any, **opts: Any) -> None:
        swept = sweep_stale_runs(opts["seconds"])
        for run_id in swept:
            self.stdout.write(f"re-queued {run_id}")
        self.stdout.write(f"{len(swept)} stale run(s) re-queued")
