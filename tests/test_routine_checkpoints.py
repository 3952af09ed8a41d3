"""A worker killed mid-stream, nothing broken at the provider: the next one resumes from the
last routine checkpoint (the coalescing policy's, not a break's) and the turn keeps its answer
and its max_tokens. Real HTTP against the fake provider.

The fake holds the stream (a stall) right after the delta the worker dies at, so what it bills
is exactly what the dead worker received: the budget check is not at the mercy of how much a
loopback socket buffers.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from streamrecover.engine.agent import RunResult, run_agent
from streamrecover.engine.checkpoint import Checkpoint, InMemoryCheckpointStore
from streamrecover.engine.config import EngineConfig
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest, ProviderConfig
from streamrecover.engine.sink import CollectingSink
from streamrecover.providers.registry import get_adapter
from streamrecover.testing.client import ClientView
from streamrecover.testing.fake import FakeProviderServer

from .harness import DiesAtFrame, WorkerDied, events_through_delta, events_until, provider, run, user, with_config

THINKING_MODEL = "claude-sonnet-4-5"
# small enough that the fake's thinking block (25 deltas) spans several routine checkpoints,
# far from one per delta
EVERY_8_DELTAS = with_config(checkpoint_every_deltas=8, checkpoint_every_seconds=60.0)


class Resumed:
    """One run killed by ``dying`` and resumed by a second worker, both against one store."""

    def __init__(self, server: FakeProviderServer, request: ModelRequest, config: EngineConfig, stall_at: int) -> None:
        self.server, self.request, self.config = server, request, config
        self.scenario, self.run_id = uuid.uuid4().hex, uuid.uuid4().hex
        self.store = InMemoryCheckpointStore()
        # held there for longer than the worker lives; then cut (no worker reads it any more)
        server.set_faults(self.scenario, [f"stall:events={stall_at},seconds=0.5,then=cut"])

    def context(self, sink: CollectingSink) -> RunContext:
        adapter = get_adapter(provider(self.server, self.scenario))
        return RunContext(run_id=self.run_id, adapter=adapter, config=self.config, sink=sink, checkpoints=self.store)

    async def kill(self, dying: DiesAtFrame) -> Checkpoint | None:
        with pytest.raises(WorkerDied):
            await run_agent(self.context(dying), self.request)
        return await self.store.get(self.run_id)

    async def resume(self) -> tuple[RunResult, CollectingSink]:
        sink = CollectingSink()
        return await run_agent(self.context(sink), self.request, resume=True), sink

    def billed(self) -> int:
        return sum(e.billed_output_tokens for e in self.server.log_for(self.scenario))


def _rebuilt_turns(*sinks: CollectingSink) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """What a client shown every frame of both workers, in order, rebuilt, beside what was committed."""
    view = ClientView()
    for sink in sinks:
        view.apply_all(sink.frames)
    return view.turns


@pytest.mark.parametrize(
    ("model", "thinking_budget"),
    [("claude-3-7-sonnet", None), (THINKING_MODEL, 1024)],
    ids=["text", "text_after_thinking"],
)
async def test_a_worker_killed_mid_answer_resumes_from_its_routine_checkpoint(fake_server, model, thinking_budget):
    prompt, max_tokens = "A story [[words=200]]", 2000
    reference = await run(fake_server, prompt, model=model, thinking_budget=thinking_budget, max_tokens=max_tokens)
    assert reference.status == "completed"
    request = ModelRequest(model=model, messages=[user(prompt)], max_tokens=max_tokens, thinking_budget=thinking_budget)
    dies_at = 150  # text deltas: past a few routine checkpoints, far from the answer's end
    resumed = Resumed(
        fake_server, request, EVERY_8_DELTAS, await events_through_delta(fake_server, reference, "text_delta", dies_at)
    )
    dying = DiesAtFrame("text_delta", dies_at)

    checkpoint = await resumed.kill(dying)
    assert checkpoint is not None  # written by the policy: nothing broke, no break wrote it
    # bounded by the policy (the thinking block before the text is 26 deltas): never one per delta
    assert resumed.store.writes <= 1 + (dies_at + 30) // 8
    shown = "".join(f["text"] for f in dying.frames if f["type"] == "text_delta")
    kept = "".join(b.get("text", "") for b in checkpoint.blocks)
    assert kept
    assert shown.startswith(kept)
    assert len(kept) < len(shown)  # the checkpoint is behind the worker, as routine ones are

    result, sink = await resumed.resume()
    assert result.status == "completed", result.error
    assert [a.kind for a in sink.attempts] == ["resume"]
    assert result.new_messages == reference.result.new_messages  # byte for byte
    assert [(rebuilt, committed) for rebuilt, committed in _rebuilt_turns(dying, sink) if rebuilt != committed] == []
    assert _rebuilt_turns(dying, sink)
    assert resumed.billed() <= max_tokens


async def test_a_worker_killed_inside_a_long_thinking_block_leaves_the_thinking_it_was_billed(fake_server):
    # The worker dies 20 thinking deltas in, nothing broken at the provider. Thinking deltas did
    # not count toward the routine checkpoints: none was written, and the next worker started the
    # turn over asking for the whole max_tokens again; the turn was billed past it.
    prompt, max_tokens = "A story [[words=3000]]", 1500  # an answer that runs to its max_tokens
    reference = await run(fake_server, prompt, model=THINKING_MODEL, thinking_budget=1024, max_tokens=max_tokens)
    request = ModelRequest(model=THINKING_MODEL, messages=[user(prompt)], max_tokens=max_tokens, thinking_budget=1024)
    dies_at = 20
    resumed = Resumed(
        fake_server,
        request,
        EVERY_8_DELTAS,
        await events_through_delta(fake_server, reference, "thinking_delta", dies_at),
    )
    dying = DiesAtFrame("thinking_delta", dies_at)

    checkpoint = await resumed.kill(dying)
    assert checkpoint is not None
    assert resumed.store.writes == dies_at // 8  # the policy's writes, no more
    assert checkpoint.blocks == []  # unfinished thinking is never kept
    assert checkpoint.dropped_output >= 16  # but what it cost is: the deltas up to the last write
    (first,) = fake_server.log_for(resumed.scenario)
    assert first.billed_output_tokens == dies_at

    result, sink = await resumed.resume()
    assert result.status == "completed", result.error
    assert [a.kind for a in sink.attempts] == ["restart"]
    asked = sink.attempts[0].request["json"]["max_tokens"]
    assert asked <= max_tokens - first.billed_output_tokens
    assert resumed.billed() <= max_tokens
    # the client was told to drop the thinking it had been shown, and rebuilt what was committed
    assert [(rebuilt, committed) for rebuilt, committed in _rebuilt_turns(dying, sink) if rebuilt != committed] == []


async def test_a_worker_killed_inside_a_continuations_thinking_leaves_a_checkpoint_that_follows_it(fake_server):
    # The answer breaks in its text; the continuation starts with thinking of its own (dropped
    # once it closes: it would follow the kept text) and the worker dies 10 deltas into it. The
    # last checkpoint was the break's: the next worker counted the answer as it stood then, not
    # the thinking billed since, and asked for more than was left.
    prompt, max_tokens = "A story [[words=3000]]", 1500
    reference = await run(fake_server, prompt, model=THINKING_MODEL, thinking_budget=1024, max_tokens=max_tokens)
    request = ModelRequest(model=THINKING_MODEL, messages=[user(prompt)], max_tokens=max_tokens, thinking_budget=1024)
    cut = await events_until(fake_server, reference, "thinking") + 41  # its signed thinking and 40 text deltas
    dies_at = 10
    resumed = Resumed(fake_server, request, EVERY_8_DELTAS, stall_at=3 + dies_at)  # message_start, block start, ping
    fake_server.set_faults(resumed.scenario, [f"cut:events={cut}", f"stall:events={3 + dies_at},seconds=0.5,then=cut"])
    first_thinking = sum(1 for f in reference.sink.frames if f["type"] == "thinking_delta")
    dying = DiesAtFrame("thinking_delta", first_thinking + dies_at)

    checkpoint = await resumed.kill(dying)
    assert [a.kind for a in dying.attempts] == ["initial", "continuation"]
    assert checkpoint is not None
    assert checkpoint.attempt == 1  # written while the continuation streamed, not at the break
    # what it keeps is what the break kept: the continuation's unfinished thinking is not in it
    assert [b["type"] for b in checkpoint.blocks] == ["thinking", "text"]
    billed_before = resumed.billed()
    assert fake_server.log_for(resumed.scenario)[1].billed_output_tokens == dies_at

    result, sink = await resumed.resume()
    assert result.status == "completed", result.error
    assert sink.attempts[0].request["json"]["max_tokens"] <= max_tokens - billed_before
    assert resumed.billed() <= max_tokens
    assert [(rebuilt, committed) for rebuilt, committed in _rebuilt_turns(dying, sink) if rebuilt != committed] == []


# Output the fake does not write: a redacted thinking block (whole in its start) and a compaction
# summary (streamed in field deltas, shown once it closes), each of ``OPAQUE_TOKENS`` billed
# tokens, before the answer's text.
OPAQUE_TOKENS = 400
OPAQUE = "RWFzdGVyIGVnZw" * (OPAQUE_TOKENS // 4)  # 3.5 characters a token, as encrypted thinking has


@pytest.mark.parametrize(
    "opaque",
    [
        ({"type": "redacted_thinking", "data": OPAQUE}, []),
        ({"type": "compaction", "content": None}, [{"type": "compaction_delta", "content": OPAQUE}]),
    ],
    ids=["redacted_thinking", "compaction"],
)
async def test_a_resumed_turn_counts_the_opaque_output_before_its_checkpointed_text(opaque):
    # The worker dies 20 text deltas into the answer, a routine checkpoint holding the block and
    # the text before it. The block's output was not counted as received (only text, thinking and
    # tool calls were): the next worker asked for max_tokens less the text, as if the block had
    # cost nothing, and the turn could be billed past max_tokens.
    from .scripted import ScriptedTransport, anthropic_blocks

    block, deltas = opaque
    words = [{"type": "text_delta", "text": f"w{n} "} for n in range(40)]
    first = anthropic_blocks((block, deltas, True), ({"type": "text", "text": ""}, words, False))
    rest = anthropic_blocks(({"type": "text", "text": ""}, [{"type": "text_delta", "text": "end."}], True), ended=True)
    transport = ScriptedTransport([(200, {}, first), (200, {}, rest)])
    store, run_id, max_tokens = InMemoryCheckpointStore(), uuid.uuid4().hex, 2000
    request = ModelRequest(model="claude-3-7-sonnet", messages=[user("Tell me something")], max_tokens=max_tokens)

    def context(sink: CollectingSink) -> RunContext:
        adapter = get_adapter(ProviderConfig(name="anthropic", base_url="https://scripted.invalid", api_key="k"))
        return RunContext(
            run_id=run_id,
            adapter=adapter,
            config=EVERY_8_DELTAS,
            sink=sink,
            checkpoints=store,
            transport=transport,  # type: ignore[arg-type]  # the transport's interface, not its class
        )

    dying = DiesAtFrame("text_delta", 20)
    with pytest.raises(WorkerDied):
        await run_agent(context(dying), request)
    checkpoint = await store.get(run_id)
    assert checkpoint is not None
    assert [b["type"] for b in checkpoint.blocks] == [block["type"], "text"]

    sink = CollectingSink()
    result = await run_agent(context(sink), request, resume=True)
    assert result.status == "completed", result.error
    billed_before = OPAQUE_TOKENS + 20  # the block, and a token a text delta
    assert transport.requests[-1]["max_tokens"] <= max_tokens - billed_before
    assert [(rebuilt, committed) for rebuilt, committed in _rebuilt_turns(dying, sink) if rebuilt != committed] == []
