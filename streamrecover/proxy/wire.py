"""The downstream stream in each provider's own wire format, written from the splicer's ops.

One writer per response: ``start`` once, ``ops`` as blocks are released (with the turn's usage
so far, which Gemini's chunks carry), then ``end`` (the stop reason, the turn's usage summed over
its attempts and each attempt's answer metadata, which Gemini's last chunk carries) or ``error``
(the provider's own mid-stream error event). Ids are the run's, so one stream has one id however
many upstream calls served it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, cast

from ..engine.events import TokenLogprob
from ..providers.anthropic import STOP_REASONS, AnthropicStop
from ..providers.openai_responses import ANNOTATION_TYPES, WEB_SEARCH_CALL
from .splice import Citation, CloseBlock, Op, OpenText, TextPiece, WholeBlock

# canonical stop reason -> Chat Completions finish_reason
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "content_filter": "content_filter",
    # a refusal the client was shown as one (``delta.refusal``) ends with "stop", as OpenAI ends
    # it; one it got as content (Anthropic's stop reason comes after the text) is a content filter
    "refusal": "content_filter",
}

# canonical stop reason -> Messages stop_reason, where it is not one already (``STOP_REASONS``,
# the adapter's map of the API's values, holds every one the SDK's ``StopReason`` has). The
# adapter's own renames go back as they came (the context window filling is Anthropic's
# "model_context_window_exceeded"); another provider's content filter (Gemini SAFETY, a Chat or
# Responses content_filter) is the model declining, which Anthropic's SDKs know as "refusal". Any
# other (Gemini's OTHER and MALFORMED_FUNCTION_CALL, a value an OpenAI-compatible server made up)
# ends the answer with no more to say of why: "end_turn", as LiteLLM's translator ends every
# finish_reason it has no mapping for.
ANTHROPIC_STOP_REASONS = {
    **{canonical: raw for raw, canonical in STOP_REASONS.items() if raw != canonical},
    "content_filter": "refusal",
}


def anthropic_stop_reason(stop_reason: str) -> str:
    """The Messages ``stop_reason`` for a canonical one that no Anthropic attempt wrote."""
    if stop_reason in STOP_REASONS:
        return stop_reason
    return ANTHROPIC_STOP_REASONS.get(stop_reason, "end_turn")


def own_stop(metadata: Sequence[AttemptMetadata], stop_reason: str) -> AnthropicStop | None:
    """The Anthropic attempt's own stop, when the turn's last attempt was an Anthropic one and the
    turn ends with its stop reason (not a salvaged tool call's ``tool_use``, nor a break's
    ``max_tokens``): its ``stop_reason`` as the API wrote it and its ``stop_details``, if sent."""
    if not metadata:
        return None
    stop = cast(AnthropicStop, metadata[-1].values)
    raw = stop.get("stop_reason")
    if raw is None or STOP_REASONS.get(raw, raw) != stop_reason:
        return None
    return stop


@dataclass(slots=True)
class TurnUsage:
    """Usage summed over a turn's attempts, in ``Usage``'s meaning: ``input_tokens`` counts the
    cached tokens too; each writer says it in its own API's."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    reasoning_tokens: int = 0  # the part of output_tokens spent thinking, where the upstream said
    # each attempt's answer metadata so far, in order: a writer of the provider's own format finds
    # its usage fields beyond these counts there (Gemini's per-modality details)
    attempts: list[AttemptMetadata] = field(default_factory=list)

    def anthropic(self, output_tokens: int) -> dict[str, int]:
        """Anthropic's usage: its ``input_tokens`` leave out what was read from or written to the cache."""
        cached = self.cache_creation_input_tokens + self.cache_read_input_tokens
        return {
            "input_tokens": max(0, self.input_tokens - cached),
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": output_tokens,
        }


@dataclass(frozen=True, slots=True)
class AttemptMetadata:
    """One attempt's answer metadata (``AttemptRecord.metadata``, the provider's own fields) and
    whether the attempt broke (its text then goes on in another attempt's)."""

    values: Mapping[str, object]
    interrupted: bool


def _json(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def _event(name: str, payload: Any) -> bytes:
    return f"event: {name}\ndata: {_json(payload)}\n\n".encode()


def _data(payload: Any) -> bytes:
    return f"data: {_json(payload)}\n\n".encode()


class Writer(Protocol):
    def start(self, usage: TurnUsage) -> bytes: ...
    def ops(self, ops: Iterable[Op], usage: TurnUsage) -> bytes: ...
    def end(
        self,
        stop_reason: str,
        usage: TurnUsage,
        stop_sequence: str | None = None,
        metadata: Sequence[AttemptMetadata] = (),
    ) -> bytes:
        """``metadata``: each attempt's of the turn, in order."""
        ...

    def error(self, error_type: str, message: str) -> bytes: ...


class AnthropicWriter:
    """Messages: ``message_start``, content blocks with contiguous indexes, one ``message_delta``, ``message_stop``."""

    def __init__(self, message_id: str, model: str) -> None:
        self.message_id = message_id
        self.model = model

    def start(self, usage: TurnUsage) -> bytes:
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage.anthropic(output_tokens=1),
        }
        return _event("message_start", {"type": "message_start", "message": message})

    def ops(self, ops: Iterable[Op], usage: TurnUsage) -> bytes:
        out: list[bytes] = []
        for op in ops:
            if isinstance(op, OpenText):
                block: dict[str, Any] = {"type": "text", "text": ""}
                if op.cited:
                    block["citations"] = []
                start = {"type": "content_block_start", "index": op.index, "content_block": block}
                out.append(_event("content_block_start", start))
            elif isinstance(op, TextPiece):
                delta = {
                    "type": "content_block_delta",
                    "index": op.index,
                    "delta": {"type": "text_delta", "text": op.text},
                }
                out.append(_event("content_block_delta", delta))
            elif isinstance(op, Citation) and op.citation.get("type") not in ANNOTATION_TYPES:
                # a Responses annotation has no Anthropic form: its text goes out without it
                delta = {
                    "type": "content_block_delta",
                    "index": op.index,
                    "delta": {"type": "citations_delta", "citation": op.citation},
                }
                out.append(_event("content_block_delta", delta))
            elif isinstance(op, CloseBlock):
                out.append(_event("content_block_stop", {"type": "content_block_stop", "index": op.index}))
            elif isinstance(op, WholeBlock) and op.content.get("type") != WEB_SEARCH_CALL:
                # a Responses web search call: Anthropic's clients know a search only as a server tool call and result
                out.extend(self._whole(op.index, op.content))
        return b"".join(out)

    def _whole(self, index: int, content: dict[str, Any]) -> list[bytes]:
        kind = content.get("type")
        out: list[bytes] = []

        def delta(payload: dict[str, Any]) -> None:
            out.append(_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": payload}))

        if kind == "tool_use":
            opening: dict[str, Any] = {
                "type": "tool_use",
                "id": content.get("id"),
                "name": content.get("name"),
                "input": {},
            }
            out.append(
                _event("content_block_start", {"type": "content_block_start", "index": index, "content_block": opening})
            )
            delta({"type": "input_json_delta", "partial_json": _json(content.get("input") or {})})
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            out.append(
                _event("content_block_start", {"type": "content_block_start", "index": index, "content_block": opening})
            )
            delta({"type": "thinking_delta", "thinking": content.get("thinking", "")})
            delta({"type": "signature_delta", "signature": content.get("signature", "")})
        else:  # redacted thinking, server tool calls and results: whole in their start
            out.append(
                _event("content_block_start", {"type": "content_block_start", "index": index, "content_block": content})
            )
        out.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        return out

    def end(
        self,
        stop_reason: str,
        usage: TurnUsage,
        stop_sequence: str | None = None,
        metadata: Sequence[AttemptMetadata] = (),
    ) -> bytes:
        """An Anthropic upstream's own stop goes back as it came, ``stop_details`` included;
        another's is given the closest of Anthropic's values (``anthropic_stop_reason``)."""
        own = own_stop(metadata, stop_reason)
        stop: dict[str, object] = {
            "stop_reason": own["stop_reason"] if own is not None else anthropic_stop_reason(stop_reason),
            "stop_sequence": stop_sequence,
        }
        if own is not None and "stop_details" in own:
            stop["stop_details"] = own["stop_details"]
        delta = {
            "type": "message_delta",
            "delta": stop,
            "usage": usage.anthropic(output_tokens=usage.output_tokens),
        }
        return _event("message_delta", delta) + _event("message_stop", {"type": "message_stop"})

    def error(self, error_type: str, message: str) -> bytes:
        return _event("error", {"type": "error", "error": {"type": error_type, "message": message}})


def thinking_text(content: dict[str, Any]) -> str:
    """The readable thinking of a block: Anthropic's thinking, a Responses reasoning item's summaries."""
    if content.get("type") == "thinking":
        return str(content.get("thinking") or "")
    if content.get("type") == "reasoning":
        summary = content.get("summary") or []
        return "\n\n".join(str(s.get("text", "")) for s in summary if isinstance(s, dict) and s.get("text"))
    return ""


class ChoiceLogprobs(TypedDict):
    """A Chat chunk's ``choices[0].logprobs`` when the client asked for them, in the API's field
    order: a refusal's entries under ``refusal`` (``content`` then null), any other text's under
    ``content`` (``refusal`` null)."""

    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None


class OpenAIWriter:
    """Chat Completions: chunks of one id, tool calls whole, one ``finish_reason``, the usage chunk
    when the client asked for it, ``[DONE]``. A client that asked for ``logprobs`` gets, as the API
    sends them, a ``logprobs`` object on the first chunk and on each text chunk, with the entries
    the engine passed on for that text.

    A refusal (a text block the upstream marked as one) is written where the API writes it: its
    text as ``delta.refusal``, its entries under ``logprobs.refusal``, and, when it opens the
    answer, a first chunk of ``{"role": "assistant", "content": null, "refusal": ""}``. So the role
    chunk waits for the first op, which says which of the two first chunks it is."""

    def __init__(self, completion_id: str, model: str, include_usage: bool, logprobs: bool = False) -> None:
        self.completion_id = completion_id
        self.model = model
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.created = int(time.time())
        self.tool_calls = 0
        self.role_sent = False
        self.in_refusal = False  # the open text block is a refusal
        self.refused = False  # a refusal went out as one (``delta.refusal``)

    def _chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None, logprobs: ChoiceLogprobs | None = None
    ) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return _data(chunk)

    def _text_logprobs(self, entries: Sequence[TokenLogprob], refusal: bool) -> ChoiceLogprobs | None:
        if not self.logprobs:
            return None
        if refusal:
            return ChoiceLogprobs(content=None, refusal=list(entries))
        return ChoiceLogprobs(content=list(entries), refusal=None)

    def _role(self, refusal: bool) -> bytes:
        """The first chunk, once: the API's for a refusal, or for anything else."""
        if self.role_sent:
            return b""
        self.role_sent = True
        if refusal:
            delta: dict[str, Any] = {"role": "assistant", "content": None, "refusal": ""}
        else:
            delta = {"role": "assistant", "content": "", "refusal": None}
        return self._chunk(delta, logprobs=self._text_logprobs((), refusal))

    def start(self, usage: TurnUsage) -> bytes:
        """Nothing yet: the role chunk goes out with the first op (or the end), shaped by it."""
        return b""

    def ops(self, ops: Iterable[Op], usage: TurnUsage) -> bytes:
        out: list[bytes] = []
        for op in ops:
            out.append(self._role(isinstance(op, OpenText) and op.refusal))
            if isinstance(op, OpenText):
                self.in_refusal = op.refusal
                self.refused = self.refused or op.refusal
            elif isinstance(op, TextPiece):
                field = "refusal" if self.in_refusal else "content"
                logprobs = self._text_logprobs(op.logprobs, self.in_refusal)
                out.append(self._chunk({field: op.text}, logprobs=logprobs))
            elif isinstance(op, WholeBlock) and op.content.get("type") == "tool_use":
                call = {
                    "index": self.tool_calls,
                    "id": op.content.get("id"),
                    "type": "function",
                    "function": {"name": op.content.get("name"), "arguments": _json(op.content.get("input") or {})},
                }
                self.tool_calls += 1
                out.append(self._chunk({"tool_calls": [call]}))
            elif isinstance(op, WholeBlock) and (reasoning := thinking_text(op.content)):
                # no standard field: DeepSeek, vLLM and SGLang stream it as ``reasoning_content``
                out.append(self._chunk({"reasoning_content": reasoning}))
            # other blocks (redacted thinking, server tools) have no place in a chat completion
        return b"".join(out)

    def end(
        self,
        stop_reason: str,
        usage: TurnUsage,
        stop_sequence: str | None = None,
        metadata: Sequence[AttemptMetadata] = (),
    ) -> bytes:
        """Chat's ``finish_reason`` is ``stop`` at a stop sequence too, naming none."""
        finish = "stop" if stop_reason == "refusal" and self.refused else FINISH_REASONS.get(stop_reason, "stop")
        out = [self._role(refusal=False), self._chunk({}, finish)]
        if self.include_usage:
            out.append(
                _data(
                    {
                        "id": self.completion_id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": usage.input_tokens,
                            "completion_tokens": usage.output_tokens,
                            "total_tokens": usage.input_tokens + usage.output_tokens,
                            "prompt_tokens_details": {"cached_tokens": usage.cache_read_input_tokens},
                            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
                        },
                    }
                )
            )
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)

    def error(self, error_type: str, message: str) -> bytes:
        return _data({"error": {"message": message, "type": error_type, "param": None, "code": None}})
