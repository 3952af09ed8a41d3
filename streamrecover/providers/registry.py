"""The one adapter registry: built-in wire formats by name, anything else by dotted path.

A provider's ``ADAPTER`` setting (``ProviderConfig.name``) is either a registered name
(``"anthropic"``, ``"openai"``, ``"gemini"``, or one added with ``register_adapter``) or the dotted path
of a factory that takes a ``ProviderConfig`` and returns a ``ProviderAdapter``
(``"myproject.adapters.GeminiAdapter"``), imported on first use. Settings validation asks
this module, so whatever an adapter lookup accepts also passes validation. Django-free.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

from ..engine.contract import ProviderAdapter, ProviderConfig
from .anthropic import AnthropicAdapter
from .gemini import GeminiAdapter
from .openai_chat import OpenAIChatAdapter
from .openai_responses import OpenAIResponsesAdapter

__all__ = ["ADAPTERS", "AdapterFactory", "adapter_factory", "adapter_problem", "get_adapter", "register_adapter"]

AdapterFactory = Callable[[ProviderConfig], ProviderAdapter]

# Registered names -> factories: the built-ins, plus whatever ``register_adapter`` adds.
ADAPTERS: dict[str, AdapterFactory] = {
    AnthropicAdapter.name: AnthropicAdapter,
    OpenAIChatAdapter.name: OpenAIChatAdapter,
    OpenAIResponsesAdapter.name: OpenAIResponsesAdapter,
    GeminiAdapter.name: GeminiAdapter,
}


def register_adapter(name: str, factory: AdapterFactory) -> None:
    """Add an adapter (a new wire format, a test double) under ``name`` without editing this module."""
    ADAPTERS[name] = factory


def adapter_factory(name: str) -> AdapterFactory:
    """The factory for a registered name or a dotted path; a ``ValueError`` naming what is known otherwise."""
    factory = ADAPTERS.get(name)
    if factory is not None:
        return factory
    known = ", ".join(map(repr, sorted(ADAPTERS)))
    if "." not in name:
        raise ValueError(
            f"unknown provider adapter {name!r}; known adapters: {known}, "
            "or the dotted path of a factory taking a ProviderConfig"
        )
    module_path, _, attribute = name.rpartition(".")
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise ValueError(f"cannot import provider adapter {name!r} ({exc}); known adapters: {known}") from exc
    found = getattr(module, attribute, None)
    if found is None or not callable(found):
        raise ValueError(
            f"provider adapter {name!r}: module {module_path!r} has no callable {attribute!r}; known adapters: {known}"
        )
    return cast(AdapterFactory, found)


def adapter_problem(name: object) -> str | None:
    """Why ``name`` is not a usable ``ADAPTER`` value, or ``None`` when it is (settings validation)."""
    if not isinstance(name, str) or not name:
        known = ", ".join(map(repr, sorted(ADAPTERS)))
        return f"must be an adapter name ({known}) or the dotted path of a factory taking a ProviderConfig"
    try:
        adapter_factory(name)
    except ValueError as exc:
        return str(exc)
    return None


def get_adapter(config: ProviderConfig) -> ProviderAdapter:
    """The adapter for ``config.name``; a clear ``ValueError`` for a name nobody registered,
    since that is a settings mistake best reported at start-up."""
    return adapter_factory(config.name)(config)
