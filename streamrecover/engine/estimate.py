"""A broken attempt's usage: what the provider reported, completed with the engine's estimate of what it billed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .events import Usage

# Keys whose strings are base64 payloads (Anthropic's and Gemini's ``data``), not text the model reads as tokens.
_PAYLOAD_KEYS = frozenset({"data", "file_data"})


def estimated_usage(reported: Usage, output_bound: int, body: Mapping[str, Any] | None) -> Usage:
    """``reported`` completed for an attempt whose final usage never arrived: the output is the
    engine's upper bound on what was streamed (the one the max_tokens guard counts), never less
    than the provider's running count; the input is the provider's count where the stream's start
    carried one (Anthropic's ``message_start``), else the bytes of the request's text."""
    input_tokens = reported.input_tokens
    if input_tokens is None and body is not None:
        input_tokens = request_text_bytes(body)
    return Usage(
        input_tokens=input_tokens,
        output_tokens=max(reported.output_tokens or 0, output_bound),
        cache_creation_input_tokens=reported.cache_creation_input_tokens,
        cache_read_input_tokens=reported.cache_read_input_tokens,
        reasoning_tokens=reported.reasoning_tokens,
    )


def request_text_bytes(value: object) -> int:
    """UTF-8 bytes of every string in a request body (messages, system prompt, tool schemas):
    each text token is at least one byte. Base64 payloads (images, files, audio) are left out:
    they are billed by size, not by their characters, which would count thousands of times over."""
    if isinstance(value, str):
        return 0 if value.startswith("data:") else len(value.encode())
    if isinstance(value, Mapping):
        return sum(request_text_bytes(v) for k, v in value.items() if k not in _PAYLOAD_KEYS)
    if isinstance(value, list | tuple):
        return sum(request_text_bytes(v) for v in value)
    return 0
