"""The uninterrupted answers: each run's request sent to a fault-free fake provider in this process.

The fake's answer is a pure function of the conversation, so a run that survived every
fault must have committed exactly these messages.
"""

from __future__ import annotations

import asyncio
from typing import Any

from streamrecover.engine.agent import run_agent
from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import InMemoryCheckpointStore
from streamrecover.engine.config import EngineConfig
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest, ProviderConfig
from streamrecover.engine.sink import CollectingSink
from streamrecover.providers.registry import get_adapter
from streamrecover.testing import FakeProviderServer, demo_registry

from .plan import RunSpec


async def _reference(server: FakeProviderServer, spec: RunSpec) -> list[dict[str, Any]]:
    wire = "openai" if spec.provider == "fake-openai" else "anthropic"
    base = f"{server.base_url}/v1" if wire == "openai" else server.base_url
    config = ProviderConfig(name=wire, base_url=base, api_key="reference")
    tools = demo_registry() if spec.tools else None
    request = ModelRequest(
        model=spec.model,
        messages=[{"role": "user", "content": [{"type": "text", "text": spec.prompt}]}],
        max_tokens=spec.max_tokens,
        thinking_budget=spec.thinking_budget,
        tools=tuple(tools.specs()) if tools is not None else (),
    )
    ctx = RunContext(
        run_id=spec.tag,
        adapter=get_adapter(config),
        config=EngineConfig(backoff_scale=0.0),
        sink=CollectingSink(),
        checkpoints=InMemoryCheckpointStore(),
        cancel=CancelToken(),
    )
    result = await run_agent(ctx, request, tools=tools)
    if result.status != "completed":
        raise RuntimeError(f"the reference for {spec.tag} did not complete: {result.status} {result.error}")
    return list(result.messages)


def references(specs: list[RunSpec]) -> dict[str, list[dict[str, Any]]]:
    """Each run's uninterrupted thread (prompt, answers, tool results), by tag."""
    server = FakeProviderServer()
    server.start()
    try:

        async def all_of() -> list[list[dict[str, Any]]]:
            return list(await asyncio.gather(*(_reference(server, spec) for spec in specs)))

        return {spec.tag: messages for spec, messages in zip(specs, asyncio.run(all_of()), strict=True)}
    finally:
        server.stop()
