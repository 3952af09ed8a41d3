"""Recorded provider streams as the fake's answer.

A fresh request of a scenario with a recording gets the recorded bytes verbatim (faults
cut them like any other stream); a continuation gets the rest of the recorded answer, since
the recording says what the model would have said. For an Anthropic recording the rest is
sent in the recording's own encoding (``Recording.continuation``): the assistant prefix of
the request is matched block by block against the recorded blocks, and the response carries
the rest of the block the cut fell in, then every later block (text with its citations,
server tool calls and their results, MCP blocks, compaction, thinking when the request
enables it), re-indexed from 0, between the recorded ``message_start`` and ending. An
OpenAI recording (one text block and tool calls) is continued from its plan in the fake's
own encoding. So the engine can be swept over real provider bytes and still be checked end
to end.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ...engine.contract import CONTINUE_INSTRUCTION
from .model import BlockKind, Plan, PlannedBlock, trust_signature
from .wire import WireEvent, compact
from .wire_openai_responses import trust_reasoning

_THINKING_KINDS = ("thinking", "redacted_thinking")


@dataclass(frozen=True, slots=True)
class _RecordedBlock:
    """One block of an Anthropic recording: its start, its delta payloads, its text."""

    start: dict[str, Any]  # the content_block_start payload
    deltas: tuple[dict[str, Any], ...]  # the content_block_delta payloads, in order
    kind: str
    text: str  # a text block's text (its text deltas joined)


@dataclass(frozen=True, slots=True)
class _Frame:
    """What the recording sends around its blocks, reused by every continuation."""

    head: tuple[tuple[str, dict[str, Any]], ...]  # message_start (event name, payload)
    ping: bool  # a ping follows the first content_block_start
    tail: tuple[tuple[str, dict[str, Any]], ...]  # message_delta, message_stop


@dataclass(frozen=True, slots=True)
class Recording:
    events: tuple[WireEvent, ...]
    plan: Plan
    blocks: tuple[_RecordedBlock, ...] = ()  # Anthropic recordings only
    frame: _Frame | None = None

    def continuation(self, body: Any, *, thinking: bool) -> list[WireEvent] | None:
        """The rest of the recorded answer after the assistant prefix ``body`` carries
        (a prefill, or an assistant message and the continue instruction), or None when
        the prefix is not a beginning of the recording (the caller answers from its plan).

        Blocks the prefix holds whole are skipped; the text block it holds in part goes on
        from there (its start repeated, its citations sent already not sent again);
        thinking blocks after the cut are sent only when ``thinking`` is on."""
        if self.frame is None:
            return None
        prefix = _anthropic_prefix(body)
        found = _match(prefix, self.blocks) if prefix else None
        if found is None:
            return None
        at, offset = found
        events = [_sse(name, payload) for name, payload in self.frame.head]
        index = 0
        for n, block in enumerate(self.blocks[at:]):
            if block.kind in _THINKING_KINDS and not thinking:
                continue
            skip = offset if n == 0 else 0
            events.append(_sse("content_block_start", {**block.start, "index": index}))
            if index == 0 and self.frame.ping:
                events.append(_sse("ping", {"type": "ping"}))
            for delta in _deltas_after(block, skip):
                events.append(_sse("content_block_delta", {**delta, "index": index}))
            events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        billed = sum(e.tokens for e in events)
        for name, payload in self.frame.tail:
            if name == "message_delta" and isinstance(payload.get("usage"), dict):
                payload = {**payload, "usage": {**payload["usage"], "output_tokens": billed}}
            events.append(_sse(name, payload))
        return events

    @classmethod
    def from_bytes(cls, raw: bytes) -> Recording:
        """Split ``raw`` (LF line ends, events ended by a blank line) and read its answer."""
        chunks = [c + b"\n\n" for c in raw.split(b"\n\n") if c.strip()]
        payloads = [_payload(c) for c in chunks]
        if any(str(p.get("type", "")).startswith("response.") for p in payloads):
            plan, billing = _responses_plan(payloads)
            events = tuple(WireEvent(c, *billing[i]) for i, c in enumerate(chunks))
            return cls(events, plan)
        if any(p.get("object") == "chat.completion.chunk" or "choices" in p for p in payloads):
            plan, billing = _openai_plan(payloads)
            events = tuple(WireEvent(c, *billing[i]) for i, c in enumerate(chunks))
            return cls(events, plan)
        plan, billing = _anthropic_plan(payloads)
        events = tuple(WireEvent(c, *billing[i]) for i, c in enumerate(chunks))
        return cls(events, plan, *_anthropic_blocks(chunks, payloads))


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


def _responses_plan(payloads: list[dict[str, Any]]) -> tuple[Plan, list[tuple[int, str]]]:
    """An OpenAI Responses recording's text parts and function calls (its reasoning items are
    trusted when they come back in history, and not part of the plan a continuation answers from)."""
    builder = _Builder()
    billing: list[tuple[int, str]] = []
    stop = "end_turn"
    items: dict[str, int] = {}  # item id -> block index
    for p in payloads:
        tokens, text = 0, ""
        kind = p.get("type")
        if kind == "response.output_item.added" and p["item"].get("type") == "function_call":
            item = p["item"]
            items[item["id"]] = len(builder.blocks)
            builder.blocks[len(builder.blocks)] = {
                "kind": BlockKind.TOOL_USE,
                "pieces": [],
                "call_id": item.get("call_id", ""),
                "name": item.get("name", ""),
            }
        elif kind == "response.output_item.done" and p["item"].get("type") == "reasoning":
            token = p["item"].get("encrypted_content")
            if isinstance(token, str):
                trust_reasoning(token)
        elif kind == "response.output_text.delta":
            index = items.setdefault(p["item_id"], len(builder.blocks))
            builder.piece(index, BlockKind.TEXT, p["delta"])
            tokens, text = int(bool(p["delta"])), p["delta"]
        elif kind == "response.function_call_arguments.delta":
            builder.piece(items[p["item_id"]], BlockKind.TOOL_USE, p["delta"])
            tokens = int(bool(p["delta"]))
        elif kind == "response.completed":
            output = p["response"].get("output") or []
            stop = "tool_use" if any(i.get("type") == "function_call" for i in output) else "end_turn"
        billing.append((tokens, text))
    return builder.plan(stop), billing


# ---- continuing an Anthropic recording -----------------------------------------------------


def _event_name(chunk: bytes) -> str:
    for line in chunk.decode("utf-8").splitlines():
        if line.startswith("event:"):
            return line[6:].strip()
    return ""


def _anthropic_blocks(chunks: list[bytes], payloads: list[dict[str, Any]]) -> tuple[tuple[_RecordedBlock, ...], _Frame]:
    starts: dict[int, dict[str, Any]] = {}
    deltas: dict[int, list[dict[str, Any]]] = {}
    head: list[tuple[str, dict[str, Any]]] = []
    tail: list[tuple[str, dict[str, Any]]] = []
    ping = False
    for chunk, p in zip(chunks, payloads, strict=True):
        kind = p.get("type")
        if kind == "message_start":
            head.append((_event_name(chunk) or "message_start", p))
        elif kind == "content_block_start":
            starts[p["index"]] = p
        elif kind == "content_block_delta":
            deltas.setdefault(p["index"], []).append(p)
        elif kind == "ping" and len(starts) == 1:
            ping = True
        elif kind in ("message_delta", "message_stop"):
            tail.append((_event_name(chunk) or str(kind), p))
    blocks = []
    for index in sorted(starts):
        start, own = starts[index], tuple(deltas.get(index, ()))
        kind = str(start["content_block"].get("type", ""))
        text = _units("".join(d["delta"].get("text", "") for d in own if d["delta"].get("type") == "text_delta"))
        blocks.append(_RecordedBlock(start, own, kind, text))
    return tuple(blocks), _Frame(tuple(head), ping, tuple(tail))


def _content(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _is_continue_instruction(message: Any) -> bool:
    if not isinstance(message, dict) or message.get("role") != "user":
        return False
    blocks = _content(message)
    return (
        bool(blocks)
        and all(b.get("type") == "text" for b in blocks)
        and ("".join(b.get("text", "") for b in blocks).strip() == CONTINUE_INSTRUCTION)
    )


def _anthropic_prefix(body: Any) -> list[dict[str, Any]]:
    """The assistant blocks a continuation request carries: a trailing assistant message
    (prefill) and/or (assistant message, continue instruction) pairs, oldest first."""
    messages = list(body.get("messages") or []) if isinstance(body, dict) else []
    blocks: list[dict[str, Any]] = []
    if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        blocks = _content(messages.pop())
    while len(messages) >= 2 and _is_continue_instruction(messages[-1]) and messages[-2].get("role") == "assistant":
        blocks = _content(messages[-2]) + blocks
        del messages[-2:]
    return blocks


def _match(prefix: list[dict[str, Any]], blocks: tuple[_RecordedBlock, ...]) -> tuple[int, int] | None:
    """Where the prefix ends in the recording: (block, characters of its text already sent).

    Text blocks with no text, or only whitespace, that the prefix does not start with are
    skipped (a recovery keeps no empty block, and a blank one is not sent back); a prefix text block
    may span several recorded text blocks (a recovery that joined them) and the last one may
    end inside a recorded block (the cut, or a prefill that lost its trailing whitespace)."""
    at = 0
    for n, sent in enumerate(prefix):
        last = n == len(prefix) - 1
        kind = sent.get("type")
        if kind == "text":
            text = _units(str(sent.get("text", "")))
            while True:
                while at < len(blocks) and _skippable(blocks[at], text):
                    at += 1
                if at >= len(blocks) or blocks[at].kind != "text":
                    return None
                recorded = blocks[at].text
                if text == recorded:
                    at += 1
                    break
                if text.startswith(recorded):
                    text, at = text[len(recorded) :], at + 1
                    continue
                if last and recorded.startswith(text):
                    return at, len(text)
                return None
        else:
            while at < len(blocks) and _skippable(blocks[at], ""):
                at += 1
            if at >= len(blocks) or blocks[at].kind != kind:
                return None
            ident = blocks[at].start["content_block"].get("id")
            if ident is not None and sent.get("id") not in (None, ident):
                return None
            at += 1
    return at, 0


def _skippable(block: _RecordedBlock, text: str) -> bool:
    return block.kind == "text" and not block.text.strip() and not (block.text and text.startswith(block.text))


def _deltas_after(block: _RecordedBlock, offset: int) -> list[dict[str, Any]]:
    """The block's deltas after its first ``offset`` characters of text (0: all of them)."""
    if not offset:
        return list(block.deltas)
    out: list[dict[str, Any]] = []
    seen = 0
    for payload in block.deltas:
        delta = payload["delta"]
        if delta.get("type") != "text_delta":
            if seen >= offset:
                out.append(payload)
            continue
        text = _units(delta.get("text", ""))
        if seen + len(text) > offset:
            rest = text[max(0, offset - seen) :]
            out.append({**payload, "delta": {**delta, "text": _characters(rest)}} if rest != text else payload)
        seen += len(text)
    return out


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def _units(text: str) -> str:
    """``text`` with each character beyond the BMP as its UTF-16 pair (two surrogates): how a
    recording that split pairs across deltas holds it. A prefix holds such a character whole
    (the engine joins the halves), so texts are matched, and offsets counted, in these units."""
    return _ASTRAL.sub(_as_pair, text)


def _as_pair(match: re.Match[str]) -> str:
    code = ord(match.group()) - 0x10000
    return chr(0xD800 + (code >> 10)) + chr(0xDC00 + (code & 0x3FF))


def _characters(units: str) -> str:
    """``_units`` undone: each pair of surrogates joined into its character (a lone one stays)."""
    return units.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _billing(payload: dict[str, Any]) -> tuple[int, str]:
    """What an event bills, as the whole recording's events do (see ``_anthropic_plan``)."""
    if payload.get("type") != "content_block_delta":
        return 0, ""
    delta = payload["delta"]
    dtype = delta.get("type")
    if dtype == "text_delta":
        return int(bool(delta["text"])), delta["text"]
    if dtype == "input_json_delta":
        return int(bool(delta["partial_json"])), ""
    if dtype == "thinking_delta":
        return int(bool(delta["thinking"])), ""
    return 0, ""


def _sse(name: str, payload: dict[str, Any]) -> WireEvent:
    """One event as the recording frames it: ``event:`` line, compact JSON, blank line."""
    ordered = {"type": payload["type"], **payload} if "type" in payload else payload
    try:
        data = f"event: {name}\ndata: {compact(ordered)}\n\n".encode()
    except UnicodeEncodeError:  # a lone surrogate the recording sent escaped: only its escape has bytes
        data = f"event: {name}\ndata: {json.dumps(ordered, separators=(',', ':'))}\n\n".encode()
    return WireEvent(data, *_billing(payload))
