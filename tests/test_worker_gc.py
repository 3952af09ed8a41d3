"""A worker's run loop and the ASGI application tune their process's garbage collector as configured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# In a fresh interpreter on the demo's settings, with GC_THRESHOLD as given: starts the shared
# run loop (as a worker's first run does) or imports the demo's ASGI application (as Daphne
# does), and prints the collector's state before and after.
SCRIPT = """
import gc, json, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
import django
django.setup()
from django.conf import settings
from streamrecover.conf import app_settings
settings.STREAMRECOVER = {**getattr(settings, "STREAMRECOVER", {}), "GC_THRESHOLD": json.loads(sys.argv[1])}
app_settings.reload()
before = {"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}
if sys.argv[2] == "worker":
    from streamrecover.runs.loop import run_on_shared_loop
    async def one_run():
        return 1
    assert run_on_shared_loop(one_run()) == 1
else:
    import project.asgi
print(json.dumps({"before": before, "after": {"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}}))
"""


def _collector_around(process: str, threshold: int | None) -> dict[str, dict[str, list[int] | int]]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(threshold), process],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("process", ["worker", "asgi"])
def test_what_is_loaded_is_frozen_and_the_young_threshold_raised(process: str) -> None:
    state = _collector_around(process, 20_000)
    assert state["before"]["frozen"] == 0
    assert state["after"]["frozen"] > 10_000  # Django's, Channels' and the app's objects
    assert state["after"]["threshold"] == [20_000, *state["before"]["threshold"][1:]]  # type: ignore[index]


@pytest.mark.parametrize("process", ["worker", "asgi"])
def test_none_leaves_the_collector_alone(process: str) -> None:
    state = _collector_around(process, None)
    assert state["after"] == state["before"]


@pytest.mark.parametrize("bad", [0, -5, "many", True, 1.5])
def test_a_bad_threshold_is_a_clear_settings_error(bad: object) -> None:
    from streamrecover.conf import validate

    assert any("GC_THRESHOLD" in problem for problem in validate({"GC_THRESHOLD": bad}))
