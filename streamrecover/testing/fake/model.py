"""The fake provider's deterministic "model".

The planned answer is a pure function of the conversation, so an interrupted and
continued run can be compared with an uninterrupted one, byte for byte. It is built
from the last user text prompt; directives anywhere in that prompt steer it, and so do
those of the system prompt (where both give one, the prompt's wins), so a caller can steer
the fake without writing into a user's words:

``[[words=N]]``
    Length of the answer text in words (default 120; the short text before a tool call
    defaults to 12).
``[[text=...]]``
    The exact answer text (everything up to the next ``]]``), e.g. ``<script>x</script>``.
    With a tool directive it is the text before the call.
``[[tool]]`` / ``[[tool=NAME]]``
    When the request offers tools: a short text, then one call of the first offered tool
    (or of NAME, offered or not), stop reason ``tool_use``. Arguments are generated from
    the prompt and the tool's JSON schema.
``[[tools=N]]``
    N parallel calls (the offered tools in order, cycling; all NAME with ``[[tool=NAME]]``).
``[[refuse]]``
    A refusal (Anthropic: text + stop reason ``refusal``; OpenAI: ``delta.refusal``).
``[[seam=repeat]]`` / ``[[seam=repeat:N]]`` / ``[[seam=rephrase]]`` / ``[[seam=restart]]`` / ``[[seam=restart_new]]``
    A model that does not simply continue when asked to with a continue message (real
    models do this now and then): it repeats the last N words it wrote (default 3; a word
    cut in half is repeated whole), restates its unfinished sentence in other words
    before going on, starts the same answer over from its first word, or starts over and
    then says something else. Prefill and prefix-flag continuations carry on exactly.
``[[no_tool_after_break]]``
    A model that changes its mind: asked to go on after a break that cut its tool call
    off (no complete call in the prefix), it finishes its text and ends the turn
    (``end_turn``) instead of calling the tool again.
``[[partial_tool_at_limit]]``
    A model stopped by ``max_tokens`` inside a tool call's arguments sends them as far as
    they got, then the stop reason ``max_tokens`` and a clean end (OpenAI Chat; Anthropic
    with fine-grained tool streaming). Without it, or where calls arrive whole (Gemini, the
    Responses API), a call that does not fit is left out.
``[[cite]]``
    The answer text is one cited span (Anthropic: a text block that starts with
    ``"citations": []`` and gets two ``citations_delta`` before its text, as web search
    answers do; Gemini: an answer grounded in a search, its last chunk carrying the
    ``groundingMetadata`` and a ``citationMetadata``; Responses, when the request offers the
    ``web_search`` tool: a ``web_search_call`` item, then text with ``url_citation``
    annotations). A continuation of it goes on in a cited block without citations again (Gemini:
    grounding its own text; Responses: annotating its own text, without searching again).
``[[search]]`` / ``[[search=N]]``
    When the request offers Anthropic's ``web_search`` server tool: a short text, then N
    searches (default 1), each a ``server_tool_use`` block and its ``web_search_tool_result``,
    then the answer as one cited span. With a tool directive the searches come between the short
    text and the call (a turn that searches, then asks for a client tool).
``[[pause]]``
    With ``[[search]]``: the API pauses the turn (stop reason ``pause_turn``) right after each
    search call, before running it. The paused answer sent back as it is, as the last assistant
    message, gets the rest of the answer up to the next pause: the search's result first. The
    answer so far may also come in several messages, one per continue-message round before it
    (``read_anthropic``): the model goes on from all of them.
``[[no_continuation_thinking]]``
    With thinking enabled, a continuation starts without a thinking block. The real API
    starts every response with one, a continuation included: that is the default.
``[[think=N]]``
    Length of the answer's thinking in words (default 30), so a thinking budget has something
    to cap: a request's budget (Gemini's ``thinkingBudget``) cuts the thinking there.

When the last user turn carries tool results, the answer is a final text that names each
result ("NAME returned: ..."), then generated words. With thinking enabled (and a text
prompt, not tool results) a thinking block comes first, on a continuation too (a new one,
about going on); its signature is an HMAC of its text, so a block sent back in history can
be verified byte-exact. A model that thinks without being asked to show it (Gemini's thinking
models) plans the same block, hidden: billed and counted against ``max_tokens``, never sent.

Generated text contains multi-byte UTF-8 (``café``, ``日本語``, ``🚀`` within the first six
words) and newlines, so byte cuts land inside characters. Every block is pre-split into
deltas ("tokens"): text 1-6 characters, thinking 3-12, tool arguments 2-8 (partial JSON).
A continuation slices the same pieces, so token counts add up across attempts.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

DEFAULT_WORDS = 120
DEFAULT_THINKING_WORDS = 30
MAX_SEARCHES = 50
DEFAULT_TOOL_PREAMBLE_WORDS = 12
MAX_WORDS = 5000
REFUSAL_TEXT = "I'm sorry, but I can't help with that request."

_SIGNING_KEY = b"streamrecover-fake-provider/thinking-signature/v1"
_DIRECTIVE = re.compile(r"\[\[(\w+)(?:=(.*?))?\]\]", re.DOTALL)
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_PLAIN_WORDS = (
    "the", "stream", "model", "answer", "recovers", "quietly", "after", "every", "break", "and",
    "continues", "from", "where", "it", "stopped", "a", "river", "bridge", "window", "garden",
    "signal", "carries", "bright", "steady", "careful", "detail", "pattern", "message", "partial",
    "token", "between", "under", "across", "before", "simple", "reason", "value", "thought",
    "light", "north", "small", "open", "line", "paper", "stone", "music", "letter", "clear",
)  # fmt: skip
_SPICE_WORDS = ("café", "naïve", "résumé", "Zürich", "façade", "日本語", "東京", "🚀", "🙂", "✨")
_FORCED_WORDS = {1: "café", 3: "日本語", 5: "🚀"}


class BlockKind(enum.StrEnum):
    THINKING = "thinking"
    TEXT = "text"
    TOOL_USE = "tool_use"
    SERVER_TOOL_USE = "server_tool_use"  # a search the API runs itself (Anthropic's web_search)
    SEARCH_RESULT = "web_search_tool_result"  # its result, sent whole


PAUSE_TURN = "pause_turn"
WEB_SEARCH = "web_search"


@dataclass(frozen=True, slots=True)
class ToolOffer:
    """A tool the request offers; ``schema`` is the JSON schema of its arguments."""

    name: str
    schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call found in history; ``arguments`` is JSON text."""

    id: str
    name: str
    arguments: str

    def same_call(self, name: str, arguments: str) -> bool:
        """Equal name and equal parsed arguments (ids and JSON spacing may differ)."""
        return self.name == name and _loads(self.arguments) == _loads(arguments)


@dataclass(frozen=True, slots=True)
class ToolResult:
    tool_use_id: str
    name: str
    content: str


@dataclass(frozen=True, slots=True)
class Turn:
    """One merged turn of the conversation, reduced to what the model reads."""

    role: str  # "user" | "assistant"
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()


@dataclass(frozen=True, slots=True)
class Conversation:
    turns: tuple[Turn, ...]
    tools: tuple[ToolOffer, ...] = ()
    thinking: bool = False
    system: str = ""  # the system prompt's text: its directives apply, its words are not the topic
    # a model that thinks without being asked to show it (Gemini's thinking models): the same
    # thinking block, billed as output and bounded by max_tokens, but never sent
    hidden_thinking: bool = False
    # the most tokens each response may think (Gemini's positive ``thinkingBudget``), shown or not
    thinking_budget: int | None = None
    web_search: bool = False  # the request offers Anthropic's web_search server tool


@dataclass(frozen=True, slots=True)
class PlannedBlock:
    """One content block of the answer, already split into its deltas."""

    kind: BlockKind
    pieces: tuple[str, ...]
    signature: str = ""  # thinking
    hidden: bool = False  # thinking the response bills but does not send
    call_id: str = ""  # tool_use
    name: str = ""  # tool_use
    cited: bool = False  # text: a cited span (Anthropic citations)
    citations: tuple[Mapping[str, Any], ...] = ()  # text: sent before its text
    results: tuple[Mapping[str, Any], ...] = ()  # a search result block's results (``call_id``: its call)

    @property
    def content(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True, slots=True)
class Plan:
    blocks: tuple[PlannedBlock, ...]
    stop_reason: str  # "end_turn" | "tool_use" | "refusal" | "max_tokens" | "pause_turn"

    @property
    def text(self) -> str:
        return "".join(b.content for b in self.blocks if b.kind is BlockKind.TEXT)

    @property
    def output_tokens(self) -> int:
        """The number of non-empty content deltas: what the fake bills as output tokens."""
        return sum(1 for b in self.blocks for p in b.pieces if p)


@dataclass(frozen=True, slots=True)
class Directives:
    words: int | None = None
    think: int | None = None  # words of thinking
    text: str | None = None
    tool: str | None = None  # explicit tool name
    tools: int = 0  # number of tool calls wanted
    refuse: bool = False
    no_tool_after_break: bool = False
    no_continuation_thinking: bool = False
    partial_tool_at_limit: bool = False
    cite: bool = False
    search: int = 0  # web searches the answer makes (with the web_search server tool offered)
    pause: bool = False  # the API pauses the turn after each search call
    seam: str = ""  # repeat, rephrase, restart, restart_new (continue-message continuations)
    seam_words: int = 3
    topic: str = ""  # the prompt without directives

    @classmethod
    def parse(cls, prompt: str) -> Directives:
        values: dict[str, Any] = {"topic": " ".join(_DIRECTIVE.sub(" ", prompt).split())}
        for name, raw in _DIRECTIVE.findall(prompt):
            if name == "words" and raw.strip().isdigit():
                values["words"] = max(1, min(MAX_WORDS, int(raw)))
            elif name == "think" and raw.strip().isdigit():
                values["think"] = max(1, min(MAX_WORDS, int(raw)))
            elif name == "text" and raw:
                values["text"] = raw
            elif name == "tool":
                values["tools"] = max(values.get("tools", 0), 1)
                if raw.strip():
                    values["tool"] = raw.strip()
            elif name == "tools" and raw.strip().isdigit():
                values["tools"] = max(1, min(16, int(raw)))
            elif name == "refuse":
                values["refuse"] = True
            elif name == "cite":
                values["cite"] = True
            elif name == "search":
                values["search"] = max(1, min(MAX_SEARCHES, int(raw))) if raw.strip().isdigit() else 1
            elif name == "pause":
                values["pause"] = True
            elif name == "no_tool_after_break":
                values["no_tool_after_break"] = True
            elif name == "no_continuation_thinking":
                values["no_continuation_thinking"] = True
            elif name == "partial_tool_at_limit":
                values["partial_tool_at_limit"] = True
            elif name == "seam" and raw.strip():
                kind, _, count = raw.strip().partition(":")
                if kind in SEAMS:
                    values["seam"] = kind
                if count.strip().isdigit():
                    values["seam_words"] = max(1, min(50, int(count)))
        return cls(**values)

    @classmethod
    def of(cls, conversation: Conversation) -> Directives:
        """The directives of the system prompt, then of the conversation's last user text prompt
        (which win where both give one); the topic is the prompt's alone."""
        prompt = _prompt(conversation.turns)
        system = cls.parse(conversation.system)
        own = cls.parse(prompt)
        if not _DIRECTIVE.search(conversation.system):
            return own
        defaults = cls()
        return replace(
            own,
            **{
                f.name: getattr(system, f.name)
                for f in fields(cls)
                if f.name != "topic" and getattr(own, f.name) == getattr(defaults, f.name)
            },
        )


def _prompt(turns: Sequence[Turn]) -> str:
    return next((t.text for t in reversed(turns) if t.role == "user" and t.text), "")


def plan_answer(conversation: Conversation, *, tool_id_prefix: str = "toolu_") -> Plan:
    """The full answer to a conversation that ends with a user turn."""
    turns = conversation.turns
    prompt = _prompt(turns)
    directives = Directives.of(conversation)
    last = turns[-1] if turns else Turn("user")
    if last.tool_results:
        return Plan((_text_block(_after_tools_text(prompt, directives, last.tool_results)),), "end_turn")
    if directives.refuse:
        return Plan((_text_block(REFUSAL_TEXT),), "refusal")
    blocks: list[PlannedBlock] = []
    if conversation.thinking or conversation.hidden_thinking:
        blocks.append(replace(_thinking_block(prompt, directives), hidden=conversation.hidden_thinking))
    names = _tool_names(directives, conversation.tools)
    if names:
        text = directives.text or generate_text(prompt, directives.words or DEFAULT_TOOL_PREAMBLE_WORDS)
        blocks.append(_text_block(text))
        if conversation.web_search and directives.search:
            blocks.extend(_search_blocks(prompt, directives.topic, directives.search))
        schemas = {t.name: t.schema for t in conversation.tools}
        for index, name in enumerate(names):
            blocks.append(_tool_block(prompt, directives.topic, name, schemas.get(name, {}), index, tool_id_prefix))
        return Plan(tuple(blocks), "tool_use")
    if conversation.web_search and directives.search:
        blocks.append(_text_block(generate_text(prompt, DEFAULT_TOOL_PREAMBLE_WORDS)))
        blocks.extend(_search_blocks(prompt, directives.topic, directives.search))
    text = directives.text or generate_text(prompt, directives.words or DEFAULT_WORDS)
    cited = directives.cite or (conversation.web_search and directives.search > 0)
    blocks.append(_cited_block(text, directives.topic) if cited else _text_block(text))
    return Plan(tuple(blocks), "end_turn")


def paused_part(plan: Plan, start: int = 0) -> Plan:
    """What one response of a turn the API pauses after each search call sends: the answer's
    blocks from ``start`` up to and including the next search call (stop reason ``pause_turn``),
    or to the end of the answer."""
    rest = plan.blocks[start:]
    call = next((i for i, b in enumerate(rest) if b.kind is BlockKind.SERVER_TOOL_USE), None)
    if call is None:
        return Plan(rest, plan.stop_reason)
    return Plan(rest[: call + 1], PAUSE_TURN)


def continue_plan(
    plan: Plan,
    prefix_text: str,
    prefix_calls: Sequence[ToolCall] = (),
    *,
    drop_tools: bool = False,
    thinking_about: str | None = None,
    hidden_thinking: bool = False,
) -> tuple[Plan, bool]:
    """What a model asked to go on after an assistant prefix says: only the rest.

    Returns ``(rest, True)`` when the prefix matches the plan, else ``(plan without its
    thinking block, False)``: a model that does not recognise its own words starts over,
    which is what exposes a recovery bug. ``thinking_about`` (the prompt, when thinking is
    enabled): either way the response starts with a new signed thinking block, as the real
    API's every response does (``hidden_thinking``: one the response bills but does not send).
    ``drop_tools`` (``[[no_tool_after_break]]``): when the prefix holds no complete call, the
    rest has no call either and ends the turn.
    """
    rest_plan, matched = _continue_plan(plan, prefix_text, prefix_calls, drop_tools=drop_tools)
    if thinking_about is None:
        return rest_plan, matched
    thinking = replace(_continuation_thinking_block(thinking_about, prefix_text), hidden=hidden_thinking)
    return Plan((thinking, *rest_plan.blocks), rest_plan.stop_reason), matched


def _continue_plan(
    plan: Plan, prefix_text: str, prefix_calls: Sequence[ToolCall], *, drop_tools: bool
) -> tuple[Plan, bool]:
    blocks = tuple(b for b in plan.blocks if b.kind is not BlockKind.THINKING)
    restart = Plan(blocks, plan.stop_reason)
    text_block = next((b for b in blocks if b.kind is BlockKind.TEXT), None)
    calls = [b for b in blocks if b.kind is BlockKind.TOOL_USE]
    text = text_block.content if text_block else ""
    if not text.startswith(prefix_text) or len(prefix_calls) > len(calls):
        return restart, False
    if prefix_calls and prefix_text != text:
        return restart, False
    if not all(seen.same_call(b.name, b.content) for seen, b in zip(prefix_calls, calls, strict=False)):
        return restart, False
    rest: list[PlannedBlock] = []
    if text_block is not None and len(prefix_text) < len(text):
        rest.append(slice_block(text_block, len(prefix_text)))
    # what follows the text: its calls (less those the prefix holds), or a search answer's searches
    later = blocks[blocks.index(text_block) + 1 :] if text_block is not None else blocks
    sent = {id(b) for b in calls[: len(prefix_calls)]}
    dropped = drop_tools and not prefix_calls
    rest.extend(b for b in later if id(b) not in sent and not (dropped and b.kind is BlockKind.TOOL_USE))
    stop = plan.stop_reason
    if stop == "tool_use" and not any(b.kind is BlockKind.TOOL_USE for b in rest):
        stop = "end_turn"
    return Plan(tuple(rest), stop), True


def limit_plan(plan: Plan, max_tokens: int, *, partial_tools: bool = False) -> Plan:
    """The answer cut at ``max_tokens`` output tokens (non-empty pieces), stop reason
    ``max_tokens``, as a real model stops there. A thinking block cut short is signed as
    it stands; a tool call that does not fit whole is left out, or, with ``partial_tools``,
    sent as far as its arguments got (broken JSON, as a streaming API sends it)."""
    if plan.output_tokens <= max_tokens:
        return plan
    left = max_tokens
    blocks: list[PlannedBlock] = []
    for block in plan.blocks:
        count = sum(1 for p in block.pieces if p)
        if count <= left:
            blocks.append(block)
            left -= count
            continue
        whole_only = block.kind is BlockKind.SERVER_TOOL_USE or (block.kind is BlockKind.TOOL_USE and not partial_tools)
        if not whole_only and left > 0:
            pieces: list[str] = []
            for piece in block.pieces:
                if piece and left == 0:
                    break
                pieces.append(piece)
                left -= 1 if piece else 0
            signature = sign_thinking("".join(pieces)) if block.kind is BlockKind.THINKING else block.signature
            blocks.append(replace(block, pieces=tuple(pieces), signature=signature))
        break
    return Plan(tuple(blocks), "max_tokens")


def cap_thinking(plan: Plan, budget: int) -> Plan:
    """The answer with each thinking block cut at ``budget`` tokens (non-empty pieces), signed as it
    stands: a model given a thinking budget stops thinking there and answers."""
    blocks: list[PlannedBlock] = []
    for block in plan.blocks:
        if block.kind is BlockKind.THINKING and sum(1 for p in block.pieces if p) > budget:
            pieces: list[str] = []
            for piece in block.pieces:
                if piece and sum(1 for p in pieces if p) == budget:
                    break
                pieces.append(piece)
            block = replace(block, pieces=tuple(pieces), signature=sign_thinking("".join(pieces)))
        blocks.append(block)
    return Plan(tuple(blocks), plan.stop_reason)


SEAMS = ("repeat", "rephrase", "restart", "restart_new")


def seam_plan(plan: Plan, rest: Plan, prefix_text: str, directives: Directives, prompt: str) -> Plan:
    """What a model that does not simply continue says instead of ``rest`` (``plan`` is the
    whole answer, ``prefix_text`` what it already wrote of its text)."""
    seam = directives.seam
    if not seam or not prefix_text:
        return rest
    whole = tuple(b for b in plan.blocks if b.kind is not BlockKind.THINKING)
    if seam == "restart":
        return Plan(whole, plan.stop_reason)
    if seam == "restart_new":
        text = next((b.content for b in whole if b.kind is BlockKind.TEXT), "")
        head = text[: max(text.find(" ", 40), 40)] if len(text) > 40 else text
        other = head + " " + generate_text(prompt + "\x00another answer", max(8, len(text.split()) // 2))
        blocks = tuple(_text_block(other) if b.kind is BlockKind.TEXT else b for b in whole)
        return Plan(blocks, plan.stop_reason)
    text_index = next((i for i, b in enumerate(rest.blocks) if b.kind is BlockKind.TEXT), None)
    tail = rest.blocks[text_index].content if text_index is not None else ""
    if seam == "repeat":
        starts = [m.start() for m in re.finditer(r"\S+", prefix_text)]
        lead = prefix_text[starts[-directives.seam_words] if len(starts) >= directives.seam_words else 0 :]
    else:  # rephrase: finish the word, then say the unfinished sentence again, differently
        completion = re.match(r"\w*", tail)
        word_end = completion.end() if completion else 0
        sentence = re.split(r"[.!?\n]", prefix_text + tail[:word_end])[-1]
        words = [w.lower() for w in sentence.split()]
        lead, tail = tail[:word_end] + " (in other words: " + " ".join(reversed(words)) + ")", tail[word_end:]
    # a cited span goes on cited (its citations given already), as a plain continuation of it does
    cited = text_index is not None and rest.blocks[text_index].cited
    new_text = replace(_text_block(lead + tail), cited=cited)
    if text_index is None:
        return Plan((new_text, *rest.blocks), rest.stop_reason)
    edited = list(rest.blocks)
    edited[text_index] = new_text
    return Plan(tuple(edited), rest.stop_reason)


def sign_thinking(thinking: str) -> str:
    """The signature of a thinking block: proves later that the text came back unmodified."""
    mac = hmac.new(_SIGNING_KEY, thinking.encode(), hashlib.sha256).digest()
    return base64.b64encode(b"\x12\x20fake" + mac).decode()


_TRUSTED: set[tuple[str, str]] = set()


def trust_signature(thinking: str, signature: str) -> None:
    """Accept a recorded thinking block's real signature when it comes back in history."""
    _TRUSTED.add((thinking, signature))


def signature_valid(thinking: str, signature: str) -> bool:
    return (thinking, signature) in _TRUSTED or hmac.compare_digest(sign_thinking(thinking), signature)


def generate_text(seed: str, words: int, *, about: str | None = None) -> str:
    """Deterministic prose of ``words`` words, seeded by ``seed``, now and then using words
    of ``about`` (default: the seed); never ends in whitespace."""
    rng = _rng("text", seed)
    source = _DIRECTIVE.sub(" ", seed if about is None else about)
    topic = tuple(dict.fromkeys(re.findall(r"\w{3,}", source))) or _PLAIN_WORDS
    out: list[str] = []
    sentence_left, sentence_no, capital = 6, 0, True
    for i in range(words):
        roll = rng.random()
        word = _FORCED_WORDS.get(i) or (
            rng.choice(topic) if roll < 0.12 else rng.choice(_SPICE_WORDS) if roll < 0.2 else rng.choice(_PLAIN_WORDS)
        )
        if capital:
            word, capital = word[:1].upper() + word[1:], False
        out.append(word)
        sentence_left -= 1
        if i == words - 1:
            out.append(".")
        elif sentence_left == 0:
            out.append("." + ("\n" if sentence_no == 0 else rng.choice((" ", " ", "\n\n"))))
            sentence_left, sentence_no, capital = rng.randint(5, 11), sentence_no + 1, True
        else:
            out.append(", " if rng.random() < 0.06 else " ")
    return "".join(out)


def split_pieces(text: str, low: int, high: int) -> tuple[str, ...]:
    """Deterministic delta boundaries for ``text`` (``low``..``high`` characters each)."""
    rng = _rng("split", text)
    pieces: list[str] = []
    i = 0
    while i < len(text):
        n = rng.randint(low, high)
        pieces.append(text[i : i + n])
        i += n
    return tuple(pieces)


def stable_token(*parts: str, length: int = 24) -> str:
    """A base62 string derived from ``parts`` (ids that are the same for the same input)."""
    number = int.from_bytes(hashlib.sha256("\x00".join(parts).encode()).digest(), "big")
    chars = []
    for _ in range(length):
        number, digit = divmod(number, 62)
        chars.append(_B62[digit])
    return "".join(chars)


def _rng(purpose: str, seed: str) -> random.Random:
    digest = hashlib.sha256(f"{purpose}\x00{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _text_block(text: str) -> PlannedBlock:
    return PlannedBlock(BlockKind.TEXT, split_pieces(text, 1, 6))


def _cited_block(text: str, topic: str) -> PlannedBlock:
    """A text block citing two search results (what a web search answer's cited span carries)."""
    words = text.split()
    citations = tuple(
        {
            "type": "web_search_result_location",
            "cited_text": " ".join(words[n : n + 8]),
            "url": f"https://example.com/{stable_token('cite', topic, str(n), length=10)}",
            "title": f"Source {n + 1} on {topic[:40] or 'this'}",
            "encrypted_index": stable_token("cite-index", text, str(n), length=32),
        }
        for n in range(2)
    )
    return PlannedBlock(BlockKind.TEXT, split_pieces(text, 1, 6), cited=True, citations=citations)


def _search_blocks(prompt: str, topic: str, searches: int) -> list[PlannedBlock]:
    """``searches`` web searches: each call (its query streamed like a tool call's arguments)
    and its result, one page found, as the API sends them."""
    subject = " ".join(topic.split()[:5]) or "fake"
    blocks: list[PlannedBlock] = []
    for n in range(searches):
        call_id = "srvtoolu_01" + stable_token("search", prompt, str(n), length=22)
        query = json.dumps({"query": subject if n == 0 else f"{subject} #{n + 1}"}, ensure_ascii=False)
        blocks.append(
            PlannedBlock(BlockKind.SERVER_TOOL_USE, split_pieces(query, 2, 8), call_id=call_id, name=WEB_SEARCH)
        )
        found = {
            "type": "web_search_result",
            "title": f"Result {n + 1} on {topic[:40] or 'this'}",
            "url": f"https://example.com/{stable_token('search-url', prompt, str(n), length=10)}",
            "encrypted_content": stable_token("search-content", prompt, str(n), length=48),
            "page_age": None,
        }
        blocks.append(PlannedBlock(BlockKind.SEARCH_RESULT, (), call_id=call_id, name=WEB_SEARCH, results=(found,)))
    return blocks


def _thinking_block(prompt: str, directives: Directives) -> PlannedBlock:
    about = directives.topic[:80] or "this"
    words = directives.think or DEFAULT_THINKING_WORDS
    thinking = f"Let me think about {about}.\n" + generate_text("thinking\x00" + prompt, words, about=prompt)
    return PlannedBlock(BlockKind.THINKING, split_pieces(thinking, 3, 12), signature=sign_thinking(thinking))


def _continuation_thinking_block(prompt: str, prefix_text: str) -> PlannedBlock:
    tail = " ".join(prefix_text.split()[-6:]) or "the start"
    thinking = f"My answer was cut off after “{tail}”. I will go on from exactly there.\n" + generate_text(
        "continuation-thinking\x00" + prompt + "\x00" + prefix_text, 12, about=prompt
    )
    return PlannedBlock(BlockKind.THINKING, split_pieces(thinking, 3, 12), signature=sign_thinking(thinking))


def _tool_block(prompt: str, topic: str, name: str, schema: Mapping[str, Any], index: int, prefix: str) -> PlannedBlock:
    arguments = json.dumps(_tool_arguments(prompt, topic, name, schema, index), ensure_ascii=False)
    call_id = prefix + stable_token("tool", prompt, name, str(index))
    return PlannedBlock(BlockKind.TOOL_USE, split_pieces(arguments, 2, 8), call_id=call_id, name=name)


def _tool_names(directives: Directives, offered: Sequence[ToolOffer]) -> list[str]:
    if not directives.tools or not offered:
        return []
    if directives.tool:
        return [directives.tool] * directives.tools
    return [offered[i % len(offered)].name for i in range(directives.tools)]


def _tool_arguments(prompt: str, topic: str, name: str, schema: Mapping[str, Any], index: int) -> dict[str, Any]:
    rng = _rng(f"args\x00{name}\x00{index}", prompt)
    subject = " ".join(topic.split()[:5]) or "fake"
    if index:
        subject = f"{subject} #{index + 1}"
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping) or not properties:
        return {"query": subject}
    arguments: dict[str, Any] = {}
    used_subject = False
    for key, spec in list(properties.items())[:8]:
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        if isinstance(spec, Mapping) and isinstance(spec.get("enum"), list) and spec["enum"]:
            arguments[key] = spec["enum"][0]
        elif kind == "integer":
            arguments[key] = rng.randint(1, 100)
        elif kind == "number":
            arguments[key] = round(rng.uniform(0, 100), 1)
        elif kind == "boolean":
            arguments[key] = True
        elif kind == "array":
            arguments[key] = [subject]
        elif kind == "object":
            arguments[key] = {}
        elif used_subject:
            arguments[key] = rng.choice(_PLAIN_WORDS + _SPICE_WORDS)
        else:
            arguments[key], used_subject = subject, True
    return arguments


def _after_tools_text(prompt: str, directives: Directives, results: Sequence[ToolResult]) -> str:
    lines = []
    for result in results:
        content = " ".join(result.content.split())[:200] or "(empty)"
        lines.append(f"{result.name or 'The tool'} returned: {content}")
    seed = prompt + "\x00" + "\x00".join(r.content for r in results)
    return "\n".join(lines) + "\n\n" + generate_text(seed, directives.words or DEFAULT_WORDS, about=prompt)


def slice_block(block: PlannedBlock, offset: int) -> PlannedBlock:
    """The block's pieces after ``offset`` characters (the piece holding it is cut there).

    A prefix ends inside a piece only where the caller left out the piece's trailing
    whitespace (a prefill may not end with whitespace). Left-out spaces go with the next piece,
    as a tokenizer reads " word" as one token: the continuation does not bill them as a token
    of their own after the first response billed the piece they ended. A left-out line break
    is a piece of its own, written and billed again, as a real model does."""
    pieces: list[str] = []
    start = 0
    carry = ""
    for piece in block.pieces:
        end = start + len(piece)
        if end > offset:
            rest = carry + piece[max(0, offset - start) :]
            carry = ""
            if start < offset and rest.isspace() and "\n" not in rest:
                carry = rest  # the cut piece's left-out whitespace: joins the next piece
            else:
                pieces.append(rest)
        start = end
    if carry:
        pieces.append(carry)  # nothing follows it: the whitespace alone
    # a cited span goes on cited, its citations already given (unless nothing of it was)
    return replace(block, pieces=tuple(pieces), citations=block.citations if offset == 0 else ())


# What a continue-instruction message costs as input besides its own words: the finished
# assistant message it follows and its own message framing.
CONTINUE_FRAMING_TOKENS = 6


def input_tokens(
    conversation: Conversation,
    plan: Plan,
    *,
    prefix_text: str = "",
    prefix_calls: Sequence[ToolCall] = (),
    instructions: Sequence[str] = (),
    system: str = "",
) -> int:
    """The input tokens of a request, counted as consistently as the output is billed: re-sending
    a prefix as input costs the pieces it covers, what generating it cost (``plan`` is the whole
    answer the prefix is read against; a prefix that is not the plan's counts its own pieces).
    A prefill adds nothing else (the assistant turn's header is in every request); each continue
    instruction costs its own pieces and ``CONTINUE_FRAMING_TOKENS``."""
    count = 3 + _text_tokens(system)
    for turn in conversation.turns:
        count += 4 + _text_tokens(turn.text)
        count += sum(2 + _text_tokens(c.name + c.arguments) for c in turn.tool_calls)
        count += sum(2 + _text_tokens(r.content) for r in turn.tool_results)
    for tool in conversation.tools:
        count += 4 + _text_tokens(tool.name + json.dumps(tool.schema, sort_keys=True))
    count += prefix_tokens(plan, prefix_text, prefix_calls)
    count += sum(len(split_pieces(text, 1, 6)) + CONTINUE_FRAMING_TOKENS for text in instructions)
    return max(1, count)


def prefix_tokens(plan: Plan, prefix_text: str, prefix_calls: Sequence[ToolCall] = ()) -> int:
    """The output tokens (pieces) of the plan that ``prefix_text`` and ``prefix_calls`` cover; a
    piece cut by the prefix's end counts whole (it was billed whole)."""
    count = 0
    pieces = [p for b in plan.blocks if b.kind is BlockKind.TEXT for p in b.pieces]
    if prefix_text and "".join(pieces).startswith(prefix_text):
        start = 0
        for piece in pieces:
            if start >= len(prefix_text):
                break
            count += 1 if piece else 0
            start += len(piece)
    elif prefix_text:
        count += len(split_pieces(prefix_text, 1, 6))
    calls = [b for b in plan.blocks if b.kind is BlockKind.TOOL_USE]
    for index, call in enumerate(prefix_calls):
        planned = calls[index] if index < len(calls) else None
        if planned is not None and call.same_call(planned.name, planned.content):
            count += sum(1 for p in planned.pieces if p)
        else:
            count += len(split_pieces(call.arguments, 2, 8))
    return count


def _text_tokens(text: str) -> int:
    return -(-len(text.encode()) // 4)
