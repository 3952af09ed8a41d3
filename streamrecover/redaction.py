"""Keep the app's own secrets out of logs, event rows, stored requests, checkpoints and pages.

Three rules, applied where each is safe:

- By key: a scalar stored under a secret-looking key (``authorization``, ``x-api-key``,
  ``api_key``, ``*_token``, ``*secret``, ``password`` ...) is replaced; dicts and lists
  under such keys are walked instead, so a tool schema with a ``password`` property
  survives. Log lines, event rows, headers, run options.
- By pattern: bearer/``sk-``/Google ``AIza`` shaped tokens are cut out of any string. Only where the app
  itself wrote the text: log lines, event rows, error messages, headers (``redact``).
  Never over content a user or the model wrote: ordinary text matches these patterns
  ("bearer bonds", a placeholder key), and what is stored must be what was streamed.
- By value: every configured API key is cut out of any string wherever it appears, content
  included (``cut_secrets``): it is an exact value, not a pattern, so it alters nothing
  but the secret itself. Also in the escaped forms an exception message may quote it in
  (``repr`` of the string or of its bytes, JSON), and without surrounding whitespace.
"""

from __future__ import annotations

import functools
import json
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
    re.compile(r"\bAIza[A-Za-z0-9_-]{30,}"),  # Google (Gemini) API keys: AIza and 35 more
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


def json_holds_secret(text: str, secrets: Iterable[str]) -> bool:
    """Whether any of ``secrets`` (in any of the forms that are cut) appears in the JSON ``text``.

    A string's JSON form escapes it character by character, so a secret inside any string of
    the document appears in ``text`` in its own JSON form: one substring test per form tells
    whether ``cut_secrets`` would change anything, without walking and copying the document.
    """
    return any(form in text for secret in secrets for form in _json_forms(secret))


@functools.lru_cache(maxsize=64)
def _json_forms(secret: str) -> frozenset[str]:
    """How each of ``secret_forms`` appears inside a JSON string, ASCII-escaped or not."""
    return frozenset(
        json.dumps(form, ensure_ascii=escape)[1:-1] for form in secret_forms(secret) for escape in (True, False)
    )


@functools.lru_cache(maxsize=64)
def secret_forms(secret: str) -> tuple[str, ...]:
    """Every way ``secret`` may be written in a message, longest first: as it is, without
    surrounding whitespace, and as ``repr`` (of the string or of its UTF-8 bytes) and JSON
    escape it. An HTTP client refusing a header value quotes its bytes' ``repr``, so a key
    ending in a newline shows as ``...\\n``, which a search for the raw value misses.

    Forms shorter than a real key are left out: replacing them would shred text.
    """
    forms: set[str] = set()
    for value in (secret, secret.strip()):
        forms.update((value, repr(value)[1:-1], repr(value.encode())[2:-1], json.dumps(value)[1:-1]))
        forms.add(json.dumps(value, ensure_ascii=False)[1:-1])
    return tuple(sorted((form for form in forms if len(form) >= _MIN_SECRET_LEN), key=len, reverse=True))


def redact_text(text: str, secrets: Iterable[str] | None = None, *, patterns: bool = True) -> str:
    """``text`` with every secret value (and, with ``patterns``, secret-shaped token) replaced."""
    for secret in configured_secrets() if secrets is None else secrets:
        for form in secret_forms(secret):
            if form in text:
                text = text.replace(form, REDACTED)
    if not patterns:
        return text
    for pattern in _SECRET_PATTERNS:
        if pattern.search(text):
            text = pattern.sub(
                lambda m: f"{m.group(1)} {REDACTED}" if m.lastindex else REDACTED,
                text,
            )
    return text


def _walk(obj: Any, secrets: list[str], by_key: bool, patterns: bool) -> Any:
    if isinstance(obj, str):
        return redact_text(obj, secrets, patterns=patterns)
    if isinstance(obj, Mapping):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            secret_key = by_key and isinstance(key, str) and is_secret_key(key)
            if secret_key and not isinstance(value, Mapping | list | tuple) and value not in (None, ""):
                out[key] = REDACTED
            else:
                out[key] = _walk(value, secrets, by_key, patterns)
        return out
    if isinstance(obj, list | tuple):
        return [_walk(item, secrets, by_key, patterns) for item in obj]
    return obj


def redact(obj: Any, *, by_key: bool = True, patterns: bool = True, secrets: Iterable[str] | None = None) -> Any:
    """A redacted copy of ``obj`` (dicts, lists, tuples -> lists, strings; other values as is).

    For what the app writes (log lines, event rows, error messages, headers). ``by_key=False``
    keeps secret-looking keys; ``patterns=False`` keeps bearer/``sk-`` shaped text.
    """
    values = configured_secrets() if secrets is None else list(secrets)
    return _walk(obj, values, by_key, patterns)


def cut_secrets(obj: Any, *, secrets: Iterable[str] | None = None) -> Any:
    """A copy of ``obj`` with only the configured API keys cut out, nothing else touched.

    For content a user or the model wrote (messages, checkpoint blocks, the conversation in
    a stored request): stored byte for byte as streamed, except the app's own key, should
    the model ever output it (docs/recovery.md, "Secrets").
    """
    return redact(obj, by_key=False, patterns=False, secrets=secrets)


def redact_request(request: Mapping[str, Any], *, secrets: Iterable[str] | None = None) -> dict[str, Any]:
    """An attempt's request as it may be stored: headers fully redacted (by key and pattern),
    the body (the conversation as sent) and the URL with only configured keys cut out."""
    values = configured_secrets() if secrets is None else list(secrets)
    return {
        key: redact(value, secrets=values) if key == "headers" else cut_secrets(value, secrets=values)
        for key, value in request.items()
    }


def redact_processor(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: put it before the renderer. The project installs it, not the app."""
    return redact(event_dict)
