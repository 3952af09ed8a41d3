"""One proxied stream: the run executes in a thread of this process, its frames cross to the
request's event loop, and ``ProxyStream`` turns them into the provider's wire format.

The run does not depend on the client: when the client goes away the run goes on to its end
and is stored; when this process dies the sweep hands it to another worker, which resumes it
from its checkpoint (nobody is listening then, but the answer is completed and stored).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from django.db import close_old_connections

from .. import starter
from ..engine.protocol import TERMINAL_STATUSES, Frame, FrameKind, RunStatus
from ..engine.sink import AttemptOutcome, AttemptRecord, BaseSink
from ..redaction import redact_text
from .errors import error_type, status_for
from .inbound import ANTHROPIC, Format
from .splice import Splicer, Unsplicable
from .wire import AttemptMetadata, TurnUsage, Writer


@dataclass(frozen=True, slots=True)
class AttemptSeen:
    """What the stream needs of one attempt: its usage so far and how it ended."""

    index: int
    usage: dict[str, int | None]
    status_code: int | None
    error_kind: str | None
    error_message: str | None
    outcome: str
    stop_reason: str | None
    stop_sequence: str | None
    metadata: dict[str, object] = field(default_factory=dict)  # the provider's answer metadata


@dataclass(frozen=True, slots=True)
class RunEnded:
    status: str
    error: dict[str, str] | None


Item = dict[str, Any] | AttemptSeen | RunEnded


class RelaySink(BaseSink):
    """Runs in the run's thread: hands frames and attempts to the request's loop, never blocking the run."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Item]) -> None:
        self.loop = loop
        self.queue = queue
        self.current: AttemptRecord | None = None  # the attempt streaming now: its usage grows as it goes
        self.usage_sent: dict[str, int | None] = {}
        self.metadata_sent: dict[str, object] = {}

    def put(self, item: Item) -> None:
        with suppress(RuntimeError):  # the request's loop is gone: the run goes on without it
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    async def on_frame(self, frame: Frame) -> None:
        # the attempt's usage as the provider reported it so far (its input tokens arrive with
        # the stream's start), ahead of the frame: ``message_start`` carries it; and its metadata,
        # which Gemini's chunk writer reads its usage details from
        current = self.current
        if current is not None and (
            current.usage.as_dict() != self.usage_sent or current.metadata != self.metadata_sent
        ):
            self._seen(current)
        self.put(dict(frame))

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        self.current = attempt
        self._seen(attempt)

    def _seen(self, attempt: AttemptRecord) -> None:
        self.usage_sent = attempt.usage.as_dict()
        self.metadata_sent = dict(attempt.metadata)
        self.put(
            AttemptSeen(
                attempt.index,
                self.usage_sent,
                attempt.status_code,
                attempt.error_kind,
                attempt.error_message,
                attempt.outcome,
                attempt.stop_reason,
                attempt.stop_sequence,
                dict(attempt.metadata),
            )
        )


def start_run_thread(run_id: str, relay: RelaySink) -> threading.Thread:
    """Execute the run in a daemon thread of this process (named as ``starter.run_threads`` finds it)."""

    def target() -> None:
        ended = RunEnded(RunStatus.FAILED, {"kind": "not_claimed", "message": "the run was not claimed"})
        try:
            result = asyncio.run(starter.execute_here(run_id, extra_sinks=[relay]))
            if result is not None:
                ended = RunEnded(result.status, result.error)
        except Exception as exc:  # the client must hear that it ended, whatever happened
            ended = RunEnded(RunStatus.FAILED, {"kind": "internal", "message": type(exc).__name__})
        finally:
            relay.put(ended)
            close_old_connections()

    thread = threading.Thread(target=target, name=f"{starter.THREAD_PREFIX}{run_id}", daemon=True)
    thread.start()
    return thread


@dataclass(slots=True)
class ProxyStream:
    """Reads the run's items and writes the downstream stream."""

    format: Format
    writer: Writer
    queue: asyncio.Queue[Item]
    splicer: Splicer = field(default_factory=Splicer)
    attempts: dict[int, AttemptSeen] = field(default_factory=dict)
    started: bool = False
    done: bool = False
    committed: bool = False
    ended: RunEnded | None = None

    def __post_init__(self) -> None:
        # OpenAI's formats show reasoning whole (``reasoning_content``, a reasoning item); Anthropic's
        # cannot take thinking without its signature
        self.splicer.release_unsigned = self.format != ANTHROPIC

    def usage(self) -> TurnUsage:
        total = TurnUsage()
        for seen in self.attempts.values():
            total.input_tokens += seen.usage.get("input_tokens") or 0
            total.output_tokens += seen.usage.get("output_tokens") or 0
            total.cache_creation_input_tokens += seen.usage.get("cache_creation_input_tokens") or 0
            total.cache_read_input_tokens += seen.usage.get("cache_read_input_tokens") or 0
            total.reasoning_tokens += seen.usage.get("reasoning_tokens") or 0
        total.attempts = [
            AttemptMetadata(seen.metadata, seen.outcome == AttemptOutcome.INTERRUPTED)
            for _, seen in sorted(self.attempts.items())
        ]
        return total

    async def first(self) -> bytes | RunEnded:
        """The stream's first bytes, or how the run ended when it ended with nothing to show
        (the caller answers with the provider's HTTP error then)."""
        while not self.done:
            chunk = self._handle(await self.queue.get())
            if chunk:
                return chunk
            if self.ended is not None and not self.started:
                return self.ended
        return b""

    async def rest(self) -> AsyncIterator[bytes]:
        while not self.done:
            chunk = self._handle(await self.queue.get())
            if chunk:
                yield chunk

    # ---- one item ---------------------------------------------------------------------

    def _handle(self, item: Item) -> bytes:
        if isinstance(item, AttemptSeen):
            self.attempts[item.index] = item
            return b""
        if isinstance(item, RunEnded):
            return self._ended(item)
        kind = item.get("type")
        try:
            if kind == FrameKind.MESSAGE_COMMITTED:
                self.committed = True
                content = list((item.get("message") or {}).get("content") or [])
                return self._out(self.splicer.finish(content))
            if kind == FrameKind.RUN_STATUS and item.get("status") in TERMINAL_STATUSES:
                return self._ended(RunEnded(str(item.get("status")), item.get("error")))
            return self._out(self.splicer.apply(item))
        except Unsplicable as exc:
            return self._fail("api_error", f"The stream broke and could not be continued in place: {exc}")

    def _out(self, ops: list[Any]) -> bytes:
        if not ops or self.done:
            return b""
        head = b"" if self.started else self.writer.start(self.usage())
        self.started = True
        return head + self.writer.ops(ops, self.usage())

    def _ended(self, ended: RunEnded) -> bytes:
        if self.done:
            return b""
        if ended.status == RunStatus.COMPLETED:
            # an answer with no content is never committed: close what is open all the same
            tail = b"" if self.committed else self._out(self.splicer.finish([]))
            self.done = True
            head = b"" if self.started else self.writer.start(self.usage())
            self.started = True
            stop_reason = self._stop_reason()
            usage = self.usage()
            end = self.writer.end(stop_reason, usage, self._stop_sequence(stop_reason), usage.attempts)
            return head + tail + end
        self.ended = ended
        if not self.started:
            self.done = True
            return b""
        error = ended.error or {}
        return self._fail(error_type(self.format, self._status()), error.get("message") or ended.status)

    def _fail(self, kind: str, message: str) -> bytes:
        if self.done:
            return b""
        self.done = True
        return self.writer.error(kind, redact_text(message))

    def _status(self) -> int:
        """The HTTP status the run's failure maps to: the provider's own, else a 5xx."""
        last = self.attempts[max(self.attempts)] if self.attempts else None
        if last is not None and last.status_code and last.status_code >= 400:
            return last.status_code
        error = (self.ended.error if self.ended else None) or {}
        return status_for(self.format, error.get("kind"))

    def _stop_reason(self) -> str:
        """The turn's stop reason: a salvaged tool call ends it as ``tool_use``; a stream that
        ended with its stop reason says it; one that broke with no continuation left in the
        budget ended at ``max_tokens``."""
        if self.splicer.released_tools():
            return "tool_use"
        last = self.attempts[max(self.attempts)] if self.attempts else None
        if last is None:
            return "end_turn"
        if last.stop_reason:
            return last.stop_reason
        return "max_tokens" if last.outcome == AttemptOutcome.INTERRUPTED else "end_turn"

    def _stop_sequence(self, stop_reason: str) -> str | None:
        """The stop sequence that ended the turn, when it ended at one and the provider said which."""
        last = self.attempts[max(self.attempts)] if self.attempts else None
        return last.stop_sequence if last is not None and stop_reason == "stop_sequence" else None

    def failure(self) -> tuple[int, str]:
        """Status and message of a run that ended with nothing streamed."""
        ended = self.ended
        error = (ended.error if ended else None) or {}
        last = self.attempts[max(self.attempts)] if self.attempts else None
        message = (last.error_message if last and last.error_message else None) or error.get("message") or "failed"
        return self._status(), redact_text(message)
