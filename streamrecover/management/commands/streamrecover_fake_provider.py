"""Serve the fault-injecting fake LLM provider until interrupted (the demo's "provider")."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from streamrecover.testing import DEFAULT_SCENARIO, FakeProviderServer, fake_server

from ..arguments import non_negative_float, port


class Command(BaseCommand):
    help = (
        "Serve the fake LLM provider (Anthropic /v1/messages, OpenAI /v1/chat/completions) with scripted "
        "faults, and print its base URL."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=port, default=8765, help="port (0: any free port; default 8765)")
        parser.add_argument(
            "--faults",
            default="",
            help='initial fault script, e.g. "cut:bytes=900;ok" (see streamrecover.testing.fake.faults)',
        )
        parser.add_argument("--scenario", default=DEFAULT_SCENARIO, help="scenario key the --faults script is for")
        parser.add_argument(
            "--event-delay", type=non_negative_float, default=0.0, help="seconds between SSE events (e.g. 0.02)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["scenario"]:
            raise CommandError("--scenario must be a non-empty key")
        if options["scenario"] != DEFAULT_SCENARIO and not options["faults"]:
            # the scenario only names the --faults script: without one it would be silently unused
            raise CommandError(f"--scenario {options['scenario']!r} names the --faults script: give --faults too")
        try:
            server = fake_server(
                options["host"],
                options["port"],
                event_delay=options["event_delay"],
                script=options["faults"],
                scenario=options["scenario"],
            )
        except ValueError as exc:
            raise CommandError(f"--faults: {exc}") from exc
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(self._serve(server))

    async def _serve(self, server: FakeProviderServer) -> None:
        try:
            url = await server.start_async()
        except OSError as exc:  # a taken port, or a --host that is no address (socket.gaierror)
            raise CommandError(f"cannot listen on {server.host}:{server._requested_port}: {exc}") from exc
        self.stdout.write(f"Fake provider listening on {url}")
        self.stdout.write(f"  Anthropic base URL: {url}    OpenAI base URL: {url}/v1")
        self.stdout.flush()
        await server.serve_forever()
