"""Concurrent runs in one process on the embedded SQLite database (issue 10).

Run by ``tests/test_sqlite_concurrency.py`` in a subprocess with ``tests.settings_sqlite``:
migrates a fresh SQLite file, then ``CLIENTS`` client threads (as request threads of the web
process would) each hold a conversation of ``TURNS`` turns: create the run (the first in a new
thread, then follow-ups), start it in its own thread as the one-process mode does
(``starter.start_in_thread``) and join it. Prints one JSON line: every run's status and error,
the errors the clients met, anything that escaped a thread, threads still alive, and
the ids of streamrecover's system checks that fire on these settings.

    python -m tests.sqlite_concurrency CLIENTS TURNS [PROMPT [FAULT...]]
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

import django

JOIN_SECONDS = 120.0


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings_sqlite")
    django.setup()

    from django.core.checks import run_checks
    from django.core.management import call_command
    from django.db import close_old_connections

    from streamrecover import starter
    from streamrecover.models import Run
    from streamrecover.runs import lifecycle

    clients, turns = int(sys.argv[1]), int(sys.argv[2])
    prompt = sys.argv[3] if len(sys.argv) > 3 else "Hello"
    faults = sys.argv[4:]
    call_command("migrate", verbosity=0)
    escaped: list[str] = []
    threading.excepthook = lambda args: escaped.append(f"{args.exc_type.__name__}: {args.exc_value}")
    lock = threading.Lock()
    ids: list[str] = []
    client_errors: list[str] = []
    stuck: list[str] = []
    start = threading.Barrier(clients)

    def client() -> None:
        thread: Any = None
        start.wait(JOIN_SECONDS)
        try:
            for _ in range(turns):
                try:
                    run = lifecycle.create_run(prompt=prompt, provider="fake", thread=thread, faults=faults)
                except Exception as exc:
                    with lock:
                        client_errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                thread = run.thread
                with lock:
                    ids.append(str(run.pk))
                executing = starter.start_in_thread(str(run.pk))
                executing.join(JOIN_SECONDS)
                if executing.is_alive():
                    with lock:
                        stuck.append(executing.name)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=client, name=f"client-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_SECONDS * turns)
        if t.is_alive():
            stuck.append(t.name)
    found = {str(r.pk): r for r in Run.objects.filter(pk__in=ids)}
    report = {
        "runs": {run_id: [found[run_id].status, found[run_id].error_message] for run_id in ids},
        "client_errors": client_errors,
        "escaped": escaped,
        "stuck": stuck,
        "checks": sorted({m.id for m in run_checks(tags=["streamrecover"]) if m.id}),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
