"""The downstream stream in Gemini's ``streamGenerateContent?alt=sse`` format, written from the splicer's ops.

Each event is ``data: {GenerateContentResponse}`` in Google's ``\\r\\n\\r\\n`` framing, candidate 0
carrying the parts released since the last chunk: text as it arrives, thought text and function
calls whole (the Gemini adapter's ``model_parts`` writes them, a call with its thought signature),
every chunk with the response's one id and, as Gemini's own, the ``usageMetadata`` so far (the
turn's attempts' running counts summed, never lower than a count sent before, with their details,
``gemini_usage``) and, when the client set ``responseLogprobs``, the ``logprobsResult`` of the
chunk's text (the entries the engine kept at a seam, ``engine.seamlogprobs``). Gemini has no start
or stop event: the last chunk carries the ``finishReason``, the ``usageMetadata`` summed over the
turn's attempts and the candidate's metadata made true of the spliced answer (``gemini_metadata``).
An error is Google's ``{"error": {"code", "message", "status"}}`` as a data line,
which the official client raises (``ClientError``, ``ServerError``) with its code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NotRequired, TypedDict

from ..engine.events import TokenLogprob, TopLogprob
from ..providers.gemini import FINISH_REASONS, model_parts
from .errors import GEMINI_CODES
from .gemini_metadata import spliced_metadata
from .gemini_usage import turn_details
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


class ScoredToken(TypedDict):
    """A ``LogprobsResult.Candidate``: ``tokenId`` where the upstream named it."""

    token: str
    tokenId: NotRequired[int]
    logProbability: float


class TopCandidates(TypedDict):
    candidates: list[ScoredToken]


class LogprobsResult(TypedDict, total=False):
    """A chunk's ``logprobsResult``: proto JSON leaves an empty list out."""

    topCandidates: list[TopCandidates]
    chosenCandidates: list[ScoredToken]


def _scored(entry: TokenLogprob | TopLogprob) -> ScoredToken:
    if "token_id" in entry:
        return ScoredToken(token=entry["token"], tokenId=entry["token_id"], logProbability=entry["logprob"])
    return ScoredToken(token=entry["token"], logProbability=entry["logprob"])


def logprobs_result(entries: Sequence[TokenLogprob]) -> LogprobsResult:
    """The entries of a chunk's text in Gemini's shape: ``topCandidates`` only where the upstream
    gave alternatives (the request set ``logprobs``), one per chosen token then."""
    result = LogprobsResult()
    if any(e["top_logprobs"] for e in entries):
        result["topCandidates"] = [TopCandidates(candidates=[_scored(t) for t in e["top_logprobs"]]) for e in entries]
    if entries:
        result["chosenCandidates"] = [_scored(e) for e in entries]
    return result


def finish_reason(stop_reason: str) -> str:
    raw = stop_reason.upper()
    return _FINISH.get(stop_reason) or (raw if raw in FINISH_REASONS else "OTHER")


class GeminiWriter:
    """``streamGenerateContent``: chunks of one response id with the turn's usage so far, the
    finish reason, the summed usage and the candidate's metadata on the last."""

    def __init__(self, response_id: str, model: str, logprobs: bool = False) -> None:
        self.response_id = response_id
        self.model = model
        self.logprobs = logprobs  # the client set ``generationConfig.responseLogprobs``
        self.sent = TurnUsage()  # the highest counts sent so far: a later chunk never shows less
        self.tool_use = 0  # the highest toolUsePromptTokenCount sent so far

    def _chunk(self, candidate: dict[str, Any], **more: Any) -> bytes:
        return _data({"candidates": [candidate], **more, "modelVersion": self.model, "responseId": self.response_id})

    def _usage(self, usage: TurnUsage) -> dict[str, Any]:
        """``usageMetadata`` for the turn so far, in Gemini's field order. Its ``candidatesTokenCount``
        leaves out the thought tokens, which ``thoughtsTokenCount`` counts; the total counts the
        tool use prompt tokens too, as Gemini's does. Each count is the highest sent yet: an attempt
        that broke has its running count replaced by the engine's estimate, which is never less,
        but a count that went down would be read as a bug. The per-modality details are the
        attempts' own made to agree with the counts (``gemini_usage``)."""
        sent = self.sent
        sent.input_tokens = max(sent.input_tokens, usage.input_tokens)
        sent.output_tokens = max(sent.output_tokens, usage.output_tokens)
        sent.reasoning_tokens = max(sent.reasoning_tokens, usage.reasoning_tokens)
        sent.cache_read_input_tokens = max(sent.cache_read_input_tokens, usage.cache_read_input_tokens)
        candidates = sent.output_tokens - sent.reasoning_tokens
        details = turn_details(usage.attempts, candidates)
        self.tool_use = max(self.tool_use, details.get("toolUsePromptTokenCount", 0))
        metadata: dict[str, Any] = {
            "promptTokenCount": sent.input_tokens,
            "candidatesTokenCount": candidates,
            "totalTokenCount": sent.input_tokens + sent.output_tokens + self.tool_use,
        }
        if sent.cache_read_input_tokens:
            metadata["cachedContentTokenCount"] = sent.cache_read_input_tokens
        for name in ("promptTokensDetails", "cacheTokensDetails", "candidatesTokensDetails"):
            if name in details:
                metadata[name] = details[name]
        if self.tool_use:
            metadata["toolUsePromptTokenCount"] = self.tool_use
        if "toolUsePromptTokensDetails" in details:
            metadata["toolUsePromptTokensDetails"] = details["toolUsePromptTokensDetails"]
        if sent.reasoning_tokens:
            metadata["thoughtsTokenCount"] = sent.reasoning_tokens
        return metadata

    def start(self, usage: TurnUsage) -> bytes:
        return b""

    def ops(self, ops: Iterable[Op], usage: TurnUsage) -> bytes:
        parts: list[dict[str, Any]] = []
        entries: list[TokenLogprob] = []
        for op in ops:
            if isinstance(op, TextPiece):
                parts.append({"text": op.text})
                entries.extend(op.logprobs)
            elif isinstance(op, WholeBlock):
                parts.extend(model_parts([op.content]))  # redacted thinking, server tools: no Gemini part
        if not parts:
            return b""
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if self.logprobs:
            candidate["logprobsResult"] = logprobs_result(entries)
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
        if self.logprobs:  # of no token: every chunk of an answer that asked has one
            candidate["logprobsResult"] = logprobs_result(())
        return self._chunk(candidate, usageMetadata=self._usage(usage))

    def error(self, error_type: str, message: str) -> bytes:
        """``error_type`` is a google.rpc status name (an unsplicable break's ``api_error`` is ``INTERNAL``)."""
        status = error_type if error_type in GEMINI_CODES else "INTERNAL"
        error = {"code": GEMINI_CODES[status], "message": message, "status": status}
        return _data({"error": error})
