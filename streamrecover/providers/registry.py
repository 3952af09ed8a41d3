"""Adapter lookup by ``ProviderConfig.name``: the one place that knows every wire format."""

from __future__ import annotations

from collections.abc import Callable

from ..engine.contract import ProviderAdapter, ProviderConfig
from .anthropic import AnthropicAdapter
from .openai_chat import OpenAIChatAdapter

__all__ = ["ADAPTERS", "get_adapter", "register_adapter"]

AdapterFactory = Callable[[ProviderConfig], ProviderAdapter]

ADAPTERS: dict[str, AdapterFactory] = {
    AnthropicAdapter.name: AnthropicAdapter,
    OpenAIChatAdapter.name: OpenAIChatAdapter,
}


def register_adapter(name: str, factory: AdapterFactory) -> None:
    """Add an adapter (the fake provider, a new wire format) without editing this module."""
    ADAPTERS[name] = factory


def get_adapter(config: ProviderConfig) -> ProviderAdapter:
    """The adapter for ``config.name``; a clear ``ValueError`` for a name nobody registered,
    since that is a settings mistake best reported at start-up."""
    factory = ADAPTERS.get(config.name)
    if factory is None:
        known = ", ".join(sorted(ADAPTERS))
        raise ValueError(f"unknown provider adapter {config.name!r}; known adapters: {known}")
    return factory(config)
