"""The two wire formats the fake speaks, behind one shape so the server handles both alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import read_anthropic, read_openai, wire_anthropic, wire_openai
from .interpret import Interpretation
from .model import Plan
from .wire import ErrorSpec, ResponseContext, WireEvent


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str  # "anthropic" | "openai"
    tool_id_prefix: str
    interpret: Callable[[Any], Interpretation]
    authenticate: Callable[[Mapping[str, str]], ErrorSpec | None]
    check_headers: Callable[[Mapping[str, str]], ErrorSpec | None]
    stream_events: Callable[[Plan, ResponseContext], list[WireEvent]]
    response_json: Callable[[Plan, ResponseContext], dict[str, Any]]
    error_body: Callable[[ErrorSpec, str], bytes]
    error_event: Callable[[str | None, str | None], WireEvent]
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

ROUTES = {
    "/v1/messages": ANTHROPIC,
    "/v1/chat/completions": OPENAI,
    "/beta/chat/completions": OPENAI,
    "/chat/completions": OPENAI,
}
