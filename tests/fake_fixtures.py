"""One fake provider per test module, its log and scripts fresh for each test, and the client that calls it.

A module takes the fixtures by binding them under their own names (``server = fake_fixtures.server``):
pytest finds fixtures among a module's attributes, so each module gets a server of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from streamrecover.testing.fake import FakeProviderServer

HTTP = httpx.Client(timeout=10)  # one client: building one per request costs ~50 ms (TLS context)
TIME_TOOL: dict[str, Any] = {
    "name": "get_time",
    "description": "Local time",
    "input_schema": {"type": "object", "properties": {}},
}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProviderServer]:
    with FakeProviderServer() as running:
        yield running


@pytest.fixture(autouse=True)
def clean_server(server: FakeProviderServer) -> None:
    """No scripted fault or log entry of an earlier test is left."""
    server.reset()
