"""A structured answer resumed after its worker died starts over, as an unbroken worker's would."""

from __future__ import annotations

import uuid

import pytest

from streamrecover.engine.agent import run_agent
from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import InMemoryCheckpointStore
from streamrecover.engine.context import RunContext
from streamrecover.engine.contract import ModelRequest
from streamrecover.engine.sink import AttemptOutcome, CollectingSink
from streamrecover.providers.registry import get_adapter
from streamrecover.testing.client import ClientView

from .harness import FAST, DiesAt, WorkerDied, provider, run, user

STORY = "Tell me a story about the sea [[words=120]]"
MODEL = "gpt-4o"  # continues a broken answer with a continue message: a structured one restarts


@pytest.mark.parametrize(
    ("index", "outcome"),
    [(0, AttemptOutcome.INTERRUPTED), (1, AttemptOutcome.PENDING)],
    ids=["as_it_breaks", "as_it_starts_over"],
)
async def test_a_resumed_structured_answer_starts_over_instead_of_being_continued(fake_server, index, outcome):
    # The answer breaks mid-JSON; the worker dies as the break is recorded (the checkpoint holds
    # the text the client was shown) or as the answer starts over (the client was told to drop
    # that text). The next worker continued the partial JSON from the checkpoint's text (a continue
    # message after half a document), which an unbroken worker never does for a structured answer:
    # it starts over, and commits the whole answer the client then shows.
    reference = await run(fake_server, STORY, wire="openai", model=MODEL, structured=True)
    scenario, run_id = uuid.uuid4().hex, uuid.uuid4().hex
    fake_server.set_faults(scenario, ["cut:bytes=1200"])
    store = InMemoryCheckpointStore()
    request = ModelRequest(model=MODEL, messages=[user(STORY)], max_tokens=4096, structured=True)

    def context(sink: CollectingSink) -> RunContext:
        adapter = get_adapter(provider(fake_server, scenario, "openai"))
        return RunContext(run_id=run_id, adapter=adapter, config=FAST, sink=sink, checkpoints=store)

    dying = DiesAt(index, outcome)
    with pytest.raises(WorkerDied):
        await run_agent(context(dying), request)
    view = ClientView([user(STORY)]).apply_all(dying.frames)
    assert await store.get(run_id) is not None

    sink = CollectingSink()
    result = await run_agent(context(sink), request, resume=True)
    assert result.status == "completed", result.error
    assert [a.kind for a in sink.attempts] == ["restart"]
    asked = fake_server.log_for(scenario)
    assert [e.understood_as for e in asked] == ["fresh"] * len(asked)  # never a partial answer to go on from
    assert result.new_messages == reference.result.new_messages  # the whole answer, as if never broken
    view.apply_all(sink.frames)
    assert view.turns == [(result.new_messages[0]["content"],) * 2]  # the client shows what is committed


async def test_a_structured_answer_cancelled_after_it_started_over_commits_nothing(fake_server):
    # The answer broke mid-JSON and its client was told to drop what it had shown; the worker died
    # as the answer started over, and the run was cancelled before another worker claimed it. The
    # checkpoint written at the break still held the dropped text, and the next worker committed
    # that half JSON document, which an unbroken worker cancelled then does not: it commits what
    # its client holds, nothing.
    scenario, run_id = uuid.uuid4().hex, uuid.uuid4().hex
    fake_server.set_faults(scenario, ["cut:bytes=1200"])
    store = InMemoryCheckpointStore()
    request = ModelRequest(model=MODEL, messages=[user(STORY)], max_tokens=4096, structured=True)

    def context(sink: CollectingSink, cancel: CancelToken) -> RunContext:
        adapter = get_adapter(provider(fake_server, scenario, "openai"))
        return RunContext(run_id=run_id, adapter=adapter, config=FAST, sink=sink, checkpoints=store, cancel=cancel)

    dying = DiesAt(1, AttemptOutcome.PENDING)
    with pytest.raises(WorkerDied):
        await run_agent(context(dying, CancelToken()), request)
    view = ClientView([user(STORY)]).apply_all(dying.frames)
    assert [f["reason"] for f in dying.frames if f["type"] == "stream_reset"] == ["whole_restart"]
    assert view.reconstructed() == []  # the client holds nothing of the answer

    cancel = CancelToken()
    cancel.cancel("user pressed stop")
    sink = CollectingSink()
    result = await run_agent(context(sink, cancel), request, resume=True)
    assert result.status == "cancelled"
    assert result.new_messages == []
    assert len(fake_server.log_for(scenario)) == 1  # nothing asked for again
    view.apply_all(sink.frames)
    assert view.reconstructed() == []
    assert await store.get(run_id) is None
