"""The downstream stream in the OpenAI Responses wire format, written from the splicer's ops.

Named events whose ``data`` repeats the ``type``, a ``sequence_number`` from 0 up by one per
event: one ``response.created`` and ``response.in_progress``, then an output item per released
block with contiguous ``output_index`` (a message's ``content_part`` and ``output_text`` events
and its annotations, a function call's arguments whole in one delta, a reasoning item with its
summary text, a web search call with its progress events), and one
``response.completed`` (``response.incomplete`` for a turn cut by its token budget) carrying the
output and the usage summed over the turn's attempts; ``response.failed`` where nothing more can
be spliced truthfully. Token logprobs (when the client's ``include`` asked and the upstream sent
them) go in the API's two shapes: without ``bytes`` on the ``output_text.delta`` and ``.done``
events, with them in the output text part. A refusal (a text block the upstream marked as one)
is the message's ``refusal`` part, streamed in ``response.refusal.delta`` events and finished by
``response.refusal.done``, as the API sends one: no logprobs, no annotations.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ..engine.events import TokenLogprob, TopLogprob
from ..providers.openai_responses import WEB_SEARCH_CALL
from .annotations import Annotation, WholeTextCitation, as_annotation, covering, whole_text_annotation
from .splice import Citation, CloseBlock, Op, OpenText, TextPiece, WholeBlock
from .wire import AttemptMetadata, TurnUsage, _event, _json

# the request fields a response object repeats (the rest is the proxy's)
_ECHOED = ("instructions", "tool_choice", "tools", "temperature", "top_p", "parallel_tool_calls", "text", "metadata")
# canonical stop reason -> incomplete_details.reason
_INCOMPLETE = {"max_tokens": "max_output_tokens", "content_filter": "content_filter"}


class DeltaTopLogprob(TypedDict):
    """An alternative token of an ``output_text.delta``/``.done`` event's entry (no ``bytes`` there)."""

    token: str
    logprob: float


class DeltaLogprob(TypedDict):
    """An entry of an ``output_text.delta``/``.done`` event's ``logprobs``, in the API's field order."""

    token: str
    logprob: float
    top_logprobs: list[DeltaTopLogprob]


class PartTopLogprob(TypedDict):
    """An alternative token of an output text part's entry, ``bytes`` required."""

    token: str
    bytes: list[int]
    logprob: float


class PartLogprob(TypedDict):
    """An entry of an ``output_text`` content part's ``logprobs`` (``response.completed``,
    ``output_item.done``, ``content_part.done``), in the API's field order."""

    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[PartTopLogprob]


def delta_logprobs(entries: Iterable[TokenLogprob]) -> list[DeltaLogprob]:
    """The entries as the delta and done events carry them: without ``bytes``, theirs or their alternatives'."""
    return [
        DeltaLogprob(
            token=e["token"],
            logprob=e["logprob"],
            top_logprobs=[DeltaTopLogprob(token=t["token"], logprob=t["logprob"]) for t in e["top_logprobs"]],
        )
        for e in entries
    ]


def part_logprobs(entries: Iterable[TokenLogprob]) -> list[PartLogprob]:
    """The part's entries. A Responses upstream's deltas carry no ``bytes``: a token's are then its
    text's UTF-8 (what a Chat upstream sends for every token that is whole characters)."""
    return [
        PartLogprob(
            token=e["token"],
            bytes=_bytes(e),
            logprob=e["logprob"],
            top_logprobs=[
                PartTopLogprob(token=t["token"], bytes=_bytes(t), logprob=t["logprob"]) for t in e["top_logprobs"]
            ],
        )
        for e in entries
    ]


def _bytes(entry: TokenLogprob | TopLogprob) -> list[int]:
    raw = entry["bytes"]
    return list(entry["token"].encode()) if raw is None else raw


@dataclass(slots=True)
class _StreamingMessage:
    """The message item being streamed: its id and its text's deltas, joined once at its end
    (``+=`` on a str something else refers to copies all of it on every delta); ``refusal``: its
    one part is the model's refusal, not output text."""

    id: str
    refusal: bool = False
    parts: list[str] = field(default_factory=list)
    annotations: list[Annotation] = field(default_factory=list)  # sent, in order
    whole: list[WholeTextCitation] = field(default_factory=list)  # to cover all its text, sent at its end
    logprobs: list[TokenLogprob] = field(default_factory=list)  # its tokens' entries, sent, in order

    def text(self) -> str:
        return "".join(self.parts)

    def part(self, text: str) -> dict[str, Any]:
        """Its one content part holding ``text``: a refusal's, or output text with the annotations
        and entries sent."""
        if self.refusal:
            return {"type": "refusal", "refusal": text}
        return {
            "type": "output_text",
            "text": text,
            "annotations": list(self.annotations),
            "logprobs": part_logprobs(self.logprobs),
        }

    def item(self, status: str, text: str) -> dict[str, Any]:
        """The message item with its one part holding ``text``."""
        return {"id": self.id, "type": "message", "status": status, "role": "assistant", "content": [self.part(text)]}

    def delta(self, text: str, logprobs: Sequence[TokenLogprob]) -> tuple[str, dict[str, Any]]:
        """The delta event's type and its own fields for ``text``: a refusal's has no logprobs."""
        if self.refusal:
            return "response.refusal.delta", {"delta": text}
        self.logprobs.extend(logprobs)
        return "response.output_text.delta", {"delta": text, "logprobs": delta_logprobs(logprobs)}

    def done(self, text: str) -> tuple[str, dict[str, Any]]:
        """The done event's type and its own fields for the whole ``text``."""
        if self.refusal:
            return "response.refusal.done", {"refusal": text}
        return "response.output_text.done", {"text": text, "logprobs": delta_logprobs(self.logprobs)}


class ResponsesWriter:
    """Responses: lifecycle events of one response id, output items in order, one terminal event."""

    def __init__(self, response_id: str, model: str, request: Mapping[str, Any]) -> None:
        self.response_id = response_id
        self.model = model
        self.request = request
        self.created_at = int(time.time())
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # completed items, by output_index
        self.message: _StreamingMessage | None = None  # the message item streaming now
        self.refused = False  # a refusal went out as one (a ``refusal`` part)

    # ---- the response object and events ------------------------------------------------

    def _response(self, status: str, usage: TurnUsage | None = None, **more: Any) -> dict[str, Any]:
        response: dict[str, Any] = {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": self.request.get("max_output_tokens"),
            "model": self.model,
            "output": [dict(item) for item in self.output] if status != "in_progress" else [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": self.request.get("reasoning") or {"effort": None, "summary": None},
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": None,
            "metadata": {},
        }
        response.update({k: self.request[k] for k in _ECHOED if self.request.get(k) is not None})
        if usage is not None:
            response["usage"] = {
                "input_tokens": usage.input_tokens,
                "input_tokens_details": {"cached_tokens": usage.cache_read_input_tokens},
                "output_tokens": usage.output_tokens,
                "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
                "total_tokens": usage.input_tokens + usage.output_tokens,
            }
        response.update(more)
        return response

    def _emit(self, kind: str, fields: dict[str, Any]) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return _event(kind, payload)

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self.response_id.removeprefix('resp_')}{len(self.output):04d}"

    # ---- Writer ---------------------------------------------------------------------------

    def start(self, usage: TurnUsage) -> bytes:
        return self._emit("response.created", {"response": self._response("in_progress")}) + self._emit(
            "response.in_progress", {"response": self._response("in_progress")}
        )

    def ops(self, ops: Iterable[Op], usage: TurnUsage) -> bytes:
        out: list[bytes] = []
        for op in ops:
            if isinstance(op, OpenText):
                out.append(self._open_message(op.refusal))
            elif isinstance(op, TextPiece) and self.message is not None:
                self.message.parts.append(op.text)
                kind, own = self.message.delta(op.text, op.logprobs)
                fields = {"item_id": self.message.id, "output_index": len(self.output), "content_index": 0}
                out.append(self._emit(kind, {**fields, **own}))
            elif isinstance(op, Citation) and self.message is not None and not self.message.refusal:
                out.append(self._citation(op.citation))
            elif isinstance(op, CloseBlock):
                out.append(self._close_message())
            elif isinstance(op, WholeBlock):
                out.append(self._whole(op.content))
        return b"".join(out)

    def _open_message(self, refusal: bool) -> bytes:
        item_id = self._item_id("msg")
        self.message = _StreamingMessage(item_id, refusal)
        self.refused = self.refused or refusal
        at = {"output_index": len(self.output)}
        item = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        part = self.message.part("")
        return self._emit("response.output_item.added", {**at, "item": item}) + self._emit(
            "response.content_part.added", {"item_id": item_id, **at, "content_index": 0, "part": part}
        )

    def _citation(self, citation: Mapping[str, Any]) -> bytes:
        """A citation of the open message: an annotation now when it says which characters it
        covers; one covering the whole text at its end when it cites the whole span (Anthropic's
        web search results); nothing when it names no web page (a document's)."""
        assert self.message is not None
        annotation = as_annotation(citation)
        if annotation is not None:
            return self._annotation(annotation)
        whole = whole_text_annotation(citation)
        if whole is not None:
            self.message.whole.append(whole)
        return b""

    def _annotation(self, annotation: Annotation) -> bytes:
        assert self.message is not None
        fields = {"item_id": self.message.id, "output_index": len(self.output), "content_index": 0}
        index = len(self.message.annotations)
        self.message.annotations.append(annotation)
        return self._emit(
            "response.output_text.annotation.added", {**fields, "annotation_index": index, "annotation": annotation}
        )

    def _close_message(self) -> bytes:
        if self.message is None:
            return b""
        message, text = self.message, self.message.text()
        out = b""
        for whole in message.whole:
            out += self._annotation(covering(whole, text))
        self.message = None
        item = message.item("completed", text)
        part = item["content"][0]
        at = {"item_id": message.id, "output_index": len(self.output), "content_index": 0}
        kind, own = message.done(text)
        out += self._emit(kind, {**at, **own})
        out += self._emit("response.content_part.done", {**at, "part": part})
        out += self._emit("response.output_item.done", {"output_index": len(self.output), "item": item})
        self.output.append(item)
        return out

    def _whole(self, content: dict[str, Any]) -> bytes:
        kind = content.get("type")
        if kind == "tool_use":
            return self._function_call(content)
        if kind in ("thinking", "reasoning"):
            return self._reasoning(content)
        if kind == WEB_SEARCH_CALL:
            return self._web_search(content)
        return b""  # redacted thinking, Anthropic's server tool blocks: Responses has no item for them

    def _web_search(self, content: dict[str, Any]) -> bytes:
        """The provider's web search call as it ended, with the progress events the API sends
        while it runs (``completed`` only for a search that completed)."""
        index = len(self.output)
        done = dict(content)
        done.setdefault("id", self._item_id("ws"))
        done.setdefault("status", "completed")
        at = {"output_index": index, "item_id": done["id"]}
        added = {"id": done["id"], "type": WEB_SEARCH_CALL, "status": "in_progress"}
        out = self._emit("response.output_item.added", {"output_index": index, "item": added})
        out += self._emit("response.web_search_call.in_progress", at)
        out += self._emit("response.web_search_call.searching", at)
        if done["status"] == "completed":
            out += self._emit("response.web_search_call.completed", at)
        out += self._emit("response.output_item.done", {"output_index": index, "item": done})
        self.output.append(done)
        return out

    def _function_call(self, content: dict[str, Any]) -> bytes:
        item_id = self._item_id("fc")
        arguments = _json(content.get("input") or {})
        index = len(self.output)
        item = {
            "id": item_id,
            "type": "function_call",
            "status": "in_progress",
            "arguments": "",
            "call_id": content.get("id"),
            "name": content.get("name"),
        }
        out = self._emit("response.output_item.added", {"output_index": index, "item": item})
        at = {"item_id": item_id, "output_index": index}
        out += self._emit("response.function_call_arguments.delta", {**at, "delta": arguments})
        out += self._emit("response.function_call_arguments.done", {**at, "arguments": arguments})
        done = {**item, "status": "completed", "arguments": arguments}
        out += self._emit("response.output_item.done", {"output_index": index, "item": done})
        self.output.append(done)
        return out

    def _reasoning(self, content: dict[str, Any]) -> bytes:
        """A reasoning item: the Responses provider's own (its summary and ``encrypted_content``
        as received), or another provider's thinking as the summary text."""
        index = len(self.output)
        if content.get("type") == "reasoning":
            item = {k: v for k, v in content.items() if k in ("id", "type", "summary", "encrypted_content")}
            item.setdefault("id", self._item_id("rs"))
            item.setdefault("summary", [])
            summaries = [s.get("text", "") for s in item["summary"] if isinstance(s, dict)]
        else:
            item = {"id": self._item_id("rs"), "type": "reasoning", "summary": []}
            thinking = str(content.get("thinking") or "")
            summaries = [thinking] if thinking else []
        out = self._emit("response.output_item.added", {"output_index": index, "item": {**item, "summary": []}})
        for n, text in enumerate(summaries):
            at = {"item_id": item["id"], "output_index": index, "summary_index": n}
            empty = {"type": "summary_text", "text": ""}
            out += self._emit("response.reasoning_summary_part.added", {**at, "part": empty})
            out += self._emit("response.reasoning_summary_text.delta", {**at, "delta": text})
            out += self._emit("response.reasoning_summary_text.done", {**at, "text": text})
            out += self._emit("response.reasoning_summary_part.done", {**at, "part": {**empty, "text": text}})
        done = {**item, "summary": [{"type": "summary_text", "text": t} for t in summaries]}
        out += self._emit("response.output_item.done", {"output_index": index, "item": done})
        self.output.append(done)
        return out

    def end(
        self,
        stop_reason: str,
        usage: TurnUsage,
        stop_sequence: str | None = None,
        metadata: Sequence[AttemptMetadata] = (),
    ) -> bytes:
        """Responses takes no stop sequences, so names none."""
        tail = self._close_message()
        incomplete = _INCOMPLETE.get(stop_reason)
        if stop_reason == "refusal" and not self.refused:
            # a refusal the client got as output text (Anthropic's stop reason comes after the
            # text): the API's "content_filter" is how a Responses client learns it was declined
            incomplete = "content_filter"
        if incomplete is not None:
            response = self._response("incomplete", usage, incomplete_details={"reason": incomplete})
            return tail + self._emit("response.incomplete", {"response": response})
        return tail + self._emit("response.completed", {"response": self._response("completed", usage)})

    def error(self, error_type: str, message: str) -> bytes:
        """``response.failed``: the response ends here, with what was sent (a message cut short
        is closed as ``incomplete``) and the error."""
        if self.message is not None:
            self.output.append(self.message.item("incomplete", self.message.text()))
            self.message = None
        # an Anthropic-style "api_error" (an unsplicable break) is what OpenAI calls a server error
        error = {"code": "server_error" if error_type == "api_error" else error_type, "message": message}
        return self._emit("response.failed", {"response": self._response("failed", error=error)})
