"""The command line as a host project meets it: every option explained, the README's own example
provider by name, ``--model`` optional, ``--enqueue`` failing early and plainly, stdout left to
the JSON object even in a project that has not configured logging."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import CommandError
from django.test import override_settings

from streamrecover.models import Run

ROOT = Path(__file__).resolve().parents[1]


def _own_commands() -> list[tuple[str, str]]:
    return sorted((name, app) for name, app in get_commands().items() if name.startswith("streamrecover"))


def test_every_option_of_every_streamrecover_command_has_help() -> None:
    commands = _own_commands()
    assert {"streamrecover_run", "streamrecover_cancel", "streamrecover_sweep"} <= {name for name, _ in commands}
    missing = []
    for name, app in commands:
        command = load_command_class(app, name)
        assert (command.help or "").strip(), f"{name} has no help"
        parser = command.create_parser("manage.py", name)
        for action in parser._actions:
            if not (action.help or "").strip():
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def _deepseek(fake_server, **extra):
    return {
        "PROVIDERS": {
            "deepseek": {
                # the README's example provider, here served by the fake in the OpenAI wire format
                "ADAPTER": "openai",
                "BASE_URL": f"{fake_server.base_url}/v1",
                "API_KEY_ENV": "DEEPSEEK_API_KEY",
                "PREFIX_FLAG": True,
                "EXTRA_HEADERS": {"x-fake-scenario": "cli-deepseek"},
            }
        },
        "BACKOFF_SCALE": 0,
        **extra,
    }


@pytest.mark.django_db(transaction=True)
def test_a_provider_configured_by_name_runs_and_the_model_defaults(fake_server, settings, monkeypatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-deepseek-test")
    fake_server.set_faults("cli-deepseek", ["cut:bytes=900"])
    out = io.StringIO()
    with override_settings(
        STREAMRECOVER={**settings.STREAMRECOVER, **_deepseek(fake_server, DEFAULT_MODEL="deepseek-chat")}
    ):
        call_command(
            "streamrecover_run", "--provider", "deepseek", "--prompt", "A tale [[words=60]]", "--json", stdout=out
        )
    doc = json.loads(out.getvalue())
    assert doc["status"] == "completed"
    run = Run.objects.get(pk=doc["run_id"])
    assert (run.provider, run.model) == ("deepseek", "deepseek-chat")
    # the break was continued the DeepSeek way
    assert [a["strategy"] for a in doc["attempts"]] == [None, "prefix_flag"]
    assert [e.understood_as for e in fake_server.log_for("cli-deepseek")][-1] == "prefix_flag"


@pytest.mark.django_db(transaction=True)
def test_an_unknown_provider_names_the_configured_ones() -> None:
    with pytest.raises(CommandError, match=r"unknown provider 'nope'.*anthropic, fake, gemini, openai"):
        call_command("streamrecover_run", "--provider", "nope", "--prompt", "x", "--json", stdout=io.StringIO())
    assert not Run.objects.exists()


@contextlib.contextmanager
def current_celery_app(app):
    """``app`` as Celery's current app (what ``shared_task`` sends through), then the previous one."""
    from celery import _state

    previous = _state._tls.current_app
    _state._set_current_app(app)
    try:
        yield app
    finally:
        _state._set_current_app(previous)


@pytest.mark.django_db(transaction=True)
def test_enqueue_without_a_celery_app_fails_at_once_and_stores_nothing(settings) -> None:
    """No project Celery app loaded: Celery's fallback app has no broker. Said at once, not after ten minutes."""
    from celery import Celery

    fallback_like = Celery("default", fixups=[], set_as_current=False)
    started = time.monotonic()
    with (
        override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "EXECUTION": "celery"}),
        current_celery_app(fallback_like),
        pytest.raises(CommandError, match="no Celery app with a broker is loaded"),
    ):
        call_command("streamrecover_run", "--prompt", "x", "--enqueue", "--json", stdout=io.StringIO())
    assert time.monotonic() - started < 5
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_with_the_broker_down_fails_at_once_and_stores_nothing(settings) -> None:
    from celery import Celery

    unreachable = Celery("unreachable", broker="redis://127.0.0.1:1/0", set_as_current=False)
    started = time.monotonic()
    with (
        override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "EXECUTION": "celery"}),
        current_celery_app(unreachable),
        pytest.raises(CommandError, match=r"broker \(redis at 127\.0\.0\.1:1\) cannot be reached"),
    ):
        call_command("streamrecover_run", "--prompt", "x", "--enqueue", "--json", stdout=io.StringIO())
    assert time.monotonic() - started < 10
    assert not Run.objects.exists()


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_enqueue_with_no_worker_times_out_plainly(settings) -> None:
    """Broker up, nobody consuming: ``--timeout`` bounds the wait and the message says what to do."""
    import redis as redis_lib

    from project.celery import app

    redis_lib.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    started = time.monotonic()
    with (
        override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "EXECUTION": "celery"}),
        current_celery_app(app),
        pytest.raises(CommandError) as caught,
    ):
        call_command(
            "streamrecover_run", "--prompt", "x", "--enqueue", "--timeout", "1.5", "--json", stdout=io.StringIO()
        )
    assert 1.5 <= time.monotonic() - started < 10
    run = Run.objects.get()
    message = str(caught.value)
    assert f"run {run.pk} is still queued after 1.5 s: no worker took it (is a Celery worker running?)" in message
    assert f"streamrecover_cancel {run.pk}" in message
    redis_lib.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


BARE_SETTINGS = """
SECRET_KEY = "bare"
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "channels", "streamrecover"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": %(db)r}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STREAMRECOVER = {"BACKOFF_SCALE": 0}
"""


@pytest.fixture(scope="module")
def bare_host(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A host project that configures neither logging nor structlog, in a directory of its own."""
    where = tmp_path_factory.mktemp("bare_host")
    (where / "bare_settings.py").write_text(textwrap.dedent(BARE_SETTINGS % {"db": str(where / "db.sqlite3")}))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bare_settings", "PYTHONPATH": f"{where}{os.pathsep}{ROOT}"}
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=where, env=env, check=True, capture_output=True
    )
    return where, env


def test_json_is_alone_on_stdout_in_a_host_without_logging_configured(bare_host) -> None:
    where, env = bare_host
    done = subprocess.run(
        [sys.executable, "-m", "django", "streamrecover_run", "--prompt", "A tale [[words=60]]",
         "--fault", "cut:bytes=900", "--json"],
        cwd=where, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # nothing but the object
    assert doc["status"] == "completed"
    assert "llm_stream_interrupted" in [e["event"] for e in doc["events"]]
    # the run's log lines are there, on stderr
    assert "llm_stream_interrupted" in done.stderr


def test_the_live_view_is_not_mixed_with_log_lines(bare_host) -> None:
    where, env = bare_host
    done = subprocess.run(
        [sys.executable, "-m", "django", "streamrecover_run", "--prompt", "A tale [[words=40]]",
         "--fault", "cut:bytes=900"],
        cwd=where, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "[run completed]" in done.stdout
    assert "llm_stream_interrupted" not in done.stdout
    assert "llm_stream_interrupted" in done.stderr


@pytest.mark.django_db(transaction=True)
def test_every_log_line_of_a_run_carries_the_run_provider_and_model() -> None:
    import structlog

    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as lines:
        call_command(
            "streamrecover_run", "--provider", "fake", "--model", "fake-claude", "--prompt", "A tale [[words=40]]",
            "--fault", "cut:bytes=900", "--backoff-scale", "0", "--json", stdout=io.StringIO(),
        )  # fmt: skip
    run = Run.objects.get()
    during = [line for line in lines if line["event"] not in {"run_created"}]
    assert "llm_stream_interrupted" in [line["event"] for line in during]
    assert {(line["event"], line.get("run_id"), line.get("provider"), line.get("model")) for line in during} == {
        (line["event"], str(run.pk), "fake", "fake-claude") for line in during
    }
