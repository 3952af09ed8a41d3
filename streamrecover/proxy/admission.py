"""Admitting a proxied request: its key's limits, then its run (thread, messages, options) in one transaction."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..conf import app_settings
from ..models import Message, ProxyKey, Run, Thread
from ..redaction import cut_secrets
from .inbound import ProxyRequest
from .translate import Translated, translate, wire_format


@dataclass(frozen=True, slots=True)
class Refused(Exception):
    """The key may not make this request: the HTTP status and what the client is told."""

    status: int
    message: str


def model_allowed(key: ProxyKey, model: str) -> bool:
    patterns = key.allowed_models or []
    return not patterns or any(fnmatch.fnmatchcase(model, str(p)) for p in patterns)


def check_limits(key: ProxyKey, request: ProxyRequest) -> None:
    """Raise ``Refused`` unless ``key`` may ask for this model and ``max_tokens`` (a request that
    named no ``max_tokens`` gets the key's limit where it is lower than the default)."""
    if not model_allowed(key, request.model):
        raise Refused(403, f"This key may not use the model {request.model!r}.")
    if key.max_tokens is not None:
        if not request.max_tokens_given:
            request.max_tokens = min(request.max_tokens, key.max_tokens)
        elif request.max_tokens > key.max_tokens:
            raise Refused(400, f"max_tokens: {request.max_tokens} is above this key's limit of {key.max_tokens}.")


def admit(key: ProxyKey, request: ProxyRequest, provider: str, faults: list[str]) -> Run:
    """Check ``key``'s limits and create the run, or raise ``Refused``.

    The key's row is locked while its active runs are counted and the new one is created, so
    two requests at once cannot both take the last free stream.
    """
    check_limits(key, request)
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


def _served(request: ProxyRequest, provider: str) -> Translated:
    """The client's fields for the endpoint's provider: as sent, or translated when the provider
    speaks another wire format (a Responses client served by Claude, say)."""
    served = wire_format(app_settings.PROVIDERS[provider], request.model)
    if served is None or served == request.format:
        return Translated(dict(request.extra), fmt=served or request.format)
    translated = translate(request.extra, request.format, served)
    if translated.refused:
        raise Refused(400, f"This endpoint's provider speaks another API: {translated.refused}.")
    return translated


def _failover(request: ProxyRequest, served: Translated) -> tuple[dict[str, Any] | None, str | None]:
    """The run's fallback (its provider, model and, for one of another wire format than the
    served fields', the client's fields translated and the names of those left out), or why this
    request has none."""
    target = (app_settings.PROXY_FAILOVER or {}).get(request.format)
    if not target:
        return None, None
    failover: dict[str, Any] = {"provider": target["PROVIDER"], "model": target["MODEL"]}
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
    thread = Thread.objects.create(owner=key.user, title=request.last_user_text()[:80])
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
