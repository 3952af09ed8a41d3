"""Normalized stream events: what every provider adapter turns its wire events into.

The accumulator and the runner only ever see these, so recovery logic is written once
for every provider. Indices are the provider's block indices within one HTTP response.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage as reported by the provider (cumulative values, never summed).

    One meaning for every provider: ``input_tokens`` is every input token of the request, cached
    or not (OpenAI's ``prompt_tokens``, Gemini's ``promptTokenCount``); the two cache fields are
    the parts of it read from and written to the provider's prompt cache, so they are never added
    to it again. Anthropic reports its uncached tokens alone as ``input_tokens``: its adapter adds
    the cached ones in, and a writer for Anthropic's wire format takes them out again.

    ``reasoning_tokens`` is the part of ``output_tokens`` spent thinking, where the provider says
    it (OpenAI's ``reasoning_tokens``, Gemini's ``thoughtsTokenCount``, Anthropic's newer
    ``thinking_tokens``); ``output_tokens`` always counts them, since they are billed as output.
    None where the provider did not say, which a sum over attempts reads as 0.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    reasoning_tokens: int | None = None

    def merged(self, other: Usage) -> Usage:
        """Later cumulative values replace earlier ones; missing ones keep the old value."""
        return Usage(
            input_tokens=other.input_tokens if other.input_tokens is not None else self.input_tokens,
            output_tokens=other.output_tokens if other.output_tokens is not None else self.output_tokens,
            cache_creation_input_tokens=(
                other.cache_creation_input_tokens
                if other.cache_creation_input_tokens is not None
                else self.cache_creation_input_tokens
            ),
            cache_read_input_tokens=(
                other.cache_read_input_tokens
                if other.cache_read_input_tokens is not None
                else self.cache_read_input_tokens
            ),
            reasoning_tokens=other.reasoning_tokens if other.reasoning_tokens is not None else self.reasoning_tokens,
        )

    def as_dict(self) -> dict[str, int | None]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }


@dataclass(frozen=True, slots=True)
class MessageStart:
    message_id: str | None = None
    model: str | None = None
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True, slots=True)
class BlockStart:
    """A content block opens. ``kind`` is text, tool_use, thinking, redacted_thinking or
    any provider type we keep opaquely (``data`` then holds the whole block). ``refusal``: a text
    block whose text is the model's refusal (OpenAI Chat's ``delta.refusal``), known from its start
    so that a client's wire format can put it where its API puts a refusal."""

    index: int
    kind: str
    id: str | None = None
    name: str | None = None
    data: dict[str, Any] | None = None
    refusal: bool = False


class TopLogprob(TypedDict):
    """One of the most likely tokens at a position (an OpenAI ``top_logprobs`` item), in Chat's
    field order. ``bytes`` is the token's UTF-8 bytes (None where the provider sent none:
    Chat's for a token without them, every Responses delta's, Gemini's). ``token_id``: the
    token's id in the model's vocabulary, where the provider names it (Gemini's ``tokenId``)."""

    token: str
    logprob: float
    bytes: list[int] | None
    token_id: NotRequired[int]


class TokenLogprob(TypedDict):
    """One sampled token's log probability (an item of OpenAI Chat's ``logprobs.content`` or
    ``logprobs.refusal``, or of a Responses ``output_text.delta``'s ``logprobs``), in Chat's field
    order: plain JSON, so frames carry it as it is; each writer writes it in its own API's shape."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]
    token_id: NotRequired[int]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of a text block. ``logprobs``: the provider's entries for the tokens of this piece
    (OpenAI Chat or Responses when asked for them), in order; empty where it sent none."""

    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolArgsDelta:
    index: int
    partial_json: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    index: int
    thinking: str


@dataclass(frozen=True, slots=True)
class SignatureDelta:
    """Replaces (not appends) the thinking block's signature, as the SDK does."""

    index: int
    signature: str


@dataclass(frozen=True, slots=True)
class CitationDelta:
    """One citation of a text block (web search, documents): appended to its ``citations``.

    A citation with ``start_index`` and ``end_index`` (``engine.citespan``) covers those characters
    of the block's text as this response wrote it; the translator moves them onto the turn's
    block when that block was continued from an earlier attempt's text."""

    index: int
    citation: dict[str, Any]


@dataclass(frozen=True, slots=True)
class FieldDelta:
    """A piece of one string field of an opaque block (a ``compaction`` block's ``content``):
    the pieces are joined, in order, into that field of the block's content."""

    index: int
    field: str
    text: str


@dataclass(frozen=True, slots=True)
class BlockStop:
    index: int


@dataclass(frozen=True, slots=True)
class UsageUpdate:
    usage: Usage


@dataclass(frozen=True, slots=True)
class AnswerMetadata:
    """What the provider says about the answer besides its content and usage (Gemini's finish
    message, safety ratings, citation and grounding metadata). The engine does not read it: it
    keeps it on the attempt (``AttemptRecord.metadata``, each key replacing the attempt's earlier
    value, as providers resend it whole) for whoever writes the provider's own format again. The
    adapter that sends it names its shape (``providers.gemini.CandidateMetadata``)."""

    values: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class StopReason:
    """The provider's stop reason, normalized: end_turn, tool_use, max_tokens,
    stop_sequence, refusal, content_filter, context_overflow, pause_turn, or the raw value.
    ``sequence`` is the stop sequence that ended the answer, where the provider names it
    (Anthropic's ``stop_sequence``; OpenAI's and Gemini's ``stop`` do not say which)."""

    reason: str
    raw: str | None = None
    sequence: str | None = None


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The terminator arrived (message_stop, [DONE], response.completed)."""


@dataclass(frozen=True, slots=True)
class ProviderErrorEvent:
    """An error delivered inside a 200 stream (Anthropic ``event: error``, OpenAI
    ``data: {"error": ...}``). ``error_type`` is the provider's type string."""

    error_type: str
    message: str
    request_id: str | None = None


StreamEvent = (
    MessageStart
    | BlockStart
    | TextDelta
    | ToolArgsDelta
    | ThinkingDelta
    | SignatureDelta
    | CitationDelta
    | FieldDelta
    | BlockStop
    | UsageUpdate
    | AnswerMetadata
    | StopReason
    | StreamEnd
    | ProviderErrorEvent
)
