"""The demo project's LOGGING: a configured API key in an exception's message never reaches the
console, in either format, through structlog or a stdlib logger (Django's own included).

Each case runs in a subprocess: ``project.settings`` configures structlog and logging for the
whole process, and Django's default ``django`` handler is only there under those settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KEY = "AIzaSyD-THIS-IS-A-SECRET-KEY-0123456789"

SCRIPT = """
import logging
import django
import structlog

django.setup()
try:
    raise RuntimeError("upstream said: bad url ...:streamGenerateContent?key=" + {key!r})
except RuntimeError:
    structlog.get_logger("streamrecover").exception("structlog_call_failed")
    logging.getLogger("django.request").error("stdlib_call_failed", exc_info=True)
"""


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_a_traceback_holding_a_configured_key_is_logged_without_it(log_format: str) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DJANGO_DEBUG": "1",  # Django's own console handler is on only then
        "LOG_FORMAT": log_format,
        "GEMINI_API_KEY": KEY,
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(key=KEY)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "structlog_call_failed" in output
    assert "stdlib_call_failed" in output
    assert KEY not in output
    # both tracebacks are there, scrubbed, each once (not a second, raw copy from Django's handler)
    assert output.count("streamGenerateContent?key=[redacted]") == 2, output
