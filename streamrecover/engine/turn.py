"""The turn runner: one assistant turn, kept alive across broken streams.

One turn is a sequence of HTTP calls (attempts). The first is ``initial``; a call that
fails before its stream starts is retried as ``pre_stream_retry`` (own budget); a stream
that breaks is planned (R1-R4) and followed, after a backoff, by a ``continuation`` that
carries the kept blocks as history, or a ``restart`` when nothing was kept. This module
holds that loop and its recovery decisions; beside it: where the turn stands (``turnstate``),
its events (``turnevents``), its output budget (``budget``), native resume (``nativeresume``),
what it drops (``discards``), its checkpoints (``turncheckpoints``), how it ends (``endings``)
and resuming it from a checkpoint (``checkpointresume``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from . import sink as ev
from .attempts import open_attempt, run_attempt
from .blocks import TEXT, Block, Snapshot
from .budget import OutputBudget
from .checkpoint import Checkpoint
from .checkpointresume import CheckpointResume
from .context import RunCancelled, RunContext
from .continuation import (
    ENDED_STOPS,
    NEVER_CONTINUE_STOPS,
    as_restart,
    continuation_messages,
    joiner_for,
    paused_turn_messages,
    remember_prefill_refused,
    summary,
)
from .contract import ModelRequest, ProviderAdapter, ResumePoint, Strategy, resumes_natively
from .discards import Discards
from .endings import TurnEndings, TurnResult
from .errors import ErrorClass, InterruptCause, RequestFailed, StreamInterrupted
from .nativeresume import NativeResume, raise_claim_lost
from .plan import PlanKind, RecoveryPlan, native_plan, plan
from .protocol import FrameKind, RunStatus
from .retry import backoff_delay
from .translate import AttemptDone, Translator
from .turncheckpoints import TurnCheckpoints
from .turnevents import TurnEvents
from .turnstate import TurnState

__all__ = ["TurnResult", "TurnRunner"]


class TurnRunner:
    """Runs one assistant turn. Create one per turn."""

    def __init__(
        self,
        ctx: RunContext,
        request: ModelRequest,
        turn: int,
        history_len: int,
        paused: list[Block] | None = None,
        pauses: int = 0,
    ) -> None:
        """``paused``: the blocks of the turn's answer so far, which the provider paused
        (``pause_turn``): the turn goes on from them, sent back as they are. ``pauses``: how
        often the provider paused the turn so far (its checkpoints keep it for a resume)."""
        self.ctx = ctx
        self.state = TurnState(ctx, request, turn, pauses=pauses)
        if paused:
            self.state.carry_paused(paused)
        self.events = TurnEvents(self.state)
        self.discards = Discards(ctx, self.events)
        # the translator reports deltas to the checkpoints, which read what it received: it calls
        # back through the runner, which holds both
        self.translator = Translator(
            ctx, self._maybe_checkpoint, self._checkpoint_now, self.discards.thinking_dropped, self._checkpoint_now
        )
        self.budget = OutputBudget(self.state, self.translator)
        self.native_resume = NativeResume(self.state, self.translator, self.events)
        self.checkpoints = TurnCheckpoints(
            self.state, self.translator, self.budget, self.native_resume, self.discards, history_len
        )
        self.endings = TurnEndings(self.state, self.checkpoints, self.discards, self.native_resume, self.events)
        self.budget_from = 0  # continuations spent before a failover: the fallback has a budget of its own
        self.failed_over = False
        self.failed_over_from: ProviderAdapter | None = None  # the adapter the turn failed over from

    # ---- public -------------------------------------------------------------------------

    async def run(self, resume: Checkpoint | None = None) -> TurnResult:
        try:
            result = await self._run(resume)
        except asyncio.CancelledError:
            self.native_resume.cancel_stopping()  # the turn itself is stopped: so are its cancels on the way
            raise
        finally:
            # A cancel of an abandoned response ran beside the recovery; the turn ends once it is
            # answered (each within ABANDON_CANCEL_TIMEOUT_S), leaving no task behind.
            stopped = await self.native_resume.wait_stopped()
        raise_claim_lost(stopped)
        return result

    async def settled(self) -> None:
        """What the turn ended with is committed (or there was none to commit): only now may its
        checkpoint go. Deleted before the commit, a worker dying in between would lose an answer
        that was paid for (or the text a turn cut short had shown), and the next one would ask
        for it again."""
        await self.checkpoints.delete()

    @property
    def store_errors(self) -> list[str]:
        """Checkpoint store outages the turn went on without (``TurnCheckpoints``)."""
        return self.checkpoints.store_errors

    async def _run(self, resume: Checkpoint | None) -> TurnResult:
        try:
            if resume is not None:
                early = await CheckpointResume(
                    self.state, self.budget, self.native_resume, self.discards, self.endings, self.events
                ).resume(resume)
                if early is not None:
                    return early
            return await self._loop()
        except RunCancelled:
            self.native_resume.cancel_response()
            return await self.endings.end_short(
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
                return await self.endings.completed()
            except RequestFailed as failed:
                error = failed.error
                if self.state.native is not None:
                    # the response is gone (404, expired) or re-attaching failed: continue instead
                    outcome = await self._native_failed(error.kind, error.message)
                    if outcome is not None:
                        return outcome
                    continue
                if error.error_class is ErrorClass.PREFILL_REFUSED and self.state.strategy is Strategy.PREFILL:
                    # The model takes no prefill: same continuation, explicit continue message,
                    # and no prefill again for this model in this run (nor in this process).
                    self.ctx.prefill_refused.add(self.state.request.model)
                    remember_prefill_refused(self.ctx.provider, self.state.request.model)
                    self.state.strategy = Strategy.CONTINUE_MESSAGE
                    await self.events.emit(
                        ev.LLM_STREAM_CONTINUATION_FAILED,
                        continuation_attempt=self.state.continuation,
                        error_kind=error.kind,
                        error_message=error.message,
                        fallback_strategy=Strategy.CONTINUE_MESSAGE.value,
                    )
                    continue
                if self.state.continuation > 0:
                    await self.events.emit(
                        ev.LLM_STREAM_CONTINUATION_FAILED,
                        continuation_attempt=self.state.continuation,
                        error_kind=error.kind,
                        error_message=error.message,
                    )
                    if not error.permanent:
                        # The pre-stream budget of this continuation ran out: try the next one.
                        # same kept blocks again (the failed call never streamed)
                        outcome = await self._next_continuation(error.retry_after_s, plan(self.state.acc.snapshot()))
                        if outcome is not None:
                            return outcome
                        continue
                    kept = plan(self.state.acc.snapshot())
                    if await self._fail_over(error.kind, kept):
                        outcome = await self._next_continuation(None, kept)
                        if outcome is not None:
                            return outcome
                        continue
                return await self.endings.fail(error.kind, error.message)
            except StreamInterrupted as interrupted:
                self._note_join()
                self.ctx.check_cancel()
                outcome = await self._on_interrupted(interrupted)
                if outcome is not None:
                    return outcome

    async def _attempt(self) -> None:
        """One provider call with its pre-stream retries; raises AttemptDone on the terminator."""
        cfg = self.ctx.config
        native = self.state.native
        budgeted: ModelRequest | None = None
        if native is not None:
            assert resumes_natively(self.ctx.adapter)
            http_request = self.ctx.adapter.resume_request(native)
        else:
            history = self.state.request.messages
            if self.state.paused:
                messages = paused_turn_messages(history, self.state.prefix)
            else:
                messages = continuation_messages(history, self.state.prefix, self.state.strategy)
            budgeted = self.budget.budgeted(replace(self.state.request, messages=messages))
            http_request = self.ctx.adapter.build_request(budgeted)
        retries = 0
        kind = self.state.attempt_kind
        while True:
            self.ctx.check_cancel()
            self.state.attempt = record = await open_attempt(
                self.ctx,
                turn=self.state.turn,
                kind=kind,
                continuation=self.state.continuation,
                strategy=self.state.strategy_name(),
                http_request=http_request,
            )
            if native is not None:
                # the same response goes on: no join to make; a closed text block is not reopened
                merge = bool(self.state.prefix) and not self.state.prefix[-1].closed
                self.translator.begin(self.state.acc, self.state.prefix, None, merge=merge)
            elif self.state.paused:
                # the model goes on with new blocks after the paused ones: nothing is joined
                assert budgeted is not None
                self.translator.begin(self.state.acc, self.state.prefix, None, budgeted.max_tokens, merge=False)
            else:
                assert budgeted is not None
                joiner = joiner_for(self.state.prefix, self.state.strategy, self.ctx.adapter.echoes_prefix)
                self.translator.begin(self.state.acc, self.state.prefix, joiner, budgeted.max_tokens)
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
            await self.events.emit(
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
        self.budget.count_break()
        snapshot = self.state.acc.snapshot()
        # a response that sent an error has failed: re-attaching would replay the error
        failed = interrupted.cause is InterruptCause.PROVIDER_ERROR_MID_STREAM
        point = None if failed else self.native_resume.resume_point()
        adapter = self.ctx.adapter
        self.native_resume.unread = (
            (adapter, point.response_id) if point is not None and resumes_natively(adapter) else None
        )
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
            and self.state.request.structured
            and self.state.model_strategy() is not Strategy.PREFILL
        )
        if structured_restart:
            recovery = as_restart(recovery)
        self.discards.note_unsent(snapshot, recovery)

        kept_chars = sum(len(b.text) for b in recovery.keep if b.kind == TEXT)
        attempt = self.state.attempt
        usage_flushed = self.translator.final_usage
        await self.events.emit(
            ev.LLM_STREAM_INTERRUPTED,
            continuation_attempt=self.state.continuation,
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
            turn_output_tokens=self.budget.used(),
            max_tokens=self.state.request.max_tokens,
        )
        if snapshot.stop_reason is not None and attempt is not None:
            # visible on the attempt: interrupted, yet with the stop reason that had arrived
            attempt.stop_reason = snapshot.stop_reason
            attempt.stop_sequence = snapshot.stop_sequence
            await self.ctx.sink.on_attempt(attempt)
        if ended:
            return await self.endings.completed()
        if point is None and not failed:
            self.native_resume.abandon_unresumable()
        await self.discards.publish(recovery, self.state.acc)
        self.state.held = recovery.keep
        if never:
            # A refusal or content filter already arrived: the answer ends here, as it is.
            return await self.endings.finish_with(recovery.keep, snapshot.stop_reason)
        if permanent:
            assert provider_error is not None
            if recovery.kind is not PlanKind.SYNTHESIZE_TOOL_USE and await self._fail_over(
                provider_error.kind, recovery
            ):
                return await self._next_continuation(None, recovery)
            return await self.endings.fail(provider_error.kind, provider_error.message)
        if recovery.kind is PlanKind.SYNTHESIZE_TOOL_USE:
            result = await self.endings.finish_with(recovery.keep, "tool_use")
            await self.events.emit(
                ev.LLM_STREAM_CONTINUATION_COMPLETED,
                continuation_attempt=self.state.continuation,
                completion_reason="synthesized_tool_use",
                plan=recovery.kind.value,
            )
            result.recovered = True
            return result
        measuring: asyncio.Task[None] | None = None
        if point is None and self.budget.spent():
            # The running bound says the budget is spent: the provider's count decides, now.
            await self.budget.measure(recovery)
        elif recovery.continues:
            # The bound leaves budget, and the count only lowers it (it can never end the turn):
            # it runs while the checkpoint is written and the backoff waits, not before them.
            measuring = asyncio.ensure_future(self.budget.measure(recovery))
        if point is None and self.budget.spent():
            # The turn's budget is spent: it ends here, as an uninterrupted answer at its limit would.
            return await self.endings.out_of_budget(recovery)
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
        self.state.held = recovery.keep
        await self.checkpoints.write(force=True)
        if (
            self.state.continuation - self.budget_from >= cfg.max_continuations
            and await self._fail_over("exhausted", recovery)  # a fallback brings a budget of its own
            and recovery.kind is PlanKind.NATIVE_RESUME
        ):
            # The resume point belongs to the provider that issued it: the fallback cannot
            # re-attach to that response, so it carries on the ordinary way from the blocks
            # the native plan kept, as when a re-attach fails (``_native_failed``).
            recovery = await self._off_native(recovery, point)
            point = None
            if recovery.kind is PlanKind.SYNTHESIZE_TOOL_USE:
                result = await self.endings.finish_with(recovery.keep, "tool_use")
                result.recovered = True
                return result
        if self.state.continuation - self.budget_from >= cfg.max_continuations:
            await self.events.emit(
                ev.LLM_STREAM_CONTINUATION_EXHAUSTED,
                attempts=self.state.continuation,
                final_reason=self._last_error_kind(),
                plan=recovery.kind.value,
            )
            await self.ctx.frame(
                FrameKind.RECOVERY, phase="exhausted", attempt=self.state.continuation, plan=recovery.kind.value
            )
            return await self.endings.end_short(
                RunStatus.EXHAUSTED,
                {
                    "kind": "exhausted",
                    "message": f"gave up after {self.state.continuation} continuation attempts"
                    f" ({self._last_error_kind()})",
                },
            )
        self.state.continuation += 1
        delay = backoff_delay(
            self.state.continuation,
            cfg.backoff_schedule,
            cfg.backoff_scale,
            cfg.backoff_jitter,
            retry_after_s,
            cfg.max_retry_after_s,
        )
        await self.ctx.frame(
            FrameKind.RECOVERY,
            phase="backoff",
            attempt=self.state.continuation,
            plan=recovery.kind.value,
            backoff_s=delay,
        )
        await self.ctx.sleep(delay)
        if measuring is not None:
            await measuring
        if point is not None and recovery.kind is PlanKind.NATIVE_RESUME:
            self.state.set_native(recovery.keep, point)
        else:
            self._set_prefix(recovery)
        await self.events.emit(
            ev.LLM_STREAM_CONTINUATION_STARTED,
            continuation_attempt=self.state.continuation,
            backoff_s=delay,
            committed=summary(self.state.prefix),
            strategy=self.state.strategy_name(),
            plan=recovery.kind.value,
        )
        await self.ctx.frame(
            FrameKind.RECOVERY,
            phase="continuing",
            attempt=self.state.continuation,
            plan=recovery.kind.value,
            backoff_s=delay,
        )
        return None

    async def _native_failed(self, kind: str, message: str) -> TurnResult | None:
        """Re-attaching failed before its stream started: the same break is recovered the
        ordinary way, from the blocks the turn holds, without spending another continuation.
        The response, unless gone, is cancelled: nobody will read it, and it goes on being billed."""
        point, self.state.native, self.native_resume.unread = self.state.native, None, None  # gone, or abandoned below
        self.discards.lose_unsent()
        recovery = self.state.ordinary_plan(self.state.acc.snapshot())
        await self.events.emit(
            ev.LLM_STREAM_CONTINUATION_FAILED,
            continuation_attempt=self.state.continuation,
            error_kind=kind,
            error_message=message,
            fallback_strategy=self.state.model_strategy().value,
        )
        if point is not None and kind != "not_found" and resumes_natively(self.ctx.adapter):
            self.native_resume.abandon(self.ctx.adapter, point.response_id, "reattach_failed")
        await self.discards.publish(recovery, self.state.acc)
        if recovery.kind is PlanKind.SYNTHESIZE_TOOL_USE:
            result = await self.endings.finish_with(recovery.keep, "tool_use")
            result.recovered = True
            return result
        if self.budget.spent():
            # the re-attached response would have gone on within its own budget; a continuation
            # asks for what is left, and nothing the provider takes is left
            await self.budget.measure(recovery)
            if self.budget.spent():
                return await self.endings.out_of_budget(recovery)
        self._set_prefix(recovery)
        return None

    async def _off_native(self, native: RecoveryPlan, point: ResumePoint | None) -> RecoveryPlan:
        """The turn failed over from a native plan: the fallback's ordinary plan of the blocks it
        kept, its drops sent to the client. A tool call a native plan dropped while it was
        still arriving is lost now: no re-attached stream will send it again. The response at
        ``point`` is cancelled first: it would go on being generated, and billed, for nobody."""
        self.discards.lose_unsent()
        left = self.failed_over_from
        if point is not None and resumes_natively(left):
            self.native_resume.abandon(left, point.response_id, "failover")
        recovery = self.state.ordinary_plan(Snapshot(tuple(native.keep)))
        await self.discards.publish(recovery, self.state.acc)
        self.state.held = recovery.keep
        return recovery

    async def _fail_over(self, reason: str, recovery: RecoveryPlan) -> bool:
        """Switch to the context's fallback provider and model, once per turn: the next
        continuation goes there, from the same prefix, with a fresh continuation budget.
        False when there is none (or it was used)."""
        fallback = self.ctx.failover
        if fallback is None or self.failed_over:
            return False
        if self.state.request.max_tokens - self.budget.used() < fallback.adapter.min_max_tokens:
            return False  # the fallback could not be asked for what is left of the budget
        self.failed_over = True
        self.failed_over_from = self.ctx.adapter
        await self.events.emit(
            ev.LLM_STREAM_FAILOVER,
            continuation_attempt=self.state.continuation,
            reason=reason,
            from_provider=self.ctx.provider,
            from_model=self.state.request.model,
            to_provider=fallback.provider_name,
            to_model=fallback.model,
            plan=recovery.kind.value,
        )
        self.ctx.adapter = fallback.adapter
        self.ctx.provider_name = fallback.provider_name
        self.state.request = replace(self.state.request, model=fallback.model)
        if fallback.extra is not None:  # a fallback of another wire format: the fields in its own
            self.state.request = replace(self.state.request, extra=dict(fallback.extra))
        self.state.strategy = None
        self.budget_from = self.state.continuation
        return True

    def _set_prefix(self, recovery: RecoveryPlan) -> None:
        """The next attempt continues from what ``recovery`` keeps; on a restart, what the dropped
        answer cost still counts against the budget, not as a prefix's cost."""
        if self.state.set_prefix(recovery):
            self.budget.restart()

    async def _maybe_checkpoint(self, delta_bytes: int) -> None:
        await self.checkpoints.on_delta(delta_bytes)

    async def _checkpoint_now(self) -> None:
        await self.checkpoints.now()

    def _note_join(self) -> None:
        """Record how the attempt that just ended joined its text onto the kept text."""
        joined = self.translator.join_result()
        if joined is not None and self.translator.joiner is not None and self.translator.joiner.decided:
            self.state.joins.append(
                {"continuation": self.state.continuation, "kind": joined.kind.value, "chars": joined.chars}
            )

    def _last_error_kind(self) -> str:
        record = self.state.attempt
        return (record.error_kind or record.interrupt_cause or "unknown") if record else "unknown"
