"""The failure vocabulary: why a stream stopped, and whether anything may be retried.

Classification happens once, at the edge (transport or adapter), and everything after
it reasons about these values, never about exception classes of a particular library.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class InterruptCause(enum.StrEnum):
    """Why a stream that had started stopped before its terminator."""

    CONNECTION_RESET = "connection_reset"
    IDLE_STALL = "idle_stall"
    GOAWAY = "goaway"
    PROVIDER_ERROR_MID_STREAM = "provider_error_mid_stream"
    SSE_PARSE = "sse_parse"
    BODY_DECODE = "body_decode"
    STREAM_DEADLINE = "stream_deadline"  # bytes kept coming, the stream never ended
    MAX_TOKENS_EXCEEDED = "max_tokens_exceeded"  # more output than the request's max_tokens allows
    UNKNOWN = "unknown"

    @property
    def error_kind(self) -> str:
        return _CAUSE_TO_KIND[self]


_CAUSE_TO_KIND = {
    InterruptCause.CONNECTION_RESET: "sse_transport",
    InterruptCause.GOAWAY: "sse_transport",
    InterruptCause.IDLE_STALL: "idle_stall",
    InterruptCause.PROVIDER_ERROR_MID_STREAM: "provider_error",
    InterruptCause.SSE_PARSE: "sse_parse",
    InterruptCause.BODY_DECODE: "body_decode",
    InterruptCause.STREAM_DEADLINE: "stream_deadline",
    InterruptCause.MAX_TOKENS_EXCEEDED: "max_tokens_exceeded",
    InterruptCause.UNKNOWN: "unknown",
}


class ErrorClass(enum.StrEnum):
    """What the retry policy does with a provider error."""

    RETRYABLE = "retryable"  # 408/409/429/5xx/529/overloaded, connect errors
    PERMANENT = "permanent"  # invalid request, auth, not found, context overflow, quota
    PREFILL_REFUSED = "prefill_refused"  # a 400 that says this model takes no prefill


@dataclass(frozen=True, slots=True)
class ProviderError:
    """A classified provider error, from an HTTP status or a mid-stream error event."""

    error_class: ErrorClass
    kind: str  # stable name: rate_limited, overloaded, server_error, invalid_request, ...
    message: str
    status: int | None = None
    retry_after_s: float | None = None
    request_id: str | None = None

    @property
    def permanent(self) -> bool:
        return self.error_class is not ErrorClass.RETRYABLE


class StreamRecoverError(Exception):
    """Base of every error this package raises on purpose."""


class SSEError(StreamRecoverError):
    """Bytes that are not a valid event stream (an oversized line, say)."""


class BodyDecodeError(StreamRecoverError):
    """Bytes that are not UTF-8."""


class NotAnEventStream(StreamRecoverError):
    """A 200 body labelled ``text/event-stream`` that held no event and does not start like one
    (a proxy's HTML page): a failed call, not a stream that broke."""


class StreamInterrupted(StreamRecoverError):
    """A stream that had started ended before its terminator."""

    def __init__(self, cause: InterruptCause, message: str, provider_error: ProviderError | None = None):
        super().__init__(f"{cause.value}: {message}")
        self.cause = cause
        self.message = message
        self.provider_error = provider_error


class RequestFailed(StreamRecoverError):
    """The provider refused the request before any stream started."""

    def __init__(self, error: ProviderError):
        super().__init__(f"{error.kind} ({error.status}): {error.message}")
        self.error = error


class ParseError(StreamRecoverError):
    """An adapter could not understand an event's data (not JSON, wrong shape)."""


class ClaimLost(BaseException):
    """This worker's claim of the run is no longer current (the run was swept or claimed again).

    A ``BaseException``, like ``asyncio.CancelledError``: no ``except Exception`` on the way
    (a sink fan-out, a checkpoint writer, a tool) may swallow it. It unwinds the run without
    any further write; the worker that holds the claim now owns everything the run writes.
    """
