"""The Redis checkpoint store sends a loop's writes together, and each writer still gets its own outcome."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import redis

from streamrecover.engine.errors import ClaimLost
from streamrecover.redaction import json_holds_secret
from streamrecover.runs.checkpoints import RedisCheckpointStore

from .factories import make_checkpoint

DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
def store(redis_checkpoint_store: RedisCheckpointStore) -> RedisCheckpointStore:
    return redis_checkpoint_store


async def test_many_runs_write_in_one_call_and_only_the_stale_claim_is_refused(store: RedisCheckpointStore) -> None:
    run_ids = [str(uuid.uuid4()) for _ in range(50)]
    stale = run_ids[7]
    await store.get(stale, epoch=5)  # a newer claim (5) has read the run: claim 3 may not write

    def checkpoint(run_id: str) -> object:
        epoch = 3 if run_id == stale else 1
        return make_checkpoint(run_id, epoch=epoch, blocks=[{"type": "text", "text": f"answer of {run_id}"}])

    outcomes = await asyncio.gather(*(store.put(checkpoint(run_id)) for run_id in run_ids), return_exceptions=True)  # type: ignore[arg-type]

    assert [type(o).__name__ for o in outcomes if o is not None] == ["ClaimLost"]
    assert isinstance(outcomes[7], ClaimLost)
    for run_id in run_ids:
        stored = await store.get(run_id)
        if run_id == stale:
            assert stored is None
        else:
            assert stored is not None
            assert stored.blocks == [{"type": "text", "text": f"answer of {run_id}"}]
    assert store._batched().batches == 1  # fifty writes, one round trip
    assert await store._redis().smembers(store.index_key) == {r.encode() for r in run_ids if r != stale}


async def test_a_write_cancelled_before_it_left_is_never_sent(store: RedisCheckpointStore) -> None:
    run_id = str(uuid.uuid4())
    writing = asyncio.create_task(store.put(make_checkpoint(run_id, epoch=1)))
    await asyncio.sleep(0)  # staged, not sent yet
    writing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writing
    await store._batched().barrier()
    assert await store.get(run_id) is None

    await store.put(make_checkpoint(run_id, epoch=1, blocks=[{"type": "text", "text": "later"}]))
    stored = await store.get(run_id)
    assert stored is not None
    assert stored.blocks == [{"type": "text", "text": "later"}]


async def test_a_delete_lands_after_the_write_staged_before_it(store: RedisCheckpointStore) -> None:
    run_id = str(uuid.uuid4())
    writing = asyncio.create_task(store.put(make_checkpoint(run_id, epoch=1)))
    await asyncio.sleep(0)  # staged: the delete must not overtake it
    await store.delete(run_id, epoch=1)
    await writing
    assert await store.get(run_id) is None
    assert await store._redis().sismember(store.index_key, run_id) == 0


async def test_every_writer_of_a_failed_call_gets_the_error() -> None:
    dead = RedisCheckpointStore(DEAD_REDIS, ttl_s=60)
    outcomes = await asyncio.gather(
        *(dead.put(make_checkpoint(str(uuid.uuid4()), epoch=1)) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(o, redis.exceptions.ConnectionError) for o in outcomes), outcomes
    await dead.aclose()


@pytest.mark.parametrize("secret", ["sk-plain-0123456789", 'quote"and\\slash', "clé-sécrète-ü", "tab\tkey-123"])
def test_a_secret_is_found_in_json_whatever_json_escapes_in_it(secret: str) -> None:
    document = json.dumps({"blocks": [{"type": "text", "text": f"before {secret} after"}]}, separators=(",", ":"))
    assert json_holds_secret(document, [secret])
    assert not json_holds_secret(document, [secret + "x"])
    assert not json_holds_secret(document, ["short"])  # below the length a key is cut at


def test_a_checkpoints_json_is_its_dict() -> None:
    checkpoint = make_checkpoint(
        str(uuid.uuid4()),
        epoch=2,
        blocks=[
            {"type": "text", "text": 'é\n"x"'},
            {"type": "tool_use", "id": "t", "name": "n", "input": {"a": [1]}},
        ],
        native={"response_id": "r", "after": 3, "open_text": True},
        discarded_tools=[{"id": "t2", "name": "m"}],
    )
    assert json.loads(checkpoint.to_json()) == checkpoint.to_dict()
