"""Translation of provider stream events into the turn's blocks and the client's frames.

A turn's blocks are numbered the way the client sees them: ``IndexMapper`` maps one
response's block indices onto the turn's, merging a continuation's first text block into
the prefix's last text block when both are plain or both cited, and giving everything else
the next number. The continuation's first text goes through the ``ContinuationJoiner``
(which drops what the provider repeats) either way: a cited span that follows plain kept
text (or plain text a cited span) is a block of its own, but its start is the seam all the same.

With extended thinking every response starts with a thinking block, a continuation's
too. In the committed message that block would follow the prefix's text, where the
provider does not accept a thinking block back (it must lead the assistant message), so
it is shown while it streams and dropped when it closes: removed from the turn's blocks,
the client told with ``block_cancel`` (reason ``thinking_after_text``), the turn told
through ``on_thinking_dropped`` so it records ``discarded_thinking``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict

from . import citespan
from .blocks import REASONING, REDACTED_THINKING, TEXT, THINKING, TOOL_USE, Accumulator, Block
from .context import RunContext
from .errors import BodyDecodeError, InterruptCause, ParseError, StreamInterrupted
from .events import (
    AnswerMetadata,
    BlockStart,
    BlockStop,
    CitationDelta,
    FieldDelta,
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
    Usage,
    UsageUpdate,
)
from .join import ContinuationJoiner, JoinResult
from .protocol import FrameKind
from .seamlogprobs import SeamLogprobs
from .sink import AttemptRecord


class AttemptDone(Exception):
    """The stream reached its terminator."""


_Delta = TextDelta | ToolArgsDelta | ThinkingDelta | SignatureDelta | CitationDelta | FieldDelta


class _AllBut:
    """The block kinds other than ``kinds`` (a ``Container`` for ``Translator._target``)."""

    __slots__ = ("kinds",)

    def __init__(self, *kinds: str) -> None:
        self.kinds = frozenset(kinds)

    def __contains__(self, kind: object) -> bool:
        return kind not in self.kinds


# The blocks each delta may go into. Arguments stream into tool calls and into the server's
# own tool calls (opaque kinds); a signature closes a thinking block or (Gemini) a tool call;
# a streamed field fills an opaque block.
_TEXT: Container[str] = frozenset({TEXT})
_THINKING: Container[str] = frozenset({THINKING})
_SIGNED: Container[str] = frozenset({THINKING, TOOL_USE})
_ARGUMENTS: Container[str] = _AllBut(TEXT, THINKING, REDACTED_THINKING, REASONING)
_FIELDS: Container[str] = _AllBut(TEXT, THINKING, TOOL_USE, REDACTED_THINKING, REASONING)


class _TextDeltaOptions(TypedDict, total=False):
    """The optional fields of a ``text_delta`` frame (``protocol.TextDeltaFrame``)."""

    logprobs: list[TokenLogprob]
    refusal: Literal[True]


class InFlightTool(TypedDict):
    """The tool call being received, as a checkpoint records it."""

    id: str | None
    name: str | None
    partial_input_bytes: int


class IndexMapper:
    """Maps one response's block indices to the turn's, merging a continued text block."""

    def __init__(self, acc: Accumulator, prefix: list[Block], *, merge: bool = True) -> None:
        self.acc = acc
        self.map: dict[int, int] = {}
        # The kept blocks keep the indices the client knows them by; a dropped block before them
        # (unsigned reasoning) leaves a gap, so the next index follows the last kept one.
        self.next = prefix[-1].index + 1 if prefix else 0
        mergeable = merge and prefix and prefix[-1].kind == TEXT
        self.merge_index: int | None = prefix[-1].index if mergeable else None
        self._merge_open = self.merge_index is not None
        # the turn's block the continuation's first text goes into: the kept one (merged), or a
        # block of its own when their kinds differ; its start is the seam the joiner decides
        self.joined_index: int | None = None
        # a continuation's thinking blocks before its text: they would follow the prefix's text
        self.after_text_thinking: set[int] = set()
        self._merge_cited = bool(prefix and citespan.makes_cited_span(prefix[-1].citations or ()))
        # the ids of the message's tool calls so far: a repeated one is made unique (below)
        self.tool_ids: set[str] = {b.id or "" for b in prefix if b.kind == TOOL_USE}

    def start(self, event: BlockStart) -> int | None:
        if event.index in self.map:
            return self.map[event.index]
        if event.kind == TOOL_USE:
            event = BlockStart(event.index, event.kind, self._unique_tool_id(event), event.name, event.data)
        if self._merge_open and event.kind in (THINKING, REDACTED_THINKING, REASONING):
            target = self.next
            self.next += 1
            self.map[event.index] = target
            self.after_text_thinking.add(target)
            self.acc.apply(BlockStart(target, event.kind, event.id, event.name, event.data))
            return target  # the merge stays open for the text that follows
        # The first text block goes on in the kept one unless their kinds differ: a cited span
        # is a block of its own (a start with "citations"), so a cited block never continues
        # a plain one, nor a plain block a cited one; it is the next block, as uninterrupted.
        cited = bool(event.data is not None and "citations" in event.data)
        if self._merge_open and event.kind == TEXT and self.merge_index is not None and cited == self._merge_cited:
            self._merge_open = False
            self.map[event.index] = self.joined_index = self.merge_index
            self.acc.reopen(self.merge_index)
            return self.merge_index
        target = self.next
        if self._merge_open and event.kind == TEXT:
            self.joined_index = target
        self._merge_open = False
        self.next += 1
        self.map[event.index] = target
        self.acc.apply(replace(event, index=target))
        return target

    def _unique_tool_id(self, event: BlockStart) -> str | None:
        """The call's id, or, when an earlier call of the message has it (a compatible server
        that numbers every call ``call_0``, or sends no ids), one derived from it and the
        call's index. A call's result is stored and sent back under its id: two calls sharing
        one would get one result, the second never run. Made before the call's first frame,
        so the client is shown the id that is stored."""
        original = event.id or ""
        unique = original
        if unique in self.tool_ids:
            unique = f"{original or 'call'}_{event.index}"
            while unique in self.tool_ids:
                unique += "_"
        self.tool_ids.add(unique)
        return event.id if unique == original else unique

    def target(self, index: int, kind: str | None) -> int:
        if index in self.map:
            return self.map[index]
        # a delta for a block whose start never came (some compatible providers)
        self.start(BlockStart(index, kind or TEXT))
        return self.map[index]


# Longer than a word of the BPE vocabularies these servers use (only runs of spaces or symbols
# are longer): a chunk this long is tokens buffered together.
ONE_TOKEN_MAX_BYTES = 32


def delta_token_bound(text: str, size: int) -> int:
    """An upper bound on the tokens in a text delta of ``size`` UTF-8 bytes from a server that
    streams one token per chunk: one, unless the chunk cannot be a single token, and then its
    bytes (every token streams at least one). It cannot be one when it holds
    - a multi-byte character: a token that ends inside a character is held back until the
      character is whole, so that chunk carries every token the character took (an emoji, a
      CJK character, an accented letter can take several);
    - more than ``ONE_TOKEN_MAX_BYTES``: tokens buffered together (a proxy or gateway in front
      of a buffering server, a server that batches).
    Either test only ever raises the count: where it is wrong, the bound is looser, never low.
    """
    return size if size > ONE_TOKEN_MAX_BYTES or size != len(text) else 1


class Translator:
    """Applies one turn's provider events to its accumulator and sends the matching frames.

    Create one per turn; ``begin`` it for every response. ``on_progress(n)`` is called
    after each output delta of ``n`` characters (text, tool arguments, thinking and its
    signature, a streamed field, a redacted thinking block), so the routine checkpoints follow
    all the output billed, thinking included; ``on_tool_closed()`` when a
    tool call's block closes (the turn checkpoints there), ``on_interrupted()`` when the
    response broke, before its attempt is recorded as ended (the turn checkpoints there too).
    """

    def __init__(
        self,
        ctx: RunContext,
        on_progress: Callable[[int], Awaitable[None]],
        on_tool_closed: Callable[[], Awaitable[None]],
        on_thinking_dropped: Callable[[Block], Awaitable[None]] | None = None,
        on_interrupted: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.on_progress = on_progress
        self.on_tool_closed = on_tool_closed
        self.on_interrupted = on_interrupted
        self.on_thinking_dropped = on_thinking_dropped
        self.in_flight_tool: InFlightTool | None = None
        self.acc = Accumulator()
        self.mapper = IndexMapper(self.acc, [])
        self.joiner: ContinuationJoiner | None = None
        self.parser: object | None = None  # the response's parser (its cursor, for a native resume)
        self.final_usage = False  # the response's closing usage arrived (not just message_start's)
        # Broken attempts of a response to be re-attached, estimated, with the usage they had
        # reported: the re-attached end reports the whole response, and the estimates are withdrawn
        self.estimated_before_resume: list[tuple[AttemptRecord, Usage]] = []
        # UTF-8 bytes of the output received in this response (text, thinking, redacted thinking,
        # streamed fields, tool names and arguments): every output token streams at least one
        # byte, so this over-counts tokens
        self.received_bytes = 0
        # the text's bytes, and its tokens bounded delta by delta (``delta_token_bound``)
        self.text_bytes = 0
        self.text_tokens = 0
        # Non-empty output deltas (text, thinking, tool arguments) of this response: each carries
        # at least one token, so more of them than the request's max_tokens is a provider that
        # does not stop; ``max_deltas`` is that max_tokens (None: no bound).
        self.output_deltas = 0
        self.max_deltas: int | None = None
        self.spans = _ContinuedSpans()
        self.seam_logprobs = SeamLogprobs()

    def received_tokens(self, text_delta_is_token: bool) -> int:
        """An upper bound on the output tokens received in this response: its bytes, or,
        where the server streams a token per text delta, the text's ``delta_token_bound``s
        and the bytes of the rest."""
        if not text_delta_is_token:
            return self.received_bytes
        return self.received_bytes - self.text_bytes + self.text_tokens

    def begin(
        self,
        acc: Accumulator,
        prefix: list[Block],
        joiner: ContinuationJoiner | None,
        max_tokens: int | None = None,
        *,
        merge: bool = True,
    ) -> None:
        """Start one response that continues from ``prefix`` (already restored into ``acc``),
        asked for at most ``max_tokens``; ``merge=False``: its first text block is a block of its
        own (a native resume after a closed text block)."""
        self.acc = acc
        self.mapper = IndexMapper(acc, prefix, merge=merge)
        self.parser = None
        self.joiner = joiner
        self.final_usage = False
        self.received_bytes = 0
        self.text_bytes = 0
        self.text_tokens = 0
        self.output_deltas = 0
        self.max_deltas = max_tokens
        kept = prefix[-1].text if prefix and self.mapper.merge_index is not None and joiner is not None else None
        self.spans = _ContinuedSpans(len(kept) if kept is not None else None)
        self.seam_logprobs = SeamLogprobs()

    def _count_output(self, text: str) -> None:
        """One more output delta; past the budget the stream is broken off before it is applied."""
        if not text:
            return
        self.output_deltas += 1
        if self.max_deltas is not None and self.output_deltas > self.max_deltas:
            raise StreamInterrupted(
                InterruptCause.MAX_TOKENS_EXCEEDED,
                f"the provider streamed more than max_tokens ({self.max_deltas}) deltas without stopping",
            )

    async def on_event(self, event: StreamEvent, record: AttemptRecord) -> None:
        """One normalized event; raises ``AttemptDone`` at the terminator, ``StreamInterrupted``
        for an error the provider sent inside the stream."""
        frame = self.ctx.frame
        mapper, joiner = self.mapper, self.joiner
        match event:
            case TextDelta(text=text, logprobs=logprobs):
                self._count_output(text)
                size = len(text.encode())
                self.received_bytes += size
                self.text_bytes += size
                self.text_tokens += delta_token_bound(text, size) if text else 0
                target = self._target(event, TEXT, _TEXT)
                if joiner is not None and target == mapper.joined_index:
                    self.spans.raw.append(text)
                    self.seam_logprobs.fed(text, logprobs)
                    await self._joined(target, joiner.feed(text))
                    await self._settle_spans(target)
                    return
                self.acc.apply(TextDelta(target, text))
                await self._text_frame(target, text, logprobs)
                await self.on_progress(len(text))
            case ToolArgsDelta(partial_json=part):
                self._count_output(part)
                self.received_bytes += len(part.encode())
                target = self._target(event, TOOL_USE, _ARGUMENTS)
                block = self.acc.apply(ToolArgsDelta(target, part))
                assert block is not None
                if self.in_flight_tool is None or self.in_flight_tool.get("id") != block.id:
                    self.in_flight_tool = {"id": block.id, "name": block.name, "partial_input_bytes": 0}
                self.in_flight_tool["partial_input_bytes"] += len(part.encode())
                await frame(FrameKind.TOOL_CALL_DELTA, block=target, id=block.id, name=block.name, arguments_delta=part)
                await self.on_progress(len(part))
            case ThinkingDelta(thinking=text):
                self._count_output(text)
                self.received_bytes += len(text.encode())
                target = self._target(event, THINKING, _THINKING)
                self.acc.apply(ThinkingDelta(target, text))
                await frame(FrameKind.THINKING_DELTA, block=target, thinking=text)
                await self.on_progress(len(text))
            case SignatureDelta(signature=sig):
                self.acc.apply(SignatureDelta(self._target(event, THINKING, _SIGNED), sig))
                # no output tokens of its own, but it makes the thinking before it keepable
                await self.on_progress(len(sig))
            case CitationDelta(citation=citation):
                target = self._target(event, TEXT, _TEXT)
                if self.spans.base is not None and target == mapper.joined_index and citespan.is_span(citation):
                    # it indexes this response's text, which goes on after the kept text
                    self.spans.pending.append(citation)
                    await self._settle_spans(target)
                    return
                self.acc.apply(CitationDelta(target, citation))
                await frame(FrameKind.CITATION, block=target, citation=citation)
            case FieldDelta(field=name, text=text):
                # shown whole when the block closes (a compaction summary arrives in one piece)
                self.received_bytes += len(text.encode())
                self.acc.apply(FieldDelta(self._target(event, name, _FIELDS), name, text))
                await self.on_progress(len(text))
            case BlockStart(kind=kind):
                if kind == TOOL_USE and not event.name:
                    # a call of no tool: it cannot be run, nor sent back (providers refuse it)
                    raise ParseError(f"a tool call with an empty name (id {event.id!r})")
                self.received_bytes += len((event.name or "").encode())
                mapped = mapper.start(event)
                if mapped is None:
                    return
                if mapped == mapper.joined_index and mapped != mapper.merge_index:
                    # the continuation's text starts a block of its own: its spans count from there
                    self.spans.started_own_block()
                started = self.acc.block_at(mapped)
                if kind == TOOL_USE and started is not None:
                    self.in_flight_tool = {"id": started.id, "name": started.name, "partial_input_bytes": 0}
                    await frame(
                        FrameKind.TOOL_CALL_DELTA, block=mapped, id=started.id, name=started.name, arguments_delta=""
                    )
                elif kind not in (TEXT, THINKING) and started is not None:
                    await frame(FrameKind.BLOCK, block=mapped, content=started.to_content())
                if kind == REDACTED_THINKING and started is not None:
                    await self._redacted_thinking(started)
            case BlockStop(index=i):
                target = mapper.target(i, None)
                if joiner is not None and target == mapper.joined_index and not joiner.decided:
                    await self._joined(target, joiner.flush())
                if target == mapper.joined_index:
                    await self._settle_spans(target)
                stopped = self.acc.apply(BlockStop(target))
                if stopped is not None and stopped.kind == TOOL_USE:
                    self.in_flight_tool = None
                    await self.on_tool_closed()
                elif stopped is not None and target in mapper.after_text_thinking:
                    self.acc.remove(target)
                    await frame(FrameKind.BLOCK_CANCEL, block=target, kind=stopped.kind, reason="thinking_after_text")
                    if self.on_thinking_dropped is not None:
                        await self.on_thinking_dropped(stopped)
                elif stopped is not None and stopped.field:
                    # an opaque block whose content streamed: the client gets it again, whole
                    await frame(FrameKind.BLOCK, block=target, content=stopped.to_content())
            case MessageStart(usage=usage):
                record.usage = record.usage.merged(usage)
            case UsageUpdate(usage=usage):
                record.usage = record.usage.merged(usage)
                self.final_usage = True
            case AnswerMetadata(values=values):
                record.metadata = {**record.metadata, **values}
            case StopReason():
                self.acc.apply(event)
            case ProviderErrorEvent():
                error = self.ctx.adapter.classify_stream_error(event)
                raise StreamInterrupted(
                    InterruptCause.PROVIDER_ERROR_MID_STREAM, f"{event.error_type}: {event.message}", error
                )
            case StreamEnd():
                seam = mapper.joined_index if mapper.joined_index is not None else mapper.merge_index
                if joiner is not None and not joiner.decided and seam is not None:
                    await self._joined(seam, joiner.flush())
                if seam is not None:
                    await self._settle_spans(seam)
                raise AttemptDone

    async def _redacted_thinking(self, block: Block) -> None:
        """Redacted thinking arrives whole in its start: billed thinking the provider encrypted.
        Its bytes count as received output (more than its tokens: the bound stays an upper one)
        and toward the next checkpoint, as streamed thinking does."""
        size = len(str(block.to_content()["data"]).encode())
        self.received_bytes += size
        await self.on_progress(size)

    def _target(self, event: _Delta, kind: str, fits: Container[str]) -> int:
        """The turn's block for ``event``'s index (a block of ``kind`` when its start never
        came). A delta that does not fit that block (thinking for a text block, text for a
        tool call) is bad data: applied, it would be stored as something else than the client
        is shown, so the stream is broken at the last good event instead."""
        target = self.mapper.target(event.index, kind)
        block = self.acc.block_at(target)
        if block is not None and block.kind not in fits:
            raise ParseError(f"a {type(event).__name__} for block {event.index}, which is a {block.kind} block")
        return target

    async def _joined(self, target: int, text: str) -> None:
        """Apply what the joiner released for the continued block. When the continuation
        restarted the answer and replaced the kept text, the block takes the new text and the
        client is reset to the turn's blocks as they now are."""
        assert self.joiner is not None
        replacement = self.joiner.take_replacement()
        if replacement is not None:
            block = self.acc.block_at(target)
            assert block is not None
            block.text = replacement
            kept_index = self.mapper.merge_index
            if kept_index is not None and kept_index != target:
                # the new text, in a block of its own, replaces the kept text's block: it goes
                self.acc.remove(kept_index)
            self.spans.replaced(len(replacement))
            await self.ctx.frame(FrameKind.STREAM_RESET, reason="continuation_restart")
            for kept in self.acc.blocks:
                await replay_block(self.ctx, kept)
            await self.on_progress(len(replacement))
        logprobs = self.seam_logprobs.released(text, decided=self.joiner.decided)
        if text:
            self.spans.released += len(text)
            self.acc.apply(TextDelta(target, text))
            await self._text_frame(target, text, logprobs)
            await self.on_progress(len(text))

    async def _text_frame(self, target: int, text: str, logprobs: tuple[TokenLogprob, ...]) -> None:
        """A text delta for the client, with its tokens' logprobs where the provider sent some."""
        await text_frame(self.ctx, self.acc.block_at(target), target, text, logprobs)

    async def _settle_spans(self, target: int) -> None:
        """Move the continued block's span citations onto its text, once the joiner decided the
        seam and their text arrived; one whose text the client's does not hold there is dropped,
        and so is one the block has already (a repeat of the kept text, cited again)."""
        spans = self.spans
        if not spans.pending or self.joiner is None or not self.joiner.decided:
            return
        block = self.acc.block_at(target)
        if block is None:
            return
        own = "".join(spans.raw)
        waiting: list[dict[str, Any]] = []
        for citation in spans.pending:
            span = citespan.span_of(citation)
            assert span is not None
            if span[1] > len(own):
                waiting.append(citation)  # its text is still to come
                continue
            moved = spans.onto(citation, len(own), own, block.text)
            # a continuation that repeated the kept text cites it again: the block has that citation
            if moved is not None and moved not in (block.citations or ()):
                self.acc.apply(CitationDelta(target, moved))
                await self.ctx.frame(FrameKind.CITATION, block=target, citation=moved)
        spans.pending = waiting

    def join_result(self) -> JoinResult | None:
        """What the joiner did with this response's seam (None: nothing was continued)."""
        return self.joiner.result if self.joiner is not None else None


async def text_frame(
    ctx: RunContext, block: Block | None, target: int, text: str, logprobs: tuple[TokenLogprob, ...] = ()
) -> None:
    """A ``text_delta`` frame of ``block`` (the turn's block ``target``): with its tokens' logprobs
    where the provider sent some, and ``refusal`` on every delta of a refusal (not only the first:
    a reader may start inside the block)."""
    options: _TextDeltaOptions = {}
    if logprobs:
        options["logprobs"] = list(logprobs)
    if block is not None and block.refusal:
        options["refusal"] = True
    await ctx.frame(FrameKind.TEXT_DELTA, block=target, text=text, **options)


async def replay_block(ctx: RunContext, block: Block) -> None:
    """The frames that show a kept block to a client that starts from nothing (a resume)."""
    if block.kind == TEXT:
        await text_frame(ctx, block, block.index, block.text)
        for citation in block.citations or ():
            await ctx.frame(FrameKind.CITATION, block=block.index, citation=citation)
    elif block.kind == TOOL_USE:
        await ctx.frame(
            FrameKind.TOOL_CALL_DELTA, block=block.index, id=block.id, name=block.name, arguments_delta=block.arguments
        )
    elif block.kind == THINKING:
        await ctx.frame(FrameKind.THINKING_DELTA, block=block.index, thinking=block.text)
    else:  # redacted thinking, server tool calls and results, compaction: whole
        await ctx.frame(FrameKind.BLOCK, block=block.index, content=block.to_content())


@dataclass(slots=True)
class _ContinuedSpans:
    """The continued block's span citations (``citespan``) of one response, and what is needed to
    move them: the block's text is the kept text (``base`` characters), then what the joiner
    released of this response's text (``raw``), which is that text less what it dropped at its
    start (a repeat of the kept text's end, a prefill's whitespace, a restart's repeat)."""

    base: int | None = None  # None: this response continues no block
    raw: list[str] = field(default_factory=list)  # the response's own text of the block
    released: int = 0  # characters of it the block received
    pending: list[dict[str, Any]] = field(default_factory=list)

    def started_own_block(self) -> None:
        """The continued text is a block of its own (another kind than the kept one): nothing before it."""
        if self.base is not None:
            self.base = 0

    def replaced(self, chars: int) -> None:
        """The continuation replaced the kept text: the block is its ``chars`` released so far."""
        if self.base is not None:
            self.base, self.released = 0, chars

    def onto(self, citation: dict[str, Any], own_chars: int, own: str, text: str) -> dict[str, Any] | None:
        """The citation moved onto the block's ``text``, or None where that text does not hold
        the characters it cited (they were dropped at the seam, or the shift is not certain)."""
        assert self.base is not None
        span = citespan.span_of(citation)
        assert span is not None
        shift = self.base - (own_chars - self.released)
        start, end = span[0] + shift, span[1] + shift
        if start < 0 or text[start:end] != own[span[0] : span[1]]:
            return None
        return citespan.moved(citation, shift)


def as_interrupted(exc: BaseException) -> StreamInterrupted:
    """A broken body (bad SSE, bad bytes, bad data) as the interruption it is."""
    if isinstance(exc, StreamInterrupted):
        return exc
    if isinstance(exc, BodyDecodeError):
        return StreamInterrupted(InterruptCause.BODY_DECODE, str(exc))
    return StreamInterrupted(InterruptCause.SSE_PARSE, str(exc))
