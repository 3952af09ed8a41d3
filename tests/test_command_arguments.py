"""A bad command-line value is a clear ``CommandError`` before anything is created: never a
traceback, never a run left ``running`` for the sweeper to retry."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from streamrecover.models import ProxyKey, Run

pytestmark = pytest.mark.django_db

RUN = ["streamrecover_run", "--provider", "fake", "--prompt", "hi", "--json"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*RUN, "--fault", "bogus"], "bogus"),
        ([*RUN, "--fault", "cut"], "cut"),
        ([*RUN, "--fault", "cut:bytes=abc"], "cut:bytes=abc"),
        ([*RUN, "--backoff-scale", "nan"], "finite"),
        ([*RUN, "--backoff-scale", "inf"], "finite"),
        ([*RUN, "--backoff-scale", "-1"], "non-negative"),
        ([*RUN, "--max-continuations", "-1"], "integer from 0"),
        ([*RUN, "--idle-timeout", "-3"], "positive"),
        ([*RUN, "--idle-timeout", "0"], "positive"),
        ([*RUN, "--enqueue", "--timeout", "-1"], "positive"),
        ([*RUN, "--max-tokens", "0"], "integer from 1"),
        (
            [*RUN[:2], "anthropic", "--api-key", "x", "--prompt", "hi", "--fault", "cut:bytes=10"],
            "fake provider",
        ),
    ],
)
def test_a_bad_run_argument_is_refused_before_the_run_exists(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command(*args)
    assert not Run.objects.exists()


def test_a_fault_for_a_real_provider_from_settings_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "x")
    with pytest.raises(CommandError, match="fake provider"):
        call_command("streamrecover_run", "--provider", "anthropic", "--prompt", "hi", "--fault", "cut:bytes=10")
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["streamrecover_sweep", "--seconds", "nan"], "finite"),
        (["streamrecover_sweep", "--seconds", "-5"], "non-negative"),
        (["streamrecover_sweep", "--queued-seconds", "-5"], "non-negative"),
        (["streamrecover_cancel", "not-a-uuid"], "UUID"),
        (["streamrecover_stats", "--window", "99999999999d"], "99999999999d"),
        (["streamrecover_fake_provider", "--port", "70000"], "port"),
        (["streamrecover_fake_provider", "--port", "-1"], "port"),
        (["streamrecover_chaos_proxy", "--upstream", "https://x", "--port", "-1"], "port"),
        (["streamrecover_chaos_proxy", "--upstream", "https://x", "--port", "70000"], "port"),
        (["streamrecover_fake_provider", "--host", "999.1.1.1", "--port", "0"], "cannot listen"),
        (["streamrecover_fake_provider", "--scenario", "nope"], "--faults"),
        (["streamrecover_fake_provider", "--event-delay", "-1"], "non-negative"),
    ],
)
def test_a_bad_argument_of_another_command_is_a_clear_error(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command(*args)


@pytest.mark.parametrize(
    "option", [["--max-tokens", "-1"], ["--max-concurrent", "-1"], ["--max-concurrent", "99999999999999999999"]]
)
def test_a_bad_proxy_key_limit_issues_no_key(option: list[str]) -> None:
    get_user_model().objects.create_user("alice")
    with pytest.raises(CommandError, match="integer from 1"):
        call_command("streamrecover_proxy_key", "alice", *option)
    assert not ProxyKey.objects.exists()
