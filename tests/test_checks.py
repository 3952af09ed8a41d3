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
    assert [m for m in run_checks(tags=["streamrecover"])] == []


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


@pytest.mark.parametrize(
    "celery_settings",
    [
        # At the visibility timeout.
        {"CELERY_TASK_TIME_LIMIT": 3600, "CELERY_BROKER_TRANSPORT_OPTIONS": {"visibility_timeout": 3600}},
        # Above Redis's default visibility timeout (3600 s) with no transport options.
        {"CELERY_TASK_TIME_LIMIT": 7200, "CELERY_BROKER_TRANSPORT_OPTIONS": {}},
        # No time limit at all with a Redis broker.
        {"CELERY_TASK_TIME_LIMIT": None, "CELERY_BROKER_TRANSPORT_OPTIONS": {}},
    ],
)
def test_w001_time_limit_at_or_above_visibility(celery_settings: dict[str, Any]) -> None:
    with override_settings(STREAMRECOVER=CELERY, CELERY_BROKER_URL="redis://127.0.0.1:6379/0", **celery_settings):
        assert ids(checks.check_celery_time_limit()) == ["streamrecover.W001"]


def test_w001_quiet_below_visibility() -> None:
    with override_settings(
        STREAMRECOVER=CELERY,
        CELERY_BROKER_URL="redis://127.0.0.1:6379/0",
        CELERY_TASK_TIME_LIMIT=1800,
        CELERY_BROKER_TRANSPORT_OPTIONS={},
    ):
        assert checks.check_celery_time_limit() == []
    with override_settings(
        STREAMRECOVER=CELERY,
        CELERY_TASK_TIME_LIMIT=5000,
        CELERY_BROKER_TRANSPORT_OPTIONS={"visibility_timeout": 6000},
    ):
        assert checks.check_celery_time_limit() == []


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
