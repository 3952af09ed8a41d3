"""Cancel on the demo chat while the page's socket is down during a long continuation backoff
(Chromium against Daphne, as tests/test_browser_chat.py): the click is never lost; and a page
reloaded during that backoff says the stream is reconnecting, as the page that saw the break did."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import browser_fixtures
from .e2e_helpers import ChatPage, browser_site

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def demo_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The demo whose first continuation backoff lasts about 20 s: long enough to act in."""
    db = tmp_path_factory.mktemp("browser_cancel") / "demo.sqlite3"
    delays = {"STREAMRECOVER_FAKE_EVENT_DELAY": "0.01", "STREAMRECOVER_BROWSER_BACKOFF_SCALE": "20"}
    with browser_site(db, ("streamrecover_demo_user",), **delays) as url:
        yield url


browser = browser_fixtures.browser
chat = browser_fixtures.chat


def start_a_run_in_backoff(chat: ChatPage) -> str:
    run_id = chat.send("A story about bridges. [[words=200]]", "r1")
    chat.page.wait_for_function("window.__streamrecover.recoveries.some(r => r.phase === 'backoff')")
    assert chat.page.locator("#sr-status").text_content() == "recovering"
    return run_id


def wait_for_db_status(chat: ChatPage, run_id: str, status: str, timeout_ms: int = 8_000) -> None:
    for _ in range(timeout_ms // 250):
        if chat.run_detail(run_id)["status"] == status:
            return
        chat.page.wait_for_timeout(250)
    pytest.fail(f"run {run_id} is {chat.run_detail(run_id)['status']!r}, not {status!r}")


def test_cancel_while_the_socket_reconnects_goes_over_the_api(chat: ChatPage) -> None:
    run_id = start_a_run_in_backoff(chat)
    # the socket drops and its reconnect waits about 8 s (the client's later delays)
    chat.page.evaluate("window.__streamrecover.client.delays = [8000]")
    chat.page.evaluate("window.__streamrecover.client.dropConnection()")
    chat.page.wait_for_function("!document.querySelector('#sr-connection').hidden")
    chat.page.click("#sr-cancel")
    wait_for_db_status(chat, run_id, "cancelled")  # long before the backoff or the reconnect would end
    assert chat.page.evaluate("window.__streamrecover.client.socket") is None  # still down: it went over HTTP
    button = chat.page.locator("#sr-cancel")
    assert button.text_content() == "Cancelling\u2026"
    assert button.is_disabled()  # no second click meanwhile
    assert chat.page.locator("#sr-status").text_content() == "recovering"  # the page has not heard yet
    assert chat.wait_until_finished(timeout_ms=15_000) == "cancelled"  # once the socket is back
    assert button.text_content() == "Cancel"
    assert chat.page.locator("#sr-error").is_hidden()


def test_cancel_while_offline_is_sent_once_the_page_is_back(chat: ChatPage) -> None:
    run_id = start_a_run_in_backoff(chat)
    chat.page.context.set_offline(True)
    chat.page.evaluate("window.__streamrecover.client.dropConnection()")
    chat.page.wait_for_function("!document.querySelector('#sr-connection').hidden")
    chat.page.click("#sr-cancel")  # neither the socket nor the API is reachable
    chat.page.wait_for_timeout(1_000)
    assert chat.page.locator("#sr-cancel").text_content() == "Cancelling\u2026"
    assert chat.page.locator("#sr-error").is_hidden()
    chat.page.context.set_offline(False)
    assert chat.wait_until_finished(timeout_ms=15_000) == "cancelled"  # well within the 20 s backoff
    assert chat.run_detail(run_id)["status"] == "cancelled"
    assert chat.page.locator("#sr-cancel").text_content() == "Cancel"


def test_a_page_reloaded_during_a_backoff_still_says_the_stream_is_reconnecting(chat: ChatPage) -> None:
    start_a_run_in_backoff(chat)
    notice = chat.page.locator("#sr-recovery")
    assert notice.is_visible()
    chat.page.reload()
    chat.page.wait_for_function("window.__streamrecover.status === 'recovering'")
    chat.page.wait_for_timeout(300)  # the snapshot rendered
    assert chat.page.locator("#sr-status").text_content() == "recovering"
    assert notice.is_visible()  # it was hidden: only the frame of the break showed it
    assert "reconnecting" in (notice.text_content() or "")
    chat.page.click("#sr-cancel")
    assert chat.wait_until_finished(timeout_ms=15_000) == "cancelled"
    assert notice.is_hidden()
