"""What the fake provider and the chaos proxy share: a server on real sockets that reads each
connection as HTTP/1.1 or, after the HTTP/2 preface, HTTP/2 (``http11``, ``http2``), consumes
one scripted fault per request by scenario, keeps a log, and answers control endpoints.

``ScriptedServer`` runs in a background thread (``start``/``stop``, a context manager) or in an
existing event loop (``start_async``/``serve_forever``, an async context manager). A subclass
answers requests (``_dispatch``) and names its control prefix; the control endpoints are
``POST <prefix>faults`` ``{"scenario": key, "faults": [...]}`` (strings, dicts, or one
``;``-separated string), ``GET <prefix>faults``, ``GET <prefix>log[?scenario=]`` and
``POST <prefix>reset`` (optionally ``{"scenario": key}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar

from .faults import Fault, FaultScripts, as_fault, parse_script
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

SCENARIO_HEADER = "x-fake-scenario"
DEFAULT_SCENARIO = "default"
JSON_TYPE = "application/json"


class _Entry(Protocol):
    @property
    def scenario(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


EntryT = TypeVar("EntryT", bound=_Entry)


class LogSlot(Generic[EntryT]):
    """One request's place in the log, taken when the request is accepted, so the log holds
    every request that reached the server, however it ended. While the answer goes on, ``live``
    builds the entry as it stands whenever the log is read; at the end the entry is frozen."""

    __slots__ = ("entry", "live")

    def __init__(self, entry: EntryT | None = None, live: Callable[[], EntryT] | None = None) -> None:
        self.entry = entry
        self.live = live

    def read(self) -> EntryT:
        if self.live is not None:
            return self.live()
        assert self.entry is not None
        return self.entry


def scenario_of(request: Request) -> str:
    """The request's scenario: its ``x-fake-scenario`` header, ``default`` without one."""
    return request.headers.get(SCENARIO_HEADER) or DEFAULT_SCENARIO


def json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


class ScriptedServer(Generic[EntryT]):
    """Listens on ``host:port`` (port 0: any free port); a subclass answers the requests."""

    _what = "the server"  # in "... is not running"
    _thread_name = "streamrecover-server"
    _control_prefix = "/_control/"

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._requested_port = port
        self.port = 0
        self._scripts = FaultScripts()
        self._log: list[LogSlot[EntryT]] = []
        self._log_lock = threading.Lock()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- what a subclass adds ----------------------------------------------------------

    async def _dispatch(self, request: Request, responder: Responder) -> None:
        """Answer one request (HTTP/1.1 or one HTTP/2 stream)."""
        raise NotImplementedError

    def _before_listening(self) -> None:
        """Called before the socket accepts its first connection."""

    async def _after_stopping(self) -> None:
        """Called once every connection has ended."""

    def _on_http2(self) -> None:
        """Called for each connection that speaks HTTP/2."""

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if not self.port:
            raise RuntimeError(f"{self._what} is not running")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start_async(self) -> str:
        """Listen in the running event loop; returns the base URL."""
        if self._server is not None:
            raise RuntimeError("already started")
        self._before_listening()
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
        await self._after_stopping()

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

        self._thread = threading.Thread(target=run, name=self._thread_name, daemon=True)
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

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await self.start_async()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop_async()

    # -- faults and log ------------------------------------------------------------------

    def set_faults(self, scenario: str, faults: Iterable[Fault | str | Mapping[str, Any]]) -> None:
        """Replace the scenario's script; each request consumes one fault."""
        self._scripts.set(scenario, faults)

    @property
    def log(self) -> list[EntryT]:
        """A copy of the log, oldest first."""
        with self._log_lock:
            return [slot.read() for slot in self._log]

    def log_for(self, scenario: str) -> list[EntryT]:
        return [entry for entry in self.log if entry.scenario == scenario]

    def reset(self, scenario: str | None = None) -> None:
        """Forget the scripts and log entries of one scenario, or of all."""
        self._scripts.clear(scenario)
        with self._log_lock:
            self._log = [] if scenario is None else [s for s in self._log if s.read().scenario != scenario]

    def _append_log(self, entry: EntryT) -> None:
        with self._log_lock:
            self._log.append(LogSlot(entry))

    def _append_live_log(self, live: Callable[[], EntryT]) -> LogSlot[EntryT]:
        """A request's entry built by ``live`` until ``_settle_log`` freezes it."""
        slot = LogSlot(live=live)
        with self._log_lock:
            self._log.append(slot)
        return slot

    def _settle_log(self, slot: LogSlot[EntryT]) -> None:
        """Freeze the entry as the request ended (after a reset dropped it, this goes nowhere)."""
        entry = slot.read()
        with self._log_lock:
            slot.entry, slot.live = entry, None

    # -- connections ---------------------------------------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            try:
                request = await read_request(reader)
            except BadHTTPRequest as exc:
                writer.write(full_response(exc.status, [], json_bytes({"error": exc.message}), JSON_TYPE))
                return
            except HTTP2Preface:
                self._on_http2()
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

    # -- control endpoints ---------------------------------------------------------------

    def _is_control(self, request: Request) -> bool:
        return request.path.startswith(self._control_prefix)

    async def _answer_control(self, request: Request, responder: Responder) -> None:
        status, payload = self._control(request)
        await responder.full(status, [], json_bytes(payload), JSON_TYPE)

    def _control(self, request: Request) -> tuple[int, Any]:
        try:
            return self._control_payload(request)
        except (ValueError, TypeError) as exc:
            return 400, {"error": str(exc)}

    def _control_payload(self, request: Request) -> tuple[int, Any]:
        prefix = self._control_prefix
        route = (request.method, request.path)
        data = json.loads(request.body) if request.body.strip() else {}
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        scenario = data.get("scenario") or request.query.get("scenario")
        if route == ("POST", f"{prefix}faults"):
            raw = data.get("faults", [])
            faults = parse_script(raw) if isinstance(raw, str) else [as_fault(f) for f in raw]
            key = scenario or DEFAULT_SCENARIO
            self.set_faults(key, faults)
            return 200, {"scenario": key, "faults": [f.to_dict() for f in faults]}
        if route == ("GET", f"{prefix}faults"):
            pending = self._scripts.pending()
            return 200, {"scenarios": {key: [f.to_dict() for f in faults] for key, faults in pending.items()}}
        if route == ("GET", f"{prefix}log"):
            entries = self.log_for(scenario) if scenario else self.log
            return 200, {"entries": [entry.to_dict() for entry in entries]}
        if route == ("POST", f"{prefix}reset"):
            self.reset(scenario)
            return 200, {"reset": scenario or "all"}
        return 404, {"error": f"no control endpoint {request.method} {request.path}"}
