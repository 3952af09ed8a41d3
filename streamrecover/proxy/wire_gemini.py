"""The downstream stream in Gemini's ``streamGenerateContent?alt=sse`` format, written from the splicer's ops.

Each event is ``data: {GenerateContentResponse}`` in Google's ``\\r\\n\\r\\n`` framing, candidate 0
carrying the parts released since the last chunk: text as it arrives, thought text and function
calls whole (the Gemini adapter's ``model_parts`` writes them, a call with its thought signature),
every chunk with the response's one id and, as Gemini's own, the ``usageMetadata`` so far (the
turn's attempts' running counts summed, never lower than a count sent before). Gemini has no start
or stop event: the last chunk carries the ``finishReason``, the ``usageMetadata`` summed over the
turn's attempts and the candidate's metadata made true of the spliced answer (``gemini_metadata``).
An error is Google's ``{"error": {"code", "message", "status"}}`` as a data line,
which the official client raises (``ClientError``, ``ServerError``) with its code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..providers.gemini import FINISH_REASONS, model_parts
from .errors import GEMINI_CODES
from .gemini_metadata import spliced_metadata
from .splice import Op, TextPiece, WholeBlock
from .wire import AttemptMetadata, TurnUsage, _json

# canonical stop reason -> finishReason (a Gemini upstream's own reasons come back lowercased)
_FINISH = {
    "end_turn": "STOP",
    "tool_use": "STOP",
    "stop_sequence": "STOP",
    "max_tokens": "MAX_TOKENS",
    "content_filter": "SAFETY",
    "refusal": "SAFETY",
    "malformed_function_call": "MALFORMED_FUNCTION_CALL",
}


def _data(payload: Any) -> bytes:
    """One event in Google's framing."""
    return f"data: {_json(payload)}\r\n\r\n".encode()


def finish_reason(stop_reason: str) -> str:
    raw = stop_reason.upper()
    return _FINISH.get(stop_reason) or (raw if raw in FINISH_REASONS else "OTHER")


class GeminiWriter:
    """``streamGenerateContent``: chunks of one response id with the turn's usage so far, the
    finish reason, the summed usage and the candidate's metadata on the last."""

    def __init__(self, response_id: str, model: str) -> None:
        self.response_id = response_id
        self.model = model
        self.sent = TurnUsage()  # the highest counts sent so far: a later chunk never shows less

    def _chunk(self, candidate: dict[str, Any], **more: Any) -> bytes:
        return _data({"candidates": [candidate], **more, "modelVersion": self.model, "responseId": self.response_id})

    def _usage(self, usage: TurnUsage) -> dict[str, int]:
        """``usageMetadata`` for the turn so far. Its ``candidatesTokenCount`` leaves out the thought
        tokens, which ``thoughtsTokenCount`` counts. Each count is the highest sent yet: an attempt
        that broke has its running count replaced by the engine's estimate, which is never less,
        but a count that went down would be read as a bug."""
        sent = self.sent
        sent.input_tokens = max(sent.input_tokens, usage.input_tokens)
        sent.output_tokens = max(sent.output_tokens, usage.output_tokens)
        sent.reasoning_tokens = max(sent.reasoning_tokens, usage.reasoning_tokens)
        sent.cache_read_input_tokens = max(sent.cache_read_input_tokens, usage.cache_read_input_tokens)
        metadata = {
            "promptTokenCount": sent.input_tokens,
            "candidatesTokenCount": sent.output_tokens - sent.reasoning_tokens,
            "totalTokenCount": sent.input_tokens + sent.output_tokens,
        }
        if sent.cache_read_input_tokens:
            metadata["cachedContentTokenCount"] = sent.cache_read_input_tokens
        if sent.reasoning_tokens:
            metadata["thoughtsTokenCount"] = sent.reasoning_tokens
        return metadata

    def start(self, usage: TurnUsage) -> bytes:
        return b""

    def ops(self, ops: Iterable[Op], usage: TurnUsage) -> bytes:
        parts: list[dict[str, Any]] = []
        for op in ops:
            if isinstance(op, TextPiece):
                parts.append({"text": op.text})
            elif isinstance(op, WholeBlock):
                parts.extend(model_parts([op.content]))  # redacted thinking, server tools: no Gemini part
        if not parts:
            return b""
        candidate = {"content": {"parts": parts, "role": "model"}, "index": 0}
        return self._chunk(candidate, usageMetadata=self._usage(usage))

    def end(
        self,
        stop_reason: str,
        usage: TurnUsage,
        stop_sequence: str | None = None,
        metadata: Sequence[AttemptMetadata] = (),
    ) -> bytes:
        """Gemini's ``STOP`` names no stop sequence."""
        # an empty text part, as Gemini's own last chunk often has: a chunk without content is
        # one the client's chat session counts as invalid
        candidate: dict[str, Any] = {
            "content": {"parts": [{"text": ""}], "role": "model"},
            "finishReason": finish_reason(stop_reason),
            "index": 0,
            **spliced_metadata(metadata),
        }
        return self._chunk(candidate, usageMetadata=self._usage(usage))

    def error(self, error_type: str, message: str) -> bytes:
        """``error_type`` is a google.rpc status name (an unsplicable break's ``api_error`` is ``INTERNAL``)."""
        status = error_type if error_type in GEMINI_CODES else "INTERNAL"
        error = {"code": GEMINI_CODES[status], "message": message, "status": status}
        return _data({"error": error})
