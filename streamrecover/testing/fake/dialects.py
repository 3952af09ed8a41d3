"""The wire formats the fake speaks, behind one shape so the server handles them alike, and the routes to them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from . import (
    read_anthropic,
    read_gemini,
    read_openai,
    read_openai_responses,
    wire_anthropic,
    wire_gemini,
    wire_openai,
    wire_openai_responses,
)
from .interpret import Interpretation, RequestRejected
from .model import Plan
from .wire import ErrorSpec, ResponseContext, WireEvent


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str  # "anthropic" | "openai" | "openai-responses" | "gemini"
    tool_id_prefix: str
    interpret: Callable[[Any], Interpretation]
    authenticate: Callable[[Mapping[str, str]], ErrorSpec | None]
    check_headers: Callable[[Mapping[str, str]], ErrorSpec | None]
    stream_events: Callable[[Plan, ResponseContext], list[WireEvent]]
    response_json: Callable[[Plan, ResponseContext], dict[str, Any]]
    error_body: Callable[[ErrorSpec, str], bytes]
    error_event: Callable[..., WireEvent]  # (error_type, message, *, after: the event it follows)
    status_error: Callable[..., ErrorSpec]  # (status, error_type, message, *, quota)
    response_headers: Callable[[str], list[tuple[str, str]]]
    bad_json: ErrorSpec
    bad_content_type: ErrorSpec


ANTHROPIC = Dialect(
    name="anthropic",
    tool_id_prefix="toolu_01",
    interpret=read_anthropic.interpret,
    authenticate=wire_anthropic.authenticate,
    check_headers=wire_anthropic.check_headers,
    stream_events=wire_anthropic.stream_events,
    response_json=wire_anthropic.response_json,
    error_body=wire_anthropic.error_body,
    error_event=wire_anthropic.error_event,
    status_error=wire_anthropic.status_error,
    response_headers=wire_anthropic.response_headers,
    bad_json=wire_anthropic.BAD_JSON,
    bad_content_type=wire_anthropic.BAD_CONTENT_TYPE,
)

OPENAI = Dialect(
    name="openai",
    tool_id_prefix="call_",
    interpret=read_openai.interpret,
    authenticate=wire_openai.authenticate,
    check_headers=wire_openai.check_headers,
    stream_events=wire_openai.stream_events,
    response_json=wire_openai.response_json,
    error_body=wire_openai.error_body,
    error_event=wire_openai.error_event,
    status_error=wire_openai.status_error,
    response_headers=wire_openai.response_headers,
    bad_json=wire_openai.BAD_JSON,
    bad_content_type=wire_openai.BAD_CONTENT_TYPE,
)

RESPONSES = replace(
    OPENAI,
    name="openai-responses",
    interpret=read_openai_responses.interpret,
    stream_events=wire_openai_responses.stream_events,
    response_json=wire_openai_responses.response_json,
    error_event=wire_openai_responses.error_event,
)

# Azure OpenAI: the same formats, the key in an ``api-key`` header; a Chat stream opens with
# Azure's empty-choices chunk (an event like any other, so fault positions count it)
AZURE_OPENAI = replace(
    OPENAI, authenticate=wire_openai.authenticate_azure, stream_events=wire_openai.stream_events_azure
)
AZURE_RESPONSES = replace(RESPONSES, authenticate=wire_openai.authenticate_azure)

ROUTES = {
    "/v1/messages": ANTHROPIC,
    "/v1/chat/completions": OPENAI,
    "/beta/chat/completions": OPENAI,
    "/chat/completions": OPENAI,
    "/v1/responses": RESPONSES,
    "/openai/v1/chat/completions": AZURE_OPENAI,
    "/openai/v1/responses": AZURE_RESPONSES,
    "/openai/responses": AZURE_RESPONSES,
}

GEMINI = Dialect(
    name="gemini",
    tool_id_prefix="",
    interpret=partial(read_gemini.interpret, model="", stream=False),  # bound to the URL by ``route``
    authenticate=wire_gemini.authenticate,
    check_headers=wire_gemini.check_headers,
    stream_events=wire_gemini.stream_events,
    response_json=wire_gemini.response_json,
    error_body=wire_gemini.error_body,
    error_event=wire_gemini.error_event,
    status_error=wire_gemini.status_error,
    response_headers=wire_gemini.response_headers,
    bad_json=wire_gemini.BAD_JSON,
    bad_content_type=wire_gemini.BAD_CONTENT_TYPE,
)

# Gemini names the model and the method in the path: /v1beta/models/{model}:streamGenerateContent?alt=sse
_GEMINI_PATH = re.compile(r"/v1(?:beta)?/models/(?P<model>[^/:]+):(?P<method>streamGenerateContent|generateContent)")


RESPONSES_PATHS = ("/v1/responses/", "/openai/v1/responses/", "/openai/responses/")  # + {id}: re-attach


def route(path: str, query: Mapping[str, str] | None = None) -> tuple[Dialect | None, str | None]:
    """The dialect serving ``path`` (Gemini's bound to the model and method in it), and the
    response id of a re-attach path (``GET .../responses/{id}``)."""
    dialect = ROUTES.get(path)
    if dialect is not None:
        return dialect, None
    for prefix in RESPONSES_PATHS:
        if path.startswith(prefix) and "/" not in path[len(prefix) :] and path[len(prefix) :]:
            return ROUTES[prefix.rstrip("/")], path[len(prefix) :]
    # Azure's dated form: /openai/deployments/{deployment}/chat/completions
    parts = path.split("/")
    if len(parts) == 6 and parts[1:3] == ["openai", "deployments"] and parts[4:] == ["chat", "completions"]:
        return AZURE_OPENAI, None
    match = _GEMINI_PATH.fullmatch(path)
    if match is None:
        return None, None
    stream = match["method"] == "streamGenerateContent"
    sse = (query or {}).get("alt") == "sse"
    interpret = partial(_gemini_interpret, model=match["model"], stream=stream, sse=sse)
    return replace(GEMINI, interpret=interpret), None


def _gemini_interpret(body: Any, *, model: str, stream: bool, sse: bool) -> Interpretation:
    if stream and not sse:
        raise RequestRejected(
            "the fake provider streams Gemini answers as server-sent events only: add ?alt=sse",
            error_type="INVALID_ARGUMENT",
        )
    return read_gemini.interpret(body, model=model, stream=stream)
