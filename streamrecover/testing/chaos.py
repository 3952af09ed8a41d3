"""The chaos proxy: forwards requests to a real provider (or the fake) and breaks the real
response stream as it is told, so an operator can prove recovery against their own model.

It listens on loopback only, speaks HTTP/1.1 and HTTP/2 (cleartext, prior knowledge) to its
clients with the fake provider's own server (``fake.serving``: sockets, fault scripts, log and
control endpoints, over ``fake.http11`` and ``fake.http2``), and takes the fake's fault
vocabulary (``fake.faults``), consumed one fault per proxied request, per scenario (the
``x-fake-scenario`` header; default ``default``). What a fault does to a real stream:

- ``cut:bytes=N`` / ``cut:events=N[,mid]``: the upstream's first N body bytes or whole SSE
  events (halfway into the next one with ``mid``) are forwarded, then the connection is
  closed without the last chunk (HTTP/2: the connection is closed under the stream);
- ``eof:...``: the same, but the body ends cleanly (the terminator events are lost);
- ``stall:events=N,seconds=S[,then=cut|eof|continue]``: nothing for S seconds after N events;
- ``error:events=N[,type=...,message=...]``: after N events, a mid-stream error event in the
  request's wire format (the fake's route for the path: Anthropic ``/messages``, OpenAI
  ``/chat/completions``, OpenAI ``/responses``, Gemini; Anthropic for any other path), clean
  end; a Responses error carries the stream's next ``sequence_number``, as the real API's does;
- ``garbage:events=N`` / ``bad_utf8:events=N``: event N+1 forwarded corrupted, clean end;
- ``goaway:events=N|bytes=N``: HTTP/2: GOAWAY mid-stream, then the connection closes (over
  HTTP/1.1, a plain cut);
- ``drop``, ``stall_headers:seconds=S``, ``status:CODE[,...]``: before (or instead of) asking
  the upstream: the connection closes at once, nothing is sent for S seconds, or an HTTP error
  in the request's wire format is answered without calling the upstream.

Positions count the upstream's decoded body bytes (the proxy asks it for ``identity``
encoding) and whole SSE events; a position beyond the stream does not trigger; ``from_end``
needs the stream's end in advance and is refused. With no fault the client gets the
upstream's status, headers (hop-by-hop ones aside) and body bytes unchanged.

Control endpoints, as the fake's: ``POST /_chaos/faults`` ``{"scenario", "faults"}``,
``GET /_chaos/faults``, ``GET /_chaos/log``, ``POST /_chaos/reset``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from ..engine.sse import is_event_stream
from .fake.dialects import ANTHROPIC, Dialect, route
from .fake.faults import Fault, FaultKind, as_fault
from .fake.http11 import Request, Responder
from .fake.serving import DEFAULT_SCENARIO, JSON_TYPE, ScriptedServer, json_bytes, scenario_of
from .fake.wire import ErrorSpec, WireEvent

# Never forwarded either way: they describe one hop, not the message.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
    }
)
_CORRUPTING = (FaultKind.GARBAGE, FaultKind.BAD_UTF8)


def check_loopback(host: str) -> None:
    """A ``ValueError`` unless ``host`` is a loopback address (the proxy never listens elsewhere)."""
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address: the chaos proxy listens on loopback only") from None
    if not loopback:
        raise ValueError(f"{host} is not a loopback address: the chaos proxy listens on loopback only")


def check_fault(fault: Fault) -> Fault:
    if fault.from_end is not None:
        raise ValueError("from_end needs the stream's end in advance: the proxy cannot break a live stream there")
    return fault


def dialect_for(path: str, query: Mapping[str, str] | None = None) -> Dialect:
    """The wire format an error is written in: the fake provider's for the path (so the
    proxy's errors are the fake's, numbered alike), Anthropic for a path the fake does not serve."""
    dialect, _ = route(path.rstrip("/") or "/", query)
    return dialect or ANTHROPIC


@dataclass(frozen=True, slots=True)
class ProxyLogEntry:
    method: str
    path: str
    scenario: str
    fault: dict[str, Any] | None
    status: int
    bytes_forwarded: int
    events_forwarded: int
    fault_triggered: bool
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ChaosProxy(ScriptedServer[ProxyLogEntry]):
    """Forwards to ``upstream`` (an origin: ``https://api.anthropic.com``; request paths pass
    unchanged), breaking responses by the fault scripts. ``loop``: a script starts over when it
    runs out, so every request meets a fault."""

    _what = "the chaos proxy"
    _thread_name = "streamrecover-chaos-proxy"
    _control_prefix = "/_chaos/"

    def __init__(
        self,
        upstream: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        faults: Iterable[Fault | str | Mapping[str, Any]] = (),
        loop: bool = False,
        upstream_http2: bool = False,
        connect_timeout: float = 10.0,
    ) -> None:
        check_loopback(host)
        parsed = httpx.URL(upstream)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"--upstream must be an http(s) URL, not {upstream!r}")
        super().__init__(host, port)
        self.upstream = upstream.rstrip("/")
        self.loop = loop
        self.upstream_http2 = upstream_http2
        self.connect_timeout = connect_timeout
        self._originals: dict[str, list[Fault]] = {}
        self._client: httpx.AsyncClient | None = None
        if faults:
            self.set_faults(DEFAULT_SCENARIO, faults)

    # -- the upstream client, for as long as the proxy listens ---------------------------

    def _before_listening(self) -> None:
        timeout = httpx.Timeout(connect=self.connect_timeout, read=None, write=None, pool=None)
        self._client = httpx.AsyncClient(http2=self.upstream_http2, timeout=timeout, follow_redirects=False)

    async def _after_stopping(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- faults and log ----------------------------------------------------------------

    def set_faults(self, scenario: str, faults: Iterable[Fault | str | Mapping[str, Any]]) -> None:
        script = [check_fault(as_fault(f)) for f in faults]
        self._originals[scenario] = script
        self._scripts.set(scenario, script)

    def _next_fault(self, scenario: str) -> Fault | None:
        fault = self._scripts.next(scenario)
        if fault is None and self.loop and self._originals.get(scenario):
            self._scripts.set(scenario, self._originals[scenario])
            fault = self._scripts.next(scenario)
        return fault

    def reset(self, scenario: str | None = None) -> None:
        super().reset(scenario)
        if scenario is None:
            self._originals.clear()
        else:
            self._originals.pop(scenario, None)

    # -- requests ------------------------------------------------------------------------

    async def _dispatch(self, request: Request, responder: Responder) -> None:
        if self._is_control(request):
            await self._answer_control(request, responder)
            return
        scenario = scenario_of(request)
        fault = self._next_fault(scenario)
        relay = _Relay(request, responder, fault)
        logged = False

        def record() -> None:
            nonlocal logged
            if logged:
                return
            logged = True
            entry = ProxyLogEntry(
                method=request.method,
                path=request.path,
                scenario=scenario,
                fault=fault.to_dict() if fault else None,
                status=relay.status,
                bytes_forwarded=relay.bytes,
                events_forwarded=relay.events,
                fault_triggered=relay.triggered,
                error=relay.error,
            )
            self._append_log(entry)

        relay.on_end = record
        try:
            await self._forward(request, relay)
        finally:
            record()

    async def _forward(self, request: Request, relay: _Relay) -> None:
        fault = relay.fault
        if fault is not None and fault.kind is FaultKind.DROP:
            relay.triggered = True
            return
        if fault is not None and fault.kind is FaultKind.STALL_HEADERS:
            relay.triggered = True
            await asyncio.sleep(fault.seconds)
        if fault is not None and fault.kind is FaultKind.STATUS:
            relay.triggered = True
            await relay.status_error(fault)
            return
        assert self._client is not None
        url = self.upstream + request.path
        headers = [(k, v) for k, v in request.headers.items() if k not in HOP_BY_HOP]
        headers.append(("accept-encoding", "identity"))  # positions count the bytes the client reads
        target = httpx.URL(url, params=request.query) if request.query else httpx.URL(url)
        upstream = self._client.build_request(request.method, target, headers=headers, content=request.body or None)
        try:
            response = await self._client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            relay.error = f"upstream: {type(exc).__name__}: {exc}"
            relay.status = 502
            relay.on_end()
            await relay.responder.full(502, [], json_bytes({"error": relay.error}), JSON_TYPE)
            return
        try:
            await relay.forward(response)
        finally:
            await response.aclose()


class _Relay:
    """One proxied response: the upstream's bytes to the client, broken where the fault says."""

    def __init__(self, request: Request, responder: Responder, fault: Fault | None) -> None:
        self.request = request
        self.responder = responder
        self.fault = fault
        self.dialect = dialect_for(request.path, request.query)
        self.status = 0
        self.bytes = 0
        self.events = 0
        # the last whole SSE event the client got: an injected error follows it (a Responses
        # error is numbered one past it)
        self.last_event: WireEvent | None = _reattached_after(request)
        self.triggered = False
        self.error: str | None = None
        self.on_end: Callable[[], None] = lambda: None  # called just before the client can see the end

    async def _end(self) -> None:
        """End the body cleanly (the log entry is written first: a client that reads the log
        right after its response finds the entry there)."""
        self.on_end()
        await self.responder.data(b"", end_stream=True)

    async def status_error(self, fault: Fault) -> None:
        assert fault.code is not None
        spec: ErrorSpec = self.dialect.status_error(fault.code, fault.error_type, fault.message, quota=fault.quota)
        body = self.dialect.error_body(spec, "req_chaos")
        self.status = spec.status
        self.on_end()
        await self.responder.full(spec.status, [*spec.headers, *fault.retry_headers()], body, JSON_TYPE)

    async def forward(self, response: httpx.Response) -> None:
        self.status = response.status_code
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in HOP_BY_HOP]
        content_type = response.headers.get("content-type", "")
        if not is_event_stream(
            content_type
        ):  # a JSON answer or an error: whole, untouched (stream faults are for streams)
            body = await response.aread()
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
            self.bytes = len(body)
            self.on_end()
            await self.responder.full(response.status_code, headers, body, content_type or "application/octet-stream")
            return
        await self.responder.head(response.status_code, headers)
        fault = self.fault
        if fault is None or fault.kind in (FaultKind.OK, FaultKind.DROP, FaultKind.STATUS, FaultKind.STALL_HEADERS):
            async for chunk in response.aiter_raw():
                await self._send(chunk)
            await self._end()
            return
        if fault.byte_offset is not None:
            await self._by_bytes(response.aiter_raw(), fault)
        else:
            await self._by_events(response.aiter_raw(), fault)

    async def _send(self, data: bytes) -> None:
        if data and not self.responder.closing():
            self.bytes += len(data)
            await self.responder.data(data)

    async def _by_bytes(self, chunks: AsyncIterator[bytes], fault: Fault) -> None:
        offset = fault.byte_offset or 0
        rest = b""
        async for chunk in chunks:
            if self.bytes + len(chunk) >= offset and not self.triggered:
                head, rest = chunk[: offset - self.bytes], chunk[offset - self.bytes :]
                await self._send(head)
                if await self._trigger(fault, rest):
                    return
                continue
            await self._send(chunk)
        if not self.triggered and self.bytes == offset and await self._trigger(fault, b""):
            return
        await self._end()

    async def _by_events(self, chunks: AsyncIterator[bytes], fault: Fault) -> None:
        target = fault.events or 0
        buffer = b""
        if target == 0 and not fault.mid and fault.kind not in _CORRUPTING and await self._trigger(fault, b""):
            return
        async for chunk in chunks:
            if self.triggered:  # a stall that continues: the rest as it comes
                await self._send(chunk)
                continue
            buffer += chunk
            while (end := _event_end(buffer)) is not None:
                event, buffer = buffer[:end], buffer[end:]
                if self.events == target and (fault.mid or fault.kind in _CORRUPTING):
                    if await self._trigger(fault, event, rest=buffer):
                        return
                    buffer = b""  # a stall that continued sent it
                    break
                await self._send(event)
                self.events += 1
                self.last_event = WireEvent(event)
                if self.events == target and not fault.mid and fault.kind not in _CORRUPTING:
                    if await self._trigger(fault, b""):
                        return
                    await self._send(buffer)
                    buffer = b""
                    break
        await self._send(buffer)  # a stream that ended before the fault's position: as it was
        await self._end()

    async def _trigger(self, fault: Fault, event: bytes, *, rest: bytes = b"") -> bool:
        """Break the stream here; ``event`` is the next event (or bytes) not yet sent. True when
        the response is over (the caller stops), False when it goes on (a stall that continues)."""
        self.triggered = True
        kind = fault.kind
        if kind in _CORRUPTING:
            await self._send(_corrupt(event, bad_utf8=kind is FaultKind.BAD_UTF8))
            await self._end()
            return True
        if fault.mid and event:
            half = max(1, len(event) // 2)
            await self._send(event[:half])
            event = event[half:]
        if kind is FaultKind.ERROR:
            error = self.dialect.error_event(fault.error_type, fault.message, after=self.last_event)
            await self._send(error.data)
            await self._end()
            return True
        if kind is FaultKind.STALL:
            await asyncio.sleep(fault.seconds)
            if fault.then == "continue":
                await self._send(event + rest)
                return False
            if fault.then == "eof":
                await self._end()
            return True
        if kind is FaultKind.EOF:
            await self._end()
            return True
        if kind is FaultKind.GOAWAY:
            await self.responder.goaway()
            return True
        return True  # cut: returning without the end of the body closes the connection under it


def _reattached_after(request: Request) -> WireEvent | None:
    """On a Responses re-attach (``GET .../responses/{id}?starting_after=N``), the event the
    client already has, reduced to its number: the stream goes on from N + 1, an error too."""
    _, reattach = route(request.path, request.query)
    after = request.query.get("starting_after", "")
    if reattach is None or not after.isdigit():
        return None
    return WireEvent(f"data: {json.dumps({'sequence_number': int(after)})}\n\n".encode())


def _event_end(buffer: bytes) -> int | None:
    """Where the first whole SSE event in ``buffer`` ends (after its blank line), or None."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else None


def _corrupt(event: bytes, *, bad_utf8: bool) -> bytes:
    start = event.find(b"data:")
    if start < 0:
        return b"\xff\xfe" + event if bad_utf8 else event[: max(1, len(event) // 2)] + b"\n\n"
    start += len(b"data:")
    if bad_utf8:
        return event[:start] + b"\xff\xfe\xc3" + event[start:]
    payload = event[start:].rstrip(b"\r\n")
    return event[:start] + payload[: max(1, len(payload) // 2)] + b"\n\n"
