"""Session guards: the real PostgreSQL and Redis for the tests that use them, never a skip.

Tests that touch the database (``django_db``, ``db``, ``transactional_db``, ``live_server``)
or are marked ``services`` (Redis, worker processes, browsers) need the real services: when
any such test is collected and a service is down, the whole session stops with what is
missing and how to start it, because a suite that passes by skipping proves nothing. The
engine, adapter and fake-provider tests need neither and run on a bare checkout.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from .streams import MISSING

START_POSTGRES = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
START_REDIS = (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no '
    "--dir /var/lib/redis --logfile /var/log/redis/ci.log"
)


def _postgres_problem() -> str | None:
    import psycopg

    db = settings.DATABASES["default"]
    where = (
        f"{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432} (database {db.get('NAME')}, user {db.get('USER')})"
    )
    try:
        conn = psycopg.connect(
            host=db.get("HOST") or None,
            port=db.get("PORT") or None,
            dbname=db.get("NAME"),
            user=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            connect_timeout=3,
        )
    except psycopg.Error as exc:
        return f"PostgreSQL is not reachable at {where}: {str(exc).strip()}\n  start it: {START_POSTGRES}"
    conn.close()
    return None


def _redis_problem() -> str | None:
    import redis

    url = settings.REDIS_URL
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:
        host = client.connection_pool.connection_kwargs.get("host")
        port = client.connection_pool.connection_kwargs.get("port")
        return f"Redis is not reachable at {host}:{port}: {exc}\n  start it: {START_REDIS}"
    finally:
        client.close()
    return None


SERVICE_FIXTURES = frozenset({"db", "transactional_db", "django_db_setup", "live_server", "redis_checkpoint_store"})


def needs_services(item: pytest.Item) -> bool:
    """True for a test that talks to PostgreSQL or Redis (or starts processes that do)."""
    if item.get_closest_marker("services") or item.get_closest_marker("django_db"):
        return True
    return bool(SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())))


SERVICES_GROUP = "services"


@pytest.hookimpl(tryfirst=True)  # as each test is collected: before pytest-xdist reads the groups
def pytest_itemcollected(item: pytest.Item) -> None:
    """Under ``make test`` (two pytest-xdist processes) every test that uses PostgreSQL, Redis,
    worker processes or a browser runs in one process, in order, as in a plain run: they share
    the test database, the Redis db and Celery's queue. The rest (the engine, the adapters, the
    fake provider, the recovery sweeps: CPU, no shared state) are spread over both."""
    if needs_services(item) or item.get_closest_marker("browser"):
        item.add_marker(pytest.mark.xdist_group(SERVICES_GROUP))


GROUPS_LOST = pytest.StashKey[str]()


def _check_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist process, fail the service tests if they lost their group: they would
    run in both processes at once, on one Redis db and one Celery queue, and fail for that, or
    pass by luck. (Exiting from a pytest-xdist process loses the message.)"""
    if not (hasattr(config, "workerinput") and config.getoption("loadgroup", False)):
        return
    lost = [item for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    for item in lost:
        item.stash[GROUPS_LOST] = (
            "pytest-xdist did not keep this test in its group: this pytest and pytest-xdist do not work "
            "together (pytest-dev/pytest-xdist#1386); install the pytest the test extra names, or run "
            "pytest without -n"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if GROUPS_LOST in item.stash:
        pytest.fail(item.stash[GROUPS_LOST], pytrace=False)


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: only the tests that will run count
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_groups(config, items)
    if not any(needs_services(item) for item in items):
        return
    problems = [p for p in (_postgres_problem(), _redis_problem()) if p]
    if problems:
        pytest.exit("The tests need the real services.\n" + "\n".join(problems), returncode=1)


@pytest.fixture(autouse=True)
def _close_async_db_connections(request: pytest.FixtureRequest) -> Iterator[None]:
    """The async ORM of an async test runs in asgiref's shared sync thread; close that
    thread's connections afterwards, or the test database cannot be dropped at the end."""
    yield
    if inspect.iscoroutinefunction(request.function):
        asyncio.run(sync_to_async(connections.close_all)())


@pytest.fixture(autouse=True)
def _forget_prefill_refusals() -> Iterator[None]:
    """A model's prefill refusal is remembered process-wide: no test sees another's."""
    from streamrecover.engine.continuation import forget_prefill_refusals

    forget_prefill_refusals()
    yield
    forget_prefill_refusals()


@pytest.fixture
async def redis_checkpoint_store() -> AsyncIterator[object]:
    """A Redis checkpoint store under a key prefix of its own, its keys deleted afterwards."""
    from streamrecover.runs.checkpoints import RedisCheckpointStore

    store = RedisCheckpointStore(settings.REDIS_URL, ttl_s=60, prefix=f"streamrecover:test:{uuid.uuid4().hex}:")
    yield store
    client = store._redis()
    async for key in client.scan_iter(match=f"{store.prefix}*"):
        await client.delete(key)
    await store.aclose()


@pytest.fixture(scope="session")
def fake_server() -> Iterator[object]:
    """One fault-injecting fake provider on loopback for the whole session; tests keep
    apart by scenario key."""
    from streamrecover.testing.fake import FakeProviderServer

    server = FakeProviderServer()
    server.start()
    yield server
    server.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say plainly how many tests did not run because the test data beside the repository is not there."""
    skipped = terminalreporter.stats.get("skipped", [])
    missing = [str(getattr(r, "longrepr", "")) for r in skipped if MISSING in str(getattr(r, "longrepr", ""))]
    if missing:
        folders = sorted({text.split(MISSING + ": ", 1)[1].split(" (set ", 1)[0] for text in missing})
        terminalreporter.write_line(
            f"{len(missing)} tests that need the recorded provider streams did not run: "
            + "; ".join(folders)
            + " (put the test data beside the repository or set the variable named in each skip)",
            yellow=True,
        )


def pytest_configure(config: pytest.Config) -> None:
    # The app's pytest plugin, as a host project gets it from the ``pytest11`` entry point
    # (registered here too when the installed distribution predates the entry point).
    from streamrecover.testing import pytest_plugin

    if not config.pluginmanager.is_registered(pytest_plugin):
        config.pluginmanager.register(pytest_plugin, "streamrecover")


@pytest.fixture(autouse=True)
def _join_run_threads(_django_db_marker: None) -> Iterator[None]:
    """Runs a test started in threads of this process (the in-process mode) end before the test
    database's teardown: the flush must never race a run's last writes (issue 10).

    Tests wait for their runs (``streamrecover.testing.host.wait_for`` joins the run's thread);
    this is the net under them. Requesting pytest-django's ``_django_db_marker`` orders it after
    the database fixtures, so its teardown runs before theirs.
    """
    yield
    from streamrecover import starter

    deadline = time.monotonic() + 60
    left = []
    for thread in starter.run_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            left.append(thread.name)
    assert not left, f"run threads still alive after the test: {left}"
