"""The analytics page, its JSON twin and the stats command; and the charts in a real browser."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from streamrecover.analytics import definitions

from .e2e_helpers import chromium
from .factories import make_user
from .test_analytics import EXPECTED_O, EXPECTED_TOTAL, History, record_history

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "streamrecover" / "static" / "streamrecover"
PAGE = "/streamrecover/analytics/"
JSON_URL = "/streamrecover/analytics.json"


@pytest.fixture
def history() -> History:
    return record_history()


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(make_user(is_staff=True))
    return client


def _close(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    for key, value in expected.items():
        assert actual[key] == (pytest.approx(value) if isinstance(value, float) else value), key


# ---- who may see it -------------------------------------------------------------------------------


def test_urls() -> None:
    assert reverse("streamrecover_analytics:page") == PAGE
    assert reverse("streamrecover_analytics:json") == JSON_URL


@pytest.mark.django_db
def test_anonymous_visitors_are_sent_to_the_login_page() -> None:
    response = Client().get(PAGE, {"window": "7d"})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login") + "?next=")
    assert "analytics" in response["Location"]


@pytest.mark.django_db
def test_anonymous_json_is_refused_with_json() -> None:
    response = Client().get(JSON_URL)
    assert response.status_code == 403
    assert response.json() == {"error": "authentication required"}


@pytest.mark.django_db
def test_non_staff_users_are_refused() -> None:
    client = Client()
    client.force_login(make_user())
    assert client.get(PAGE).status_code == 403
    response = client.get(JSON_URL)
    assert response.status_code == 403
    assert response.json() == {"error": "staff only"}


@pytest.mark.django_db
def test_only_get(staff: Client) -> None:
    assert staff.post(PAGE).status_code == 405
    assert staff.post(JSON_URL).status_code == 405


# ---- what staff sees ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_json_carries_the_report(staff: Client, history: History) -> None:
    response = staff.get(JSON_URL, {"window": "24h"})
    assert response.status_code == 200
    data = response.json()
    assert set(data) == {"window", "definitions", "totals", "groups", "series"}
    _close(data["totals"], EXPECTED_TOTAL)
    assert data["window"]["bucket"] == "hour"
    assert [d["key"] for d in data["definitions"]] == [f.key for f in definitions.DEFINITIONS]
    assert sum(p["runs"] for p in data["series"]) == 14


@pytest.mark.django_db
def test_json_filters(staff: Client, history: History) -> None:
    data = staff.get(JSON_URL, {"window": "7d", "provider": "openai", "model": "gpt-x"}).json()
    _close(data["totals"], EXPECTED_O)
    assert (data["window"]["provider"], data["window"]["model"]) == ("openai", "gpt-x")
    window = history.window()
    data = staff.get(
        JSON_URL, {"window": "custom", "start": window.start.isoformat(), "end": window.end.isoformat()}
    ).json()
    assert data["window"]["start"] == window.start.isoformat()
    _close(data["totals"], EXPECTED_TOTAL)
    # a custom window after the runs: nothing; one that starts in the future: refused
    later = history.start + timedelta(hours=2, minutes=30)
    assert staff.get(JSON_URL, {"window": "custom", "start": later.isoformat()}).json()["totals"]["runs"] == 0
    future = (history.start + timedelta(days=1)).isoformat()
    response = staff.get(JSON_URL, {"window": "custom", "start": future})
    assert response.status_code == 400
    assert "__all__" in response.json()["fields"]


@pytest.mark.django_db
def test_invalid_filters(staff: Client) -> None:
    response = staff.get(JSON_URL, {"window": "custom"})
    assert response.status_code == 400
    assert "start" in response.json()["fields"]
    response = staff.get(JSON_URL, {"window": "forever"})
    assert response.status_code == 400
    start = "2026-01-02T00:00:00+00:00"
    response = staff.get(JSON_URL, {"window": "custom", "start": start, "end": "2026-01-01T00:00:00+00:00"})
    assert response.status_code == 400
    assert "end" in response.json()["fields"]
    page = staff.get(PAGE, {"window": "custom"})
    assert page.status_code == 400
    assert "A custom window needs a start." in page.content.decode()


@pytest.mark.django_db
def test_page_shows_tables_charts_and_definitions(staff: Client, history: History) -> None:
    response = staff.get(PAGE)
    assert response.status_code == 200
    html = response.content.decode()
    for canvas in ("sr-chart-series", "sr-chart-rates", "sr-chart-causes", "sr-chart-plans"):
        assert f'id="{canvas}"' in html
    # the figures, formatted: 11 of 14 runs interrupted, 8 of 11 recovered
    assert '<td data-key="interruption_rate">78.6%</td>' in html
    assert '<td data-key="recovery_rate">72.7%</td>' in html
    assert '<td data-key="tokens_saved">213</td>' in html
    assert '<td data-key="time_to_recover_p50_s">8.0 s</td>' in html
    assert "claude-x" in html
    assert "gpt-x" in html
    # every definition, with its code spans
    for figure in definitions.DEFINITIONS:
        assert figure.label in html
    assert "<code>llm_stream_interrupted</code>" in html
    # the same report as the JSON endpoint, embedded for the charts
    embedded = response.context["report"]
    assert embedded["totals"] == staff.get(JSON_URL).json()["totals"]
    assert 'id="sr-analytics-report" type="application/json"' in html
    # provider and model choices come from the window's runs
    assert '<option value="openai">openai</option>' in html


@pytest.mark.django_db
def test_page_serves_chart_js_from_the_app_never_a_cdn(staff: Client, history: History) -> None:
    html = staff.get(PAGE).content.decode()
    static = settings.STATIC_URL.lstrip("/")
    assert f'src="/{static}streamrecover/vendor/chart.umd.min.js"' in html
    assert f'src="/{static}streamrecover/analytics.js"' in html
    assert "cdn" not in html.lower()
    assert "https://" not in html
    vendored = (STATIC / "vendor" / "chart.umd.min.js").read_text()
    assert vendored.startswith("/*!\n * Chart.js v4")
    assert (STATIC / "vendor" / "chart.js.LICENSE.md").read_text().startswith("The MIT License")


@pytest.mark.django_db
def test_page_escapes_what_it_shows(staff: Client) -> None:
    from .factories import make_run

    make_run(provider="<script>x</script>", model="m")
    html = staff.get(PAGE).content.decode()
    assert "<script>x</script>" not in html
    assert "&lt;script&gt;x&lt;/script&gt;" in html


# ---- the stats command -----------------------------------------------------------------------------


def _stats(*args: str) -> str:
    out = io.StringIO()
    call_command("streamrecover_stats", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_stats_command_json(history: History) -> None:
    window = history.window()
    data = json.loads(_stats("--since", window.start.isoformat(), "--until", window.end.isoformat(), "--json"))
    _close(data["totals"], EXPECTED_TOTAL)
    assert data["totals"]["interruptions_by_cause"]["connection_reset"] == 7
    data = json.loads(_stats("--window", "24h", "--provider", "openai", "--json"))
    _close(data["totals"], EXPECTED_O)


@pytest.mark.django_db
def test_stats_command_table(history: History) -> None:
    text = _stats("--window", "24h")  # the run two days back stays out
    lines = text.splitlines()
    assert lines[0].startswith("Runs created from ")
    header = lines[2].split()
    assert header == ["figure", "total", "anthropic/claude-x", "openai/gpt-x"]

    def row(label: str) -> list[str]:
        [line] = [line for line in lines if line.startswith(label + "  ")]
        return line[len(label) :].split()

    assert row("Runs") == ["14", "11", "3"]
    assert row("Interruption rate") == ["78.6%", "72.7%", "100.0%"]
    assert row("Recovery rate") == ["72.7%", "75.0%", "66.7%"]
    assert row("Time to recover, p95") == ["40.8", "s", "42.6", "s", "19.4", "s"]
    assert row("Output tokens saved vs. a naive restart") == ["213", "163", "50"]
    assert row("  whole_restart") == ["1", "0", "1"]
    assert "Interruptions by cause:" in text


@pytest.mark.django_db
def test_stats_command_rejects_bad_windows() -> None:
    with pytest.raises(CommandError, match="window"):
        _stats("--window", "forever")
    with pytest.raises(CommandError, match="ISO"):
        _stats("--since", "yesterday")
    with pytest.raises(CommandError, match="before"):
        _stats("--since", "2026-02-01", "--until", "2026-01-01")


@pytest.mark.django_db
def test_stats_command_on_an_empty_database() -> None:
    text = _stats()
    assert "Interruption rate" in text
    assert "—" in text


# ---- a real browser ------------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_charts_are_drawn_in_chromium(live_server: Any) -> None:
    """Debian's Chromium (never a downloaded browser) opens the page; the four charts have pixels."""
    record_history()
    client = Client()
    client.force_login(make_user(is_staff=True))
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1800})
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": live_server.url}])
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        external: list[str] = []
        page.on("request", lambda r: None if r.url.startswith(live_server.url) else external.append(r.url))
        page.goto(f"{live_server.url}{PAGE}?window=24h")
        page.wait_for_function("() => Boolean(window.streamrecoverCharts && window.Chart)")
        drawn = page.evaluate(
            """() => {
                const out = {};
                for (const [name, chart] of Object.entries(window.streamrecoverCharts)) {
                    const canvas = chart.canvas;
                    const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
                    let painted = 0;
                    for (let i = 3; i < data.length; i += 4) if (data[i] !== 0) painted++;
                    out[name] = {
                        painted: painted,
                        width: canvas.width,
                        registered: window.Chart.getChart(canvas) === chart,
                        points: chart.data.datasets.map(d => d.data.length),
                    };
                }
                return out;
            }"""
        )
        page.screenshot(path=str(artifacts / "analytics.png"), full_page=True)
    assert errors == []
    assert external == []
    assert set(drawn) == {"series", "rates", "causes", "plans"}
    for name, chart in drawn.items():
        assert chart["registered"], name
        assert chart["width"] > 100, name
        assert chart["painted"] > 500, name  # axes, labels, lines and bars: far from blank
    assert drawn["series"]["points"] == [24, 24, 24] or drawn["series"]["points"] == [25, 25, 25]
    assert drawn["causes"]["points"] == [len(definitions.CAUSES) + 1]
    assert (artifacts / "analytics.png").stat().st_size > 10_000


@pytest.mark.django_db
def test_the_window_is_shown_as_readable_dates_in_the_current_time_zone(staff: Client) -> None:
    import re

    from django.test import override_settings

    window = {"window": "custom", "start": "2025-03-04T05:06:00+00:00", "end": "2025-03-05T17:30:00+00:00"}
    html = staff.get(PAGE, window).content.decode()
    shown = re.search(r'<p class="sr-window">(.*?)</p>', html, re.S)
    assert shown is not None
    text = " ".join(re.sub(r"<[^>]*>", " ", shown.group(1)).split())
    assert text.startswith("Runs created from March 4, 2025, 5:06 a.m. to March 5, 2025, 5:30 p.m. (UTC)"), text
    assert "2025-03-04T05:06" not in text  # no ISO timestamp in what a reader sees...
    assert '<time datetime="2025-03-04T05:06:00+00:00">' in shown.group(1)  # ...but the machine-readable one
    with override_settings(TIME_ZONE="Asia/Kolkata"):
        html = staff.get(PAGE, window).content.decode()
    assert "from March 4, 2025, 10:36 a.m. to March 5, 2025, 11 p.m. (IST)" in " ".join(
        re.sub(r"<[^>]*>", " ", html).split()
    )
