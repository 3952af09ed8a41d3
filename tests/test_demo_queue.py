"""The demo project's ``CELERY_QUEUE``: the queue its runs are sent to is the one its workers consume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# In a fresh interpreter (the demo's settings read the environment once, at import): where
# Celery's router sends the run task, and the queues a worker of this app consumes by default.
SCRIPT = """
import json, os
os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
import django
django.setup()
from project.celery import app
import streamrecover.tasks
route = app.amqp.router.route({}, "streamrecover.execute_run")
print(json.dumps({"sent_to": route["queue"].name, "consumed": sorted(app.amqp.queues)}))
"""


def _queues(queue: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_QUEUE", "DJANGO_SETTINGS_MODULE")}
    if queue is not None:
        env["CELERY_QUEUE"] = queue
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_runs_go_through_the_named_queue_and_workers_consume_it() -> None:
    assert _queues("site-a") == {"sent_to": "site-a", "consumed": ["site-a"]}


def test_without_it_celerys_default_queue() -> None:
    assert _queues(None) == {"sent_to": "celery", "consumed": ["celery"]}
