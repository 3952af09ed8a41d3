"""Forward to a real provider (or the fake) and break its response streams as told."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from streamrecover.testing import ChaosProxy, parse_faults

from ..arguments import port


class Command(BaseCommand):
    help = (
        "Serve a chaos proxy on loopback: requests go to --upstream unchanged, and its streamed answers are "
        "broken by the --fault script (one fault per request), so recovery can be proven against a real model. "
        "Point a provider's BASE_URL at the printed URL."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--upstream",
            required=True,
            help="the provider's origin, e.g. https://api.anthropic.com (request paths are kept: an OpenAI "
            "client's base URL becomes http://127.0.0.1:PORT/v1 for an upstream of https://api.openai.com)",
        )
        parser.add_argument(
            "--fault",
            action="append",
            default=[],
            metavar="SPEC",
            help='a fault for the next request, in order (repeat the option, or separate with ";"): ok, drop, '
            "cut:bytes=N, cut:events=N[,mid], eof:events=N, stall:events=N,seconds=S[,then=cut|eof|continue], "
            "error:events=N[,type=...], garbage:events=N, bad_utf8:events=N, goaway:events=N (HTTP/2), "
            "stall_headers:seconds=S, status:CODE[,retry_after=S]",
        )
        parser.add_argument("--loop", action="store_true", help="start the script over when it runs out")
        parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=port, default=8787, help="port (0: any free port; default 8787)")
        parser.add_argument("--upstream-http2", action="store_true", help="speak HTTP/2 to the upstream where offered")

    def handle(self, *args: Any, **options: Any) -> None:
        specs = [part for spec in options["fault"] for part in spec.replace("\n", ";").split(";") if part.strip()]
        try:
            faults = parse_faults(specs)
        except ValueError as exc:
            raise CommandError(f"--fault: {exc}") from exc
        try:
            proxy = ChaosProxy(
                options["upstream"],
                options["host"],
                options["port"],
                faults=faults,
                loop=options["loop"],
                upstream_http2=options["upstream_http2"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(self._serve(proxy, [str(f) for f in faults]))

    async def _serve(self, proxy: ChaosProxy, faults: list[str]) -> None:
        try:
            url = await proxy.start_async()
        except OSError as exc:
            raise CommandError(f"cannot listen on {proxy.host}:{proxy._requested_port}: {exc}") from exc
        self.stdout.write(f"Chaos proxy listening on {url} -> {proxy.upstream}")
        self.stdout.write(f"  faults: {'; '.join(faults) or 'none'}{' (looped)' if proxy.loop else ''}")
        self.stdout.flush()
        await proxy.serve_forever()
