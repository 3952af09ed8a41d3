"""The healing endpoint's tests' kit: Daphne serving the app in a thread, keys, the fake as upstream."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from django.core.asgi import get_asgi_application

from streamrecover.testing.fake.local import local_fake_server

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


def fake_providers(api_key: str) -> dict[str, dict[str, str]]:
    """Providers served by the built-in fake, with a provider key of their own: ``fake`` (the
    Anthropic and Chat formats) and ``fake-responses`` (the Responses dialect)."""
    fake = {"ADAPTER": "anthropic", "BASE_URL": "fake://streamrecover", "API_KEY": api_key}
    return {"fake": fake, "fake-responses": {**fake, "ADAPTER": "openai-responses"}}


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


def upstream_events(path: str, body: dict[str, Any]) -> int:
    """How many SSE events the fake sends for ``body`` uninterrupted (each is a boundary to cut at)."""
    headers = {"x-api-key": "k", "authorization": "Bearer k", "anthropic-version": "2023-06-01"}
    response = httpx.post(local_fake_server().base_url + path, json={**body, "stream": True}, headers=headers)
    return sum(1 for line in response.text.splitlines() if line.startswith("data:"))


def sweep(answer: Callable[[str], dict[str, Any]], cuts: range) -> list[dict[str, Any]]:
    """``answer(faults)`` for a cut at every boundary, a few at a time (each is one proxied run)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda cut: answer(f"cut:events={cut}"), cuts))
