"""Checkpoint stores that outlive a process: the database and Redis.

Both fulfil ``engine.checkpoint.CheckpointStore``: ``put`` is an idempotent upsert by run
id, ``get`` ignores a checkpoint older than the TTL, ``delete`` is a no-op when absent.
They raise on failure; the engine's ``CheckpointWriter`` logs and carries on, and the
sweeper deletes later what a failed ``delete`` left (``sweep_settled_checkpoints``: the
checkpoints of settled runs). Blocks are
stored byte for byte as streamed (a resume sends them back as the prefix), with one
exception: configured API keys are cut out (exact values, never patterns; a tool's own
``password`` argument is the user's data and survives).
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from ..conf import app_settings
from ..engine.checkpoint import Checkpoint, CheckpointStore, InMemoryCheckpointStore
from ..models import Run, StreamCheckpoint
from ..redaction import cut_secrets

if TYPE_CHECKING:  # redis is the distributed extra: imported only where a Redis store is used
    from redis.asyncio import Redis

log = structlog.get_logger("streamrecover")

REDIS_KEY_PREFIX = "streamrecover:checkpoint:"
SWEEP_LIMIT = 1000  # checkpoints looked at per sweep: one sweep never runs for long
DELETE_RETRY_DELAYS_S = (0.2, 0.5, 1.0)  # a Redis outage of a second or two does not leave a key behind


def _scrubbed(checkpoint: Checkpoint) -> dict[str, Any]:
    return cut_secrets(checkpoint.to_dict())


def _run_uuid(run_id: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(run_id))
    except ValueError:
        return None


class DjangoCheckpointStore:
    """One ``StreamCheckpoint`` row per run, through the async ORM."""

    def __init__(self, ttl_s: float | None = None) -> None:
        self._ttl_s = ttl_s

    @property
    def ttl_s(self) -> float:
        if self._ttl_s is not None:
            return self._ttl_s
        return float(app_settings.CHECKPOINT_TTL)

    async def put(self, checkpoint: Checkpoint) -> None:
        run_uuid = _run_uuid(checkpoint.run_id)
        if run_uuid is None:
            raise ValueError(f"checkpoint run_id is not a run UUID: {checkpoint.run_id!r}")
        await StreamCheckpoint.objects.aupdate_or_create(
            run_id=run_uuid,
            defaults={
                "data": _scrubbed(checkpoint),
                "turn": checkpoint.turn,
                "attempt": checkpoint.attempt,
                "continuation": checkpoint.continuation,
                "seq": checkpoint.seq,
                "updated_at": datetime.fromtimestamp(checkpoint.updated_at, tz=UTC),
            },
        )

    async def get(self, run_id: str) -> Checkpoint | None:
        run_uuid = _run_uuid(run_id)
        if run_uuid is None:
            return None
        try:
            row = await StreamCheckpoint.objects.aget(run_id=run_uuid)
        except StreamCheckpoint.DoesNotExist:
            return None
        checkpoint = Checkpoint.from_dict(row.data)
        return checkpoint if checkpoint.is_fresh(self.ttl_s) else None

    async def delete(self, run_id: str) -> None:
        run_uuid = _run_uuid(run_id)
        if run_uuid is not None:
            await StreamCheckpoint.objects.filter(run_id=run_uuid).adelete()

    def sweep_settled(self, limit: int = SWEEP_LIMIT) -> int:
        """Delete the rows of settled runs (a ``delete`` that failed when the run ended)."""
        settled = StreamCheckpoint.objects.filter(run__status__in=Run.TERMINAL_STATUSES)
        run_ids = list(settled.values_list("run_id", flat=True)[:limit])
        if not run_ids:
            return 0
        deleted, _ = StreamCheckpoint.objects.filter(run_id__in=run_ids, run__status__in=Run.TERMINAL_STATUSES).delete()
        return deleted


class RedisCheckpointStore:
    """A JSON value per run under ``streamrecover:checkpoint:<run_id>``, expiring in Redis.

    Short timeouts and a single retry: the runner awaits each write, so a dead Redis must
    fail fast rather than stall the stream. One client per event loop (a Celery task may
    run each run in its own loop; redis.asyncio connections belong to one loop).

    Every run with a checkpoint is also a member of one set (``index_key``), written in the
    same transaction as the value and removed with it: the sweeper reads the set, not the
    keyspace, to find the checkpoints of settled runs. ``delete`` retries for a second or
    two (``DELETE_RETRY_DELAYS_S``) before it gives up.
    """

    def __init__(
        self,
        url: str,
        ttl_s: float,
        *,
        prefix: str = REDIS_KEY_PREFIX,
        connect_timeout_s: float = 1.0,
        timeout_s: float = 2.0,
    ) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self.prefix = prefix
        self._connect_timeout_s = connect_timeout_s
        self._timeout_s = timeout_s
        self._client: Redis | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"RedisCheckpointStore(ttl_s={self.ttl_s!r}, prefix={self.prefix!r})"  # the URL may hold a password

    def key(self, run_id: str) -> str:
        return f"{self.prefix}{run_id}"

    @property
    def index_key(self) -> str:
        """The set of run ids that have (or had, until their TTL) a checkpoint."""
        return f"{self.prefix}index"

    def _redis(self) -> Redis:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            from redis.asyncio import Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            self._client = Redis.from_url(
                self.url,
                socket_connect_timeout=self._connect_timeout_s,
                socket_timeout=self._timeout_s,
                retry=Retry(NoBackoff(), 1),
            )
            self._loop = loop
        return self._client

    async def put(self, checkpoint: Checkpoint) -> None:
        value = json.dumps(_scrubbed(checkpoint), separators=(",", ":"))
        async with self._redis().pipeline(transaction=True) as pipe:
            pipe.set(self.key(checkpoint.run_id), value, ex=max(1, math.ceil(self.ttl_s)))
            pipe.sadd(self.index_key, checkpoint.run_id)
            await pipe.execute()

    async def get(self, run_id: str) -> Checkpoint | None:
        raw = await self._redis().get(self.key(run_id))
        if raw is None:
            return None
        checkpoint = Checkpoint.from_dict(json.loads(raw))
        return checkpoint if checkpoint.is_fresh(self.ttl_s) else None

    async def delete(self, run_id: str) -> None:
        from redis.exceptions import ConnectionError, TimeoutError

        for delay in (*DELETE_RETRY_DELAYS_S, None):
            try:
                async with self._redis().pipeline(transaction=True) as pipe:
                    pipe.delete(self.key(run_id))
                    pipe.srem(self.index_key, run_id)
                    await pipe.execute()
                return
            except (ConnectionError, TimeoutError):
                if delay is None:
                    raise  # the sweeper deletes it once Redis is back
                await asyncio.sleep(delay)

    def sweep_settled(self, limit: int = SWEEP_LIMIT) -> int:
        """Delete the checkpoints of settled runs (a ``delete`` that failed when the run ended).

        Synchronous (the sweeper is): a client of its own for the call. Looks at up to
        ``limit`` members of the index; a member whose run is gone or terminal is deleted
        with its key. Members of active runs stay, expired value or not: the run's own
        ``delete`` or a later sweep removes them.
        """
        from redis import Redis

        client = Redis.from_url(
            self.url, socket_connect_timeout=self._connect_timeout_s, socket_timeout=self._timeout_s
        )
        try:
            members: list[str] = []
            for member in client.sscan_iter(self.index_key, count=min(limit, 500)):
                members.append(member.decode() if isinstance(member, bytes) else str(member))
                if len(members) >= limit:
                    break
            settled = list(_settled_run_ids(members))
            if settled:
                with client.pipeline(transaction=True) as pipe:
                    pipe.delete(*(self.key(run_id) for run_id in settled))
                    pipe.srem(self.index_key, *settled)
                    pipe.execute()
            return len(settled)
        finally:
            client.close()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
            self._loop = None


def _settled_run_ids(run_ids: Iterable[str]) -> Iterable[str]:
    """Those of ``run_ids`` whose run is terminal or no longer exists (not a run id: settled too)."""
    by_uuid = {uuid_: run_id for run_id in run_ids if (uuid_ := _run_uuid(run_id)) is not None}
    active = set(Run.objects.filter(pk__in=list(by_uuid)).active().values_list("pk", flat=True))
    return [run_id for run_id in run_ids if (uuid_ := _run_uuid(run_id)) is None or uuid_ not in active]


_memory_store = InMemoryCheckpointStore()


def checkpoint_store_from_settings() -> CheckpointStore:
    """The store ``STREAMRECOVER['CHECKPOINT_STORE']`` names; ``memory`` is one per process."""
    kind = app_settings.CHECKPOINT_STORE
    if kind == "memory":
        return _memory_store
    if kind == "orm":
        return DjangoCheckpointStore(ttl_s=float(app_settings.CHECKPOINT_TTL))
    return RedisCheckpointStore(app_settings.REDIS_URL, float(app_settings.CHECKPOINT_TTL))


def sweep_settled_checkpoints(limit: int = SWEEP_LIMIT) -> int:
    """Delete leftover checkpoints of settled runs from the configured store; how many.

    A run's end deletes its checkpoint; when that failed (Redis or the database unreachable
    at that moment), this catches it. The in-memory store's delete cannot fail: nothing to do.
    """
    store: Any = checkpoint_store_from_settings()
    sweep: Callable[[int], int] | None = getattr(store, "sweep_settled", None)
    if sweep is None:
        return 0
    deleted = sweep(limit)
    if deleted:
        log.info("checkpoints_swept", count=deleted)
    return deleted
