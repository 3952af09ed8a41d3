"""The terminal view of a run: a sink that shows the answer as it streams.

The recovery shows as it happens, in brackets, so the break and the continuation are visible."""

from __future__ import annotations

import sys
from typing import Any, TextIO, cast

from ..engine.protocol import Frame, FrameKind
from ..engine.sink import (
    DISCARDED_PARTIAL_TOOL_USE,
    DISCARDED_THINKING,
    LLM_REQUEST_RETRY,
    LLM_STREAM_CONTINUATION_COMPLETED,
    LLM_STREAM_CONTINUATION_EXHAUSTED,
    LLM_STREAM_CONTINUATION_STARTED,
    LLM_STREAM_INTERRUPTED,
    BaseSink,
    StructuredEvent,
)


class ConsoleSink(BaseSink):
    """Shows the answer as it streams and the recovery as it happens."""

    def __init__(self, out: TextIO | None = None, color: bool | None = None) -> None:
        self.out = out or sys.stdout
        self.color = self.out.isatty() if color is None else color
        self._at_line_start = True
        # (block, id) of the tool calls announced: a call's first arguments delta may be empty, as
        # its start is (Anthropic sends one), and is not a second call
        self._announced: set[tuple[int, str | None]] = set()

    def _note(self, text: str) -> None:
        if not self._at_line_start:
            self.out.write("\n")
        styled = f"\033[2;33m[{text}]\033[0m" if self.color else f"[{text}]"
        self.out.write(styled + "\n")
        self._at_line_start = True
        self.out.flush()

    def _write(self, text: str) -> None:
        if not text:
            return
        self.out.write(text)
        self._at_line_start = text.endswith("\n")
        self.out.flush()

    async def on_event(self, event: StructuredEvent) -> None:
        f = event.fields
        if event.name == LLM_STREAM_INTERRUPTED:
            self._note(f"stream interrupted: {f.get('cause')} ({f.get('error_message')}); plan {f.get('plan')}")
        elif event.name == LLM_STREAM_CONTINUATION_STARTED:
            self._note(
                f"continuation {f.get('continuation_attempt')} after {f.get('backoff_s'):.2f}s"
                f" (strategy {f.get('strategy') or 'restart'})"
            )
        elif event.name == LLM_STREAM_CONTINUATION_COMPLETED:
            self._note(f"recovered: {f.get('completion_reason')}")
        elif event.name == LLM_STREAM_CONTINUATION_EXHAUSTED:
            self._note(f"gave up after {f.get('attempts')} continuations")
        elif event.name == LLM_REQUEST_RETRY:
            self._note(f"request failed ({f.get('status')} {f.get('error_kind')}); retrying in {f.get('delay_s')}s")
        elif event.name == DISCARDED_PARTIAL_TOOL_USE:
            self._note(f"dropped half-received tool call {f.get('tool_name')} ({f.get('partial_input_bytes')} bytes)")
        elif event.name == DISCARDED_THINKING:
            self._note(f"dropped unfinished thinking ({f.get('partial_bytes')} bytes)")

    async def on_frame(self, frame: Frame) -> None:
        await self._show(cast("dict[str, Any]", frame))

    async def _show(self, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == FrameKind.TEXT_DELTA:
            self._write(frame["text"])
        elif kind == FrameKind.TOOL_CALL_DELTA and not frame.get("arguments_delta"):
            call = (frame["block"], frame.get("id"))
            if call not in self._announced:
                self._announced.add(call)
                self._note(f"calling tool {frame.get('name')}")
        elif kind == FrameKind.TOOL_CALL_CANCEL:
            self._announced.discard((frame["block"], frame.get("id")))  # sent again, it is announced again
        elif kind == FrameKind.STREAM_RESET:
            self._note(f"restarting the answer ({frame.get('reason')})")
        elif kind == FrameKind.MESSAGE_COMMITTED and frame["message"]["role"] == "user":
            for block in frame["message"]["content"]:
                if block.get("type") == "tool_result":
                    self._note(f"tool result: {block.get('content')}")

    def finish(self, status: str, error: dict[str, str] | None) -> None:
        if not self._at_line_start:
            self.out.write("\n")
        self._note(f"run {status}" + (f": {error['kind']}: {error['message']}" if error else ""))
