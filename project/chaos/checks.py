"""The promises checked after the chaos, each a count of what held and what did not.

Reads the harness's database (runs, attempts, committed messages), the fake provider's
billing log, the tool's execution log, the clients' views and the harness's Redis.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from streamrecover.models import Attempt, Message, Run, ToolCallResult
from streamrecover.runs.checkpoints import REDIS_KEY_PREFIX
from streamrecover.testing.client import comparable

from .load import TERMINAL, Watched
from .plan import RunSpec

JOINER_WINDOW = 256  # the most a continuation's joiner holds back (ContinuationJoiner's ``window``)


@dataclass
class Check:
    """One promise: how many cases were looked at, which failed (with evidence)."""

    name: str
    checked: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        mark = "PASS" if self.ok else "FAIL"
        return f"{mark}  {self.name}: {self.checked - len(self.failures)}/{self.checked} held"


def assistant_text(messages: list[dict[str, Any]]) -> str:
    return "".join(
        b.get("text", "") for m in messages if m["role"] == "assistant" for b in m["content"] if b.get("type") == "text"
    )


def _comparable_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": [comparable(b) for b in m["content"]]} for m in messages]


def check_terminal(runs: dict[str, Run]) -> Check:
    check = Check("every run terminal", checked=len(runs))
    for tag, run in runs.items():
        if run.status not in TERMINAL:
            check.failures.append(f"{tag} run {run.pk} is {run.status} (worker {run.worker!r}, claims {run.claims})")
    return check


def check_answers(
    runs: dict[str, Run], threads: dict[str, list[dict[str, Any]]], references: dict[str, list[dict[str, Any]]]
) -> Check:
    check = Check("completed run's committed thread == its uninterrupted answer")
    for tag, run in runs.items():
        if run.status != "completed":
            continue
        check.checked += 1
        got, want = threads[tag], references[tag]
        if got != want:
            got_text, want_text = assistant_text(got), assistant_text(want)
            check.failures.append(
                f"{tag} run {run.pk}: {len(got)} messages vs {len(want)} expected; assistant text"
                f" {len(got_text)} vs {len(want_text)} chars,"
                f" first difference at {_first_difference(got_text, want_text)}"
            )
    return check


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def check_clients(runs: dict[str, Run], threads: dict[str, list[dict[str, Any]]], watched: dict[str, Watched]) -> Check:
    """Each client ended with the committed thread's assistant messages, and at every commit it
    had reconstructed exactly the message committed."""
    check = Check("client's reconstruction == committed messages")
    for tag, seen in watched.items():
        run = runs[tag]
        if seen.connects == 0:
            check.notes.append(f"{tag}: the client never connected")
            continue
        if run.status not in TERMINAL:  # counted by the terminal check; nothing settled to compare
            check.notes.append(f"{tag}: the run never ended")
            continue
        check.checked += 1
        committed = [m for m in _comparable_messages(threads[tag]) if m["role"] == "assistant"]
        shown = [m for m in _comparable_messages(seen.view.messages) if m["role"] == "assistant"]
        problems = []
        if seen.status != run.status:
            problems.append(f"last status seen {seen.status!r}, the run is {run.status}")
        if shown != committed:
            problems.append(f"shows {len(shown)} assistant messages, {len(committed)} committed")
        for reconstructed, at_commit in seen.view.turns:
            if reconstructed != at_commit:
                problems.append("a streamed message differed from the message committed after it")
                break
        if seen.view.gaps:
            check.notes.append(f"{tag}: {seen.view.gaps} seq gaps")
        if problems:
            check.failures.append(f"{tag} run {run.pk} ({seen.connects} connects): " + "; ".join(problems))
    return check


def check_attempt_overlap(runs: dict[str, Run]) -> Check:
    """No two attempts of one run streamed at the same time. An attempt a killed worker left
    open (no end) cannot be placed in time: it is counted, not checked."""
    check = Check("no two attempts of a run streaming at once")
    open_attempts = 0
    for tag, run in runs.items():
        check.checked += 1
        attempts = list(Attempt.objects.of_run(run.pk))
        closed = [a for a in attempts if a.ended_at is not None]
        open_attempts += len(attempts) - len(closed)
        for i, a in enumerate(closed):
            for b in closed[i + 1 :]:
                if a.started_at < b.ended_at and b.started_at < a.ended_at:
                    check.failures.append(
                        f"{tag} run {run.pk}: attempt {a.index} ({a.kind}, {a.started_at:%H:%M:%S.%f}"
                        f"-{a.ended_at:%H:%M:%S.%f}) overlaps attempt {b.index} ({b.kind},"
                        f" {b.started_at:%H:%M:%S.%f}-{b.ended_at:%H:%M:%S.%f})"
                    )
                    break
            else:
                continue
            break
    check.notes.append(f"{open_attempts} attempts left open by killed workers (no end time)")
    return check


def read_tool_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_tool_results(runs: dict[str, Run]) -> dict[tuple[str, str], float]:
    """When each stored tool result was written (epoch seconds), by run id and call id."""
    rows = ToolCallResult.objects.filter(run__in=list(runs.values())).values_list("run_id", "tool_call_id", "created")
    return {(str(run_id), call_id): created.timestamp() for run_id, call_id, created in rows}


def check_tools(
    runs: dict[str, Run],
    threads: dict[str, list[dict[str, Any]]],
    executions: list[dict[str, Any]],
    kills: list[tuple[float, str, int]],
    stored: dict[tuple[str, str], float],
) -> Check:
    """Each committed tool call was executed once: the tool's log has as many lines for a call
    (its arguments) as the run's thread has calls with them.

    A repeat is a note, not a failure, in the window no store can close (the recovery notes'
    "Tool calls"): the execution before it ended, then its worker was SIGKILLed (``kills``: the
    process group's leader) before the result was stored: the call's stored result is newer than
    the repeat's start, so no result existed when the next claim looked. A repeat while a result
    was stored, or with no kill between the two, is a failure.
    """
    check = Check("no tool executed twice")
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in executions:
        by_run[str(line.get("run_id"))].append(line)
    unattributed = by_run.pop("None", [])
    if unattributed:
        check.notes.append(f"{len(unattributed)} executions carried no run id")
    repeats_after_kills = 0
    for tag, run in runs.items():
        calls: dict[str, list[str]] = defaultdict(list)  # the arguments, as JSON: the calls' ids
        for message in threads[tag]:
            for block in message["content"]:
                if block.get("type") == "tool_use":
                    calls[json.dumps(block.get("input"), sort_keys=True)].append(str(block.get("id")))
        lines = by_run.get(str(run.pk), [])
        if not calls and not lines:
            continue
        check.checked += 1
        by_args: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for line in lines:
            by_args[json.dumps(line.get("args"), sort_keys=True)].append(line)
        failed = False
        for args, made in by_args.items():
            made.sort(key=lambda line: float(line["started"]))
            ids = calls.get(args, [])
            # a run that ended before committing its call may still have made it once
            for before, repeat in zip(made, made[max(len(ids), 1) :], strict=False):
                if _lost_before_stored(str(run.pk), ids, before, repeat, kills, stored):
                    repeats_after_kills += 1
                else:
                    failed = True
        if failed:
            pids = sorted({line["pid"] for line in lines})
            count = sum(len(ids) for ids in calls.values())
            check.failures.append(
                f"{tag} run {run.pk}: {len(lines)} executions for {count} committed calls (processes {pids})"
            )
    if repeats_after_kills:
        check.notes.append(
            f"{repeats_after_kills} calls made again: the worker that made one was killed after the call "
            "ended, before its result was stored (what the call's idempotency key is for)"
        )
    return check


def _lost_before_stored(
    run_id: str,
    ids: list[str],
    before: dict[str, Any],
    repeat: dict[str, Any],
    kills: list[tuple[float, str, int]],
    stored: dict[tuple[str, str], float],
) -> bool:
    """True when ``before``'s worker was killed after that call started (it wrote its line, so
    after it ended: the harness notes a kill just before sending it) and before ``repeat``
    started, and the call's result was stored only after ``repeat`` started."""
    killed = any(
        pgid == before.get("pgid") and float(before["started"]) <= when <= float(repeat["started"])
        for when, _, pgid in kills
    )
    written = [stored[(run_id, call_id)] for call_id in ids if (run_id, call_id) in stored]
    return killed and bool(written) and min(written) > float(repeat["started"])


def check_billing(runs: dict[str, Run], threads: dict[str, list[dict[str, Any]]], log: list[dict[str, Any]]) -> Check:
    """No text billed twice: within each assistant turn, the text each provider response billed
    starts where its request's prefix ended; text billed again is a failure unless the response
    that first billed it was lost with its worker (``_after_a_lost_claim``) before the text was
    stored, which a kill cannot avoid (a note)."""
    check = Check("no text billed twice")
    rows = list(
        Attempt.objects.filter(run__in=list(runs.values())).values_list(
            "run_id", "index", "provider_request_id", "kind", "ended_at"
        )
    )
    attempts = {
        request_id: CallAttempt(str(run_id), index, kind, ended_at is not None)
        for run_id, index, request_id, kind, ended_at in rows
        if request_id
    }
    claimed_at: dict[str, list[int]] = defaultdict(list)  # run id -> the attempts that began a new claim
    for run_id, index, _, kind, _ in rows:
        if kind == "resume":
            claimed_at[str(run_id)].append(index)
    by_tag: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in log:
        tag = _tag_of(entry.get("request"), runs)
        if tag is not None:
            by_tag[tag].append(entry)
    lost_to_kills = trimmed = held_back = 0
    for tag, run in runs.items():
        entries = sorted(by_tag.get(tag, []), key=lambda e: e["seq"])
        if not entries:
            continue
        check.checked += 1
        ranges: dict[int, list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)  # turn -> billed spans
        twice = 0
        for entry in entries:
            turn = _turn_of(entry.get("request"))
            start = entry["prefix_chars"] if entry.get("prefix_matched") is not False else 0
            end = start + len(entry["billed_text"])
            for earlier_start, earlier_end, earlier in ranges[turn]:
                overlap = min(end, earlier_end) - max(start, earlier_start)
                if overlap <= 0:
                    continue
                again = earlier["billed_text"][max(start, earlier_start) - earlier_start :][:overlap]
                if _after_a_lost_claim(earlier, entry, attempts, claimed_at):
                    lost_to_kills += overlap
                elif _held_back_by_the_joiner(earlier, entry):
                    held_back += overlap
                elif not again.strip() and entry.get("prefix_matched") is not False:
                    trimmed += overlap
                else:
                    twice += overlap
            ranges[turn].append((start, end, entry))
        billed_total = sum(len(e["billed_text"]) for e in entries)
        committed = len(assistant_text(threads[tag]))
        if twice:
            check.failures.append(
                f"{tag} run {run.pk} ({run.status}): {twice} characters billed twice;"
                f" {billed_total} billed for {committed} committed over {len(entries)} requests"
            )
    check.notes.append(f"{lost_to_kills} characters streamed again after a worker was killed before storing them")
    # A prefill may not end with whitespace (the Anthropic API refuses it): the trailing
    # whitespace is trimmed from the prefix and the model writes it again.
    check.notes.append(f"{trimmed} characters of trailing whitespace written again after a prefill trim")
    # A continuation's first characters are held back until the joiner can tell whether the
    # model repeats the end of the prefix, starts over or goes on; a continuation cut before
    # then gave the engine nothing it could place, and the next one writes them again.
    check.notes.append(f"{held_back} characters of a continuation cut before it could be joined, written again")
    return check


def _held_back_by_the_joiner(earlier: dict[str, Any], later: dict[str, Any]) -> bool:
    """Whether the earlier response was a continuation cut while its joiner still held back
    all it had sent: nothing of it was kept (the later request goes on from the same prefix),
    and it sent less than the joiner's window (``engine.join.ContinuationJoiner``)."""
    return (
        earlier.get("understood_as") in ("continue_message", "prefill", "prefix_flag")
        and bool(earlier.get("fault_triggered"))
        and later.get("prefix_matched") is not False
        and earlier.get("prefix_chars") == later.get("prefix_chars")
        and len(earlier.get("billed_text") or "") <= JOINER_WINDOW
    )


@dataclass(frozen=True)
class CallAttempt:
    """The attempt row a provider request belongs to."""

    run_id: str
    index: int
    kind: str
    ended: bool


def _after_a_lost_claim(
    earlier: dict[str, Any],
    later: dict[str, Any],
    attempts: dict[str, CallAttempt],
    claimed_at: dict[str, list[int]],
) -> bool:
    """Whether text billed again was lost with a claim: the earlier response's worker died before
    it ended the attempt (or recorded it), or a new claim (a ``resume`` attempt) began after the
    earlier response's attempt and by the later one's: the earlier worker died between receiving
    the text and storing it, and the later request is the new claim's first or one of its retries
    (a 529 before the resumed stream started). A model that started over (its prefix not
    recognised) is never explained by a kill."""
    if later.get("prefix_matched") is False:
        return False
    first = attempts.get(earlier["request_id"])
    if first is None or not first.ended:
        return True
    then = attempts.get(later["request_id"])
    if then is None or then.run_id != first.run_id:
        return False
    return any(first.index < index <= then.index for index in claimed_at.get(first.run_id, []))


def _tag_of(request: Any, runs: dict[str, Run]) -> str | None:
    if not isinstance(request, dict):
        return None
    for message in request.get("messages") or []:
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        texts = [content] if isinstance(content, str) else [b.get("text", "") for b in blocks if isinstance(b, dict)]
        for text in texts:
            if isinstance(text, str) and text.startswith("Run chaos-"):
                tag = text.split(":", 1)[0].removeprefix("Run ")
                return tag if tag in runs else None
    return None


def _turn_of(request: Any) -> int:
    """Which assistant turn a request asks for: one more per tool result in its history."""
    turn = 0
    for message in request.get("messages") or []:
        if message.get("role") == "tool":
            turn += 1
        content = message.get("content")
        if isinstance(content, list):
            turn += sum(1 for b in content if isinstance(b, dict) and b.get("type") == "tool_result")
    return turn


def _text(value: bytes | str) -> str:
    """A Redis reply as text (redis-py gives bytes unless the client decodes)."""
    return value.decode() if isinstance(value, bytes) else value


def check_checkpoints(redis_url: str) -> Check:
    """No checkpoint of a settled (or deleted) run is left; an active run's is its own business.
    A run's fencing key (its highest claim epoch, ``<prefix>fence:<run>``) is not a checkpoint: it
    outlives the checkpoint on purpose, so a late writer stays refused, and expires by its TTL."""
    check = Check("no checkpoint left in Redis")
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        keys = [_text(k) for k in client.scan_iter(match=REDIS_KEY_PREFIX + "*", count=1000)]
        left = [k for k in keys if not k.endswith("index") and not k.startswith(REDIS_KEY_PREFIX + "fence:")]
        members = [_text(m) for m in client.smembers(REDIS_KEY_PREFIX + "index")]
    finally:
        client.close()
    active = {str(pk) for pk in Run.objects.filter(status__in=Run.ACTIVE_STATUSES).values_list("pk", flat=True)}
    left = [k for k in left if k.removeprefix(REDIS_KEY_PREFIX) not in active]
    members = [m for m in members if m not in active]
    check.checked = 1
    if left or members:
        check.failures.append(
            f"{len(left)} checkpoint keys and {len(members)} index members of settled runs: {left[:5]} {members[:5]}"
        )
    return check


def load_threads(runs: dict[str, Run]) -> dict[str, list[dict[str, Any]]]:
    return {tag: Message.objects.of_thread(run.thread_id).canonical() for tag, run in runs.items()}


def load_runs(run_ids: dict[str, str]) -> dict[str, Run]:
    found = Run.objects.in_bulk(list(run_ids.values()))
    return {tag: found[uuid.UUID(run_id)] for tag, run_id in run_ids.items()}


def spec_map(specs: list[RunSpec]) -> dict[str, RunSpec]:
    return {spec.tag: spec for spec in specs}
