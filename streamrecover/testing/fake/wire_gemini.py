"""A planned answer as Gemini's ``streamGenerateContent?alt=sse`` sends it, byte for byte.

Each event is ``data: {GenerateContentResponse}`` ended by ``\\r\\n\\r\\n`` (Google's framing), the JSON
with ``": "`` after keys and a bare ``,`` between members, as the API writes it. Every chunk carries
``candidates[0].content.parts``, the cumulative ``usageMetadata``, ``modelVersion`` and ``responseId``;
the last one carries the ``finishReason`` (there is no terminator event). Text pieces are grouped a few
to a chunk; function calls arrive whole, all of them in one chunk. With ``includeThoughts`` the answer
starts with ``thought: true`` parts; their ``thoughtSignature`` rides on the first function call when
there is one (as the API sends it), otherwise on the last thought part. A Gemini 3 model thinks
whether or not its thoughts are shown: its first function call is signed either way. Gemini 3,
2.5 Pro and 2.5 Flash think by default: asked for no thoughts, they think all the same, and that
hidden thinking is billed as the first chunk goes out, counted in ``thoughtsTokenCount`` and
``totalTokenCount`` from that chunk on, and takes its share of ``maxOutputTokens``. A positive
``thinkingBudget`` caps the thinking, shown or hidden (-1: the model's default amount); a budget
the model does not take (0 on 2.5 Pro, one outside a 2.5 model's range, one beside a Gemini 3
``thinkingLevel``) is the API's 400 ``INVALID_ARGUMENT``. A cited answer (``[[cite]]``) is one
grounded in a search: its last chunk carries the ``groundingMetadata`` (the sources as
``groundingChunks``, each cited span as a ``groundingSupports`` segment of UTF-8 byte offsets into this
response's text, the search queries and entry point) and a ``citationMetadata`` naming the first
source for the first span; a continuation's response grounds its own text, its offsets counted from
its own start. A refusal is a ``SAFETY`` stop with no content and the ``safetyRatings`` that blocked
it; the ``error`` fault with a finish reason as its type (``error:events=5,type=SAFETY``)
stops the answer there with that reason, as a content stop cuts a real answer short. Errors are
Google's ``{"error": {"code", "message", "status"}}``, pretty-printed, as the API sends them.
Every chunk's ``usageMetadata`` has the per-modality ``promptTokensDetails`` and, once there is
output, ``candidatesTokensDetails``. With ``generationConfig.responseLogprobs`` every chunk's candidate
carries a ``logprobsResult`` of that chunk's tokens (each piece is a token: thought text, answer text
and a call's alike), with ``topCandidates`` as many as ``logprobs`` asks, and the last one the answer's
``avgLogprobs``. With the URL context tool (``tools: [{"urlContext": {}}]``) the prompt's retrieved
pages are billed as ``toolUsePromptTokenCount`` (in the total, with its details) and the last chunk
names them in ``urlContextMetadata``.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Mapping
from typing import Any

from .model import BlockKind, Plan, PlannedBlock, sign_thinking, signature_valid, stable_token
from .wire import ErrorSpec, ResponseContext, WireEvent
from .wire_openai import Logprobs

PIECES_PER_CHUNK = 4
FINISH_STOPS = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "LANGUAGE", "OTHER", "MALFORMED_FUNCTION_CALL"}
)
_FINISH = {"end_turn": "STOP", "tool_use": "STOP", "max_tokens": "MAX_TOKENS", "refusal": "SAFETY"}
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_CODES = {name: code for code, name in _STATUS_NAMES.items() if code != 405}
_MESSAGES = {
    "RESOURCE_EXHAUSTED": "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
    "UNAVAILABLE": "The model is overloaded. Please try again later.",
    "INTERNAL": "An internal error has occurred. Please retry or report in "
    "https://developers.generativeai.google/guide/troubleshooting",
    "DEADLINE_EXCEEDED": "Deadline expired before operation could complete.",
    "NOT_FOUND": "models/unknown is not found for API version v1beta, or is not supported for generateContent.",
    "INVALID_ARGUMENT": "Request contains an invalid argument.",
}
_SAFETY_RATINGS = [
    {"category": "HARM_CATEGORY_SEXUALLY_EXPLICIT", "probability": "NEGLIGIBLE"},
    {"category": "HARM_CATEGORY_HATE_SPEECH", "probability": "NEGLIGIBLE"},
    {"category": "HARM_CATEGORY_HARASSMENT", "probability": "NEGLIGIBLE"},
    {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True},
]
BAD_JSON = ErrorSpec(400, "INVALID_ARGUMENT", "Invalid JSON payload received. Unexpected token.")
BAD_CONTENT_TYPE = BAD_JSON


def _json(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ": "))


def _event(payload: Any, *, tokens: int = 0, text: str = "") -> WireEvent:
    return WireEvent(f"data: {_json(payload)}\r\n\r\n".encode(), tokens, text)


def sign(thinking: str) -> str:
    """A thought signature (base64, as the API's bytes field is) the fake can verify later
    without the thought text: Gemini sends it back on a function call part, not beside the thought."""
    nonce = stable_token("gemini-thought", thinking, length=16)
    return base64.b64encode(nonce.encode() + base64.b64decode(sign_thinking(nonce))).decode()


def signs_every_call(model: str) -> bool:
    """Gemini 3 models think whether or not the request asks to see their thoughts, and their
    first function call of a turn always carries a signature, which must come back with it."""
    return model.startswith("gemini-3")


def thinks_unasked(model: str, thinking_config: Mapping[str, Any]) -> bool:
    """True when ``model`` thinks though the request does not ask to see its thoughts: Gemini 3,
    2.5 Pro and 2.5 Flash think by default, 2.5 Flash-Lite only when given a ``thinkingBudget``;
    a budget of 0 turns thinking off where a model allows it (not on Gemini 3 or 2.5 Pro)."""
    budget = thinking_config.get("thinkingBudget")
    if model.startswith("gemini-3") or model.startswith("gemini-2.5-pro"):
        return True
    if model.startswith("gemini-2.5-flash-lite"):
        return isinstance(budget, int) and budget != 0
    return model.startswith("gemini-2.5") and budget != 0


# The thinkingBudget each Gemini 2.5 model takes (Gemini API docs, "Gemini thinking"): a positive
# budget from ``lowest`` to ``highest``, -1 (dynamic), and 0 where thinking can be turned off.
# Flash-Lite before Flash: its name starts with Flash's.
_BUDGET_RANGES: tuple[tuple[str, int, int, bool], ...] = (
    ("gemini-2.5-pro", 128, 32768, False),
    ("gemini-2.5-flash-lite", 512, 24576, True),
    ("gemini-2.5-flash", 1, 24576, True),
)


def _budget(thinking_config: Mapping[str, Any]) -> int | None:
    budget = thinking_config.get("thinkingBudget")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else None


def budget_problem(model: str, thinking_config: Mapping[str, Any]) -> str | None:
    """The real API's 400 message for a ``thinkingBudget`` ``model`` does not take, else None:
    2.5 Pro cannot turn thinking off (0), and each 2.5 model has its range; a Gemini 3 model
    takes a ``thinkingLevel`` or a budget, not both. Other budgets are not checked."""
    budget = _budget(thinking_config)
    if model.startswith("gemini-3") and "thinkingBudget" in thinking_config and "thinkingLevel" in thinking_config:
        # Gemini 3 docs: the two are exclusive, a request with both is a 400 (wording ours)
        return "thinking_budget and thinking_level are not supported together."
    if budget is None or budget == -1:
        return None
    for prefix, lowest, highest, can_turn_off in _BUDGET_RANGES:
        if not model.startswith(prefix):
            continue
        if budget == 0:
            return None if can_turn_off else "Budget 0 is invalid. This model only works in thinking mode."
        return None if lowest <= budget <= highest else f"The thinking budget ({budget}) is invalid."
    return None


def thinking_off(model: str, thinking_config: Mapping[str, Any]) -> bool:
    """True when a budget of 0 turns ``model``'s thinking off (2.5 Flash and Flash-Lite): asked
    to show its thoughts all the same, it has none to show."""
    if _budget(thinking_config) != 0:
        return False
    return any(model.startswith(prefix) and off for prefix, _, _, off in _BUDGET_RANGES)


def thinking_cap(thinking_config: Mapping[str, Any]) -> int | None:
    """The most tokens a response thinks: a positive ``thinkingBudget`` (None for -1, dynamic:
    the model's default amount)."""
    budget = _budget(thinking_config)
    return budget if budget is not None and budget > 0 else None


def _shown_thinking(plan: Plan) -> PlannedBlock | None:
    return next((b for b in plan.blocks if b.kind is BlockKind.THINKING and not b.hidden), None)


def _hidden_thoughts(plan: Plan) -> int:
    """The tokens of the thinking the answer bills but does not send."""
    return sum(1 for b in plan.blocks if b.kind is BlockKind.THINKING and b.hidden for p in b.pieces if p)


def _signature(plan: Plan, ctx: ResponseContext, thinking: PlannedBlock | None) -> str | None:
    """The signature of the answer's thinking: of its thought text when it was shown, of the
    hidden thinking a Gemini 3 model's function call rests on otherwise."""
    if thinking is not None:
        return sign(thinking.content)
    if signs_every_call(ctx.model) and any(b.kind is BlockKind.TOOL_USE for b in plan.blocks):
        return sign(stable_token("gemini-hidden-thought", ctx.seed, length=22))
    return None


def signature_ok(signature: Any) -> bool:
    """A signature the fake made, in either base64 alphabet: the bytes field reads both, and
    google-genai sends a signature back URL-safe encoded whatever alphabet it arrived in."""
    if not isinstance(signature, str):
        return False
    try:
        raw = base64.b64decode(signature.replace("-", "+").replace("_", "/"), validate=True)
    except ValueError:
        return False
    nonce = raw[:16].decode("ascii", errors="replace")
    return signature_valid(nonce, base64.b64encode(raw[16:]).decode())


def response_id(ctx: ResponseContext) -> str:
    return stable_token("gemini-response", ctx.seed, length=22)


def _config(ctx: ResponseContext, name: str) -> Any:
    """``generationConfig.{name}`` in either spelling (proto JSON takes snake_case too)."""
    config = ctx.options.get("generationConfig") or ctx.options.get("generation_config") or {}
    if not isinstance(config, Mapping):
        return None
    snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)
    return config[name] if name in config else config.get(snake)


def url_context_tokens(ctx: ResponseContext) -> int:
    """The prompt tokens of the pages the URL context tool retrieved (0 without the tool): a
    few hundred, the same for the same request."""
    tools = ctx.options.get("tools")
    asked = isinstance(tools, list) and any(
        isinstance(t, Mapping) and ("urlContext" in t or "url_context" in t) for t in tools
    )
    return 200 + zlib.crc32(f"{ctx.seed}\x00url-context".encode()) % 300 if asked else 0


def _url_context(ctx: ResponseContext) -> dict[str, Any]:
    topic = stable_token("gemini-url-context", ctx.seed, length=10)
    pages = [f"https://example.com/{topic}/{n}" for n in range(2)]
    status = "URL_RETRIEVAL_STATUS_SUCCESS"
    return {"urlMetadata": [{"retrievedUrl": url, "urlRetrievalStatus": status} for url in pages]}


class _Scores:
    """A chunk's ``logprobsResult`` when the request set ``responseLogprobs`` (None otherwise):
    one ``chosenCandidates`` item per token with its ``tokenId``, and ``topCandidates`` when
    ``logprobs`` asks for alternatives (the chosen token first, as the likeliest). The values
    are those of the fake's OpenAI dialect: derived from the request and the token's place."""

    def __init__(self, ctx: ResponseContext) -> None:
        top = _config(ctx, "logprobs")
        self.on = _config(ctx, "responseLogprobs") is True
        self.top = top if isinstance(top, int) and not isinstance(top, bool) else 0
        self.scores = Logprobs(ctx.seed, self.top)
        self.chosen: list[float] = []  # every token's so far: the answer's ``avgLogprobs``

    def of(self, tokens: list[str]) -> dict[str, Any] | None:
        if not self.on:
            return None
        entries = [self.scores.entry(token, self.top) for token in tokens if token]
        self.chosen.extend(e["logprob"] for e in entries)
        result: dict[str, Any] = {}
        if entries and self.top:
            result["topCandidates"] = [{"candidates": [_scored(t) for t in e["top_logprobs"]]} for e in entries]
        if entries:
            result["chosenCandidates"] = [_scored(e) for e in entries]
        return result

    def average(self) -> dict[str, float]:
        return {"avgLogprobs": sum(self.chosen) / len(self.chosen)} if self.on and self.chosen else {}


def _scored(entry: Mapping[str, Any]) -> dict[str, Any]:
    token = str(entry["token"])
    return {"token": token, "tokenId": zlib.crc32(token.encode()) % 256_000, "logProbability": entry["logprob"]}


class _Writer:
    """Chunks with the cumulative usage every chunk carries."""

    def __init__(self, ctx: ResponseContext, plan: Plan) -> None:
        self.ctx = ctx
        self.thinking = any(b.kind is BlockKind.THINKING for b in plan.blocks)
        self.output = 0
        self.thoughts = _hidden_thoughts(plan)  # thought before the first chunk, counted on every one
        self.tool_use = url_context_tokens(ctx)

    def usage(self) -> dict[str, Any]:
        usage: dict[str, Any] = {"promptTokenCount": self.ctx.input_tokens}
        if self.output:
            usage["candidatesTokenCount"] = self.output
        usage["totalTokenCount"] = self.ctx.input_tokens + self.output + self.thoughts + self.tool_use
        usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": self.ctx.input_tokens}]
        if self.output:
            usage["candidatesTokensDetails"] = [{"modality": "TEXT", "tokenCount": self.output}]
        if self.tool_use:
            usage["toolUsePromptTokenCount"] = self.tool_use
            usage["toolUsePromptTokensDetails"] = [{"modality": "TEXT", "tokenCount": self.tool_use}]
        if self.thinking:
            usage["thoughtsTokenCount"] = self.thoughts
        return usage

    def chunk(self, candidate: Mapping[str, Any], *, tokens: int = 0, text: str = "") -> WireEvent:
        payload = {
            "candidates": [candidate],
            "usageMetadata": self.usage(),
            "modelVersion": self.ctx.model,
            "responseId": response_id(self.ctx),
        }
        return _event(payload, tokens=tokens, text=text)


def _content(parts: list[dict[str, Any]], finish: str | None = None, **more: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    candidate.update(more)
    return candidate


def _grounded(plan: Plan) -> dict[str, Any]:
    """A cited answer's grounding and citation metadata (nothing for another answer): each source
    supports a run of a few words of this response's text, its segment in UTF-8 byte offsets from
    the start of that text (``startIndex`` left out at 0, as proto JSON leaves out zeros)."""
    cited = next((b for b in plan.blocks if b.kind is BlockKind.TEXT and b.cited), None)
    if cited is None:
        return {}
    text = plan.text
    sources = [(str(c.get("url", "")), str(c.get("title", ""))) for c in cited.citations]
    if not sources:  # a continuation's: the first response gave the block's citations
        topic = stable_token("gemini-grounding", text, length=10)
        sources = [(f"https://example.com/{topic}-{n}", f"Source {n + 1}") for n in range(2)]
    words = [m.span() for m in re.finditer(r"\S+", text)]
    supports: list[dict[str, Any]] = []
    for number in range(len(sources)):
        run = words[number * 4 : number * 4 + 4]
        if not run:
            break
        start, end = run[0][0], run[-1][1]
        segment: dict[str, Any] = {"endIndex": len(text[:end].encode()), "text": text[start:end]}
        if start:
            segment = {"startIndex": len(text[:start].encode()), **segment}
        supports.append({"segment": segment, "groundingChunkIndices": [number]})
    query = " ".join(text.split()[:4])
    grounding = {
        "groundingChunks": [{"web": {"uri": uri, "title": title}} for uri, title in sources],
        "groundingSupports": supports,
        "webSearchQueries": [query],
        "searchEntryPoint": {"renderedContent": f'<div class="chip">{query}</div>'},
    }
    more: dict[str, Any] = {"groundingMetadata": grounding}
    if supports:
        span = {k: v for k, v in supports[0]["segment"].items() if k != "text"}
        more["citationMetadata"] = {"citationSources": [{**span, "uri": sources[0][0]}]}
    return more


def _groups(pieces: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [pieces[i : i + PIECES_PER_CHUNK] for i in range(0, len(pieces), PIECES_PER_CHUNK)]


def stream_events(plan: Plan, ctx: ResponseContext) -> list[WireEvent]:
    """Every chunk of the answer; the last one carries the finish reason."""
    thinking = _shown_thinking(plan)
    writer = _Writer(ctx, plan)
    if plan.stop_reason == "refusal":
        candidate = {"finishReason": "SAFETY", "index": 0, "safetyRatings": _SAFETY_RATINGS}
        return [writer.chunk(candidate)]
    calls = [b for b in plan.blocks if b.kind is BlockKind.TOOL_USE]
    signature = _signature(plan, ctx, thinking)
    # (parts, tokens, text, counter) per chunk, then the finish reason goes on the last
    pending: list[tuple[list[dict[str, Any]], list[str], str, str]] = []
    for block in plan.blocks:
        if block.kind is BlockKind.THINKING and block.hidden:
            continue
        if block.kind is BlockKind.THINKING:
            groups = _groups(block.pieces)
            for number, group in enumerate(groups):
                part: dict[str, Any] = {"text": "".join(group), "thought": True}
                if not calls and number == len(groups) - 1 and signature:
                    part["thoughtSignature"] = signature
                pending.append(([part], [p for p in group if p], "", "thoughts"))
        elif block.kind is BlockKind.TEXT:
            for group in _groups(block.pieces):
                text = "".join(group)
                pending.append(([{"text": text}], [p for p in group if p], text, "output"))
    if calls:
        parts = [_call_part(call, signature if i == 0 else None) for i, call in enumerate(calls)]
        tokens = [p for call in calls for p in call.pieces if p]
        pending.append((parts, tokens, "", "output"))
    finish = _FINISH.get(plan.stop_reason, "STOP")
    if not pending:
        pending.append(([{"text": ""}], [], "", "output"))
    scores = _Scores(ctx)
    events: list[WireEvent] = []
    for number, (parts, tokens, text, counter) in enumerate(pending):
        if counter == "thoughts":
            writer.thoughts += len(tokens)
        else:
            writer.output += len(tokens)
        last = number == len(pending) - 1
        scored = scores.of(tokens)
        more: dict[str, Any] = {} if scored is None else {"logprobsResult": scored}
        if last:
            more.update(scores.average())
            if calls:
                more["finishMessage"] = "Model generated function call(s)."
            more.update(_grounded(plan))
            if writer.tool_use:
                more["urlContextMetadata"] = _url_context(ctx)
        billed = len(tokens) + (_hidden_thoughts(plan) if number == 0 else 0)  # the hidden thinking, with the first
        events.append(writer.chunk(_content(parts, finish if last else None, **more), tokens=billed, text=text))
    return events


def _call_part(call: PlannedBlock, signature: str | None) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": call.name, "args": json.loads(call.content)}}
    if signature:
        part["thoughtSignature"] = signature
    return part


def response_json(plan: Plan, ctx: ResponseContext) -> dict[str, Any]:
    """The ``generateContent`` (non-streaming) body: every part in one response."""
    parts: list[dict[str, Any]] = []
    writer = _Writer(ctx, plan)
    signature = _signature(plan, ctx, _shown_thinking(plan))  # on the first call when there is one, as when streamed
    calls = any(b.kind is BlockKind.TOOL_USE for b in plan.blocks)
    for block in plan.blocks:
        count = sum(1 for p in block.pieces if p)
        if block.kind is BlockKind.THINKING and block.hidden:
            continue  # counted by the writer already
        if block.kind is BlockKind.THINKING:
            writer.thoughts += count
            part: dict[str, Any] = {"text": block.content, "thought": True}
            if not calls:
                part["thoughtSignature"] = sign(block.content)
            parts.append(part)
        elif block.kind is BlockKind.TEXT:
            writer.output += count
            parts.append({"text": block.content})
        else:
            writer.output += count
            parts.append(_call_part(block, signature))
            signature = None
    candidate = _content(parts, _FINISH.get(plan.stop_reason, "STOP"))
    return {
        "candidates": [candidate],
        "usageMetadata": writer.usage(),
        "modelVersion": ctx.model,
        "responseId": response_id(ctx),
    }


def _status_name(spec: ErrorSpec) -> str:
    if spec.error_type.isupper():
        return spec.error_type
    return _STATUS_NAMES.get(spec.status, "INTERNAL" if spec.status >= 500 else "INVALID_ARGUMENT")


def error_body(spec: ErrorSpec, request_id: str) -> bytes:
    error: dict[str, Any] = {"code": spec.status, "message": spec.message, "status": _status_name(spec)}
    if spec.details is not None:
        error["details"] = list(spec.details.get("details", []))
    return json.dumps({"error": error}, ensure_ascii=False, indent=2).encode()


def error_event(error_type: str | None, message: str | None, *, after: WireEvent | None = None) -> WireEvent:
    """A mid-stream error chunk (HTTP status stays 200), or, when ``error_type`` is a finish
    reason (``SAFETY``, ``RECITATION``, ...), the final chunk of a content stop: with the usage,
    model and response id of the chunk it comes ``after``, as every chunk of the answer has them."""
    if error_type in FINISH_STOPS:
        candidate: dict[str, Any] = {"content": {"parts": [{"text": ""}], "role": "model"}}
        candidate["finishReason"] = error_type
        candidate["index"] = 0
        if error_type == "SAFETY":
            candidate["safetyRatings"] = _SAFETY_RATINGS
        earlier = json.loads(after.data.decode().removeprefix("data: ")) if after is not None else {}
        kept = ("usageMetadata", "modelVersion", "responseId")
        return _event({"candidates": [candidate], **{k: earlier[k] for k in kept if k in earlier}})
    status = error_type or "UNAVAILABLE"
    error = {
        "code": _CODES.get(status, 500),
        "message": message or _MESSAGES.get(status, _MESSAGES["INTERNAL"]),
        "status": status,
    }
    return _event({"error": error})


def status_error(status: int, error_type: str | None, message: str | None, *, quota: bool) -> ErrorSpec:
    """An HTTP error; ``quota`` gives the daily-quota 429 that waiting does not fix."""
    name = error_type or _STATUS_NAMES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    details = None
    if status == 429:
        quota_id = (
            "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
            if quota
            else "GenerateRequestsPerMinutePerProjectPerModel"
        )
        details = {
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                            "quotaId": quota_id,
                        }
                    ],
                }
            ]
        }
    return ErrorSpec(status, name, message or _MESSAGES.get(name, _MESSAGES["INTERNAL"]), details=details)


def authenticate(headers: Mapping[str, str]) -> ErrorSpec | None:
    """Any non-empty ``x-goog-api-key`` passes; a request without one gets the real 403."""
    if headers.get("x-goog-api-key", "").strip():
        return None
    return ErrorSpec(
        403,
        "PERMISSION_DENIED",
        "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or "
        "other form of API consumer identity to call this API.",
    )


def check_headers(headers: Mapping[str, str]) -> ErrorSpec | None:
    return None


def response_headers(request_id: str) -> list[tuple[str, str]]:
    return [("x-request-id", request_id), ("server", "scaffolding on HTTPServer2")]
