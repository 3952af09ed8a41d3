"""Attempts: one HTTP call to the provider, from opening its ``AttemptRecord`` to closing it on one path.

``open_attempt`` numbers the record and reports it; ``run_attempt`` makes the call and
streams the response through the turn's ``Translator``, racing the cancel token; every
ending (completed, interrupted, request_failed, cancelled) goes through ``close_attempt``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from .context import RunCancelled, RunContext
from .contract import HTTPRequest, follows_cursor, resumes_natively
from .errors import (
    BodyDecodeError,
    ErrorClass,
    InterruptCause,
    NotAnEventStream,
    ParseError,
    ProviderError,
    SSEError,
    StreamInterrupted,
)
from .estimate import estimated_usage
from .plan import PlanKind
from .sink import AttemptOutcome, AttemptRecord
from .sse import SSEDecoder, is_event_stream
from .translate import AttemptDone, Translator, as_interrupted
from .transport import ConnectFailed, OpenedStream

T = TypeVar("T")
log = logging.getLogger(__name__)


async def open_attempt(
    ctx: RunContext, *, turn: int, kind: str, continuation: int, strategy: str | None, http_request: HTTPRequest
) -> AttemptRecord:
    """A new record for the run's next attempt (``kind``: initial, pre_stream_retry, continuation, restart,
    resume), reported to the sink."""
    record = AttemptRecord(
        run_id=ctx.run_id,
        turn=turn,
        index=ctx.attempts,
        kind=kind,
        continuation=continuation,
        strategy=strategy,
        request=http_request.redacted(),
        started_at=time.time(),
    )
    ctx.attempts += 1
    await ctx.sink.on_attempt(record)
    return record


async def close_attempt(
    ctx: RunContext,
    record: AttemptRecord,
    outcome: str,
    *,
    stop_reason: str | None = None,
    stop_sequence: str | None = None,
    interrupt_cause: str | None = None,
    error_kind: str | None = None,
    error_message: str | None = None,
) -> None:
    """The one way an attempt ends: its outcome and end time set, the sink told again."""
    record.outcome = outcome
    record.ended_at = time.time()
    record.stop_reason = stop_reason
    record.stop_sequence = stop_sequence
    record.interrupt_cause = interrupt_cause
    record.error_kind = error_kind
    record.error_message = error_message
    await ctx.sink.on_attempt(record)


async def run_attempt(
    ctx: RunContext, http_request: HTTPRequest, record: AttemptRecord, translator: Translator
) -> ProviderError:
    """Make one call and stream its response.

    Returns the ``ProviderError`` of a call that failed before its stream started. Raises
    ``AttemptDone`` at the stream's terminator, ``StreamInterrupted`` when it broke and
    ``RunCancelled`` when the cancel token fired. The record is closed in every case.
    """
    error = await _open_and_stream(ctx, http_request, record, translator)
    await close_attempt(ctx, record, AttemptOutcome.REQUEST_FAILED, error_kind=error.kind, error_message=error.message)
    return error


async def _open_and_stream(
    ctx: RunContext, http_request: HTTPRequest, record: AttemptRecord, translator: Translator
) -> ProviderError:
    assert ctx.transport is not None, "run_agent provides the transport"
    try:
        # connecting and waiting for the headers race the cancel token too
        opened = await _unless_cancelled(
            ctx,
            record,
            _open(ctx, http_request),
        )
    except ConnectFailed as exc:
        return ProviderError(ErrorClass.RETRYABLE, "connect_error", str(exc))
    record.status_code = opened.status
    record.request_id = _request_id(opened.headers)
    try:
        if opened.status != 200:
            body = await _unless_cancelled(ctx, record, opened.read_error_body())
            return ctx.adapter.classify_http_error(opened.status, opened.headers, body)
        content_type = opened.headers.get("content-type", "")
        if not is_event_stream(content_type):
            body = await _unless_cancelled(ctx, record, opened.read_error_body())
            excerpt = body[:200].decode("utf-8", "replace")
            return ProviderError(
                ErrorClass.PERMANENT,
                "bad_content_type",
                f"expected text/event-stream, got {content_type or 'no content type'!r}: {excerpt!r}",
                status=opened.status,
            )
        try:
            await _consume(ctx, opened, record, translator, http_request)
        except NotAnEventStream as exc:
            return ProviderError(ErrorClass.PERMANENT, "bad_content_type", str(exc), status=opened.status)
    finally:
        await opened.close()
    raise AssertionError("unreachable")  # _consume always raises


async def _open(ctx: RunContext, http_request: HTTPRequest) -> OpenedStream:
    """Open ``http_request`` on the run's transport with the configured timeouts."""
    assert ctx.transport is not None, "run_agent provides the transport"
    cfg = ctx.config
    return await ctx.transport.open(
        http_request.method,
        http_request.url,
        http_request.headers,
        http_request.json,
        cfg.idle_timeout_s,
        cfg.connect_timeout_s,
    )


async def _unless_cancelled(ctx: RunContext, record: AttemptRecord, awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, unless the cancel token fires first: then it is abandoned (a
    stream it opened anyway is closed), the attempt is closed ``cancelled`` and
    ``RunCancelled`` raised. A cancel beats connecting, waiting for headers, reading an
    error body."""
    work = asyncio.ensure_future(awaitable)
    if await _cancelled_first(ctx, work):
        await close_attempt(ctx, record, AttemptOutcome.CANCELLED)
        raise RunCancelled
    return work.result()


async def _cancelled_first(ctx: RunContext, work: asyncio.Future[Any]) -> bool:
    """Wait for ``work`` or the cancel token, whichever comes first. True when the token has
    fired: ``work`` is then cancelled and awaited (a stream it opened anyway is closed)."""
    await asyncio.wait({work, ctx.cancel.stopped_future()}, return_when=asyncio.FIRST_COMPLETED)
    if not ctx.cancel.stopped:
        return False
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        result = await work
        if isinstance(result, OpenedStream):
            await result.close()
    return True


async def _consume(
    ctx: RunContext, opened: OpenedStream, record: AttemptRecord, translator: Translator, http_request: HTTPRequest
) -> None:
    """Feed the body through decoder, parser and translator, racing the cancel token."""
    stream_task = asyncio.ensure_future(_pump(ctx, opened, record, translator, http_request))
    # the token's own future, not a task awaiting it: a task per attempt held for the stream
    done, _ = await asyncio.wait({stream_task, ctx.cancel.stopped_future()}, return_when=asyncio.FIRST_COMPLETED)
    if stream_task not in done:
        stream_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await stream_task
        await close_attempt(ctx, record, AttemptOutcome.CANCELLED)
        raise RunCancelled
    stream_task.result()  # re-raises AttemptDone / StreamInterrupted


async def _pump(
    ctx: RunContext, opened: OpenedStream, record: AttemptRecord, translator: Translator, http_request: HTTPRequest
) -> None:
    decoder = SSEDecoder(ctx.config.max_line_bytes)
    parser = translator.parser = ctx.adapter.new_parser()
    limit = ctx.config.max_stream_seconds
    head = b""  # the body's first bytes, to tell a page from a stream that broke
    events = 0
    try:
        # Keep-alives (or a runaway model) can keep a stream alive forever without an idle
        # stall: the whole stream has a deadline too.
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                async for chunk in opened.chunks:
                    if record.first_byte_at is None:
                        record.first_byte_at = time.time()
                    record.bytes_received += len(chunk)
                    if len(head) < _HEAD_BYTES:
                        head += chunk[:_HEAD_BYTES]
                    for sse in decoder.feed(chunk):
                        events += 1
                        for event in parser.feed(sse):
                            await translator.on_event(event, record)
                    if decoder.error is not None:  # a bad line after the events just applied
                        raise decoder.error
        except TimeoutError:
            if not deadline.expired():
                raise
            raise StreamInterrupted(
                InterruptCause.STREAM_DEADLINE, f"the stream did not end within MAX_STREAM_SECONDS ({limit:g} s)"
            ) from None
        decoder.close()
        if not events and not _starts_like_sse(head):
            raise NotAnEventStream(f"the body is not an event stream: {head[:200].decode('utf-8', 'replace')!r}")
        raise StreamInterrupted(
            InterruptCause.CONNECTION_RESET,
            "the body ended without the stream's terminator"
            + (" (inside an event)" if decoder.had_unterminated_event else ""),
        )
    except AttemptDone:
        acc = translator.acc
        await close_attempt(
            ctx, record, AttemptOutcome.COMPLETED, stop_reason=acc.stop_reason, stop_sequence=acc.stop_sequence
        )
        if record.kind == PlanKind.NATIVE_RESUME.value:
            await _withdraw_estimates(ctx, translator)
        raise
    except (StreamInterrupted, SSEError, BodyDecodeError, ParseError) as exc:
        await _interrupted(ctx, record, translator, http_request, as_interrupted(exc), exc)
    except (NotAnEventStream, RunCancelled):
        raise
    except Exception as exc:
        # A bug, or data no parser check foresaw, in parsing or translating: the attempt still
        # ends (never left pending, never asked for and paid again by the next claim) and what
        # arrived before it is kept, as for any break. (CancelledError and ClaimLost are
        # BaseExceptions: they go on up.)
        log.exception("stream_event_failed run_id=%s attempt=%s", ctx.run_id, record.index)
        message = f"the stream could not be handled ({type(exc).__name__}: {exc})"
        await _interrupted(
            ctx, record, translator, http_request, StreamInterrupted(InterruptCause.UNKNOWN, message), exc
        )


async def _interrupted(
    ctx: RunContext,
    record: AttemptRecord,
    translator: Translator,
    http_request: HTTPRequest,
    interrupted: StreamInterrupted,
    exc: BaseException,
) -> None:
    """Close the attempt as interrupted (what arrived checkpointed first) and raise ``interrupted``."""
    error = interrupted.provider_error
    if translator.on_interrupted is not None and translator.received_bytes:
        # What arrived is checkpointed before the attempt is recorded as ended: a worker
        # that dies in between (a window of a few writes) leaves it to the next claim,
        # which goes on from it instead of asking for it, and paying for it, again.
        await translator.on_interrupted()
    if not translator.final_usage:
        # The provider bills a broken stream too, yet its count never came (or only
        # message_start's): the attempt is stored with the engine's estimate, flagged.
        reported = record.usage
        bound = translator.received_tokens(ctx.adapter.text_delta_is_token)
        record.usage = estimated_usage(reported, bound, http_request.json)
        record.usage_estimated = True
        if _usage_comes_later(ctx, record, translator, interrupted):
            # a re-attached response that reaches its end reports its whole usage, this part
            # included: the estimate is withdrawn then (and stays if the response is gone)
            translator.estimated_before_resume.append((record, reported))
    await close_attempt(
        ctx,
        record,
        AttemptOutcome.INTERRUPTED,
        interrupt_cause=interrupted.cause.value,
        error_kind=error.kind if error else interrupted.cause.error_kind,
        error_message=interrupted.message,
    )
    raise interrupted from exc


async def _withdraw_estimates(ctx: RunContext, translator: Translator) -> None:
    """The re-attached response ended with its whole usage: the estimates of its broken parts
    would count it twice, so they go back to what the provider reported of them."""
    for earlier, reported in translator.estimated_before_resume:
        earlier.usage, earlier.usage_estimated = reported, False
        await ctx.sink.on_attempt(earlier)
    translator.estimated_before_resume.clear()


def _usage_comes_later(
    ctx: RunContext, record: AttemptRecord, translator: Translator, interrupted: StreamInterrupted
) -> bool:
    """True when the broken response goes on server-side and is re-attached (native resume):
    the attempt that reaches its end reports the whole response's usage, this part included."""
    if not resumes_natively(ctx.adapter) or interrupted.cause is InterruptCause.PROVIDER_ERROR_MID_STREAM:
        return False
    if record.kind == PlanKind.NATIVE_RESUME.value:
        return True
    parser = translator.parser
    return follows_cursor(parser) and parser.resume_point() is not None


_HEAD_BYTES = 256
_SSE_STARTS = (b"data", b"event", b"id", b"retry", b":")


def _starts_like_sse(head: bytes) -> bool:
    """True for an empty body (a plain cut) and for one whose first line is an SSE field or comment."""
    first = head.removeprefix(b"\xef\xbb\xbf").lstrip(b"\r\n")
    return not first or first.startswith(_SSE_STARTS)


def _request_id(headers: Mapping[str, str]) -> str | None:
    for name in ("request-id", "x-request-id"):
        value = headers.get(name)
        if value:
            return str(value)
    return None


async def count_input_tokens(ctx: RunContext, http_request: HTTPRequest) -> int | None:
    """The provider's (free) count of a request's input tokens; None when the call fails in any
    way (the caller then keeps its upper bound). A cancel beats it, as every other call."""
    assert ctx.transport is not None, "run_agent provides the transport"

    async def call() -> bytes | None:
        opened = await _open(ctx, http_request)
        try:
            return await opened.read_error_body() if opened.status == 200 else None
        finally:
            await opened.close()

    work = asyncio.ensure_future(call())
    if await _cancelled_first(ctx, work):
        raise RunCancelled
    try:
        body = work.result()
    except Exception:  # a count is an optimisation: no count, no harm
        return None
    return ctx.adapter.read_count(body) if body is not None else None
