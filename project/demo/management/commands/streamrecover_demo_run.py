"""``manage.py streamrecover_demo_run``: ``make demo-cli``'s ``streamrecover_run``, holding the demo's database lock."""

from __future__ import annotations

from typing import Any

from streamrecover.management.commands.streamrecover_run import Command as RunCommand

from ... import lock


class Command(RunCommand):
    help = (
        f"{RunCommand.help} For make demo-cli: holds the demo database's lock while the run executes, so "
        "a make demo starting meanwhile leaves this run to this process."
    )

    def handle(self, *args: Any, **opts: Any) -> None:
        # Shared: beside other demo processes. A demo server that finds it held sweeps only stale
        # runs, not every run at once (this one is alive, executed here).
        lock.hold(alone=False)
        super().handle(*args, **opts)
