"""The harness's report: what was done to the stack, each check's count, the evidence of failures."""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from typing import Any

import httpx

from . import checks
from .plan import Plan
from .stack import Stack

EVIDENCE_LINES = 8  # failures printed per check (all of them are in the count)


def report(
    args: argparse.Namespace, plan: Plan, stack: Stack, outcome: dict[str, Any], expected: dict[str, Any]
) -> int:
    from django.db import close_old_connections

    close_old_connections()
    log = outcome["log"]
    runs = checks.load_runs(outcome["run_ids"])
    threads = checks.load_threads(runs)
    fake_log = httpx.get(f"{stack.fake_url}/_fake/log", params={"scenario": "default"}, timeout=30).json()
    entries = fake_log["entries"]
    _save_evidence(stack, runs, threads, entries, outcome["watched"])
    # when each worker was killed, and its process group (the tool's lines carry theirs)
    (stack.workdir / "worker-kills.json").write_text(json.dumps(log.worker_kills))
    checkpoint_check = _checkpoints_after_sweeps(stack.redis_url)
    results = [
        checks.check_terminal(runs),
        checks.check_answers(runs, threads, expected),
        checks.check_clients(runs, threads, outcome["watched"]),
        checks.check_attempt_overlap(runs),
        checks.check_tools(
            runs, threads, checks.read_tool_log(stack.tool_log), log.worker_kills, checks.load_tool_results(runs)
        ),
        checks.check_billing(runs, threads, entries),
        checkpoint_check,
    ]
    statuses = Counter(run.status for run in runs.values())
    hits = [e for e in entries if e.get("fault_triggered") or e.get("status", 200) != 200]
    triggered = Counter((e.get("fault") or {}).get("kind", "ok") for e in hits)
    print()
    print(f"chaos report (seed {args_seed(plan)}; {outcome['elapsed']:.0f}s under fire)")
    print(f"  runs: {len(runs)} ({', '.join(f'{n} {s}' for s, n in statuses.most_common())})")
    print(f"  provider calls: {len(entries)}, faults that hit: {sum(triggered.values())} ({_counts(triggered)})")
    print(
        f"  chaos: {len(log.worker_kills)} worker SIGKILLs, {len(log.redis_restarts)} Redis restarts,"
        f" {sum(n for _, n in log.pg_terminated)} PostgreSQL connections terminated in {len(log.pg_terminated)} rounds"
    )
    watched = outcome["watched"].values()
    print(
        f"  clients: {len(watched)} watched, {sum(w.connects for w in watched)} connects,"
        f" {sum(w.resyncs for w in watched)} resyncs after a seq gap"
    )
    claims = Counter(run.claims for run in runs.values())
    print(f"  claims per run: {_counts(claims)}")
    failed_runs = [run for run in runs.values() if run.status in ("failed", "exhausted")]
    for run in failed_runs[:EVIDENCE_LINES]:
        print(f"    {run.status} {run.pk}: {run.error_kind} {run.error_message[:160]!r}")
    for check in results:
        print("  " + check.line())
        for note in check.notes[:3]:
            print(f"        note: {note}")
        for failure in check.failures[:EVIDENCE_LINES]:
            print(f"        {failure}")
        if len(check.failures) > EVIDENCE_LINES:
            print(f"        ... and {len(check.failures) - EVIDENCE_LINES} more")
    dead = [p.name for p in stack.dead()]
    if dead:
        print(f"  processes that exited on their own: {', '.join(dead)}")
    ok = all(check.ok for check in results)
    print(f"chaos: {'all checks held' if ok else 'CHECKS FAILED'}")
    return 0 if ok else 1


def _save_evidence(
    stack: Stack, runs: dict[str, Any], threads: dict[str, Any], entries: list[Any], watched: dict[str, Any]
) -> None:
    """The billing log, and each run's attempts and thread, beside the processes' logs."""
    from streamrecover.models import Attempt

    (stack.workdir / "fake-log.json").write_text(json.dumps(entries, indent=1, default=str))
    summary = {
        tag: {
            "run_id": str(run.pk), "status": run.status, "claims": run.claims, "error": run.error_message,
            "attempts": list(Attempt.objects.of_run(run.pk).values(
                "index", "turn", "kind", "outcome", "started_at", "ended_at", "provider_request_id",
                "output_tokens", "interrupt_cause")),
            "thread": threads[tag],
        }
        for tag, run in runs.items()
    }  # fmt: skip
    (stack.workdir / "runs.json").write_text(json.dumps(summary, indent=1, default=str))
    clients = {
        tag: {
            "connects": seen.connects, "resyncs": seen.resyncs, "status": seen.status, "errors": seen.errors,
            "gaps": seen.view.gaps,
            "messages": seen.view.messages, "turns": seen.view.turns, "frames": seen.frames,
        }
        for tag, seen in watched.items()
    }  # fmt: skip
    (stack.workdir / "clients.json").write_text(json.dumps(clients, indent=1, default=str))


def args_seed(plan: Plan) -> str:
    return plan.runs[0].tag.split("-")[1] if plan.runs else "?"


def _counts(counter: Counter[Any]) -> str:
    return ", ".join(f"{key}: {n}" for key, n in sorted(counter.items(), key=lambda kv: str(kv[0])))


def _checkpoints_after_sweeps(redis_url: str, wait_s: float = 8.0) -> checks.Check:
    """Checkpoints of settled runs are deleted when the run ends or by a later sweep: give the
    sweeper (every second) a few rounds before counting what is left."""
    deadline = time.monotonic() + wait_s
    while True:
        check = checks.check_checkpoints(redis_url)
        if check.ok or time.monotonic() > deadline:
            return check
        time.sleep(1.0)
