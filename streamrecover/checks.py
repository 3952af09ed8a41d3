"""System checks for configurations that break recovery quietly, each with a stable id.

Celery values are read from Django settings under the ``CELERY_`` namespace (how the demo
project and most Django projects configure Celery), so ``override_settings`` is obeyed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

from .conf import SETTINGS_NAME, merge, validate

IN_MEMORY_LAYER = "channels.layers.InMemoryChannelLayer"

# Broker URL scheme -> the transport's default visibility timeout (seconds).
DEFAULT_VISIBILITY = {"redis": 3600, "rediss": 3600, "sentinel": 3600, "sqs": 1800}


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


def _visibility_timeout() -> float | None:
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}
    if options.get("visibility_timeout") is not None:
        return float(options["visibility_timeout"])
    broker = getattr(settings, "CELERY_BROKER_URL", None) or ""
    scheme = broker.split("://", 1)[0].split("+", 1)[0].lower() if "://" in broker else ""
    return DEFAULT_VISIBILITY.get(scheme)


def check_celery_time_limit(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """streamrecover.W001: a task that may outlive the broker's visibility timeout is
    delivered again to another worker while the first still streams."""
    conf = _streamrecover()
    time_limit = getattr(settings, "CELERY_TASK_TIME_LIMIT", None)
    if conf is None or not (_uses_celery(conf) or time_limit is not None):
        return []
    visibility = _visibility_timeout()
    if visibility is None:
        return []
    hint = (
        "Set CELERY_TASK_TIME_LIMIT below CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout'] "
        f"(currently {visibility:g} s)."
    )
    if time_limit is None:
        return [
            Warning(
                "Celery tasks have no time limit (CELERY_TASK_TIME_LIMIT), so a run can outlive the "
                "broker's visibility timeout and be executed twice.",
                hint=hint,
                id="streamrecover.W001",
            )
        ]
    if float(time_limit) >= visibility:
        return [
            Warning(
                f"CELERY_TASK_TIME_LIMIT ({time_limit} s) is at or above the broker's visibility timeout "
                f"({visibility:g} s): a long run is redelivered to a second worker while the first still streams.",
                hint=hint,
                id="streamrecover.W001",
            )
        ]
    return []


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
    """streamrecover.W004: prefetched long tasks wait behind a stream and are lost with its worker."""
    conf = _streamrecover()
    configured = hasattr(settings, "CELERY_WORKER_PREFETCH_MULTIPLIER")
    if conf is None or not (_uses_celery(conf) or configured):
        return []
    multiplier = getattr(settings, "CELERY_WORKER_PREFETCH_MULTIPLIER", 4)  # Celery's default
    if multiplier == 1:
        return []
    return [
        Warning(
            f"CELERY_WORKER_PREFETCH_MULTIPLIER is {multiplier}: a worker busy with one long stream holds "
            "other runs it prefetched instead of leaving them to idle workers.",
            hint="Set CELERY_WORKER_PREFETCH_MULTIPLIER = 1.",
            id="streamrecover.W004",
        )
    ]


ALL_CHECKS = (check_settings, check_celery_time_limit, check_channel_layer, check_checkpoint_store, check_prefetch)
