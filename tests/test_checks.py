"""Each system check fires on its bad configuration and stays quiet on the good one."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from streamrecover import checks

CELERY = {"EXECUTION": "celery", "CHECKPOINT_STORE": "redis"}
REDIS_LAYER = {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": {"hosts": []}}}
MEMORY_LAYER = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def test_the_test_settings_pass_every_check() -> None:
    # W007 (in-process runs with DEBUG = False) is silenced in tests/settings.py, as a host would.
    assert [m for m in run_checks(tags=["streamrecover"]) if not m.is_silenced()] == []


def test_checks_are_registered() -> None:
    with override_settings(STREAMRECOVER={"NOPE": 1}):
        assert "streamrecover.E001" in ids(run_checks(tags=["streamrecover"]))


@pytest.mark.parametrize(
    "bad",
    [{"NOPE": 1}, {"EXECUTION": "threads"}, {"PROVIDERS": {"x": {"ADAPTER": "openai"}}}, "not a dict"],
)
def test_e001_invalid_settings(bad: Any) -> None:
    with override_settings(STREAMRECOVER=bad):
        found = checks.check_settings()
    assert found
    assert set(ids(found)) == {"streamrecover.E001"}


def test_e001_quiet_on_valid_settings() -> None:
    with override_settings(STREAMRECOVER={"MAX_CONTINUATIONS": 1}):
        assert checks.check_settings() == []


def test_w002_celery_with_in_memory_layer() -> None:
    with override_settings(STREAMRECOVER=CELERY, CHANNEL_LAYERS=MEMORY_LAYER):
        assert ids(checks.check_channel_layer()) == ["streamrecover.W002"]
    with override_settings(STREAMRECOVER=CELERY, CHANNEL_LAYERS=REDIS_LAYER):
        assert checks.check_channel_layer() == []
    with override_settings(STREAMRECOVER={"EXECUTION": "inprocess"}, CHANNEL_LAYERS=MEMORY_LAYER):
        assert checks.check_channel_layer() == []


def test_w003_memory_checkpoints_with_celery() -> None:
    with override_settings(STREAMRECOVER={"EXECUTION": "celery", "CHECKPOINT_STORE": "memory"}):
        assert ids(checks.check_checkpoint_store()) == ["streamrecover.W003"]
    for store in ("redis", "orm"):
        with override_settings(STREAMRECOVER={"EXECUTION": "celery", "CHECKPOINT_STORE": store}):
            assert checks.check_checkpoint_store() == []
    with override_settings(STREAMRECOVER={"EXECUTION": "inprocess", "CHECKPOINT_STORE": "memory"}):
        assert checks.check_checkpoint_store() == []


def test_e004_a_setting_whose_package_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(STREAMRECOVER=CELERY):
        assert checks.check_packages() == []  # both installed here
        monkeypatch.setattr(checks, "_installed", lambda module: module != "celery")
        found = checks.check_packages()
        assert ids(found) == ["streamrecover.E004"]
        assert "'celery' package" in found[0].msg
        monkeypatch.setattr(checks, "_installed", lambda module: False)
        assert [m.msg.split("]")[0] for m in checks.check_packages()] == [
            "STREAMRECOVER['EXECUTION'",
            "STREAMRECOVER['CHECKPOINT_STORE'",
        ]
    with override_settings(STREAMRECOVER={"EXECUTION": "inprocess", "CHECKPOINT_STORE": "orm"}):
        assert checks.check_packages() == []


def test_w004_prefetch_multiplier() -> None:
    with override_settings(STREAMRECOVER=CELERY, CELERY_WORKER_PREFETCH_MULTIPLIER=4):
        assert ids(checks.check_prefetch()) == ["streamrecover.W004"]
    with override_settings(STREAMRECOVER=CELERY, CELERY_WORKER_PREFETCH_MULTIPLIER=1):
        assert checks.check_prefetch() == []


def test_w004_celery_default_prefetch_is_four() -> None:
    with override_settings(STREAMRECOVER=CELERY):
        from django.conf import settings

        del settings.CELERY_WORKER_PREFETCH_MULTIPLIER
        assert ids(checks.check_prefetch()) == ["streamrecover.W004"]


def test_warnings_stand_aside_when_settings_are_invalid() -> None:
    with override_settings(STREAMRECOVER={"EXECUTION": "celery", "CHECKPOINT_STORE": "memory", "NOPE": 1}):
        assert ids(run_checks(tags=["streamrecover"])) == ["streamrecover.E001"]


# ---- W005: no channel layer -------------------------------------------------------------------


@pytest.mark.parametrize("layers", [None, {}, {"other": MEMORY_LAYER["default"]}, {"default": {}}])
def test_w005_no_channel_layer(layers: Any) -> None:
    with override_settings(CHANNEL_LAYERS=layers):
        assert ids(checks.check_no_channel_layer()) == ["streamrecover.W005"]


def test_w005_quiet_with_a_layer() -> None:
    for layers in (MEMORY_LAYER, REDIS_LAYER):
        with override_settings(CHANNEL_LAYERS=layers):
            assert checks.check_no_channel_layer() == []


def test_w005_when_the_setting_is_absent() -> None:
    with override_settings():
        from django.conf import settings

        del settings.CHANNEL_LAYERS
        found = [m for m in run_checks(tags=["streamrecover"]) if not m.is_silenced()]
        assert ids(found) == ["streamrecover.W005"]


# ---- W006: the WebSocket route without an origin check ----------------------------------------


@pytest.mark.parametrize("app", ["unchecked", "nested_unchecked"])
def test_w006_route_without_origin_check(app: str) -> None:
    with override_settings(ASGI_APPLICATION=f"tests.asgi_apps.{app}"):
        found = checks.check_websocket_origin()
    assert ids(found) == ["streamrecover.W006"]
    assert f"tests.asgi_apps.{app}" in found[0].msg


@pytest.mark.parametrize("app", ["checked", "nested_checked", "http_only", "opaque", "does_not_exist"])
def test_w006_quiet_when_checked_or_not_seen(app: str) -> None:
    with override_settings(ASGI_APPLICATION=f"tests.asgi_apps.{app}"):
        assert checks.check_websocket_origin() == []
    with override_settings(ASGI_APPLICATION=None):
        assert checks.check_websocket_origin() == []


def test_w006_sees_the_demo_projects_check() -> None:
    from project.asgi import application
    from tests import asgi_apps

    assert checks.run_socket_routes(application) == [True]
    assert checks.run_socket_routes(asgi_apps.unchecked) == [False]
    assert checks.run_socket_routes(asgi_apps.nested_unchecked) == [True, False]
    assert checks.run_socket_routes(asgi_apps.opaque) == []


# ---- W007 / W008: the one-process setup with DEBUG = False ------------------------------------


def test_w007_inprocess_execution_without_debug() -> None:
    with override_settings(DEBUG=False, STREAMRECOVER={"EXECUTION": "inprocess"}, CHANNEL_LAYERS=REDIS_LAYER):
        assert ids(checks.check_single_process_in_production()) == ["streamrecover.W007"]
    with override_settings(DEBUG=True, STREAMRECOVER={"EXECUTION": "inprocess"}, CHANNEL_LAYERS=REDIS_LAYER):
        assert checks.check_single_process_in_production() == []


def test_w008_in_memory_layer_without_debug() -> None:
    with override_settings(DEBUG=False, STREAMRECOVER={"EXECUTION": "inprocess"}, CHANNEL_LAYERS=MEMORY_LAYER):
        assert ids(checks.check_single_process_in_production()) == ["streamrecover.W007", "streamrecover.W008"]
    with override_settings(DEBUG=True, STREAMRECOVER={"EXECUTION": "inprocess"}, CHANNEL_LAYERS=MEMORY_LAYER):
        assert checks.check_single_process_in_production() == []
    # With Celery, W002 already says it; the distributed setup is quiet here.
    with override_settings(DEBUG=False, STREAMRECOVER=CELERY, CHANNEL_LAYERS=MEMORY_LAYER):
        assert checks.check_single_process_in_production() == []
    with override_settings(DEBUG=False, STREAMRECOVER=CELERY, CHANNEL_LAYERS=REDIS_LAYER):
        assert checks.check_single_process_in_production() == []


# ---- W009: SQLite with deferred transactions --------------------------------------------------


def _sqlite(**options: Any) -> dict[str, Any]:
    return {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3", "OPTIONS": options}}


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_w009_sqlite_without_immediate_transactions() -> None:
    for bad in (_sqlite(), _sqlite(timeout=20), _sqlite(transaction_mode="DEFERRED", timeout=20)):
        with override_settings(DATABASES=bad):
            assert ids(checks.check_sqlite_transaction_mode()) == ["streamrecover.W009"]
    for good in (_sqlite(transaction_mode="IMMEDIATE", timeout=20), _sqlite(transaction_mode="EXCLUSIVE")):
        with override_settings(DATABASES=good):
            assert checks.check_sqlite_transaction_mode() == []
    postgres = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}}
    with override_settings(DATABASES=postgres):
        assert checks.check_sqlite_transaction_mode() == []
    # The demo's embedded database is quiet: tests/test_sqlite_concurrency.py runs the check there.


# ---- E002: Celery without a broker -------------------------------------------------------------


def test_e002_celery_without_a_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.setattr(checks, "celery_app_broker", lambda: None)
    with override_settings(STREAMRECOVER=CELERY, CELERY_BROKER_URL=None):
        assert ids(checks.check_celery_broker()) == ["streamrecover.E002"]
        assert "streamrecover.E002" in ids(run_checks(tags=["streamrecover"]))
    with override_settings(STREAMRECOVER=CELERY):
        from django.conf import settings

        del settings.CELERY_BROKER_URL
        assert ids(checks.check_celery_broker()) == ["streamrecover.E002"]


def test_e002_quiet_with_a_broker_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.setattr(checks, "celery_app_broker", lambda: None)
    with override_settings(STREAMRECOVER=CELERY, CELERY_BROKER_URL="redis://127.0.0.1:6379/0"):
        assert checks.check_celery_broker() == []
    with override_settings(STREAMRECOVER=CELERY, CELERY_BROKER_URL=None, CELERY_TASK_ALWAYS_EAGER=True):
        assert checks.check_celery_broker() == []
    with override_settings(STREAMRECOVER={"EXECUTION": "inprocess"}, CELERY_BROKER_URL=None):
        assert checks.check_celery_broker() == []
    with override_settings(STREAMRECOVER=CELERY, CELERY_BROKER_URL=None):
        monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:6379/1")
        assert checks.check_celery_broker() == []
        monkeypatch.delenv("CELERY_BROKER_URL")
        monkeypatch.setattr(checks, "celery_app_broker", lambda: "amqp://broker//")
        assert checks.check_celery_broker() == []


def test_e002_reads_the_broker_of_the_projects_celery_app() -> None:
    # The demo project's app (imported with it) reads CELERY_BROKER_URL from the settings.
    import project  # noqa: F401

    assert checks.celery_app_broker()


# ---- E003, W010: a failover to a provider of another wire format -----------------------------


def test_e003_a_failover_to_a_provider_that_cannot_take_the_clients_fields() -> None:
    gemini = {"PROXY_FAILOVER": {"anthropic": {"PROVIDER": "gemini", "MODEL": "gemini-2.5-pro"}}}
    with override_settings(STREAMRECOVER=gemini):
        assert ids(checks.check_proxy_failover()) == ["streamrecover.E003"]
        assert "streamrecover.E003" in ids(run_checks(tags=["streamrecover"]))


def test_w010_a_failover_from_an_openai_format_to_anthropic() -> None:
    for source in ("openai", "responses"):
        to_anthropic = {"PROXY_FAILOVER": {source: {"PROVIDER": "anthropic", "MODEL": "claude-sonnet-4-5"}}}
        with override_settings(STREAMRECOVER=to_anthropic):
            assert ids(checks.check_proxy_failover()) == ["streamrecover.W010"]


def test_e003_w010_quiet_where_the_fields_translate() -> None:
    for failover in (
        {"anthropic": {"PROVIDER": "openai", "MODEL": "gpt-4o"}},
        {"openai": {"PROVIDER": "openai-responses", "MODEL": "gpt-5"}},
        {"responses": {"PROVIDER": "fake", "MODEL": "gpt-4o"}},
        {"anthropic": {"PROVIDER": "fake", "MODEL": "claude-x"}},
        None,
    ):
        with override_settings(STREAMRECOVER={"PROXY_FAILOVER": failover}):
            assert checks.check_proxy_failover() == []
