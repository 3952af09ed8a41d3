"""The run context numbers frames, and a frame's own ``kind`` field never clashes with its type."""

from __future__ import annotations

from streamrecover.engine.config import EngineConfig
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ProviderConfig
from streamrecover.engine.protocol import FrameKind
from streamrecover.engine.sink import CollectingSink
from streamrecover.providers.anthropic import AnthropicAdapter


async def test_frames_are_numbered_and_may_carry_a_kind_field():
    sink = CollectingSink()
    adapter = AnthropicAdapter(ProviderConfig(name="anthropic", base_url="https://api.anthropic.com"))
    ctx = RunContext("r1", adapter, EngineConfig(), sink, seq=4)
    await ctx.frame(FrameKind.BLOCK_CANCEL, block=1, kind="thinking", reason="partial")
    await ctx.frame(FrameKind.STREAM_RESET, reason="resume")
    assert sink.frames == [
        {"type": "block_cancel", "run_id": "r1", "seq": 5, "block": 1, "kind": "thinking", "reason": "partial"},
        {"type": "stream_reset", "run_id": "r1", "seq": 6, "reason": "resume"},
    ]
    assert ctx.provider == "anthropic"
