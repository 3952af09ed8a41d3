"""The demo project's healing endpoint answers every wire format from the built-in fake, as the
README says: a format left on its default provider would call the real API, with no key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import django
django.setup()
from streamrecover.conf import app_settings
from streamrecover.testing import is_fake
for format in ("ANTHROPIC", "OPENAI", "RESPONSES", "GEMINI"):
    setting = f"PROXY_{format}_PROVIDER"
    name = getattr(app_settings, setting)
    config = app_settings.provider_config(name)
    print(setting, name, config.name, is_fake(config))
"""


def test_every_proxy_format_answers_from_the_fake_in_the_demo() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env |= {"DJANGO_SETTINGS_MODULE": "project.settings", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    # the demo's "fake" speaks Anthropic (OpenAI requests are translated); Gemini needs a Gemini adapter
    assert [(setting, adapter, fake) for setting, _, adapter, fake in rows] == [
        ("PROXY_ANTHROPIC_PROVIDER", "anthropic", "True"),
        ("PROXY_OPENAI_PROVIDER", "anthropic", "True"),
        ("PROXY_RESPONSES_PROVIDER", "openai-responses", "True"),
        ("PROXY_GEMINI_PROVIDER", "gemini", "True"),
    ]
