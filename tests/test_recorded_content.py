"""What the providers send beyond text and tool calls is kept: citations, server tool calls
and results, compaction summaries; committed, shown by the client, sent back as received.

Each behaviour is checked on a stream the tests write in the real API's shape (runs in any
clone) and on the stream recorded from the real API (skipped, saying so, when the recorded
streams are not beside the repository).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamrecover.engine.contract import ModelRequest, ProviderConfig
from streamrecover.engine.protocol import FrameReducer
from streamrecover.live.state import RunState
from streamrecover.providers.registry import get_adapter
from streamrecover.testing.client import ClientView

from .harness import assert_invariants, run
from .recorded_reading import (
    CITATION,
    COMPACTION_SUMMARY,
    SEARCH_QUERY,
    SEARCH_RESULT,
    compaction_stream,
    mcp_stream,
    read,
    web_search_stream,
)
from .streams import load_recorded

BUILT = {"web_search": web_search_stream, "mcp": mcp_stream, "compaction": compaction_stream}
RECORDED = (
    "anthropic_web_search_citations.sse",
    "anthropic_web_search_thinking.sse",
    "anthropic_code_execution_text_editor.sse",
    "anthropic_mcp_tool.sse",
    "anthropic_compaction_emoji.sse",
)


def _payloads(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for chunk in raw.decode().split("\n\n"):
        for line in chunk.splitlines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                out.append(json.loads(line[5:]))
    return out


def _expected(raw: bytes) -> dict[int, dict[str, Any]]:
    """Per block index, straight from the wire: its citations, its streamed input, its
    compaction content, and the start of every block that arrives whole."""
    out: dict[int, dict[str, Any]] = {}
    for p in _payloads(raw):
        if p.get("type") == "content_block_start":
            out[p["index"]] = {"start": p["content_block"], "citations": [], "args": "", "field": None}
        elif p.get("type") == "content_block_delta":
            delta, entry = p["delta"], out[p["index"]]
            if delta["type"] == "citations_delta":
                entry["citations"].append(delta["citation"])
            elif delta["type"] == "input_json_delta":
                entry["args"] += delta["partial_json"]
            elif delta["type"] == "compaction_delta":
                entry["field"] = (entry["field"] or "") + delta["content"]
    return out


def _check_kept(raw: bytes, content: list[dict[str, Any]]) -> None:
    expected = _expected(raw)
    assert len(content) == len(expected)
    for index, block in enumerate(content):
        wire = expected[index]
        start = wire["start"]
        if block["type"] == "text":
            assert block.get("citations", []) == wire["citations"]
        elif block["type"] in ("server_tool_use", "mcp_tool_use"):
            assert block["input"] == (json.loads(wire["args"]) if wire["args"] else {})
            assert {k: v for k, v in block.items() if k != "input"} == {k: v for k, v in start.items() if k != "input"}
        elif block["type"] == "compaction":
            assert block["content"] == wire["field"]
            assert block["content"]
        elif block["type"] not in ("thinking", "tool_use"):
            assert block == start  # server tool results and other opaque blocks: exactly as sent


def _source(kind: str, name: str) -> bytes:
    return BUILT[name]() if kind == "built" else load_recorded(name)


CASES = [("built", n) for n in BUILT] + [("recorded", n) for n in RECORDED]


@pytest.mark.parametrize(("kind", "name"), CASES)
def test_the_adapter_keeps_what_the_provider_sent(kind: str, name: str) -> None:
    raw = _source(kind, name)
    reading = read(raw, "anthropic")
    assert reading.ended
    _check_kept(raw, reading.content)


def test_the_recorded_web_search_answer_keeps_every_citation() -> None:
    reading = read(load_recorded("anthropic_web_search_citations.sse"), "anthropic")
    cited = [b for b in reading.content if b["type"] == "text" and b.get("citations")]
    assert len(cited) == 9
    assert sum(len(b["citations"]) for b in cited) == 14
    assert reading.content[0]["input"] == {"query": "tech news today September 26 2025"}


@pytest.mark.parametrize(("kind", "name"), CASES)
async def test_committed_and_shown_as_sent(fake_server: Any, kind: str, name: str) -> None:
    raw = _source(kind, name)
    outcome = await run(fake_server, f"Replay {name}", recording=raw, model="claude-sonnet-4-5")
    assert_invariants(outcome)
    (message,) = outcome.assistant
    assert message["content"] == read(raw, "anthropic").content
    _check_kept(raw, message["content"])


async def test_the_built_streams_say_what_they_test(fake_server: Any) -> None:
    """The hand-built streams carry what the recorded ones do (a guard on the builders)."""
    search = read(web_search_stream(), "anthropic").content
    assert search[0]["input"] == SEARCH_QUERY
    assert search[1] == SEARCH_RESULT
    assert search[3]["citations"] == [CITATION]
    assert read(compaction_stream(), "anthropic").content[0] == {"type": "compaction", "content": COMPACTION_SUMMARY}


def test_citations_and_opaque_blocks_go_back_to_the_provider_as_received() -> None:
    content = read(web_search_stream(), "anthropic").content + read(compaction_stream(), "anthropic").content
    adapter = get_adapter(ProviderConfig(name="anthropic", base_url="http://unused", api_key="k"))
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Lighthouse news?"}]},
        {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]
    body = adapter.build_request(ModelRequest(model="claude-sonnet-4-5", messages=messages, max_tokens=100)).json
    assert body["messages"][1]["content"] == content


# ---- the reducer: a server tool's input after its block frame, citations, snapshots ----------


def _frames() -> list[dict[str, Any]]:
    """Frames as the engine sends them for the hand-built web search answer."""
    start = {"type": "server_tool_use", "id": "srvtoolu_01HandBuilt", "name": "web_search", "input": {}}
    ident = {"id": "srvtoolu_01HandBuilt", "name": "web_search"}
    frames: list[dict[str, Any]] = [
        {"type": "block", "block": 0, "content": start},
        {"type": "tool_call_delta", "block": 0, **ident, "arguments_delta": ""},
        {"type": "tool_call_delta", "block": 0, **ident, "arguments_delta": '{"query": "light'},
        {"type": "tool_call_delta", "block": 0, **ident, "arguments_delta": 'house relit café 東京"}'},
        {"type": "block", "block": 1, "content": SEARCH_RESULT},
        {"type": "citation", "block": 2, "citation": CITATION},
        {"type": "text_delta", "block": 2, "text": "the lighthouse was relit."},
        {"type": "block", "block": 3, "content": {"type": "compaction", "content": None}},
        {"type": "block", "block": 3, "content": {"type": "compaction", "content": COMPACTION_SUMMARY}},
    ]
    return [{**f, "run_id": "r", "seq": i + 1} for i, f in enumerate(frames)]


EXPECTED = [
    {"type": "server_tool_use", "id": "srvtoolu_01HandBuilt", "name": "web_search", "input": SEARCH_QUERY},
    SEARCH_RESULT,
    {"type": "text", "text": "the lighthouse was relit.", "citations": [CITATION]},
    {"type": "compaction", "content": COMPACTION_SUMMARY},
]


def test_the_reducer_applies_a_server_tools_input_after_its_block_frame() -> None:
    reducer = FrameReducer()
    for frame in _frames():
        reducer.apply(frame)
    assert reducer.reconstructed() == EXPECTED


@pytest.mark.parametrize("cut", range(1, 9))
def test_a_snapshot_anywhere_goes_on_to_the_same_blocks(cut: int) -> None:
    """The server's state (stored as JSON between frames), a snapshot of it, then the rest."""
    frames = _frames()
    state = RunState()
    for frame in frames[:cut]:
        state.apply(frame)
    state = RunState.from_json(state.to_json())
    snapshot = {"type": "snapshot", "run_id": "r", "seq": cut, "status": "running", "messages": [], "error": None}
    view = ClientView().apply_all([{**snapshot, "partial": state.partial()}, *frames[cut:]])
    assert view.reconstructed() == EXPECTED
