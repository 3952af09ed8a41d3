"""The ``fake://`` scheme: this process's shared fake server, and configs pointed at it.

The built-in fake provider is configured as ``fake://streamrecover``: the first use in a
process starts one fake server on loopback and every later use shares it (spacing its SSE
events by ``STREAMRECOVER_FAKE_EVENT_DELAY`` seconds, so a demo streams visibly). Its wire format
follows the model name: OpenAI-style names (``gpt-*``, ``o1``/``o3``/``o4``, ``deepseek-*``)
get the Chat Completions format, everything else the Anthropic Messages format; a provider whose
``ADAPTER`` is ``openai-responses`` (or ``gemini``) gets the Responses (Gemini) format whatever the model.

With ``STREAMRECOVER_FAKE_URL`` set (e.g. ``http://127.0.0.1:8765``, a
``manage.py streamrecover_fake_provider`` in its own process, as a real provider is),
``fake://`` points there instead and fault scripts go to its control endpoint.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import replace

from ...engine.contract import ProviderConfig
from .faults import Fault
from .server import FakeProviderServer

FAKE_SCHEME = "fake://"
OPENAI_STYLE_PREFIXES = ("gpt", "o1", "o3", "o4", "deepseek", "fake-gpt", "fake-openai")

EVENT_DELAY_ENV = "STREAMRECOVER_FAKE_EVENT_DELAY"
EXTERNAL_URL_ENV = "STREAMRECOVER_FAKE_URL"

_lock = threading.Lock()
_server: FakeProviderServer | None = None


class RemoteFake:
    """A fake provider served by another process: its base URL and its fault scripts."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def set_faults(self, scenario: str, faults: Sequence[Fault | str]) -> None:
        """Replace the scenario's script through ``POST /_fake/faults``."""
        import httpx

        specs = [str(f) if isinstance(f, str) else f.to_dict() for f in faults]
        response = httpx.post(f"{self.base_url}/_fake/faults", json={"scenario": scenario, "faults": specs}, timeout=5)
        response.raise_for_status()


def local_fake_server() -> FakeProviderServer | RemoteFake:
    """This process's fake provider, started on first use (or the one ``STREAMRECOVER_FAKE_URL`` names)."""
    global _server
    external = os.environ.get(EXTERNAL_URL_ENV)
    if external:
        return RemoteFake(external)
    with _lock:
        if _server is None:
            server = FakeProviderServer(event_delay=float(os.environ.get(EVENT_DELAY_ENV) or 0))
            server.start()
            _server = server
        return _server


def is_openai_style(model: str) -> bool:
    return model.lower().startswith(OPENAI_STYLE_PREFIXES)


def fake_adapter(adapter: str, model: str) -> str:
    """The adapter a ``fake://`` provider gets: Responses or Gemini when configured so, else the model's format."""
    if adapter in ("openai-responses", "gemini"):
        return adapter
    return "openai" if is_openai_style(model) else "anthropic"


def materialize(config: ProviderConfig, model: str) -> ProviderConfig:
    """Replace a ``fake://`` base URL with the running fake server, in the model's format."""
    if not config.base_url.startswith(FAKE_SCHEME):
        return config
    base = local_fake_server().base_url
    name = fake_adapter(config.name, model)
    url = base if name in ("anthropic", "gemini") else f"{base}/v1"  # the Gemini adapter adds its version
    # the fake plays OpenAI's own API, whose o-series and gpt-5 take only max_completion_tokens
    field = config.max_tokens_field or ("max_completion_tokens" if name == "openai" else None)
    return replace(config, name=name, base_url=url, api_key=config.api_key or "fake-key", max_tokens_field=field)
