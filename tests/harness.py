"""Running the engine against the real fake provider over loopback, and checking the
invariants every recovery must keep."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from streamrecover.engine.agent import RunResult, ToolRegistry, run_agent
from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import CheckpointStore, InMemoryCheckpointStore
from streamrecover.engine.config import EngineConfig
from streamrecover.engine.context import Failover, RunContext
from streamrecover.engine.contract import ModelRequest, ProviderConfig
from streamrecover.engine.sink import AttemptRecord, CollectingSink
from streamrecover.engine.transport import HttpxTransport
from streamrecover.providers.registry import get_adapter
from streamrecover.testing.client import ClientView
from streamrecover.testing.fake import FakeProviderServer

FAST = EngineConfig(backoff_scale=0.0, idle_timeout_s=2.0, request_retry_base_s=0.0)


@dataclass
class Outcome:
    result: RunResult
    sink: CollectingSink
    log: list[Any]  # the fake provider's LogEntry list for this run's scenario
    view: ClientView = field(default_factory=ClientView)

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def assistant(self) -> list[dict[str, Any]]:
        return [m for m in self.result.messages if m["role"] == "assistant"]

    def names(self) -> list[str]:
        return self.sink.names()

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e.fields for e in self.sink.events if e.name == name]

    def frames(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.sink.frames if f["type"] == kind]

    def billed_text(self) -> str:
        return "".join(e.billed_text for e in self.log)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def provider(server: FakeProviderServer, scenario: str, wire: str = "anthropic", **kw: Any) -> ProviderConfig:
    base = kw.pop("base_url", None) or (server.base_url if wire in ("anthropic", "gemini") else f"{server.base_url}/v1")
    return ProviderConfig(
        name=wire, base_url=base, api_key="sk-test-secret", extra_headers={"x-fake-scenario": scenario}, **kw
    )


async def run(
    server: FakeProviderServer,
    prompt: str = "Tell me a story [[words=80]]",
    *,
    faults: list[Any] | tuple[Any, ...] = (),
    wire: str = "anthropic",
    model: str = "claude-3-7-sonnet",
    config: EngineConfig = FAST,
    tools: ToolRegistry | None = None,
    thinking_budget: int | None = None,
    max_tokens: int = 4096,
    cancel: CancelToken | None = None,
    checkpoints: CheckpointStore | None = None,
    run_id: str | None = None,
    resume: bool = False,
    messages: list[dict[str, Any]] | None = None,
    provider_kw: dict[str, Any] | None = None,
    structured: bool = False,
    recording: bytes | None = None,
    transport: HttpxTransport | None = None,
    extra: dict[str, Any] | None = None,
    failover: tuple[str, str] | None = None,
    scenario: str | None = None,
    sink: CollectingSink | None = None,
) -> Outcome:
    """One run against the fake; ``failover`` is the (wire, model) a turn goes on with when its
    provider gives up mid-answer (the same fake, the same scenario). ``scenario``: the fake's
    scenario to run in (a new one when None), e.g. one holding a background response already.
    ``sink``: where the run's events go (a new ``CollectingSink`` when None)."""
    scenario = scenario or uuid.uuid4().hex
    server.set_faults(scenario, list(faults))
    if recording is not None:
        server.set_recording(scenario, recording)
    config_ = provider(server, scenario, wire, **(provider_kw or {}))
    sink = sink or CollectingSink()
    request = ModelRequest(
        model=model,
        messages=messages or [user(prompt)],
        max_tokens=max_tokens,
        thinking_budget=thinking_budget,
        structured=structured,
        extra=extra or {},
    )
    ctx = RunContext(
        run_id=run_id or uuid.uuid4().hex,
        adapter=get_adapter(config_),
        config=config,
        sink=sink,
        checkpoints=checkpoints or InMemoryCheckpointStore(),
        cancel=cancel or CancelToken(),
        transport=transport,
        failover=None
        if failover is None
        else Failover(get_adapter(provider(server, scenario, failover[0])), failover[1], f"fake-{failover[0]}"),
    )
    result = await run_agent(ctx, request, tools=tools, resume=resume)
    outcome = Outcome(result, sink, server.log_for(scenario))
    outcome.view.apply_all(sink.frames)
    return outcome


def assert_invariants(outcome: Outcome, reference: Outcome | None = None) -> None:
    """What every recovered run must satisfy."""
    assert outcome.status == "completed", (outcome.status, outcome.result.error)
    # the client's reconstruction equals every committed assistant message
    assert outcome.view.turns, "no assistant message was committed"
    for reconstructed, committed in outcome.view.turns:
        assert reconstructed == committed
    assert outcome.view.gaps == 0
    # no partial tool call ever reaches history
    for message in outcome.assistant:
        for block in message["content"]:
            if block["type"] == "tool_use":
                assert isinstance(block["input"], dict)
    if reference is not None:
        assert outcome.result.messages == reference.result.messages


def with_config(**changes: Any) -> EngineConfig:
    return replace(FAST, **changes)


async def _first_response_events(server: FakeProviderServer, reference: Outcome) -> list[dict[str, Any]]:
    """The SSE events (their JSON) of the reference run's first response, asked for again."""
    import json

    import httpx

    from streamrecover.engine.sse import SSEDecoder

    request = reference.sink.attempts[0].request
    headers = {k: v for k, v in request["headers"].items() if v != "[redacted]"}
    headers["x-api-key"] = "sk-test-secret"
    headers["x-fake-scenario"] = uuid.uuid4().hex
    async with httpx.AsyncClient() as client:
        response = await client.post(request["url"], json=request["json"], headers=headers)
    decoder = SSEDecoder()
    return [json.loads(event.data) for event in decoder.feed(response.content) + decoder.close()]


async def events_through_delta(server: FakeProviderServer, reference: Outcome, delta: str, nth: int) -> int:
    """How many SSE events the reference run's first response sends up to and including its
    ``nth`` delta of type ``delta`` ("text_delta", "thinking_delta"): a stall there holds the
    stream at that delta."""
    seen = 0
    for count, data in enumerate(await _first_response_events(server, reference), start=1):
        if data.get("type") == "content_block_delta" and data["delta"]["type"] == delta:
            seen += 1
            if seen == nth:
                return count
    raise AssertionError(f"the reference stream has fewer than {nth} {delta}s")


async def events_until(server: FakeProviderServer, reference: Outcome, kind: str) -> int:
    """How many SSE events the reference run's first response sends up to and including
    the ``content_block_stop`` of its first ``kind`` block ("tool" or "thinking"): a cut
    there leaves exactly that block complete and nothing after it."""
    open_kinds: dict[int, str] = {}
    for count, data in enumerate(await _first_response_events(server, reference), start=1):
        if data.get("type") == "content_block_start":
            open_kinds[data["index"]] = data["content_block"]["type"]
        if data.get("type") == "content_block_stop" and open_kinds.get(data["index"], "").startswith(kind):
            return count
    raise AssertionError(f"no {kind} block in the reference stream")


class WorkerDied(BaseException):
    """Where the test kills the worker: nothing after it runs."""


class DiesAt(CollectingSink):
    """A run's client sink whose worker dies as attempt ``index`` is recorded ``outcome``."""

    def __init__(self, index: int, outcome: str) -> None:
        super().__init__()
        self.index, self.outcome = index, outcome

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        await super().on_attempt(attempt)
        if attempt.index == self.index and attempt.outcome == self.outcome:
            raise WorkerDied(f"killed as attempt {attempt.index} was recorded {attempt.outcome}")


class DiesAtFrame(CollectingSink):
    """A run's client sink whose worker dies as the ``nth`` frame of type ``kind`` reaches it
    (mid-stream, nothing broken at the provider)."""

    def __init__(self, kind: str, nth: int) -> None:
        super().__init__()
        self.kind, self.left = kind, nth

    async def on_frame(self, frame: Any) -> None:
        await super().on_frame(frame)
        if frame["type"] == self.kind:
            self.left -= 1
            if not self.left:
                raise WorkerDied(f"killed as {self.kind} frame was sent")
