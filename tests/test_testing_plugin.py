"""The host-project testing kit: the plugin's settings override, the reports, ``assert_recovered``
failing when it should, and the README's example being the file the suite runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings

from streamrecover.conf import app_settings
from streamrecover.testing.host import FakeProvider, assert_recovered

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "test_readme_testing_example.py"


def readme_block(heading: str) -> str:
    """The first ```python block of the README section ``heading``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block in the README section {heading!r}"
    return match.group(1)


def test_the_readme_example_is_the_test_the_suite_runs():
    assert readme_block("Testing your project") == EXAMPLE.read_text(encoding="utf-8")


def test_the_fixture_points_every_built_in_provider_at_the_fake_and_restores_the_settings(streamrecover_fake_server):
    before = settings.STREAMRECOVER
    with FakeProvider(streamrecover_fake_server, scenario="pointing") as fake:
        for name in ("fake", "anthropic", "openai", "fake-openai"):
            config = app_settings.provider_config(name)
            assert config.base_url.startswith(streamrecover_fake_server.base_url), name
            assert config.extra_headers["x-fake-scenario"] == "pointing"
        assert app_settings.provider_config("openai").base_url.endswith("/v1")
        assert app_settings.BACKOFF_SCALE == 0.0
        fake.script("cut:bytes=10;ok")
        assert fake.pending_faults == ["cut:bytes=10", "ok"]
    assert settings.STREAMRECOVER is before
    assert app_settings.PROVIDERS["anthropic"]["BASE_URL"] == "https://api.anthropic.com"
    assert streamrecover_fake_server.pending_faults("pointing") == []  # forgotten with the test


@pytest.mark.django_db(transaction=True)
def test_assert_recovered_fails_when_nothing_broke(streamrecover_fake):
    report = streamrecover_fake.run("Hello [[words=20]]", faults=["cut:bytes=999999"])  # beyond the stream
    assert report.status == "completed"
    assert report.interruptions == []
    with pytest.raises(AssertionError, match="no provider stream broke"):
        assert_recovered(report)


@pytest.mark.django_db(transaction=True)
def test_assert_recovered_fails_on_an_exhausted_run_and_names_its_wrong_expectations(streamrecover_fake):
    faults = ["cut:bytes=1500", "cut:events=6", "cut:events=6"]
    report = streamrecover_fake.run("Hello [[words=200]]", faults=faults, engine={"max_continuations": 1})
    assert report.status != "completed"
    with pytest.raises(AssertionError, match="the run ended") as failure:
        assert_recovered(report, interruptions=1, cause="idle_timeout")
    assert "not 1" in str(failure.value)
    assert "not all 'idle_timeout'" in str(failure.value)


@pytest.mark.django_db(transaction=True)
@pytest.mark.streamrecover_faults("cut:events=10", "ok")
def test_the_mark_scripts_the_fake_and_the_openai_entry_speaks_chat_completions(streamrecover_fake):
    report = streamrecover_fake.run("Hello [[words=60]]", provider="fake-openai", model="gpt-4o")
    assert_recovered(report, interruptions=1)
    assert [entry.provider for entry in streamrecover_fake.requests] == ["openai", "openai"]
    assert report.view is not None
    assert report.view.text() == report.assistant_text


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("provider", "model", "base"), [("openai-responses", "gpt-4o", "/v1"), ("gemini", "gemini-2.0-flash", "")]
)
def test_the_responses_and_gemini_providers_are_pointed_at_the_fake_too(streamrecover_fake, provider, model, base):
    """Built-in adapters both: left alone, a test's run would call the real API (or fail for want of its key)."""
    assert app_settings.provider_config(provider).base_url == streamrecover_fake.server.base_url + base
    report = streamrecover_fake.run("Hello [[words=60]]", faults=["cut:events=8"], provider=provider, model=model)
    assert_recovered(report, interruptions=1)
    assert [entry.provider for entry in streamrecover_fake.requests] == [provider, provider]
