"""Recovery overhead per strategy, and billing against a naive retry over a sweep of cut points.

Engine only (no Django), against the fake provider on loopback in this process:

* **overhead**: a stream cut after ``--cut`` body bytes is continued with each strategy
  (``prefill``: Anthropic Messages; ``prefix_flag``: an OpenAI-compatible server with the
  prefix flag, DeepSeek style; ``continue_message``: OpenAI Chat Completions). Measured per
  run: from the break (the interrupted attempt's end) to the first continued delta reaching
  the sink, minus the backoff (``--backoff-ms``, 50 by default: the schedule's first wait
  scaled down; the run's own ``backoff_s``) and minus the provider's time to first byte of the
  continuation (its ``first_byte_at - started_at``): what streamrecover itself adds. p50 and
  p90 over ``--repeat`` runs (after one warm-up run). For ``prefill`` the free
  ``count_tokens`` calls the Anthropic adapter makes (to keep the output budget exact) run
  during the backoff, so they show only where they outlast it (``--backoff-ms 0``: all of
  them); ``prep`` is from the break to the continuation request, less the backoff.
* **billing**: the same story cut at each point of a sweep, recovered by streamrecover's
  continuation and by a naive retry of the same request (what ``max_retries`` in the
  official SDKs and most frameworks do: resend, generate everything again). Output tokens
  paid are the fake provider's billing log (content deltas written before the cut, plus the
  whole second response); input tokens are what each response's ``message_start`` reports.

Run: ``python -m bench.bench_recovery`` (``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, cast

import httpx

from streamrecover.engine.agent import run_agent
from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import InMemoryCheckpointStore
from streamrecover.engine.config import EngineConfig
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest, ProviderConfig
from streamrecover.engine.sink import CollectingSink, StructuredEvent
from streamrecover.engine.sse import SSEDecoder
from streamrecover.providers.registry import get_adapter
from streamrecover.testing.fake import FakeProviderServer

FAST = EngineConfig(backoff_scale=0.0, idle_timeout_s=5.0, request_retry_base_s=0.0)
STORY = "Tell me a long story about the sea [[words={words}]]"
STRATEGIES = {
    # strategy: (wire, model, provider keyword arguments)
    "prefill": ("anthropic", "claude-3-7-sonnet", {}),
    "prefix_flag": ("openai", "deepseek-chat", {"prefix_flag": True}),
    "continue_message": ("openai", "gpt-4o", {}),
}


class TimedSink(CollectingSink):
    """Collects like ``CollectingSink`` and notes when each frame and event arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.frame_times: list[float] = []
        self.event_times: dict[str, float] = {}

    async def on_frame(self, frame: Any) -> None:
        self.frame_times.append(time.time())
        await super().on_frame(frame)

    async def on_event(self, event: StructuredEvent) -> None:
        self.event_times.setdefault(event.name, time.time())
        await super().on_event(event)


@dataclass(slots=True)
class Run:
    sink: TimedSink
    log: list[Any]
    status: str
    messages: list[dict[str, Any]] = field(default_factory=list)


def _provider(server: FakeProviderServer, scenario: str, wire: str, **kw: Any) -> ProviderConfig:
    base = server.base_url if wire == "anthropic" else f"{server.base_url}/v1"
    return ProviderConfig(
        name=wire, base_url=base, api_key="sk-bench", extra_headers={"x-fake-scenario": scenario}, **kw
    )


async def _run(
    server: FakeProviderServer, prompt: str, faults: list[str], strategy: str, engine: EngineConfig = FAST
) -> Run:
    wire, model, kw = STRATEGIES[strategy]
    scenario = uuid.uuid4().hex
    server.set_faults(scenario, faults)
    config = _provider(server, scenario, wire, **kw)
    sink = TimedSink()
    request = ModelRequest(
        model=model, messages=[{"role": "user", "content": [{"type": "text", "text": prompt}]}], max_tokens=4096
    )
    ctx = RunContext(
        run_id=uuid.uuid4().hex,
        adapter=get_adapter(config),
        config=engine,
        sink=sink,
        checkpoints=InMemoryCheckpointStore(),
        cancel=CancelToken(),
    )
    result = await run_agent(ctx, request)
    return Run(sink, server.log_for(scenario), result.status, result.messages)


def _backoff_s(run: Run) -> float:
    started = [e for e in run.sink.events if e.name == "llm_stream_continuation_started"]
    return float(cast(float, started[0].fields["backoff_s"])) if started else 0.0


def _overhead_ms(run: Run) -> float | None:
    """Break -> first continued delta, minus the backoff and the continuation's time to first byte (ms)."""
    attempts = run.sink.attempts
    if len(attempts) < 2 or attempts[0].ended_at is None or attempts[1].first_byte_at is None:
        return None
    broke = attempts[0].ended_at
    ttfb = attempts[1].first_byte_at - attempts[1].started_at
    after = [
        t
        for t, f in zip(run.sink.frame_times, run.sink.frames, strict=True)
        if t > broke and f["type"] in ("text_delta", "thinking_delta")
    ]
    if not after:
        return None
    return (after[0] - broke - ttfb - _backoff_s(run)) * 1000


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def overhead(
    server: FakeProviderServer, repeat: int, cut: int, words: int, backoff_ms: float = 50.0
) -> list[dict[str, Any]]:
    config = replace(FAST, backoff_schedule=(backoff_ms / 1000,), backoff_scale=1.0)
    rows = []
    for strategy in STRATEGIES:
        values, ttfbs, preps = [], [], []
        await _run(server, STORY.format(words=words), [f"cut:bytes={cut}"], strategy, config)  # warm-up
        for _ in range(repeat):
            run = await _run(server, STORY.format(words=words), [f"cut:bytes={cut}"], strategy, config)
            assert run.status == "completed", (strategy, run.status)
            assert [e.understood_as for e in run.log][1] == strategy, [e.understood_as for e in run.log]
            value = _overhead_ms(run)
            if value is not None:
                values.append(value)
                a = run.sink.attempts[1]
                ttfbs.append(((a.first_byte_at or a.started_at) - a.started_at) * 1000)
                broke = run.sink.attempts[0].ended_at or a.started_at
                preps.append((a.started_at - broke - _backoff_s(run)) * 1000)
        rows.append(
            {
                "strategy": strategy,
                "n": len(values),
                "p50": _pct(values, 0.5),
                "p90": _pct(values, 0.9),
                "prep_p50": _pct(preps, 0.5),  # break -> continuation request sent, less the backoff
                "ttfb_p50": _pct(ttfbs, 0.5),
            }
        )
    return rows


async def _naive(server: FakeProviderServer, body: dict[str, Any], headers: dict[str, str], cut: int) -> dict[str, int]:
    """Resend the same request after the cut (a naive retry); what the provider billed."""
    scenario = uuid.uuid4().hex
    server.set_faults(scenario, [f"cut:bytes={cut}", "ok"])
    headers = {**headers, "x-fake-scenario": scenario}
    input_tokens = 0
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(2):
            decoder = SSEDecoder()
            try:
                async with client.stream("POST", f"{server.base_url}/v1/messages", json=body, headers=headers) as r:
                    async for chunk in r.aiter_raw():
                        for event in decoder.feed(chunk):
                            data = json.loads(event.data) if event.data.startswith("{") else {}
                            if data.get("type") == "message_start":
                                input_tokens += int(data["message"]["usage"]["input_tokens"])
                break
            except httpx.HTTPError:
                continue  # cut: retry the same request
    log = server.log_for(scenario)
    return {"output": sum(e.billed_output_tokens for e in log), "input": input_tokens, "requests": len(log)}


async def billing(server: FakeProviderServer, words: int, points: int) -> list[dict[str, Any]]:
    prompt = STORY.format(words=words)
    reference = await _run(server, prompt, [], "prefill")
    total_bytes = reference.log[0].bytes_sent
    uninterrupted = reference.log[0].billed_output_tokens
    request = reference.sink.attempts[0].request
    headers = {k: v for k, v in request["headers"].items() if v != "[redacted]"}
    headers["x-api-key"] = "sk-bench"
    rows = []
    for i in range(1, points + 1):
        cut = int(total_bytes * i / (points + 1))
        ours = await _run(server, prompt, [f"cut:bytes={cut}"], "prefill")
        assert ours.status == "completed"
        assert ours.messages == reference.messages, "a recovered run must equal the uninterrupted one"
        naive = await _naive(server, request["json"], headers, cut)
        rows.append(
            {
                "cut_fraction": i / (points + 1),
                "cut_bytes": cut,
                "uninterrupted_output": uninterrupted,
                "ours_output": sum(e.billed_output_tokens for e in ours.log),
                "ours_input": sum(a.usage.input_tokens or 0 for a in ours.sink.attempts),
                "naive_output": naive["output"],
                "naive_input": naive["input"],
            }
        )
    return rows


async def run_all(
    repeat: int = 30, cut: int = 3000, words: int = 300, points: int = 9, backoff_ms: float = 50.0
) -> dict[str, Any]:
    server = FakeProviderServer()
    await server.start_async()
    try:
        return {
            "overhead": await overhead(server, repeat, cut, words, backoff_ms),
            "billing": await billing(server, words, points),
            "params": {"repeat": repeat, "cut": cut, "words": words, "points": points, "backoff_ms": backoff_ms},
        }
    finally:
        await server.stop_async()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--cut", type=int, default=3000)
    parser.add_argument("--words", type=int, default=300)
    parser.add_argument("--points", type=int, default=9)
    parser.add_argument("--backoff-ms", type=float, default=50.0, help="the backoff before the continuation")
    args = parser.parse_args(argv)
    result = asyncio.run(run_all(args.repeat, args.cut, args.words, args.points, args.backoff_ms))
    for row in result["overhead"]:
        print(row)
    for row in result["billing"]:
        print(row)


if __name__ == "__main__":
    main()
