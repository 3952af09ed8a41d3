"""The recorder: the sink that writes a run's events, attempts and committed messages to the database and logs.

The app emits; the project configures logging (django-structlog style). A log line and its
``RecoveryEvent`` row carry the same redacted fields, so what an operator greps and what
analytics counts never disagree. Writes run in asgiref's thread (``sync_to_async``), so the
runner's event loop is never blocked by the database. Given the worker's ``Fence``, every
write is made in a transaction that holds the run's row at the claim's epoch (on a worker's
shared loop, many runs' attempt rows share one: ``attempt_writes``): a worker whose claim was
taken over writes nothing (``ClaimLost``), not even the log line.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import structlog
from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Q

from ..engine.sink import (
    DISCARDED_PARTIAL_TOOL_USE,
    DISCARDED_THINKING,
    LLM_RESPONSE_ABANDONED,
    LLM_STREAM_CONTINUATION_EXHAUSTED,
    LLM_STREAM_CONTINUATION_FAILED,
    LLM_STREAM_FAILOVER,
    LLM_STREAM_INTERRUPTED,
    AttemptRecord,
    BaseSink,
    StructuredEvent,
)
from ..models import Message, RecoveryEvent, Run
from ..redaction import cut_secrets, redact
from .attempt_writes import AttemptWrites, refresh_totals
from .fence import Fence
from .loop import on_shared_loop
from .rows import jsonable, upsert_attempts

T = TypeVar("T")

logger = structlog.get_logger("streamrecover")

_LEVELS = {
    LLM_STREAM_INTERRUPTED: logging.WARNING,
    LLM_STREAM_CONTINUATION_FAILED: logging.WARNING,
    LLM_STREAM_CONTINUATION_EXHAUSTED: logging.ERROR,
    LLM_STREAM_FAILOVER: logging.WARNING,
    LLM_RESPONSE_ABANDONED: logging.WARNING,  # a response the provider may go on billing
    DISCARDED_PARTIAL_TOOL_USE: logging.INFO,
    DISCARDED_THINKING: logging.INFO,
}


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
        """Upsert by (run, index): called when the attempt starts and again when it ends. On a
        worker's shared loop the writes of all its runs go together (``attempt_writes``)."""
        if self.fence is not None and on_shared_loop():
            await AttemptWrites.of_running_loop().write(self.fence, attempt)
            return
        await self._write(lambda: self._store_attempt(attempt))

    def _store_attempt(self, attempt: AttemptRecord) -> None:
        upsert_attempts([(self.run_id, attempt)])
        if attempt.ended_at is not None:
            refresh_totals([str(self.run_id)])

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
    write_messages([(thread_id, run_id, message, position)])


def write_messages(rows: Sequence[tuple[int, uuid.UUID | str, dict[str, Any], int]]) -> None:
    """``write_message`` for each (thread id, run id, message, position), in two statements."""
    if not rows:
        return
    wanted = {
        (thread_id, position): Message(
            thread_id=thread_id,
            position=position,
            run_id=run_id,
            role=message["role"],
            content=cut_secrets(jsonable(message.get("content", []))),
        )
        for thread_id, run_id, message, position in rows
    }
    Message.objects.bulk_create(wanted.values(), ignore_conflicts=True)  # a position already taken stays
    at = Q()
    for thread_id, position in wanted:
        at |= Q(thread_id=thread_id, position=position)
    for row in Message.objects.filter(at):
        ours = wanted[(row.thread_id, row.position)]
        if row.role != ours.role or row.content != ours.content:
            logger.warning(
                "message_position_conflict",
                run_id=str(ours.run_id),
                thread_id=row.thread_id,
                position=row.position,
                stored_run_id=str(row.run_id) if row.run_id else None,
            )
