"""The fake provider's HTTP server: real sockets, scripted faults, a billing log.

It speaks the Anthropic Messages, OpenAI Chat Completions and Gemini wire formats on loopback so
the product is tested through the same httpx code paths as production, and it fails the
way real providers fail: a chunked body cut without its last chunk (httpx raises
``RemoteProtocolError``), a clean end without the terminator event, a stall, an error
event inside a 200 stream, an HTTP error with Retry-After, bytes that are not JSON or not
UTF-8, a GOAWAY in the middle of an HTTP/2 stream (a connection that opens with the HTTP/2
preface is served over HTTP/2, ``http2``). It can run in a background thread
(``start``/``stop``, a context manager) or in an existing event loop
(``start_async``/``serve_forever``, an async context manager): the sockets, the fault scripts,
the log and the control endpoints are ``serving.ScriptedServer``'s, shared with the chaos proxy.

Routes: ``POST /v1/messages`` (Anthropic) and its free ``/v1/messages/count_tokens``, ``POST /v1/chat/completions``,
``/beta/chat/completions`` and ``/chat/completions`` (OpenAI; DeepSeek-style bases),
``POST /v1beta/models/{model}:streamGenerateContent?alt=sse`` and ``:generateContent`` (Gemini), and
control endpoints ``POST /_fake/faults`` ``{"scenario": key, "faults": [...]}`` (strings,
dicts, or one ``;``-separated string), ``GET /_fake/faults``, ``GET /_fake/log[?scenario=]``
and ``POST /_fake/reset`` (optionally ``{"scenario": key}``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...engine.contract import CONTINUE_INSTRUCTION, SECRET_HEADERS
from . import read_anthropic, wire_anthropic
from .background import CANCELLED, IN_PROGRESS, BackgroundResponse
from .dialects import ROUTES, Dialect, route
from .faults import Delivery, Fault, FaultKind, plan_delivery
from .hostile import HTML_PAGE
from .http11 import Request, Responder
from .interpret import Interpretation, Mode, RequestRejected
from .log import LogEntry
from .model import (
    Directives,
    Plan,
    cap_thinking,
    continue_plan,
    input_tokens,
    limit_plan,
    paused_part,
    plan_answer,
    seam_plan,
)
from .recording import Recording
from .serving import DEFAULT_SCENARIO, JSON_TYPE, SCENARIO_HEADER, ScriptedServer, json_bytes, scenario_of
from .wire import ErrorSpec, ResponseContext, WireEvent
from .wire_openai_responses import not_found, response_id

SSE_TYPE = "text/event-stream; charset=utf-8"
HTML_TYPE = "text/html; charset=utf-8"

__all__ = ["COUNT_TOKENS_PATH", "DEFAULT_SCENARIO", "SCENARIO_HEADER", "FakeProviderServer"]

COUNT_TOKENS_PATH = "/v1/messages/count_tokens"  # Anthropic's free input-token count


@dataclass(slots=True)
class _Outcome:
    """What happened to one provider request, filled in as it is answered."""

    status: int = 0
    bytes_sent: int = 0
    fault_triggered: bool = False
    understood_as: str | None = None
    prefix_chars: int = 0
    prefix_matched: bool | None = None
    output_tokens: int = 0
    billed_output_tokens: int = 0
    billed_text: list[str] = field(default_factory=list)
    completed: bool = False
    error: str | None = None
    finished: bool = False
    # a background response this request created: billed as it is generated, not as it is sent
    generation: BackgroundResponse | None = None


class FakeProviderServer(ScriptedServer[LogEntry]):
    """A fault-injecting fake LLM provider on ``host:port`` (port 0: any free port); its log is
    the billing log.

    ``event_delay`` (seconds) spaces the SSE events out, so a demo streams visibly: event n of a
    response is due ``n * event_delay`` after its first, however late the ones before it went.
    """

    _what = "the fake provider"
    _thread_name = "streamrecover-fake-provider"
    _control_prefix = "/_fake/"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, event_delay: float = 0.0) -> None:
        super().__init__(host, port)
        self.event_delay = event_delay
        self._recordings: dict[str, Recording] = {}
        self.count_requests = 0  # token-count calls (free: not in the billing log)
        self._seq = itertools.count(1)
        self.http2_connections = 0  # connections that spoke HTTP/2 (prior knowledge)
        # Responses background mode: (scenario, response id) -> the response, generated (and
        # billed) once, at the model's pace, served again from any sequence number
        self._background: dict[tuple[str, str], BackgroundResponse] = {}

    def _on_http2(self) -> None:
        self.http2_connections += 1

    # -- recordings and pending faults -------------------------------------------------

    def set_recording(self, scenario: str, raw: bytes | None) -> None:
        """Answer the scenario's fresh requests with these recorded bytes (None: stop)."""
        if raw is None:
            self._recordings.pop(scenario, None)
        else:
            self._recordings[scenario] = Recording.from_bytes(raw)

    def expire_responses(self, scenario: str | None = None) -> None:
        """Forget stored background responses (of one scenario, or all): a re-attach gets a 404,
        as after the real API's retention window."""
        for key in [k for k in self._background if scenario is None or k[0] == scenario]:
            del self._background[key]

    def reset(self, scenario: str | None = None) -> None:
        super().reset(scenario)
        self.expire_responses(scenario)

    def pending_faults(self, scenario: str = DEFAULT_SCENARIO) -> list[Fault]:
        return self._scripts.pending().get(scenario, [])

    # -- requests ----------------------------------------------------------------------

    async def _dispatch(self, request: Request, responder: Responder) -> None:
        if self._is_control(request):
            await self._answer_control(request, responder)
            return
        if request.path == COUNT_TOKENS_PATH and request.method == "POST":
            self.count_requests += 1
            scenario = scenario_of(request)
            status, payload = _count_tokens(ROUTES["/v1/messages"], request, self._recordings.get(scenario))
            await responder.full(status, [], json_bytes(payload), JSON_TYPE)
            return
        if request.path.endswith("/cancel"):
            dialect, cancelled = route(request.path.removesuffix("/cancel"), request.query)
            if dialect is not None and cancelled is not None:
                await self._cancel_background(dialect, request, cancelled, responder)
                return
        dialect, resumed = route(request.path, request.query)
        if dialect is not None and resumed is not None:
            await self._provider_request(dialect, request, responder, resumed)
            return
        if dialect is None:
            body = json_bytes({"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}})
            await responder.full(404, [], body, JSON_TYPE)
            return
        await self._provider_request(dialect, request, responder)

    async def _provider_request(
        self, dialect: Dialect, request: Request, writer: Responder, resumed: str | None = None
    ) -> None:
        scenario = scenario_of(request)
        fault = self._scripts.next(scenario)
        seq = next(self._seq)
        request_id = f"req_fake{seq:018d}"
        outcome = _Outcome()
        # Logged as accepted, before any answer: a client that hangs up at any point (even
        # right after the headers, while this handler still waits to write) leaves its request
        # in the log, as the real provider has seen (and may bill) it.
        # The entry is read from the outcome whenever the log is read, so it is never behind
        # what the client has been sent, and costs nothing per event; it is frozen at the end.
        accepted = _log_entry(seq, request_id, dialect, request, scenario, fault)
        slot = self._append_live_log(lambda: _with_outcome(accepted, outcome))
        try:
            if resumed is not None:
                await self._reattach(dialect, request, fault, resumed, request_id, writer, outcome)
                return
            recording = self._recordings.get(scenario)
            await self._answer(dialect, request, fault, request_id, writer, outcome, recording)
        finally:
            outcome.finished = True
            generation = outcome.generation
            if generation is None or generation.status() != IN_PROGRESS:
                self._settle_log(slot)
            # else the entry stays live: the response goes on being generated (and billed)

    async def _answer(
        self,
        dialect: Dialect,
        request: Request,
        fault: Fault | None,
        request_id: str,
        writer: Responder,
        outcome: _Outcome,
        recording: Recording | None = None,
    ) -> None:
        if fault is not None and fault.kind is FaultKind.DROP:
            outcome.fault_triggered = True
            return
        if fault is not None and fault.kind is FaultKind.STALL_HEADERS:
            outcome.fault_triggered = True
            await asyncio.sleep(fault.seconds)
        try:
            answer = _understand(dialect, request, fault, outcome, recording)
        except Exception as exc:  # a bug in the fake must not look like a network failure to the client
            answer = ErrorSpec(500, "api_error", f"fake provider internal error: {exc!r}")
        if isinstance(answer, ErrorSpec):
            error_body = dialect.error_body(answer, request_id)
            outcome.status, outcome.bytes_sent, outcome.error = answer.status, len(error_body), answer.message
            headers = [*dialect.response_headers(request_id), *answer.headers]
            await writer.full(answer.status, headers, error_body, JSON_TYPE)
            return
        interpretation, plan, ctx = answer
        if fault is not None and fault.kind is FaultKind.HTML:  # a proxy's page, status 200
            outcome.status, outcome.bytes_sent, outcome.fault_triggered = 200, len(HTML_PAGE), True
            await writer.full(200, dialect.response_headers(request_id), HTML_PAGE, fault.content_type or HTML_TYPE)
            return
        if not interpretation.stream:  # stream faults apply to streams only
            whole = json_bytes(dialect.response_json(plan, ctx))
            outcome.status, outcome.bytes_sent, outcome.completed = 200, len(whole), True
            outcome.billed_output_tokens, outcome.billed_text = plan.output_tokens, [plan.text]
            await writer.full(200, dialect.response_headers(request_id), whole, JSON_TYPE)
            return
        replay = recording is not None and not interpretation.continues and not _after_tools(interpretation)
        events = list(recording.events) if replay and recording is not None else None
        if recording is not None and interpretation.continues and not _after_tools(interpretation):
            events = recording.continuation(json.loads(request.body), thinking=interpretation.conversation.thinking)
            if events is not None:  # the rest of the recorded answer, in its own encoding
                outcome.output_tokens, outcome.prefix_matched = sum(e.tokens for e in events), True
        if events is None:
            events = dialect.stream_events(plan, ctx)
        delivery = plan_delivery(events, fault, _injected_error(dialect, fault, events))
        outcome.fault_triggered = delivery.triggered
        background = ctx.options.get("background") is True and not (fault and fault.kind in _BREAKS_RESPONSE)
        if background:
            # generated to the end whatever happens to this connection (unless cancelled), and
            # billed as it is generated: once, on this request
            outcome.generation = BackgroundResponse(events, self.event_delay)
            self._background[(scenario_of(request), response_id(ctx))] = outcome.generation
        content_type = SSE_TYPE
        if fault is not None and fault.kind is FaultKind.MISLABEL:
            content_type, outcome.fault_triggered = fault.content_type or JSON_TYPE, True
        await self._send_stream(writer, dialect, request_id, delivery, outcome, content_type, billed=background)

    async def _cancel_background(self, dialect: Dialect, request: Request, response: str, writer: Responder) -> None:
        """``POST .../responses/{id}/cancel``: a background response still being generated stops
        there (status ``cancelled``; what was generated stays billed, on the request that made
        it) and cannot be re-attached afterwards; one that had ended is answered as it is
        (``completed``, billed whole), as the real API does. Logged (``understood_as``
        ``cancel``), never billed itself."""
        seq = next(self._seq)
        request_id = f"req_fake{seq:018d}"
        outcome = _Outcome(understood_as="cancel")
        problem = dialect.authenticate(request.headers)
        stored = self._background.get((scenario_of(request), response)) if problem is None else None
        if problem is None and stored is None:
            problem = not_found(response)
        if problem is not None or stored is None:
            assert problem is not None
            body = dialect.error_body(problem, request_id)
            outcome.status, outcome.error = problem.status, problem.message
        else:
            status = stored.cancel()
            body = json_bytes({"id": response, "object": "response", "status": status, "background": True})
            outcome.status = 200
        outcome.bytes_sent, outcome.finished = len(body), True
        self._append_log(_log_entry(seq, request_id, dialect, request, scenario_of(request), None, outcome))
        await writer.full(outcome.status, dialect.response_headers(request_id), body, JSON_TYPE)

    async def _reattach(
        self,
        dialect: Dialect,
        request: Request,
        fault: Fault | None,
        resumed: str,
        request_id: str,
        writer: Responder,
        outcome: _Outcome,
    ) -> None:
        """``GET .../responses/{id}?stream=true&starting_after=N``: a background response's
        events after sequence number N, nothing generated (or billed) again, none sent before
        it is generated. A cancelled response is not there to re-attach to."""
        problem = _check_reattach(dialect, request)
        stored = self._background.get((scenario_of(request), resumed))
        if stored is not None and stored.status() == CANCELLED:
            stored = None
        if problem is None and stored is None:
            problem = not_found(resumed)
        if problem is None and fault is not None and fault.kind is FaultKind.STATUS:
            assert fault.code is not None
            outcome.fault_triggered = True
            spec = dialect.status_error(fault.code, fault.error_type, fault.message, quota=fault.quota)
            problem = replace(spec, headers=tuple(fault.retry_headers()))
        if problem is not None or stored is None:
            assert problem is not None
            body = dialect.error_body(problem, request_id)
            outcome.status, outcome.bytes_sent, outcome.error = problem.status, len(body), problem.message
            await writer.full(
                problem.status, [*dialect.response_headers(request_id), *problem.headers], body, JSON_TYPE
            )
            return
        outcome.understood_as = "resume"
        after = int(request.query.get("starting_after", "-1"))
        events = stored.events
        delivery = plan_delivery(events[after + 1 :], fault, _injected_error(dialect, fault, events, after + 1))
        outcome.fault_triggered = delivery.triggered
        first_due = stored.due(after + 1)
        await self._send_stream(writer, dialect, request_id, delivery, outcome, billed=True, first_due=first_due)

    async def _send_stream(
        self,
        writer: Responder,
        dialect: Dialect,
        request_id: str,
        delivery: Delivery,
        outcome: _Outcome,
        content_type: str = SSE_TYPE,
        *,
        billed: bool = False,
        first_due: float | None = None,
    ) -> None:
        """Write the stream; what it carries is billed as it is written, unless ``billed``
        (a background response's generation is billed as it is made). ``first_due``: when the
        first event may go (a re-attach: when the model generates it), the rest paced after it."""
        headers = [
            ("content-type", content_type),
            ("cache-control", "no-cache"),
            *dialect.response_headers(request_id),
        ]
        outcome.status = 200
        await writer.head(200, headers)

        def finish() -> bool:
            outcome.completed = delivery.complete
            return delivery.clean_end

        pieces = delivery.pieces
        if delivery.endless is not None:
            await self._send_endless(writer, delivery, outcome)
            return
        last = len(pieces) - 1 if delivery.stall_before != len(pieces) else -1
        loop = asyncio.get_running_loop()
        due = loop.time()  # when the next event is due: paced on a schedule, not by sleeps
        if first_due is not None and first_due > due:
            due = first_due
            await asyncio.sleep(due - loop.time())
        for index, piece in enumerate(pieces):
            if index == delivery.stall_before:
                await asyncio.sleep(delivery.stall_seconds)
                due = loop.time()
            elif index and self.event_delay:
                # A model generates at its own rate: an event written late (a busy loop) does
                # not push every later one back, so the offered rate is the one asked for.
                due += self.event_delay
                await asyncio.sleep(max(0.0, due - loop.time()))
            if writer.closing():
                return
            outcome.bytes_sent += len(piece.data)
            if not billed:
                outcome.billed_output_tokens += piece.tokens
                outcome.billed_text.append(piece.text)
            await writer.data(piece.data, end_stream=finish() if index == last else False)
        if last < 0:  # no pieces, or a stall after the last one
            if delivery.stall_before == len(pieces):
                await asyncio.sleep(delivery.stall_seconds)
            await writer.data(b"", end_stream=finish())
        if delivery.goaway:
            await writer.goaway()

    async def _send_endless(self, writer: Responder, delivery: Delivery, outcome: _Outcome) -> None:
        """The pieces, then ``delivery.endless`` again and again until the client goes away."""
        assert delivery.endless is not None
        for piece in itertools.chain(delivery.pieces, itertools.repeat(delivery.endless)):
            if writer.closing():
                return
            outcome.bytes_sent += len(piece.data)
            outcome.billed_output_tokens += piece.tokens
            outcome.billed_text.append(piece.text)
            try:
                await writer.data(piece.data)
            except Exception:  # the client went away (HTTP/1.1 or HTTP/2, however it shows): stop
                return
            if piece is delivery.endless:
                await asyncio.sleep(delivery.endless_every)


def _log_entry(
    seq: int,
    request_id: str,
    dialect: Dialect,
    request: Request,
    scenario: str,
    fault: Fault | None,
    outcome: _Outcome | None = None,
) -> LogEntry:
    """The entry of a request: what was asked, and the answer as ``outcome`` stands (none yet:
    a request just accepted)."""
    try:
        body: Any = json.loads(request.body)
    except ValueError:
        body = None
    return LogEntry(
        seq=seq,
        request_id=request_id,
        method=request.method,
        path=request.path,
        provider=dialect.name,
        scenario=scenario,
        headers={k: v for k, v in request.headers.items() if k not in SECRET_HEADERS},
        request=body,
        fault=fault.to_dict() if fault else None,
        **_answered(outcome or _Outcome()),
    )


def _with_outcome(entry: LogEntry, outcome: _Outcome) -> LogEntry:
    """``entry`` as the answer stands now."""
    return replace(entry, **_answered(outcome))


def _answered(outcome: _Outcome) -> dict[str, Any]:
    """The log entry's fields that tell of the answer (a background response's billing as it
    stands: what has been generated so far)."""
    billed_tokens, billed_text = outcome.billed_output_tokens, outcome.billed_text
    if outcome.generation is not None:
        billed_tokens, billed_text = outcome.generation.billed()
    return {
        "fault_triggered": outcome.fault_triggered,
        "status": outcome.status,
        "bytes_sent": outcome.bytes_sent,
        "understood_as": outcome.understood_as,
        "prefix_chars": outcome.prefix_chars,
        "prefix_matched": outcome.prefix_matched,
        "output_tokens": outcome.output_tokens,
        "billed_output_tokens": billed_tokens,
        "billed_text": "".join(billed_text),
        "completed": outcome.completed,
        "error": outcome.error,
        "finished": outcome.finished,
    }


_PARTIAL_TOOL_WIRES = ("anthropic", "openai")  # where ``[[partial_tool_at_limit]]`` applies
# how an answer so far holding server tool blocks comes back (``Interpretation.sent_back``)
_SENT_BACK_MODES = (Mode.PAUSED_TURN, Mode.PREFILL, Mode.CONTINUE_MESSAGE)


def _prompt_of(interpretation: Interpretation) -> str:
    turns = interpretation.conversation.turns
    return next((t.text for t in reversed(turns) if t.role == "user" and t.text), "")


def _after_tools(interpretation: Interpretation) -> bool:
    turns = interpretation.conversation.turns
    return bool(turns) and bool(turns[-1].tool_results)


def _injected_error(dialect: Dialect, fault: Fault | None, events: list[WireEvent], start: int = 0) -> WireEvent | None:
    """The error event an ``error`` fault puts after ``fault.events`` events of the stream
    ``events[start:]``, told which event it follows so it can carry the stream's next
    sequence number (a Responses stream numbers every event, an error included)."""
    if fault is None or fault.kind is not FaultKind.ERROR:
        return None
    at = start + (fault.events or 0) - 1
    previous = events[at] if 0 <= at < len(events) else None
    return dialect.error_event(fault.error_type, fault.message, after=previous)


def _understand(
    dialect: Dialect, request: Request, fault: Fault | None, outcome: _Outcome, recording: Recording | None = None
) -> ErrorSpec | tuple[Interpretation, Plan, ResponseContext]:
    """The answer to send, or the error the provider would send instead (in the real order:
    request checks, then a scripted status fault, then the body)."""
    rejection = _check_request(dialect, request)
    if rejection is not None:
        return rejection
    if fault is not None and fault.kind is FaultKind.STATUS:
        assert fault.code is not None
        outcome.fault_triggered = True
        spec = dialect.status_error(fault.code, fault.error_type, fault.message, quota=fault.quota)
        return replace(spec, headers=tuple(fault.retry_headers()))
    try:
        body = json.loads(request.body)
    except ValueError:  # JSON and UTF-8 decoding errors
        return dialect.bad_json
    try:
        interpretation = dialect.interpret(body)
    except RequestRejected as exc:
        return ErrorSpec(exc.status, exc.error_type, exc.message, exc.param, exc.code)
    if recording is not None and not _after_tools(interpretation):
        plan = recording.plan
    else:
        plan = plan_answer(interpretation.conversation, tool_id_prefix=dialect.tool_id_prefix)
    outcome.understood_as = interpretation.mode.value
    inputs = _input_tokens(interpretation, plan, body)
    if interpretation.sent_back and recording is None and interpretation.mode in _SENT_BACK_MODES:
        # an answer with server tool blocks goes on after the blocks sent back (a paused turn, or
        # after a break a prefill or a continue message); a model that does not recognise them
        # starts over
        rest = wire_anthropic.rest_after(plan, interpretation.sent_back)
        outcome.prefix_matched = rest is not None
        plan = rest or plan
    elif interpretation.continues:
        directives = Directives.of(interpretation.conversation)
        conversation = interpretation.conversation
        thinks = (conversation.thinking or conversation.hidden_thinking) and not directives.no_continuation_thinking
        whole = plan
        plan, matched = continue_plan(
            plan,
            interpretation.prefix_text,
            interpretation.prefix_calls,
            drop_tools=directives.no_tool_after_break,
            thinking_about=_prompt_of(interpretation) if thinks else None,
            hidden_thinking=conversation.hidden_thinking,
        )
        outcome.prefix_chars, outcome.prefix_matched = len(interpretation.prefix_text), matched
        if matched and directives.seam and interpretation.mode is Mode.CONTINUE_MESSAGE:
            plan = seam_plan(whole, plan, interpretation.prefix_text, directives, _prompt_of(interpretation))
    if Directives.of(interpretation.conversation).pause:
        plan = paused_part(plan)  # up to the next search call, where the API pauses the turn
    if interpretation.conversation.thinking_budget is not None:
        plan = cap_thinking(plan, interpretation.conversation.thinking_budget)
    if interpretation.max_tokens is not None:
        # only these wires stream a call's arguments in pieces: elsewhere a call comes whole
        directives = Directives.of(interpretation.conversation)
        partial = dialect.name in _PARTIAL_TOOL_WIRES and directives.partial_tool_at_limit
        plan = limit_plan(plan, interpretation.max_tokens, partial_tools=partial)
    outcome.output_tokens = plan.output_tokens
    ctx = ResponseContext(
        model=interpretation.model,
        seed=json.dumps(body, sort_keys=True, ensure_ascii=False),
        input_tokens=inputs,
        include_usage=interpretation.include_usage,
        options=body,
    )
    return interpretation, plan, ctx


def _input_tokens(interpretation: Interpretation, plan: Plan, body: Mapping[str, Any]) -> int:
    """What the request costs as input (``plan``: the whole answer, before any continuation)."""
    system = body.get("system")
    return input_tokens(
        interpretation.conversation,
        plan,
        prefix_text=interpretation.prefix_text,
        prefix_calls=interpretation.prefix_calls,
        instructions=[CONTINUE_INSTRUCTION] * interpretation.instructions,
        system=json.dumps(system, ensure_ascii=False) if system else "",
    )


def _count_tokens(dialect: Dialect, request: Request, recording: Recording | None) -> tuple[int, Any]:
    """``POST /v1/messages/count_tokens``: the input tokens the same Messages request would
    report in its ``message_start``, free (nothing generated, nothing in the billing log)."""
    rejection = _check_request(dialect, request)
    if rejection is not None:
        return rejection.status, json.loads(dialect.error_body(rejection, "req_count"))
    try:
        body = json.loads(request.body)
        if not isinstance(body, dict):
            raise ValueError("not an object")
        interpretation = read_anthropic.interpret({**body, "stream": False}, counting=True)
    except ValueError:
        return 400, json.loads(dialect.error_body(dialect.bad_json, "req_count"))
    except RequestRejected as exc:
        spec = ErrorSpec(exc.status, exc.error_type, exc.message, exc.param, exc.code)
        return spec.status, json.loads(dialect.error_body(spec, "req_count"))
    if recording is not None and not _after_tools(interpretation):
        plan = recording.plan
    else:
        plan = plan_answer(interpretation.conversation, tool_id_prefix=dialect.tool_id_prefix)
    return 200, {"input_tokens": _input_tokens(interpretation, plan, body)}


# Faults after which a background response is not there to re-attach to: it failed.
_BREAKS_RESPONSE = (FaultKind.ERROR, FaultKind.GARBAGE, FaultKind.BAD_UTF8, FaultKind.DROP, FaultKind.STATUS)


def _check_reattach(dialect: Dialect, request: Request) -> ErrorSpec | None:
    """A re-attach is a GET with the key and ``stream=true``."""
    if request.method != "GET":
        return ErrorSpec(405, "invalid_request_error", f"Invalid method for URL ({request.method} {request.path})")
    spec = dialect.authenticate(request.headers)
    if spec is not None:
        return spec
    if request.query.get("stream") != "true":
        return ErrorSpec(400, "invalid_request_error", "This fake serves re-attaches as streams only (stream=true).")
    after = request.query.get("starting_after", "0")
    if not after.lstrip("-").isdigit():
        return ErrorSpec(400, "invalid_request_error", f"Invalid 'starting_after': {after!r}.", param="starting_after")
    return None


def _check_request(dialect: Dialect, request: Request) -> ErrorSpec | None:
    """The checks real APIs make before reading the body: method, key, headers, content type."""
    if request.method != "POST":
        return ErrorSpec(405, "invalid_request_error", f"Invalid method for URL ({request.method} {request.path})")
    for check in (dialect.authenticate, dialect.check_headers):
        if (spec := check(request.headers)) is not None:
            return spec
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != JSON_TYPE:
        return dialect.bad_content_type
    return None
