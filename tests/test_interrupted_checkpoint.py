"""A response that broke is checkpointed before its attempt is recorded as ended.

Found by the chaos harness (seed 105, a run billed its first 12 characters twice): a response
ended by an error event after a few deltas, the attempt was recorded as interrupted, and the
worker was killed before the turn checkpointed what had arrived (that happened only on the way
to the continuation, after a few more writes). The next claim found no checkpoint and asked for
the answer from the start. Now what arrived is in the checkpoint before the attempt's end is
recorded, so a worker dying after that leaves it to the next claim.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from streamrecover.engine.agent import run_agent
from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import InMemoryCheckpointStore
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest
from streamrecover.engine.sink import AttemptOutcome, AttemptRecord, CollectingSink
from streamrecover.providers.registry import get_adapter

from .harness import FAST, provider, user

PROMPT = "Tell me a story [[words=60]]"


class WorkerDied(BaseException):
    """Where the test kills the worker: nothing after it runs."""


class DiesWhenAnAttemptBreaks(CollectingSink):
    async def on_attempt(self, attempt: AttemptRecord) -> None:
        await super().on_attempt(attempt)
        if attempt.outcome == AttemptOutcome.INTERRUPTED:
            raise WorkerDied("killed as the interrupted attempt was recorded")


def _context(server: Any, scenario: str, run_id: str, store: InMemoryCheckpointStore, sink: Any) -> RunContext:
    return RunContext(
        run_id=run_id,
        adapter=get_adapter(provider(server, scenario)),
        config=FAST,
        sink=sink,
        checkpoints=store,
        cancel=CancelToken(),
    )


async def test_a_worker_killed_as_a_broken_attempt_is_recorded_leaves_what_arrived_to_the_next(fake_server):
    scenario, run_id = uuid.uuid4().hex, uuid.uuid4().hex
    fake_server.set_faults(scenario, ["error:events=12,type=overloaded_error"])
    store = InMemoryCheckpointStore()
    request = ModelRequest(model="claude-3-7-sonnet", messages=[user(PROMPT)], max_tokens=4096)

    with pytest.raises(WorkerDied):
        await run_agent(_context(fake_server, scenario, run_id, store, DiesWhenAnAttemptBreaks()), request)
    first = fake_server.log_for(scenario)[0]
    assert first.billed_text  # some text arrived before the error event
    checkpoint = await store.get(run_id)
    assert checkpoint is not None
    assert "".join(b.get("text", "") for b in checkpoint.blocks) == first.billed_text

    sink = CollectingSink()
    result = await run_agent(_context(fake_server, scenario, run_id, store, sink), request, resume=True)
    assert result.status == "completed"
    second = fake_server.log_for(scenario)[1]
    assert second.prefix_matched
    assert second.prefix_chars == len(first.billed_text)  # goes on from it: nothing billed twice
    answer = result.messages[-1]["content"][0]["text"]
    assert answer == first.billed_text + second.billed_text
