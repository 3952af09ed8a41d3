"""The one adapter registry: built-in wire formats by name, anything else by dotted path.

A provider's ``ADAPTER`` setting (``ProviderConfig.name``) is either a registered name
(``"anthropic"``, ``"openai"``, ``"openai-responses"``, ``"gemini"``, or one added with
``register_adapter``) or the dotted path
of a factory that takes a ``ProviderConfig`` and returns a ``ProviderAdapter``
(``"myproject.adapters.GeminiAdapter"``), imported on first use. Settings validation asks
this module, so whatever an adapter lookup accepts also passes validation, and an adapter that
lacks members of ``ProviderAdapter`` (or has some of ``ResumableAdapter``'s but not all) is
reported there rather than mid-run. Django-free.
"""

from __future__ import annotations

import dis
import importlib
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any, cast

from ..engine.contract import ProviderAdapter, ProviderConfig, ResumableAdapter, is_protocol_class, protocol_members
from .anthropic import AnthropicAdapter
from .gemini import GeminiAdapter
from .openai_chat import OpenAIChatAdapter
from .openai_responses import OpenAIResponsesAdapter

__all__ = [
    "ADAPTERS",
    "ADAPTER_MEMBERS",
    "RESUMABLE_MEMBERS",
    "AdapterFactory",
    "adapter_factory",
    "adapter_problem",
    "get_adapter",
    "register_adapter",
]

AdapterFactory = Callable[[ProviderConfig], ProviderAdapter]

# Registered names -> factories: the built-ins, plus whatever ``register_adapter`` adds.
ADAPTERS: dict[str, AdapterFactory] = {
    AnthropicAdapter.name: AnthropicAdapter,
    OpenAIChatAdapter.name: OpenAIChatAdapter,
    OpenAIResponsesAdapter.name: OpenAIResponsesAdapter,
    GeminiAdapter.name: GeminiAdapter,
}


# What every adapter must have; the docs list them (docs/providers.md, "Writing an adapter").
ADAPTER_MEMBERS = protocol_members(ProviderAdapter)
# Optional, but all of them or none: an adapter with some is not resumable to the engine (a
# ``native_resume`` without ``resume_request`` would be ignored, or fail at a stream's break).
RESUMABLE_MEMBERS = protocol_members(ResumableAdapter)


def register_adapter(name: str, factory: AdapterFactory) -> None:
    """Add an adapter (a new wire format, a test double) under ``name`` without editing this module.

    A ``ValueError`` instead, leaving the registry as it was, for a name that is empty or no
    string, a factory that is not callable, or one whose class shows it lacks members of
    ``ProviderAdapter`` or has only some of ``ResumableAdapter``'s: the mistake is reported
    where it is made, not when a provider first names the adapter.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"an adapter's name is a non-empty string, not {name!r}")
    if not callable(factory):
        raise ValueError(f"provider adapter {name!r}: the factory {factory!r} is not callable")
    problem = _members_problem(name, factory)
    if problem is not None:
        raise ValueError(problem)
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


def _partial(missing: Sequence[str]) -> list[str]:
    """``missing``, the members of ``ResumableAdapter`` an adapter lacks, where it has the others;
    nothing where it has none of them (an adapter that does not resume natively)."""
    return list(missing) if len(missing) < len(RESUMABLE_MEMBERS) else []


def _lacks(name: str, missing: Sequence[str], partial: Sequence[str] = ()) -> str:
    parts = [f"{', '.join(missing)} of ProviderAdapter"] if missing else []
    why = ""
    if partial:
        parts.append(f"{', '.join(partial)} of ResumableAdapter")
        having = ", ".join(member for member in RESUMABLE_MEMBERS if member not in partial)
        why = f"it has {having}, and an adapter has all of ResumableAdapter's members or none; "
    return (
        f"provider adapter {name!r} lacks {' and '.join(parts)} (streamrecover.engine.contract): "
        f"{why}see docs/providers.md 'Writing an adapter'"
    )


def _assigned(cls: type) -> set[str]:
    """The attribute names the methods of ``cls`` assign (``self.name = ...`` in ``__init__``)."""
    names: set[str] = set()
    for base in cls.__mro__:
        if base is object or is_protocol_class(base):
            continue
        for value in vars(base).values():
            function = value.__func__ if isinstance(value, classmethod | staticmethod) else value
            if inspect.isfunction(function) and inspect.isfunction(function := inspect.unwrap(function)):
                names.update(i.argval for i in dis.get_instructions(function) if i.opname == "STORE_ATTR")
    return names


def _built_class(factory: object) -> type | None:
    """The class whose instances ``factory`` returns, where that shows without calling it: the
    factory itself, or the class its return annotation names (not a protocol). None otherwise."""
    if isinstance(factory, type):
        return factory
    try:
        built = typing.get_type_hints(factory).get("return")
    except Exception:  # not a function, or an annotation that does not resolve: nothing to see
        return None
    return built if isinstance(built, type) and not is_protocol_class(built) else None


def missing_members(factory: object, protocol: type = ProviderAdapter) -> list[str]:
    """The members of ``protocol`` that ``factory``'s adapters lack, as far as its class shows
    without building one (validation calls no factory: it may open clients, read files).

    A member counts as there when the class (not a protocol it subclasses) has it, declares it
    (``name: str``) or assigns it in a method (``self.name = ...``); a class with ``__getattr__``
    (a delegating wrapper) may have anything, and a factory whose class does not show lacks
    nothing here: ``get_adapter`` checks what such factories build.
    """
    cls = _built_class(factory)
    if cls is None or any("__getattr__" in vars(base) for base in cls.__mro__[:-1]):
        return []
    assigned: set[str] | None = None
    missing = []
    for member in protocol_members(protocol):
        owner = next((base for base in cls.__mro__ if member in vars(base)), None)
        if owner is not None and not is_protocol_class(owner):
            continue
        if any(member in inspect.get_annotations(base) for base in cls.__mro__ if not is_protocol_class(base)):
            continue
        assigned = _assigned(cls) if assigned is None else assigned
        if member not in assigned:
            missing.append(member)
    return missing


def adapter_problem(name: object) -> str | None:
    """Why ``name`` is not a usable ``ADAPTER`` value, or ``None`` when it is (settings validation)."""
    if not isinstance(name, str) or not name:
        known = ", ".join(map(repr, sorted(ADAPTERS)))
        return f"must be an adapter name ({known}) or the dotted path of a factory taking a ProviderConfig"
    try:
        factory = adapter_factory(name)
    except ValueError as exc:
        return str(exc)
    return _members_problem(name, factory)


def _members_problem(name: str, factory: object) -> str | None:
    """What members ``factory``'s class shows it lacks, in ``_lacks``'s words; ``None`` when none."""
    missing = missing_members(factory)
    partial = _partial(missing_members(factory, ResumableAdapter))
    return _lacks(name, missing, partial) if missing or partial else None


_ABSENT = object()

# Adapter classes whose instances need no check (``_complete``): a run, a proxied request each
# build one, and looking at every member of the instance costs ~60 µs.
_COMPLETE: set[type] = set()


def _has(adapter: Any, member: str) -> bool:
    """Whether ``adapter`` has ``member``: found without running a property, or else served
    by its ``__getattr__``."""
    return inspect.getattr_static(adapter, member, _ABSENT) is not _ABSENT or hasattr(adapter, member)


def _complete(cls: type) -> bool:
    """Whether every instance of ``cls`` is a whole adapter, as the class shows: each member of
    ``ProviderAdapter`` on it, and ``ResumableAdapter``'s all defined by it or none there at all
    (not declared, not assigned by a method, no ``__getattr__`` that could serve them)."""
    if not all(hasattr(cls, member) for member in ADAPTER_MEMBERS):
        return False
    bases = [base for base in cls.__mro__ if not is_protocol_class(base)]
    defined = [member for member in RESUMABLE_MEMBERS if any(member in vars(base) for base in bases)]
    if len(defined) == len(RESUMABLE_MEMBERS):
        return True
    return not defined and len(missing_members(cls, ResumableAdapter)) == len(RESUMABLE_MEMBERS)


def _lacking(adapter: Any) -> tuple[list[str], list[str]]:
    """The members of ``ProviderAdapter`` that ``adapter`` lacks, and those of ``ResumableAdapter``
    where it has only some."""
    cls = type(adapter)
    if cls in _COMPLETE:
        return [], []
    if _complete(cls):
        _COMPLETE.add(cls)
        return [], []
    missing = [member for member in ADAPTER_MEMBERS if not _has(adapter, member)]
    return missing, _partial([member for member in RESUMABLE_MEMBERS if not _has(adapter, member)])


def get_adapter(config: ProviderConfig) -> ProviderAdapter:
    """The adapter for ``config.name``; a clear ``ValueError`` for a name nobody registered, or
    for an adapter without every member of ``ProviderAdapter`` or with only some of
    ``ResumableAdapter``'s (before any request, rather than an ``AttributeError`` mid-run or a
    native resume silently not done), since either is a settings mistake best reported at start-up."""
    adapter = adapter_factory(config.name)(config)
    missing, partial = _lacking(adapter)
    if missing or partial:
        raise ValueError(_lacks(config.name, missing, partial))
    return adapter
