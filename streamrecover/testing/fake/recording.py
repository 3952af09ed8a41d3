"""Recorded provider streams as the fake's answer.

A fresh request of a scenario with a recording gets the recorded bytes verbatim (faults
cut them like any other stream); a continuation gets the rest of the recorded answer in
the fake's own encoding, since the recording says what the model would have said. So the
engine can be swept over real provider bytes and still be checked end to end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .model import BlockKind, Plan, PlannedBlock, trust_signature
from .wire import WireEvent


@dataclass(frozen=True, slots=True)
class Recording:
    events: tuple[WireEvent, ...]
    plan: Plan

    @classmethod
    def from_bytes(cls, raw: bytes) -> Recording:
        """Split ``raw`` (LF line ends, events ended by a blank line) and read its answer."""
        chunks = [c + b"\n\n" for c in raw.split(b"\n\n") if c.strip()]
        payloads = [_payload(c) for c in chunks]
        if any(p.get("object") == "chat.completion.chunk" or "choices" in p for p in payloads):
            plan, billing = _openai_plan(payloads)
        else:
            plan, billing = _anthropic_plan(payloads)
        events = tuple(WireEvent(c, *billing[i]) for i, c in enumerate(chunks))
        return cls(events, plan)


def _payload(chunk: bytes) -> dict[str, Any]:
    for line in chunk.decode("utf-8").splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return {}
            value = json.loads(data)
            return value if isinstance(value, dict) else {}
    return {}


class _Builder:
    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}

    def piece(self, index: int, kind: BlockKind, text: str, **meta: Any) -> None:
        block = self.blocks.setdefault(index, {"kind": kind, "pieces": [], **meta})
        block["pieces"].append(text)

    def plan(self, stop: str) -> Plan:
        out = []
        for index in sorted(self.blocks):
            b = self.blocks[index]
            out.append(
                PlannedBlock(
                    b["kind"],
                    tuple(b["pieces"]),
                    signature=b.get("signature", ""),
                    call_id=b.get("call_id", ""),
                    name=b.get("name", ""),
                )
            )
            if b["kind"] is BlockKind.THINKING:
                trust_signature("".join(b["pieces"]), b.get("signature", ""))
        return Plan(tuple(out), stop)


def _anthropic_plan(payloads: list[dict[str, Any]]) -> tuple[Plan, list[tuple[int, str]]]:
    builder = _Builder()
    billing: list[tuple[int, str]] = []
    stop = "end_turn"
    for p in payloads:
        tokens, text = 0, ""
        kind = p.get("type")
        if kind == "content_block_start":
            block = p["content_block"]
            if block.get("type") == "tool_use":
                builder.blocks[p["index"]] = {
                    "kind": BlockKind.TOOL_USE,
                    "pieces": [],
                    "call_id": block.get("id", ""),
                    "name": block.get("name", ""),
                }
            elif block.get("type") == "thinking":
                builder.blocks[p["index"]] = {"kind": BlockKind.THINKING, "pieces": []}
            elif block.get("type") == "text":
                builder.blocks[p["index"]] = {"kind": BlockKind.TEXT, "pieces": []}
        elif kind == "content_block_delta":
            delta, index = p["delta"], p["index"]
            dtype = delta.get("type")
            if dtype == "text_delta":
                builder.piece(index, BlockKind.TEXT, delta["text"])
                tokens, text = int(bool(delta["text"])), delta["text"]
            elif dtype == "input_json_delta":
                builder.piece(index, BlockKind.TOOL_USE, delta["partial_json"])
                tokens = int(bool(delta["partial_json"]))
            elif dtype == "thinking_delta":
                builder.piece(index, BlockKind.THINKING, delta["thinking"])
                tokens = int(bool(delta["thinking"]))
            elif dtype == "signature_delta" and index in builder.blocks:
                builder.blocks[index]["signature"] = delta["signature"]
        elif kind == "message_delta":
            stop = (p.get("delta") or {}).get("stop_reason") or stop
        billing.append((tokens, text))
    return builder.plan(stop), billing


def _openai_plan(payloads: list[dict[str, Any]]) -> tuple[Plan, list[tuple[int, str]]]:
    builder = _Builder()
    billing: list[tuple[int, str]] = []
    stop = "end_turn"
    for p in payloads:
        tokens, text = 0, ""
        for choice in p.get("choices") or []:
            delta = choice.get("delta") or {}
            for key in ("content", "refusal"):
                if delta.get(key):
                    builder.piece(0, BlockKind.TEXT, delta[key])
                    tokens, text = 1, delta[key]
                    if key == "refusal":
                        stop = "refusal"
            for call in delta.get("tool_calls") or []:
                index = 1 + call.get("index", 0)
                fn = call.get("function") or {}
                block = builder.blocks.setdefault(
                    index, {"kind": BlockKind.TOOL_USE, "pieces": [], "call_id": "", "name": ""}
                )
                block["call_id"] = call.get("id") or block["call_id"]
                block["name"] = fn.get("name") or block["name"]
                if fn.get("arguments"):
                    block["pieces"].append(fn["arguments"])
                    tokens = 1
            if choice.get("finish_reason") == "tool_calls":
                stop = "tool_use"
        billing.append((tokens, text))
    return builder.plan(stop), billing
