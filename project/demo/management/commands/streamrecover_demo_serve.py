"""``manage.py streamrecover_demo_serve``: ``make demo``'s Daphne runserver, finishing the last server's runs first."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from io import StringIO
from typing import Any

from daphne.management.commands.runserver import Command as RunserverCommand
from daphne.server import Server
from django.core.management import call_command
from django.core.management.base import OutputWrapper

from ... import lock


class _Server(Server):
    """Daphne's server remembering why it could not listen (Daphne only logs it, and returns),
    and calling ``on_listening`` once it listens."""

    listen_failure: BaseException | None = None

    def __init__(self, on_listening: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_listening = on_listening

    def listen_success(self, port: Any) -> None:
        super().listen_success(port)
        self.on_listening()

    def listen_error(self, failure: Any) -> None:
        self.listen_failure = failure.value
        super().listen_error(failure)


class Command(RunserverCommand):
    help = (
        "Daphne's runserver (use --noreload) for make demo: first executes to their end the runs a stopped "
        "demo server left (streamrecover_sweep), then prints the demo chat's address once it listens, and "
        "exits 1, naming the address, when it cannot listen there."
    )

    stdout: OutputWrapper  # BaseCommand's (the Daphne command it comes through is untyped)

    def sweep(self) -> None:
        """Execute here, to their end, the runs nobody executes (their server stopped mid-answer).

        Runs execute in the threads of the demo server that started them; one that stopped left
        its runs without a worker. When no other demo process uses this database (they hold its
        demo lock: ``lock.hold``), every run in it is such a run: all are swept at once (``--seconds
        0 --queued-seconds 0``). Another demo server's runs are alive (another port, the same
        database), and so is a ``make demo-cli`` run: sweeping them at once would take them from
        their process mid-answer (its page or terminal would stop streaming, the run go on here).
        Then only the runs whose heartbeat is older than ``STALE_AFTER_SECONDS`` are swept, as
        everywhere else.
        """
        alone = lock.hold(alone=True)  # kept until the process exits: a demo starting later sees it
        windows = ["--seconds", "0", "--queued-seconds", "0"] if alone else []
        out = StringIO()
        call_command("streamrecover_sweep", *windows, stdout=out, stderr=sys.stderr)
        if out.getvalue().strip() != "0 runs to execute":
            self.stdout.write(out.getvalue(), ending="")

    def inner_run(self, *args: Any, **options: Any) -> None:
        self.sweep()
        servers: list[_Server] = []
        out = self.stdout
        # Daphne writes "Starting ... development server at http://HOST:PORT/" before it tries to
        # listen: held back until it does, so an address is never shown for a port it never got.
        held = StringIO()
        self.stdout = OutputWrapper(held)

        def listening() -> None:
            if self.stdout is out:  # one message, whatever calls this again
                return
            self.stdout = out
            out.write(held.getvalue(), ending="")
            host = f"[{self.addr}]" if self._raw_ipv6 else self.addr
            out.write(f"\n  streamrecover demo chat:  http://{host}:{self.port}/streamrecover/")
            out.write("  log in as demo / demo, pick a fault scenario, send a message; Ctrl-C stops the server.\n")
            out.flush()

        def serve(**kwargs: Any) -> _Server:
            servers.append(_Server(on_listening=listening, **kwargs))
            return servers[-1]

        self.server_cls = serve
        try:
            super().inner_run(*args, **options)
        finally:
            self.stdout = out
        failure = next((s.listen_failure for s in servers if s.listen_failure is not None), None)
        if failure is None:
            return
        host = f"[{self.addr}]" if self._raw_ipv6 else self.addr
        address = f"{host}:{self.port}"
        # Twisted's CannotListenError carries the OSError of the bind.
        reason = getattr(failure, "socketError", None)
        if isinstance(reason, OSError) and reason.errno == errno.EADDRINUSE:
            # The port was free when scripts/demo.sh looked (or held without answering): the same
            # words as its own check, so either way the user learns what to do.
            self.stderr.write(
                f"make demo: {address} is in use; choose another port, e.g. DEMO_PORT={int(self.port) + 1} make demo"
            )
        else:
            self.stderr.write(f"make demo: cannot listen on {address}: {reason or failure}")
        # Exits the process: with --noreload this is its main thread, and the reactor never ran.
        sys.exit(1)
