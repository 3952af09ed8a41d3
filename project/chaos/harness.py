"""The chaos harness's command: start the stack, launch the runs under fire, check, report, clean up.

``python -m project.chaos --runs 100`` (``make chaos``). Exits 0 when every check held, 1 when
one failed, 2 when the harness itself could not run (a process did not start, ...). Every
process it started is ended and its database dropped, on Ctrl-C and failures too; the logs
stay in the printed directory when something failed (or with ``--keep-logs``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from .plan import Plan, make_plan
from .stack import Database, Stack, StackError

HARNESS_APPLICATION = "chaos-harness"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m project.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="concurrent runs to launch (default 100)")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=4, help="prefork children per worker (default 4)")
    parser.add_argument(
        "--runs-per-process",
        type=int,
        default=2,
        help="runs each worker process (prefork child) streams at once, WORKER_MAX_RUNS (default 2)",
    )
    parser.add_argument("--seed", type=int, default=None, help="the seed of the runs and faults (default: random)")
    parser.add_argument("--fault-rate", type=float, default=0.35, help="share of provider calls given a fault")
    parser.add_argument("--kill-every", type=float, default=6.0, help="seconds between worker SIGKILLs (0: none)")
    parser.add_argument("--kills", type=int, default=None, help="at most this many worker kills (default: no cap)")
    parser.add_argument("--redis-restarts", type=int, default=1, help="Redis restarts during the load (default 1)")
    parser.add_argument("--pg-every", type=float, default=8.0, help="seconds between connection kills (0: none)")
    parser.add_argument("--tool-block", type=float, default=3.0, help="seconds the recording tool blocks (default 3)")
    parser.add_argument("--tools-every", type=int, default=4, help="every Nth run uses the tool (0: none)")
    parser.add_argument("--event-delay", type=float, default=0.01, help="the fake provider's seconds between events")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the runs get to end (default 600)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="the PostgreSQL server (its database name prefixes the harness's own database)",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs even when all checks hold")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    workdir = Path(tempfile.mkdtemp(prefix="streamrecover-chaos-"))
    base_name = (urlsplit(args.database_url).path.lstrip("/") or "postgres").replace("-", "_")
    database = Database(args.database_url, f"{base_name}_chaos_{uuid.uuid4().hex[:8]}")
    print(
        f"chaos: seed {seed}, {args.runs} runs, {args.workers} workers x {args.concurrency}"
        f" x {args.runs_per_process} runs, logs in {workdir}"
    )
    code = 2
    try:
        database.create()
        with Stack(workdir, database.url, args.event_delay, args.tool_block) as stack:
            stack.env["CHAOS_WORKER_MAX_RUNS"] = str(args.runs_per_process)
            code = _run(args, seed, stack, database)
    except StackError as exc:
        print(f"chaos: the stack did not start: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("chaos: interrupted; every process was stopped", file=sys.stderr)
        code = 130
    finally:
        try:
            _close_django()
            database.drop()
        except Exception as exc:  # the report matters more than the cleanup's error
            print(f"chaos: could not drop {database.name}: {exc}", file=sys.stderr)
        if code == 0 and not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"chaos: logs kept in {workdir}")
    return code


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _close_django() -> None:
    if "django.db" in sys.modules:
        from django.db import connections

        connections.close_all()


def _setup_django(stack: Stack, database: Database) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="project.chaos.settings",
        DATABASE_URL=database.url,
        REDIS_URL=stack.redis_url,
        CHAOS_ROLE="harness",
        DJANGO_DEBUG="0",
        LOG_LEVEL="WARNING",
    )
    os.environ.pop("CHAOS_TOOL_LOG", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _login() -> str:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_user("chaos", password=uuid.uuid4().hex)
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


def _run(args: argparse.Namespace, seed: int, stack: Stack, database: Database) -> int:
    stack.start_redis()
    _setup_django(stack, database)
    plan = make_plan(args.runs, seed, args.fault_rate, args.tools_every)
    from .references import references

    started = time.monotonic()
    expected = references(plan.runs)
    print(f"chaos: {len(expected)} uninterrupted answers computed in {time.monotonic() - started:.1f}s")
    session_key = _login()
    stack.start_fake()
    httpx.post(f"{stack.fake_url}/_fake/faults", json={"scenario": "default", "faults": plan.faults}, timeout=10)
    stack.start_web()
    for index in range(args.workers):
        stack.start_worker(index, args.concurrency)
    for worker in stack.workers:
        worker.wait_for_log("ready.", 90)
    stack.start_beat()
    print(f"chaos: stack up (redis :{stack.redis_port}, fake :{stack.fake_port}, daphne :{stack.web_port})")
    outcome = asyncio.run(_load(args, seed, plan, stack, database, session_key))
    from .report import report

    return report(args, plan, stack, outcome, expected)


async def _load(
    args: argparse.Namespace, seed: int, plan: Plan, stack: Stack, database: Database, session_key: str
) -> dict[str, Any]:
    from asgiref.sync import sync_to_async

    from .load import ChaosLog, Session, Watched, monkey, start_run, watch

    session = Session(session_key)
    log = ChaosLog()
    stop = asyncio.Event()
    began = time.monotonic()
    deadline = began + args.timeout
    async with httpx.AsyncClient(timeout=10) as client:
        created = await asyncio.gather(*(start_run(client, stack, session, spec) for spec in plan.runs))
    run_ids = {spec.tag: answer["run_id"] for spec, answer in zip(plan.runs, created, strict=True)}
    print(f"chaos: {len(run_ids)} runs started in {time.monotonic() - began:.1f}s")
    watched = {spec.tag: Watched(answer["run_id"]) for spec, answer in zip(plan.runs, created, strict=True)}
    watchers = [
        asyncio.ensure_future(
            watch(stack, session, watched[spec.tag], answer["ws_url"], deadline + 20, delay=0.1 * spec.index)
        )
        for spec, answer in zip(plan.runs, created, strict=True)
    ]
    chaos = asyncio.ensure_future(
        monkey(
            stack, database, log, random.Random(seed), stop,
            kill_every=args.kill_every, max_kills=args.kills, redis_restarts=args.redis_restarts,
            pg_every=args.pg_every, harness_application=HARNESS_APPLICATION,
        )
    )  # fmt: skip

    @sync_to_async
    def active() -> int:
        from django.db import close_old_connections

        from streamrecover.models import Run

        close_old_connections()
        return Run.objects.filter(pk__in=list(run_ids.values())).exclude(status__in=Run.TERMINAL_STATUSES).count()

    left = len(run_ids)
    while time.monotonic() < deadline:
        try:
            left = await active()
        except Exception:  # the harness's query met the chaos: ask again
            left = -1
        if left == 0:
            break
        if chaos.done():
            chaos.result()  # the monkey's own failure is the harness's
        await asyncio.sleep(0.5)
    stop.set()
    await chaos
    elapsed = time.monotonic() - began
    print(f"chaos: runs ended after {elapsed:.1f}s ({left} still active)")
    # the clients get a moment for the last frames; then those still waiting are given up on
    _, pending = await asyncio.wait(watchers, timeout=20)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return {"run_ids": run_ids, "watched": watched, "log": log, "elapsed": elapsed}
