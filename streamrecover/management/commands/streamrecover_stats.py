"""``manage.py streamrecover_stats``: the recovery analytics as a table, or ``--json``.

The same report as the analytics page and ``analytics.json`` (``streamrecover.analytics.report``),
for the runs created in the last ``--window`` (default 24h) or from ``--since`` to
``--until`` (default now), optionally of one ``--provider`` and ``--model``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from ...analytics.definitions import DEFINITIONS
from ...analytics.report import build_report, display
from ...analytics.windows import Window, parse_span


def parse_moment(text: str) -> datetime:
    """An ISO date or date-time; naive values are in the current time zone."""
    value = parse_datetime(text)
    if value is None:
        day = parse_date(text)
        if day is None:
            raise ValueError(f"not an ISO date or date-time: {text!r}")
        value = datetime(day.year, day.month, day.day)
    return value if timezone.is_aware(value) else timezone.make_aware(value)


class Command(BaseCommand):
    help = "Print the stream-recovery figures (interruptions, recoveries, tokens saved, ...) for a window."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--window", default="24h", help="length of the window ending now or at --until (24h, 7d, 30d, 2w)"
        )
        parser.add_argument("--since", help="start of the window (ISO date or date-time); overrides --window")
        parser.add_argument("--until", help="end of the window (ISO date or date-time; default now)")
        parser.add_argument("--provider", help="only runs of this provider")
        parser.add_argument("--model", help="only runs of this model")
        parser.add_argument("--json", action="store_true", help="print the report as one JSON object")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            end = parse_moment(opts["until"]) if opts["until"] else timezone.now()
            filters = {"provider": opts["provider"] or None, "model": opts["model"] or None}
            if opts["since"]:
                window = Window(parse_moment(opts["since"]), end, **filters)
            else:
                window = Window.last(parse_span(opts["window"]), now=end, **filters)
        except OverflowError:
            raise CommandError(f"--window {opts['window']!r} reaches beyond the dates the calendar holds") from None
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        report = build_report(window)
        if opts["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self.stdout.write(render_table(report))


def render_table(report: dict[str, Any]) -> str:
    """Figures down, total then one column per provider/model across; breakdowns below."""
    groups = report["groups"]
    header = ["figure", "total", *(f"{g['provider']}/{g['model']}" for g in groups)]
    rows: list[list[str]] = []
    for figure in DEFINITIONS:
        if figure.unit == "breakdown":
            continue
        values = [report["totals"][figure.key], *(g[figure.key] for g in groups)]
        rows.append([figure.label, *(display(figure.unit, v) for v in values)])
    for figure in DEFINITIONS:
        if figure.unit != "breakdown":
            continue
        rows.append([f"{figure.label}:", *([""] * (len(header) - 1))])
        for label, count in report["totals"][figure.key].items():
            values = [count, *(g[figure.key][label] for g in groups)]
            rows.append([f"  {label}", *(display("count", v) for v in values)])
    window = report["window"]
    scope = " ".join(f"{key}={window[key]}" for key in ("provider", "model") if window[key])
    title = f"Runs created from {window['start']} to {window['end']}" + (f" ({scope})" if scope else "")
    return title + "\n\n" + _columns([header, *rows]) + "\n"


def _columns(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
