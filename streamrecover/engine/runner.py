"""The turn runner: one assistant turn, kept alive across broken streams.

One turn is a sequence of HTTP calls (attempts). The first is ``initial``; a call that
fails before its stream starts is retried as ``pre_stream_retry`` (own budget); a stream
that breaks is planned (R1-R4) and followed, after a backoff, by a ``continuation`` that
carries the kept blocks as history, or a ``restart`` when nothing was kept. The turn's
blocks are numbered the way the client sees them: a continuation's first text block
merges into the prefix's last text block, everything else gets the next number.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from . import sink as ev
from .blocks import TEXT, THINKING, TOOL_USE, Accumulator, Block, BlockStatus, Snapshot
from .cancel import CancelToken
from .checkpoint import Checkpoint, CheckpointStore, CheckpointWriter, CoalescePolicy
from .config import EngineConfig
from .contract import CONTINUE_INSTRUCTION, HTTPRequest, ModelRequest, ProviderAdapter, Strategy
from .errors import (
    BodyDecodeError,
    ErrorClass,
    InterruptCause,
    ParseError,
    ProviderError,
    RequestFailed,
    SSEError,
    StreamInterrupted,
)
from .events import (
    BlockStart,
    BlockStop,
    MessageStart,
    ProviderErrorEvent,
    SignatureDelta,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolArgsDelta,
    UsageUpdate,
)
from .join import ContinuationJoiner
from .plan import PlanKind, RecoveryPlan, plan
from .retry import backoff_delay
from .sink import AttemptRecord, RunSink, StructuredEvent
from .sse import SSEDecoder
from .transport import ConnectFailed, HttpxTransport

log = logging.getLogger(__name__)

NEVER_CONTINUE_STOPS = frozenset({"refusal", "content_filter", "context_overflow"})


class RunCancelled(Exception):
    """The cancel token fired; carries what stopped the run."""


@dataclass(slots=True)
class TurnResult:
    status: str  # completed, failed, exhausted, cancelled
    blocks: list[dict[str, Any]] = field(default_factory=list)  # canonical content of the assistant message
    stop_reason: str | None = None
    error: dict[str, str] | None = None
    continuations: int = 0
    recovered: bool = False
    discarded_tools: list[dict[str, Any]] = field(default_factory=list)  # {"id", "name", "reason"}


@dataclass(slots=True)
class RunContext:
    """Identity and shared services of one run, handed to every turn."""

    run_id: str
    adapter: ProviderAdapter
    config: EngineConfig
    sink: RunSink
    checkpoints: CheckpointStore
    cancel: CancelToken
    transport: HttpxTransport
    seq: int = 0
    attempts: int = 0  # attempts across the run, for AttemptRecord.index
    provider_name: str = ""  # the configured provider's name for events (default: the adapter's)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    async def frame(self, type_: str, **payload: Any) -> None:
        await self.sink.on_frame({"type": type_, "run_id": self.run_id, "seq": self.next_seq(), **payload})


class _AttemptDone(Exception):
    """Internal: the stream reached its terminator."""


class TurnRunner:
    """Runs one assistant turn. Create one per turn."""

    def __init__(self, ctx: RunContext, request: ModelRequest, turn: int, history_len: int) -> None:
        self.ctx = ctx
        self.request = request
        self.turn = turn
        self.history_len = history_len
        self.acc = Accumulator()  # the turn's blocks, numbered as the client sees them
        self.prefix: list[Block] = []  # kept blocks the current attempt continues from
        self.strategy: Strategy | None = None
        self.continuation = 0
        self.attempt_kind = "initial"
        self.writer = CheckpointWriter(
            ctx.checkpoints,
            CoalescePolicy(
                ctx.config.checkpoint_every_deltas,
                ctx.config.checkpoint_every_bytes,
                ctx.config.checkpoint_every_seconds,
            ),
            on_error=self._store_failed,
        )
        self._current_attempt: AttemptRecord | None = None
        self._in_flight_tool: dict[str, Any] | None = None
        self.store_errors: list[str] = []
        self.discarded_tools: list[dict[str, Any]] = []

    # ---- public -------------------------------------------------------------------------

    async def run(self, resume: Checkpoint | None = None) -> TurnResult:
        try:
            if resume is not None:
                early = await self._resume(resume)
                if early is not None:
                    return early
            return await self._loop()
        except RunCancelled:
            await self.writer.delete(self.ctx.run_id)
            return TurnResult(
                "cancelled",
                error={"kind": self.ctx.cancel.kind or "cancel", "message": self.ctx.cancel.reason},
                continuations=self.continuation,
            )

    # ---- the loop -----------------------------------------------------------------------

    async def _loop(self) -> TurnResult:
        prefill_fallback_used = False
        while True:
            self._check_cancel()
            try:
                await self._attempt()
            except _AttemptDone:
                return await self._finish_completed()
            except RequestFailed as failed:
                error = failed.error
                if (
                    error.error_class is ErrorClass.PREFILL_REFUSED
                    and self.strategy is Strategy.PREFILL
                    and not prefill_fallback_used
                ):
                    # The model takes no prefill: same continuation, explicit continue message.
                    prefill_fallback_used = True
                    self.strategy = Strategy.CONTINUE_MESSAGE
                    await self._emit(
                        ev.LLM_STREAM_CONTINUATION_FAILED,
                        continuation_attempt=self.continuation,
                        error_kind=error.kind,
                        error_message=error.message,
                        fallback_strategy=Strategy.CONTINUE_MESSAGE.value,
                    )
                    continue
                if self.continuation > 0:
                    await self._emit(
                        ev.LLM_STREAM_CONTINUATION_FAILED,
                        continuation_attempt=self.continuation,
                        error_kind=error.kind,
                        error_message=error.message,
                    )
                    if not error.permanent:
                        # The pre-stream budget of this continuation ran out: try the next one.
                        # same kept blocks again (the failed call never streamed)
                        outcome = await self._next_continuation(error.retry_after_s, plan(self.acc.snapshot()))
                        if outcome is not None:
                            return outcome
                        continue
                return await self._fail(error.kind, error.message)
            except StreamInterrupted as interrupted:
                self._check_cancel()
                outcome = await self._on_interrupted(interrupted)
                if outcome is not None:
                    return outcome

    async def _on_interrupted(self, interrupted: StreamInterrupted) -> TurnResult | None:
        snapshot = self.acc.snapshot()
        recovery = plan(snapshot)
        provider_error = interrupted.provider_error
        permanent = provider_error is not None and provider_error.permanent
        never = snapshot.stop_reason in NEVER_CONTINUE_STOPS
        structured_restart = (
            recovery.continues and self.request.structured and self._strategy_for_continuation() is not Strategy.PREFILL
        )
        if structured_restart:
            recovery = _as_restart(recovery)

        kept_chars = sum(len(b.text) for b in recovery.keep if b.kind == TEXT)
        attempt = self._current_attempt
        usage_flushed = attempt is not None and attempt.usage.output_tokens is not None
        await self._emit(
            ev.LLM_STREAM_INTERRUPTED,
            continuation_attempt=self.continuation,
            cause=interrupted.cause.value,
            error_kind=interrupted.cause.error_kind,
            error_message=interrupted.message,
            committed_text_blocks=sum(1 for b in recovery.keep if b.kind == TEXT),
            committed_partial_text=any(b.kind == TEXT and not b.closed for b in recovery.keep),
            discarded_partial_tool_uses=len(recovery.discarded_tools),
            discarded_thinking_blocks=len(recovery.discarded_thinking),
            usage_flushed=usage_flushed,
            plan=recovery.kind.value,
            kept_text_chars=kept_chars,
            kept_output_tokens_estimate=-(-kept_chars // 4),
        )
        await self._publish_discards(recovery)
        if never:
            # A refusal or content filter already arrived: the answer ends here, as it is.
            return await self._finish_with(recovery.keep, snapshot.stop_reason)
        if permanent:
            assert provider_error is not None
            return await self._fail(provider_error.kind, provider_error.message)
        if recovery.kind is PlanKind.SYNTHESIZE_TOOL_USE:
            result = await self._finish_with(recovery.keep, "tool_use")
            await self._emit(
                ev.LLM_STREAM_CONTINUATION_COMPLETED,
                continuation_attempt=self.continuation,
                completion_reason="synthesized_tool_use",
                plan=recovery.kind.value,
            )
            result.recovered = True
            return result
        retry_after = provider_error.retry_after_s if provider_error is not None else None
        return await self._next_continuation(retry_after, recovery)

    async def _next_continuation(self, retry_after_s: float | None, recovery: RecoveryPlan) -> TurnResult | None:
        """Spend one continuation: checkpoint, back off (cancellable), set up the prefix."""
        cfg = self.ctx.config
        await self._write_checkpoint(force=True)
        if self.continuation >= cfg.max_continuations:
            await self._emit(
                ev.LLM_STREAM_CONTINUATION_EXHAUSTED,
                attempts=self.continuation,
                final_reason=self._last_error_kind(),
            )
            await self.ctx.frame("recovery", phase="exhausted", attempt=self.continuation, plan=recovery.kind.value)
            await self.writer.delete(self.ctx.run_id)
            return TurnResult(
                "exhausted",
                error={
                    "kind": "exhausted",
                    "message": f"gave up after {self.continuation} continuation attempts ({self._last_error_kind()})",
                },
                continuations=self.continuation,
            )
        self.continuation += 1
        delay = backoff_delay(
            self.continuation,
            cfg.backoff_schedule,
            cfg.backoff_scale,
            cfg.backoff_jitter,
            retry_after_s,
            cfg.max_retry_after_s,
        )
        await self.ctx.frame(
            "recovery", phase="backoff", attempt=self.continuation, plan=recovery.kind.value, backoff_s=delay
        )
        if await self.ctx.cancel.sleep(delay):
            raise RunCancelled
        self._set_prefix(recovery)
        await self._emit(
            ev.LLM_STREAM_CONTINUATION_STARTED,
            continuation_attempt=self.continuation,
            backoff_s=delay,
            committed=_summary(self.prefix),
            strategy=self.strategy.value if self.strategy else None,
            plan=recovery.kind.value,
        )
        await self.ctx.frame(
            "recovery", phase="continuing", attempt=self.continuation, plan=recovery.kind.value, backoff_s=delay
        )
        return None

    def _set_prefix(self, recovery: RecoveryPlan) -> None:
        if recovery.kind is PlanKind.WHOLE_RESTART or not recovery.keep:
            self.prefix = []
            self.strategy = None
            self.acc = Accumulator()
            self.attempt_kind = "restart"
        else:
            self.prefix = [b.copy() for b in recovery.keep]
            self.strategy = self._strategy_for_continuation()
            self.acc = Accumulator()
            self.acc.restore(self.prefix)
            self.attempt_kind = "continuation"

    def _strategy_for_continuation(self) -> Strategy:
        return self.ctx.adapter.continuation_strategy(self.request.model, thinking=bool(self.request.thinking_budget))

    # ---- resume from a checkpoint -----------------------------------------------------

    async def _resume(self, checkpoint: Checkpoint) -> TurnResult | None:
        """Pick up a turn another process left: replay what it kept, then go on from it."""
        blocks = [Block.from_content(i, c) for i, c in enumerate(checkpoint.blocks)]
        # The client may have seen more than the checkpoint: reset it to exactly the checkpoint.
        await self.ctx.frame("stream_reset", reason="resume")
        for block in blocks:
            await self._replay_block(block)
        recovery = plan(Snapshot(tuple(blocks)))
        await self._emit(
            ev.LLM_RUN_RESUMED,
            plan=recovery.kind.value,
            committed=_summary(recovery.keep),
            checkpoint_attempt=checkpoint.attempt,
            checkpoint_continuation=checkpoint.continuation,
        )
        self.continuation = checkpoint.continuation  # a resume spends no continuation
        if recovery.kind is PlanKind.SYNTHESIZE_TOOL_USE:
            self.acc.restore(recovery.keep)
            result = await self._finish_with(recovery.keep, "tool_use")
            result.recovered = True
            return result
        self._set_prefix(recovery)
        if self.prefix:
            self.attempt_kind = "resume"
        return None

    async def _replay_block(self, block: Block) -> None:
        if block.kind == TEXT:
            await self.ctx.frame("text_delta", block=block.index, text=block.text)
        elif block.kind == TOOL_USE:
            await self.ctx.frame(
                "tool_call_delta", block=block.index, id=block.id, name=block.name, arguments_delta=block.arguments
            )
        elif block.kind == THINKING:
            await self.ctx.frame("thinking_delta", block=block.index, thinking=block.text)

    # ---- one attempt ------------------------------------------------------------------

    def _messages(self) -> list[dict[str, Any]]:
        messages = list(self.request.messages)
        if not self.prefix:
            return messages
        content = [b.to_content() for b in self.prefix]
        if self.strategy is Strategy.PREFILL:
            last = content[-1]
            if last.get("type") == "text":
                stripped = last["text"].rstrip()
                if stripped:
                    content[-1] = {**last, "text": stripped}
                else:
                    content.pop()
            messages.append({"role": "assistant", "content": content})
        elif self.strategy is Strategy.PREFIX_FLAG:
            messages.append({"role": "assistant", "content": content, "prefix": True})
        else:
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "user", "content": [{"type": "text", "text": CONTINUE_INSTRUCTION}]})
        return messages

    def _joiner(self) -> ContinuationJoiner | None:
        if not self.prefix or self.prefix[-1].kind != TEXT:
            return None
        text = self.prefix[-1].text
        if self.strategy is Strategy.PREFILL:
            return ContinuationJoiner(text[len(text.rstrip()) :])
        if self.strategy is Strategy.PREFIX_FLAG:
            return ContinuationJoiner(text if self.ctx.adapter.echoes_prefix else "")
        return ContinuationJoiner(overlap_with=text)

    async def _attempt(self) -> None:
        """One provider call with its pre-stream retries; raises _AttemptDone on the terminator."""
        cfg = self.ctx.config
        http_request = self.ctx.adapter.build_request(self._request_for_attempt())
        retries = 0
        kind = self.attempt_kind
        while True:
            self._check_cancel()
            record = self._new_attempt(kind, http_request)
            await self.ctx.sink.on_attempt(record)
            error = await self._open_and_stream(http_request, record)
            # only pre-stream failures come back here
            record.outcome = "request_failed"
            record.ended_at = time.time()
            record.error_kind = error.kind
            record.error_message = error.message
            await self.ctx.sink.on_attempt(record)
            if error.permanent or retries >= cfg.max_request_retries:
                raise RequestFailed(error)
            retries += 1
            delay = error.retry_after_s
            if delay is not None:
                delay = min(delay, cfg.max_retry_after_s)
            else:
                delay = min(cfg.request_retry_base_s * (2 ** (retries - 1)), 8.0) * cfg.backoff_scale
            await self._emit(
                ev.LLM_REQUEST_RETRY,
                status=error.status,
                error_kind=error.kind,
                retry_after_s=error.retry_after_s,
                delay_s=delay,
                retry=retries,
            )
            if await self.ctx.cancel.sleep(delay):
                raise RunCancelled
            kind = "pre_stream_retry"

    def _request_for_attempt(self) -> ModelRequest:
        return replace(self.request, messages=self._messages())

    def _new_attempt(self, kind: str, http_request: HTTPRequest) -> AttemptRecord:
        record = AttemptRecord(
            run_id=self.ctx.run_id,
            turn=self.turn,
            index=self.ctx.attempts,
            kind=kind,
            continuation=self.continuation,
            strategy=self.strategy.value if (self.strategy and self.prefix) else None,
            request=http_request.redacted(),
            started_at=time.time(),
        )
        self.ctx.attempts += 1
        self._current_attempt = record
        return record

    async def _open_and_stream(self, http_request: HTTPRequest, record: AttemptRecord) -> ProviderError:
        """Stream one response. Returns a pre-stream ProviderError; raises for everything else."""
        cfg = self.ctx.config
        adapter = self.ctx.adapter
        try:
            opened = await self.ctx.transport.open(
                http_request.method,
                http_request.url,
                http_request.headers,
                http_request.json,
                cfg.idle_timeout_s,
                cfg.connect_timeout_s,
            )
        except ConnectFailed as exc:
            return ProviderError(ErrorClass.RETRYABLE, "connect_error", str(exc))
        record.status_code = opened.status
        record.request_id = _request_id(opened.headers)
        try:
            if opened.status != 200:
                body = await opened.read_error_body()
                return adapter.classify_http_error(opened.status, opened.headers, body)
            content_type = opened.headers.get("content-type", "")
            if "text/event-stream" not in content_type:
                body = await opened.read_error_body()
                excerpt = body[:200].decode("utf-8", "replace")
                return ProviderError(
                    ErrorClass.PERMANENT,
                    "bad_content_type",
                    f"expected text/event-stream, got {content_type or 'no content type'!r}: {excerpt!r}",
                    status=opened.status,
                )
            await self._consume(opened, record)
        finally:
            await opened.close()
        raise AssertionError("unreachable")  # _consume always raises

    async def _consume(self, opened: Any, record: AttemptRecord) -> None:
        """Feed bytes through decoder, parser and accumulator, racing the cancel token."""
        stream_task = asyncio.ensure_future(self._pump(opened, record))
        cancel_task = asyncio.ensure_future(self.ctx.cancel.wait())
        try:
            done, _ = await asyncio.wait({stream_task, cancel_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel_task.cancel()
        if stream_task not in done:
            stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await stream_task
            record.outcome = "cancelled"
            record.ended_at = time.time()
            await self.ctx.sink.on_attempt(record)
            raise RunCancelled
        stream_task.result()  # re-raises _AttemptDone / StreamInterrupted

    async def _pump(self, opened: Any, record: AttemptRecord) -> None:
        decoder = SSEDecoder(self.ctx.config.max_line_bytes)
        parser = self.ctx.adapter.new_parser()
        mapper = _IndexMapper(self.acc, self.prefix)
        joiner = self._joiner()
        try:
            async for chunk in opened.chunks:
                if record.first_byte_at is None:
                    record.first_byte_at = time.time()
                record.bytes_received += len(chunk)
                for sse in decoder.feed(chunk):
                    for event in parser.feed(sse):
                        await self._on_event(event, record, mapper, joiner)
            decoder.close()
            raise StreamInterrupted(
                InterruptCause.CONNECTION_RESET,
                "the body ended without the stream's terminator"
                + (" (inside an event)" if decoder.had_unterminated_event else ""),
            )
        except _AttemptDone:
            record.outcome = "completed"
            record.ended_at = time.time()
            record.stop_reason = self.acc.stop_reason
            await self.ctx.sink.on_attempt(record)
            raise
        except (StreamInterrupted, SSEError, BodyDecodeError, ParseError) as exc:
            interrupted = _as_interrupted(exc)
            record.outcome = "interrupted"
            record.ended_at = time.time()
            record.interrupt_cause = interrupted.cause.value
            record.error_kind = (
                interrupted.provider_error.kind if interrupted.provider_error else interrupted.cause.error_kind
            )
            record.error_message = interrupted.message
            await self.ctx.sink.on_attempt(record)
            raise interrupted from exc

    async def _on_event(
        self, event: StreamEvent, record: AttemptRecord, mapper: _IndexMapper, joiner: ContinuationJoiner | None
    ) -> None:
        frame = self.ctx.frame
        match event:
            case TextDelta(index=i, text=text):
                target = mapper.target(i, TEXT)
                if joiner is not None and target == mapper.merge_index:
                    text = joiner.feed(text)
                    if not text:
                        return
                self.acc.apply(TextDelta(target, text))
                await frame("text_delta", block=target, text=text)
                await self._maybe_checkpoint(len(text))
            case ToolArgsDelta(index=i, partial_json=part):
                target = mapper.target(i, TOOL_USE)
                block = self.acc.apply(ToolArgsDelta(target, part))
                assert block is not None
                if self._in_flight_tool is None or self._in_flight_tool.get("id") != block.id:
                    self._in_flight_tool = {"id": block.id, "name": block.name, "partial_input_bytes": 0}
                self._in_flight_tool["partial_input_bytes"] += len(part.encode())
                await frame("tool_call_delta", block=target, id=block.id, name=block.name, arguments_delta=part)
                await self._maybe_checkpoint(len(part))
            case ThinkingDelta(index=i, thinking=text):
                target = mapper.target(i, THINKING)
                self.acc.apply(ThinkingDelta(target, text))
                await frame("thinking_delta", block=target, thinking=text)
            case SignatureDelta(index=i, signature=sig):
                self.acc.apply(SignatureDelta(mapper.target(i, THINKING), sig))
            case BlockStart(index=i, kind=kind):
                target = mapper.start(event)
                if target is None:
                    return
                block = self.acc.block_at(target)
                if kind == TOOL_USE and block is not None:
                    self._in_flight_tool = {"id": block.id, "name": block.name, "partial_input_bytes": 0}
                    await frame("tool_call_delta", block=target, id=block.id, name=block.name, arguments_delta="")
                elif kind not in (TEXT, THINKING) and block is not None:
                    await frame("block", block=target, content=block.to_content())
            case BlockStop(index=i):
                target = mapper.target(i, None)
                if joiner is not None and target == mapper.merge_index and not joiner.decided:
                    rest = joiner.flush()
                    if rest:
                        self.acc.apply(TextDelta(target, rest))
                        await frame("text_delta", block=target, text=rest)
                block = self.acc.apply(BlockStop(target))
                if block is not None and block.kind == TOOL_USE:
                    self._in_flight_tool = None
                    await self._write_checkpoint(force=True)
            case MessageStart(usage=usage):
                record.usage = record.usage.merged(usage)
            case UsageUpdate(usage=usage):
                record.usage = record.usage.merged(usage)
            case StopReason():
                self.acc.apply(event)
            case ProviderErrorEvent():
                error = self.ctx.adapter.classify_stream_error(event)
                raise StreamInterrupted(
                    InterruptCause.PROVIDER_ERROR_MID_STREAM, f"{event.error_type}: {event.message}", error
                )
            case StreamEnd():
                if joiner is not None and not joiner.decided and mapper.merge_index is not None:
                    rest = joiner.flush()
                    if rest:
                        self.acc.apply(TextDelta(mapper.merge_index, rest))
                        await frame("text_delta", block=mapper.merge_index, text=rest)
                raise _AttemptDone

    # ---- endings ----------------------------------------------------------------------

    async def _finish_completed(self) -> TurnResult:
        snapshot = self.acc.snapshot()
        stop = snapshot.stop_reason or "end_turn"
        keep: list[Block] = []
        for block in snapshot.blocks:
            # A clean end closes every block; anything unusable still never reaches history.
            block.closed = True
            if block.kind == TEXT and not block.text:
                continue
            if block.status() is BlockStatus.COMPLETE:
                keep.append(block)
        result = await self._finish_with(keep, stop)
        if self.continuation > 0:
            await self._emit(
                ev.LLM_STREAM_CONTINUATION_COMPLETED,
                continuation_attempt=self.continuation,
                completion_reason=stop,
            )
            result.recovered = True
        return result

    async def _finish_with(self, blocks: list[Block], stop_reason: str | None) -> TurnResult:
        await self.writer.delete(self.ctx.run_id)
        return TurnResult(
            "completed",
            blocks=[b.to_content() for b in blocks],
            stop_reason=stop_reason,
            continuations=self.continuation,
            discarded_tools=list(self.discarded_tools),
        )

    async def _fail(self, kind: str, message: str) -> TurnResult:
        await self.writer.delete(self.ctx.run_id)
        return TurnResult("failed", error={"kind": kind, "message": message}, continuations=self.continuation)

    # ---- helpers ------------------------------------------------------------------------

    def _check_cancel(self) -> None:
        if self.ctx.cancel.stopped:
            raise RunCancelled

    async def _publish_discards(self, recovery: RecoveryPlan) -> None:
        for block in recovery.discarded_tools:
            reason = "incomplete_arguments" if not block.closed else "invalid_arguments_json"
            self.discarded_tools.append({"id": block.id, "name": block.name, "reason": reason})
            await self._emit(
                ev.DISCARDED_PARTIAL_TOOL_USE,
                tool_name=block.name,
                tool_call_id=block.id,
                partial_input_bytes=len(block.arguments.encode()),
                reason=reason,
            )
        for block in recovery.discarded_thinking:
            reason = "restart" if block.status() is BlockStatus.COMPLETE else "unsigned_partial_thinking"
            await self._emit(
                ev.DISCARDED_THINKING,
                kind=block.kind,
                partial_bytes=len(block.text.encode()),
                reason=reason,
            )
        if recovery.kind is PlanKind.WHOLE_RESTART:
            if self.acc.blocks:
                await self.ctx.frame("stream_reset", reason="whole_restart")
            return
        for block in recovery.discarded_tools:
            await self.ctx.frame("tool_call_cancel", block=block.index, id=block.id, name=block.name, reason="partial")
        for block in [*recovery.discarded_thinking, *recovery.discarded_other]:
            await self.ctx.frame("block_cancel", block=block.index, kind=block.kind, reason="partial")

    async def _maybe_checkpoint(self, delta_bytes: int) -> None:
        if self.writer.note(delta_bytes):
            await self._write_checkpoint()

    async def _write_checkpoint(self, force: bool = False) -> None:
        keep = plan(self.acc.snapshot()).keep
        checkpoint = Checkpoint(
            run_id=self.ctx.run_id,
            turn=self.turn,
            history_len=self.history_len,
            blocks=[b.to_content() for b in keep],
            in_flight_tool=self._in_flight_tool,
            attempt=self._current_attempt.index if self._current_attempt else 0,
            continuation=self.continuation,
            seq=self.ctx.seq,
        )
        await self.writer.write(checkpoint)

    def _store_failed(self, what: str, exc: BaseException) -> None:
        """A checkpoint store outage is logged and the run goes on without it."""
        self.store_errors.append(f"{what}: {type(exc).__name__}: {exc}")
        log.warning("%s run_id=%s error=%s: %s", what, self.ctx.run_id, type(exc).__name__, exc)

    def _last_error_kind(self) -> str:
        record = self._current_attempt
        return (record.error_kind or record.interrupt_cause or "unknown") if record else "unknown"

    async def _emit(self, name: str, **fields: Any) -> None:
        attempt = self._current_attempt
        base = {
            "provider": self.ctx.provider_name or self.ctx.adapter.name,
            "model": self.request.model,
            "run_id": self.ctx.run_id,
            "turn_id": f"{self.ctx.run_id}:{self.turn}",
            "attempt": attempt.index if attempt else None,
        }
        await self.ctx.sink.on_event(StructuredEvent(name, {**base, **fields}))


class _IndexMapper:
    """Maps one response's block indices to the turn's, merging a continued text block."""

    def __init__(self, acc: Accumulator, prefix: list[Block]) -> None:
        self.acc = acc
        self.map: dict[int, int] = {}
        self.next = len(prefix)
        self.merge_index: int | None = len(prefix) - 1 if prefix and prefix[-1].kind == TEXT else None
        self._merge_open = self.merge_index is not None

    def start(self, event: BlockStart) -> int | None:
        if event.index in self.map:
            return self.map[event.index]
        if self._merge_open and event.kind == TEXT and self.merge_index is not None:
            self._merge_open = False
            self.map[event.index] = self.merge_index
            self.acc.reopen(self.merge_index)
            return self.merge_index
        self._merge_open = False
        target = self.next
        self.next += 1
        self.map[event.index] = target
        self.acc.apply(BlockStart(target, event.kind, event.id, event.name, event.data))
        return target

    def target(self, index: int, kind: str | None) -> int:
        if index in self.map:
            return self.map[index]
        # a delta for a block whose start never came (some compatible providers)
        self.start(BlockStart(index, kind or TEXT))
        return self.map[index]


def _as_restart(recovery: RecoveryPlan) -> RecoveryPlan:
    restart = RecoveryPlan(PlanKind.WHOLE_RESTART)
    restart.discarded_tools = list(recovery.discarded_tools)
    restart.discarded_thinking = list(recovery.discarded_thinking)
    restart.discarded_other = [*recovery.discarded_other, *recovery.keep]
    return restart


def _as_interrupted(exc: BaseException) -> StreamInterrupted:
    if isinstance(exc, StreamInterrupted):
        return exc
    if isinstance(exc, BodyDecodeError):
        return StreamInterrupted(InterruptCause.BODY_DECODE, str(exc))
    return StreamInterrupted(InterruptCause.SSE_PARSE, str(exc))


def _summary(blocks: list[Block]) -> dict[str, int]:
    return {
        "text_blocks": sum(1 for b in blocks if b.kind == TEXT),
        "text_chars": sum(len(b.text) for b in blocks if b.kind == TEXT),
        "tool_calls": sum(1 for b in blocks if b.kind == TOOL_USE),
        "thinking_blocks": sum(1 for b in blocks if b.kind == THINKING),
    }


def _request_id(headers: Any) -> str | None:
    for name in ("request-id", "x-request-id"):
        value = headers.get(name)
        if value:
            return str(value)
    return None
