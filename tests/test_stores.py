"""Checkpoint stores on PostgreSQL and Redis: the engine's contract, TTL, failure."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from django.test import override_settings

from streamrecover.engine.checkpoint import CheckpointWriter, CoalescePolicy, InMemoryCheckpointStore
from streamrecover.models import StreamCheckpoint
from streamrecover.runs.checkpoints import DjangoCheckpointStore, RedisCheckpointStore, checkpoint_store_from_settings

from .factories import make_checkpoint, make_run

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-ant-api03-test-NOT-A-REAL-KEY-0123456789"
DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
def redis_store(redis_checkpoint_store: RedisCheckpointStore) -> RedisCheckpointStore:
    return redis_checkpoint_store


@pytest.fixture
def orm_store() -> DjangoCheckpointStore:
    return DjangoCheckpointStore(ttl_s=60)


@pytest.fixture(params=["orm", "redis"])
def store(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_store")


async def new_run_id() -> str:
    return str((await sync_to_async(make_run)()).pk)


async def test_round_trip(store: Any) -> None:
    run_id = await new_run_id()
    checkpoint = make_checkpoint(
        run_id,
        blocks=[
            {"type": "text", "text": "Hello wor"},
            {"type": "tool_use", "id": "t1", "name": "login", "input": {"password": "hunter2"}},
        ],
        in_flight_tool={"id": "t2", "name": "search", "partial_input_bytes": 7},
        attempt=2,
        continuation=1,
        seq=41,
    )
    assert await store.get(run_id) is None
    await store.put(checkpoint)
    assert await store.get(run_id) == checkpoint  # a tool's own "password" argument survives
    await store.delete(run_id)
    assert await store.get(run_id) is None
    await store.delete(run_id)  # absent: no error


async def test_put_is_an_idempotent_upsert(store: Any) -> None:
    run_id = await new_run_id()
    first = make_checkpoint(run_id, seq=1)
    await store.put(first)
    await store.put(first)
    second = make_checkpoint(run_id, seq=2, blocks=[{"type": "text", "text": "Partial answer"}])
    await store.put(second)
    assert await store.get(run_id) == second
    if isinstance(store, DjangoCheckpointStore):
        rows = await sync_to_async(list)(StreamCheckpoint.objects.filter(run_id=run_id).values_list("seq", flat=True))
        assert rows == [2]
    else:
        keys = [k async for k in store._redis().scan_iter(match=f"{store.prefix}*")]
        assert sorted(keys) == sorted([store.key(run_id).encode(), store.index_key.encode()])  # one value, one index
        assert await store._redis().smembers(store.index_key) == {run_id.encode()}


async def test_ttl_is_enforced_on_get(store: Any) -> None:
    run_id = await new_run_id()
    await store.put(make_checkpoint(run_id, updated_at=time.time() - 61))
    assert await store.get(run_id) is None
    await store.put(make_checkpoint(run_id, updated_at=time.time() - 30))
    assert await store.get(run_id) is not None


async def test_redis_sets_the_ttl_on_the_key(redis_store: RedisCheckpointStore) -> None:
    run_id = str(uuid.uuid4())
    await redis_store.put(make_checkpoint(run_id))
    assert redis_store.key(run_id).startswith("streamrecover:")
    ttl = await redis_store._redis().ttl(redis_store.key(run_id))
    assert 0 < ttl <= 60


async def test_default_redis_key_is_namespaced() -> None:
    assert RedisCheckpointStore("redis://x", 1).key("abc") == "streamrecover:checkpoint:abc"


async def test_configured_api_key_never_reaches_a_checkpoint(store: Any) -> None:
    run_id = await new_run_id()
    providers = {"anthropic": {"ADAPTER": "anthropic", "BASE_URL": "https://api.anthropic.com", "API_KEY": SECRET}}
    with override_settings(STREAMRECOVER={"PROVIDERS": providers}):
        await store.put(make_checkpoint(run_id, blocks=[{"type": "text", "text": f"the key is {SECRET}."}]))
    stored = await store.get(run_id)
    assert stored is not None
    assert SECRET not in str(stored.to_dict())
    assert stored.blocks[0]["text"] == "the key is [redacted]."


async def test_orm_store_rejects_a_run_id_that_is_not_a_run() -> None:
    store = DjangoCheckpointStore(ttl_s=60)
    assert await store.get("not-a-uuid") is None
    with pytest.raises(ValueError, match="run UUID"):
        await store.put(make_checkpoint("not-a-uuid"))


async def test_orm_store_reads_the_ttl_from_settings() -> None:
    run_id = await new_run_id()
    store = DjangoCheckpointStore()
    await store.put(make_checkpoint(run_id, updated_at=time.time() - 100))
    with override_settings(STREAMRECOVER={"CHECKPOINT_TTL": 50}):
        assert await store.get(run_id) is None
    with override_settings(STREAMRECOVER={"CHECKPOINT_TTL": 500}):
        assert await store.get(run_id) is not None


async def test_dead_redis_raises_and_the_writer_carries_on() -> None:
    dead = RedisCheckpointStore(DEAD_REDIS, ttl_s=60)
    checkpoint = make_checkpoint(str(uuid.uuid4()))
    started = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError):
        await dead.put(checkpoint)
    with pytest.raises(redis.exceptions.ConnectionError):
        await dead.get(checkpoint.run_id)

    reported: list[tuple[str, BaseException]] = []
    writer = CheckpointWriter(dead, CoalescePolicy(), on_error=lambda name, exc: reported.append((name, exc)))
    await writer.write(checkpoint)  # does not raise
    await writer.delete(checkpoint.run_id)
    assert [name for name, _ in reported] == ["checkpoint_put_failed", "checkpoint_delete_failed"]
    assert writer.writes == 0
    assert time.monotonic() - started < 10  # fails fast: the runner awaits every write
    await dead.aclose()


@pytest.mark.parametrize(
    ("kind", "cls"),
    [("memory", InMemoryCheckpointStore), ("orm", DjangoCheckpointStore), ("redis", RedisCheckpointStore)],
)
def test_store_from_settings(kind: str, cls: type) -> None:
    with override_settings(STREAMRECOVER={"CHECKPOINT_STORE": kind, "CHECKPOINT_TTL": 42, "REDIS_URL": DEAD_REDIS}):
        store = checkpoint_store_from_settings()
        assert isinstance(store, cls)
        if kind != "memory":
            assert store.ttl_s == 42
        if kind == "memory":
            assert checkpoint_store_from_settings() is store  # one per process
    if kind == "redis":
        assert DEAD_REDIS not in repr(store)
