"""A scripted provider for the healing endpoint's tests: canned SSE bodies per path, every request
recorded. The built-in fake reports no prompt cache and no stop sequence; real providers do."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedUpstream:
    """An HTTP server on a free loopback port: a POST to a path starting with a key of
    ``responses`` gets that body as an event stream (a list of bodies: one per POST, in turn, the
    last one again after them), with ``headers`` (a ``content-type`` there replaces the event
    stream's); ``requests`` holds what each POST sent."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.responses: dict[str, bytes | list[bytes]] = {}
        self.headers: dict[str, str] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                data = next((v for k, v in outer.responses.items() if self.path.startswith(k)), b"")
                if isinstance(data, list):
                    data = data.pop(0) if len(data) > 1 else data[0]
                self.send_response(200)
                for name, value in {"content-type": "text/event-stream", **outer.headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                with contextlib.suppress(ConnectionError):  # a client that stops reading a long body
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, name="scripted-upstream", daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sse(events: list[tuple[str | None, Any]]) -> bytes:
    """Events as SSE: ``(name or None, payload)``, a str payload sent as it is."""
    out = []
    for name, data in events:
        payload = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "") + f"data: {payload}\n\n")
    return "".join(out).encode()


def anthropic_stream(
    text: str = "Hello there",
    *,
    stop_reason: str = "end_turn",
    stop_sequence: str | None = None,
    input_tokens: int = 10,
    cache_read: int = 0,
    cache_creation: int = 0,
    output_tokens: int = 5,
) -> bytes:
    """A Messages stream of one text block (``input_tokens`` are Anthropic's: the uncached ones)."""
    usage = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": cache_creation,
        "cache_read_input_tokens": cache_read,
        "output_tokens": 1,
    }
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": []}
    return sse(
        [
            ("message_start", {"type": "message_start", "message": {**message, "stop_reason": None, "usage": usage}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": {"output_tokens": output_tokens},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
    )


def chat_stream(
    text: str = "Hello there",
    *,
    prompt_tokens: int = 100,
    cached: int = 0,
    completion_tokens: int = 5,
    reasoning_tokens: int | None = None,
) -> bytes:
    """A Chat Completions stream of one text answer and its usage chunk (``prompt_tokens`` count the
    cached ones, ``completion_tokens`` the reasoning ones)."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return sse(
        [
            (None, {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            (None, {**head, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}),
            (None, {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            (None, {**head, "choices": [], "usage": usage}),
            (None, "[DONE]"),
        ]
    )


def gemini_stream(
    text: str, *, thoughts: int, candidates: int, finished: bool = True, prompt_tokens: int = 10
) -> bytes:
    """A ``streamGenerateContent`` stream of one text chunk with its cumulative ``usageMetadata``
    (``candidatesTokenCount`` leaves the thoughts out); without ``finished`` it ends with no
    ``finishReason``: a stream that broke."""
    usage = {
        "promptTokenCount": prompt_tokens,
        "candidatesTokenCount": candidates,
        "thoughtsTokenCount": thoughts,
        "totalTokenCount": prompt_tokens + candidates + thoughts,
    }
    candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    if finished:
        candidate["finishReason"] = "STOP"
    return sse([(None, {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "gemini-x"})])
