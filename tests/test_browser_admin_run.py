"""A run's admin page in Debian's Chromium at 1280 px, for a run recovered twice (the fake provider,
the connection cut twice): the page does not scroll sideways, and each recovery event's payload is
wide enough to read (it had shrunk to a few characters a line, the page to thousands of pixels)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .e2e_helpers import admin_run_list, browser_site, chromium

pytestmark = pytest.mark.browser

WIDTH = 1280
SUPERUSER = """
from django.contrib.auth import get_user_model
get_user_model().objects.create_superuser("root", "root@example.org", "root-pw")
"""


@pytest.fixture(scope="module")
def admin_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    recovered_run = (
        "streamrecover_run", "--provider", "fake", "--prompt", "A story [[words=120]]", "--json",
        "--fault", "cut:bytes=900", "--fault", "cut:events=6", "--backoff-scale", "0",
    )  # fmt: skip
    db = tmp_path_factory.mktemp("browser-admin-run") / "admin.sqlite3"
    with browser_site(db, ("shell", "-c", SUPERUSER), recovered_run) as url:
        yield url


def test_a_recovered_runs_page_fits_1280_px_and_its_event_payloads_are_readable(admin_site: str) -> None:
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        admin_run_list(page, admin_site, "root", "root-pw")
        page.click("#result_list tbody tr:first-child a")
        page.wait_for_url("**/change/")
        measured: dict[str, Any] = page.evaluate(
            """() => ({
                pageOverflow: document.documentElement.scrollWidth - window.innerWidth,
                attempts: document.querySelectorAll('#attempts-group tbody tr.has_original').length,
                eventsOverflow: (() => { const g = document.querySelector('#events-group');
                    return g.scrollWidth - g.clientWidth; })(),
                payloadWidths: [...document.querySelectorAll('#events-group .field-payload_pretty pre')]
                    .map((pre) => Math.round(pre.getBoundingClientRect().width)),
            })"""
        )
    assert measured["attempts"] == 3, measured  # the initial call and two continuations
    assert len(measured["payloadWidths"]) >= 4, measured  # two interruptions, two continuations...
    assert measured["pageOverflow"] <= 0, measured  # nothing to scroll sideways
    assert measured["eventsOverflow"] <= 0, measured  # nor in the events' box: each payload is seen whole
    assert min(measured["payloadWidths"]) >= 400, measured  # a JSON line of a payload fits, not a word of it
