"""The command-line driver: one run from command-line options to the ``--json`` document.

Resolves the provider with the command line's overrides, creates the run, executes it here
(or starts it the configured way with ``enqueue`` and waits), and shapes the result as the
command line's JSON contract.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from django.core.exceptions import ImproperlyConfigured

from .. import dispatch, starter
from ..conf import app_settings
from ..engine.agent import RunResult
from ..engine.contract import ProviderConfig
from ..engine.sink import CollectingSink, RunSink
from ..models import Attempt, Message, RecoveryEvent, Run
from ..runs import lifecycle
from ..testing import is_fake, parse_faults
from .console import ConsoleSink


@dataclass(slots=True)
class RunOptions:
    prompt: str
    provider: str | None = None  # None: DEFAULT_PROVIDER
    model: str | None = None  # None: DEFAULT_MODEL
    system: str | None = None
    max_tokens: int = 1024
    thinking_budget: int | None = None
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    max_continuations: int | None = None
    backoff_scale: float | None = None
    idle_timeout: float | None = None
    faults: list[str] = field(default_factory=list)
    demo_tools: bool = False
    enqueue: bool = False
    timeout: float = 600.0  # with enqueue: how long to wait for the run to end


def provider_config_for(name: str, base_url: str | None = None, api_key: str | None = None) -> ProviderConfig:
    """The configured provider, with command-line overrides; a key given here wins."""
    try:
        config = app_settings.provider_config(name)
    except ImproperlyConfigured:
        if not api_key:
            raise
        entry = app_settings.PROVIDERS[name]
        config = ProviderConfig(name=entry["ADAPTER"], base_url=entry["BASE_URL"])
    if base_url:
        config = replace(config, base_url=base_url)
    if api_key:
        config = replace(config, api_key=api_key)
    return config


def user_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _engine_overrides(options: RunOptions) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if options.max_continuations is not None:
        changes["max_continuations"] = options.max_continuations
    if options.backoff_scale is not None:
        changes["backoff_scale"] = options.backoff_scale
    if options.idle_timeout is not None:
        changes["idle_timeout_s"] = options.idle_timeout
    return changes


class RunTimeout(Exception):
    """An enqueued run did not end within the wait (its message says what to do)."""


def execute_cli_run(options: RunOptions, live: TextIO | None = None) -> dict[str, Any]:
    """Create a persisted run and execute it here (or start it the configured way with
    ``enqueue``: a Celery worker when ``EXECUTION`` is ``celery``); returns the ``--json`` document."""
    overridden = bool(options.base_url or options.api_key)
    provider = options.provider or app_settings.DEFAULT_PROVIDER
    if provider not in app_settings.PROVIDERS:
        raise ValueError(
            f"unknown provider {provider!r}; configured in STREAMRECOVER['PROVIDERS']: "
            + ", ".join(sorted(app_settings.PROVIDERS))
        )
    # resolve the provider before anything is stored: a missing key fails here, clearly
    resolved = provider_config_for(provider, options.base_url, options.api_key)
    override = resolved if overridden else None
    if options.enqueue and overridden:
        raise ValueError("--base-url/--api-key cannot be handed to a worker: configure the provider in settings")
    if options.enqueue and app_settings.EXECUTION == "celery":
        dispatch.check_celery_reachable()  # before the run exists: nothing is left queued for nobody
    if options.faults:
        # before the run exists: a bad or ignored fault must not leave a claimed run behind
        if not is_fake(resolved):
            raise ValueError(f"--fault works only with the built-in fake provider (--provider fake), not {provider!r}")
        parse_faults(options.faults)
    run = lifecycle.create_run(
        prompt=options.prompt,
        provider=provider,
        model=options.model or app_settings.DEFAULT_MODEL,
        system=options.system,
        max_tokens=options.max_tokens,
        thinking_budget=options.thinking_budget,
        demo_tools=options.demo_tools,
        faults=options.faults,
        engine=_engine_overrides(options),
    )
    run_id = str(run.pk)
    if options.enqueue:
        dispatch.enqueue_run(run)
        try:
            lifecycle.wait_for_run(run_id, timeout_s=options.timeout)
        except TimeoutError:
            status = Run.objects.values_list("status", flat=True).get(pk=run_id)
            why = (
                "no worker took it (is a Celery worker running?)"
                if status == Run.Status.QUEUED
                else "a worker is still on it"
            )
            raise RunTimeout(
                f"run {run_id} is still {status} after {options.timeout:g} s: {why}. "
                f"It was not stopped; cancel it with: manage.py streamrecover_cancel {run_id}"
            ) from None
        return stored_output(run_id)
    collected = CollectingSink()
    sinks: list[RunSink] = [collected]
    console = ConsoleSink(live) if live is not None else None
    if console is not None:
        sinks.append(console)
    result = asyncio.run(starter.execute_here(run_id, extra_sinks=sinks, provider_override=override))
    if result is None:
        raise ValueError(f"run {run_id} could not be claimed")
    if console is not None:
        console.finish(result.status, result.error)
    return cli_output(run_id, result, collected)


def cli_output(run_id: str, result: RunResult, collected: CollectingSink) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "status": result.status,
        "messages": result.messages,
        "client_events": collected.frames,
        "events": [e.as_dict() for e in collected.events],
        "attempts": [a.as_dict() for a in collected.attempts],
        "error": result.error,
    }


def stored_output(run_id: str) -> dict[str, Any]:
    """The same document, read back from the database (a run executed elsewhere).
    ``client_events`` is empty: live frames went to the channel layer, not here."""
    run = Run.objects.get(pk=run_id)
    messages = Message.objects.of_thread(run.thread_id).canonical()
    events = [{"event": e.name, **e.payload} for e in RecoveryEvent.objects.filter(run=run).order_by("id")]
    attempts = [
        {
            "index": a.index,
            "kind": a.kind,
            "status_code": a.status_code,
            "usage": {
                "input_tokens": a.input_tokens,
                "output_tokens": a.output_tokens,
                "cache_creation_input_tokens": a.cache_creation_input_tokens,
                "cache_read_input_tokens": a.cache_read_input_tokens,
                "reasoning_tokens": a.reasoning_tokens,
            },
            "usage_estimated": a.usage_estimated,
            "interrupt_cause": a.interrupt_cause or None,
            "strategy": a.strategy or None,
            "outcome": a.outcome,
        }
        for a in Attempt.objects.of_run(run.pk)
    ]
    error = {"kind": run.error_kind, "message": run.error_message} if run.error_kind else None
    return {
        "run_id": run_id,
        "status": run.status,
        "messages": messages,
        "client_events": [],
        "events": events,
        "attempts": attempts,
        "error": error,
    }
