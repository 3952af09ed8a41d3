"""The staff-only analytics page and its JSON twin: one filter form, one report (``report.build_report``).

Anonymous visitors of the page go to the login page; the JSON endpoint answers them with a
403 body instead (a script has no login form to follow). Authenticated non-staff users get
403 from both.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET

from .definitions import DEFINITIONS
from .report import build_report, choices, display
from .windows import PRESETS, Window

WINDOW_CHOICES = [
    ("24h", "Last 24 hours"),
    ("7d", "Last 7 days"),
    ("30d", "Last 30 days"),
    ("custom", "Custom"),
]


LOCAL_INPUT = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


class AnalyticsFilterForm(forms.Form):
    """Window (a preset or a custom range), provider and model; everything optional."""

    window = forms.ChoiceField(choices=WINDOW_CHOICES, required=False)
    start = forms.DateTimeField(required=False, widget=LOCAL_INPUT)
    end = forms.DateTimeField(required=False, widget=LOCAL_INPUT)
    provider = forms.CharField(required=False, max_length=64)
    model = forms.CharField(required=False, max_length=200)

    report_window: Window  # set by a successful clean()

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("window") == "custom" and not data.get("start"):
            self.add_error("start", "A custom window needs a start.")
        elif not self.errors:
            try:
                self.report_window = self._window(data)
            except ValueError as exc:
                self.add_error("end" if data.get("end") else None, str(exc))
        return data

    def _window(self, data: dict[str, Any]) -> Window:
        now = timezone.now()
        filters = {"provider": data.get("provider") or None, "model": data.get("model") or None}
        if data.get("window") == "custom":
            return Window(data["start"], data.get("end") or now, **filters)
        return Window.last(PRESETS[data.get("window") or "24h"], now=now, **filters)


def _login_url() -> str:
    """The admin's login when the admin is installed (this is a staff page), else LOGIN_URL."""
    try:
        return reverse("admin:login")
    except NoReverseMatch:
        return str(settings.LOGIN_URL)


def _form(request: HttpRequest) -> AnalyticsFilterForm:
    data = request.GET.copy()
    data.setdefault("window", "24h")
    return AnalyticsFilterForm(data)


@require_GET
def analytics_page(request: HttpRequest) -> HttpResponse:
    """The figures as tables and charts, with their definitions."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), _login_url())
    if not request.user.is_staff:
        raise PermissionDenied("Staff only.")
    form = _form(request)
    context: dict[str, Any] = {"form": form, "report": None}
    if form.is_valid():
        window = form.report_window
        report = build_report(window)
        context.update(
            report=report,
            window=window,  # its datetimes, for display in the current time zone
            choices=choices(window),
            figure_rows=_figure_rows(report),
            definitions=[{"figure": f, "html": _code_spans(f.definition)} for f in DEFINITIONS],
            breakdowns=_breakdown_tables(report),
            json_query=request.GET.urlencode(),
        )
    status = 200 if form.is_valid() else 400
    return render(request, "streamrecover/analytics.html", context, status=status)


@require_GET
def analytics_json(request: HttpRequest) -> JsonResponse:
    """The same report as JSON: window, definitions, totals, groups, series."""
    if not request.user.is_authenticated:
        return JsonResponse({"error": "authentication required"}, status=403)
    if not request.user.is_staff:
        return JsonResponse({"error": "staff only"}, status=403)
    form = _form(request)
    if not form.is_valid():
        return JsonResponse({"error": "invalid filters", "fields": form.errors.get_json_data()}, status=400)
    return JsonResponse(build_report(form.report_window))


def _figure_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per scalar figure: label, definition, total and per-group values, formatted."""
    rows = []
    for figure in DEFINITIONS:
        if figure.unit == "breakdown":
            continue
        rows.append(
            {
                "figure": figure,
                "total": display(figure.unit, report["totals"][figure.key]),
                "groups": [display(figure.unit, group[figure.key]) for group in report["groups"]],
            }
        )
    return rows


def _breakdown_tables(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Interruptions by cause and by plan: one row per value, a column per group."""
    tables = []
    for figure in DEFINITIONS:
        if figure.unit != "breakdown":
            continue
        total = report["totals"][figure.key]
        tables.append(
            {
                "figure": figure,
                "rows": [
                    {
                        "label": label,
                        "total": display("count", count),
                        "groups": [display("count", group[figure.key][label]) for group in report["groups"]],
                    }
                    for label, count in total.items()
                ],
            }
        )
    return tables


def _code_spans(text: str) -> SafeString:
    """The definitions' `backticks` as <code>, everything else escaped."""
    return mark_safe(re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text)))  # escaped first
