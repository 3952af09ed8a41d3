"""The recorder: the sink that writes a run's events, attempts and committed messages to the database and logs.

The app emits; the project configures logging (django-structlog style). A log line and its
``RecoveryEvent`` row carry the same redacted fields, so what an operator greps and what
analytics counts never disagree. Writes run in asgiref's thread (``sync_to_async``), so the
runner's event loop is never blocked by the database. Given the worker's ``Fence``, every
write is one transaction that holds the run's row at the claim's epoch: a worker whose claim
was taken over writes nothing (``ClaimLost``), not even the log line.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog
from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Count, Q, Sum

from ..engine.sink import (
    DISCARDED_PARTIAL_TOOL_USE,
    DISCARDED_THINKING,
    LLM_STREAM_CONTINUATION_EXHAUSTED,
    LLM_STREAM_CONTINUATION_FAILED,
    LLM_STREAM_INTERRUPTED,
    AttemptRecord,
    BaseSink,
    StructuredEvent,
)
from ..models import Attempt, Message, RecoveryEvent, Run
from ..redaction import cut_secrets, redact, redact_request
from .fence import Fence

T = TypeVar("T")

logger = structlog.get_logger("streamrecover")

_LEVELS = {
    LLM_STREAM_INTERRUPTED: logging.WARNING,
    LLM_STREAM_CONTINUATION_FAILED: logging.WARNING,
    LLM_STREAM_CONTINUATION_EXHAUSTED: logging.ERROR,
    DISCARDED_PARTIAL_TOOL_USE: logging.INFO,
    DISCARDED_THINKING: logging.INFO,
}


def jsonable(value: Any) -> Any:
    """Plain JSON types only, so a log line and a JSON column hold the very same thing."""
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _dt(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, tz=UTC) if ts is not None else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class RecorderSink(BaseSink):
    """``RunSink`` for one run. ``on_frame`` does nothing: the publisher handles frames."""

    def __init__(
        self,
        run_id: str | uuid.UUID,
        thread_id: int,
        *,
        provider: str = "",
        model: str = "",
        fence: Fence | None = None,
    ) -> None:
        self.run_id = uuid.UUID(str(run_id))
        self.thread_id = thread_id
        self.provider = provider
        self.model = model
        self.fence = fence
        self._stored: set[int] = set()  # positions of messages stored with the run's end

    @classmethod
    def for_run(cls, run: Run, fence: Fence | None = None) -> RecorderSink:
        return cls(run.pk, run.thread_id, provider=run.provider, model=run.model, fence=fence)

    async def _write(self, fn: Callable[[], T]) -> T:
        """``fn``'s writes in one transaction; with a fence, only while the claim is current."""
        if self.fence is not None:
            return await self.fence.awrite(fn)
        return await sync_to_async(transaction.atomic(fn))()

    async def on_event(self, event: StructuredEvent) -> None:
        fields = redact(jsonable(event.fields))
        await self._write(
            lambda: RecoveryEvent.objects.create(
                run_id=self.run_id,
                attempt=_int_or_none(fields.get("attempt")),
                turn=_int_or_none(fields.get("turn_id", fields.get("turn"))),
                name=event.name,
                provider=str(fields.get("provider") or self.provider),
                model=str(fields.get("model") or self.model),
                payload=fields,
            )
        )
        logger.log(_LEVELS.get(event.name, logging.INFO), event.name, **fields)

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        """Upsert by (run, index): called when the attempt starts and again when it ends."""
        await self._write(lambda: self._store_attempt(attempt))

    def _store_attempt(self, attempt: AttemptRecord) -> None:
        usage = attempt.usage
        fields = {
            "turn": attempt.turn,
            "kind": attempt.kind,
            "continuation": attempt.continuation,
            "strategy": attempt.strategy or "",
            "status_code": attempt.status_code,
            "provider_request_id": attempt.request_id or "",
            "started_at": _dt(attempt.started_at),
            "first_byte_at": _dt(attempt.first_byte_at),
            "ended_at": _dt(attempt.ended_at),
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens,
            "cache_read_input_tokens": usage.cache_read_input_tokens,
            "bytes_received": attempt.bytes_received,
            "interrupt_cause": str(attempt.interrupt_cause or ""),
            "error_kind": str(attempt.error_kind or ""),
            "error_message": redact(attempt.error_message or ""),
            "stop_reason": str(attempt.stop_reason or ""),
            "outcome": str(attempt.outcome),
            "request": redact_request(jsonable(attempt.request)),
        }
        # One upsert on (run, index) (``INSERT ... ON CONFLICT DO UPDATE``): an attempt's start
        # and its end are one statement each. ``update_or_create`` took a savepoint, a locking
        # read and, at the start, a savepoint for the insert: all of it in the one thread a
        # worker's runs share for the ORM, where each statement waits for the GIL.
        Attempt.objects.bulk_create(
            [Attempt(run_id=self.run_id, index=attempt.index, **fields)],
            update_conflicts=True,
            unique_fields=["run", "index"],
            update_fields=list(fields),
        )
        if attempt.ended_at is not None:
            self._refresh_totals()

    def _refresh_totals(self) -> None:
        """Run totals from its attempt rows: recomputed, so a repeated call changes nothing."""
        totals = Attempt.objects.filter(run_id=self.run_id).aggregate(
            input_tokens=Sum("input_tokens", default=0),
            output_tokens=Sum("output_tokens", default=0),
            attempt_count=Count("id"),
            continuation_count=Count("id", filter=Q(kind=Attempt.Kind.CONTINUATION)),
        )
        Run.objects.filter(pk=self.run_id).update(**totals)

    def stored(self, position: int) -> None:
        """The message at ``position`` was stored with the run's end (``lifecycle.finish``):
        told of it next, as every sink is, the recorder has nothing to write."""
        self._stored.add(position)

    async def on_message(self, message: dict[str, Any], position: int) -> None:
        """Write the committed message once; a retried write finds it and changes nothing."""
        if position in self._stored:
            return  # a transaction of its own would only find it there
        await self._write(lambda: write_message(self.thread_id, self.run_id, message, position))


def write_message(thread_id: int, run_id: uuid.UUID | str, message: dict[str, Any], position: int) -> None:
    """Commit ``message`` at ``position`` of the thread, once: a retried write finds it and
    changes nothing. Stored as written (the app's own API keys cut out)."""
    content = cut_secrets(jsonable(message.get("content", [])))
    row, created = Message.objects.get_or_create(
        thread_id=thread_id,
        position=position,
        defaults={"run_id": run_id, "role": message["role"], "content": content},
    )
    if not created and (row.role != message["role"] or row.content != content):
        logger.warning(
            "message_position_conflict",
            run_id=str(run_id),
            thread_id=thread_id,
            position=position,
            stored_run_id=str(row.run_id) if row.run_id else None,
        )
