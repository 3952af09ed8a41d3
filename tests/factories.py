"""Plain factory functions: a valid row with sensible defaults, any field overridable."""

from __future__ import annotations

import itertools
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from streamrecover.engine.checkpoint import Checkpoint
from streamrecover.models import Attempt, Message, RecoveryEvent, Run, Thread

_counter = itertools.count(1)


def make_user(**fields: Any) -> Any:
    n = next(_counter)
    fields.setdefault("username", f"user{n}")
    return get_user_model().objects.create_user(password="pw", **fields)


def make_thread(**fields: Any) -> Thread:
    fields.setdefault("title", f"Thread {next(_counter)}")
    return Thread.objects.create(**fields)


def make_run(**fields: Any) -> Run:
    if "thread" not in fields:
        fields["thread"] = make_thread(owner=fields.get("owner"))
    fields.setdefault("provider", "fake")
    fields.setdefault("model", "fake-model")
    return Run.objects.create(**fields)


def make_message(thread: Thread | None = None, **fields: Any) -> Message:
    thread = thread or make_thread()
    if "position" not in fields:
        fields["position"] = thread.messages.count()
    fields.setdefault("role", "user")
    fields.setdefault("content", [{"type": "text", "text": "Hello"}])
    return Message.objects.create(thread=thread, **fields)


def make_attempt(run: Run | None = None, **fields: Any) -> Attempt:
    run = run or make_run()
    if "index" not in fields:
        fields["index"] = run.attempts.count()
    fields.setdefault("kind", Attempt.Kind.INITIAL)
    return Attempt.objects.create(run=run, **fields)


def make_event(run: Run | None = None, name: str = "llm_stream_interrupted", **fields: Any) -> RecoveryEvent:
    run = run or make_run()
    fields.setdefault("provider", run.provider)
    fields.setdefault("model", run.model)
    fields.setdefault("payload", {"provider": run.provider, "model": run.model, "run_id": str(run.pk)})
    fields.setdefault("created", timezone.now())
    return RecoveryEvent.objects.create(run=run, name=name, **fields)


def make_checkpoint(run_id: str, **fields: Any) -> Checkpoint:
    fields.setdefault("turn", 0)
    fields.setdefault("history_len", 1)
    fields.setdefault("blocks", [{"type": "text", "text": "Partial answ"}])
    fields.setdefault("updated_at", time.time())
    return Checkpoint(run_id=run_id, **fields)


def tool_results(run: Run) -> list[dict[str, Any]]:
    """The tool_result blocks of the run's thread, in order."""
    return [
        block
        for message in Message.objects.of_thread(run.thread_id).canonical()
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
