"""The admin's run list in Debian's Chromium at 1280 px: every run id on one line, every column
visible (none cut off on the right, no sideways scrolling), long model names and all."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .e2e_helpers import admin_run_list, browser_site, chromium

pytestmark = pytest.mark.browser

WIDTH = 1280
POPULATE = """
from django.contrib.auth import get_user_model
from streamrecover.models import Run, Thread
User = get_user_model()
admin = User.objects.create_superuser("root", "root@example.org", "root-pw")
statuses = ["completed", "failed", "exhausted", "running", "queued", "cancelled"]
for i in range(24):
    thread = Thread.objects.create(owner=admin)
    Run.objects.create(
        thread=thread, owner=admin, status=statuses[i % len(statuses)],
        provider=["fake", "anthropic", "openai-compatible-eu-west"][i % 3],
        model=["claude-sonnet-4-5-20250929", "gpt-4o-mini-2024-07-18", "fake-model"][i % 3],
        attempt_count=i % 6, continuation_count=i % 5, input_tokens=123456 * i, output_tokens=65432 * i,
        error_kind=["", "provider_error_mid_stream", "exhausted", "too_many_claims"][i % 4],
    )
"""


@pytest.fixture(scope="module")
def admin_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with browser_site(tmp_path_factory.mktemp("browser-admin") / "admin.sqlite3", ("shell", "-c", POPULATE)) as url:
        yield url


def test_the_run_list_fits_1280_px_with_each_id_on_one_line(admin_site: str) -> None:
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        admin_run_list(page, admin_site, "root", "root-pw")
        measured: dict[str, Any] = page.evaluate(
            """() => {
                const table = document.querySelector('#result_list');
                const results = table.closest('.results') || table.parentElement;
                const ids = [...table.querySelectorAll('tbody .field-short_id a code')];
                const heads = [...table.querySelectorAll('thead th')];
                const lineHeight = (el) => parseFloat(getComputedStyle(el).lineHeight) || 20;
                return {
                    rows: table.querySelectorAll('tbody tr').length,
                    idLines: ids.map((a) => Math.round(a.getBoundingClientRect().height / lineHeight(a))),
                    idTexts: ids.map((a) => a.textContent.trim()),
                    headers: heads.map((th) => th.textContent.trim()),
                    headerRights: heads.map((th) => th.getBoundingClientRect().right),
                    resultsRight: results.getBoundingClientRect().right,
                    resultsOverflow: results.scrollWidth - results.clientWidth,
                    pageOverflow: document.documentElement.scrollWidth - window.innerWidth,
                    viewport: window.innerWidth,
                };
            }"""
        )
    assert measured["rows"] == 24
    assert len(measured["idLines"]) == 24, measured
    assert all(lines == 1 for lines in measured["idLines"]), measured["idLines"]  # no UUID over several lines
    assert measured["headers"][-1].lower() == "error", measured["headers"]  # the last column is there
    assert measured["pageOverflow"] <= 0, measured  # nothing to scroll sideways
    assert measured["resultsOverflow"] <= 0, measured  # the table is not cut inside its box
    assert max(measured["headerRights"]) <= min(measured["resultsRight"], measured["viewport"]), measured
