"""The healing endpoint's tests' kit: Daphne serving the app in a thread, keys, the fake as upstream."""

from __future__ import annotations

import threading
import time
from typing import Any

from django.core.asgi import get_asgi_application

_lock = threading.Lock()
_base_url: str | None = None


def daphne_url() -> str:
    """The base URL of Daphne serving this process's Django app, started once per process
    (Twisted's reactor runs once) in a daemon thread, on a free loopback port."""
    global _base_url
    with _lock:
        if _base_url is None:
            from daphne.endpoints import build_endpoint_description_strings
            from daphne.server import Server

            server = Server(
                get_asgi_application(),
                endpoints=build_endpoint_description_strings(host="127.0.0.1", port=0),
                signal_handlers=False,
                verbosity=0,
            )
            threading.Thread(target=server.run, name="proxy-tests-daphne", daemon=True).start()
            deadline = time.monotonic() + 20
            while not server.listening_addresses:
                if time.monotonic() > deadline:
                    raise RuntimeError("Daphne did not start listening")
                time.sleep(0.02)
            host, port = server.listening_addresses[0]
            _base_url = f"http://{host}:{port}"
        return _base_url


def proxy_settings(base: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The test STREAMRECOVER settings with both formats served by the built-in fake, no backoff,
    a checkpoint at every delta."""
    return {
        **base,
        "PROXY_ANTHROPIC_PROVIDER": "fake",
        "PROXY_OPENAI_PROVIDER": "fake",
        "BACKOFF_SCALE": 0.0,
        "REQUEST_RETRY_BASE": 0.0,
        **extra,
    }
