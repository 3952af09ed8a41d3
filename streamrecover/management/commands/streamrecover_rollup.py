"""``manage.py streamrecover_rollup``: fold settled runs into the analytics rollup, or rebuild it."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...analytics import rollup
from ...models import AnalyticsRollup, Run


class Command(BaseCommand):
    help = (
        "Fold settled runs into the analytics rollup (after installing the app on an existing "
        "history, or where no beat runs streamrecover.fold_analytics); --rebuild starts it again from the rows."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rebuild", action="store_true", help="empty the rollup and fold every settled run again")
        parser.add_argument("--batch", type=int, default=rollup.BATCH, help="runs per transaction")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        started = time.monotonic()
        fold = rollup.rebuild if opts["rebuild"] else rollup.fold_all
        folded = fold(batch=opts["batch"])
        elapsed = time.monotonic() - started
        unfolded = Run.objects.filter(analytics_folded=False).count()
        self.stdout.write(
            f"folded {folded} run(s) in {elapsed:.1f} s; {AnalyticsRollup.objects.count()} rollup row(s); "
            f"{unfolded} run(s) still counted row by row (not settled yet)"
        )
