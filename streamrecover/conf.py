"""The one ``STREAMRECOVER`` settings dict, read lazily (DRF style).

Nothing is read at import time: ``app_settings`` merges the project's dict over ``DEFAULTS``
on first use and forgets it on ``setting_changed``, so ``override_settings`` works in tests.
Unknown keys and invalid values raise ``ImproperlyConfigured`` (the ``streamrecover.E001``
check reports the same problems without raising). API keys never appear in a message.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .engine.agent import ToolRegistry
from .engine.config import EngineConfig
from .engine.contract import ProviderConfig
from .providers.openai_chat import MAX_TOKENS_FIELDS  # what ``MAX_TOKENS_FIELD`` may name
from .providers.registry import adapter_problem

SETTINGS_NAME = "STREAMRECOVER"

# Base URL of the built-in fake provider: the runner serves it in-process, no network.
FAKE_BASE_URL = "fake://streamrecover"

# The largest value an integer column (IntegerField, PositiveIntegerField) holds on every supported
# database: a larger number from a client or a command line is refused, not a database error.
MAX_STORED_INT = 2**31 - 1

# Adapter name -> the wire format the healing endpoint can translate a client's fields into
# (a failover to another format); other adapters take no translated fields.
PROXY_ADAPTER_FORMATS: dict[str, str] = {"anthropic": "anthropic", "openai": "openai", "openai-responses": "responses"}


def proxy_adapter(provider: Mapping[str, Any], model: str) -> str:
    """The adapter a ``PROVIDERS`` entry uses for ``model`` (the built-in fake's follows the model's name)."""
    adapter = str(provider.get("ADAPTER", ""))
    if str(provider.get("BASE_URL", "")).startswith(FAKE_BASE_URL.split("//")[0] + "//"):
        from .testing import fake_adapter  # the fake's format follows the model name

        adapter = fake_adapter(adapter, model)
    return adapter


def proxy_wire_format(provider: Mapping[str, Any], model: str) -> str | None:
    """The wire format a ``PROVIDERS`` entry speaks for ``model``, or None for one the healing
    endpoint cannot write a client's fields for (Gemini, a custom adapter)."""
    return PROXY_ADAPTER_FORMATS.get(proxy_adapter(provider, model))


# Each of the healing endpoint's wire formats -> the setting naming the provider that serves it.
PROXY_PROVIDER_SETTINGS: dict[str, str] = {
    "anthropic": "PROXY_ANTHROPIC_PROVIDER",
    "openai": "PROXY_OPENAI_PROVIDER",
    "responses": "PROXY_RESPONSES_PROVIDER",
    "gemini": "PROXY_GEMINI_PROVIDER",
}

CHECKPOINT_STORES = ("memory", "orm", "redis")
EXECUTIONS = ("inprocess", "celery")

# Settings key -> EngineConfig field. A test pins that every engine field has a key.
ENGINE_KEYS: dict[str, str] = {
    "MAX_CONTINUATIONS": "max_continuations",
    "BACKOFF_SCHEDULE": "backoff_schedule",
    "BACKOFF_SCALE": "backoff_scale",
    "BACKOFF_JITTER": "backoff_jitter",
    "MAX_RETRY_AFTER": "max_retry_after_s",
    "MAX_REQUEST_RETRIES": "max_request_retries",
    "REQUEST_RETRY_BASE": "request_retry_base_s",
    "IDLE_TIMEOUT": "idle_timeout_s",
    "CONNECT_TIMEOUT": "connect_timeout_s",
    "CHECKPOINT_TTL": "checkpoint_ttl_s",
    "CHECKPOINT_EVERY_DELTAS": "checkpoint_every_deltas",
    "CHECKPOINT_EVERY_BYTES": "checkpoint_every_bytes",
    "CHECKPOINT_EVERY_SECONDS": "checkpoint_every_seconds",
    "NOTIFY_MODEL_OF_DISCARDED_TOOLS": "notify_model_of_discarded_tools",
    "MAX_TURNS": "max_turns",
    "MAX_LINE_BYTES": "max_line_bytes",
    "MAX_STREAM_SECONDS": "max_stream_seconds",
}

DEFAULT_PROVIDERS: dict[str, dict[str, Any]] = {
    "fake": {"ADAPTER": "anthropic", "BASE_URL": FAKE_BASE_URL},
    "anthropic": {
        "ADAPTER": "anthropic",
        "BASE_URL": "https://api.anthropic.com",
        "API_KEY_ENV": "ANTHROPIC_API_KEY",
    },
    "openai": {
        "ADAPTER": "openai",
        "BASE_URL": "https://api.openai.com/v1",
        "API_KEY_ENV": "OPENAI_API_KEY",
    },
    "openai-responses": {
        "ADAPTER": "openai-responses",
        "BASE_URL": "https://api.openai.com/v1",
        "API_KEY_ENV": "OPENAI_API_KEY",
    },
    "gemini": {
        "ADAPTER": "gemini",
        "BASE_URL": "https://generativelanguage.googleapis.com",
        "API_KEY_ENV": "GEMINI_API_KEY",
    },
}

PROVIDER_KEYS = (
    "ADAPTER",
    "BASE_URL",
    "API_KEY",
    "API_KEY_ENV",
    "EXTRA_HEADERS",
    "STRATEGY_OVERRIDES",
    "PREFIX_FLAG",
    "ECHOES_PREFIX",
    "CONTINUE_FINAL_MESSAGE",
    "ANTHROPIC_VERSION",
    "NATIVE_RESUME",
    "AZURE",
    "AZURE_API_VERSION",
    "AZURE_DEPLOYMENT",
    "MAX_TOKENS_FIELD",
)
DEFAULTS: dict[str, Any] = {
    # Engine (EngineConfig).
    "MAX_CONTINUATIONS": 5,
    "BACKOFF_SCHEDULE": [1, 2, 4, 8, 16],
    "BACKOFF_SCALE": 1.0,
    "BACKOFF_JITTER": 0.0,
    "MAX_RETRY_AFTER": 60,
    "MAX_REQUEST_RETRIES": 2,
    "REQUEST_RETRY_BASE": 0.5,
    "IDLE_TIMEOUT": 60,
    "CONNECT_TIMEOUT": 10,
    "CHECKPOINT_TTL": 3600,
    "CHECKPOINT_EVERY_DELTAS": 64,
    "CHECKPOINT_EVERY_BYTES": 16384,
    "CHECKPOINT_EVERY_SECONDS": 1.0,
    "NOTIFY_MODEL_OF_DISCARDED_TOOLS": False,
    "MAX_TURNS": 8,
    "MAX_LINE_BYTES": 1048576,
    "MAX_STREAM_SECONDS": 1800,
    "FRAME_COALESCE_MS": 25,
    "FRAME_MAX_CHARS": 4096,
    # Providers. A project's PROVIDERS dict is merged over these by name.
    "PROVIDERS": DEFAULT_PROVIDERS,
    "DEFAULT_PROVIDER": "fake",
    "DEFAULT_MODEL": "fake-model",
    # Django side.
    "CHECKPOINT_STORE": "orm",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "EXECUTION": "inprocess",
    "MAX_CLAIMS": 3,
    # The runs one worker process holds at once on its event loop (``runs.holder``), whatever
    # its Celery pool and concurrency: a task waits for a place, and the broker keeps the rest.
    "WORKER_MAX_RUNS": 100,
    # How long a task waits for a place in a full process before it sends its run back to the
    # queue, for a worker with room; the wait paces a lone full worker that takes it again.
    # None: it waits as long as it takes (the run starts late while another worker may idle).
    "WORKER_FULL_WAIT_SECONDS": 3.0,
    "HEARTBEAT_SECONDS": 5,
    "STALE_AFTER_SECONDS": 30,
    "QUEUED_STALE_AFTER_SECONDS": 300,
    "REPLAY_BUFFER_FRAMES": 2000,
    # How often a run's WebSocket checks that its client has not fallen behind a run whose
    # frames were lost (a Redis restart): one primary-key read and one buffer read per check.
    "LIVE_CHECK_SECONDS": 5,
    # The young threshold of the garbage collector of a process serving streams (``gctuning``:
    # a worker's run loop as it starts, an ASGI server's asgi.py), which also freezes what the
    # process has loaded out of full passes. None leaves the interpreter's collector as it is.
    "GC_THRESHOLD": 20_000,
    # The healing endpoint (streamrecover.proxy): which provider serves each wire format.
    "PROXY_ANTHROPIC_PROVIDER": "anthropic",
    "PROXY_OPENAI_PROVIDER": "openai",
    "PROXY_RESPONSES_PROVIDER": "openai-responses",
    "PROXY_GEMINI_PROVIDER": "gemini",
    "PROXY_DEFAULT_MAX_TOKENS": 4096,
    # The largest request body the healing endpoint reads (it ignores DATA_UPLOAD_MAX_MEMORY_SIZE,
    # made for form posts): Anthropic takes 32 MB, images included; a larger one is a 413.
    "PROXY_MAX_BODY_BYTES": 32 * 1024 * 1024,
    # The largest answer of a non-streamed request the healing endpoint holds (decoded), from the
    # provider to the client: a larger one is a 502 rather than a body held in memory whole.
    "PROXY_MAX_RESPONSE_BYTES": 32 * 1024 * 1024,
    # format -> {"PROVIDER", "MODEL"}: where a proxied answer goes on when its provider gives up
    "PROXY_FAILOVER": None,
    # The dotted path of the tools every run offers, on every path that executes it (a thread, a
    # Celery task, the sweep's resume): a callable ``(run) -> ToolRegistry | None`` or a
    # ``ToolRegistry``. None: no tools. The default gives the sample tools to ``demo_tools`` runs.
    "TOOLS": "streamrecover.testing.demo_tools_for_run",
}

# What ``TOOLS`` names: a registry every run shares, or a function of the run giving its own.
ToolsSource = ToolRegistry | Callable[[Any], ToolRegistry | None]

_INTS = (
    "MAX_CONTINUATIONS",
    "MAX_REQUEST_RETRIES",
    "CHECKPOINT_EVERY_DELTAS",
    "CHECKPOINT_EVERY_BYTES",
    "MAX_TURNS",
    "MAX_LINE_BYTES",
    "FRAME_MAX_CHARS",
    "MAX_CLAIMS",
    "WORKER_MAX_RUNS",
    "REPLAY_BUFFER_FRAMES",
    "PROXY_DEFAULT_MAX_TOKENS",
)
_NUMBERS = (
    "BACKOFF_SCALE",
    "MAX_RETRY_AFTER",
    "REQUEST_RETRY_BASE",
    "IDLE_TIMEOUT",
    "MAX_STREAM_SECONDS",
    "CONNECT_TIMEOUT",
    "CHECKPOINT_TTL",
    "CHECKPOINT_EVERY_SECONDS",
    "FRAME_COALESCE_MS",
    "HEARTBEAT_SECONDS",
    "STALE_AFTER_SECONDS",
    "QUEUED_STALE_AFTER_SECONDS",
    "LIVE_CHECK_SECONDS",
)
_CHOICES = {"CHECKPOINT_STORE": CHECKPOINT_STORES, "EXECUTION": EXECUTIONS}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def merge(user: Mapping[str, Any]) -> dict[str, Any]:
    """DEFAULTS with the project's values on top; PROVIDERS merge by provider name."""
    merged = {**DEFAULTS, **user}
    providers = user.get("PROVIDERS")
    if isinstance(providers, Mapping):
        merged["PROVIDERS"] = {**DEFAULT_PROVIDERS, **providers}
    return merged


def _provider_problems(name: str, entry: Any) -> list[str]:
    where = f"{SETTINGS_NAME}['PROVIDERS'][{name!r}]"
    if not isinstance(entry, Mapping):
        return [f"{where} must be a dict."]
    problems = [
        f"{where} has an unknown key {key!r}. Valid keys: {', '.join(PROVIDER_KEYS)}."
        for key in entry
        if key not in PROVIDER_KEYS
    ]
    adapter = adapter_problem(entry.get("ADAPTER"))
    if adapter is not None:
        problems.append(f"{where}['ADAPTER']: {adapter}.")
    if not isinstance(entry.get("BASE_URL"), str) or not entry.get("BASE_URL"):
        problems.append(f"{where}['BASE_URL'] must be a non-empty string.")
    for key in ("API_KEY", "API_KEY_ENV", "ANTHROPIC_VERSION", "AZURE_API_VERSION", "AZURE_DEPLOYMENT"):
        if key in entry and not isinstance(entry[key], str):
            problems.append(f"{where}[{key!r}] must be a string.")  # never echo the value
    for key in ("EXTRA_HEADERS", "STRATEGY_OVERRIDES"):
        if key in entry and not isinstance(entry[key], Mapping):
            problems.append(f"{where}[{key!r}] must be a dict.")
    for key in ("PREFIX_FLAG", "ECHOES_PREFIX", "CONTINUE_FINAL_MESSAGE", "NATIVE_RESUME", "AZURE"):
        if key in entry and not isinstance(entry[key], bool):
            problems.append(f"{where}[{key!r}] must be True or False.")
    if entry.get("MAX_TOKENS_FIELD") not in (None, *MAX_TOKENS_FIELDS):
        problems.append(f"{where}['MAX_TOKENS_FIELD'] must be 'max_tokens' or 'max_completion_tokens'.")
    return problems


def _speaks_gemini(entry: Any, model: str) -> bool:
    return isinstance(entry, Mapping) and proxy_adapter(entry, model) == "gemini"


def _failover_problems(failover: Any, providers: Mapping[str, Any]) -> list[str]:
    where = f"{SETTINGS_NAME}['PROXY_FAILOVER']"
    if failover is None:
        return []
    if not isinstance(failover, Mapping):
        return [
            f"{where} must be None or a dict of wire format ('anthropic', 'openai', 'responses', 'gemini') "
            "-> {'PROVIDER', 'MODEL'}."
        ]
    problems = []
    for format, target in failover.items():
        if format not in ("anthropic", "openai", "responses", "gemini"):
            problems.append(
                f"{where} has an unknown wire format {format!r}: 'anthropic', 'openai', 'responses' or 'gemini'."
            )
        elif not isinstance(target, Mapping) or set(target) != {"PROVIDER", "MODEL"}:
            problems.append(f"{where}[{format!r}] must be a dict with exactly 'PROVIDER' and 'MODEL'.")
        elif target["PROVIDER"] not in providers:
            problems.append(f"{where}[{format!r}]['PROVIDER'] is {target['PROVIDER']!r}, which is not in PROVIDERS.")
        elif not isinstance(target["MODEL"], str) or not target["MODEL"]:
            problems.append(f"{where}[{format!r}]['MODEL'] must be a non-empty string.")
        elif format == "gemini" and not _speaks_gemini(providers[target["PROVIDER"]], target["MODEL"]):
            problems.append(
                f"{where}['gemini'] falls back to {target['PROVIDER']!r}, which is not a Gemini provider: a Gemini "
                "request's fields are written for Gemini only, so it fails over only to another Gemini provider."
            )
    return problems


def validate(user: Any) -> list[str]:
    """Every problem with a ``STREAMRECOVER`` value, as readable sentences (empty: valid)."""
    if not isinstance(user, Mapping):
        return [f"{SETTINGS_NAME} must be a dict."]
    problems = [
        f"{SETTINGS_NAME} has an unknown key {key!r}. Valid keys: {', '.join(sorted(DEFAULTS))}."
        for key in user
        if key not in DEFAULTS
    ]
    merged = merge(user)
    for key in _INTS:
        value = merged[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            problems.append(f"{SETTINGS_NAME}[{key!r}] must be a non-negative integer, not {value!r}.")
    for key in _NUMBERS:
        value = merged[key]
        if not _is_number(value) or value < 0:
            problems.append(f"{SETTINGS_NAME}[{key!r}] must be a non-negative number, not {value!r}.")
    jitter = merged["BACKOFF_JITTER"]
    if not _is_number(jitter) or not 0 <= jitter <= 1:
        problems.append(f"{SETTINGS_NAME}['BACKOFF_JITTER'] must be a number from 0 to 1, not {jitter!r}.")
    schedule = merged["BACKOFF_SCHEDULE"]
    if not isinstance(schedule, list | tuple) or not schedule or not all(_is_number(v) and v >= 0 for v in schedule):
        problems.append(
            f"{SETTINGS_NAME}['BACKOFF_SCHEDULE'] must be a non-empty list of non-negative numbers, not {schedule!r}."
        )
    for key in ("PROXY_MAX_BODY_BYTES", "PROXY_MAX_RESPONSE_BYTES"):
        limit = merged[key]
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            problems.append(f"{SETTINGS_NAME}[{key!r}] must be a positive integer (bytes), not {limit!r}.")
    full_wait = merged["WORKER_FULL_WAIT_SECONDS"]
    if full_wait is not None and (not _is_number(full_wait) or full_wait <= 0):
        problems.append(
            f"{SETTINGS_NAME}['WORKER_FULL_WAIT_SECONDS'] must be a positive number or None, not {full_wait!r}."
        )
    threshold = merged["GC_THRESHOLD"]
    if threshold is not None and (not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1):
        problems.append(f"{SETTINGS_NAME}['GC_THRESHOLD'] must be a positive integer or None, not {threshold!r}.")
    if not isinstance(merged["NOTIFY_MODEL_OF_DISCARDED_TOOLS"], bool):
        problems.append(f"{SETTINGS_NAME}['NOTIFY_MODEL_OF_DISCARDED_TOOLS'] must be True or False.")
    for key, choices in _CHOICES.items():
        if merged[key] not in choices:
            problems.append(
                f"{SETTINGS_NAME}[{key!r}] must be one of {', '.join(map(repr, choices))}, not {merged[key]!r}."
            )
    tools = merged["TOOLS"]
    if tools is not None and (not isinstance(tools, str) or not tools):
        problems.append(
            f"{SETTINGS_NAME}['TOOLS'] must be None or the dotted path of a ToolRegistry or of a function "
            f"(run) -> ToolRegistry, not {tools!r}."
        )
    for key in ("DEFAULT_MODEL", "REDIS_URL"):
        if not isinstance(merged[key], str) or not merged[key]:
            problems.append(f"{SETTINGS_NAME}[{key!r}] must be a non-empty string.")
    providers = merged["PROVIDERS"]
    if not isinstance(providers, Mapping):
        problems.append(f"{SETTINGS_NAME}['PROVIDERS'] must be a dict of provider name -> dict.")
        return problems
    for name, entry in providers.items():
        problems.extend(_provider_problems(name, entry))
    for key in PROXY_PROVIDER_SETTINGS.values():
        if merged[key] not in providers:
            problems.append(
                f"{SETTINGS_NAME}[{key!r}] is {merged[key]!r}, which is not in PROVIDERS "
                f"({', '.join(sorted(providers))})."
            )
    problems.extend(_failover_problems(merged["PROXY_FAILOVER"], providers))
    if merged["DEFAULT_PROVIDER"] not in providers:
        problems.append(
            f"{SETTINGS_NAME}['DEFAULT_PROVIDER'] is {merged['DEFAULT_PROVIDER']!r}, which is not in PROVIDERS "
            f"({', '.join(sorted(providers))})."
        )
    return problems


def import_tools(path: str) -> ToolsSource:
    """What ``TOOLS`` names, imported; an ``ImproperlyConfigured`` that names the setting when it
    does not import or is neither a ``ToolRegistry`` nor callable (the check E005 says the same)."""
    try:
        source = import_string(path)
    except Exception as exc:  # ImportError, or whatever the module raised as it was imported
        raise ImproperlyConfigured(
            f"{SETTINGS_NAME}['TOOLS'] is {path!r}, which does not import ({type(exc).__name__}: {exc})."
        ) from exc
    if not isinstance(source, ToolRegistry) and not callable(source):
        raise ImproperlyConfigured(
            f"{SETTINGS_NAME}['TOOLS'] is {path!r}, a {type(source).__name__}: it must name a ToolRegistry "
            "or a function (run) -> ToolRegistry | None."
        )
    return source


def _key(value: Any) -> str:
    """A configured API key as it is sent and redacted: without surrounding whitespace.

    A key read from a secrets file or an environment file often ends in a newline; no key is
    meant to hold whitespace, and sent as it is the key is refused by the HTTP client with an
    error that quotes it (escaped, so redaction looking for the raw value would miss it).
    """
    return value.strip() if isinstance(value, str) else ""


class AppSettings:
    """Attribute access to the merged settings: ``app_settings.MAX_CONTINUATIONS``."""

    def __init__(self) -> None:
        self._merged: dict[str, Any] | None = None

    def user_settings(self) -> Any:
        return getattr(settings, SETTINGS_NAME, {})

    def problems(self) -> list[str]:
        """What ``validate`` finds in the current settings, without raising."""
        return validate(self.user_settings())

    def as_dict(self) -> dict[str, Any]:
        if self._merged is None:
            user = self.user_settings()
            problems = validate(user)
            if problems:
                raise ImproperlyConfigured(" ".join(problems))
            self._merged = merge(user)
        return self._merged

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Invalid {SETTINGS_NAME} setting: {name!r}")
        return self.as_dict()[name]

    def reload(self) -> None:
        self._merged = None

    def engine_config(self) -> EngineConfig:
        """The engine's knobs; the engine never reads Django settings itself."""
        values = self.as_dict()
        kwargs: dict[str, Any] = {field: values[key] for key, field in ENGINE_KEYS.items()}
        kwargs["backoff_schedule"] = tuple(float(v) for v in values["BACKOFF_SCHEDULE"])
        return EngineConfig(**kwargs)

    def provider_config(self, name: str | None = None) -> ProviderConfig:
        """How to reach provider ``name`` (default: DEFAULT_PROVIDER), with its API key.

        The key comes from ``API_KEY`` or else the environment variable ``API_KEY_ENV``,
        stripped of surrounding whitespace (a trailing newline from a secrets file). A provider
        that names an environment variable which is unset raises; the message names the
        variable, never a value.
        """
        values = self.as_dict()
        name = name or values["DEFAULT_PROVIDER"]
        providers = values["PROVIDERS"]
        if name not in providers:
            raise ImproperlyConfigured(
                f"Unknown streamrecover provider {name!r}. Configured: {', '.join(sorted(providers))}."
            )
        entry = providers[name]
        api_key = _key(entry.get("API_KEY"))
        env_name = entry.get("API_KEY_ENV")
        if not api_key and env_name:
            api_key = _key(os.environ.get(env_name))
            if not api_key:
                raise ImproperlyConfigured(
                    f"Provider {name!r} has no API key: set the environment variable {env_name} "
                    f"or {SETTINGS_NAME}['PROVIDERS'][{name!r}]['API_KEY']."
                )
        extra: dict[str, Any] = {}
        if "ANTHROPIC_VERSION" in entry:
            extra["anthropic_version"] = entry["ANTHROPIC_VERSION"]
        return ProviderConfig(
            name=entry["ADAPTER"],
            base_url=entry["BASE_URL"],
            api_key=api_key,
            extra_headers=dict(entry.get("EXTRA_HEADERS") or {}),
            strategy_overrides=dict(entry.get("STRATEGY_OVERRIDES") or {}),
            prefix_flag=bool(entry.get("PREFIX_FLAG", False)),
            echoes_prefix=bool(entry.get("ECHOES_PREFIX", False)),
            continue_final_message=bool(entry.get("CONTINUE_FINAL_MESSAGE", False)),
            native_resume=bool(entry.get("NATIVE_RESUME", False)),
            azure=bool(entry.get("AZURE", False)),
            azure_api_version=entry.get("AZURE_API_VERSION") or None,
            azure_deployment=entry.get("AZURE_DEPLOYMENT") or None,
            max_tokens_field=entry.get("MAX_TOKENS_FIELD"),
            connect_timeout_s=float(values["CONNECT_TIMEOUT"]),
            **extra,
        )

    def secret_values(self) -> list[str]:
        """Every configured API key (settings or environment), for redaction.

        Never raises: the redaction processor runs on every log line, even with bad settings.
        """
        try:
            providers = merge(self.user_settings()).get("PROVIDERS")
        except Exception:
            return []
        if not isinstance(providers, Mapping):
            return []
        values: list[str] = []
        for entry in providers.values():
            if not isinstance(entry, Mapping):
                continue
            key = _key(entry.get("API_KEY"))
            if key:
                values.append(key)
            env_name = entry.get("API_KEY_ENV")
            env_key = _key(os.environ.get(env_name)) if isinstance(env_name, str) else ""
            if env_key:
                values.append(env_key)
        return values


app_settings = AppSettings()


def reload_app_settings(*, setting: str, **kwargs: Any) -> None:
    """``setting_changed`` receiver (connected in ``apps.ready``)."""
    if setting == SETTINGS_NAME:
        app_settings.reload()
