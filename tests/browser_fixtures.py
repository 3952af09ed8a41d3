"""One Chromium per browser test module and a signed-in chat page per test, on the module's ``demo_site``.

A module takes them by binding them under their own names (``chat = browser_fixtures.chat``), as with
``fake_fixtures``; the page's JavaScript errors fail the test that caused them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .e2e_helpers import ChatPage, chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as running:
        yield running


@pytest.fixture
def chat(browser: Any, demo_site: str) -> Iterator[ChatPage]:
    context = browser.new_context()
    page = ChatPage(context.new_page(), demo_site)
    page.login()
    yield page
    context.close()
    assert page.errors == []
