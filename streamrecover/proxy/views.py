"""The healing endpoint's views: ``v1/messages`` (Anthropic Messages), ``v1/chat/completions`` (OpenAI Chat),
``v1/responses`` (OpenAI Responses) and ``{v1,v1beta,v1alpha}/models/{model}:streamGenerateContent`` (Gemini).

A streamed request becomes a run executed in this process; its answer streams back in the
client's own wire format, recovered in place when the upstream breaks. A non-streamed request
passes to the provider whole, with the pre-stream retries only.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from ..conf import PROXY_PROVIDER_SETTINGS, app_settings
from ..models import ProxyKey
from ..testing import is_fake
from .admission import Refused, admit, check_limits, refuse_other_api
from .errors import error_response
from .inbound import ANTHROPIC, GEMINI, OPENAI, RESPONSES, BadRequest, Format, ProxyRequest, beta_flags, parse
from .inbound_gemini import parse_gemini
from .keys import find_key
from .passthrough import forward
from .relay import Item, ProxyStream, RelaySink, RunEnded, start_run_thread
from .translate import wire_format
from .wire import AnthropicWriter, OpenAIWriter, Writer
from .wire_gemini import GeminiWriter
from .wire_responses import ResponsesWriter

log = structlog.get_logger("streamrecover")

# Faults for the built-in fake provider only (tests and demos): ignored for any real provider.
FAULTS_HEADER = "x-streamrecover-faults"
# What a client is told of a missing or unknown key, in its provider's words.
_BAD_KEY = {
    ANTHROPIC: "invalid x-api-key",
    GEMINI: "API key not valid. Please pass a valid API key.",
}


def _raw_key(request: HttpRequest, format: Format) -> str:
    """The key as each SDK sends it: ``x-api-key`` (Anthropic; its ``auth_token`` sends a bearer
    token, also taken), ``x-goog-api-key`` (Gemini: google-genai never sends it as ``?key=``) or
    ``Authorization: Bearer`` (OpenAI)."""
    if format == ANTHROPIC and request.headers.get("x-api-key"):
        return request.headers["x-api-key"].strip()
    if format == GEMINI:
        return request.headers.get("x-goog-api-key", "").strip()
    authorization = request.headers.get("authorization", "")
    return authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""


def _provider(format: Format) -> str:
    return str(getattr(app_settings, PROXY_PROVIDER_SETTINGS[format]))


def _faults(request: HttpRequest, provider: str) -> list[str]:
    specs = request.headers.get(FAULTS_HEADER, "")
    if not is_fake(app_settings.provider_config(provider)) or not specs:
        return []
    return [s.strip() for s in specs.split(";") if s.strip()]


def _body(request: HttpRequest) -> bytes | None:
    """The request's body, or None when it is over ``PROXY_MAX_BODY_BYTES``.

    Read here rather than through ``request.body``, which holds every request to Django's
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (2.5 MB by default, made for form posts): a request with an
    image or a long document is routinely larger, and a provider takes up to 32 MB. A declared
    length over the limit is refused before anything is read; an undeclared one is read one
    byte past it at most.
    """
    limit = int(app_settings.PROXY_MAX_BODY_BYTES)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return None
    body = request.read(limit + 1)
    return None if len(body) > limit else body


async def _serve(request: HttpRequest, format: Format, gemini: tuple[str, bool] | None = None) -> HttpResponseBase:
    """One request; ``gemini``: a Gemini request's model and whether it streams (from its URL)."""
    key: ProxyKey | None = await sync_to_async(find_key)(_raw_key(request, format))
    if key is None:
        return error_response(format, 401, _BAD_KEY.get(format, "Incorrect API key provided."))
    raw = _body(request)
    if raw is None:
        limit = int(app_settings.PROXY_MAX_BODY_BYTES)
        return error_response(format, 413, f"The request body is over this endpoint's limit of {limit} bytes.")
    try:
        parsed = _parse(format, raw, gemini)
    except BadRequest as exc:
        return error_response(format, 400, str(exc))
    if format == ANTHROPIC:
        parsed.betas = beta_flags(request.headers.get("anthropic-beta"))
    provider = _provider(format)
    try:
        faults = _faults(request, provider)  # reads the provider's settings: a missing API key raises
    except ImproperlyConfigured as exc:
        log.error("proxy_provider_not_configured", provider=provider, error=str(exc))
        return error_response(format, 500, "The endpoint's provider is not configured.")
    if not parsed.stream:
        try:
            check_limits(key, parsed)
            if format == GEMINI:
                refuse_other_api(parsed, provider)
        except Refused as refused:
            return error_response(format, refused.status, refused.message)
        if wire_format(app_settings.PROVIDERS[provider], parsed.model) not in (format, None):
            # passed on as sent: only a provider of the client's own API can read it
            return error_response(
                format, 400, "Non-streamed requests need a provider of this endpoint's own API; stream this one."
            )
        return await forward(parsed, provider)
    try:
        run = await sync_to_async(admit)(key, parsed, provider, faults)
    except Refused as refused:
        return error_response(format, refused.status, refused.message)
    queue: asyncio.Queue[Item] = asyncio.Queue()
    relay = RelaySink(asyncio.get_running_loop(), queue)
    writer: Writer
    if format == ANTHROPIC:
        writer = AnthropicWriter(f"msg_{run.pk.hex}", parsed.model)
    elif format == OPENAI:
        writer = OpenAIWriter(f"chatcmpl-{run.pk.hex}", parsed.model, parsed.include_usage, parsed.logprobs)
    elif format == GEMINI:
        writer = GeminiWriter(run.pk.hex, parsed.model, parsed.logprobs)
    else:
        echoed = {**parsed.body, "max_output_tokens": parsed.max_tokens}
        writer = ResponsesWriter(f"resp_{run.pk.hex}", parsed.model, echoed)
    stream = ProxyStream(format, writer, queue)
    start_run_thread(str(run.pk), relay)
    first = await stream.first()
    if isinstance(first, RunEnded):
        status, message = stream.failure()
        return error_response(format, status, message)

    async def body() -> Any:
        yield first
        async for chunk in stream.rest():
            yield chunk

    response = StreamingHttpResponse(body(), content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Streamrecover-Run"] = str(run.pk)
    response["request-id" if format == ANTHROPIC else "x-request-id"] = f"req_{run.pk.hex}"
    return response


def _parse(format: Format, raw: bytes, gemini: tuple[str, bool] | None) -> ProxyRequest:
    default = int(app_settings.PROXY_DEFAULT_MAX_TOKENS)
    if gemini is not None:
        return parse_gemini(raw, gemini[0], gemini[1], default)
    return parse(format, raw, default)


@csrf_exempt
@require_POST
async def messages(request: HttpRequest) -> HttpResponseBase:
    """``POST v1/messages``: the Anthropic Messages API."""
    return await _serve(request, ANTHROPIC)


@csrf_exempt
@require_POST
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    """``POST v1/chat/completions``: the OpenAI Chat Completions API."""
    return await _serve(request, OPENAI)


@csrf_exempt
@require_POST
async def responses(request: HttpRequest) -> HttpResponseBase:
    """``POST v1/responses``: the OpenAI Responses API."""
    return await _serve(request, RESPONSES)


@csrf_exempt
@require_POST
async def generate_content(request: HttpRequest, version: str, model: str, method: str) -> HttpResponseBase:
    """``POST {version}/models/{model}:streamGenerateContent?alt=sse`` and ``:generateContent``:
    the Gemini API (``v1``, google-genai's default, ``v1beta``, ``v1alpha``: the provider is asked
    at its adapter's version)."""
    stream = method == "streamGenerateContent"
    if stream and request.GET.get("alt") != "sse":
        return error_response(GEMINI, 400, "This endpoint streams as server-sent events only: add ?alt=sse.")
    return await _serve(request, GEMINI, (model, stream))
