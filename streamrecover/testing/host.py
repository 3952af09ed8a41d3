"""Testing a host project's use of streamrecover: the fake provider behind the project's own settings.

``FakeProvider`` points every provider in ``STREAMRECOVER['PROVIDERS']`` that uses a built-in
adapter at a running fake provider (Anthropic-style ones at its Messages route, OpenAI-style
ones at its Chat Completions route, Responses and Gemini ones at theirs) for one scenario of
its own, and restores the settings afterwards (``override_settings``). ``script()`` gives the
fault each next provider request meets (the ``fake`` provider speaks the Anthropic format,
``fake-openai`` the OpenAI one);
``run()`` creates a run and executes it here, returning a ``RunReport``: the recorded
events, the attempts, the committed messages and what a client that received every frame shows.
``assert_recovered`` checks a report for the one thing recovery promises.

The pytest plugin (``streamrecover.testing.pytest_plugin``) gives these as fixtures. This
module imports Django's ORM: it is for tests, and ``streamrecover.testing`` does not import it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.test import override_settings

from .. import starter
from ..conf import DEFAULT_PROVIDERS, SETTINGS_NAME
from ..engine.sink import LLM_STREAM_CONTINUATION_COMPLETED, LLM_STREAM_INTERRUPTED, CollectingSink
from ..models import Attempt, Message, RecoveryEvent, Run
from ..runs import execution, lifecycle
from .client import ClientView
from .fake import SCENARIO_HEADER, FakeProviderServer, parse_script

__all__ = ["FakeProvider", "RunReport", "assert_recovered"]

# Built-in adapter -> the fake's wire format for it (every one the fake speaks).
_BUILT_IN = {
    "anthropic": "anthropic",
    "openai": "openai",
    "openai_chat": "openai",
    "openai-responses": "openai-responses",
    "gemini": "gemini",
}
# The fake's routes below its address: Anthropic's and Gemini's paths hold their own prefix.
_ROUTE_PREFIX = {"anthropic": "", "gemini": ""}
_counter = itertools.count(1)
# Recovery settings that make a test fast: no real backoff between continuations.
FAST = {"BACKOFF_SCALE": 0.0, "REQUEST_RETRY_BASE": 0.0, "BACKOFF_JITTER": 0.0}


@dataclass
class RunReport:
    """What one run left behind, and what a client that received its frames shows."""

    run_id: str
    status: str
    error: dict[str, str] | None
    events: list[tuple[str, dict[str, Any]]]  # (name, payload), in the order they were recorded
    attempts: list[dict[str, Any]]  # kind, outcome, interrupt_cause, strategy, status_code
    messages: list[dict[str, Any]]  # the thread's committed messages, {"role", "content"}
    view: ClientView | None = None  # None when the frames were not seen (a run started elsewhere)
    frames: list[dict[str, Any]] = field(default_factory=list)

    def event_names(self) -> list[str]:
        return [name for name, _ in self.events]

    def events_named(self, name: str) -> list[dict[str, Any]]:
        return [payload for event, payload in self.events if event == name]

    @property
    def assistant_text(self) -> str:
        """The committed assistant text of the run's thread."""
        return "".join(
            block.get("text", "")
            for message in self.messages
            if message["role"] == "assistant"
            for block in message["content"]
            if block.get("type") == "text"
        )

    @property
    def interruptions(self) -> list[str]:
        """The causes of the provider streams that broke."""
        return [a["interrupt_cause"] for a in self.attempts if a["interrupt_cause"]]


def report(run_id: Any, *, frames: Sequence[dict[str, Any]] | None = None) -> RunReport:
    """The report of a run as the database has it (``frames``: the frames a client received)."""
    run = Run.objects.get(pk=run_id)
    view = ClientView().apply_all(frames) if frames is not None else None
    return RunReport(
        run_id=str(run.pk),
        status=run.status,
        error={"kind": run.error_kind, "message": run.error_message} if run.error_kind else None,
        events=[(e.name, e.payload) for e in RecoveryEvent.objects.filter(run=run).order_by("id")],
        attempts=[
            {
                "kind": a.kind,
                "outcome": a.outcome,
                "interrupt_cause": a.interrupt_cause,
                "strategy": a.strategy,
                "status_code": a.status_code,
            }
            for a in Attempt.objects.of_run(run.pk)
        ],
        messages=Message.objects.of_thread(run.thread_id).canonical(),
        view=view,
        frames=list(frames or []),
    )


def wait_for(run_id: Any, timeout: float = 30.0) -> RunReport:
    """Wait until a run started elsewhere (a view, a thread, a worker) has ended; its report.

    A run executing in a thread of this process (the in-process mode) has ended when that
    thread has: its last writes (the analytics fold) follow the terminal status, and a test
    database flushed under them deadlocks.
    """
    deadline = time.monotonic() + timeout
    while True:
        status = Run.objects.filter(pk=run_id).values_list("status", flat=True).get()
        if status in Run.TERMINAL_STATUSES:
            for thread in starter.run_threads(run_id):
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    raise AssertionError(f"run {run_id} is {status!r} but its thread still runs after {timeout} s")
            return report(run_id)
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} still {status!r} after {timeout} s")
        time.sleep(0.05)


class FakeProvider:
    """A running fake provider that the ``STREAMRECOVER`` settings point at, for one scenario.

    Use as a context manager (the settings are overridden inside it) or through the
    ``streamrecover_fake`` fixture. ``fast`` (default) zeroes the backoff between continuations.
    """

    def __init__(self, server: FakeProviderServer, *, scenario: str | None = None, fast: bool = True) -> None:
        self.server = server
        self.scenario = scenario or f"host-test-{next(_counter)}"
        self.fast = fast
        self._override: override_settings | None = None

    # -- settings ----------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """The project's ``STREAMRECOVER`` with its providers pointed at this fake."""
        conf = dict(getattr(settings, SETTINGS_NAME, {}) or {})
        providers = {**DEFAULT_PROVIDERS, **(conf.get("PROVIDERS") or {})}
        pointed = {}
        for name, entry in providers.items():
            wire = _BUILT_IN.get(str(entry.get("ADAPTER", "")))
            # A custom adapter keeps its settings: the fake may not speak its format.
            pointed[name] = entry if wire is None else self.provider_entry(wire, base=entry)
        pointed.setdefault("fake-openai", self.provider_entry("openai"))
        conf["PROVIDERS"] = pointed
        if self.fast:
            conf.update(FAST)
        return conf

    def provider_entry(self, wire: str = "anthropic", *, base: dict[str, Any] | None = None) -> dict[str, Any]:
        """A ``PROVIDERS`` entry for this fake in ``wire`` format (``anthropic``, ``openai``,
        ``openai-responses``, ``gemini``), keeping ``base``'s other keys (its adapter, extra
        headers, strategy overrides...)."""
        entry = {k: v for k, v in (base or {}).items() if k not in ("API_KEY_ENV", "BASE_URL", "API_KEY")}
        entry.setdefault("ADAPTER", wire)
        entry["EXTRA_HEADERS"] = {**(entry.get("EXTRA_HEADERS") or {}), SCENARIO_HEADER: self.scenario}
        entry["BASE_URL"] = self.server.base_url + _ROUTE_PREFIX.get(wire, "/v1")
        entry["API_KEY"] = "fake-key"
        return entry

    def __enter__(self) -> FakeProvider:
        self._override = override_settings(**{SETTINGS_NAME: self.settings()})
        self._override.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._override is not None:
            self._override.disable()
            self._override = None
        self.server.reset(self.scenario)

    # -- faults and the provider's log --------------------------------------------

    def script(self, *faults: str) -> None:
        """The faults the next provider requests meet, one each (``"cut:bytes=900"``, ``"ok"``,
        or one ``;``-separated string); see ``streamrecover.testing.fake.faults``."""
        parsed = [fault for text in faults for fault in parse_script(text)]
        self.server.set_faults(self.scenario, parsed)

    @property
    def requests(self) -> list[Any]:
        """The provider requests this scenario made, as the fake logged them (``LogEntry``)."""
        return self.server.log_for(self.scenario)

    @property
    def pending_faults(self) -> list[str]:
        return [str(f) for f in self.server.pending_faults(self.scenario)]

    # -- runs ----------------------------------------------------------------------

    def run(self, prompt: str, *, faults: Iterable[str] = (), **options: Any) -> RunReport:
        """Create a run (``lifecycle.create_run``'s options: ``provider``, ``model``, ``thread``,
        ``owner``, ``max_tokens``...), execute it in this process and return its report.

        ``faults`` script the fake first. The ORM work happens in another thread: use
        ``transactional_db`` (pytest-django) or ``TransactionTestCase``."""
        if faults:
            self.script(*faults)
        run = lifecycle.create_run(prompt=prompt, **options)
        collected = CollectingSink()
        asyncio.run(execution.execute_run(str(run.pk), extra_sinks=[collected]))
        return report(run.pk, frames=[dict(frame) for frame in collected.frames])


def assert_recovered(
    report: RunReport,
    *,
    interruptions: int | None = None,
    cause: str | None = None,
    plan: str | None = None,
) -> None:
    """The run completed although its stream broke, and the client shows exactly what was committed.

    ``interruptions``: how many provider streams broke (default: at least one); ``cause``: every
    break had this interrupt cause (``connection_reset``, ``idle_timeout``, ``goaway``...);
    ``plan``: every recovery used this plan (``continue_text``, ``truncate_before_tool``...).
    """
    problems = []
    if report.status != "completed":
        problems.append(f"the run ended {report.status!r}: {report.error}")
    broke = report.interruptions
    if interruptions is None and not broke:
        problems.append("no provider stream broke: nothing was recovered (did the fault trigger?)")
    elif interruptions is not None and len(broke) != interruptions:
        problems.append(f"{len(broke)} provider streams broke ({broke}), not {interruptions}")
    if cause is not None and any(c != cause for c in broke):
        problems.append(f"interrupt causes {broke}, not all {cause!r}")
    plans = [p.get("plan") for p in report.events_named(LLM_STREAM_INTERRUPTED)]
    if plan is not None and any(p != plan for p in plans):
        problems.append(f"recovery plans {plans}, not all {plan!r}")
    if report.status == "completed" and not report.events_named(LLM_STREAM_CONTINUATION_COMPLETED) and broke:
        problems.append("a stream broke but no continuation completed")
    if report.view is not None:
        for shown, committed in report.view.turns:
            if shown != committed:
                problems.append(f"the client shows {shown!r} but {committed!r} was committed")
        if report.view.gaps:
            problems.append(f"the client saw {report.view.gaps} gaps in the frame sequence")
    assert not problems, "not recovered: " + "; ".join(problems)
