"""The JSON API for the chat page and scripts: start, watch, cancel runs; list threads.

Session authentication and CSRF exactly as Django does them (no exemption): a browser page
sends the ``X-CSRFToken`` header. Anonymous callers get a JSON 403; a thread or run that is
not the caller's is a 404, so nobody learns what exists, unless the caller holds the admin's
permission: ``streamrecover.view_run`` to read any run and its thread, ``change_run`` to cancel
any run (``is_staff`` alone grants neither). Follow-ups and the thread list are the caller's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from . import dispatch
from .conf import MAX_STORED_INT, app_settings
from .models import Attempt, Message, Run, Thread
from .providers.common import LONE_SURROGATE
from .providers.modelname import model_name_problem
from .runs import lifecycle
from .testing import is_fake, parse_faults

JsonView = Callable[..., JsonResponse]
# A run's model column holds no longer name.
MODEL_MAX_LENGTH: int = Run._meta.get_field("model").max_length or 0


class BadRequest(Exception):
    """Turned into a 400 with ``message``."""


def error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def login_required_json(view: JsonView) -> JsonView:
    """403 with a JSON body: a script has no login form to follow."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
        if not request.user.is_authenticated:
            return error(403, "Authentication required: log in first.")
        return view(request, *args, **kwargs)

    return wrapped


# The WebSocket paths (``routing.py``), ``{id}`` for the run's or the thread's id.
RUN_SOCKET = "/ws/streamrecover/runs/{id}/"
THREAD_SOCKET = "/ws/streamrecover/threads/{id}/"


def ws_url(run: Run) -> str:
    return RUN_SOCKET.replace("{id}", str(run.pk))


def _messages(thread_id: int) -> list[dict[str, Any]]:
    return [{"position": m.position, **m.as_canonical()} for m in Message.objects.of_thread(thread_id)]


def _run_summary(run: Run) -> dict[str, Any]:
    return {
        "run_id": str(run.pk),
        "thread_id": run.thread_id,
        "status": run.status,
        "provider": run.provider,
        "model": run.model,
        "created": run.created.isoformat(),
        "url": reverse("streamrecover:api-run", args=[run.pk]),
        "ws_url": ws_url(run),
    }


def _own_threads(request: HttpRequest) -> Any:
    user = request.user
    if not user.is_authenticated:  # (every caller is behind login_required_json)
        return Thread.objects.none()
    return Thread.objects.filter(owner=user)


def _readable_threads(request: HttpRequest) -> Any:
    """The threads whose messages the caller may read: the same rule as a run's (its detail
    shows its thread's messages)."""
    return Thread.objects.all() if Run.objects.may_view_all(request.user) else _own_threads(request)


# ---- parsing the body of POST api/runs/ ------------------------------------------------------


def _json_body(request: HttpRequest) -> dict[str, Any]:
    if request.content_type != "application/json":
        raise BadRequest(f"Send the body as application/json (got {request.content_type or 'no content type'}).")
    try:
        raw = request.body
    except RequestDataTooBig:
        raise BadRequest("The body is too large (see DATA_UPLOAD_MAX_MEMORY_SIZE).") from None
    try:
        body = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        raise BadRequest("The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.")
    return body


def _optional(body: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``body[key]`` when it has the type ``kind`` (JSON true is not an integer), else 400."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise BadRequest(f"{key!r} must be {what}.")
    # the database's integer columns hold no more: a larger number is a client's mistake, not a 500
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_STORED_INT:
        raise BadRequest(f"{key!r} is too large.")
    if isinstance(value, str):
        _check_text(key, value)
    return value


def _check_text(key: str, value: str) -> None:
    """400 for a string that could be neither stored nor sent on."""
    if "\x00" in value:  # PostgreSQL stores no NUL in text (the chat form refuses it too)
        raise BadRequest(f"{key!r} cannot contain NUL (\\u0000) characters.")
    if LONE_SURROGATE.search(value):  # no UTF-8 form
        raise BadRequest(f"{key!r} is not valid Unicode (a lone surrogate escape).")


def _run_options(body: dict[str, Any]) -> dict[str, Any]:
    """``create_run`` keyword arguments from the body (the thread is checked separately)."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadRequest("'prompt' is required: a non-empty string.")
    _check_text("prompt", prompt)
    provider = _optional(body, "provider", str, "a provider name") or app_settings.DEFAULT_PROVIDER
    if provider not in app_settings.PROVIDERS:
        raise BadRequest(f"Unknown provider {provider!r}. Configured: {', '.join(sorted(app_settings.PROVIDERS))}.")
    try:
        app_settings.provider_config(provider)
    except ImproperlyConfigured as exc:
        raise BadRequest(str(exc)) from None
    model = _optional(body, "model", str, "a model name") or None
    if model is not None and len(model) > MODEL_MAX_LENGTH:
        raise BadRequest(f"'model' is longer than {MODEL_MAX_LENGTH} characters.")
    problem = model_name_problem(model) if model is not None else None
    if problem:
        raise BadRequest(f"'model' {problem}.")
    system = _optional(body, "system", str, "a string")
    options: dict[str, Any] = {
        "prompt": prompt,
        "system": system or None,
        "provider": provider,
        "model": model,
        "demo_tools": bool(_optional(body, "demo_tools", bool, "true or false")),
        "thinking_budget": _optional(body, "thinking_budget", int, "an integer (tokens)"),
        "faults": _faults(body.get("faults"), provider),
    }
    max_tokens = _optional(body, "max_tokens", int, "an integer (tokens)")
    if max_tokens is not None:
        if max_tokens < 1:
            raise BadRequest("'max_tokens' must be positive.")
        options["max_tokens"] = max_tokens
    if options["thinking_budget"] is not None and options["thinking_budget"] < 0:
        raise BadRequest("'thinking_budget' must be 0 or more.")
    if options["thinking_budget"] is not None and options["thinking_budget"] >= options.get("max_tokens", 1024):
        raise BadRequest("'thinking_budget' must be below 'max_tokens' (default 1024).")
    limit = _optional(body, "max_continuations", int, "an integer")
    if limit is not None:
        if not 0 <= limit <= app_settings.MAX_CONTINUATIONS:
            raise BadRequest(f"'max_continuations' must be between 0 and {app_settings.MAX_CONTINUATIONS}.")
        options["engine"] = {"max_continuations": limit}
    return options


def _faults(value: Any, provider: str) -> list[str]:
    """Fault specs for the built-in fake provider (``cut:bytes=1500``...), validated here."""
    if value is None or value == []:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest("'faults' must be a list of fault strings such as \"cut:bytes=1500\".")
    if not is_fake(app_settings.provider_config(provider)):
        raise BadRequest("'faults' work with the built-in fake provider only.")
    try:
        parse_faults(value)
    except ValueError as exc:
        raise BadRequest(f"{exc}.") from None
    return value


# ---- views -------------------------------------------------------------------------------------


@require_POST
@login_required_json
def create_run(request: HttpRequest) -> JsonResponse:
    """``POST api/runs/`` ``{prompt, system?, thread_id?, provider?, model?, faults?, demo_tools?,
    max_tokens?, thinking_budget?, max_continuations?}``: a follow-up when ``thread_id`` is given."""
    try:
        body = _json_body(request)
        options = _run_options(body)
        thread_id = _optional(body, "thread_id", int, "an integer")
    except BadRequest as exc:
        return error(400, str(exc))
    thread = None
    if thread_id is not None:
        thread = _own_threads(request).filter(pk=thread_id).first()
        if thread is None:
            return error(404, f"No thread {thread_id} of yours.")
    try:
        with transaction.atomic():
            run = lifecycle.create_run(owner=request.user, thread=thread, **options)
            dispatch.enqueue_run(run)
    except lifecycle.ThreadBusy:
        return error(409, "This thread has a run in progress: wait for it or cancel it.")
    return JsonResponse(
        {"run_id": str(run.pk), "thread_id": run.thread_id, "status": run.status, "ws_url": ws_url(run)}, status=201
    )


def _run_or_404(request: HttpRequest, run_id: Any) -> Run | None:
    return Run.objects.visible_to(request.user).filter(pk=run_id).first()


@require_POST
@login_required_json
def cancel_run(request: HttpRequest, run_id: Any) -> JsonResponse:
    """``POST api/runs/<id>/cancel/``: a queued run stops at once, a running one within a tick (a
    queued one that had started at once too: this process commits what its client was shown)."""
    run = _run_or_404(request, run_id)
    if run is None:
        return error(404, f"No run {run_id} of yours.")
    if not Run.objects.cancellable_by(request.user).filter(pk=run.pk).exists():
        # seen (the view permission) but not the change permission the admin's cancel needs
        return error(403, "You may not cancel someone else's run (it needs the permission to change runs).")
    cancelled = lifecycle.request_cancel(run.pk)
    run.refresh_from_db(fields=["status"])
    return JsonResponse({"run_id": str(run.pk), "cancel_requested": cancelled, "status": run.status}, status=202)


@require_GET
@login_required_json
def run_detail(request: HttpRequest, run_id: Any) -> JsonResponse:
    """``GET api/runs/<id>/``: status, error, the thread's messages, the attempts."""
    run = _run_or_404(request, run_id)
    if run is None:
        return error(404, f"No run {run_id} of yours.")
    attempts = list(Attempt.objects.of_run(run.pk))
    kinds: dict[str, int] = {}
    for attempt in attempts:
        kinds[attempt.kind] = kinds.get(attempt.kind, 0) + 1
    return JsonResponse(
        {
            **_run_summary(run),
            "error": {"kind": run.error_kind, "message": run.error_message} if run.error_kind else None,
            "messages": _messages(run.thread_id),
            "attempts": {
                "count": len(attempts),
                "by_kind": kinds,
                "interrupt_causes": sorted({a.interrupt_cause for a in attempts if a.interrupt_cause}),
                "items": [
                    {
                        "index": a.index,
                        "kind": a.kind,
                        "continuation": a.continuation,
                        "strategy": a.strategy,
                        "status_code": a.status_code,
                        "outcome": a.outcome,
                        "interrupt_cause": a.interrupt_cause,
                        "output_tokens": a.output_tokens,
                    }
                    for a in attempts
                ],
            },
        }
    )


@require_GET
@login_required_json
def thread_list(request: HttpRequest) -> JsonResponse:
    """``GET api/threads/``: the caller's threads, newest first, with their latest run."""
    threads = []
    for thread in _own_threads(request).order_by("-created")[:200]:
        last = Run.objects.filter(thread=thread).order_by("-created").first()
        threads.append(
            {
                "id": thread.pk,
                "title": thread.title,
                "created": thread.created.isoformat(),
                "url": reverse("streamrecover:api-thread", args=[thread.pk]),
                "last_run": _run_summary(last) if last else None,
            }
        )
    return JsonResponse({"threads": threads})


@require_GET
@login_required_json
def thread_detail(request: HttpRequest, thread_id: int) -> JsonResponse:
    """``GET api/threads/<id>/``: the committed messages and the runs of one thread."""
    thread = _readable_threads(request).filter(pk=thread_id).first()
    if thread is None:
        return error(404, f"No thread {thread_id} of yours.")
    runs = Run.objects.filter(thread=thread).order_by("created")
    return JsonResponse(
        {
            "id": thread.pk,
            "title": thread.title,
            "created": thread.created.isoformat(),
            "messages": _messages(thread.pk),
            "runs": [_run_summary(run) for run in runs],
        }
    )
