"""The client frame protocol: the frame kinds, the shape of each frame, and the one reducer that applies them.

Every frame carries ``type``, ``run_id`` and ``seq``; a coalesced delta also carries
``first_seq`` (it covers ``first_seq..seq``). ``FrameReducer`` holds the rules a client
follows to rebuild a run's in-flight blocks from frames. The server's snapshot state
(``live.state.RunState``) and the tests' reference client (``testing.client.ClientView``)
both build on it, and ``static/streamrecover/client.js`` implements the same rules.
docs/protocol.md describes the protocol. Django-free.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, NotRequired, TypedDict

from .events import TokenLogprob
from .utf8text import Utf8Attr, Utf8Slots


class FrameKind:
    """The ``type`` of every frame, as plain strings (what goes over the wire)."""

    TEXT_DELTA: Final = "text_delta"
    THINKING_DELTA: Final = "thinking_delta"
    TOOL_CALL_DELTA: Final = "tool_call_delta"
    BLOCK: Final = "block"
    CITATION: Final = "citation"
    TOOL_CALL_CANCEL: Final = "tool_call_cancel"
    BLOCK_CANCEL: Final = "block_cancel"
    STREAM_RESET: Final = "stream_reset"
    RECOVERY: Final = "recovery"
    MESSAGE_COMMITTED: Final = "message_committed"
    RUN_STATUS: Final = "run_status"
    SNAPSHOT: Final = "snapshot"
    ERROR: Final = "error"


# The delta frames and the field that carries each one's text (coalescing appends to it).
DELTA_FIELDS: Final[Mapping[str, str]] = {
    FrameKind.TEXT_DELTA: "text",
    FrameKind.THINKING_DELTA: "thinking",
    FrameKind.TOOL_CALL_DELTA: "arguments_delta",
}


class RunStatus:
    """A run's status, as ``run_status`` frames, snapshots and the ``Run`` rows carry it."""

    QUEUED: Final = "queued"
    RUNNING: Final = "running"
    RECOVERING: Final = "recovering"
    COMPLETED: Final = "completed"
    FAILED: Final = "failed"
    EXHAUSTED: Final = "exhausted"
    CANCELLED: Final = "cancelled"


TERMINAL_STATUSES: Final = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.EXHAUSTED, RunStatus.CANCELLED})


# ---- frame shapes -----------------------------------------------------------------------


class _Header(TypedDict):
    run_id: str
    seq: int
    first_seq: NotRequired[int]  # a coalesced delta covers first_seq..seq


class TextDeltaFrame(_Header):
    """``logprobs``: the provider's entries for the tokens of ``text`` (OpenAI Chat or Responses,
    when the request asked), each one's token exactly the text at its place. For the healing
    endpoint: the live publisher leaves them out of what browsers get. ``refusal``: on every delta
    of a text block that is the model's refusal (``BlockStart.refusal``), absent on any other."""

    type: Literal["text_delta"]
    block: int
    text: str
    logprobs: NotRequired[list[TokenLogprob]]
    refusal: NotRequired[Literal[True]]


class ThinkingDeltaFrame(_Header):
    type: Literal["thinking_delta"]
    block: int
    thinking: str


class ToolCallDeltaFrame(_Header):
    type: Literal["tool_call_delta"]
    block: int
    id: str | None
    name: str | None
    arguments_delta: str


class BlockFrame(_Header):
    """A whole block of a kind that streams no text deltas (``redacted_thinking``, server tool
    calls and results, ``compaction``). Sent again for the same index it replaces the block
    (a compaction block, announced empty, is sent again whole when it closes); a server tool
    call's input then arrives as ``tool_call_delta`` frames for its index."""

    type: Literal["block"]
    block: int
    content: dict[str, Any]


class CitationFrame(_Header):
    """One citation of the text block ``block`` (web search answers): appended to its ``citations``."""

    type: Literal["citation"]
    block: int
    citation: dict[str, Any]


class ToolCallCancelFrame(_Header):
    type: Literal["tool_call_cancel"]
    block: int
    id: str | None
    name: str | None
    reason: str


class BlockCancelFrame(_Header):
    type: Literal["block_cancel"]
    block: int
    kind: str
    reason: str


class StreamResetFrame(_Header):
    type: Literal["stream_reset"]
    reason: str  # whole_restart, resume, continuation_restart, reclaimed


class RecoveryFrame(_Header):
    type: Literal["recovery"]
    phase: str  # backoff, continuing, exhausted
    attempt: int
    plan: str
    backoff_s: NotRequired[float]


class MessageCommittedFrame(_Header):
    type: Literal["message_committed"]
    position: int
    message: dict[str, Any]


class RunStatusFrame(_Header):
    type: Literal["run_status"]
    status: str
    error: NotRequired[dict[str, str] | None]


class PartialEntry(TypedDict):
    """One in-flight block of a snapshot."""

    block: int
    content: dict[str, Any]


class SnapshotFrame(_Header):
    type: Literal["snapshot"]
    status: str | None
    messages: list[dict[str, Any]]
    partial: list[PartialEntry]
    error: dict[str, Any] | None


class ErrorFrame(_Header):
    type: Literal["error"]
    code: str
    message: str


Frame = (
    TextDeltaFrame
    | ThinkingDeltaFrame
    | ToolCallDeltaFrame
    | BlockFrame
    | CitationFrame
    | ToolCallCancelFrame
    | BlockCancelFrame
    | StreamResetFrame
    | RecoveryFrame
    | MessageCommittedFrame
    | RunStatusFrame
    | SnapshotFrame
    | ErrorFrame
)


def frame_span(frame: Mapping[str, Any]) -> tuple[int, int]:
    """The seqs a (possibly coalesced) frame covers: ``(first_seq, seq)``."""
    seq = int(frame.get("seq") or 0)
    return int(frame.get("first_seq") or seq), seq


# ---- the reducer ------------------------------------------------------------------------


def _shown_input(arguments: str) -> Any:
    """A tool call's arguments as the client shows them (unparseable ones as ``__unparsed__``)."""
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"__unparsed__": arguments}


@dataclass(slots=True)
class PartialBlock(Utf8Slots):
    """One in-flight block as a client holds it: text so far, or a tool call's raw arguments.

    ``text`` and ``arguments`` are kept as UTF-8 (``Utf8Attr``, installed below the class):
    the reducer appends each delta to them, and a ``str`` would be copied whole each time.
    """

    kind: str
    text: str = ""
    id: str | None = None
    name: str | None = None
    arguments: str = ""  # a tool call's, or a server tool call's (announced by a ``block`` frame)
    content: dict[str, Any] | None = None  # a whole block (kinds without text deltas)
    citations: list[dict[str, Any]] | None = None  # a text block's
    # a text block that is the model's refusal (its deltas say ``"refusal": true``): only the
    # snapshot says so; canonical content (history, the committed message) has no such field
    refusal: bool = False

    def to_content(self) -> dict[str, Any]:
        """What the client shows: canonical content (unparseable arguments kept as ``__unparsed__``)."""
        if self.kind == "text":
            if self.citations:
                return {"type": "text", "text": self.text, "citations": list(self.citations)}
            return {"type": "text", "text": self.text}
        if self.kind == "tool_use":
            return {"type": "tool_use", "id": self.id, "name": self.name, "input": _shown_input(self.arguments)}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": self.text}
        content = dict(self.content or {"type": self.kind})
        if self.arguments:  # a server tool call's input, streamed after its block frame
            content["input"] = _shown_input(self.arguments)
        return content

    def to_snapshot_content(self) -> dict[str, Any]:
        """The block in a snapshot. A tool call's arguments may be half a JSON document:
        ``partial_json`` carries them verbatim so the client appends further deltas (a
        server tool call's too, beside its whole content)."""
        if self.kind == "tool_use":
            try:
                parsed = json.loads(self.arguments) if self.arguments.strip() else {}
            except ValueError:
                parsed = {}
            return {
                "type": "tool_use",
                "id": self.id,
                "name": self.name,
                "input": parsed if isinstance(parsed, dict) else {},
                "partial_json": self.arguments,
            }
        if self.kind not in ("text", "thinking") and self.arguments:
            return {**dict(self.content or {"type": self.kind}), "partial_json": self.arguments}
        if self.kind == "text" and self.refusal:
            # so that a client that reconnects mid-refusal knows it is one, as one that stayed does
            return {**self.to_content(), "refusal": True}
        return self.to_content()

    @classmethod
    def from_content(cls, content: Mapping[str, Any]) -> PartialBlock:
        """A snapshot's partial block back into the form later deltas append to."""
        kind = str(content.get("type", ""))
        if kind == "text":
            cited = content.get("citations")
            return cls(
                "text",
                text=content.get("text", ""),
                citations=list(cited) if cited else None,
                refusal=content.get("refusal") is True,
            )
        if kind == "thinking":
            return cls("thinking", text=content.get("thinking", ""))
        raw = content.get("partial_json")
        if kind == "tool_use":
            arguments = raw if isinstance(raw, str) else json.dumps(content.get("input"))
            return cls("tool_use", id=content.get("id"), name=content.get("name"), arguments=arguments)
        whole = {k: v for k, v in content.items() if k != "partial_json"}
        return cls(kind, content=whole, arguments=raw if isinstance(raw, str) else "")


# After the dataclass is built, as for ``blocks.Block``.
PartialBlock.text = Utf8Attr("_text")  # type: ignore[assignment,misc]
PartialBlock.arguments = Utf8Attr("_arguments")  # type: ignore[assignment,misc]


class FrameReducer:
    """Applies frames in order: the in-flight blocks by index, the run's status and error, the last seq.

    Subclasses keep committed messages their own way by overriding ``on_commit`` (called
    before the in-flight blocks are cleared) and ``on_snapshot_messages``.
    """

    def __init__(self) -> None:
        self.seq = 0
        self.status: str | None = None
        self.error: dict[str, Any] | None = None
        self.blocks: dict[int, PartialBlock] = {}

    def apply(self, frame: Mapping[str, Any]) -> None:
        kind = frame.get("type")
        block: int = frame.get("block")  # type: ignore[assignment]  # every frame that uses it carries it
        self.seq = max(self.seq, int(frame.get("seq") or 0))
        if kind == FrameKind.TEXT_DELTA:
            entry = self._in_flight(block, "text")
            entry._text.append(frame.get("text", ""))
            if frame.get("refusal") is True:
                entry.refusal = True
        elif kind == FrameKind.THINKING_DELTA:
            self._in_flight(block, "thinking")._text.append(frame.get("thinking", ""))
        elif kind == FrameKind.TOOL_CALL_DELTA:
            # also a server tool call's input, after the block frame that announced it
            entry = self._in_flight(block, "tool_use", id=frame.get("id"), name=frame.get("name"))
            entry._arguments.append(frame.get("arguments_delta", ""))
        elif kind == FrameKind.CITATION:
            entry = self._in_flight(block, "text")
            entry.citations = [*(entry.citations or []), frame.get("citation") or {}]
        elif kind == FrameKind.BLOCK:
            content = frame.get("content") or {}
            self.blocks[block] = PartialBlock(content.get("type", "block"), content=content)
        elif kind in (FrameKind.TOOL_CALL_CANCEL, FrameKind.BLOCK_CANCEL):
            self.blocks.pop(block, None)
        elif kind == FrameKind.STREAM_RESET:
            self.blocks.clear()
        elif kind == FrameKind.MESSAGE_COMMITTED:
            self.on_commit(frame.get("position"), frame.get("message") or {})
            self.blocks.clear()
        elif kind == FrameKind.SNAPSHOT:
            self.on_snapshot_messages(list(frame.get("messages", [])))
            self.blocks = {
                item["block"]: PartialBlock.from_content(item["content"]) for item in frame.get("partial", [])
            }
            self.status = frame.get("status")
            self.error = frame.get("error")  # a run that ended failed, exhausted or cancelled carries why
        elif kind == FrameKind.RUN_STATUS:
            self.status = frame.get("status")
            self.error = frame.get("error")

    def _in_flight(self, index: int, kind: str, **fields: Any) -> PartialBlock:
        """The in-flight block at ``index``, begun as ``kind`` (with ``fields``) if there is none
        (deltas may come first)."""
        entry = self.blocks.get(index)
        if entry is None:
            entry = self.blocks[index] = PartialBlock(kind, **fields)
        return entry

    def on_commit(self, position: int | None, message: dict[str, Any]) -> None:
        """A ``message_committed`` frame; the in-flight blocks are still there."""

    def on_snapshot_messages(self, messages: list[dict[str, Any]]) -> None:
        """A ``snapshot`` frame's committed messages."""

    def partial(self) -> list[PartialEntry]:
        """The in-flight blocks as ``[{block, content}]`` in block order (the snapshot's shape)."""
        return [{"block": index, "content": self.blocks[index].to_snapshot_content()} for index in sorted(self.blocks)]

    def reconstructed(self) -> list[dict[str, Any]]:
        """The in-flight blocks as the client shows them, in block order."""
        return [self.blocks[index].to_content() for index in sorted(self.blocks)]
