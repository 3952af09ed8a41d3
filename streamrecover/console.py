"""A sink that shows a run to a person in a terminal: the answer as it streams, and the
recovery as it happens, in brackets, so the break and the continuation are visible."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from .engine.sink import AttemptRecord, StructuredEvent


class ConsoleSink:
    def __init__(self, out: TextIO | None = None, color: bool | None = None) -> None:
        self.out = out or sys.stdout
        self.color = self.out.isatty() if color is None else color
        self._at_line_start = True

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
        if event.name == "llm_stream_interrupted":
            self._note(f"stream interrupted: {f.get('cause')} ({f.get('error_message')}); plan {f.get('plan')}")
        elif event.name == "llm_stream_continuation_started":
            self._note(
                f"continuation {f.get('continuation_attempt')} after {f.get('backoff_s'):.2f}s"
                f" (strategy {f.get('strategy') or 'restart'})"
            )
        elif event.name == "llm_stream_continuation_completed":
            self._note(f"recovered: {f.get('completion_reason')}")
        elif event.name == "llm_stream_continuation_exhausted":
            self._note(f"gave up after {f.get('attempts')} continuations")
        elif event.name == "llm_request_retry":
            self._note(f"request failed ({f.get('status')} {f.get('error_kind')}); retrying in {f.get('delay_s')}s")
        elif event.name == "discarded_partial_tool_use":
            self._note(f"dropped half-received tool call {f.get('tool_name')} ({f.get('partial_input_bytes')} bytes)")
        elif event.name == "discarded_thinking":
            self._note(f"dropped unfinished thinking ({f.get('partial_bytes')} bytes)")

    async def on_attempt(self, attempt: AttemptRecord) -> None:
        return None

    async def on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == "text_delta":
            self._write(frame["text"])
        elif kind == "tool_call_delta" and not frame.get("arguments_delta"):
            self._note(f"calling tool {frame.get('name')}")
        elif kind == "stream_reset":
            self._note(f"restarting the answer ({frame.get('reason')})")
        elif kind == "message_committed" and frame["message"]["role"] == "user":
            for block in frame["message"]["content"]:
                if block.get("type") == "tool_result":
                    self._note(f"tool result: {block.get('content')}")

    async def on_message(self, message: dict[str, Any], position: int) -> None:
        return None

    def finish(self, status: str, error: dict[str, str] | None) -> None:
        if not self._at_line_start:
            self.out.write("\n")
        self._note(f"run {status}" + (f": {error['kind']}: {error['message']}" if error else ""))
