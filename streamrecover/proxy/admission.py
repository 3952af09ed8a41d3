"""Admitting a proxied request: its key's limits, then its run (thread, messages, options) in one transaction."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..conf import app_settings, proxy_adapter
from ..models import Message, ProxyKey, Run, Thread
from ..providers.modelname import model_name_problem
from ..redaction import cut_secrets
from .inbound import ANTHROPIC, GEMINI, OPENAI, ProxyRequest, json_path, walk_json
from .translate import Translated, translate, wire_format


@dataclass(frozen=True, slots=True)
class Refused(Exception):
    """The key may not make this request: the HTTP status and what the client is told."""

    status: int
    message: str


# What a run's model column holds.
MODEL_MAX_LENGTH: int = Run._meta.get_field("model").max_length or 0
# Where each format's system prompt came from (a run keeps it in its options).
_SYSTEM_FIELD = {ANTHROPIC: "system", OPENAI: "messages[0].content", GEMINI: "systemInstruction"}
# Where each format names its output limit, when it is not ``max_tokens``.
_MAX_TOKENS_FIELD = {GEMINI: "generationConfig.maxOutputTokens"}


def model_allowed(key: ProxyKey, model: str) -> bool:
    patterns = key.allowed_models or []
    return not patterns or any(fnmatch.fnmatchcase(model, str(p)) for p in patterns)


def check_limits(key: ProxyKey, request: ProxyRequest) -> None:
    """Raise ``Refused`` unless ``key`` may ask for this model and ``max_tokens`` (a request that
    named no ``max_tokens`` gets the key's limit where it is lower than the default).

    A name no provider's URL could hold is refused first (400): a key limited to
    ``gemini-2.0-flash*`` would otherwise match ``gemini-2.0-flash/../gemini-2.5-pro``."""
    problem = model_name_problem(request.model)
    if problem:
        raise Refused(400, f"model: {problem}.")
    if not model_allowed(key, request.model):
        raise Refused(403, f"This key may not use the model {request.model!r}.")
    if key.max_tokens is not None:
        if not request.max_tokens_given:
            request.max_tokens = min(request.max_tokens, key.max_tokens)
        elif request.max_tokens > key.max_tokens:
            field = _MAX_TOKENS_FIELD.get(request.format, "max_tokens")
            raise Refused(400, f"{field}: {request.max_tokens} is above this key's limit of {key.max_tokens}.")


def admit(key: ProxyKey, request: ProxyRequest, provider: str, faults: list[str]) -> Run:
    """Check ``key``'s limits and create the run, or raise ``Refused``.

    The key's row is locked while its active runs are counted and the new one is created, so
    two requests at once cannot both take the last free stream.
    """
    check_limits(key, request)
    check_storable(request)
    served = _served(request, provider)
    with transaction.atomic():
        locked = ProxyKey.objects.select_for_update().get(pk=key.pk)
        if locked.max_concurrent is not None:
            active = Run.objects.filter(options__proxy__key=key.pk).active().count()
            if active >= locked.max_concurrent:
                raise Refused(
                    429, f"This key already has {active} streams open (its limit is {locked.max_concurrent})."
                )
        locked.last_used_at = timezone.now()
        locked.save(update_fields=["last_used_at"])
        return _create_run(key, request, provider, faults, served)


def check_storable(request: ProxyRequest) -> None:
    """Raise ``Refused`` (400) for what the run's rows cannot hold: a model name longer than its
    column, NUL (U+0000) in the model or in what is kept in the run's options (the system prompt,
    the fields passed to the provider: PostgreSQL's jsonb refuses ``\\u0000``). The conversation
    itself may hold NUL: its messages store any string exactly (``TextJSONField``), as they do
    a model's output that the client sends back."""
    if len(request.model) > MODEL_MAX_LENGTH:
        raise Refused(400, f"model: longer than {MODEL_MAX_LENGTH} characters.")
    if "\x00" in request.model:
        raise Refused(400, "model: cannot contain NUL (\\u0000) characters.")
    if request.system and "\x00" in request.system:
        field = _SYSTEM_FIELD.get(request.format, "instructions")
        raise Refused(400, f"{field}: cannot contain NUL (\\u0000) characters.")
    for value, trail, _ in walk_json(request.extra):
        key = trail[1]  # a field's name (the root's is "")
        if (isinstance(value, str) and "\x00" in value) or (isinstance(key, str) and "\x00" in key):
            raise Refused(400, f"{json_path(trail)}: cannot contain NUL (\\u0000) characters.")


def _served(request: ProxyRequest, provider: str) -> Translated:
    """The client's fields for the endpoint's provider: as sent, or translated when the provider
    speaks another wire format (a Responses client served by Claude, say). A Gemini client's fields
    are written for Gemini only: its provider must be one."""
    if request.format == GEMINI:
        refuse_other_api(request, provider)
        return Translated(dict(request.extra), fmt=request.format)
    served = wire_format(app_settings.PROVIDERS[provider], request.model)
    if served is None or served == request.format:
        return Translated(dict(request.extra), fmt=served or request.format)
    translated = translate(request.extra, request.format, served)
    if translated.refused:
        raise Refused(400, f"This endpoint's provider speaks another API: {translated.refused}.")
    return translated


def refuse_other_api(request: ProxyRequest, provider: str) -> None:
    """Raise ``Refused`` (400) when a Gemini client's provider is not a Gemini one: no field of
    a Gemini request is translated to another API."""
    if proxy_adapter(app_settings.PROVIDERS[provider], request.model) != "gemini":
        raise Refused(400, "This endpoint's provider speaks another API; a Gemini request needs a Gemini provider.")


def _failover(request: ProxyRequest, served: Translated) -> tuple[dict[str, Any] | None, str | None]:
    """The run's fallback (its provider, model and, for one of another wire format than the
    served fields', the client's fields translated and the names of those left out), or why this
    request has none."""
    target = (app_settings.PROXY_FAILOVER or {}).get(request.format)
    if not target:
        return None, None
    failover: dict[str, Any] = {"provider": target["PROVIDER"], "model": target["MODEL"]}
    if request.format == GEMINI:  # another Gemini provider (the setting's validation): the fields as sent
        return failover, None
    fmt = wire_format(app_settings.PROVIDERS[target["PROVIDER"]], target["MODEL"])
    if fmt is None:
        return None, f"the fallback provider {target['PROVIDER']!r} takes no translated fields"
    if fmt != served.fmt:
        translated = translate(request.extra, request.format, fmt)
        if translated.refused:
            return None, translated.refused
        failover.update(extra=translated.extra, dropped=translated.dropped)
    return failover, None


def _create_run(key: ProxyKey, request: ProxyRequest, provider: str, faults: list[str], served: Translated) -> Run:
    messages: list[dict[str, Any]] = cut_secrets(request.messages)
    failover, no_failover = _failover(request, served)
    # NUL, kept in the messages, has no place in the title's plain text column
    title = request.last_user_text().replace("\x00", "")[:80]
    thread = Thread.objects.create(owner=key.user, title=title)
    run = Run.objects.create(
        thread=thread,
        owner=key.user,
        provider=provider,
        model=request.model,
        options={
            "system": request.system,
            "max_tokens": request.max_tokens,
            "thinking_budget": request.thinking_budget,
            "demo_tools": False,
            "faults": faults,
            "engine": {},
            "proxy": {
                "format": request.format,
                "key": key.pk,
                "temperature": request.temperature,
                "structured": request.structured,
                "extra": served.extra,
                "betas": request.betas,
                "max_tokens_field": request.max_tokens_field,
                "dropped": served.dropped,
                "failover": failover,
                "no_failover": no_failover,
            },
        },
    )
    Message.objects.bulk_create(
        Message(thread=thread, run=run, position=position, role=message["role"], content=message["content"])
        for position, message in enumerate(messages)
    )
    return run
