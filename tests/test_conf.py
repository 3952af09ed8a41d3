"""``STREAMRECOVER`` settings: defaults, validation, override_settings, providers and keys."""

from __future__ import annotations

import dataclasses

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from streamrecover.conf import DEFAULTS, ENGINE_KEYS, FAKE_BASE_URL, app_settings, validate
from streamrecover.engine.config import EngineConfig
from streamrecover.providers.openai_chat import OpenAIChatAdapter
from streamrecover.providers.registry import ADAPTERS, get_adapter, register_adapter

SECRET = "sk-ant-api03-test-NOT-A-REAL-KEY-0123456789"


def test_defaults() -> None:
    with override_settings(STREAMRECOVER={}):
        assert app_settings.MAX_CONTINUATIONS == 5
        assert app_settings.BACKOFF_SCHEDULE == [1, 2, 4, 8, 16]
        assert app_settings.BACKOFF_SCALE == 1.0
        assert app_settings.MAX_REQUEST_RETRIES == 2
        assert app_settings.CHECKPOINT_TTL == 3600
        assert app_settings.FRAME_COALESCE_MS == 25
        assert app_settings.DEFAULT_PROVIDER == "fake"
        assert app_settings.EXECUTION == "inprocess"
        assert app_settings.MAX_CLAIMS == 3
        assert app_settings.HEARTBEAT_SECONDS == 5
        assert app_settings.STALE_AFTER_SECONDS == 30
        assert app_settings.REPLAY_BUFFER_FRAMES == 2000
        assert set(app_settings.PROVIDERS) == {"fake", "anthropic", "openai", "openai-responses", "gemini"}
        config = app_settings.engine_config()
    assert config.max_continuations == 5
    assert config.backoff_schedule == (1.0, 2.0, 4.0, 8.0, 16.0)
    assert config.idle_timeout_s == 60
    assert config.checkpoint_every_deltas == 64
    assert config.notify_model_of_discarded_tools is False


def test_every_engine_field_has_a_setting() -> None:
    assert set(ENGINE_KEYS.values()) == {f.name for f in dataclasses.fields(EngineConfig)}
    assert set(ENGINE_KEYS) <= set(DEFAULTS)


def test_test_settings_are_read() -> None:
    assert app_settings.BACKOFF_SCALE == 0.001
    assert app_settings.engine_config().backoff_scale == 0.001


def test_override_settings_is_obeyed_by_engine_config() -> None:
    with override_settings(
        STREAMRECOVER={"MAX_CONTINUATIONS": 2, "BACKOFF_SCHEDULE": [0.5, 3], "NOTIFY_MODEL_OF_DISCARDED_TOOLS": True}
    ):
        config = app_settings.engine_config()
        assert config.max_continuations == 2
        assert config.backoff_schedule == (0.5, 3.0)
        assert config.notify_model_of_discarded_tools is True
        assert app_settings.MAX_CONTINUATIONS == 2
    assert app_settings.engine_config().max_continuations == 5


def test_unknown_key_raises_naming_it_and_the_valid_keys() -> None:
    with override_settings(STREAMRECOVER={"MAX_CONTINUATION": 3}), pytest.raises(ImproperlyConfigured) as info:
        _ = app_settings.MAX_CONTINUATIONS
    message = str(info.value)
    assert "'MAX_CONTINUATION'" in message
    assert "MAX_CONTINUATIONS" in message
    assert "CHECKPOINT_STORE" in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("EXECUTION", "threads"),
        ("CHECKPOINT_STORE", "disk"),
        ("MAX_CONTINUATIONS", -1),
        ("MAX_CONTINUATIONS", "5"),
        ("BACKOFF_SCHEDULE", []),
        ("BACKOFF_JITTER", 2),
        ("DEFAULT_PROVIDER", "nope"),
        ("PROXY_MAX_BODY_BYTES", 0),
        ("PROXY_MAX_BODY_BYTES", "32MB"),
        ("PROXY_MAX_RESPONSE_BYTES", 0),
        ("PROXY_MAX_RESPONSE_BYTES", True),
        ("PROVIDERS", {"x": {"ADAPTER": "cohere", "BASE_URL": "https://x"}}),
        ("PROVIDERS", {"x": {"ADAPTER": "openai", "BASE_URL": "https://x", "TOKEN": "t"}}),
    ],
)
def test_invalid_values_raise(key: str, value: object) -> None:
    with override_settings(STREAMRECOVER={key: value}), pytest.raises(ImproperlyConfigured, match=key.split("_")[0]):
        app_settings.engine_config()


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _ = app_settings.NOT_A_SETTING


def test_validate_accepts_the_defaults() -> None:
    assert validate({}) == []
    assert validate(DEFAULTS) == []


def test_the_full_worker_wait_is_positive_or_none() -> None:
    """0 would hand a run back at once, and a lone full worker would take it again in a loop."""
    assert validate({"WORKER_FULL_WAIT_SECONDS": None}) == []
    assert validate({"WORKER_FULL_WAIT_SECONDS": 0.5}) == []
    for bad in (0, -1, "3", True):
        (problem,) = validate({"WORKER_FULL_WAIT_SECONDS": bad})
        assert "WORKER_FULL_WAIT_SECONDS" in problem


def test_fake_provider_is_the_default() -> None:
    config = app_settings.provider_config()
    assert config.name == "anthropic"
    assert config.base_url == FAKE_BASE_URL
    assert config.api_key == ""


def test_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    config = app_settings.provider_config("anthropic")
    assert config.api_key == SECRET
    assert config.base_url == "https://api.anthropic.com"
    assert SECRET not in repr(config)


def test_missing_api_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ImproperlyConfigured, match="OPENAI_API_KEY"):
        app_settings.provider_config("openai")


def test_api_key_from_settings_wins_and_providers_merge_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_KEY", "from-env-not-used")
    providers = {
        "deepseek": {
            "ADAPTER": "openai",
            "BASE_URL": "https://api.deepseek.com",
            "API_KEY": SECRET,
            "API_KEY_ENV": "DEEPSEEK_KEY",
            "PREFIX_FLAG": True,
            "STRATEGY_OVERRIDES": {"deepseek-*": "prefix_flag"},
            "EXTRA_HEADERS": {"x-team": "a"},
        }
    }
    with override_settings(STREAMRECOVER={"PROVIDERS": providers, "CONNECT_TIMEOUT": 3}):
        assert {"fake", "anthropic", "openai", "deepseek"} <= set(app_settings.PROVIDERS)
        config = app_settings.provider_config("deepseek")
        assert SECRET in app_settings.secret_values()
    assert config.api_key == SECRET
    assert config.prefix_flag is True
    assert dict(config.strategy_overrides) == {"deepseek-*": "prefix_flag"}
    assert dict(config.extra_headers) == {"x-team": "a"}
    assert config.connect_timeout_s == 3.0
    assert SECRET not in repr(config)


def test_api_keys_are_read_without_surrounding_whitespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key read from a secrets file ends in a newline: sent as it is, the HTTP client refuses
    the header; the key meant is the one without it, and that is the one redaction looks for."""
    monkeypatch.setenv("OPENAI_API_KEY", f"  {SECRET}-env\n")
    providers = {
        "anthropic": {"ADAPTER": "anthropic", "BASE_URL": "https://api.anthropic.com", "API_KEY": SECRET + "\n"}
    }
    with override_settings(STREAMRECOVER={"PROVIDERS": providers}):
        assert app_settings.provider_config("anthropic").api_key == SECRET
        assert app_settings.provider_config("openai").api_key == f"{SECRET}-env"
        assert {SECRET, f"{SECRET}-env"} <= set(app_settings.secret_values())
    monkeypatch.setenv("OPENAI_API_KEY", " \n")  # only whitespace: no key, said so
    with pytest.raises(ImproperlyConfigured, match="OPENAI_API_KEY"):
        app_settings.provider_config("openai")


def test_unknown_provider_is_improperly_configured() -> None:
    with pytest.raises(ImproperlyConfigured, match="'nope'"):
        app_settings.provider_config("nope")


def test_a_bad_api_key_type_is_reported_without_its_value() -> None:
    secret_bytes = SECRET.encode()
    providers = {"x": {"ADAPTER": "openai", "BASE_URL": "https://x", "API_KEY": secret_bytes}}
    problems = validate({"PROVIDERS": providers})
    assert problems
    assert all(SECRET not in p for p in problems)


# -- ADAPTER: whatever the one registry knows, and nothing else --------------------------------

DOTTED = "tests.test_adapter_openai.TaggedAdapter"


def test_a_dotted_path_adapter_validates_and_is_used() -> None:
    providers = {"custom": {"ADAPTER": DOTTED, "BASE_URL": "https://custom.invalid/v1", "API_KEY": "k"}}
    assert validate({"PROVIDERS": providers}) == []
    with override_settings(STREAMRECOVER={"PROVIDERS": providers}):
        config = app_settings.provider_config("custom")
    assert config.name == DOTTED
    assert type(get_adapter(config)).__name__ == "TaggedAdapter"


def test_a_registered_adapter_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ADAPTERS, "registered", OpenAIChatAdapter)
    register_adapter("registered", OpenAIChatAdapter)
    providers = {"r": {"ADAPTER": "registered", "BASE_URL": "https://r.invalid/v1"}}
    assert validate({"PROVIDERS": providers}) == []


@pytest.mark.parametrize("adapter", ["cohere", "no.such.module.Factory", "", None, 3])
def test_an_unknown_adapter_is_reported_with_the_known_ones(adapter: object) -> None:
    problems = validate({"PROVIDERS": {"x": {"ADAPTER": adapter, "BASE_URL": "https://x"}}})
    assert len(problems) == 1
    assert "['PROVIDERS']['x']['ADAPTER']" in problems[0]
    assert "'anthropic', 'gemini', 'openai'" in problems[0]
    bad = {"PROVIDERS": {"x": {"ADAPTER": adapter, "BASE_URL": "https://x"}}}
    with pytest.raises(ImproperlyConfigured, match="ADAPTER"), override_settings(STREAMRECOVER=bad):
        app_settings.provider_config("x")


def test_a_failover_that_is_no_dict_is_told_every_wire_format_it_may_name() -> None:
    (problem,) = validate({"PROXY_FAILOVER": ["anthropic"]})
    assert "'anthropic', 'openai', 'responses', 'gemini'" in problem
