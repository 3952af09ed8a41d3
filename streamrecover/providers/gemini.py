"""Google Gemini adapter (``POST {base_url}/v1beta/models/{model}:streamGenerateContent?alt=sse``).

Each SSE event is a whole ``GenerateContentResponse`` chunk: ``candidates[0].content.parts``
(text, thought text, whole function calls), ``usageMetadata`` (cumulative) on every chunk,
and ``finishReason`` on the last one. There is no terminator event: the chunk with the
``finishReason`` is the end, so a body that ends before it is a break. A chunk's usage is
applied before its parts, so what the parts stream counts them. The candidate's
``finishMessage``, ``safetyRatings``, ``citationMetadata``, ``groundingMetadata``,
``urlContextMetadata`` and ``avgLogprobs``, and the usage's per-modality and tool-use details,
are passed on as they came (``AnswerMetadata``, a ``GeminiMetadata``), for a Gemini client of
the healing endpoint. A chunk's ``logprobsResult`` (asked for with ``responseLogprobs``) rides
on the chunk's text, as the text delta's token logprobs.

Thought signatures: a ``thoughtSignature`` signs the response's thought run (the thinking
block closes with it) wherever it arrives, and one on a ``functionCall`` part also rides on
that ``tool_use`` block (``"signature"``), because Gemini 3 rejects a function call sent back
without it. A signature on a text part with no thought run open is not kept: the API asks
for text signatures back only as a recommendation.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, TypedDict, cast

from ..engine.contract import HTTPRequest, ModelRequest, ProviderConfig, ThinkingRule
from ..engine.errors import ErrorClass, ParseError, ProviderError
from ..engine.events import (
    AnswerMetadata,
    BlockStart,
    BlockStop,
    MessageStart,
    ProviderErrorEvent,
    SignatureDelta,
    StopReason,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    TokenLogprob,
    ToolArgsDelta,
    TopLogprob,
    Usage,
    UsageUpdate,
)
from ..engine.retry import header_value, parse_retry_after
from ..engine.sse import SSEEvent
from .common import (
    ContinueMessageOnly,
    SplitPairs,
    as_int,
    excerpt,
    optional_strings,
    read_error_body,
    status_policy,
    with_should_retry,
)
from .modelname import path_segments

__all__ = [
    "API_VERSION",
    "CONTENT_STOPS",
    "FINISH_REASONS",
    "PART",
    "CandidateMetadata",
    "GeminiAdapter",
    "GeminiMetadata",
    "GeminiStreamParser",
    "candidate_metadata",
    "chunk_logprobs",
    "method_url",
    "model_parts",
    "thinking_rule",
]

API_VERSION = "v1beta"
# A canonical block holding a Gemini part as a client sent it (the healing endpoint's Gemini
# surface: inline data, code execution, a function response...): sent back without its ``type``.
PART = "gemini_part"

# finishReason -> normalized stop reason. The content stops end the answer as it is and
# are never continued (``content_filter`` is one of the engine's never-continue stops).
CONTENT_STOPS = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "LANGUAGE"}
)
FINISH_REASONS: dict[str, str] = {
    "STOP": "end_turn",
    "MAX_TOKENS": "max_tokens",
    **{reason: "content_filter" for reason in CONTENT_STOPS},
    "MALFORMED_FUNCTION_CALL": "malformed_function_call",
    "UNEXPECTED_TOOL_CALL": "malformed_function_call",
    "OTHER": "other",
    "FINISH_REASON_UNSPECIFIED": "other",
}

_STATUS_POLICY: dict[int, tuple[str, ErrorClass]] = {
    400: ("invalid_request", ErrorClass.PERMANENT),
    401: ("unauthorized", ErrorClass.PERMANENT),
    403: ("permission_denied", ErrorClass.PERMANENT),
    404: ("model_not_found", ErrorClass.PERMANENT),
    408: ("timeout", ErrorClass.RETRYABLE),
    429: ("rate_limited", ErrorClass.RETRYABLE),
    500: ("server_error", ErrorClass.RETRYABLE),
    503: ("overloaded", ErrorClass.RETRYABLE),
    504: ("timeout", ErrorClass.RETRYABLE),
}

# google.rpc status names inside a 200 stream -> (kind, class)
_STREAM_STATUS: dict[str, tuple[str, ErrorClass]] = {
    "RESOURCE_EXHAUSTED": ("rate_limited", ErrorClass.RETRYABLE),
    "UNAVAILABLE": ("overloaded", ErrorClass.RETRYABLE),
    "INTERNAL": ("server_error", ErrorClass.RETRYABLE),
    "DEADLINE_EXCEEDED": ("timeout", ErrorClass.RETRYABLE),
    "ABORTED": ("server_error", ErrorClass.RETRYABLE),
    "INVALID_ARGUMENT": ("invalid_request", ErrorClass.PERMANENT),
    "FAILED_PRECONDITION": ("invalid_request", ErrorClass.PERMANENT),
    "UNAUTHENTICATED": ("unauthorized", ErrorClass.PERMANENT),
    "PERMISSION_DENIED": ("permission_denied", ErrorClass.PERMANENT),
    "NOT_FOUND": ("model_not_found", ErrorClass.PERMANENT),
    "PROMPT_BLOCKED": ("prompt_blocked", ErrorClass.PERMANENT),
}


class SafetyRating(TypedDict, total=False):
    category: str
    probability: str  # NEGLIGIBLE, LOW, MEDIUM, HIGH
    blocked: bool
    probabilityScore: float
    severity: str
    severityScore: float


class CitationSource(TypedDict, total=False):
    """A recited source; ``startIndex``/``endIndex`` are byte offsets into the candidate's text."""

    startIndex: int
    endIndex: int
    uri: str
    title: str
    license: str
    publicationDate: dict[str, int]


class CitationMetadata(TypedDict, total=False):
    citationSources: list[CitationSource]


class GroundingMetadata(TypedDict, total=False):
    """Search grounding: the sources (``groundingChunks``), what of the text each supports
    (``groundingSupports``, whose segments are offsets into the candidate's text), the queries and
    the search entry point Google asks to be shown. The nested objects pass as they came."""

    groundingChunks: list[dict[str, object]]
    groundingSupports: list[dict[str, object]]
    webSearchQueries: list[str]
    searchEntryPoint: dict[str, object]
    retrievalMetadata: dict[str, object]


class CandidateMetadata(TypedDict, total=False):
    """What candidate 0 says about the answer besides its content. ``urlContextMetadata`` (the
    URLs the URL context tool retrieved, ``urlMetadata``) passes as it came."""

    finishMessage: str
    safetyRatings: list[SafetyRating]
    citationMetadata: CitationMetadata
    groundingMetadata: GroundingMetadata
    urlContextMetadata: dict[str, object]
    avgLogprobs: float


class ModalityTokenCount(TypedDict):
    modality: str  # TEXT, IMAGE, AUDIO, VIDEO, DOCUMENT
    tokenCount: int


class UsageDetails(TypedDict, total=False):
    """The fields of ``usageMetadata`` besides the counts ``Usage`` holds: per-modality counts and
    the prompt tokens of tool use (URL context, search), which Gemini counts in its total."""

    promptTokensDetails: list[ModalityTokenCount]
    cacheTokensDetails: list[ModalityTokenCount]
    candidatesTokensDetails: list[ModalityTokenCount]
    toolUsePromptTokenCount: int
    toolUsePromptTokensDetails: list[ModalityTokenCount]


class GeminiMetadata(CandidateMetadata, total=False):
    """``AnswerMetadata.values`` of a Gemini response: candidate 0's metadata and, as
    ``usageDetails``, the latest ``usageMetadata``'s details (cumulative, as its counts are)."""

    usageDetails: UsageDetails


_DETAIL_LISTS = ("promptTokensDetails", "cacheTokensDetails", "candidatesTokensDetails", "toolUsePromptTokensDetails")


def _modalities(value: Any) -> list[ModalityTokenCount] | None:
    """A list of ``{modality, tokenCount}``, or None where it has the wrong shape (a missing
    ``tokenCount`` is 0: proto JSON leaves zeros out)."""
    if not isinstance(value, list):
        return None
    out: list[ModalityTokenCount] = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("modality", ""), str):
            return None
        count = as_int(item.get("tokenCount")) or 0
        out.append(ModalityTokenCount(modality=str(item.get("modality", "MODALITY_UNSPECIFIED")), tokenCount=count))
    return out


def usage_details(raw: Mapping[str, Any]) -> UsageDetails:
    """``usageMetadata``'s details of the right JSON type (a field of another is left out)."""
    details = UsageDetails()
    for name in _DETAIL_LISTS:
        modalities = _modalities(raw.get(name))
        if modalities is not None:
            details[name] = modalities  # type: ignore[literal-required]
    tool_use = as_int(raw.get("toolUsePromptTokenCount"))
    if tool_use is not None:
        details["toolUsePromptTokenCount"] = tool_use
    return details


def candidate_metadata(candidate: Mapping[str, Any]) -> CandidateMetadata:
    """The candidate's metadata fields of the right JSON type (a field of another is left out)."""
    metadata = CandidateMetadata()
    message, ratings = candidate.get("finishMessage"), candidate.get("safetyRatings")
    citations, grounding = candidate.get("citationMetadata"), candidate.get("groundingMetadata")
    url_context, average = candidate.get("urlContextMetadata"), candidate.get("avgLogprobs")
    if isinstance(message, str) and message:
        metadata["finishMessage"] = message
    if isinstance(ratings, list):
        metadata["safetyRatings"] = cast(list[SafetyRating], [r for r in ratings if isinstance(r, dict)])
    if isinstance(citations, dict):
        metadata["citationMetadata"] = cast(CitationMetadata, citations)
    if isinstance(grounding, dict):
        metadata["groundingMetadata"] = cast(GroundingMetadata, grounding)
    if isinstance(url_context, dict):
        metadata["urlContextMetadata"] = url_context
    if isinstance(average, int | float) and not isinstance(average, bool):
        metadata["avgLogprobs"] = average
    return metadata


def _scored(entry: Any) -> TopLogprob | None:
    """A ``{token, tokenId?, logProbability}`` as a ``TopLogprob`` (``bytes`` None: Gemini sends
    none), or None where a field has the wrong type. A missing ``logProbability`` is 0."""
    if not isinstance(entry, dict):
        return None
    token, logprob, token_id = entry.get("token"), entry.get("logProbability", 0.0), entry.get("tokenId")
    if type(token) is not str or not isinstance(logprob, int | float) or isinstance(logprob, bool):
        return None
    scored = TopLogprob(token=token, logprob=logprob, bytes=None)
    if isinstance(token_id, int) and not isinstance(token_id, bool):
        scored["token_id"] = token_id
    return scored


def chunk_logprobs(result: Any) -> list[TokenLogprob]:
    """A chunk's ``logprobsResult``: one entry per ``chosenCandidates`` item, its alternatives the
    ``topCandidates`` item at the same step (none where there are none). An entry of the wrong
    shape ends the list there: the entries after it could not be placed on their tokens."""
    if not isinstance(result, dict) or not isinstance(result.get("chosenCandidates"), list):
        return []
    tops = result.get("topCandidates")
    tops = tops if isinstance(tops, list) else []
    out: list[TokenLogprob] = []
    for step, chosen in enumerate(result["chosenCandidates"]):
        scored = _scored(chosen)
        if scored is None:
            break
        top = tops[step] if step < len(tops) and isinstance(tops[step], dict) else {}
        alternatives = [_scored(c) for c in top.get("candidates") or ()] if isinstance(top, dict) else []
        entry = TokenLogprob(
            token=scored["token"],
            logprob=scored["logprob"],
            bytes=None,
            top_logprobs=[a for a in alternatives if a is not None],
        )
        if "token_id" in scored:
            entry["token_id"] = scored["token_id"]
        out.append(entry)
    return out


# The smallest positive ``thinkingBudget`` each 2.5 model takes (Gemini API docs, "Gemini
# thinking": Pro 128 to 32768, Flash 0 to 24576, Flash-Lite 512 to 24576 or 0). 0 is no floor: it
# turns thinking off (and the thoughts a request shows with it) or, on Pro, is refused. Flash-Lite
# before Flash: its name starts with Flash's. Other models (Gemini 3 given a budget, tuned models)
# have no known floor: their budget is not lowered.
MIN_THINKING_BUDGETS: tuple[tuple[str, int], ...] = (
    ("gemini-2.5-pro", 128),
    ("gemini-2.5-flash-lite", 512),
    ("gemini-2.5-flash", 1),
)


def thinking_rule(model: str) -> ThinkingRule:
    """A continuation's ``thinkingBudget`` is lowered below what is left of the turn, never under
    the model's minimum; where even that does not fit, the minimum goes all the same, since
    ``maxOutputTokens`` caps thinking and answer together (no budget at all would drop
    ``includeThoughts`` with it, and let the model think its default amount)."""
    name = model.rsplit("/", 1)[-1]  # "models/gemini-2.5-pro" names the same model
    minimum = next((low for prefix, low in MIN_THINKING_BUDGETS if name.startswith(prefix)), None)
    return ThinkingRule(minimum=minimum, send_minimum=True)


_CONTEXT_MARKERS = ("exceeds the maximum number of tokens", "input token count", "context window")
# A 429 that waiting a minute cannot fix: a daily quota (``QuotaFailure``'s quotaId), or a tier
# with no quota at all. Not "billing": every RESOURCE_EXHAUSTED message, the per-minute one
# included, says "please check your plan and billing details".
_QUOTA_MARKERS = ("perday", "per_day", "limit: 0")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")
SYNTHETIC_ID_PREFIX = "gemini_call_"  # ids this adapter made up (Gemini sends none): never sent back


def _usage(raw: Mapping[str, Any]) -> Usage:
    """``usageMetadata`` -> Usage. Thought tokens are billed as output, so they count in it (Gemini
    leaves them out of ``candidatesTokenCount``), and are its reasoning tokens."""
    candidates = as_int(raw.get("candidatesTokenCount"))
    thoughts = as_int(raw.get("thoughtsTokenCount"))
    output = None if candidates is None and thoughts is None else (candidates or 0) + (thoughts or 0)
    return Usage(
        input_tokens=as_int(raw.get("promptTokenCount")),
        output_tokens=output,
        cache_read_input_tokens=as_int(raw.get("cachedContentTokenCount")),
        reasoning_tokens=thoughts,
    )


def synthetic_call_id(name: str, arguments: str, ordinal: int) -> str:
    """A stable id for a call Gemini sent without one: the same call gets the same id in an
    uninterrupted answer and in a continuation, so the committed thread is the same."""
    digest = hashlib.sha256(f"{name}\x00{arguments}\x00{ordinal}".encode()).hexdigest()[:24]
    return SYNTHETIC_ID_PREFIX + digest


def _shown_text(part: Any) -> str:
    """The text a part adds to the answer's text (none for a thought or a call)."""
    if not isinstance(part, dict) or part.get("thought") or "functionCall" in part:
        return ""
    text = part.get("text")
    return text if type(text) is str else ""


def _placed(entries: list[TokenLogprob], parts: Any) -> dict[int, tuple[TokenLogprob, ...]]:
    """A chunk's logprob entries per text part (by its position in ``parts``): with one text part,
    all of them; with several, each part the entries whose tokens spell its text, in order, or
    none at all when they do not (an entry is never put on text that is not its token)."""
    texts = [(number, _shown_text(part)) for number, part in enumerate(parts)]
    texts = [(number, text) for number, text in texts if text]
    if not entries or not texts:
        return {}  # the tokens of thoughts or calls: no text of the answer shows them
    if len(texts) == 1:
        return {texts[0][0]: tuple(entries)}
    placed: dict[int, tuple[TokenLogprob, ...]] = {}
    at = 0
    for number, text in texts:
        spelled, start = "", at
        while at < len(entries) and len(spelled) < len(text):
            spelled += entries[at]["token"]
            at += 1
        if spelled != text:
            return {}
        placed[number] = tuple(entries[start:at])
    return placed


class GeminiStreamParser:
    """One response's chunks -> normalized stream events (candidate 0 only)."""

    __slots__ = ("_calls", "_next", "_pairs", "_saw_call", "_started", "_text", "_thinking")

    def __init__(self) -> None:
        self._pairs = SplitPairs()
        self._started = False
        self._next = 0  # the next block index
        self._text: int | None = None  # the open text block
        self._thinking: int | None = None  # the open (unsigned) thinking block
        self._saw_call = False
        self._calls: dict[tuple[str, str], int] = {}  # (name, arguments) -> how many so far

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        data = event.data
        chunk = self._pairs.event_object(data, "gemini chunk")
        try:
            return self._pairs.settle(self._chunk(chunk))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ParseError(f"gemini chunk has the wrong shape ({exc!r}): {excerpt(data)}") from None

    def _chunk(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        error = chunk.get("error")
        if error:
            if not isinstance(error, dict):
                return [ProviderErrorEvent("UNKNOWN", str(error))]
            return [
                ProviderErrorEvent(
                    str(error.get("status") or error.get("code") or "UNKNOWN"), str(error.get("message") or "")
                )
            ]
        out: list[StreamEvent] = []
        if not self._started:
            self._started = True
            out.append(
                MessageStart(message_id=chunk.get("responseId") or None, model=chunk.get("modelVersion") or None)
            )
        candidates = chunk.get("candidates") or []
        feedback = chunk.get("promptFeedback")
        if not candidates and isinstance(feedback, dict) and feedback.get("blockReason"):
            reason = str(feedback["blockReason"])
            return [*out, ProviderErrorEvent("PROMPT_BLOCKED", f"the prompt was blocked ({reason})")]
        usage = chunk.get("usageMetadata")
        if usage:  # first: the parts' frames then go out with the count that includes them
            out.append(UsageUpdate(_usage(usage)))
            details = usage_details(usage)
            if details:
                out.append(AnswerMetadata(GeminiMetadata(usageDetails=details)))
        finish: str | None = None
        for candidate in candidates:
            if candidate.get("index", 0) != 0:
                continue
            content = candidate.get("content") or {}
            parts = content.get("parts") or ()
            logprobs = _placed(chunk_logprobs(candidate.get("logprobsResult")), parts)
            for number, part in enumerate(parts):
                self._part(part, out, logprobs.get(number, ()))
            finish = candidate.get("finishReason") or None
            metadata = candidate_metadata(candidate)
            if metadata:
                out.append(AnswerMetadata(metadata))
        if finish is not None:
            self._finish(str(finish), out)
        return out

    def _open(self, kind: str, out: list[StreamEvent], **fields: Any) -> int:
        index = self._next
        self._next += 1
        out.append(BlockStart(index, kind, **fields))
        return index

    def _sign_thinking(self, signature: str, out: list[StreamEvent]) -> None:
        if self._thinking is not None:
            out.append(SignatureDelta(self._thinking, signature))
            out.append(BlockStop(self._thinking))
            self._thinking = None

    def _close_text(self, out: list[StreamEvent]) -> None:
        if self._text is not None:
            out.append(BlockStop(self._text))
            self._text = None

    def _part(self, part: dict[str, Any], out: list[StreamEvent], logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        signature = part.get("thoughtSignature")
        if signature is not None and type(signature) is not str:
            raise TypeError("thoughtSignature is not a string")
        if part.get("thought"):
            text = part.get("text") or ""
            if type(text) is not str:
                raise TypeError("text is not a string")
            if self._thinking is None and (text or signature):
                self._close_text(out)
                self._thinking = self._open("thinking", out)
            if text and self._thinking is not None:
                out.append(ThinkingDelta(self._thinking, text))
            if signature:
                self._sign_thinking(signature, out)
            return
        call = part.get("functionCall")
        if call is not None:
            self._call(call, signature, out)
            return
        if signature:
            self._sign_thinking(signature, out)
        text = part.get("text")
        if text:
            if type(text) is not str:
                raise TypeError("text is not a string")
            if self._text is None:
                self._text = self._open("text", out)
            out.append(TextDelta(self._text, text, logprobs))
        # other parts (inline data, executable code, ...) carry nothing this app shows or keeps

    def _call(self, call: dict[str, Any], signature: str | None, out: list[StreamEvent]) -> None:
        """A function call arrives whole: a complete tool_use block in one go."""
        name = call["name"]
        if type(name) is not str:
            raise TypeError("functionCall.name is not a string")
        args = call.get("args") or {}
        if not isinstance(args, dict):
            raise TypeError("functionCall.args is not an object")
        arguments = json.dumps(args, ensure_ascii=False)
        call_id = call.get("id")
        if not optional_strings(call_id):
            raise TypeError("functionCall.id is not a string")
        if not call_id:
            ordinal = self._calls.get((name, arguments), 0)
            self._calls[(name, arguments)] = ordinal + 1
            call_id = synthetic_call_id(name, arguments, ordinal)
        self._close_text(out)
        if signature:
            self._sign_thinking(signature, out)
        self._saw_call = True
        index = self._open("tool_use", out, id=str(call_id), name=name)
        if signature:
            out.append(SignatureDelta(index, signature))
        out.append(ToolArgsDelta(index, arguments))
        out.append(BlockStop(index))

    def _finish(self, finish: str, out: list[StreamEvent]) -> None:
        self._close_text(out)
        if self._thinking is not None:  # a thought run that was never signed: closed as it is
            out.append(BlockStop(self._thinking))
            self._thinking = None
        reason = FINISH_REASONS.get(finish, finish.lower())
        if reason == "end_turn" and self._saw_call:
            reason = "tool_use"
        out.append(StopReason(reason, finish))
        out.append(StreamEnd())


# -- requests -------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not content:
        return ""
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")


def _call_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """tool_use id -> function name: a ``functionResponse`` is matched by name."""
    names: dict[str, str] = {}
    for message in messages:
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, list):
            names.update((b["id"], b["name"]) for b in content if b.get("type") == "tool_use")
    return names


def _user_parts(content: Any, names: Mapping[str, str]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts: list[dict[str, Any]] = []
    for block in content:
        btype = block.get("type")
        if btype == "text":
            if block["text"]:
                parts.append({"text": block["text"]})
        elif btype == "tool_result":
            call_id = block["tool_use_id"]
            key = "error" if block.get("is_error") else "result"
            response: dict[str, Any] = {
                "name": names.get(call_id, call_id),
                "response": {key: _text_of(block.get("content"))},
            }
            if not call_id.startswith(SYNTHETIC_ID_PREFIX):
                response["id"] = call_id
            parts.append({"functionResponse": response})
        elif btype == "image" and isinstance(block.get("source"), dict) and block["source"].get("type") == "base64":
            source = block["source"]
            parts.append({"inlineData": {"mimeType": source["media_type"], "data": source["data"]}})
        else:
            parts.append({k: v for k, v in block.items() if k != "type"})  # assumed a Gemini part already
    return parts


def model_parts(content: Any) -> list[dict[str, Any]]:
    """Text, signed thought text (``thought: true``) and function calls with their signatures, and
    parts kept as a client sent them (``PART``). A thought run's signature that also rides on a call
    is sent once, on the call."""
    if isinstance(content, str):
        return [{"text": content}] if content else []
    call_signatures = {b.get("signature") for b in content if b.get("type") == "tool_use" and b.get("signature")}
    parts: list[dict[str, Any]] = []
    for block in content:
        btype = block.get("type")
        if btype == "text":
            if block["text"]:
                parts.append({"text": block["text"]})
        elif btype == "thinking":
            signature = block.get("signature") or ""
            part: dict[str, Any] = {"text": block.get("thinking", ""), "thought": True}
            if signature and signature not in call_signatures:
                part["thoughtSignature"] = signature
            if part["text"] or "thoughtSignature" in part:
                parts.append(part)
        elif btype == "tool_use":
            call: dict[str, Any] = {"name": block["name"], "args": block.get("input") or {}}
            if block.get("id") and not str(block["id"]).startswith(SYNTHETIC_ID_PREFIX):
                call["id"] = block["id"]
            part = {"functionCall": call}
            if block.get("signature"):
                part["thoughtSignature"] = block["signature"]
            parts.append(part)
        elif btype == PART:
            parts.append({k: v for k, v in block.items() if k != "type"})
        # redacted thinking and other providers' blocks: nothing Gemini can take
    return parts


def contents(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical messages -> ``contents``: ``user``/``model`` turns, one per run of a role."""
    names = _call_names(messages)
    out: list[dict[str, Any]] = []
    for message in messages:
        role = "model" if message["role"] == "assistant" else "user"
        if message["role"] == "assistant":
            parts = model_parts(message["content"])
        else:
            parts = _user_parts(message["content"], names)
        if not parts:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["parts"].extend(parts)
        else:
            out.append({"role": role, "parts": parts})
    return out


def method_url(base_url: str, model: str, *, stream: bool = True) -> str:
    """``streamGenerateContent?alt=sse`` (or ``generateContent``, one JSON answer) of ``model``."""
    name = path_segments(model)  # the name stays in its own path segments
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"{base_url.rstrip('/')}/{API_VERSION}/models/{name}:{method}"


def _retry_delay(error: Any) -> float | None:
    """``google.rpc.RetryInfo.retryDelay`` ("37s") from an error's details."""
    if not isinstance(error, dict):
        return None
    for detail in error.get("details") or ():
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.RetryInfo"):
            match = _DURATION.match(str(detail.get("retryDelay", "")))
            if match:
                return float(match.group(1))
    return None


THINKING_CONFIG_NAMES = ("thinkingConfig", "thinking_config")  # proto JSON takes either spelling
THINKING_BUDGET_NAMES = ("thinkingBudget", "thinking_budget")


def _thinking_config_name(extra: Mapping[str, Any]) -> str | None:
    """The name a ``thinkingConfig`` object in ``extra``'s ``generationConfig`` goes under (a
    proxied client's own), else None."""
    generation = extra.get("generationConfig")
    if not isinstance(generation, Mapping):
        return None
    return next((n for n in THINKING_CONFIG_NAMES if isinstance(generation.get(n), Mapping)), None)


class GeminiAdapter(ContinueMessageOnly):
    """Translates between the canonical conversation and ``streamGenerateContent``."""

    name = "gemini"

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    def build_request(self, request: ModelRequest) -> HTTPRequest:
        config = self.config
        headers = {
            "x-goog-api-key": config.api_key,
            "content-type": "application/json",
            "accept": "text/event-stream",
        }
        headers.update(config.extra_headers)
        generation: dict[str, Any] = {"maxOutputTokens": request.max_tokens}
        if request.temperature is not None:
            generation["temperature"] = request.temperature
        own_thinking = _thinking_config_name(request.extra)
        if request.thinking_budget is not None and own_thinking is None:
            generation["thinkingConfig"] = {"thinkingBudget": request.thinking_budget, "includeThoughts": True}
        body: dict[str, Any] = {"contents": contents(request.messages), "generationConfig": generation}
        if request.system:
            body["systemInstruction"] = {"parts": [{"text": request.system}]}
        if request.tools:
            declarations = [
                {"name": t.name, "description": t.description, "parametersJsonSchema": t.input_schema}
                for t in request.tools
            ]
            body["tools"] = [{"functionDeclarations": declarations}]
        for key, value in request.extra.items():  # objects merge one level deep (generationConfig)
            if isinstance(value, Mapping) and isinstance(body.get(key), dict):
                body[key] = {**body[key], **value}
            else:
                body[key] = value
        if request.thinking_budget is not None and own_thinking is not None:
            # a proxied client's own thinkingConfig: its fields as sent, its budget this call's
            # (lowered on a continuation as a run's is), under the spelling the client used
            thinking = dict(body["generationConfig"][own_thinking])
            name = next((n for n in THINKING_BUDGET_NAMES if n in thinking), THINKING_BUDGET_NAMES[0])
            thinking[name] = request.thinking_budget
            body["generationConfig"][own_thinking] = thinking
        return HTTPRequest("POST", method_url(config.base_url, request.model), headers, body)

    def new_parser(self) -> GeminiStreamParser:
        return GeminiStreamParser()

    def classify_http_error(self, status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
        """Status policy, refined by the body: a 429 for a daily or absent quota is permanent,
        a 400 over the context window is ``context_overflow``; ``RetryInfo`` is honoured."""
        _, error, message = read_error_body(status, body)
        kind, error_class = status_policy(status, _STATUS_POLICY)
        haystack = (json.dumps(error) if isinstance(error, dict) else message).lower()
        if status == 429 and any(m in haystack for m in _QUOTA_MARKERS):
            kind, error_class = "spend_limit", ErrorClass.PERMANENT
        elif status == 400 and any(m in message.lower() for m in _CONTEXT_MARKERS):
            kind = "context_overflow"
        error_class = with_should_retry(headers, error_class)
        retry_after = parse_retry_after(headers)
        if retry_after is None:
            retry_after = _retry_delay(error)
        status_name = error.get("status") if isinstance(error, dict) else None
        return ProviderError(
            error_class=error_class,
            kind=kind,
            message=f"{status_name}: {message}" if status_name else message,
            status=status,
            retry_after_s=retry_after,
            request_id=header_value(headers, "x-request-id"),
        )

    def classify_stream_error(self, event: ProviderErrorEvent) -> ProviderError:
        """A google.rpc status inside the stream: server trouble and rate limits are worth a
        continuation, anything else (a blocked prompt included) is permanent."""
        kind, error_class = _STREAM_STATUS.get(event.error_type.upper(), ("provider_error", ErrorClass.PERMANENT))
        return ProviderError(
            error_class=error_class,
            kind=kind,
            message=f"{event.error_type}: {event.message}",
            request_id=event.request_id,
        )

    @property
    def text_delta_is_token(self) -> bool:
        """A chunk carries many tokens; ``usageMetadata`` counts them."""
        return False

    @property
    def min_max_tokens(self) -> int:
        return 1

    def thinking_rule(self, model: str) -> ThinkingRule:
        return thinking_rule(model)
