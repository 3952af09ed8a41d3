"""System checks for configurations that break recovery quietly, each with a stable id.

Celery values are read from Django settings under the ``CELERY_`` namespace (how the demo
project and most Django projects configure Celery), so ``override_settings`` is obeyed.
Every id is listed in the README's "System checks" section, and each has a test.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .conf import SETTINGS_NAME, import_tools, merge, proxy_wire_format, validate

IN_MEMORY_LAYER = "channels.layers.InMemoryChannelLayer"


def _streamrecover() -> dict[str, Any] | None:
    """The merged settings, or None when E001 already reports them as invalid."""
    user = getattr(settings, SETTINGS_NAME, {})
    return None if validate(user) else merge(user)


def _uses_celery(conf: Mapping[str, Any]) -> bool:
    return conf["EXECUTION"] == "celery"


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.E001: unknown keys or invalid values in STREAMRECOVER."""
    return [
        Error(problem, hint="See streamrecover.conf.DEFAULTS for every key.", id="streamrecover.E001")
        for problem in validate(getattr(settings, SETTINGS_NAME, {}))
    ]


def check_channel_layer(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.W002: a Celery worker is another process; an in-memory layer cannot carry its frames."""
    conf = _streamrecover()
    if conf is None or not _uses_celery(conf):
        return []
    layer = (getattr(settings, "CHANNEL_LAYERS", None) or {}).get("default") or {}
    backend = layer.get("BACKEND")
    if backend is None or backend == IN_MEMORY_LAYER:
        return [
            Warning(
                f"{SETTINGS_NAME}['EXECUTION'] is 'celery' but the default channel layer is "
                f"{backend or 'not configured'}: frames published by a worker process never reach the browser.",
                hint="Use channels_redis.pubsub.RedisPubSubChannelLayer, or EXECUTION='inprocess'.",
                id="streamrecover.W002",
            )
        ]
    return []


def check_checkpoint_store(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.W003: in-memory checkpoints die with the worker, so nothing can be resumed."""
    conf = _streamrecover()
    if conf is None or not _uses_celery(conf) or conf["CHECKPOINT_STORE"] != "memory":
        return []
    return [
        Warning(
            f"{SETTINGS_NAME}['CHECKPOINT_STORE'] is 'memory' with EXECUTION='celery': a checkpoint lives "
            "only in the worker that wrote it, so a run whose worker died cannot be resumed.",
            hint="Use CHECKPOINT_STORE='redis' or 'orm'.",
            id="streamrecover.W003",
        )
    ]


def check_prefetch(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.W004: tasks a full worker prefetched wait for a place there, not on a worker with room."""
    conf = _streamrecover()
    configured = hasattr(settings, "CELERY_WORKER_PREFETCH_MULTIPLIER")
    if conf is None or not (_uses_celery(conf) or configured):
        return []
    multiplier = getattr(settings, "CELERY_WORKER_PREFETCH_MULTIPLIER", 4)  # Celery's default
    if multiplier == 1:
        return []
    return [
        Warning(
            f"CELERY_WORKER_PREFETCH_MULTIPLIER is {multiplier}: a worker holding WORKER_MAX_RUNS runs holds "
            "other runs it prefetched instead of leaving them to workers with room.",
            hint="Set CELERY_WORKER_PREFETCH_MULTIPLIER = 1.",
            id="streamrecover.W004",
        )
    ]


def _default_layer() -> Mapping[str, Any] | None:
    layers = getattr(settings, "CHANNEL_LAYERS", None) or {}
    layer = layers.get("default") if isinstance(layers, Mapping) else None
    return layer if isinstance(layer, Mapping) and layer.get("BACKEND") else None


def check_no_channel_layer(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.W005: without a channel layer a WebSocket client gets its snapshot, then nothing."""
    if _default_layer() is not None:
        return []
    return [
        Warning(
            "No default channel layer is configured (CHANNEL_LAYERS['default']): a client of the run's "
            "WebSocket receives the snapshot and then nothing, however the run goes on.",
            hint="One process: CHANNEL_LAYERS = {'default': {'BACKEND': 'channels.layers.InMemoryChannelLayer'}}; "
            "several processes: channels_redis.pubsub.RedisPubSubChannelLayer.",
            id="streamrecover.W005",
        )
    ]


# ---- the WebSocket route's origin check (W006) ------------------------------------------------------

# Attributes through which Channels' routers and middleware hold what they wrap.
_WRAPPED = ("application", "inner", "app")


# Named, not imported: the consumer sits in a layer above the checks (tests/test_architecture.py).
RUN_CONSUMER = ("streamrecover.live.consumer", "RunConsumer")


def _is_run_consumer(app: Any) -> bool:
    """``RunConsumer.as_asgi()`` (or a subclass's): Channels marks it with ``consumer_class``."""
    consumer = getattr(app, "consumer_class", None)
    return isinstance(consumer, type) and any((c.__module__, c.__qualname__) == RUN_CONSUMER for c in consumer.__mro__)


def _is_origin_check(app: Any) -> bool:
    from channels.security.websocket import OriginValidator

    return isinstance(app, OriginValidator)


def run_socket_routes(app: Any, *, checked: bool = False, seen: set[int] | None = None) -> list[bool]:
    """For every ``RunConsumer`` reachable in the ASGI application ``app``: is an origin check above it?

    Follows what can be seen: ``ProtocolTypeRouter`` (its ``websocket`` entry), ``URLRouter``
    routes, and middleware that keeps what it wraps in ``inner``, ``application`` or ``app``
    (Channels' own, ``AuthMiddlewareStack``, ``OriginValidator``). A wrapper that hides its
    inner application (a closure, another attribute name) ends the walk there: nothing is seen.
    """
    seen = set() if seen is None else seen
    if id(app) in seen:
        return []
    seen.add(id(app))
    if _is_run_consumer(app):
        return [checked]
    checked = checked or _is_origin_check(app)
    found: list[bool] = []
    mapping = getattr(app, "application_mapping", None)
    if isinstance(mapping, Mapping):
        if "websocket" in mapping:
            found += run_socket_routes(mapping["websocket"], checked=checked, seen=seen)
        return found
    routes = getattr(app, "routes", None)
    if isinstance(routes, list | tuple):
        for route in routes:
            target = getattr(route, "callback", None)
            if target is not None:
                found += run_socket_routes(target, checked=checked, seen=seen)
        return found
    for name in _WRAPPED:
        inner = getattr(app, name, None)
        if inner is not None and callable(inner):
            found += run_socket_routes(inner, checked=checked, seen=seen)
    return found


def check_websocket_origin(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.W006: the run's WebSocket is routed without an origin check.

    A socket authenticates with the session cookie, which the browser sends from any page:
    without ``AllowedHostsOriginValidator`` a page on another site can open it and read the
    user's runs (cross-site WebSocket hijacking). Silent when ``ASGI_APPLICATION`` is unset or
    cannot be imported, or when the route cannot be seen inside it (see ``run_socket_routes``).
    """
    path = getattr(settings, "ASGI_APPLICATION", None)
    if not path:
        return []
    try:
        application = import_string(path)
    except Exception:  # the ASGI server reports its own import errors; a check must not raise
        return []
    if all(run_socket_routes(application)):  # all([]) is True: nothing seen, nothing said
        return []
    return [
        Warning(
            f"{path} routes streamrecover's WebSocket without an origin check: a page on another site "
            "can open it with the user's session cookie and read the user's runs.",
            hint="Wrap the websocket application: AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(...))) "
            "(channels.security.websocket).",
            id="streamrecover.W006",
        )
    ]


def check_single_process_in_production(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.W007 / W008: the one-process setup with ``DEBUG = False``.

    W007: runs executed in a thread of the web process die with it (a deploy, a restart) and
    nothing else picks them up. W008: the in-memory channel layer carries frames inside one
    process only; a second web process's clients see nothing. (With Celery, W002 says it.)
    """
    conf = _streamrecover()
    if conf is None or settings.DEBUG:
        return []
    found: list[CheckMessage] = []
    if conf["EXECUTION"] == "inprocess":
        found.append(
            Warning(
                f"{SETTINGS_NAME}['EXECUTION'] is 'inprocess' with DEBUG = False: runs execute in a thread of "
                "the web process and are lost, not resumed elsewhere, when that process stops.",
                hint="Use EXECUTION='celery' with a worker and the sweeper, or silence "
                "streamrecover.W007 for a deliberately single-process deployment.",
                id="streamrecover.W007",
            )
        )
    layer = _default_layer()
    if not _uses_celery(conf) and layer is not None and layer["BACKEND"] == IN_MEMORY_LAYER:
        found.append(
            Warning(
                "The default channel layer is the in-memory layer with DEBUG = False: live frames reach only "
                "the clients connected to the process that runs the run.",
                hint="Use channels_redis.pubsub.RedisPubSubChannelLayer, or silence streamrecover.W008 "
                "when exactly one process serves the site.",
                id="streamrecover.W008",
            )
        )
    return found


def celery_app_broker() -> str | None:
    """The broker URL of the Celery app the project created, if it created one (else None)."""
    try:
        from celery import _state
    except ImportError:
        return None
    app = getattr(_state._tls, "current_app", None) or _state.default_app
    if app is None:
        return None
    try:
        return app.conf.broker_url or None
    except Exception:
        return None


def check_celery_broker(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.E002: Celery execution without a broker, so no run ever leaves ``queued``.

    A broker is the ``CELERY_BROKER_URL`` setting or environment variable, or the broker of a
    Celery app the project created (imported with Django, as Celery's Django guide does).
    Eager tasks (``CELERY_TASK_ALWAYS_EAGER``) need none.
    """
    conf = _streamrecover()
    if conf is None or not _uses_celery(conf) or getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False):
        return []
    if getattr(settings, "CELERY_BROKER_URL", None) or os.environ.get("CELERY_BROKER_URL") or celery_app_broker():
        return []
    return [
        Error(
            f"{SETTINGS_NAME}['EXECUTION'] is 'celery' but no Celery broker is configured: runs are queued "
            "and no worker ever receives them.",
            hint="Set CELERY_BROKER_URL (e.g. 'redis://127.0.0.1:6379/0') and create the Celery app in your "
            "project's celery.py, imported from its __init__.py; or use EXECUTION='inprocess'.",
            id="streamrecover.E002",
        )
    ]


# SQLite transaction modes that take the write lock when the transaction begins.
SQLITE_WRITING_MODES = ("IMMEDIATE", "EXCLUSIVE")


def check_sqlite_transaction_mode(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.W009: the default database is SQLite with deferred transactions.

    A deferred transaction begins as a reader; when it then writes while another connection
    writes, SQLite fails it at once with "database is locked" instead of waiting for the busy
    timeout. A run writes from its own thread while requests (and other runs) write too.
    """
    default = (getattr(settings, "DATABASES", None) or {}).get("default") or {}
    if not str(default.get("ENGINE", "")).endswith("sqlite3"):
        return []
    mode = str((default.get("OPTIONS") or {}).get("transaction_mode") or "DEFERRED").upper()
    if mode in SQLITE_WRITING_MODES:
        return []
    return [
        Warning(
            f"The default database is SQLite with {mode} transactions: concurrent runs (and requests "
            "writing while a run writes) fail with 'database is locked' instead of waiting.",
            hint="Set DATABASES['default']['OPTIONS'] = {'transaction_mode': 'IMMEDIATE', 'timeout': 20} "
            "(Django 5.1+).",
            id="streamrecover.W009",
        )
    ]


def check_proxy_failover(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.E003: a failover to a provider whose adapter cannot take a client's fields
    written for another API; streamrecover.W010: one to Anthropic from an OpenAI format, where
    structured-output requests cannot fail over."""
    conf = _streamrecover()
    if conf is None:
        return []
    found: list[CheckMessage] = []
    for source, target in (conf["PROXY_FAILOVER"] or {}).items():
        where = f"{SETTINGS_NAME}['PROXY_FAILOVER'][{source!r}]"
        entry = conf["PROVIDERS"][target["PROVIDER"]]
        fmt = proxy_wire_format(entry, target["MODEL"])
        if source == "gemini":
            continue  # to another Gemini provider only (the setting's own validation), fields as sent
        if fmt is None:
            found.append(
                Error(
                    f"{where} falls back to {target['PROVIDER']!r} (adapter {entry.get('ADAPTER')!r}), which cannot "
                    f"take a {source} client's tools and settings: its proxied requests would never fail over.",
                    hint="Fall back to a provider whose ADAPTER is 'anthropic', 'openai' or 'openai-responses' "
                    "(a Gemini provider is a fallback for Gemini requests only).",
                    id="streamrecover.E003",
                )
            )
        elif fmt == "anthropic" and source != "anthropic":
            found.append(
                Warning(
                    f"{where} falls back to an Anthropic Messages provider: a request asking for structured "
                    "output (response_format, text.format) has no counterpart there and does not fail over; "
                    "other fields without one (seed, penalties, logprobs...) are left out at the fallback.",
                    hint="Silence it if that is what you want, or fall back to a provider of the same format.",
                    id="streamrecover.W010",
                )
            )
    return found


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_packages(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.E004: a setting needs a package the ``distributed`` extra brings, and it is
    not installed. Without this a run is accepted and then fails in its thread or task (the API
    answered 500 for Celery, and a Redis checkpoint store left the run ``running``)."""
    conf = _streamrecover()
    if conf is None:
        return []
    needs = []
    if _uses_celery(conf):
        needs.append(("EXECUTION", "celery", "celery"))
    if conf["CHECKPOINT_STORE"] == "redis":
        needs.append(("CHECKPOINT_STORE", "redis", "redis"))
    return [
        Error(
            f"{SETTINGS_NAME}[{key!r}] is {value!r}, which needs the {module!r} package, and it is not installed.",
            hint="install the package's 'distributed' extra "
            "(from a checkout: pip install '/path/to/streamrecover[distributed]')",
            id="streamrecover.E004",
        )
        for key, value, module in needs
        if not _installed(module)
    ]


def check_tools(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.E005: ``TOOLS`` names nothing importable (or neither a registry nor a function):
    every run would fail as it starts (``tool_unavailable``) instead of offering the project's tools."""
    conf = _streamrecover()
    if conf is None or conf["TOOLS"] is None:
        return []
    try:
        import_tools(conf["TOOLS"])
    except ImproperlyConfigured as exc:
        return [
            Error(
                str(exc),
                hint="Name a ToolRegistry or a function (run) -> ToolRegistry | None, e.g. 'myproject.tools.for_run'; "
                "None offers no tools.",
                id="streamrecover.E005",
            )
        ]
    return []


ALL_CHECKS = (
    check_settings,
    check_channel_layer,
    check_checkpoint_store,
    check_prefetch,
    check_no_channel_layer,
    check_websocket_origin,
    check_single_process_in_production,
    check_celery_broker,
    check_sqlite_transaction_mode,
    check_proxy_failover,
    check_packages,
    check_tools,
)
