"""NativeResume: the background responses a turn re-attaches to, and the cancels of those it leaves."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

from . import sink as ev
from .contract import ResumableAdapter, ResumePoint, follows_cursor, resumes_natively
from .errors import ClaimLost
from .protocol import RunStatus
from .sink import AttemptRecord
from .translate import Translator
from .turnevents import TurnEvents
from .turnstate import TurnState

log = logging.getLogger("streamrecover.engine.turn")  # the turn's log: its records keep their logger name

# a background response the turn leaves behind is cancelled while it goes on; the turn's end
# waits for that cancel no longer than this
ABANDON_CANCEL_TIMEOUT_S = 2.0


class NativeResume:
    """Where a broken background response can be re-attached, and the responses the turn
    abandons. ``unread`` is the background response a break (or the checkpoint resumed from)
    left generating, that the turn may re-attach to: cancelled if the turn ends without reading
    it to its end. Each abandoned response is cancelled once, beside the recovery; the turn's
    end waits for those cancels (``wait_stopped``)."""

    def __init__(self, state: TurnState, translator: Translator, events: TurnEvents) -> None:
        self.state = state
        self.translator = translator
        self.events = events
        self.unread: tuple[ResumableAdapter, str] | None = None
        self._stopping: list[asyncio.Task[None]] = []  # cancels of abandoned responses on their way
        self._abandoned: set[str] = set()  # the ids of those responses: each is cancelled once

    def cancel_stopping(self) -> None:
        """The turn itself is stopped: so are its cancels on the way."""
        for task in self._stopping:
            task.cancel()

    async def wait_stopped(self) -> list[object]:
        """Every cancel beside the recovery, answered (each within ``ABANDON_CANCEL_TIMEOUT_S``):
        how each ended, its exception included."""
        return await asyncio.gather(*self._stopping, return_exceptions=True)

    def resume_point(self) -> ResumePoint | None:
        """Where the broken response can be re-attached, when the provider's setting allows it
        and the blocks hold exactly its state there (not while a continuation's seam is open)."""
        if not resumes_natively(self.state.ctx.adapter) or not follows_cursor(self.translator.parser):
            return None
        joiner = self.translator.joiner
        if joiner is not None and not joiner.decided:
            return None
        return self.read_point()

    def read_point(self) -> ResumePoint | None:
        """Where the background response the current attempt reads stands now, seam or not."""
        parser = self.translator.parser
        native = self.state.native
        point = None
        if follows_cursor(parser):
            point = parser.resume_point(native.response_id if native is not None else None)
        # a re-attached stream that broke (or was stopped) before its first event stands where it was
        return point if point is not None else native

    def abandon(self, adapter: ResumableAdapter, response_id: str, reason: str) -> None:
        """Cancel a background response the turn leaves behind, beside whatever the turn does
        next (a backoff, the next request: the recovery waits for nothing), and record it
        (``llm_response_abandoned``). Best effort: the turn's end waits for it at most
        ``ABANDON_CANCEL_TIMEOUT_S`` (``TurnRunner.run``), and a cancel that fails is logged, never
        raised (but a ``ClaimLost`` recording it, which stops the run at the turn's end). Once
        per response: a cancel of the run right after a break that abandoned it adds nothing."""
        if self.unread is not None and self.unread[1] == response_id:
            self.unread = None
        if response_id in self._abandoned:
            return
        self._abandoned.add(response_id)
        attempt = self.state.attempt  # the event is the break's, whatever attempt runs by then
        self._stopping.append(asyncio.ensure_future(self._abandon_now(adapter, response_id, reason, attempt)))

    async def _abandon_now(
        self, adapter: ResumableAdapter, response_id: str, reason: str, attempt: AttemptRecord | None
    ) -> None:
        ctx = self.state.ctx
        timeout = min(ctx.config.connect_timeout_s, ABANDON_CANCEL_TIMEOUT_S)
        try:
            status, error = await self._stop_response(adapter, response_id, timeout)
            if error is not None:
                log.warning("response_cancel_failed run_id=%s response_id=%s error=%s", ctx.run_id, response_id, error)
            fields: ev.ResponseAbandonedFields = {
                "response_id": response_id,
                "reason": reason,
                "cancelled": status == "cancelled",
                "response_status": status,
                "error": error,
            }
            await self.events.emit_at(attempt, ev.LLM_RESPONSE_ABANDONED, fields)
        except Exception as exc:  # the run goes on regardless (a ClaimLost stops it: ``TurnRunner.run``)
            log.warning(
                "response_abandon_failed run_id=%s response_id=%s error=%s: %s",
                ctx.run_id,
                response_id,
                type(exc).__name__,
                exc,
            )

    def abandon_unresumable(self) -> None:
        """A break with no point to re-attach at (a continuation's seam was still open) in a
        background response: the turn goes on without it, and it would go on being generated,
        and billed, for nobody. Cancelled beside the recovery, as after a failover."""
        adapter = self.state.ctx.adapter
        if not resumes_natively(adapter):
            return
        left = self.read_point()
        if left is not None:
            self.abandon(adapter, left.response_id, "no_resume_point")

    def abandon_unread(self, status: str) -> None:
        """The turn ends cut short (failed, exhausted) with a background response a break left
        unread: nobody will read it now, and it goes on being billed. Cancelled as after a failover."""
        if self.unread is not None and status != RunStatus.CANCELLED:  # a cancel stops it itself
            adapter, response_id = self.unread
            self.abandon(adapter, response_id, status)

    def cancel_response(self) -> None:
        """A stopped run (a user's cancel, an abort) stops its background response too, which
        would otherwise go on generating (and being billed) with nobody reading it: abandoned
        as any response the turn leaves behind (``abandon``), the stop's kind as the reason. The
        run ends cancelled meanwhile; the turn's end waits for the cancel only briefly."""
        ctx = self.state.ctx
        adapter = ctx.adapter
        if ctx.transport is None:
            return
        # Before its stream carries an event (a re-attach not yet streaming, a run resumed from
        # a checkpoint and cancelled before it re-attached), the parser knows no point: the
        # response is the one the turn re-attaches to, or the one a break or checkpoint left.
        stop, self.unread = self.unread, None
        if resumes_natively(adapter) and (point := self.read_point()) is not None:
            stop = (adapter, point.response_id)
        if stop is not None:
            self.abandon(stop[0], stop[1], str(ctx.cancel.kind or "cancel"))

    async def _stop_response(
        self, adapter: ResumableAdapter, response_id: str, timeout: float
    ) -> tuple[str | None, str | None]:
        """``POST .../responses/{id}/cancel`` within ``timeout`` seconds in all: the response's
        status as the answer gives it, and why the cancel failed (None when it did not)."""
        transport = self.state.ctx.transport
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


def raise_claim_lost(stopped: Sequence[object]) -> None:
    """A newer claim of the run refused what a cancel beside the recovery wrote (its event):
    the run stops here as on any lost claim, before the turn's answer is committed or its tool
    calls run (the worker holding the claim does that). Raised once, the first one."""
    lost = next((outcome for outcome in stopped if isinstance(outcome, ClaimLost)), None)
    if lost is not None:
        raise lost
