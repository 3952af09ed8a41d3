"""Keep secrets out of logs, event rows, stored requests, checkpoints and pages.

Two rules. By key: a scalar stored under a secret-looking key (``authorization``,
``x-api-key``, ``api_key``, ``*_token``, ``*secret``, ``password`` ...) is replaced; dicts
and lists under such keys are walked instead, so a tool schema with a ``password``
property survives. By value: every configured API key, and bearer/``sk-`` shaped tokens,
are cut out of any string wherever they appear (an error message quoting a header).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .conf import app_settings
from .engine.contract import SECRET_HEADERS

REDACTED = "[redacted]"

_SECRET_KEY = re.compile(
    r"(^|_)(api_?key|apikey|authorization|password|passwd|secret|token|credentials?|cookie|set_cookie)$"
)
_SECRET_PATTERNS = (
    re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{16,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
)
_MIN_SECRET_LEN = 6  # shorter configured "keys" are placeholders; replacing them would shred text


def is_secret_key(key: str) -> bool:
    normal = key.lower().replace("-", "_")
    return key.lower() in SECRET_HEADERS or bool(_SECRET_KEY.search(normal))


def configured_secrets() -> list[str]:
    """The API keys the settings know about; empty when Django is not configured."""
    try:
        return app_settings.secret_values()
    except Exception:
        return []


def redact_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with every secret value and secret-shaped token replaced."""
    for secret in configured_secrets() if secrets is None else secrets:
        if len(secret) >= _MIN_SECRET_LEN and secret in text:
            text = text.replace(secret, REDACTED)
    for pattern in _SECRET_PATTERNS:
        if pattern.search(text):
            text = pattern.sub(
                lambda m: f"{m.group(1)} {REDACTED}" if m.lastindex else REDACTED,
                text,
            )
    return text


def _walk(obj: Any, secrets: list[str], by_key: bool) -> Any:
    if isinstance(obj, str):
        return redact_text(obj, secrets)
    if isinstance(obj, Mapping):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            secret_key = by_key and isinstance(key, str) and is_secret_key(key)
            if secret_key and not isinstance(value, Mapping | list | tuple) and value not in (None, ""):
                out[key] = REDACTED
            else:
                out[key] = _walk(value, secrets, by_key)
        return out
    if isinstance(obj, list | tuple):
        return [_walk(item, secrets, by_key) for item in obj]
    return obj


def redact(obj: Any, *, by_key: bool = True, secrets: Iterable[str] | None = None) -> Any:
    """A redacted copy of ``obj`` (dicts, lists, tuples -> lists, strings; other values as is).

    ``by_key=False`` keeps secret-looking keys and only scrubs values: for model output
    (checkpoints, messages) where a tool's ``password`` argument is the user's own data.
    """
    values = configured_secrets() if secrets is None else list(secrets)
    return _walk(obj, values, by_key)


def redact_processor(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: put it before the renderer. The project installs it, not the app."""
    return redact(event_dict)
