"""The turn runner: one assistant turn, kept alive across broken streams.

One turn is a sequence of HTTP calls (attempts). The first is ``initial``; a call that
fails before its stream starts is retried as ``pre_stream_retry`` (own budget); a stream
that breaks is planned (R1-R4) and followed, after a backoff, by a ``continuation`` that
carries the kept blocks as history, or a ``restart`` when nothing was kept. This module
holds that loop and the turn's endings; translating events (``translate``), building
continuations (``continuation``) and recording attempts (``attempts``) live beside it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Unpack, overload

from . import sink as ev
from .attempts import count_input_tokens, open_attempt, run_attempt
from .blocks import TEXT, THINKING, TOOL_USE, Accumulator, Block, BlockStatus, Snapshot
from .checkpoint import Checkpoint, CheckpointWriter, CoalescePolicy
from .context import RunCancelled, RunContext
from .continuation import (
    ENDED_STOPS,
    NEVER_CONTINUE_STOPS,
    as_restart,
    continuation_messages,
    continue_from,
    joiner_for,
    prefill_refused,
    remember_prefill_refused,
    strategy_for,
    summary,
)
from .contract import (
    ModelRequest,
    ProviderAdapter,
    ResumableAdapter,
    ResumePoint,
    Strategy,
    follows_cursor,
    resumes_natively,
)
from .errors import ClaimLost, ErrorClass, InterruptCause, RequestFailed, StreamInterrupted
from .plan import PlanKind, RecoveryPlan, cut_short, native_plan, plan
from .protocol import FrameKind, RunStatus
from .retry import backoff_delay
from .sink import AttemptRecord, StructuredEvent
from .translate import AttemptDone, Translator, replay_block

log = logging.getLogger(__name__)

MIN_THINKING_BUDGET = 1024  # the smallest extended-thinking budget a provider takes
NATIVE_RESUME = PlanKind.NATIVE_RESUME.value  # the attempt kind and strategy of a re-attach
# a background response the turn leaves behind is cancelled while it goes on; the turn's end
# waits for that cancel no longer than this
ABANDON_CANCEL_TIMEOUT_S = 2.0


@dataclass(slots=True)
class DiscardedTool:
    """A tool call cut off before its arguments were complete: never executed."""

    id: str | None
    name: str | None
    reason: str  # incomplete_arguments, invalid_arguments_json

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "reason": self.reason}


@dataclass(slots=True)
class TurnResult:
    status: str  # completed, failed, exhausted, cancelled
    blocks: list[dict[str, Any]] = field(default_factory=list)  # canonical content of the assistant message
    stop_reason: str | None = None
    error: dict[str, str] | None = None
    continuations: int = 0
    recovered: bool = False
    discarded_tools: list[dict[str, Any]] = field(default_factory=list)  # {"id", "name", "reason"}


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
        self.translator = Translator(
            ctx, self._maybe_checkpoint, self._checkpoint_now, self._thinking_dropped, self._checkpoint_now
        )
        self._current_attempt: AttemptRecord | None = None
        self.store_errors: list[str] = []
        self.discarded_tools: list[dict[str, Any]] = []
        # output tokens the blocks this turn builds on cost so far (an upper bound), and those of
        # answers it dropped to start over (billed all the same): max_tokens is the turn's budget,
        # for both together. ``received_bytes`` is every byte of output received since the answer
        # last started over; ``base_input`` the provider's count of the turn's request, no prefix.
        self.output_used = 0
        self.dropped_output = 0
        self.counted: AttemptRecord | None = None  # the attempt whose output ``output_used`` holds last
        self.received_bytes = 0
        self.base_input: int | None = None
        self.joins: list[ev.JoinRecord] = []  # how each continuation joined the kept text
        self.native: ResumePoint | None = None  # where the current attempt re-attaches (native resume)
        self.budget_from = 0  # continuations spent before a failover: the fallback has a budget of its own
        self.failed_over = False
        self.failed_over_from: ProviderAdapter | None = None  # the adapter the turn failed over from
        # the background response a break (or the checkpoint resumed from) left generating, that
        # the turn may re-attach to: cancelled if the turn ends without reading it to its end
        self.unread: tuple[ResumableAdapter, str] | None = None
        self.stopping: list[asyncio.Task[None]] = []  # cancels of abandoned responses on their way
        self.abandoned: set[str] = set()  # the ids of those responses: each is cancelled once
        # tool calls native plans dropped while their arguments arrived, that no re-attached
        # stream has sent again: lost (``discarded_tools``) once the turn goes on another way
        self.unsent_tools: list[Block] = []
        # the blocks the client holds while a plan waits for its continuation (its drops sent):
        # what a turn ending then keeps from; None while the client holds the turn's blocks
        self.held: list[Block] | None = None

    # ---- public -------------------------------------------------------------------------

    async def run(self, resume: Checkpoint | None = None) -> TurnResult:
        try:
            result = await self._run(resume)
        except asyncio.CancelledError:
            for task in self.stopping:  # the turn itself is stopped: so are its cancels on the way
                task.cancel()
            raise
        finally:
            # A cancel of an abandoned response ran beside the recovery; the turn ends once it is
            # answered (each within ABANDON_CANCEL_TIMEOUT_S), leaving no task behind.
            stopped = await asyncio.gather(*self.stopping, return_exceptions=True)
        _raise_claim_lost(stopped)
        return result

    async def _run(self, resume: Checkpoint | None) -> TurnResult:
        try:
            if resume is not None:
                early = await self._resume(resume)
                if early is not None:
                    return early
            return await self._loop()
        except RunCancelled:
            self._cancel_response()
            return await self._end_short(
                RunStatus.CANCELLED, {"kind": self.ctx.cancel.kind or "cancel", "message": self.ctx.cancel.reason}
            )

    # ---- the loop -----------------------------------------------------------------------

    async def _loop(self) -> TurnResult:
        while True:
            self.ctx.check_cancel()
            try:
                await self._attempt()
            except AttemptDone:
                self._note_join()
                return await self._finish_completed()
            except RequestFailed as failed:
                error = failed.error
                if self.native is not None:
                    # the response is gone (404, expired) or re-attaching failed: continue instead
                    outcome = await self._native_failed(error.kind, error.message)
                    if outcome is not None:
                        return outcome
                    continue
                if error.error_class is ErrorClass.PREFILL_REFUSED and self.strategy is Strategy.PREFILL:
                    # The model takes no prefill: same continuation, explicit continue message,
                    # and no prefill again for this model in this run (nor in this process).
                    self.ctx.prefill_refused.add(self.request.model)
                    remember_prefill_refused(self.ctx.provider, self.request.model)
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
                    kept = plan(self.acc.snapshot())
                    if await self._fail_over(error.kind, kept):
                        outcome = await self._next_continuation(None, kept)
                        if outcome is not None:
                            return outcome
                        continue
                return await self._fail(error.kind, error.message)
            except StreamInterrupted as interrupted:
                self._note_join()
                self.ctx.check_cancel()
                outcome = await self._on_interrupted(interrupted)
                if outcome is not None:
                    return outcome

    async def _attempt(self) -> None:
        """One provider call with its pre-stream retries; raises AttemptDone on the terminator."""
        cfg = self.ctx.config
        native = self.native
        budgeted: ModelRequest | None = None
        if native is not None:
            assert resumes_natively(self.ctx.adapter)
            http_request = self.ctx.adapter.resume_request(native)
        else:
            messages = continuation_messages(self.request.messages, self.prefix, self.strategy)
            budgeted = self._budgeted(replace(self.request, messages=messages))
            http_request = self.ctx.adapter.build_request(budgeted)
        retries = 0
        kind = self.attempt_kind
        while True:
            self.ctx.check_cancel()
            self._current_attempt = record = await open_attempt(
                self.ctx,
                turn=self.turn,
                kind=kind,
                continuation=self.continuation,
                strategy=self._strategy_name(),
                http_request=http_request,
            )
            if native is not None:
                # the same response goes on: no join to make; a closed text block is not reopened
                merge = bool(self.prefix) and not self.prefix[-1].closed
                self.translator.begin(self.acc, self.prefix, None, merge=merge)
            else:
                assert budgeted is not None
                joiner = joiner_for(self.prefix, self.strategy, self.ctx.adapter.echoes_prefix)
                self.translator.begin(self.acc, self.prefix, joiner, budgeted.max_tokens)
            # only pre-stream failures come back here
            error = await run_attempt(self.ctx, http_request, record, self.translator)
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
            await self.ctx.sleep(delay)
            kind = "pre_stream_retry"

    async def _on_interrupted(self, interrupted: StreamInterrupted) -> TurnResult | None:
        self.output_used += self._attempt_output()
        self.counted = self._current_attempt
        self.received_bytes += self.translator.received_bytes
        snapshot = self.acc.snapshot()
        # a response that sent an error has failed: re-attaching would replay the error
        failed = interrupted.cause is InterruptCause.PROVIDER_ERROR_MID_STREAM
        point = None if failed else self._resume_point()
        adapter = self.ctx.adapter
        self.unread = (adapter, point.response_id) if point is not None and resumes_natively(adapter) else None
        recovery = native_plan(snapshot) if point is not None else plan(snapshot)
        provider_error = interrupted.provider_error
        permanent = provider_error is not None and provider_error.permanent
        never = snapshot.stop_reason in NEVER_CONTINUE_STOPS
        # The stop reason arrived, so the answer had ended: only the terminator (and, where the
        # provider sends usage after the stop reason, the final usage) was lost.
        ended = snapshot.stop_reason in ENDED_STOPS and not permanent
        structured_restart = (
            point is None
            and recovery.continues
            and self.request.structured
            and self._strategy() is not Strategy.PREFILL
        )
        if structured_restart:
            recovery = as_restart(recovery)
        self._note_unsent(snapshot, recovery)

        kept_chars = sum(len(b.text) for b in recovery.keep if b.kind == TEXT)
        attempt = self._current_attempt
        usage_flushed = self.translator.final_usage
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
            answer_complete=ended,
            final_usage_missing=not usage_flushed,
            plan=recovery.kind.value,
            kept_text_chars=kept_chars,
            kept_output_tokens_estimate=-(-kept_chars // 4),
            turn_output_tokens=self._used(),
            max_tokens=self.request.max_tokens,
        )
        if snapshot.stop_reason is not None and attempt is not None:
            # visible on the attempt: interrupted, yet with the stop reason that had arrived
            attempt.stop_reason = snapshot.stop_reason
            attempt.stop_sequence = snapshot.stop_sequence
            await self.ctx.sink.on_attempt(attempt)
        if ended:
            return await self._finish_completed()
        if point is None and not failed:
            self._abandon_unresumable()
        await self._publish_discards(recovery)
        self.held = recovery.keep
        if never:
            # A refusal or content filter already arrived: the answer ends here, as it is.
            return await self._finish_with(recovery.keep, snapshot.stop_reason)
        if permanent:
            assert provider_error is not None
            if recovery.kind is not PlanKind.SYNTHESIZE_TOOL_USE and await self._fail_over(
                provider_error.kind, recovery
            ):
                return await self._next_continuation(None, recovery)
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
        measuring: asyncio.Task[None] | None = None
        if point is None and self._spent():
            # The running bound says the budget is spent: the provider's count decides, now.
            await self._measure(recovery)
        elif recovery.continues:
            # The bound leaves budget, and the count only lowers it (it can never end the turn):
            # it runs while the checkpoint is written and the backoff waits, not before them.
            measuring = asyncio.ensure_future(self._measure(recovery))
        if point is None and self._spent():
            # The turn's budget is spent: it ends here, as an uninterrupted answer at its limit would.
            return await self._out_of_budget(recovery)
        retry_after = provider_error.retry_after_s if provider_error is not None else None
        try:
            return await self._next_continuation(retry_after, recovery, point, measuring)
        finally:
            if measuring is not None and not measuring.done():  # the turn ended or was cancelled
                measuring.cancel()
            elif measuring is not None and not measuring.cancelled():
                measuring.exception()  # retrieved: a count that failed after the turn ended is moot

    async def _next_continuation(
        self,
        retry_after_s: float | None,
        recovery: RecoveryPlan,
        point: ResumePoint | None = None,
        measuring: asyncio.Task[None] | None = None,
    ) -> TurnResult | None:
        """Spend one continuation: checkpoint, back off (cancellable), set up the prefix (a
        native resume at ``point`` when the plan is one). ``measuring``, the provider's count of
        what the turn has used, is awaited after the backoff, before the budget is read."""
        cfg = self.ctx.config
        self.held = recovery.keep
        await self._write_checkpoint(force=True)
        if (
            self.continuation - self.budget_from >= cfg.max_continuations
            and await self._fail_over("exhausted", recovery)  # a fallback brings a budget of its own
            and recovery.kind is PlanKind.NATIVE_RESUME
        ):
            # The resume point belongs to the provider that issued it: the fallback cannot
            # re-attach to that response, so it carries on the ordinary way from the blocks
            # the native plan kept, as when a re-attach fails (``_native_failed``).
            recovery = await self._off_native(recovery, point)
            point = None
            if recovery.kind is PlanKind.SYNTHESIZE_TOOL_USE:
                result = await self._finish_with(recovery.keep, "tool_use")
                result.recovered = True
                return result
        if self.continuation - self.budget_from >= cfg.max_continuations:
            await self._emit(
                ev.LLM_STREAM_CONTINUATION_EXHAUSTED,
                attempts=self.continuation,
                final_reason=self._last_error_kind(),
            )
            await self.ctx.frame(
                FrameKind.RECOVERY, phase="exhausted", attempt=self.continuation, plan=recovery.kind.value
            )
            return await self._end_short(
                RunStatus.EXHAUSTED,
                {
                    "kind": "exhausted",
                    "message": f"gave up after {self.continuation} continuation attempts ({self._last_error_kind()})",
                },
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
            FrameKind.RECOVERY, phase="backoff", attempt=self.continuation, plan=recovery.kind.value, backoff_s=delay
        )
        await self.ctx.sleep(delay)
        if measuring is not None:
            await measuring
        if point is not None and recovery.kind is PlanKind.NATIVE_RESUME:
            self._set_native(recovery.keep, point)
        else:
            self._set_prefix(recovery)
        await self._emit(
            ev.LLM_STREAM_CONTINUATION_STARTED,
            continuation_attempt=self.continuation,
            backoff_s=delay,
            committed=summary(self.prefix),
            strategy=self._strategy_name(),
            plan=recovery.kind.value,
        )
        await self.ctx.frame(
            FrameKind.RECOVERY,
            phase="continuing",
            attempt=self.continuation,
            plan=recovery.kind.value,
            backoff_s=delay,
        )
        return None

    def _set_native(self, keep: list[Block], point: ResumePoint) -> None:
        """The next attempt re-attaches at ``point``, from exactly the blocks ``keep``."""
        self.prefix = [b.copy() for b in keep]
        self.acc = Accumulator()
        self.acc.restore([b.copy() for b in keep])
        self.strategy, self.attempt_kind, self.native = None, NATIVE_RESUME, point
        self.held = None

    async def _native_failed(self, kind: str, message: str) -> TurnResult | None:
        """Re-attaching failed before its stream started: the same break is recovered the
        ordinary way, from the blocks the turn holds, without spending another continuation.
        The response, unless gone, is cancelled: nobody will read it, and it goes on being billed."""
        point, self.native, self.unread = self.native, None, None  # gone, or abandoned below
        self._lose_unsent()
        recovery = self._ordinary_plan(self.acc.snapshot())
        await self._emit(
            ev.LLM_STREAM_CONTINUATION_FAILED,
            continuation_attempt=self.continuation,
            error_kind=kind,
            error_message=message,
            fallback_strategy=self._strategy().value,
        )
        if point is not None and kind != "not_found" and resumes_natively(self.ctx.adapter):
            self._abandon(self.ctx.adapter, point.response_id, "reattach_failed")
        await self._publish_discards(recovery)
        if recovery.kind is PlanKind.SYNTHESIZE_TOOL_USE:
            result = await self._finish_with(recovery.keep, "tool_use")
            result.recovered = True
            return result
        if self._spent():
            # the re-attached response would have gone on within its own budget; a continuation
            # asks for what is left, and nothing the provider takes is left
            await self._measure(recovery)
            if self._spent():
                return await self._out_of_budget(recovery)
        self._set_prefix(recovery)
        return None

    def _ordinary_plan(self, snapshot: Snapshot) -> RecoveryPlan:
        """The plan of blocks a native resume kept, for a provider that continues instead: a
        structured answer goes on only by prefill (``ModelRequest.structured``), else starts over."""
        recovery = plan(snapshot)
        if recovery.continues and self.request.structured and self._strategy() is not Strategy.PREFILL:
            recovery = as_restart(recovery)
        return recovery

    async def _off_native(self, native: RecoveryPlan, point: ResumePoint | None) -> RecoveryPlan:
        """The turn failed over from a native plan: the fallback's ordinary plan of the blocks it
        kept, its drops sent to the client. A tool call a native plan dropped while it was
        still arriving is lost now: no re-attached stream will send it again. The response at
        ``point`` is cancelled first: it would go on being generated, and billed, for nobody."""
        self._lose_unsent()
        left = self.failed_over_from
        if point is not None and resumes_natively(left):
            self._abandon(left, point.response_id, "failover")
        recovery = self._ordinary_plan(Snapshot(tuple(native.keep)))
        await self._publish_discards(recovery)
        self.held = recovery.keep
        return recovery

    def _note_unsent(self, snapshot: Snapshot, recovery: RecoveryPlan) -> None:
        """At a break: a native plan's dropped tool calls wait to be sent again (a call the
        response sent again, whole or not, is the snapshot's, as the plan says); any other
        plan leaves the response, and those still waiting are lost."""
        sent = {_tool_key(b) for b in snapshot.blocks if b.kind == TOOL_USE}
        self.unsent_tools = [b for b in self.unsent_tools if _tool_key(b) not in sent]
        if recovery.kind is PlanKind.NATIVE_RESUME:
            self.unsent_tools.extend(recovery.discarded_tools)
        else:
            self._lose_unsent()

    def _lose_unsent(self) -> None:
        """The turn no longer re-attaches: the tool calls still waiting to be sent again are
        discarded (the client dropped them at their break, and the event was emitted then), so
        the model may be told they were not executed. Once each: the list is emptied."""
        recorded = {d["id"] for d in self.discarded_tools if d["id"] is not None}
        for block in self.unsent_tools:
            if block.id is None or block.id not in recorded:
                self.discarded_tools.append(DiscardedTool(block.id, block.name, _discard_reason(block)).as_dict())
                recorded.add(block.id)
        self.unsent_tools = []

    def _abandon(self, adapter: ResumableAdapter, response_id: str, reason: str) -> None:
        """Cancel a background response the turn leaves behind, beside whatever the turn does
        next (a backoff, the next request: the recovery waits for nothing), and record it
        (``llm_response_abandoned``). Best effort: the turn's end waits for it at most
        ``ABANDON_CANCEL_TIMEOUT_S`` (``run``), and a cancel that fails is logged, never raised
        (but a ``ClaimLost`` recording it, which stops the run at the turn's end: ``run``). Once
        per response: a cancel of the run right after a break that abandoned it adds nothing."""
        if self.unread is not None and self.unread[1] == response_id:
            self.unread = None
        if response_id in self.abandoned:
            return
        self.abandoned.add(response_id)
        attempt = self._current_attempt  # the event is the break's, whatever attempt runs by then
        self.stopping.append(asyncio.ensure_future(self._abandon_now(adapter, response_id, reason, attempt)))

    async def _abandon_now(
        self, adapter: ResumableAdapter, response_id: str, reason: str, attempt: AttemptRecord | None
    ) -> None:
        timeout = min(self.ctx.config.connect_timeout_s, ABANDON_CANCEL_TIMEOUT_S)
        try:
            status, error = await self._stop_response(adapter, response_id, timeout)
            if error is not None:
                log.warning(
                    "response_cancel_failed run_id=%s response_id=%s error=%s", self.ctx.run_id, response_id, error
                )
            fields: ev.ResponseAbandonedFields = {
                "response_id": response_id,
                "reason": reason,
                "cancelled": status == "cancelled",
                "response_status": status,
                "error": error,
            }
            await self._emit_at(attempt, ev.LLM_RESPONSE_ABANDONED, fields)
        except Exception as exc:  # the run goes on regardless (a ClaimLost stops it: ``run``)
            log.warning(
                "response_abandon_failed run_id=%s response_id=%s error=%s: %s",
                self.ctx.run_id,
                response_id,
                type(exc).__name__,
                exc,
            )

    def _abandon_unresumable(self) -> None:
        """A break with no point to re-attach at (a continuation's seam was still open) in a
        background response: the turn goes on without it, and it would go on being generated,
        and billed, for nobody. Cancelled beside the recovery, as after a failover."""
        adapter = self.ctx.adapter
        if not resumes_natively(adapter):
            return
        left = self._read_point()
        if left is not None:
            self._abandon(adapter, left.response_id, "no_resume_point")

    def _abandon_unread(self, status: str) -> None:
        """The turn ends cut short (failed, exhausted) with a background response a break left
        unread: nobody will read it now, and it goes on being billed. Cancelled as after a failover."""
        if self.unread is not None and status != RunStatus.CANCELLED:  # a cancel stops it itself
            adapter, response_id = self.unread
            self._abandon(adapter, response_id, status)

    async def _stop_response(
        self, adapter: ResumableAdapter, response_id: str, timeout: float
    ) -> tuple[str | None, str | None]:
        """``POST .../responses/{id}/cancel`` within ``timeout`` seconds in all: the response's
        status as the answer gives it, and why the cancel failed (None when it did not)."""
        transport = self.ctx.transport
        if transport is None:
            return None, "no transport"
        request = adapter.cancel_request(response_id)

        async def cancel() -> tuple[int, bytes]:
            opened = await transport.open(request.method, request.url, request.headers, request.json, timeout, timeout)
            try:
                return opened.status, await opened.read_error_body()
            finally:
                await opened.close()

        try:
            code, body = await asyncio.wait_for(cancel(), timeout)
        except Exception as exc:  # no answer in time, or none at all: the turn goes on regardless
            return None, type(exc).__name__
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        status = answer.get("status") if isinstance(answer, dict) else None
        status = status if isinstance(status, str) else None
        if not 200 <= code < 300:
            return status, f"HTTP {code}"
        return status, None

    def _resume_point(self) -> ResumePoint | None:
        """Where the broken response can be re-attached, when the provider's setting allows it
        and the blocks hold exactly its state there (not while a continuation's seam is open)."""
        if not resumes_natively(self.ctx.adapter) or not follows_cursor(self.translator.parser):
            return None
        joiner = self.translator.joiner
        if joiner is not None and not joiner.decided:
            return None
        return self._read_point()

    def _read_point(self) -> ResumePoint | None:
        """Where the background response the current attempt reads stands now, seam or not."""
        parser = self.translator.parser
        point = None
        if follows_cursor(parser):
            point = parser.resume_point(self.native.response_id if self.native is not None else None)
        # a re-attached stream that broke (or was stopped) before its first event stands where it was
        return point if point is not None else self.native

    def _cancel_response(self) -> None:
        """A stopped run (a user's cancel, an abort) stops its background response too, which
        would otherwise go on generating (and being billed) with nobody reading it: abandoned
        as any response the turn leaves behind (``_abandon``), the stop's kind as the reason. The
        run ends cancelled meanwhile; the turn's end waits for the cancel only briefly (``run``)."""
        adapter = self.ctx.adapter
        if self.ctx.transport is None:
            return
        # Before its stream carries an event (a re-attach not yet streaming, a run resumed from
        # a checkpoint and cancelled before it re-attached), the parser knows no point: the
        # response is the one the turn re-attaches to, or the one a break or checkpoint left.
        stop, self.unread = self.unread, None
        if resumes_natively(adapter) and (point := self._read_point()) is not None:
            stop = (adapter, point.response_id)
        if stop is not None:
            self._abandon(stop[0], stop[1], str(self.ctx.cancel.kind or "cancel"))

    def _strategy_name(self) -> str | None:
        """How the current attempt carries on: ``native_resume``, or the continuation strategy."""
        if self.native is not None:
            return NATIVE_RESUME
        return self.strategy.value if (self.strategy and self.prefix) else None

    async def _fail_over(self, reason: str, recovery: RecoveryPlan) -> bool:
        """Switch to the context's fallback provider and model, once per turn: the next
        continuation goes there, from the same prefix, with a fresh continuation budget.
        False when there is none (or it was used)."""
        fallback = self.ctx.failover
        if fallback is None or self.failed_over:
            return False
        if self.request.max_tokens - self._used() < fallback.adapter.min_max_tokens:
            return False  # the fallback could not be asked for what is left of the budget
        self.failed_over = True
        self.failed_over_from = self.ctx.adapter
        await self._emit(
            ev.LLM_STREAM_FAILOVER,
            continuation_attempt=self.continuation,
            reason=reason,
            from_provider=self.ctx.provider,
            from_model=self.request.model,
            to_provider=fallback.provider_name,
            to_model=fallback.model,
            plan=recovery.kind.value,
        )
        self.ctx.adapter = fallback.adapter
        self.ctx.provider_name = fallback.provider_name
        self.request = replace(self.request, model=fallback.model)
        if fallback.extra is not None:  # a fallback of another wire format: the fields in its own
            self.request = replace(self.request, extra=dict(fallback.extra))
        self.strategy = None
        self.budget_from = self.continuation
        return True

    def _set_prefix(self, recovery: RecoveryPlan) -> None:
        self.native = None
        self.held = None
        chosen = continue_from(recovery, self._strategy())
        if chosen.kind == "restart":
            # the answer starts over, and what it dropped was billed: it still counts against
            # the turn's budget (the restart asks for what is left), but not as a prefix's cost
            self.dropped_output += self.output_used
            self.output_used = self.received_bytes = 0
        self.prefix, self.strategy, self.acc, self.attempt_kind = (
            chosen.prefix,
            chosen.strategy,
            chosen.acc,
            chosen.kind,
        )

    def _attempt_output(self) -> int:
        """Output tokens of the attempt that just broke: the provider's count when its final usage
        arrived, else an upper bound (the bytes received, at least one per token; where the server
        streams a token per text delta, ``delta_token_bound`` of each; the provider's running
        count when that is higher)."""
        record = self._current_attempt
        reported = record.usage.output_tokens if record is not None else None
        if self.translator.final_usage and reported is not None:
            return reported
        return max(self.translator.received_tokens(self.ctx.adapter.text_delta_is_token), reported or 0)

    async def _measure(self, recovery: RecoveryPlan) -> None:
        """Refine ``output_used`` with the provider's own count, where it has a free one: the
        continuation's input tokens less the turn request's are the prefix it carries (an upper
        bound: the framing a continuation adds counts too); every received byte not in that
        prefix (thinking, dropped blocks, a prefill's held-back whitespace) still counts as one
        token. The lower of this and the running bound is kept: both only over-count."""
        adapter = self.ctx.adapter
        chosen = continue_from(recovery, self._strategy())
        if chosen.kind == "restart":
            return
        messages = continuation_messages(self.request.messages, chosen.prefix, chosen.strategy)
        prefixed = adapter.count_request(replace(self.request, messages=messages))
        if prefixed is None:
            return
        if self.base_input is None:  # the turn's first break: both counts at once, one round trip
            base = adapter.count_request(self.request)
            if base is None:
                return
            self.base_input, counted = await asyncio.gather(
                count_input_tokens(self.ctx, base), count_input_tokens(self.ctx, prefixed)
            )
        else:
            counted = await count_input_tokens(self.ctx, prefixed)
        if counted is None or self.base_input is None:
            return
        sent = _sent_bytes(messages[len(self.request.messages)], chosen.prefix)
        measured = max(0, counted - self.base_input) + max(0, self.received_bytes - sent)
        self.output_used = min(self.output_used, measured)

    def _answer_output(self) -> tuple[int, int]:
        """``output_used`` and ``received_bytes`` with the output of the attempt streaming now,
        counted only once it breaks: what the answer cost and received so far, kept or not."""
        attempt = self._current_attempt
        if attempt is None or attempt is self.counted:
            return self.output_used, self.received_bytes
        return self.output_used + self._attempt_output(), self.received_bytes + self.translator.received_bytes

    def _used(self) -> int:
        """Output tokens the turn was billed so far (an upper bound), kept or dropped."""
        return self.dropped_output + self.output_used

    def _spent(self) -> bool:
        """True when what is left of the turn's ``max_tokens`` is below the smallest budget the
        provider takes in a request (OpenAI Responses: 16): no further call can be made."""
        return self.request.max_tokens - self._used() < self.ctx.adapter.min_max_tokens

    async def _out_of_budget(self, recovery: RecoveryPlan) -> TurnResult:
        """End the turn at its budget with what it keeps, as an uninterrupted answer at its
        limit would (a whole restart keeps nothing: the answer is empty)."""
        keep = recovery.keep if recovery.continues else []
        result = await self._finish_with(keep, "max_tokens")
        result.recovered = self.continuation > 0
        return result

    def _budgeted(self, request: ModelRequest) -> ModelRequest:
        """A continuation or a restart asks for what is left of the turn's ``max_tokens``, never
        more. An extended-thinking budget must stay below it (and at least 1024): lowered, or left
        out. The callers end the turn before too little is left (``_spent``): asking for less
        than the provider takes would be refused, so that is a bug, raised."""
        used = self._used()
        if not used:
            return request
        left = request.max_tokens - used
        if left < self.ctx.adapter.min_max_tokens:
            raise ValueError(
                f"max_tokens left ({left}) is below the provider's minimum ({self.ctx.adapter.min_max_tokens})"
            )
        thinking = request.thinking_budget
        if thinking is not None and thinking >= left:
            thinking = left - 1 if left - 1 >= MIN_THINKING_BUDGET else None
        return replace(request, max_tokens=left, thinking_budget=thinking)

    def _strategy(self) -> Strategy:
        """The model's strategy; ``continue_message`` once it refused a prefill in this run or process."""
        strategy = strategy_for(self.ctx.adapter, self.request)
        model = self.request.model
        if strategy is Strategy.PREFILL and (
            model in self.ctx.prefill_refused or prefill_refused(self.ctx.provider, model)
        ):
            return Strategy.CONTINUE_MESSAGE
        return strategy

    # ---- resume from a checkpoint -----------------------------------------------------

    async def _resume(self, checkpoint: Checkpoint) -> TurnResult | None:
        """Pick up a turn another process left: replay what it kept, then go on from it."""
        blocks = [Block.from_content(i, c) for i, c in enumerate(checkpoint.blocks)]
        # The client may have seen more than the checkpoint: reset it to exactly the checkpoint.
        await self.ctx.frame(FrameKind.STREAM_RESET, reason="resume")
        for block in blocks:
            await replay_block(self.ctx, block)
        native = self._checkpoint_point(checkpoint)
        if native is not None and blocks and (checkpoint.native or {}).get("open_text") is True:
            blocks[-1].closed = False  # the re-attached stream goes on inside it
        # as at a break: a structured answer is not continued, it starts over (``_ordinary_plan``)
        snapshot = Snapshot(tuple(blocks))
        recovery = native_plan(snapshot) if native is not None else self._ordinary_plan(snapshot)
        await self._emit(
            ev.LLM_RUN_RESUMED,
            plan=recovery.kind.value,
            committed=summary(recovery.keep),
            checkpoint_attempt=checkpoint.attempt,
            checkpoint_continuation=checkpoint.continuation,
        )
        self.continuation = checkpoint.continuation  # a resume spends no continuation
        self.discarded_tools = list(checkpoint.discarded_tools)
        self.dropped_output = checkpoint.dropped_output  # billed: still counted against max_tokens
        if native is not None and resumes_natively(self.ctx.adapter):
            # generating still, for all this worker knows: a cancel before it re-attaches stops it
            self.unread = (self.ctx.adapter, native.response_id)
        ending = checkpoint.ending
        if ending is not None:
            # The turn had ended cut short (the worker died before committing it): it ends so,
            # with the text its client was shown, just replayed.
            return TurnResult(
                ending["status"],
                blocks=[b.to_content() for b in blocks],
                error=ending.get("error"),
                continuations=self.continuation,
            )
        if checkpoint.stop_reason is not None:
            # The answer was complete (the worker died before it was committed): it is the answer.
            self.acc.restore(blocks)
            result = await self._finish_with(blocks, checkpoint.stop_reason)
            result.recovered = True
            return result
        if self.ctx.cancel.stopped:
            # Cancelled while no worker held the run: it ends with what its client was just shown,
            # neither continued nor asked for again.
            self.held = blocks
            raise RunCancelled
        if native is not None:
            # the response went on generating while no worker read it: re-attach where the
            # checkpoint's blocks end (a failure falls back to continuing from them)
            self._set_native(recovery.keep, native)
            self.output_used, self.received_bytes = checkpoint.output_used or 0, checkpoint.received_bytes
            return None
        if recovery.kind is PlanKind.WHOLE_RESTART and blocks:
            # the answer starts over, as at a break: the client drops what it was just shown
            await self.ctx.frame(FrameKind.STREAM_RESET, reason="whole_restart")
        if checkpoint.output_used is None:
            # a checkpoint from before does not say what its blocks cost: their bytes over-count
            # it, the provider's count (where it has one) tells it
            self.received_bytes = sum(len(b.text.encode()) + len(b.arguments.encode()) for b in blocks)
            self.output_used = self.received_bytes
        else:
            # What the answer cost and received, what its blocks do not hold included (thinking
            # cut off, a tool call half received: billed all the same), counted as the worker that
            # wrote it would have: ``_measure`` counts every received byte not in the prefix. A
            # restart drops it all (``_set_prefix``).
            self.output_used, self.received_bytes = checkpoint.output_used, checkpoint.received_bytes
        if recovery.kind is PlanKind.SYNTHESIZE_TOOL_USE:
            self.acc.restore(recovery.keep)
            result = await self._finish_with(recovery.keep, "tool_use")
            result.recovered = True
            return result
        if recovery.continues:
            await self._measure(recovery)
        if self._spent():
            # as at a break: the answer ends at its budget with what it keeps (a restart: nothing)
            keep = recovery.keep if recovery.continues else []
            self.acc.restore(keep)
            result = await self._finish_with(keep, "max_tokens")
            result.recovered = True
            return result
        self._set_prefix(recovery)
        if self.prefix:
            self.attempt_kind = "resume"
        return None

    def _checkpoint_point(self, checkpoint: Checkpoint) -> ResumePoint | None:
        native = checkpoint.native
        adapter = self.ctx.adapter
        if not native or not resumes_natively(adapter):
            return None
        response_id, after = native.get("response_id"), native.get("after")
        if not isinstance(response_id, str) or type(after) is not int:
            return None
        return ResumePoint(response_id, after)

    # ---- endings ----------------------------------------------------------------------

    async def _finish_completed(self) -> TurnResult:
        snapshot = self.acc.snapshot()
        stop = snapshot.stop_reason or "end_turn"
        keep: list[Block] = []
        for block in snapshot.blocks:
            # A clean end closes every block; anything unusable still never reaches history,
            # and the client, which saw it stream, is told it is gone.
            reason = _discard_reason(block)  # read before the block is closed here
            block.closed = True
            if block.kind == TEXT and not block.text:
                continue
            if block.status() is BlockStatus.COMPLETE:
                keep.append(block)
            elif block.kind == THINKING:
                await self._unsigned_thinking_dropped(block)
            elif block.kind == TOOL_USE:
                # arguments that do not parse (max_tokens hit inside them): dropped as at a break
                await self._tool_dropped(block, reason)
        result = await self._finish_with(keep, stop)
        if self.continuation > 0:
            await self._emit(
                ev.LLM_STREAM_CONTINUATION_COMPLETED,
                continuation_attempt=self.continuation,
                completion_reason=stop,
                join=self.joins[-1]["kind"] if self.joins else None,
                joins=list(self.joins),
            )
            result.recovered = True
        return result

    async def settled(self) -> None:
        """What the turn ended with is committed (or there was none to commit): only now may its
        checkpoint go. Deleted before the commit, a worker dying in between would lose an answer
        that was paid for (or the text a turn cut short had shown), and the next one would ask
        for it again."""
        await self.writer.delete(self.ctx.run_id)

    async def _finish_with(self, blocks: list[Block], stop_reason: str | None) -> TurnResult:
        # The checkpoint now holds the whole answer and stays until the caller has committed it
        # (``settled``): a worker dying in between leaves it for the next one, paid for once.
        await self._write_checkpoint(force=True, blocks=blocks, stop_reason=stop_reason or "end_turn")
        return TurnResult(
            RunStatus.COMPLETED,
            blocks=[b.to_content() for b in blocks],
            stop_reason=stop_reason,
            continuations=self.continuation,
            discarded_tools=list(self.discarded_tools),
        )

    async def _fail(self, kind: str, message: str) -> TurnResult:
        return await self._end_short(RunStatus.FAILED, {"kind": kind, "message": message})

    async def _end_short(self, status: str, error: dict[str, str]) -> TurnResult:
        """End the turn before its answer did (cancelled, failed, exhausted) with what its client
        was shown (``_cut_short``). Like a completed answer, that is checkpointed with how the turn
        ended and the checkpoint stays until the caller has committed it (``settled``): a worker
        dying in between leaves it to the next one, which ends the turn the same way."""
        keep = await self._cut_short()
        self._abandon_unread(status)
        await self._write_checkpoint(force=True, blocks=keep, ending={"status": status, "error": error})
        return TurnResult(status, blocks=[b.to_content() for b in keep], error=error, continuations=self.continuation)

    async def _cut_short(self) -> list[Block]:
        """The content a turn ending before its answer did commits (``plan.cut_short``): the text
        the client was shown, as it was shown. What else it shows is dropped first, with the
        frames a break sends, so the client rebuilds exactly the committed message."""
        shown = self.held if self.held is not None else list(self.acc.snapshot().blocks)
        self.held = None
        cut = cut_short(shown)
        tools: list[tuple[Block, str]] = []
        for block in cut.discarded_tools:
            complete = block.status() is BlockStatus.COMPLETE
            # a call cut off is lost as at a break; a whole one was simply never run
            await self._tool_discarded(block, "not_executed" if complete else _discard_reason(block), lost=not complete)
            tools.append((block, "not_executed" if complete else "partial"))
        for block in cut.discarded_thinking:
            await self._emit(
                ev.DISCARDED_THINKING, kind=block.kind, partial_bytes=len(block.text.encode()), reason="cut_short"
            )
        await self._send_drops(tools, [*cut.discarded_thinking, *cut.discarded_other])
        return cut.keep

    # ---- helpers ------------------------------------------------------------------------

    async def _publish_discards(self, recovery: RecoveryPlan) -> None:
        for block in recovery.discarded_tools:
            # a native resume receives the call again, whole: not a tool call the turn lost
            await self._tool_discarded(block, _discard_reason(block), lost=recovery.kind is not PlanKind.NATIVE_RESUME)
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
                await self.ctx.frame(FrameKind.STREAM_RESET, reason="whole_restart")
            return
        await self._send_drops(
            [(block, "partial") for block in recovery.discarded_tools],
            [*recovery.discarded_thinking, *recovery.discarded_other],
        )

    async def _send_drops(self, tools: list[tuple[Block, str]], others: list[Block]) -> None:
        """The frames that tell the client to drop blocks it was shown and that will not be
        stored: each tool call (with why) first, then the other blocks."""
        for block, reason in tools:
            await self.ctx.frame(
                FrameKind.TOOL_CALL_CANCEL, block=block.index, id=block.id, name=block.name, reason=reason
            )
        for block in others:
            await self.ctx.frame(FrameKind.BLOCK_CANCEL, block=block.index, kind=block.kind, reason="partial")

    async def _tool_discarded(self, block: Block, reason: str, *, lost: bool = True) -> None:
        """Record a tool call that is never run nor committed: the event, and, when the turn
        loses it (``lost``), the turn result's ``discarded_tools`` (the model may be told)."""
        if lost:
            self.discarded_tools.append(DiscardedTool(block.id, block.name, reason).as_dict())
        await self._emit(
            ev.DISCARDED_PARTIAL_TOOL_USE,
            tool_name=block.name,
            tool_call_id=block.id,
            partial_input_bytes=len(block.arguments.encode()),
            reason=reason,
        )

    async def _tool_dropped(self, block: Block, reason: str) -> None:
        """A tool call a completed answer ends with, unusable: recorded as at a break, and the
        client, which saw it stream, drops it, so it shows what is committed."""
        await self._tool_discarded(block, reason)
        await self._send_drops([(block, "partial")], [])

    async def _unsigned_thinking_dropped(self, block: Block) -> None:
        """Reasoning that ended without a signature (DeepSeek's ``reasoning_content``, a Gemini
        thought run never signed): the provider takes none of it back, so it is not committed;
        the client, which saw it stream, is told, as for any dropped thinking."""
        await self._emit(
            ev.DISCARDED_THINKING, kind=block.kind, partial_bytes=len(block.text.encode()), reason="unsigned_thinking"
        )
        await self.ctx.frame(FrameKind.BLOCK_CANCEL, block=block.index, kind=block.kind, reason="unsigned_thinking")

    async def _thinking_dropped(self, block: Block) -> None:
        """A continuation's thinking block closed after the prefix's text: not kept (see ``translate``)."""
        await self._emit(
            ev.DISCARDED_THINKING,
            kind=block.kind,
            partial_bytes=len(block.text.encode()),
            reason="thinking_after_text",
        )

    async def _maybe_checkpoint(self, delta_bytes: int) -> None:
        if self.writer.note(delta_bytes):
            await self._write_checkpoint()

    async def _checkpoint_now(self) -> None:
        await self._write_checkpoint(force=True)

    async def _write_checkpoint(
        self,
        force: bool = False,
        blocks: list[Block] | None = None,
        stop_reason: str | None = None,
        ending: dict[str, Any] | None = None,
    ) -> None:
        ended = stop_reason is not None or ending is not None
        point = self._resume_point() if not ended else None
        if blocks is not None:
            keep = blocks
        elif point is not None:
            keep = native_plan(self.acc.snapshot()).keep
        else:
            # what the client holds: while a plan waits for its continuation, what that plan kept
            # (nothing when the answer starts over, as a structured one does), else the plan's keep
            keep = self.held if self.held is not None else plan(self.acc.snapshot()).keep
        in_flight = self.translator.in_flight_tool if not ended else None
        used, received = self._answer_output()
        checkpoint = Checkpoint(
            run_id=self.ctx.run_id,
            turn=self.turn,
            history_len=self.history_len,
            blocks=[b.to_content() for b in keep],
            in_flight_tool=dict(in_flight) if in_flight is not None else None,
            attempt=self._current_attempt.index if self._current_attempt else 0,
            continuation=self.continuation,
            seq=self.ctx.seq,
            native={**point.as_dict(), "open_text": _open_text(keep)} if point is not None else None,
            stop_reason=stop_reason,
            discarded_tools=list(self.discarded_tools),
            # with nothing kept a resume starts the answer over: what it cost so far is dropped too
            dropped_output=self.dropped_output + (0 if keep else used),
            output_used=used if keep else 0,
            received_bytes=received if keep else 0,
            ending=ending,
        )
        await self.writer.write(checkpoint)

    def _store_failed(self, what: str, exc: BaseException) -> None:
        """A checkpoint store outage is logged and the run goes on without it."""
        self.store_errors.append(f"{what}: {type(exc).__name__}: {exc}")
        log.warning("%s run_id=%s error=%s: %s", what, self.ctx.run_id, type(exc).__name__, exc)

    def _note_join(self) -> None:
        """Record how the attempt that just ended joined its text onto the kept text."""
        joined = self.translator.join_result()
        if joined is not None and self.translator.joiner is not None and self.translator.joiner.decided:
            self.joins.append({"continuation": self.continuation, "kind": joined.kind.value, "chars": joined.chars})

    def _last_error_kind(self) -> str:
        record = self._current_attempt
        return (record.error_kind or record.interrupt_cause or "unknown") if record else "unknown"

    # One overload per event: each call site is checked against that event's payload shape.
    @overload
    async def _emit(self, name: Literal["llm_stream_interrupted"], **fields: Unpack[ev.InterruptedFields]) -> None: ...
    @overload
    async def _emit(
        self, name: Literal["llm_stream_continuation_started"], **fields: Unpack[ev.ContinuationStartedFields]
    ) -> None: ...
    @overload
    async def _emit(
        self, name: Literal["llm_stream_continuation_completed"], **fields: Unpack[ev.ContinuationCompletedFields]
    ) -> None: ...
    @overload
    async def _emit(
        self, name: Literal["llm_stream_continuation_failed"], **fields: Unpack[ev.ContinuationFailedFields]
    ) -> None: ...
    @overload
    async def _emit(
        self, name: Literal["llm_stream_continuation_exhausted"], **fields: Unpack[ev.ContinuationExhaustedFields]
    ) -> None: ...
    @overload
    async def _emit(
        self, name: Literal["discarded_partial_tool_use"], **fields: Unpack[ev.DiscardedToolFields]
    ) -> None: ...
    @overload
    async def _emit(
        self, name: Literal["discarded_thinking"], **fields: Unpack[ev.DiscardedThinkingFields]
    ) -> None: ...
    @overload
    async def _emit(self, name: Literal["llm_request_retry"], **fields: Unpack[ev.RequestRetryFields]) -> None: ...
    @overload
    async def _emit(self, name: Literal["llm_run_resumed"], **fields: Unpack[ev.RunResumedFields]) -> None: ...
    @overload
    async def _emit(self, name: Literal["llm_stream_failover"], **fields: Unpack[ev.FailoverFields]) -> None: ...
    @overload
    async def _emit(
        self, name: Literal["llm_response_abandoned"], **fields: Unpack[ev.ResponseAbandonedFields]
    ) -> None: ...

    async def _emit(self, name: str, **fields: object) -> None:
        await self._emit_at(self._current_attempt, name, fields)

    async def _emit_at(self, attempt: AttemptRecord | None, name: str, fields: Mapping[str, object]) -> None:
        base: ev.EventContext = {
            "provider": self.ctx.provider,
            "model": self.request.model,
            "run_id": self.ctx.run_id,
            "turn_id": f"{self.ctx.run_id}:{self.turn}",
            "attempt": attempt.index if attempt else None,
        }
        await self.ctx.sink.on_event(StructuredEvent(name, {**base, **fields}))


def _raise_claim_lost(stopped: Sequence[object]) -> None:
    """A newer claim of the run refused what a cancel beside the recovery wrote (its event):
    the run stops here as on any lost claim, before the turn's answer is committed or its tool
    calls run (the worker holding the claim does that). Raised once, the first one."""
    lost = next((outcome for outcome in stopped if isinstance(outcome, ClaimLost)), None)
    if lost is not None:
        raise lost


def _discard_reason(block: Block) -> str:
    """Why a tool call is dropped: its arguments were still arriving, or its block closed
    with arguments that are not a JSON object."""
    return "incomplete_arguments" if not block.closed else "invalid_arguments_json"


def _tool_key(block: Block) -> str:
    """What tells a tool call sent again from another: its id (its position when it has none)."""
    return block.id if block.id is not None else f"#{block.index}"


def _open_text(blocks: list[Block]) -> bool:
    """True when the last block is a text block still receiving text."""
    return bool(blocks) and blocks[-1].kind == TEXT and not blocks[-1].closed


def _sent_bytes(message: dict[str, Any], prefix: list[Block]) -> int:
    """UTF-8 bytes of the prefix's text and tool arguments as ``message`` carries them (a
    prefill's last text without its trailing whitespace; a blank text block is not sent)."""
    sent = 0
    texts = [c.get("text", "") for c in message.get("content", []) if isinstance(c, dict) and c.get("type") == TEXT]
    sent += sum(len(t.encode()) for t in texts if isinstance(t, str) and t.strip())
    sent += sum(len(b.arguments.encode()) for b in prefix if b.kind == TOOL_USE)
    return sent
