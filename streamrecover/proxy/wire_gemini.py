"""The downstream stream in Gemini's ``streamGenerateContent?alt=sse`` format, written from the splicer's ops.

Each event is ``data: {GenerateContentResponse}`` in Google's ``\\r\\n\\r\\n`` framing, candidate 0
carrying the parts released since the last chunk: text as it arrives, thought text and function
calls whole (the Gemini adapter's ``model_parts`` writes them, a call with its thought signature),
every chunk with the response's one id. Gemini has no start or stop event: the last chunk carries
the ``finishReason`` and the ``usageMetadata`` summed over the turn's attempts (the earlier chunks
carry none). An error is Google's ``{"error": {"code", "message", "status"}}`` as a data line,
which the official client raises (``ClientError``, ``ServerError``) with its code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..providers.gemini import FINISH_REASONS, model_parts
from .errors import GEMINI_CODES
from .splice import Op, TextPiece, WholeBlock
from .wire import TurnUsage, _json

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


def finish_reason(stop_reason: str) -> str:
    raw = stop_reason.upper()
    return _FINISH.get(stop_reason) or (raw if raw in FINISH_REASONS else "OTHER")


class GeminiWriter:
    """``streamGenerateContent``: chunks of one response id, the finish reason and usage on the last."""

    def __init__(self, response_id: str, model: str) -> None:
        self.response_id = response_id
        self.model = model

    def _chunk(self, candidate: dict[str, Any], **more: Any) -> bytes:
        payload = {"candidates": [candidate], **more, "modelVersion": self.model, "responseId": self.response_id}
        return f"data: {_json(payload)}\r\n\r\n".encode()

    def start(self, usage: TurnUsage) -> bytes:
        return b""

    def ops(self, ops: Iterable[Op]) -> bytes:
        parts: list[dict[str, Any]] = []
        for op in ops:
            if isinstance(op, TextPiece):
                parts.append({"text": op.text})
            elif isinstance(op, WholeBlock):
                parts.extend(model_parts([op.content]))  # redacted thinking, server tools: no Gemini part
        if not parts:
            return b""
        return self._chunk({"content": {"parts": parts, "role": "model"}, "index": 0})

    def end(self, stop_reason: str, usage: TurnUsage, stop_sequence: str | None = None) -> bytes:
        """Gemini's ``STOP`` names no stop sequence. Its ``candidatesTokenCount`` leaves out the
        thought tokens, which ``thoughtsTokenCount`` counts."""
        metadata: dict[str, Any] = {
            "promptTokenCount": usage.input_tokens,
            "candidatesTokenCount": usage.output_tokens - usage.reasoning_tokens,
            "totalTokenCount": usage.input_tokens + usage.output_tokens,
        }
        if usage.cache_read_input_tokens:
            metadata["cachedContentTokenCount"] = usage.cache_read_input_tokens
        if usage.reasoning_tokens:
            metadata["thoughtsTokenCount"] = usage.reasoning_tokens
        # an empty text part, as Gemini's own last chunk often has: a chunk without content is
        # one the client's chat session counts as invalid
        candidate = {
            "content": {"parts": [{"text": ""}], "role": "model"},
            "finishReason": finish_reason(stop_reason),
            "index": 0,
        }
        return self._chunk(candidate, usageMetadata=metadata)

    def error(self, error_type: str, message: str) -> bytes:
        """``error_type`` is a google.rpc status name (an unsplicable break's ``api_error`` is ``INTERNAL``)."""
        status = error_type if error_type in GEMINI_CODES else "INTERNAL"
        error = {"code": GEMINI_CODES[status], "message": message, "status": status}
        return f"data: {_json({'error': error})}\r\n\r\n".encode()
