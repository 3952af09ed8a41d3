"""A non-streamed request: passed to the provider as the client sent it, retried only before any answer.

Nothing streams, so there is nothing to continue: a 429, 529, 5xx or a connection error is
retried (``MAX_REQUEST_RETRIES``, the pre-stream backoff, ``Retry-After`` honoured and capped),
and the provider's answer, or its last error, is the client's.

The answer is held whole before it is sent, so it is read with a cap (``PROXY_MAX_RESPONSE_BYTES``,
counted after decoding): past it the client gets a 502 in its provider's shape. The provider is
asked for ``Accept-Encoding: identity``; a compressed answer regardless is inflated in bounded
slices (``engine.contentcoding``) and sent plain, so any client reads it, whatever it accepts.
"""

from __future__ import annotations

import asyncio

import httpx
from django.http import HttpResponse

from ..conf import app_settings
from ..engine.contentcoding import decoded
from ..engine.contract import ModelRequest
from ..engine.errors import StreamInterrupted
from ..engine.retry import parse_retry_after
from ..providers.gemini import method_url
from ..providers.registry import get_adapter
from ..testing import fake_provider
from .errors import error_response
from .inbound import GEMINI, RESPONSES, ProxyRequest

RETRIED = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


async def forward(request: ProxyRequest, provider: str) -> HttpResponse:
    config = fake_provider(app_settings.provider_config(provider), request.model)
    adapter = get_adapter(config)
    model_request = ModelRequest(
        model=request.model, messages=request.messages, max_tokens=1, betas=tuple(request.betas)
    )
    built = adapter.build_request(model_request)
    headers = {**built.headers, "accept": "application/json", "accept-encoding": "identity"}
    body = dict(request.body)
    url = built.url
    if request.format == GEMINI:  # ``generateContent``: the model and method are the URL's
        url = method_url(config.base_url, request.model, stream=False)
        if not request.max_tokens_given:
            config_key = "generation_config" if "generation_config" in body else "generationConfig"
            body[config_key] = {**(body.get(config_key) or {}), "maxOutputTokens": request.max_tokens}
    elif not request.max_tokens_given:  # an OpenAI request without one: the default (or the key's limit)
        body[_limit_name(request, built.json)] = request.max_tokens
    engine = app_settings.engine_config()
    attempts = engine.max_request_retries + 1
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=config.connect_timeout_s)) as client:
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                async with client.stream("POST", url, json=body, headers=headers) as response:
                    if response.status_code in RETRIED and not last:
                        retry_after = parse_retry_after(response.headers)
                    else:
                        return await _answer(request, response)
            except httpx.TransportError as exc:
                if last:
                    return error_response(
                        request.format, 502, f"The provider could not be reached: {type(exc).__name__}"
                    )
                retry_after = None
            await asyncio.sleep(_delay(attempt, retry_after))
    raise AssertionError("unreachable")  # pragma: no cover


async def _answer(request: ProxyRequest, response: httpx.Response) -> HttpResponse:
    """The provider's answer as the client's response, or a 502 past ``PROXY_MAX_RESPONSE_BYTES``."""
    limit = int(app_settings.PROXY_MAX_RESPONSE_BYTES)
    body = bytearray()
    try:
        async for piece in decoded(response.aiter_raw(), response.headers.get("content-encoding")):
            body += piece
            if len(body) > limit:  # stop reading: the rest is never asked for, the connection closed
                return error_response(
                    request.format,
                    502,
                    f"The provider's answer is larger than PROXY_MAX_RESPONSE_BYTES ({limit} bytes).",
                )
    except StreamInterrupted as exc:
        return error_response(request.format, 502, f"The provider's answer could not be read: {exc.message}")
    return HttpResponse(
        bytes(body),
        status=response.status_code,
        content_type=response.headers.get("content-type", "application/json"),
    )


def _delay(attempt: int, retry_after: float | None) -> float:
    engine = app_settings.engine_config()
    if retry_after is not None:
        return min(retry_after, engine.max_retry_after_s)
    return min(engine.request_retry_base_s * (2**attempt), 8.0) * engine.backoff_scale


def _limit_name(request: ProxyRequest, built: dict[str, object]) -> str:
    """What an OpenAI request names its output limit: on Chat, the name the adapter sends it under
    for this provider (OpenAI's own API: ``max_completion_tokens``, which every model takes)."""
    if request.format == RESPONSES:
        return "max_output_tokens"
    return "max_completion_tokens" if "max_completion_tokens" in built else "max_tokens"
