"""The pytest plugin for projects that use streamrecover (registered as ``streamrecover``
through the ``pytest11`` entry point: installing the app is enough; with pytest-django).

Fixtures:

- ``streamrecover_fake_server``: one fake provider per test session, on loopback.
- ``streamrecover_fake``: a ``FakeProvider`` for one test: the ``STREAMRECOVER`` settings point
  every built-in-adapter provider at the fake server for the test (restored after), with a
  scenario of its own. ``streamrecover_fake.script("cut:bytes=900")`` breaks the next stream;
  ``streamrecover_fake.run(prompt)`` runs a run here and returns its ``RunReport``.

A test may also mark itself ``@pytest.mark.streamrecover_faults("cut:bytes=900", ...)`` to
script the fake before it starts. Assertions: ``streamrecover.testing.host.assert_recovered``.

Nothing Django is imported until a fixture is used, so the plugin loads in any pytest run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

FAULTS_MARK = "streamrecover_faults"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{FAULTS_MARK}(*faults): script the streamrecover fake provider before the test"
    )


@pytest.fixture(scope="session")
def streamrecover_fake_server() -> Iterator[Any]:
    """A fake provider (``streamrecover.testing.FakeProviderServer``) running for the session."""
    from streamrecover.testing import fake_server

    server = fake_server()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def streamrecover_fake(request: pytest.FixtureRequest, streamrecover_fake_server: Any) -> Iterator[Any]:
    """The ``STREAMRECOVER`` settings pointed at the fake provider for this test (a ``FakeProvider``)."""
    from streamrecover.testing.host import FakeProvider

    marker = request.node.get_closest_marker(FAULTS_MARK)
    with FakeProvider(streamrecover_fake_server, scenario=f"test-{request.node.nodeid}") as fake:
        if marker is not None:
            fake.script(*marker.args)
        yield fake
