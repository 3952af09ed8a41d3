"""The fake provider's HTTP server: real sockets, scripted faults, a billing log.

It speaks the Anthropic Messages and OpenAI Chat Completions wire formats on loopback so
the product is tested through the same httpx code paths as production, and it fails the
way real providers fail: a chunked body cut without its last chunk (httpx raises
``RemoteProtocolError``), a clean end without the terminator event, a stall, an error
event inside a 200 stream, an HTTP error with Retry-After, bytes that are not JSON or not
UTF-8, a GOAWAY in the middle of an HTTP/2 stream (a connection that opens with the HTTP/2
preface is served over HTTP/2, ``http2``). It can run in a background thread
(``start``/``stop``, a context manager) or in an existing event loop
(``start_async``/``serve_forever``, an async context manager).

Routes: ``POST /v1/messages`` (Anthropic) and its free ``/v1/messages/count_tokens``, ``POST /v1/chat/completions``,
``/beta/chat/completions`` and ``/chat/completions`` (OpenAI; DeepSeek-style bases), and
control endpoints ``POST /_fake/faults`` ``{"scenario": key, "faults": [...]}`` (strings,
dicts, or one ``;``-separated string), ``GET /_fake/faults``, ``GET /_fake/log[?scenario=]``
and ``POST /_fake/reset`` (optionally ``{"scenario": key}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

from ...engine.contract import CONTINUE_INSTRUCTION, SECRET_HEADERS
from .dialects import ROUTES, Dialect
from .faults import Delivery, Fault, FaultKind, FaultScripts, as_fault, parse_script, plan_delivery
from .http2 import H2ServerConnection
from .http11 import (
    MAX_HEADER_BYTES,
    BadHTTPRequest,
    H1Responder,
    HTTP2Preface,
    Request,
    Responder,
    full_response,
    read_request,
)
from .interpret import Interpretation, Mode, RequestRejected
from .log import LogEntry
from .model import Directives, Plan, continue_plan, input_tokens, limit_plan, plan_answer, seam_plan
from .recording import Recording
from .wire import ErrorSpec, ResponseContext

SCENARIO_HEADER = "x-fake-scenario"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"  # Anthropic's free input-token count
DEFAULT_SCENARIO = "default"
_JSON = "application/json"


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


class FakeProviderServer:
    """A fault-injecting fake LLM provider on ``host:port`` (port 0: any free port).

    ``event_delay`` (seconds) spaces the SSE events out, so a demo streams visibly.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, event_delay: float = 0.0) -> None:
        self.host = host
        self._requested_port = port
        self.event_delay = event_delay
        self._scripts = FaultScripts()
        self._recordings: dict[str, Recording] = {}
        self.count_requests = 0  # token-count calls (free: not in the billing log)
        self._log: list[LogEntry] = []
        self._log_lock = threading.Lock()
        self._seq = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = 0
        self.http2_connections = 0  # connections that spoke HTTP/2 (prior knowledge)

    # -- lifecycle -----------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if not self.port:
            raise RuntimeError("the fake provider is not running")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start_async(self) -> str:
        """Listen in the running event loop; returns the base URL."""
        if self._server is not None:
            raise RuntimeError("already started")
        self._server = await asyncio.start_server(
            self._on_connection, self.host, self._requested_port, limit=MAX_HEADER_BYTES
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.base_url

    async def serve_forever(self) -> None:
        """Serve in the running event loop until cancelled (starts listening if needed)."""
        if self._server is None:
            await self.start_async()
        assert self._server is not None
        try:
            await self._server.serve_forever()
        finally:
            await self.stop_async()

    async def stop_async(self) -> None:
        """Stop listening and end every open connection (a stalled stream included)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    def start(self) -> str:
        """Run in a background thread with its own event loop; returns the base URL."""
        if self._thread is not None:
            raise RuntimeError("already started")
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.start_async())
            except BaseException as exc:  # reported to the caller of start()
                failure.append(exc)
                loop.close()
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.stop_async())
                loop.close()

        self._thread = threading.Thread(target=run, name="streamrecover-fake-provider", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self.base_url

    def stop(self) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._thread = None
        self._loop = None

    def __enter__(self) -> FakeProviderServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeProviderServer:
        await self.start_async()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop_async()

    # -- faults and log ----------------------------------------------------------------

    def set_faults(self, scenario: str, faults: Iterable[Fault | str | Mapping[str, Any]]) -> None:
        """Replace the scenario's script; each provider request consumes one fault."""
        self._scripts.set(scenario, faults)

    def set_recording(self, scenario: str, raw: bytes | None) -> None:
        """Answer the scenario's fresh requests with these recorded bytes (None: stop)."""
        if raw is None:
            self._recordings.pop(scenario, None)
        else:
            self._recordings[scenario] = Recording.from_bytes(raw)

    def pending_faults(self, scenario: str = DEFAULT_SCENARIO) -> list[Fault]:
        return self._scripts.pending().get(scenario, [])

    @property
    def log(self) -> list[LogEntry]:
        """A copy of the billing log, oldest first."""
        with self._log_lock:
            return list(self._log)

    def log_for(self, scenario: str) -> list[LogEntry]:
        return [entry for entry in self.log if entry.scenario == scenario]

    def reset(self, scenario: str | None = None) -> None:
        """Forget the scripts and log entries of one scenario, or of all."""
        self._scripts.clear(scenario)
        with self._log_lock:
            self._log = [] if scenario is None else [e for e in self._log if e.scenario != scenario]

    # -- connections -------------------------------------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            try:
                request = await read_request(reader)
            except BadHTTPRequest as exc:
                writer.write(full_response(exc.status, [], _json_bytes({"error": exc.message}), _JSON))
                return
            except HTTP2Preface:
                self.http2_connections += 1
                await H2ServerConnection(reader, writer, self._dispatch).serve()
                return
            if request is None:
                return
            await self._dispatch(request, H1Responder(writer))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # stop() ends open connections; the task must not end "cancelled" (asyncio logs that)
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()  # flushes what was written, then FIN: no last chunk unless one was sent
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _dispatch(self, request: Request, responder: Responder) -> None:
        """Answer one request (HTTP/1.1 or one HTTP/2 stream)."""
        if request.path.startswith("/_fake/"):
            status, payload = self._control(request)
            await responder.full(status, [], _json_bytes(payload), _JSON)
            return
        if request.path == COUNT_TOKENS_PATH and request.method == "POST":
            self.count_requests += 1
            scenario = request.headers.get(SCENARIO_HEADER) or DEFAULT_SCENARIO
            status, payload = _count_tokens(ROUTES["/v1/messages"], request, self._recordings.get(scenario))
            await responder.full(status, [], _json_bytes(payload), _JSON)
            return
        dialect = ROUTES.get(request.path)
        if dialect is None:
            body = _json_bytes({"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}})
            await responder.full(404, [], body, _JSON)
            return
        await self._provider_request(dialect, request, responder)

    async def _provider_request(self, dialect: Dialect, request: Request, writer: Responder) -> None:
        scenario = request.headers.get(SCENARIO_HEADER) or DEFAULT_SCENARIO
        fault = self._scripts.next(scenario)
        seq = next(self._seq)
        request_id = f"req_fake{seq:018d}"
        outcome = _Outcome()
        recorded = False

        def record() -> None:
            # Called just before the write that lets the client see the end of the answer,
            # so a test that reads the log right after its response finds the entry there.
            nonlocal recorded
            if not recorded:
                recorded = True
                self._record(seq, request_id, dialect, request, scenario, fault, outcome)

        try:
            recording = self._recordings.get(scenario)
            await self._answer(dialect, request, fault, request_id, writer, outcome, record, recording)
        finally:
            record()

    async def _answer(
        self,
        dialect: Dialect,
        request: Request,
        fault: Fault | None,
        request_id: str,
        writer: Responder,
        outcome: _Outcome,
        record: Callable[[], None],
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
            record()
            headers = [*dialect.response_headers(request_id), *answer.headers]
            await writer.full(answer.status, headers, error_body, _JSON)
            return
        interpretation, plan, ctx = answer
        if not interpretation.stream:  # stream faults apply to streams only
            whole = _json_bytes(dialect.response_json(plan, ctx))
            outcome.status, outcome.bytes_sent, outcome.completed = 200, len(whole), True
            outcome.billed_output_tokens, outcome.billed_text = plan.output_tokens, [plan.text]
            record()
            await writer.full(200, dialect.response_headers(request_id), whole, _JSON)
            return
        injected = (
            dialect.error_event(fault.error_type, fault.message) if fault and fault.kind is FaultKind.ERROR else None
        )
        replay = recording is not None and not interpretation.continues and not _after_tools(interpretation)
        events = list(recording.events) if replay and recording is not None else None
        if recording is not None and interpretation.continues and not _after_tools(interpretation):
            events = recording.continuation(json.loads(request.body), thinking=interpretation.conversation.thinking)
            if events is not None:  # the rest of the recorded answer, in its own encoding
                outcome.output_tokens, outcome.prefix_matched = sum(e.tokens for e in events), True
        if events is None:
            events = dialect.stream_events(plan, ctx)
        delivery = plan_delivery(events, fault, injected)
        outcome.fault_triggered = delivery.triggered
        await self._send_stream(writer, dialect, request_id, delivery, outcome, record)

    async def _send_stream(
        self,
        writer: Responder,
        dialect: Dialect,
        request_id: str,
        delivery: Delivery,
        outcome: _Outcome,
        record: Callable[[], None],
    ) -> None:
        headers = [
            ("content-type", "text/event-stream; charset=utf-8"),
            ("cache-control", "no-cache"),
            *dialect.response_headers(request_id),
        ]
        await writer.head(200, headers)
        outcome.status = 200

        def finish() -> bool:
            outcome.completed = delivery.complete
            record()
            return delivery.clean_end

        pieces = delivery.pieces
        last = len(pieces) - 1 if delivery.stall_before != len(pieces) else -1
        for index, piece in enumerate(pieces):
            if index == delivery.stall_before:
                await asyncio.sleep(delivery.stall_seconds)
            elif index and self.event_delay:
                await asyncio.sleep(self.event_delay)
            if writer.closing():
                return
            outcome.bytes_sent += len(piece.data)
            outcome.billed_output_tokens += piece.tokens
            outcome.billed_text.append(piece.text)
            await writer.data(piece.data, end_stream=finish() if index == last else False)
        if last < 0:  # no pieces, or a stall after the last one
            if delivery.stall_before == len(pieces):
                await asyncio.sleep(delivery.stall_seconds)
            await writer.data(b"", end_stream=finish())
        if delivery.goaway:
            await writer.goaway()

    def _record(
        self,
        seq: int,
        request_id: str,
        dialect: Dialect,
        request: Request,
        scenario: str,
        fault: Fault | None,
        outcome: _Outcome,
    ) -> None:
        try:
            body: Any = json.loads(request.body)
        except ValueError:
            body = None
        entry = LogEntry(
            seq=seq,
            request_id=request_id,
            method=request.method,
            path=request.path,
            provider=dialect.name,
            scenario=scenario,
            headers={k: v for k, v in request.headers.items() if k not in SECRET_HEADERS},
            request=body,
            fault=fault.to_dict() if fault else None,
            fault_triggered=outcome.fault_triggered,
            status=outcome.status,
            bytes_sent=outcome.bytes_sent,
            understood_as=outcome.understood_as,
            prefix_chars=outcome.prefix_chars,
            prefix_matched=outcome.prefix_matched,
            output_tokens=outcome.output_tokens,
            billed_output_tokens=outcome.billed_output_tokens,
            billed_text="".join(outcome.billed_text),
            completed=outcome.completed,
            error=outcome.error,
        )
        with self._log_lock:
            self._log.append(entry)

    # -- control endpoints ---------------------------------------------------------------

    def _control(self, request: Request) -> tuple[int, Any]:
        try:
            return self._control_payload(request)
        except (ValueError, TypeError) as exc:
            return 400, {"error": str(exc)}

    def _control_payload(self, request: Request) -> tuple[int, Any]:
        route = (request.method, request.path)
        data = json.loads(request.body) if request.body.strip() else {}
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        scenario = data.get("scenario") or request.query.get("scenario")
        if route == ("POST", "/_fake/faults"):
            raw = data.get("faults", [])
            faults = parse_script(raw) if isinstance(raw, str) else [as_fault(f) for f in raw]
            key = scenario or DEFAULT_SCENARIO
            self.set_faults(key, faults)
            return 200, {"scenario": key, "faults": [f.to_dict() for f in faults]}
        if route == ("GET", "/_fake/faults"):
            pending = self._scripts.pending()
            return 200, {"scenarios": {key: [f.to_dict() for f in faults] for key, faults in pending.items()}}
        if route == ("GET", "/_fake/log"):
            entries = self.log_for(scenario) if scenario else self.log
            return 200, {"entries": [entry.to_dict() for entry in entries]}
        if route == ("POST", "/_fake/reset"):
            self.reset(scenario)
            return 200, {"reset": scenario or "all"}
        return 404, {"error": f"no control endpoint {request.method} {request.path}"}


def _prompt_of(interpretation: Interpretation) -> str:
    turns = interpretation.conversation.turns
    return next((t.text for t in reversed(turns) if t.role == "user" and t.text), "")


def _after_tools(interpretation: Interpretation) -> bool:
    turns = interpretation.conversation.turns
    return bool(turns) and bool(turns[-1].tool_results)


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
    if interpretation.continues:
        directives = Directives.of(interpretation.conversation)
        thinks = interpretation.conversation.thinking and not directives.no_continuation_thinking
        whole = plan
        plan, matched = continue_plan(
            plan,
            interpretation.prefix_text,
            interpretation.prefix_calls,
            drop_tools=directives.no_tool_after_break,
            thinking_about=_prompt_of(interpretation) if thinks else None,
        )
        outcome.prefix_chars, outcome.prefix_matched = len(interpretation.prefix_text), matched
        if matched and directives.seam and interpretation.mode is Mode.CONTINUE_MESSAGE:
            plan = seam_plan(whole, plan, interpretation.prefix_text, directives, _prompt_of(interpretation))
    if interpretation.max_tokens is not None:
        plan = limit_plan(plan, interpretation.max_tokens)
    outcome.output_tokens = plan.output_tokens
    ctx = ResponseContext(
        model=interpretation.model,
        seed=json.dumps(body, sort_keys=True, ensure_ascii=False),
        input_tokens=inputs,
        include_usage=interpretation.include_usage,
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
        interpretation = dialect.interpret({**body, "max_tokens": 1, "stream": False})
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


def _check_request(dialect: Dialect, request: Request) -> ErrorSpec | None:
    """The checks real APIs make before reading the body: method, key, headers, content type."""
    if request.method != "POST":
        return ErrorSpec(405, "invalid_request_error", f"Invalid method for URL ({request.method} {request.path})")
    for check in (dialect.authenticate, dialect.check_headers):
        if (spec := check(request.headers)) is not None:
            return spec
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != _JSON:
        return dialect.bad_content_type
    return None


def _json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
