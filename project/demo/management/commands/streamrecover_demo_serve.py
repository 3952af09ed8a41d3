"""``manage.py streamrecover_demo_serve``: ``make demo``'s server, Daphne's runserver failing when it cannot listen."""

from __future__ import annotations

import errno
import sys
from typing import Any

from daphne.management.commands.runserver import Command as RunserverCommand
from daphne.server import Server


class _Server(Server):
    """Daphne's server remembering why it could not listen: Daphne only logs it, and returns."""

    listen_failure: BaseException | None = None

    def listen_error(self, failure: Any) -> None:
        self.listen_failure = failure.value
        super().listen_error(failure)


class Command(RunserverCommand):
    help = "Daphne's runserver (use --noreload) that exits 1, naming the address, when it cannot listen there."

    def inner_run(self, *args: Any, **options: Any) -> None:
        servers: list[_Server] = []

        def serve(**kwargs: Any) -> _Server:
            servers.append(_Server(**kwargs))
            return servers[-1]

        self.server_cls = serve
        super().inner_run(*args, **options)
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
