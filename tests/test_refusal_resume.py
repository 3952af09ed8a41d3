"""A refusal is still one after a worker died in it: the checkpoint keeps the flag, and the worker
that resumes from it shows the client the refusal's text as a refusal again."""

from __future__ import annotations

import uuid

import pytest

from streamrecover.engine.blocks import TEXT, Block
from streamrecover.engine.checkpoint import Checkpoint, InMemoryCheckpointStore
from streamrecover.testing.fake.model import REFUSAL_TEXT

from .harness import DiesAtFrame, WorkerDied, run, with_config

PROMPT = "Explain something forbidden [[refuse]]"
EVERY_DELTA = with_config(checkpoint_every_deltas=1, checkpoint_every_seconds=60.0)


def test_a_refusal_block_keeps_its_flag_through_a_checkpoint_and_an_older_one_reads_as_text() -> None:
    refusal = Block(0, TEXT, text="I'm sorry, but", refusal=True)
    answer = Block(1, TEXT, text="Rivers flow", closed=True)
    stored = Checkpoint("run", 0, 1, [refusal.to_checkpoint(), answer.to_checkpoint()]).to_json()

    read = Checkpoint.from_json(stored).blocks
    assert [Block.from_checkpoint(i, c).refusal for i, c in enumerate(read)] == [True, False]
    assert refusal.to_content() == {"type": "text", "text": "I'm sorry, but"}  # history has no such field
    older = {"type": "text", "text": "I'm sorry, but"}  # written before the flag was kept
    assert Block.from_checkpoint(0, older).refusal is False


async def test_a_chat_refusal_cut_by_a_workers_death_is_replayed_as_a_refusal_and_not_continued(fake_server) -> None:
    scenario, run_id, store = uuid.uuid4().hex, uuid.uuid4().hex, InMemoryCheckpointStore()
    once = {"wire": "openai", "model": "gpt-4o", "config": EVERY_DELTA, "checkpoints": store, "run_id": run_id}
    dying = DiesAtFrame("text_delta", 4)
    with pytest.raises(WorkerDied):
        await run(fake_server, PROMPT, scenario=scenario, sink=dying, **once)
    shown = [f for f in dying.frames if f["type"] == "text_delta"]
    assert all(f.get("refusal") is True for f in shown)
    checkpoint = await store.get(run_id)
    assert checkpoint is not None
    kept = checkpoint.blocks[0]["text"]
    assert kept
    assert REFUSAL_TEXT.startswith(kept)

    resumed = await run(fake_server, PROMPT, scenario=scenario, resume=True, **once)
    assert resumed.status == "completed", resumed.result.error
    frames = resumed.sink.frames
    reset = next(i for i, f in enumerate(frames) if f["type"] == "stream_reset")
    replayed = [f for f in frames[reset:] if f["type"] == "text_delta"]
    assert [(f["text"], f.get("refusal")) for f in replayed] == [(kept, True)]
    # never continued, as at a break: what arrived of it is the answer, the provider asked nothing
    assert len(resumed.log) == 1
    assert resumed.assistant[-1]["content"] == [{"type": "text", "text": kept}]
