"""Running the engine against scripted responses, byte for byte, without a server.

For the streams the fake provider does not write (a proxy's ``[DONE]`` after a failed
upstream, Azure's buffered chunks, a provider's exact error body): each request the engine
makes takes the next script entry, a ``(status, headers, body)`` response or a function of the
request's JSON body that returns one (a rule the real API applies, checked on what was sent).
Token-count requests (Anthropic's ``/count_tokens``) are answered 404, as by a server without
that endpoint, and are not part of the script.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamrecover.engine.agent import ToolRegistry, run_agent
from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import InMemoryCheckpointStore
from streamrecover.engine.config import EngineConfig
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest, ProviderConfig
from streamrecover.engine.sink import CollectingSink
from streamrecover.engine.transport import OpenedStream
from streamrecover.providers.registry import get_adapter
from streamrecover.testing.client import ClientView

from .harness import FAST, user

Response = tuple[int, dict[str, str], bytes]
Entry = Response | Callable[[dict[str, Any]], Response]


def sse(events: list[dict[str, Any] | None], *, named: bool = False) -> bytes:
    """Events as SSE: ``None`` is ``data: [DONE]``; ``named`` adds ``event: <type>`` lines (Anthropic)."""
    out = []
    for event in events:
        if event is None:
            out.append("data: [DONE]\n\n")
            continue
        name = f"event: {event['type']}\n" if named else ""
        out.append(f"{name}data: {json.dumps(event, ensure_ascii=False)}\n\n")
    return "".join(out).encode()


def anthropic_blocks(
    *blocks: tuple[dict[str, Any], list[dict[str, Any]], bool], ended: bool = False, model: str = "claude-3-7-sonnet"
) -> bytes:
    """An Anthropic stream of (content_block_start, deltas, closed) blocks; ``ended``: with its end."""
    start = {"id": "msg_scripted", "type": "message", "role": "assistant", "model": model}
    events = [{"type": "message_start", "message": {**start, "content": [], "stop_reason": None, "usage": {}}}]
    for index, (block, deltas, closed) in enumerate(blocks):
        events.append({"type": "content_block_start", "index": index, "content_block": block})
        events.extend({"type": "content_block_delta", "index": index, "delta": d} for d in deltas)
        if closed:
            events.append({"type": "content_block_stop", "index": index})
    if ended:
        events.append({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}})
        events.append({"type": "message_stop"})
    return sse(events, named=True)


def chat_chunk(content: str | None = None, finish: str | None = None) -> dict[str, Any]:
    """One Chat Completions chunk: a text delta, or the ``finish_reason`` chunk (an empty delta)."""
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "model": "gpt-4o", "choices": [choice]}


def chat_usage(prompt: int, completion: int) -> dict[str, Any]:
    """The closing usage chunk (``include_usage``): no choices."""
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "model": "gpt-4o",
        "choices": [],
        "usage": usage,
    }


class ScriptedTransport:
    """The engine's transport, answering from a script; ``requests`` holds each request's JSON."""

    def __init__(self, script: list[Entry]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []

    async def __aenter__(self) -> ScriptedTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def open(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        json_body: dict[str, Any],
        idle_timeout_s: float,
        connect_timeout_s: float,
    ) -> OpenedStream:
        if url.endswith("/count_tokens"):
            return _opened((404, {"content-type": "application/json"}, b'{"error": "not found"}'))
        self.requests.append(json_body)
        entry = self.script.pop(0)
        return _opened(entry(json_body) if callable(entry) else entry)


def _opened(response: Response) -> OpenedStream:
    status, headers, body = response

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    async def close() -> None:
        return None

    return OpenedStream(status, {"content-type": "text/event-stream", **headers}, chunks(), close)


@dataclass
class Scripted:
    """A run's result, what the client rebuilt from its frames, and the requests it made."""

    result: Any
    sink: CollectingSink
    requests: list[dict[str, Any]]
    view: ClientView = field(default_factory=ClientView)

    @property
    def answer(self) -> list[dict[str, Any]]:
        """The committed assistant message's content."""
        (message,) = [m for m in self.result.messages if m["role"] == "assistant"]
        return list(message["content"])

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e.fields for e in self.sink.events if e.name == name]


async def run_scripted(
    wire: str,
    script: list[Entry],
    *,
    model: str = "gpt-4o",
    max_tokens: int = 4096,
    config: EngineConfig = FAST,
    provider_kw: dict[str, Any] | None = None,
    tools: ToolRegistry | None = None,
) -> Scripted:
    """One run of ``wire``'s adapter against ``script``."""
    transport = ScriptedTransport(script)
    provider = ProviderConfig(name=wire, base_url="https://scripted.invalid/v1", api_key="k", **(provider_kw or {}))
    sink = CollectingSink()
    ctx = RunContext(
        run_id=uuid.uuid4().hex,
        adapter=get_adapter(provider),
        config=config,
        sink=sink,
        checkpoints=InMemoryCheckpointStore(),
        cancel=CancelToken(),
        transport=transport,  # type: ignore[arg-type]  # the transport's interface, not its class
    )
    request = ModelRequest(model=model, messages=[user("Tell me something")], max_tokens=max_tokens)
    result = await run_agent(ctx, request, tools=tools)
    out = Scripted(result, sink, transport.requests)
    out.view.apply_all(sink.frames)
    return out
