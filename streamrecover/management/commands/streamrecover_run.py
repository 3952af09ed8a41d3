"""The ``streamrecover_run`` command: one run to its end, for a person or (``--json``) a program.

The contract of this command's flags and of its JSON output is relied on by other tools;
change it only by adding.

stdout is the command's own: the live view, or (``--json``) the JSON object alone. While the
run executes, anything else written to stdout (structlog's default configuration prints its
lines there in a project that has not configured logging) goes to stderr instead.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, TextIO, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...cli.driver import RunOptions, RunTimeout, execute_cli_run
from ...models import Run
from ..arguments import non_negative_float, non_negative_int, positive_float, positive_int


class Command(BaseCommand):
    help = "Run one streamed LLM run with stream recovery, showing it as it happens."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--provider",
            help="a provider name from STREAMRECOVER['PROVIDERS'] (built in: fake, anthropic, openai, "
            "openai-responses, gemini; default: DEFAULT_PROVIDER)",
        )
        parser.add_argument("--base-url", help="provider base URL (default: from settings)")
        parser.add_argument("--api-key", help="API key (default: from settings or the environment)")
        parser.add_argument("--model", help="model name (default: DEFAULT_MODEL)")
        parser.add_argument("--prompt", required=True, help="the user message")
        parser.add_argument("--system", help="system prompt")
        parser.add_argument(
            "--max-tokens", type=positive_int, default=1024, help="the turn's output budget (default 1024)"
        )
        parser.add_argument(
            "--thinking-budget", type=positive_int, help="enable extended thinking with this token budget"
        )
        parser.add_argument(
            "--max-continuations",
            type=non_negative_int,
            help="continuation attempts per turn (default: MAX_CONTINUATIONS)",
        )
        parser.add_argument(
            "--backoff-scale",
            type=non_negative_float,
            help="multiplies the backoff schedule, 0 for none (default: BACKOFF_SCALE)",
        )
        parser.add_argument(
            "--idle-timeout",
            type=positive_float,
            help="seconds without a byte that count as a stall (default: IDLE_TIMEOUT)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of the live view")
        parser.add_argument(
            "--fault",
            action="append",
            default=[],
            help="fake provider only: a fault for the next provider call, in order (e.g. cut:bytes=900)",
        )
        parser.add_argument("--demo-tools", action="store_true", help="offer the demo tools (get_weather)")
        parser.add_argument(
            "--enqueue",
            action="store_true",
            help="start the run the configured way (a Celery worker when EXECUTION is celery) and wait for it",
        )
        parser.add_argument(
            "--timeout",
            type=positive_float,
            default=600.0,
            help="with --enqueue: seconds to wait for the run to end before giving up (default 600)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        options = RunOptions(
            provider=opts["provider"],
            model=opts["model"],
            prompt=opts["prompt"],
            system=opts["system"],
            max_tokens=opts["max_tokens"],
            thinking_budget=opts["thinking_budget"],
            base_url=opts["base_url"],
            api_key=opts["api_key"],
            max_continuations=opts["max_continuations"],
            backoff_scale=opts["backoff_scale"],
            idle_timeout=opts["idle_timeout"],
            faults=opts["fault"],
            demo_tools=opts["demo_tools"],
            enqueue=opts["enqueue"],
            timeout=opts["timeout"],
        )
        # the stream under OutputWrapper, which would end every write with a newline
        live = None if opts["json"] else cast(TextIO, self.stdout._out)
        try:
            # self.stdout holds the real stdout; anything else printed meanwhile is a log line
            with contextlib.redirect_stdout(sys.stderr):
                output = execute_cli_run(options, live=live)
        except (ValueError, ImproperlyConfigured, RunTimeout) as exc:
            raise CommandError(str(exc)) from exc
        if opts["json"]:
            self.stdout.write(json.dumps(output, ensure_ascii=False, default=str))
        if output["status"] != Run.Status.COMPLETED:
            raise SystemExit(1)
