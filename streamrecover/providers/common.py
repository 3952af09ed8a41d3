"""Helpers every adapter shares: excerpts, typed ints, the status policy, the ``STRATEGY_OVERRIDES`` lookup."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from ..engine.contract import HTTPRequest, ModelRequest, ProviderConfig, Strategy
from ..engine.errors import ErrorClass, ParseError
from ..engine.retry import RETRYABLE_STATUSES, should_retry_header

EXCERPT_CHARS = 160


_json_decode = json.JSONDecoder().decode
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_event_json(data: str) -> Any:
    """An event's JSON data. A lone surrogate escape (``\\ud83d`` without its pair, from a
    server that splits UTF-16 pairs across deltas) decodes to U+FFFD, as a UTF-8 decoder does
    with broken bytes: a string holding one has no UTF-8 form, so it could be neither counted,
    sent on nor stored, and the client and the database see the same replacement."""
    value = _json_decode(data)
    if "\\ud" in data or "\\uD" in data:  # json.loads already joined every escaped pair
        value = _without_lone_surrogates(value)
    return value


def event_object(data: str, what: str) -> dict[str, Any]:
    """An event's data as a JSON object (``decode_event_json``), or a ``ParseError`` that
    names ``what`` the event was and shows the start of its data."""
    try:
        value = decode_event_json(data)
    except ValueError as exc:
        raise ParseError(f"{what}: data is not JSON ({exc}): {excerpt(data)}") from None
    if type(value) is not dict:
        raise ParseError(f"{what}: data is not a JSON object: {excerpt(data)}")
    return value


def _without_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in value]
    return value


def excerpt(text: str) -> str:
    """A short, quoted piece of bad input for an error message."""
    return repr(text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…")


def as_int(value: Any) -> int | None:
    return value if type(value) is int else None


def status_policy(status: int, table: Mapping[int, tuple[str, ErrorClass]]) -> tuple[str, ErrorClass]:
    """The adapter's table first; then any 5xx (or listed retryable status) is retried and
    any other 4xx is permanent."""
    policy = table.get(status)
    if policy is not None:
        return policy
    if status in RETRYABLE_STATUSES or status >= 500:
        return "server_error", ErrorClass.RETRYABLE
    if status >= 400:
        return "invalid_request", ErrorClass.PERMANENT
    return "unexpected_status", ErrorClass.PERMANENT


def strategy_override(overrides: Mapping[str, str], model: str) -> Strategy | None:
    """The first ``model glob -> strategy`` setting that matches, if any."""
    for pattern, value in overrides.items():
        if fnmatchcase(model, pattern):
            try:
                return Strategy(value)
            except ValueError:
                known = ", ".join(s.value for s in Strategy)
                raise ValueError(
                    f"strategy override {pattern!r} -> {value!r} is not a strategy (known: {known})"
                ) from None
    return None


class ContinueMessageOnly:
    """The recovery protocol of an API with neither a prefill nor a count endpoint (Gemini,
    OpenAI Responses): a settings override or a continue message; the continuation does not
    repeat the prefix; nothing to count before a continuation (usage comes with the stream)."""

    config: ProviderConfig

    def continuation_strategy(self, model: str, *, thinking: bool) -> Strategy:
        override = strategy_override(self.config.strategy_overrides, model)
        return override if override is not None else Strategy.CONTINUE_MESSAGE

    @property
    def echoes_prefix(self) -> bool:
        return False

    def count_request(self, request: ModelRequest) -> HTTPRequest | None:
        return None

    def read_count(self, body: bytes) -> int | None:
        return None


def read_error_body(status: int, body: bytes) -> tuple[dict[str, Any], Any, str]:
    """An error response's JSON object (or ``{}``), its ``error`` member, and a message:
    the error's own, or a clear one built from the status and an excerpt of the body."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text) if text.strip() else None
    except ValueError:
        parsed = None
    document = parsed if isinstance(parsed, dict) else {}
    error = document.get("error")
    message = ""
    if isinstance(error, dict):
        message = str(error.get("message") or "")
    elif isinstance(error, str):
        message = error
    if not message:
        message = f"HTTP {status} with an unexpected body: {excerpt(text)}" if text.strip() else f"HTTP {status}"
    return document, error, message


def with_should_retry(headers: Mapping[str, str], error_class: ErrorClass) -> ErrorClass:
    """``x-should-retry`` overrides the status policy (never a prefill refusal: that is the
    signal to fall back to a continue message)."""
    override = should_retry_header(headers)
    if override is None or error_class is ErrorClass.PREFILL_REFUSED:
        return error_class
    return ErrorClass.RETRYABLE if override else ErrorClass.PERMANENT


def text_of(content: Any) -> str:
    """Tool-result or message content (a string or canonical blocks) as the string OpenAI takes."""
    if isinstance(content, str):
        return content
    if not content:
        return ""
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")
