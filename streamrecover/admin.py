"""The admin: every model browsable, nothing editable (django-q2 style).

Runs, attempts, messages and events are recorded facts: no add, no change, no delete here.
What an operator may do to a run is an action that goes through ``streamrecover.dispatch``
and ``runs.lifecycle`` (re-queue a failed run, cancel a running one). Proxy models give one-click lists of failed,
exhausted and recovered runs, and "Recovery analytics" in the app list opens the analytics page.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from django.contrib import admin, messages
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import NoReverseMatch, reverse
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.timezone import localtime
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import dispatch
from .engine.errors import InterruptCause
from .engine.plan import PlanKind
from .engine.sink import EVENT_NAMES, LLM_STREAM_INTERRUPTED
from .models import (
    AnalyticsRollup,
    Attempt,
    ExhaustedRun,
    FailedRun,
    Message,
    ProxyKey,
    RecoveredRun,
    RecoveryAnalytics,
    RecoveryEvent,
    Run,
    StreamCheckpoint,
    Thread,
)
from .querysets import has_model_permission
from .runs import lifecycle

JSON_STYLE = "white-space: pre-wrap; word-break: break-word; margin: 0; max-width: 70rem; font-size: 12px"


def pretty_json(value: Any) -> str:
    """A JSON value indented in a ``<pre>``, escaped by ``format_html``."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)
    return format_html('<pre class="sr-json" style="{}">{}</pre>', JSON_STYLE, text)


def _short_json(value: Any, limit: int = 90) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _runs_matching(term: str) -> list[uuid.UUID]:
    """Runs whose id is ``term``, or with an attempt whose provider request id is ``term``.

    Two indexed lookups (the primary key, ``sr_attempt_request_id``) instead of one query
    with an ``OR`` that would scan every run.
    """
    ids = list(Attempt.objects.filter(provider_request_id=term).values_list("run_id", flat=True)[:100])
    run_id = _uuid(term)
    return [run_id, *ids] if run_id else ids


def _uuid(term: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(term.strip())
    except ValueError:
        return None


class RunIdSearchMixin(admin.ModelAdmin):
    """Search rows of one run by its id: an exact, indexed lookup; anything else finds nothing."""

    search_help_text = _("A run id.")
    search_fields = ("run__id",)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        run_id = _uuid(term)
        return (queryset.filter(run_id=run_id) if run_id else queryset.none()), False


class ReadOnlyAdminMixin:
    """View only: the admin never adds, changes or deletes recorded facts."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(ReadOnlyAdminMixin, admin.TabularInline):
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True


class ReadOnlyStackedInline(ReadOnlyAdminMixin, admin.StackedInline):
    """One block per row: for rows with a value too wide for a table's column."""

    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True


# ---- filters --------------------------------------------------------------------------------


def _values_filter(title: Any, field: str, values: tuple[str, ...]) -> type[admin.SimpleListFilter]:
    """A filter on a column whose values are known: no ``SELECT DISTINCT`` over a big table."""

    class ValuesFilter(admin.SimpleListFilter):
        parameter_name = field

        def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
            return [(value, value) for value in values]

        def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
            return queryset.filter(**{field: self.value()}) if self.value() is not None else queryset

    ValuesFilter.title = title
    ValuesFilter.__name__ = f"{field.title().replace('_', '')}Filter"
    return ValuesFilter


CAUSES = tuple(c.value for c in InterruptCause)
PLANS = tuple(p.value for p in PlanKind)


class _InterruptedWithFilter(admin.SimpleListFilter):
    """Runs with an ``llm_stream_interrupted`` event whose ``field`` has the chosen value."""

    field = ""
    values: tuple[str, ...] = ()

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(value, value) for value in self.values]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() is None:
            return queryset
        events = RecoveryEvent.objects.filter(run=OuterRef("pk"), name=LLM_STREAM_INTERRUPTED)
        return queryset.filter(Exists(events.filter(**{self.field: self.value()})))


class InterruptCauseFilter(_InterruptedWithFilter):
    title = _("interrupt cause")
    parameter_name = "cause"
    field = "cause"
    values = CAUSES


class RecoveryPlanFilter(_InterruptedWithFilter):
    title = _("recovery plan")
    parameter_name = "plan"
    field = "plan"
    values = PLANS


# ---- runs -------------------------------------------------------------------------------------


class MessageInline(ReadOnlyInline):
    model = Message
    fk_name = "run"
    fields = ("position", "role", "content_pretty", "created")
    readonly_fields = fields
    ordering = ("position",)

    @admin.display(description=_("content"))
    def content_pretty(self, obj: Message) -> str:
        return pretty_json(obj.content)


class AttemptInline(ReadOnlyInline):
    model = Attempt
    fields = (
        "index",
        "turn",
        "kind",
        "continuation",
        "strategy",
        "status_code",
        "provider_request_id",
        "started_at",
        "ended_at",
        "input_tokens",
        "output_tokens",
        "usage_estimated",
        "interrupt_cause",
        "outcome",
    )
    readonly_fields = fields
    ordering = ("index",)


class RecoveryEventInline(ReadOnlyStackedInline):
    # Stacked: beside six columns in a table the payload's column shrank to a few characters a
    # line (a page thousands of pixels long); here the six share a line and the payload has the width.
    model = RecoveryEvent
    fields = (("created", "name", "attempt", "turn", "cause", "plan"), "payload_pretty")
    readonly_fields = ("created", "name", "attempt", "turn", "cause", "plan", "payload_pretty")
    ordering = ("created", "id")

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: RecoveryEvent) -> str:
        return pretty_json(obj.payload)


@admin.register(Run)
class RunAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    # Seven narrow columns: beside the admin's navigation and the filters, a 1280 px screen leaves
    # the table about 630 px (tests/test_browser_admin.py measures it in Chromium).
    list_display = ("short_id", "status", "model_and_provider", "attempts", "tokens", "error")
    list_filter = (
        "status",
        "provider",
        "model",
        InterruptCauseFilter,
        RecoveryPlanFilter,
        ("created", admin.DateFieldListFilter),
    )
    search_help_text = _("A run id, or a provider request id of one of its attempts.")
    search_fields = ("id",)  # the search box; get_search_results does the looking
    ordering = ("-created",)
    show_full_result_count = False
    inlines = (MessageInline, AttemptInline, RecoveryEventInline)

    class Media:
        css = {"all": ("streamrecover/admin.css",)}  # the attempts table's width at 1280 px

    actions = ("requeue_failed_runs", "cancel_running_runs")
    fieldsets = (
        (None, {"fields": ("id", "status", "provider", "model", "thread", "owner")}),
        (_("Times"), {"fields": ("created", "started_at", "finished_at", "heartbeat_at")}),
        (_("Worker"), {"fields": ("worker", "claims", "cancel_requested", "cancel_reason")}),
        (_("Totals"), {"fields": ("attempt_count", "continuation_count", "input_tokens", "output_tokens")}),
        (_("Error"), {"fields": ("error_kind", "error_message")}),
        (_("Options"), {"fields": ("options_pretty",)}),
    )
    readonly_fields = ("options_pretty",)
    list_display_links = ("short_id",)

    @admin.display(description=_("run"), ordering="created")
    def short_id(self, obj: Run) -> str:
        """The id's first 8 characters, the whole id on hover (a UUID in full wraps over four
        lines), and when the run was created below it. The link opens the run."""
        return format_html(
            '<code title="{}" style="white-space: nowrap">{}…</code><br><small>{}</small>',
            obj.pk,
            str(obj.pk)[:8],
            date_format(localtime(obj.created), "SHORT_DATETIME_FORMAT"),
        )

    @admin.display(description=_("model"), ordering="model")
    def model_and_provider(self, obj: Run) -> str:
        return format_html("{}<br><small>{}</small>", _breakable(obj.model), _breakable(obj.provider))

    @admin.display(description=_("attempts"), ordering="attempt_count")
    def attempts(self, obj: Run) -> str:
        if not obj.continuation_count:
            return str(obj.attempt_count)
        return format_html(
            "{}<br><small>{}</small>",
            obj.attempt_count,
            ngettext("%(n)d continuation", "%(n)d continuations", obj.continuation_count)
            % {"n": obj.continuation_count},
        )

    @admin.display(description=_("tokens"), ordering="output_tokens")
    def tokens(self, obj: Run) -> str:
        return format_html(
            '<span title="{}">{}&nbsp;{}<br>{}&nbsp;{}</span>',
            _("input / output tokens"),
            _("in"),
            _compact(obj.input_tokens),
            _("out"),
            _compact(obj.output_tokens),
        )

    @admin.display(description=_("error"), ordering="error_kind")
    def error(self, obj: Run) -> str:
        return _breakable(obj.error_kind)

    @admin.display(description=_("options"))
    def options_pretty(self, obj: Run) -> str:
        return pretty_json(obj.options)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        """A whole run id, or an attempt's provider request id; never a scan of the JSON."""
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(pk__in=_runs_matching(term)), False

    # ---- actions: through dispatch and runs.lifecycle, which own the rules ----

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Re-queue and cancel need the right to change runs (the admin still edits nothing)."""
        return has_model_permission(request.user, "change", Run._meta)

    @admin.action(description=_("Re-queue failed runs"), permissions=["operate"])
    def requeue_failed_runs(self, request: HttpRequest, queryset: QuerySet) -> None:
        failed = queryset.filter(status__in=(Run.Status.FAILED, Run.Status.EXHAUSTED))
        done = sum(1 for run_id in failed.values_list("pk", flat=True) if dispatch.requeue_run(run_id))
        text = ngettext("Re-queued %(count)d run.", "Re-queued %(count)d runs.", done) % {"count": done}
        self._report(request, text, done, queryset.count())

    @admin.action(description=_("Cancel running runs"), permissions=["operate"])
    def cancel_running_runs(self, request: HttpRequest, queryset: QuerySet) -> None:
        reason = f"cancelled in the admin by {request.user.get_username()}"  # recorded, not shown: not translated
        running = queryset.filter(status__in=Run.ACTIVE_STATUSES)
        done = sum(1 for run_id in running.values_list("pk", flat=True) if lifecycle.request_cancel(run_id, reason))
        text = ngettext("Cancel requested for %(count)d run.", "Cancel requested for %(count)d runs.", done) % {
            "count": done
        }
        self._report(request, text, done, queryset.count())

    def _report(self, request: HttpRequest, done_text: str, done: int, selected: int) -> None:
        skipped = selected - done
        text = done_text
        if skipped:
            text += " " + ngettext(
                "%(count)d skipped (not in a state that allows it).",
                "%(count)d skipped (not in a state that allows it).",
                skipped,
            ) % {"count": skipped}
        self.message_user(request, text, messages.SUCCESS if done else messages.WARNING)


@admin.register(FailedRun)
class FailedRunAdmin(RunAdmin):
    """Runs that failed with an error."""


@admin.register(ExhaustedRun)
class ExhaustedRunAdmin(RunAdmin):
    """Runs whose continuation budget ran out."""


@admin.register(RecoveredRun)
class RecoveredRunAdmin(RunAdmin):
    """Runs with at least one completed continuation."""


@admin.register(RecoveryAnalytics)
class RecoveryAnalyticsAdmin(admin.ModelAdmin):
    """Not a list: the app list's entry that opens the analytics page (staff only, like the page).

    Shown only where the host project includes ``streamrecover.analytics.urls``.
    """

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff and _analytics_url() is not None

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return HttpResponseRedirect(reverse("streamrecover_analytics:page"))


def _analytics_url() -> str | None:
    """The analytics page's URL, or None when the host project does not include it."""
    try:
        return reverse("streamrecover_analytics:page")
    except NoReverseMatch:
        return None


# ---- the other models -------------------------------------------------------------------------


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "run",
        "index",
        "kind",
        "continuation",
        "status_code",
        "outcome",
        "interrupt_cause",
        "input_tokens",
        "output_tokens",
        "started_at",
    )
    list_filter = (
        "kind",
        "outcome",
        _values_filter(_("interrupt cause"), "interrupt_cause", CAUSES),
        "run__provider",
        "run__model",
        ("started_at", admin.DateFieldListFilter),
    )
    search_help_text = _("A run id or a provider request id.")
    search_fields = ("provider_request_id",)
    ordering = ("-id",)
    show_full_result_count = False
    readonly_fields = ("request_pretty",)
    exclude = ("request",)

    @admin.display(description=_("request (as sent, secrets removed)"))
    def request_pretty(self, obj: Attempt) -> str:
        return pretty_json(obj.request)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        run_id = _uuid(term) if term else None
        if run_id:
            return queryset.filter(run_id=run_id), False
        return queryset.filter(provider_request_id=term) if term else queryset, False


@admin.register(RecoveryEvent)
class RecoveryEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "created", "name", "run", "provider", "model", "cause", "plan", "payload_short")
    list_filter = (
        _values_filter(_("name"), "name", EVENT_NAMES),
        _values_filter(_("interrupt cause"), "cause", CAUSES),
        _values_filter(_("recovery plan"), "plan", PLANS),
        "provider",
        "model",
        ("created", admin.DateFieldListFilter),
    )
    search_help_text = _("A run id, or a provider request id of one of the run's attempts.")
    search_fields = ("run__id",)
    ordering = ("-id",)
    show_full_result_count = False
    readonly_fields = ("payload_pretty",)
    exclude = ("payload",)

    @admin.display(description=_("payload"))
    def payload_short(self, obj: RecoveryEvent) -> str:
        return _short_json(obj.payload)

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: RecoveryEvent) -> str:
        return pretty_json(obj.payload)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(run_id__in=_runs_matching(term)), False


@admin.register(Message)
class MessageAdmin(RunIdSearchMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "thread", "position", "role", "run", "created")
    list_filter = ("role", ("created", admin.DateFieldListFilter))
    ordering = ("-id",)
    readonly_fields = ("content_pretty",)
    exclude = ("content",)

    @admin.display(description=_("content"))
    def content_pretty(self, obj: Message) -> str:
        return pretty_json(obj.content)


class ThreadMessageInline(MessageInline):
    fk_name = "thread"


@admin.register(Thread)
class ThreadAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "title", "owner", "created")
    list_filter = (("created", admin.DateFieldListFilter),)
    search_fields = ("title",)
    ordering = ("-created",)
    inlines = (ThreadMessageInline,)


@admin.register(StreamCheckpoint)
class StreamCheckpointAdmin(RunIdSearchMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("run", "turn", "attempt", "continuation", "seq", "updated_at")
    ordering = ("-updated_at",)
    readonly_fields = ("data_pretty",)
    exclude = ("data",)

    @admin.display(description=_("data"))
    def data_pretty(self, obj: StreamCheckpoint) -> str:
        return pretty_json(obj.data)


@admin.register(AnalyticsRollup)
class AnalyticsRollupAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The rollup is derived data: shown for checking, maintained only by ``streamrecover.analytics.rollup``."""

    list_display = ("slot", "provider", "model", "runs", "interrupted_runs", "recovered_runs", "interruptions")
    list_filter = ("provider", "model", ("slot", admin.DateFieldListFilter))
    date_hierarchy = "slot"
    ordering = ("-slot", "provider", "model")
    readonly_fields = ("recover_seconds_pretty",)
    exclude = ("recover_seconds",)

    @admin.display(description=_("recover seconds"))
    def recover_seconds_pretty(self, obj: AnalyticsRollup) -> str:
        return pretty_json(obj.recover_seconds)


@admin.register(ProxyKey)
class ProxyKeyAdmin(admin.ModelAdmin):
    """Keys of the healing endpoint: limits editable, revocable; the raw key is never here (only its hash
    is stored). Issue keys with ``manage.py streamrecover_proxy_key USERNAME``."""

    list_display = ("prefix", "name", "user", "created", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("prefix", "name", "user__username")
    readonly_fields = ("prefix", "user", "created", "last_used_at", "revoked_at")
    fields = (
        "prefix",
        "user",
        "name",
        "allowed_models",
        "max_tokens",
        "max_concurrent",
        "created",
        "last_used_at",
        "revoked_at",
    )
    actions = ("revoke",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a key is issued by the command, which shows it once

    @admin.action(description=_("Revoke the selected keys"), permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ProxyKey]) -> None:
        from django.utils import timezone

        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, ngettext("%d key revoked.", "%d keys revoked.", count) % count, messages.SUCCESS)


def _breakable(text: str) -> str:
    """``text`` escaped, with a break opportunity after each ``_``, ``-`` and ``/``: a long
    model or error name may wrap instead of widening its column."""
    pieces = [piece for piece in re.split(r"(?<=[_\-/])", text or "") if piece]
    return format_html_join(mark_safe("<wbr>"), "{}", ((piece,) for piece in pieces))


def _compact(n: int | None) -> str:
    """1234 -> 1.2k, 2839488 -> 2.8M: a token count that fits a narrow column (exact on the run's page)."""
    value = n or 0
    for limit, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if value >= limit:
            return f"{value / limit:.1f}{suffix}"
    return str(value)
