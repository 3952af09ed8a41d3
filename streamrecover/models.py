"""The app's models: threads and runs, and what a run leaves behind.

The thread log, each HTTP attempt, the in-flight checkpoint, the append-only recovery events
and the analytics rollup. Index names are explicit so the admin and analytics queries can be
reasoned about (and migrations stay stable)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any, ClassVar, NamedTuple

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, router
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .engine.plan import PlanKind
from .engine.protocol import RunStatus
from .engine.sink import LLM_STREAM_CONTINUATION_COMPLETED, LLM_STREAM_INTERRUPTED, AttemptOutcome
from .fields import TextJSONField
from .querysets import AttemptQuerySet, MessageQuerySet, RecoveryEventQuerySet, RunQuerySet
from .redaction import cut_secrets, redact


class Thread(models.Model):
    """A conversation: the committed messages of every run in it."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("owner"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="streamrecover_threads",
    )
    title = models.CharField(verbose_name=_("title"), max_length=200, blank=True)
    created = models.DateTimeField(verbose_name=_("created"), default=timezone.now)
    # NOTIFY_MODEL_OF_DISCARDED_TOOLS: tool calls cut off in a turn that ended without tools to
    # run ({"id", "name", "reason"}); the thread's next user message carries them, explicitly.
    pending_notices = TextJSONField(
        verbose_name=_("pending notices"), default=list, blank=True, encoder=DjangoJSONEncoder
    )

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["owner", "created"], name="sr_thread_owner_created")]
        verbose_name = _("thread")
        verbose_name_plural = _("threads")

    def __str__(self) -> str:
        return self.title or f"Thread {self.pk}"


class Run(models.Model):
    """One request for an assistant answer (possibly several turns with tools)."""

    class Status(models.TextChoices):
        QUEUED = RunStatus.QUEUED, _("queued")
        RUNNING = RunStatus.RUNNING, _("running")
        RECOVERING = RunStatus.RECOVERING, _("recovering")
        COMPLETED = RunStatus.COMPLETED, _("completed")
        FAILED = RunStatus.FAILED, _("failed")
        EXHAUSTED = RunStatus.EXHAUSTED, _("exhausted")
        CANCELLED = RunStatus.CANCELLED, _("cancelled")

    TERMINAL_STATUSES = frozenset({Status.COMPLETED, Status.FAILED, Status.EXHAUSTED, Status.CANCELLED})
    ACTIVE_STATUSES = frozenset({Status.QUEUED, Status.RUNNING, Status.RECOVERING})
    CLAIMED_STATUSES = frozenset({Status.RUNNING, Status.RECOVERING})  # a worker is on it

    id = models.UUIDField(verbose_name=_("ID"), primary_key=True, default=uuid.uuid4, editable=False)
    thread = models.ForeignKey(Thread, verbose_name=_("thread"), on_delete=models.CASCADE, related_name="runs")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("owner"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="streamrecover_runs",
    )
    status = models.CharField(verbose_name=_("status"), max_length=16, choices=Status.choices, default=Status.QUEUED)
    provider = models.CharField(verbose_name=_("provider"), max_length=64)
    model = models.CharField(verbose_name=_("model"), max_length=200)
    # system, max_tokens, tools, thinking_budget, a proxied client's own fields (proxy.extra) ...
    # as the user wrote them: the run sends them to the model from here (save cuts configured keys).
    options = models.JSONField(verbose_name=_("options"), default=dict, blank=True, encoder=DjangoJSONEncoder)
    cancel_requested = models.BooleanField(verbose_name=_("cancel requested"), default=False)
    cancel_reason = models.CharField(verbose_name=_("cancel reason"), max_length=200, blank=True)
    claims = models.PositiveIntegerField(
        verbose_name=_("claims"), default=0, help_text=_("Times a worker claimed this run.")
    )
    # The fencing token: every claim (and every sweep or re-queue, which revokes a claim) raises
    # it; a worker writes for the run only while the epoch it claimed with is still the run's.
    claim_epoch = models.PositiveBigIntegerField(
        verbose_name=_("claim epoch"), default=0, help_text=_("Raised by every claim; fences out older claims.")
    )
    worker = models.CharField(verbose_name=_("worker"), max_length=255, blank=True)
    heartbeat_at = models.DateTimeField(verbose_name=_("heartbeat at"), null=True, blank=True)
    error_kind = models.CharField(verbose_name=_("error kind"), max_length=64, blank=True)
    error_message = models.TextField(verbose_name=_("error message"), blank=True)
    input_tokens = models.PositiveBigIntegerField(verbose_name=_("input tokens"), default=0)
    output_tokens = models.PositiveBigIntegerField(verbose_name=_("output tokens"), default=0)
    attempt_count = models.PositiveIntegerField(verbose_name=_("attempt count"), default=0)
    continuation_count = models.PositiveIntegerField(verbose_name=_("continuation count"), default=0)
    created = models.DateTimeField(verbose_name=_("created"), default=timezone.now)
    started_at = models.DateTimeField(verbose_name=_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(verbose_name=_("finished at"), null=True, blank=True)
    # True while this run's figures are counted in ``AnalyticsRollup`` (and so nowhere else).
    # Written only by ``streamrecover.analytics.rollup``, with ``update()``: ``save()`` never writes it.
    analytics_folded = models.BooleanField(verbose_name=_("analytics folded"), default=False, editable=False)

    objects = RunQuerySet.as_manager()

    class Meta:
        verbose_name = _("run")
        verbose_name_plural = _("runs")
        ordering = ["-created"]
        indexes = [
            models.Index(fields=["status", "created"], name="sr_run_status_created"),
            models.Index(fields=["provider", "model", "created"], name="sr_run_provider_model_created"),
            models.Index(fields=["status", "heartbeat_at"], name="sr_run_status_heartbeat"),
            models.Index(fields=["owner", "created"], name="sr_run_owner_created"),
            # The analytics cohort (runs created in a window) with what it groups and joins on.
            models.Index(fields=["created", "provider", "model", "status", "id"], name="sr_run_cohort"),
            # The runs analytics still reads row by row: going, or settled but not yet folded.
            models.Index(fields=["created"], condition=models.Q(analytics_folded=False), name="sr_run_unfolded"),
        ]

    def __str__(self) -> str:
        return f"Run {self.pk} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Options and the error are shown on pages: keep the app's secrets out of them.

        The error is the app's own text: scrubbed by key, value and pattern. Options hold what
        the user wrote (the system prompt, tools, a proxied client's own fields such as an MCP
        server's ``authorization_token``), sent to the model as stored: only the configured API
        keys are cut, never a value for its key's name or its shape (the model would get
        ``[redacted]`` instead of the client's credential).
        """
        self.options = cut_secrets(self.options)
        self.error_message = redact(self.error_message)
        if not self._state.adding and kwargs.get("update_fields") is None and not kwargs.get("force_insert"):
            # An instance read before a fold must not write the flag back: the run would then be
            # counted twice (rolled up and row by row). Only the rollup writes it.
            kwargs["update_fields"] = [
                f.name for f in self._meta.concrete_fields if not f.primary_key and f.name != "analytics_folded"
            ]
        super().save(*args, **kwargs)

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL_STATUSES


class _FailedManager(models.Manager.from_queryset(RunQuerySet)):  # type: ignore[misc]
    def get_queryset(self) -> RunQuerySet:
        return super().get_queryset().failed()


class _ExhaustedManager(models.Manager.from_queryset(RunQuerySet)):  # type: ignore[misc]
    def get_queryset(self) -> RunQuerySet:
        return super().get_queryset().exhausted()


class _RecoveredManager(models.Manager.from_queryset(RunQuerySet)):  # type: ignore[misc]
    def get_queryset(self) -> RunQuerySet:
        return super().get_queryset().recovered()


class FailedRun(Run):
    """Admin shortcut: runs that failed with an error."""

    objects: ClassVar[_FailedManager] = _FailedManager()

    class Meta:
        proxy = True
        verbose_name = _("failed run")


class ExhaustedRun(Run):
    """Admin shortcut: runs whose continuation budget ran out."""

    objects: ClassVar[_ExhaustedManager] = _ExhaustedManager()

    class Meta:
        proxy = True
        verbose_name = _("exhausted run")


class RecoveredRun(Run):
    """Admin shortcut: runs saved by at least one completed continuation."""

    objects: ClassVar[_RecoveredManager] = _RecoveredManager()

    class Meta:
        proxy = True
        verbose_name = _("recovered run")


class RecoveryAnalytics(Run):
    """Not a list: the admin app list's link to the analytics page (its admin redirects there)."""

    class Meta:
        proxy = True
        verbose_name = _("recovery analytics")
        verbose_name_plural = _("recovery analytics")


class Message(models.Model):
    """A committed message of the thread log; written once, when its turn commits."""

    class Role(models.TextChoices):
        USER = "user", _("user")
        ASSISTANT = "assistant", _("assistant")
        SYSTEM = "system", _("system")

    thread = models.ForeignKey(Thread, verbose_name=_("thread"), on_delete=models.CASCADE, related_name="messages")
    run = models.ForeignKey(
        Run, verbose_name=_("run"), null=True, blank=True, on_delete=models.SET_NULL, related_name="messages"
    )
    position = models.PositiveIntegerField(verbose_name=_("position"))
    role = models.CharField(verbose_name=_("role"), max_length=16, choices=Role.choices)
    content = TextJSONField(
        verbose_name=_("content"), default=list, encoder=DjangoJSONEncoder, help_text=_("Canonical content blocks.")
    )
    created = models.DateTimeField(verbose_name=_("created"), default=timezone.now)

    objects = MessageQuerySet.as_manager()

    class Meta:
        verbose_name = _("message")
        verbose_name_plural = _("messages")
        ordering = ["thread", "position"]
        constraints = [
            models.UniqueConstraint(fields=["thread", "position"], name="sr_message_thread_pos_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.role} #{self.position}"

    def as_canonical(self) -> dict[str, Any]:
        """The ``{"role", "content"}`` shape the engine works with."""
        return {"role": self.role, "content": self.content}


class Attempt(models.Model):
    """One HTTP call to the provider."""

    class Kind(models.TextChoices):
        INITIAL = "initial", _("initial")
        PRE_STREAM_RETRY = "pre_stream_retry", _("pre-stream retry")
        CONTINUATION = "continuation", _("continuation")
        RESTART = "restart", _("restart")
        RESUME = "resume", _("resume")
        NATIVE_RESUME = "native_resume", _("native resume")

    run = models.ForeignKey(Run, verbose_name=_("run"), on_delete=models.CASCADE, related_name="attempts")
    turn = models.PositiveIntegerField(verbose_name=_("turn"), default=0)
    index = models.PositiveIntegerField(verbose_name=_("index"), help_text=_("0-based across the run."))
    kind = models.CharField(verbose_name=_("kind"), max_length=20, choices=Kind.choices)
    continuation = models.PositiveIntegerField(verbose_name=_("continuation"), default=0)
    strategy = models.CharField(verbose_name=_("strategy"), max_length=32, blank=True)
    status_code = models.PositiveSmallIntegerField(verbose_name=_("status code"), null=True, blank=True)
    provider_request_id = models.CharField(verbose_name=_("provider request id"), max_length=255, blank=True)
    started_at = models.DateTimeField(verbose_name=_("started at"), default=timezone.now)
    first_byte_at = models.DateTimeField(verbose_name=_("first byte at"), null=True, blank=True)
    ended_at = models.DateTimeField(verbose_name=_("ended at"), null=True, blank=True)
    input_tokens = models.PositiveIntegerField(verbose_name=_("input tokens"), null=True, blank=True)
    output_tokens = models.PositiveIntegerField(verbose_name=_("output tokens"), null=True, blank=True)
    cache_creation_input_tokens = models.PositiveIntegerField(
        verbose_name=_("cache creation input tokens"), null=True, blank=True
    )
    cache_read_input_tokens = models.PositiveIntegerField(
        verbose_name=_("cache read input tokens"), null=True, blank=True
    )
    reasoning_tokens = models.PositiveIntegerField(
        verbose_name=_("reasoning tokens"),
        null=True,
        blank=True,
        help_text=_("The part of the output tokens spent thinking, where the provider reports it."),
    )
    usage_estimated = models.BooleanField(
        verbose_name=_("usage estimated"),
        default=False,
        help_text=_(
            "The stream broke before the provider reported its final usage: the tokens are the engine's "
            "estimate of what was billed."
        ),
    )
    bytes_received = models.PositiveBigIntegerField(verbose_name=_("bytes received"), default=0)
    interrupt_cause = models.CharField(verbose_name=_("interrupt cause"), max_length=32, blank=True)
    error_kind = models.CharField(verbose_name=_("error kind"), max_length=64, blank=True)
    error_message = models.TextField(verbose_name=_("error message"), blank=True)
    stop_reason = models.CharField(verbose_name=_("stop reason"), max_length=64, blank=True)
    outcome = models.CharField(verbose_name=_("outcome"), max_length=32, default=AttemptOutcome.PENDING)
    request = TextJSONField(
        verbose_name=_("request"),
        default=dict,
        blank=True,
        encoder=DjangoJSONEncoder,
        help_text=_("As sent, secrets removed."),
    )

    objects = AttemptQuerySet.as_manager()

    class Meta:
        verbose_name = _("attempt")
        verbose_name_plural = _("attempts")
        ordering = ["run", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="sr_attempt_run_index_uniq"),
        ]
        indexes = [
            models.Index(fields=["interrupt_cause", "started_at"], name="sr_attempt_cause_started"),
            models.Index(fields=["kind", "started_at"], name="sr_attempt_kind_started"),
            # The admin's search by provider request id.
            models.Index(fields=["provider_request_id"], name="sr_attempt_request_id"),
            # Analytics: a window's attempts with what it sums, without reading the stored requests.
            models.Index(
                fields=["started_at", "run", "kind", "outcome", "input_tokens", "output_tokens"],
                name="sr_attempt_analytics",
            ),
        ]

    def __str__(self) -> str:
        return f"Attempt {self.index} ({self.kind})"


class ToolCallResult(models.Model):
    """The result of one tool call a run executed, stored before the run goes on.

    Keyed by the run, the position of the assistant message that made the call and the call's
    id (providers may reuse a call id in a later turn): a resumed run finds it here and never
    executes the call again.
    """

    run = models.ForeignKey(Run, verbose_name=_("run"), on_delete=models.CASCADE, related_name="tool_results")
    position = models.PositiveIntegerField(
        verbose_name=_("position"), help_text=_("Of the assistant message that made the call.")
    )
    tool_call_id = models.CharField(verbose_name=_("tool call id"), max_length=255)
    result = models.JSONField(verbose_name=_("result"), encoder=DjangoJSONEncoder, help_text=_("A tool_result block."))
    created = models.DateTimeField(verbose_name=_("created"), default=timezone.now)

    class Meta:
        verbose_name = _("tool call result")
        verbose_name_plural = _("tool call results")
        ordering = ["run", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position", "tool_call_id"], name="sr_toolresult_call_uniq"),
        ]

    def __str__(self) -> str:
        return f"Result of {self.tool_call_id}"


class StreamCheckpoint(models.Model):
    """The in-flight state of a run, one row per run (``DjangoCheckpointStore``).

    ``data`` is the whole engine ``Checkpoint``; the columns beside it are for the admin
    and for purging old rows.
    """

    run = models.OneToOneField(
        Run, verbose_name=_("run"), on_delete=models.CASCADE, primary_key=True, related_name="checkpoint"
    )
    data = TextJSONField(verbose_name=_("data"), encoder=DjangoJSONEncoder)
    turn = models.PositiveIntegerField(verbose_name=_("turn"), default=0)
    attempt = models.PositiveIntegerField(verbose_name=_("attempt"), default=0)
    continuation = models.PositiveIntegerField(verbose_name=_("continuation"), default=0)
    seq = models.PositiveBigIntegerField(verbose_name=_("seq"), default=0)
    updated_at = models.DateTimeField(verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("stream checkpoint")
        verbose_name_plural = _("stream checkpoints")
        indexes = [models.Index(fields=["updated_at"], name="sr_checkpoint_updated")]

    def __str__(self) -> str:
        return f"Checkpoint of {self.run_id} (seq {self.seq})"


class RecoveryEvent(models.Model):
    """A structured event (see ``engine.sink``), append-only; ``payload`` holds the log line's fields.

    The columns after ``created`` exist for analytics over millions of rows, which then
    aggregates indexed columns instead of parsing JSON or correlating events row by row:

    - copied from the payload: ``cause``, ``plan``, ``continuation`` (continuation_attempt),
      ``kept_tokens`` (kept_output_tokens_estimate), ``discarded_bytes`` (partial_input_bytes
      or partial_bytes);
    - derived from the run's earlier events when the row is written: ``first_in_run`` (no
      earlier event of this name in the run), and on a ``llm_stream_continuation_completed``
      row the facts of its turn's interruptions: ``first_break_at``, ``salvaged_tokens`` (the
      last one's kept estimate) and ``saved_tokens`` (the sum of the kept estimates of those
      not recovered by ``whole_restart``). Events are append-only, so these never go stale.

    ``save()`` fills them all; ``from_payload`` does the same for ``bulk_create``.
    """

    run = models.ForeignKey(Run, verbose_name=_("run"), on_delete=models.CASCADE, related_name="events")
    attempt = models.PositiveIntegerField(verbose_name=_("attempt"), null=True, blank=True)
    turn = models.PositiveIntegerField(verbose_name=_("turn"), null=True, blank=True)
    name = models.CharField(verbose_name=_("name"), max_length=64)
    provider = models.CharField(verbose_name=_("provider"), max_length=64, blank=True)
    model = models.CharField(verbose_name=_("model"), max_length=200, blank=True)
    payload = TextJSONField(verbose_name=_("payload"), default=dict, encoder=DjangoJSONEncoder)
    created = models.DateTimeField(verbose_name=_("created"), default=timezone.now)
    cause = models.CharField(verbose_name=_("cause"), max_length=32, blank=True)
    plan = models.CharField(verbose_name=_("plan"), max_length=32, blank=True)
    continuation = models.PositiveIntegerField(verbose_name=_("continuation"), null=True, blank=True)
    kept_tokens = models.PositiveIntegerField(verbose_name=_("kept tokens"), null=True, blank=True)
    discarded_bytes = models.PositiveIntegerField(verbose_name=_("discarded bytes"), null=True, blank=True)
    first_in_run = models.BooleanField(verbose_name=_("first in run"), default=False)
    first_break_at = models.DateTimeField(verbose_name=_("first break at"), null=True, blank=True)
    salvaged_tokens = models.PositiveIntegerField(verbose_name=_("salvaged tokens"), null=True, blank=True)
    saved_tokens = models.PositiveIntegerField(verbose_name=_("saved tokens"), null=True, blank=True)

    objects = RecoveryEventQuerySet.as_manager()

    class Meta:
        verbose_name = _("recovery event")
        verbose_name_plural = _("recovery events")
        ordering = ["created", "id"]
        indexes = [
            models.Index(fields=["name", "created"], name="sr_event_name_created"),
            models.Index(fields=["provider", "model", "created"], name="sr_event_prov_model_created"),
            models.Index(fields=["run", "created"], name="sr_event_run_created"),
            # Analytics reads events by time and joins them to their run: every column it needs is
            # in this index, so PostgreSQL answers from it alone (an index-only scan), never
            # from the wide rows with their JSON payloads.
            models.Index(
                fields=[
                    "created",
                    "run",
                    "name",
                    "first_in_run",
                    "cause",
                    "plan",
                    "continuation",
                    "discarded_bytes",
                    "saved_tokens",
                    "salvaged_tokens",
                    "first_break_at",
                ],
                name="sr_event_analytics",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ValueError("RecoveryEvent rows are append-only.")
        self.fill_columns()
        if self.run_id is not None:
            using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
            earlier = type(self)._base_manager.using(using).filter(run_id=self.run_id)
            self.fill_from_history(earlier.values_list(*EarlierEvent._fields))
        super().save(*args, **kwargs)

    @classmethod
    def from_payload(
        cls,
        *,
        run_id: Any,
        name: str,
        payload: dict[str, Any],
        earlier: Iterable[tuple[Any, ...]] = (),
        **fields: Any,
    ) -> RecoveryEvent:
        """An unsaved row with its columns filled, for ``bulk_create`` (which skips ``save``).

        ``earlier`` holds the run's events written before this one, as ``EarlierEvent`` tuples.
        """
        event = cls(run_id=run_id, name=name, payload=payload, **fields)
        event.fill_columns()
        event.fill_from_history(earlier)
        return event

    def as_earlier(self) -> EarlierEvent:
        """This row as the ``earlier`` entry of the run's next event."""
        return EarlierEvent(self.name, self.turn, self.created, self.kept_tokens, self.plan)

    def fill_columns(self) -> None:
        """Copy the payload fields analytics aggregates into columns; explicit values win."""
        for field, value in payload_columns(self.payload).items():
            if getattr(self, field) in (None, ""):
                setattr(self, field, value)

    def fill_from_history(self, earlier: Iterable[tuple[Any, ...]]) -> None:
        """The columns that depend on the run's earlier events (see the class docstring)."""
        for field, value in history_columns(self.name, self.turn, earlier).items():
            setattr(self, field, value)


class EarlierEvent(NamedTuple):
    """What a new event needs to know about one of its run's earlier events."""

    name: str
    turn: int | None
    created: datetime
    kept_tokens: int | None
    plan: str


PAYLOAD_COLUMNS = ("turn", "attempt", "cause", "plan", "continuation", "kept_tokens", "discarded_bytes")
HISTORY_COLUMNS = ("first_in_run", "first_break_at", "salvaged_tokens", "saved_tokens")


def payload_columns(payload: Any) -> dict[str, Any]:
    """The ``PAYLOAD_COLUMNS`` of an event, read from its payload (pure)."""
    payload = payload if isinstance(payload, dict) else {}
    return {
        "turn": _turn_number(payload.get("turn_id", payload.get("turn"))),
        "attempt": _count(payload.get("attempt")),
        "cause": str(payload.get("cause") or "")[:32],
        "plan": str(payload.get("plan") or "")[:32],
        "continuation": _count(payload.get("continuation_attempt")),
        "kept_tokens": _count(payload.get("kept_output_tokens_estimate")),
        "discarded_bytes": _count(payload.get("partial_input_bytes", payload.get("partial_bytes"))),
    }


def history_columns(name: str, turn: int | None, earlier: Iterable[tuple[Any, ...]]) -> dict[str, Any]:
    """The ``HISTORY_COLUMNS`` of an event, from its run's earlier events (pure, like the above)."""
    rows = [EarlierEvent(*row) for row in earlier]
    columns: dict[str, Any] = {
        "first_in_run": all(row.name != name for row in rows),
        "first_break_at": None,
        "salvaged_tokens": None,
        "saved_tokens": None,
    }
    if name != LLM_STREAM_CONTINUATION_COMPLETED or turn is None:
        return columns
    breaks = sorted(
        (row for row in rows if row.name == LLM_STREAM_INTERRUPTED and row.turn == turn),
        key=lambda row: row.created,
    )
    if breaks:
        columns["first_break_at"] = breaks[0].created
        columns["salvaged_tokens"] = breaks[-1].kept_tokens
        columns["saved_tokens"] = sum(row.kept_tokens or 0 for row in breaks if row.plan != PlanKind.WHOLE_RESTART)
    return columns


def _count(value: Any) -> int | None:
    """A non-negative int from a payload field, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _turn_number(value: Any) -> int | None:
    """``turn_id`` is ``"<run_id>:<turn>"`` in the engine's events; a bare int is accepted too."""
    if isinstance(value, str):
        _, _, tail = value.rpartition(":")
        return int(tail) if tail.isdigit() else None
    return _count(value)


class AnalyticsRollup(models.Model):
    """The analytics figures of the settled runs created in one 15-minute slot, per provider/model.

    Maintained on write by ``streamrecover.analytics.rollup``: a run is *folded* in (its counts added,
    ``Run.analytics_folded`` set, in one transaction) once it is terminal, and folded out
    again if it is re-queued. Reports add these rows to what they read row by row (the runs
    not folded, and the partial slots at a window's edges), so they read a few thousand rows
    for 90 days whatever the number of events. A slot is 15 minutes so that every time zone's
    hours and days (UTC+05:30, +05:45 ...) are whole slots. The counters are the additive
    figures of ``streamrecover.analytics`` (see ``analytics.definitions.ROLLUP_COUNTERS``);
    ``recover_seconds`` keeps every recovery's duration so that percentiles stay exact.
    """

    slot = models.DateTimeField(
        verbose_name=_("slot"), help_text=_("Start (UTC) of the 15 minutes its runs were created in.")
    )
    provider = models.CharField(verbose_name=_("provider"), max_length=64)
    model = models.CharField(verbose_name=_("model"), max_length=200)
    runs = models.BigIntegerField(verbose_name=_("runs"), default=0)
    attempts = models.BigIntegerField(verbose_name=_("attempts"), default=0)
    pre_stream_retries = models.BigIntegerField(verbose_name=_("pre stream retries"), default=0)
    interrupted_runs = models.BigIntegerField(verbose_name=_("interrupted runs"), default=0)
    interruptions = models.BigIntegerField(verbose_name=_("interruptions"), default=0)
    recovered_runs = models.BigIntegerField(verbose_name=_("recovered runs"), default=0)
    exhausted_runs = models.BigIntegerField(verbose_name=_("exhausted runs"), default=0)
    failed_runs = models.BigIntegerField(verbose_name=_("failed runs"), default=0)
    recoveries = models.BigIntegerField(verbose_name=_("recoveries"), default=0)
    continuations_in_recovered = models.BigIntegerField(verbose_name=_("continuations in recovered"), default=0)
    discarded_tool_uses = models.BigIntegerField(verbose_name=_("discarded tool uses"), default=0)
    discarded_tool_bytes = models.BigIntegerField(verbose_name=_("discarded tool bytes"), default=0)
    discarded_thinking_blocks = models.BigIntegerField(verbose_name=_("discarded thinking blocks"), default=0)
    discarded_thinking_bytes = models.BigIntegerField(verbose_name=_("discarded thinking bytes"), default=0)
    output_tokens_billed = models.BigIntegerField(verbose_name=_("output tokens billed"), default=0)
    completed_output_tokens = models.BigIntegerField(verbose_name=_("completed output tokens"), default=0)
    kept_tokens_delivered = models.BigIntegerField(verbose_name=_("kept tokens delivered"), default=0)
    tokens_saved = models.BigIntegerField(verbose_name=_("tokens saved"), default=0)
    continuation_input_tokens = models.BigIntegerField(verbose_name=_("continuation input tokens"), default=0)
    cause_connection_reset = models.BigIntegerField(verbose_name=_("cause connection reset"), default=0)
    cause_idle_stall = models.BigIntegerField(verbose_name=_("cause idle stall"), default=0)
    cause_goaway = models.BigIntegerField(verbose_name=_("cause goaway"), default=0)
    cause_provider_error_mid_stream = models.BigIntegerField(
        verbose_name=_("cause provider error mid stream"), default=0
    )
    cause_sse_parse = models.BigIntegerField(verbose_name=_("cause sse parse"), default=0)
    cause_body_decode = models.BigIntegerField(verbose_name=_("cause body decode"), default=0)
    cause_stream_deadline = models.BigIntegerField(verbose_name=_("cause stream deadline"), default=0)
    cause_max_tokens_exceeded = models.BigIntegerField(verbose_name=_("cause max tokens exceeded"), default=0)
    cause_unknown = models.BigIntegerField(verbose_name=_("cause unknown"), default=0)
    cause_other = models.BigIntegerField(verbose_name=_("cause other"), default=0)
    plan_continue_text = models.BigIntegerField(verbose_name=_("plan continue text"), default=0)
    plan_synthesize_tool_use = models.BigIntegerField(verbose_name=_("plan synthesize tool use"), default=0)
    plan_truncate_before_tool = models.BigIntegerField(verbose_name=_("plan truncate before tool"), default=0)
    plan_whole_restart = models.BigIntegerField(verbose_name=_("plan whole restart"), default=0)
    plan_native_resume = models.BigIntegerField(verbose_name=_("plan native resume"), default=0)
    plan_other = models.BigIntegerField(verbose_name=_("plan other"), default=0)
    recover_seconds = models.JSONField(
        verbose_name=_("recover seconds"),
        default=list,
        blank=True,
        help_text=_("Time to recover of every recovery, in seconds."),
    )

    class Meta:
        ordering = ["-slot", "provider", "model"]
        constraints = [
            models.UniqueConstraint(fields=["slot", "provider", "model"], name="sr_rollup_slot_group_uniq"),
        ]
        verbose_name = _("analytics rollup")
        verbose_name_plural = _("analytics rollups")

    def __str__(self) -> str:
        return f"{self.provider}/{self.model} @ {self.slot:%Y-%m-%d %H:%M}"


class ProxyKey(models.Model):
    """A key the healing endpoint (``streamrecover.proxy``) accepts: one user's, revocable.

    Only the key's SHA-256 is stored (a key is 256 random bits: a fast hash is enough), with
    its first characters to tell keys apart; the raw key is shown once, when it is issued.
    The limits are per key: models it may ask for, its ``max_tokens`` and its concurrent streams.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, verbose_name=_("user"), on_delete=models.CASCADE, related_name="proxy_keys"
    )
    name = models.CharField(verbose_name=_("name"), max_length=100, blank=True)
    prefix = models.CharField(verbose_name=_("prefix"), max_length=16, help_text=_("The key's first characters."))
    hashed = models.CharField(verbose_name=_("hashed key"), max_length=64, unique=True, editable=False)
    allowed_models = models.JSONField(
        verbose_name=_("allowed models"),
        default=list,
        blank=True,
        help_text=_("Model names (shell-style patterns allowed) this key may use; empty: any."),
    )
    max_tokens = models.PositiveIntegerField(
        verbose_name=_("max tokens"), null=True, blank=True, help_text=_("The largest max_tokens a request may ask.")
    )
    max_concurrent = models.PositiveIntegerField(
        verbose_name=_("max concurrent streams"), null=True, blank=True, help_text=_("Empty: no limit.")
    )
    created = models.DateTimeField(verbose_name=_("created"), default=timezone.now)
    last_used_at = models.DateTimeField(verbose_name=_("last used at"), null=True, blank=True)
    revoked_at = models.DateTimeField(verbose_name=_("revoked at"), null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        verbose_name = _("proxy key")
        verbose_name_plural = _("proxy keys")

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None
