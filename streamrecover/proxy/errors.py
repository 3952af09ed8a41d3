"""Error responses in each provider's own shape, so a client's SDK raises its usual exceptions."""

from __future__ import annotations

from django.http import JsonResponse

from .inbound import ANTHROPIC, GEMINI, Format

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_OPENAI_TYPES = {
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "model_not_found"),
    404: ("invalid_request_error", "model_not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("requests", "rate_limit_exceeded"),
}

# google.rpc status name -> the HTTP code it goes with (a mid-stream error event carries it)
GEMINI_CODES = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ABORTED": 409,
    "RESOURCE_EXHAUSTED": 429,
    "INTERNAL": 500,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}

# HTTP status -> Gemini's google.rpc status name: each name's own code (400 is INVALID_ARGUMENT, the
# first), and a name for the statuses that have none of their own
_GEMINI_STATUS = {
    **{code: name for name, code in reversed(GEMINI_CODES.items())},
    402: "FAILED_PRECONDITION",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
}


# the engine's error kinds (the adapters' classification) -> the HTTP status a provider gives them
_KIND_STATUS = {
    "invalid_request": 400,
    "context_overflow": 400,
    "unauthorized": 401,
    "billing": 402,
    "spend_limit": 429,
    "permission_denied": 403,
    "model_not_found": 404,
    "request_too_large": 413,
    "rate_limited": 429,
    "server_error": 500,
    "timeout": 504,
    "overloaded": 529,
}


def status_for(format: Format, kind: str | None) -> int:
    """The status of a run that ended with error ``kind``; an answer given up on is "overloaded"."""
    status = _KIND_STATUS.get(kind or "", 529)
    return 503 if status == 529 and format != ANTHROPIC else status


def error_type(format: Format, status: int) -> str:
    """The provider's error type for ``status`` (a mid-stream error event carries it too)."""
    if format == ANTHROPIC:
        return _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    if format == GEMINI:
        return _GEMINI_STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    return _OPENAI_TYPES.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))[0]


def error_response(format: Format, status: int, message: str) -> JsonResponse:
    if format == ANTHROPIC:
        body: dict[str, object] = {"type": "error", "error": {"type": error_type(format, status), "message": message}}
    elif format == GEMINI:
        body = {"error": {"code": status, "message": message, "status": error_type(format, status)}}
    else:
        kind, code = _OPENAI_TYPES.get(status, (error_type(format, status), None))
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JsonResponse(body, status=status)
