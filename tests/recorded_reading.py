"""Reading a stream the way the engine does, without a network: the uninterrupted reading.

``read`` feeds a whole (or cut) response body through the adapter's parser into an
accumulator and returns what it holds; the tests compare committed messages with it. The
``*_stream`` builders write small Anthropic streams of the kinds the fake's own model does
not produce (web search with citations, MCP, compaction) in the real API's wire shape, so
those behaviours are tested in a clone with no recorded streams beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from streamrecover.engine.blocks import Accumulator
from streamrecover.engine.contract import ProviderConfig
from streamrecover.engine.sse import SSEDecoder
from streamrecover.providers.registry import get_adapter


@dataclass
class Reading:
    content: list[dict[str, Any]]
    stop_reason: str | None
    ended: bool


def read(raw: bytes, wire: str) -> Reading:
    """What the engine's adapter and accumulator make of ``raw`` (the stream still open at its end)."""
    adapter = get_adapter(ProviderConfig(name=wire, base_url="http://unused", api_key="k"))
    parser = adapter.new_parser()
    acc = Accumulator()
    decoder = SSEDecoder()
    for event in decoder.feed(raw):
        for normalized in parser.feed(event):
            acc.apply(normalized)
    return Reading([b.to_content() for b in acc.blocks], acc.stop_reason, acc.ended)


def _event(payload: dict[str, Any]) -> str:
    return f"event: {payload['type']}\ndata: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def anthropic_stream(blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]], stop: str = "end_turn") -> bytes:
    """An Anthropic Messages stream: each block is (its content_block_start, its deltas)."""
    out = [
        _event(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_01HandBuiltStream0000000",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-5",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 1},
                },
            }
        )
    ]
    for index, (start, deltas) in enumerate(blocks):
        out.append(_event({"type": "content_block_start", "index": index, "content_block": start}))
        out.extend(_event({"type": "content_block_delta", "index": index, "delta": d}) for d in deltas)
        out.append(_event({"type": "content_block_stop", "index": index}))
    out.append(
        _event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 40},
            }
        )
    )
    out.append(_event({"type": "message_stop"}))
    return "".join(out).encode()


def _text(*pieces: str) -> list[dict[str, Any]]:
    return [{"type": "text_delta", "text": p} for p in pieces]


def _args(*pieces: str) -> list[dict[str, Any]]:
    return [{"type": "input_json_delta", "partial_json": p} for p in ("", *pieces)]


CITATION = {
    "type": "web_search_result_location",
    "cited_text": "The lighthouse was lit again on 1 May — after forty years dark.",
    "url": "https://example.org/news/lighthouse",
    "title": "Lighthouse relit - Example News",
    "encrypted_index": "Eo8BCioICBgCIiRmYWtlLWVuY3J5cHRlZC1pbmRleC0wMDAxEgz+/w==",
}
SEARCH_RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_01HandBuilt",
    "content": [
        {
            "type": "web_search_result",
            "title": "Lighthouse relit - Example News",
            "url": "https://example.org/news/lighthouse",
            "encrypted_content": "ErkeCioICBgCIiRmYWtlLWVuY3J5cHRlZC1jb250ZW50LTAwMDESDA+/+Q==",
            "page_age": "May 2, 2025",
        }
    ],
}
SEARCH_QUERY = {"query": "lighthouse relit café 東京"}


def web_search_stream() -> bytes:
    """A web search answer: the server tool call (input streamed), its result (whole), then
    text blocks, one of them cited (its start carries ``citations: []``, then citations_delta)."""
    return anthropic_stream(
        [
            (
                {"type": "server_tool_use", "id": "srvtoolu_01HandBuilt", "name": "web_search", "input": {}},
                _args('{"query": "light', "house relit caf", 'é 東京"}'),
            ),
            (SEARCH_RESULT, []),
            ({"type": "text", "text": ""}, _text("Here is what ", "I found: ")),
            (
                {"citations": [], "type": "text", "text": ""},
                [{"type": "citations_delta", "citation": CITATION}, *_text("the lighthouse ", "was relit — 🚀.")],
            ),
            ({"type": "text", "text": ""}, _text(" That is all.")),
        ]
    )


def mcp_stream() -> bytes:
    return anthropic_stream(
        [
            (
                {
                    "type": "mcp_tool_use",
                    "id": "mcptoolu_01HandBuilt",
                    "name": "echo",
                    "input": {},
                    "server_name": "echo",
                },
                _args('{"mess', 'age": "hel', 'lo wörld"}'),
            ),
            (
                {
                    "type": "mcp_tool_result",
                    "tool_use_id": "mcptoolu_01HandBuilt",
                    "is_error": False,
                    "content": [{"type": "text", "text": "Tool echo: hello wörld"}],
                },
                [],
            ),
            ({"type": "text", "text": ""}, _text("The echo tool ", "answered: hello wörld.")),
        ]
    )


COMPACTION_SUMMARY = "The user pasted a long text and asked for a greeting.\n\nNext step: say hello 👋."


def compaction_stream() -> bytes:
    return anthropic_stream(
        [
            ({"type": "compaction", "content": None}, [{"type": "compaction_delta", "content": COMPACTION_SUMMARY}]),
            ({"type": "text", "text": ""}, _text("Hello!", " ", "👋")),
        ]
    )
