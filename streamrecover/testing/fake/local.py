"""The ``fake://`` scheme: this process's shared fake server, and configs pointed at it.

The built-in fake provider is configured as ``fake://streamrecover``: the first use in a
process starts one fake server on loopback and every later use shares it (spacing its SSE
events by ``STREAMRECOVER_FAKE_EVENT_DELAY`` seconds, so a demo streams visibly). Its wire format
follows the model name: OpenAI-style names (``gpt-*``, ``o1``/``o3``/``o4``, ``deepseek-*``)
get the Chat Completions format, everything else the Anthropic Messages format.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace

from ...engine.contract import ProviderConfig
from .server import FakeProviderServer

FAKE_SCHEME = "fake://"
OPENAI_STYLE_PREFIXES = ("gpt", "o1", "o3", "o4", "deepseek", "fake-gpt", "fake-openai")

EVENT_DELAY_ENV = "STREAMRECOVER_FAKE_EVENT_DELAY"

_lock = threading.Lock()
_server: FakeProviderServer | None = None


def local_fake_server() -> FakeProviderServer:
    """This process's fake provider, started on first use."""
    global _server
    with _lock:
        if _server is None:
            server = FakeProviderServer(event_delay=float(os.environ.get(EVENT_DELAY_ENV) or 0))
            server.start()
            _server = server
        return _server


def is_openai_style(model: str) -> bool:
    return model.lower().startswith(OPENAI_STYLE_PREFIXES)


def materialize(config: ProviderConfig, model: str) -> ProviderConfig:
    """Replace a ``fake://`` base URL with the running fake server, in the model's format."""
    if not config.base_url.startswith(FAKE_SCHEME):
        return config
    base = local_fake_server().base_url
    if is_openai_style(model):
        return replace(config, name="openai", base_url=f"{base}/v1", api_key=config.api_key or "fake-key")
    return replace(config, name="anthropic", base_url=base, api_key=config.api_key or "fake-key")
