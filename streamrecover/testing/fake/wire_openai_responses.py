"""A planned answer as the OpenAI Responses API streams it, byte for byte.

Mimics the recorded Responses streams: named events whose ``data`` repeats the ``type``,
a ``sequence_number`` from 0 (``response.created``) up by one per event, no ``[DONE]``.
``response.created`` and ``response.in_progress`` (after ``response.queued`` in background
mode) carry the response object; each output item is announced (``output_item.added``),
streamed (a message's ``content_part.added``, ``output_text.delta`` fragments, ``.done``
events; a function call's ``function_call_arguments.delta`` fragments) and closed
(``output_item.done``); a reasoning item arrives whole, its ``encrypted_content`` an opaque
token the fake can read back. ``response.completed`` carries the output and the usage.

With the hosted web search tool offered, a cited answer (``[[cite]]``) searches first: a
``web_search_call`` item (``added``, its ``in_progress``, ``searching`` and ``completed`` events,
``done`` with its action), then a message whose text carries ``url_citation`` annotations, each
announced (``output_text.annotation.added``) after the delta that completes the words it covers,
and repeated in the part and item when they are done. Their ``start_index`` and ``end_index``
count characters (code points) of this response's own text: a continuation's annotations index
its text, not the answer it continues. A continuation does not search again.

With ``include: ["message.output_text.logprobs"]`` each ``output_text.delta`` (one token) carries
its entry and ``output_text.done`` all of them, without ``bytes``; the finished part has them
with ``bytes`` (deterministic values, as many ``top_logprobs`` as asked); otherwise ``[]``.

A refusal (``[[refuse]]``) is the message's one content part of type ``refusal``: added empty,
streamed in ``response.refusal.delta`` events, finished by ``response.refusal.done`` (its whole
``refusal``), the part and item done and the completed response carrying
``{"type": "refusal", "refusal": ...}``. Refusal events and parts have no logprobs.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Mapping
from typing import Any

from .model import BlockKind, Plan, PlannedBlock, signature_valid, stable_token
from .wire import ErrorSpec, ResponseContext, WireEvent, compact
from .wire_openai import Logprobs

ENCRYPTED_PREFIX = "gAAAAAB"  # what the real tokens start with; the rest is the fake's own
_SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"
NULL_CODE = "null"  # an error fault's type that sends ``"code": null``


LOGPROBS_INCLUDE = "message.output_text.logprobs"  # what a request's ``include`` names to get them
WEB_SEARCH_TOOLS = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11")


def is_web_search(tool: Any) -> bool:
    return isinstance(tool, Mapping) and tool.get("type") in WEB_SEARCH_TOOLS


def _searches(ctx: ResponseContext, block: PlannedBlock) -> bool:
    """A cited answer with the web search tool offered: its text cites the pages searched."""
    tools = ctx.options.get("tools")
    return block.cited and isinstance(tools, list) and any(is_web_search(t) for t in tools)


def response_id(ctx: ResponseContext) -> str:
    return "resp_" + stable_token("response", ctx.seed, length=48).lower()


def encrypt_reasoning(thinking: str, signature: str) -> str:
    """The reasoning item's ``encrypted_content``: opaque to the client, readable by the fake."""
    raw = json.dumps({"t": thinking, "s": signature}, ensure_ascii=False).encode()
    return ENCRYPTED_PREFIX + base64.urlsafe_b64encode(zlib.compress(raw)).decode()


_TRUSTED: set[str] = set()


def trust_reasoning(token: str) -> None:
    """Accept a recorded reasoning item's real ``encrypted_content`` when it comes back in history."""
    _TRUSTED.add(token)


def reasoning_valid(token: str) -> bool:
    """The token is one this fake issued (its thinking signed) or a trusted recorded one."""
    if token in _TRUSTED:
        return True
    found = decrypt_reasoning(token)
    return found is not None and signature_valid(*found)


def decrypt_reasoning(token: str) -> tuple[str, str] | None:
    """(thinking, signature) of a token ``encrypt_reasoning`` made, or None for anything else."""
    if not token.startswith(ENCRYPTED_PREFIX):
        return None
    try:
        data = json.loads(zlib.decompress(base64.urlsafe_b64decode(token[len(ENCRYPTED_PREFIX) :])))
        return str(data["t"]), str(data["s"])
    except (ValueError, KeyError, TypeError, zlib.error):
        return None


def _created(ctx: ResponseContext) -> int:
    return 1_758_000_000 + zlib.crc32(ctx.seed.encode()) % 10_000_000


def _item_id(prefix: str, ctx: ResponseContext, index: int) -> str:
    return f"{prefix}_" + stable_token("item", ctx.seed, str(index), length=48).lower()


def response_object(
    ctx: ResponseContext, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
) -> dict[str, Any]:
    """The response object, its keys in the recorded order."""
    options: Mapping[str, Any] = ctx.options
    reasoning = options.get("reasoning")
    return {
        "id": response_id(ctx),
        "object": "response",
        "created_at": _created(ctx),
        "status": status,
        "background": bool(options.get("background")),
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": options.get("instructions"),
        "max_output_tokens": options.get("max_output_tokens"),
        "max_tool_calls": None,
        "model": ctx.model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "prompt_cache_key": None,
        "reasoning": {"effort": reasoning.get("effort"), "summary": None}
        if isinstance(reasoning, Mapping)
        else {"effort": None, "summary": None},
        "safety_identifier": None,
        "service_tier": "default" if status in ("completed", "incomplete") else "auto",
        "store": options.get("store", True) is not False,
        "temperature": options.get("temperature", 1.0),
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [
            {**t, "strict": True} if t.get("type", "function") == "function" else dict(t)
            for t in options.get("tools") or ()
            if isinstance(t, Mapping)
        ],
        "top_logprobs": options.get("top_logprobs") or 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def _usage(ctx: ResponseContext, plan: Plan) -> dict[str, Any]:
    reasoning = sum(1 for b in plan.blocks if b.kind is BlockKind.THINKING for p in b.pieces if p)
    return {
        "input_tokens": ctx.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": plan.output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": ctx.input_tokens + plan.output_tokens,
    }


def _refusal_part(refusal: str) -> dict[str, Any]:
    """A refusal content part, as the API's ``ResponseOutputRefusal``."""
    return {"type": "refusal", "refusal": refusal}


def _message(
    item_id: str,
    text: str,
    status: str,
    annotations: list[dict[str, Any]] | None = None,
    logprobs: list[dict[str, Any]] | None = None,
    *,
    refusal: bool = False,
) -> dict[str, Any]:
    part = {"annotations": list(annotations or ()), "text": text, "logprobs": logprobs or [], "type": "output_text"}
    content = [_refusal_part(text) if refusal else part] if status == "completed" else []
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message"}


def _call(item_id: str, block: PlannedBlock, status: str) -> dict[str, Any]:
    arguments = block.content if status == "completed" else ""
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": block.call_id,
        "name": block.name,
    }


def _reasoning(item_id: str, block: PlannedBlock) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "encrypted_content": encrypt_reasoning(block.content, block.signature),
        "summary": [],
    }


class _Writer:
    """Numbers the events as they are written."""

    def __init__(self) -> None:
        self.events: list[WireEvent] = []

    def add(
        self, kind: str, fields: dict[str, Any], *, tokens: int = 0, text: str = "", seq_first: bool = False
    ) -> None:
        seq = len(self.events)
        payload = {"type": kind, "sequence_number": seq, **fields} if seq_first else {"type": kind, **fields}
        if not seq_first:
            payload["sequence_number"] = seq
        data = f"event: {kind}\ndata: {compact(payload)}\n\n".encode()
        self.events.append(WireEvent(data, tokens, text))


def stream_events(plan: Plan, ctx: ResponseContext) -> list[WireEvent]:
    """Every event of the answer, through ``response.completed`` (``response.incomplete`` when
    the plan stopped at ``max_tokens``)."""
    background = bool(ctx.options.get("background"))
    out = _Writer()
    first = "queued" if background else "in_progress"
    out.add("response.created", {"response": response_object(ctx, first, [], None)}, seq_first=not background)
    if background:
        out.add("response.queued", {"response": response_object(ctx, "queued", [], None)})
    out.add("response.in_progress", {"response": response_object(ctx, "in_progress", [], None)}, seq_first=True)
    done_items: list[dict[str, Any]] = []
    for position, block in enumerate(plan.blocks):
        index = len(done_items)  # the item's output_index: a web search is an item of its own
        if block.kind is BlockKind.TEXT and _searches(ctx, block) and block.citations:
            done_items.append(_web_search_item(out, ctx, index, position))
            index += 1
        if block.kind is BlockKind.THINKING:
            item = _reasoning(_item_id("rs", ctx, index), block)
            out.add("response.output_item.added", {"output_index": index, "item": item}, seq_first=True)
            tokens = sum(1 for p in block.pieces if p)
            out.add("response.output_item.done", {"output_index": index, "item": item}, tokens=tokens, seq_first=True)
            done_items.append(item)
        elif block.kind is BlockKind.TEXT and plan.stop_reason == "refusal":
            done_items.append(_refusal_item(out, ctx, index, block))
        elif block.kind is BlockKind.TEXT:
            done_items.append(_text_item(out, ctx, index, block))
        else:
            done_items.append(_call_item(out, ctx, index, block))
    status = "incomplete" if plan.stop_reason == "max_tokens" else "completed"
    final = response_object(ctx, status, done_items, _usage(ctx, plan))
    out.add(f"response.{status}", {"response": final}, seq_first=True)
    return out.events


def _web_search_item(out: _Writer, ctx: ResponseContext, index: int, position: int) -> dict[str, Any]:
    item_id = _item_id("ws", ctx, position)
    added = {"id": item_id, "type": "web_search_call", "status": "in_progress"}
    out.add("response.output_item.added", {"item": added, "output_index": index}, seq_first=True)
    for stage in ("in_progress", "searching", "completed"):
        out.add(f"response.web_search_call.{stage}", {"item_id": item_id, "output_index": index}, seq_first=True)
    item = _web_search_done(item_id, ctx)
    out.add("response.output_item.done", {"item": item, "output_index": index}, seq_first=True)
    return item


def _web_search_done(item_id: str, ctx: ResponseContext) -> dict[str, Any]:
    sources = [{"type": "url", "url": source["url"]} for source in _sources(ctx)]
    action = {"type": "search", "query": _query(ctx), "sources": sources}
    return {"id": item_id, "type": "web_search_call", "status": "completed", "action": action}


def _query(ctx: ResponseContext) -> str:
    return "search " + stable_token("query", ctx.model, length=8).lower()


def _sources(ctx: ResponseContext) -> list[dict[str, str]]:
    """The pages a search finds: the same for every response of the answer, its continuations too."""
    return [
        {"url": f"https://example.com/{stable_token('web', ctx.model, str(n), length=10)}", "title": f"Page {n + 1}"}
        for n in range(2)
    ]


def _annotations(ctx: ResponseContext, text: str) -> list[dict[str, Any]]:
    """The url citations of a text, in characters of ``text``: its second to fifth words from the
    first page (six words or more), its last three from the second (four words or more). A
    continuation's text may start inside a word: no span starts at its first word."""
    words = [m.span() for m in re.finditer(r"\S+", text)]
    spans = [(words[1][0], words[4][1])] if len(words) >= 6 else []
    if len(words) >= 4:
        spans.append((words[-3][0], words[-1][1]))
    sources = _sources(ctx)[-len(spans) :] if spans else []
    return [
        {"type": "url_citation", "end_index": end, "start_index": start, "title": source["title"], "url": source["url"]}
        for (start, end), source in zip(spans, sources, strict=True)
    ]


def _text_item(out: _Writer, ctx: ResponseContext, index: int, block: PlannedBlock) -> dict[str, Any]:
    item_id = _item_id("msg", ctx, index)
    text = block.content
    annotations = _annotations(ctx, text) if _searches(ctx, block) else []
    where = {"item_id": item_id}
    at = {"content_index": 0, "output_index": index}
    empty_part = {"annotations": [], "text": "", "logprobs": [], "type": "output_text"}
    out.add("response.output_item.added", {"item": _message(item_id, "", "in_progress"), "output_index": index})
    out.add("response.content_part.added", {**where, "part": empty_part, **at})
    scores = _scores(ctx)
    entries: list[dict[str, Any]] = []  # the part's, with bytes
    written, announced = 0, 0
    for piece in block.pieces:
        if piece:
            scored = [scores.entry(piece, scores.top)] if scores.top is not None else []
            entries.extend(_part_entry(e) for e in scored)
            fields = {"delta": piece, "logprobs": _without_bytes(scored), **where, **at}
            out.add("response.output_text.delta", fields, tokens=1, text=piece)
            written += len(piece)
        while announced < len(annotations) and annotations[announced]["end_index"] <= written:
            fields = {**where, **at, "annotation_index": announced, "annotation": annotations[announced]}
            out.add("response.output_text.annotation.added", fields)
            announced += 1
    out.add("response.output_text.done", {"text": text, "logprobs": _without_bytes(entries), **where, **at})
    full_part = {**empty_part, "annotations": annotations, "text": text, "logprobs": entries}
    out.add("response.content_part.done", {**where, "content_index": 0, "part": full_part, "output_index": index})
    item = _message(item_id, text, "completed", annotations, entries)
    out.add("response.output_item.done", {"item": item, "output_index": index})
    return item


def _refusal_item(out: _Writer, ctx: ResponseContext, index: int, block: PlannedBlock) -> dict[str, Any]:
    """A message whose one part is the refusal: its own events, in the output text's field order."""
    item_id = _item_id("msg", ctx, index)
    where = {"item_id": item_id}
    at = {"content_index": 0, "output_index": index}
    out.add("response.output_item.added", {"item": _message(item_id, "", "in_progress"), "output_index": index})
    out.add("response.content_part.added", {**where, "part": _refusal_part(""), **at})
    for piece in block.pieces:
        if piece:
            out.add("response.refusal.delta", {"delta": piece, **where, **at}, tokens=1, text=piece)
    out.add("response.refusal.done", {"refusal": block.content, **where, **at})
    done_part = _refusal_part(block.content)
    out.add("response.content_part.done", {**where, "content_index": 0, "part": done_part, "output_index": index})
    item = _message(item_id, block.content, "completed", refusal=True)
    out.add("response.output_item.done", {"item": item, "output_index": index})
    return item


def _scores(ctx: ResponseContext) -> Logprobs:
    """The answer's token logprobs: asked for (``top`` not None) when ``include`` names them."""
    include = ctx.options.get("include")
    top = ctx.options.get("top_logprobs")
    asked = isinstance(include, list) and LOGPROBS_INCLUDE in include
    return Logprobs(ctx.seed, (top if isinstance(top, int) else 0) if asked else None)


def _part_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry as the output text part carries it, in its field order (bytes before logprob)."""
    tops = [{"token": t["token"], "bytes": t["bytes"], "logprob": t["logprob"]} for t in entry["top_logprobs"]]
    return {"token": entry["token"], "bytes": entry["bytes"], "logprob": entry["logprob"], "top_logprobs": tops}


def _without_bytes(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries as the ``output_text.delta`` and ``.done`` events carry them: no ``bytes``."""
    return [
        {
            "token": e["token"],
            "logprob": e["logprob"],
            "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]],
        }
        for e in entries
    ]


def _call_item(out: _Writer, ctx: ResponseContext, index: int, block: PlannedBlock) -> dict[str, Any]:
    item_id = _item_id("fc", ctx, index)
    out.add(
        "response.output_item.added",
        {"output_index": index, "item": _call(item_id, block, "in_progress")},
        seq_first=True,
    )
    for n, piece in enumerate(block.pieces):
        if piece:
            obfuscation = stable_token("obfuscation", item_id, str(n), length=max(1, 16 - len(piece)))
            fields = {"item_id": item_id, "output_index": index, "delta": piece, "obfuscation": obfuscation}
            out.add("response.function_call_arguments.delta", fields, tokens=1, seq_first=True)
    arguments = {"item_id": item_id, "output_index": index, "arguments": block.content}
    out.add("response.function_call_arguments.done", arguments, seq_first=True)
    item = _call(item_id, block, "completed")
    out.add("response.output_item.done", {"output_index": index, "item": item}, seq_first=True)
    return item


def response_json(plan: Plan, ctx: ResponseContext) -> dict[str, Any]:
    """The non-streaming response body: the final response object."""
    items: list[dict[str, Any]] = []
    for position, block in enumerate(plan.blocks):
        index = len(items)  # as streamed: a web search is an item of its own
        searches = block.kind is BlockKind.TEXT and _searches(ctx, block)
        if searches and block.citations:
            items.append(_web_search_done(_item_id("ws", ctx, position), ctx))
            index += 1
        if block.kind is BlockKind.THINKING:
            items.append(_reasoning(_item_id("rs", ctx, index), block))
        elif block.kind is BlockKind.TEXT and plan.stop_reason == "refusal":
            items.append(_message(_item_id("msg", ctx, index), block.content, "completed", refusal=True))
        elif block.kind is BlockKind.TEXT:
            annotations = _annotations(ctx, block.content) if searches else []
            scores = _scores(ctx)
            entries = [_part_entry(scores.entry(p, scores.top)) for p in block.pieces if p and scores.top is not None]
            items.append(_message(_item_id("msg", ctx, index), block.content, "completed", annotations, entries))
        else:
            items.append(_call(_item_id("fc", ctx, index), block, "completed"))
    status = "incomplete" if plan.stop_reason == "max_tokens" else "completed"
    return response_object(ctx, status, items, _usage(ctx, plan))


def error_event(error_type: str | None, message: str | None, *, after: WireEvent | None = None) -> WireEvent:
    """The documented flat ``error`` event, numbered as the next event of its stream: one
    past the event it comes ``after`` (0 when it is the stream's first). Its ``code`` is
    nullable: ``type=null`` sends ``"code": null``, an error that names nothing."""
    payload = {
        "type": "error",
        "code": None if error_type == NULL_CODE else error_type or "server_error",
        "message": message or _SERVER_ERROR,
        "param": None,
        "sequence_number": _sequence_number(after) + 1 if after is not None else 0,
    }
    return WireEvent(f"event: error\ndata: {compact(payload)}\n\n".encode())


def _sequence_number(event: WireEvent) -> int:
    """The ``sequence_number`` of one of this format's events (-1 when it has none)."""
    for line in event.data.decode("utf-8", "replace").splitlines():
        if line.startswith("data:"):
            try:
                payload = json.loads(line[5:])
            except ValueError:
                return -1
            number = payload.get("sequence_number") if isinstance(payload, dict) else None
            return number if isinstance(number, int) else -1
    return -1


def not_found(response: str) -> ErrorSpec:
    return ErrorSpec(404, "invalid_request_error", f"Response with id '{response}' not found.", param="response_id")
