"""Checkpoint stores that outlive a process: the database and Redis.

Both fulfil ``engine.checkpoint.CheckpointStore``: ``put`` is an idempotent upsert by run
id, ``get`` ignores a checkpoint older than the TTL, ``delete`` is a no-op when absent.
They raise on failure; the engine's ``CheckpointWriter`` logs and carries on, and the
sweeper deletes later what a failed ``delete`` left (``sweep_settled_checkpoints``: the
checkpoints of settled runs). Blocks are
stored byte for byte as streamed (a resume sends them back as the prefix), with one
exception: configured API keys are cut out (exact values, never patterns; a tool's own
``password`` argument is the user's data and survives).

Fencing (``engine.checkpoint``): with an ``epoch``, the ORM store writes only in a transaction
that holds the run's row at that epoch; the Redis store keeps the highest epoch seen in a key
beside the checkpoint and compares it in the same Lua script as the write.
``FencedCheckpointStore`` is what a worker hands the engine: its claim's epoch on every call.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import structlog
from asgiref.sync import sync_to_async
from django.db import transaction

from ..conf import app_settings
from ..engine.checkpoint import Checkpoint, CheckpointStore, InMemoryCheckpointStore, UnreadableCheckpoint
from ..engine.errors import ClaimLost
from ..models import Run, StreamCheckpoint
from ..redaction import configured_secrets, cut_secrets, json_holds_secret
from ..redisclients import shared_async_client
from .checkpoint_puts import CheckpointPuts
from .fence import Fence

if TYPE_CHECKING:  # redis is the distributed extra: imported only where a Redis store is used
    from redis.asyncio import Redis

log = structlog.get_logger("streamrecover")

REDIS_KEY_PREFIX = "streamrecover:checkpoint:"
SWEEP_LIMIT = 1000  # checkpoints looked at per sweep: one sweep never runs for long
DELETE_RETRY_DELAYS_S = (0.2, 0.5, 1.0)  # a Redis outage of a second or two does not leave a key behind
FENCE_TTL_S = 7 * 24 * 3600  # a run's highest epoch outlives its checkpoint: a late writer stays refused


def _refused(run_id: str, epoch: int) -> ClaimLost:
    return ClaimLost(f"run {run_id}: checkpoint write of claim {epoch} refused, the claim is no longer current")


def _hold(run_uuid: uuid.UUID, epoch: int) -> None:
    """Inside a transaction: lock the run's row at ``epoch`` (a claim takes the same lock)."""
    if not Run.objects.select_for_update().filter(pk=run_uuid, claim_epoch=epoch).exists():
        raise _refused(str(run_uuid), epoch)


def _scrubbed(checkpoint: Checkpoint) -> dict[str, Any]:
    return cut_secrets(checkpoint.to_dict())


def _encoded(checkpoint: Checkpoint) -> str:
    """The checkpoint as stored in Redis: compact JSON, configured API keys cut out.

    Walking and copying the checkpoint to look for a key was most of a write's cost; the
    encoded text is searched instead, and walked only when a key is in it."""
    text = checkpoint.to_json()
    secrets = configured_secrets()
    if json_holds_secret(text, secrets):
        text = json.dumps(cut_secrets(checkpoint.to_dict(), secrets=secrets), separators=(",", ":"))
    return text


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
        await sync_to_async(self._put)(run_uuid, checkpoint)

    def _put(self, run_uuid: uuid.UUID, checkpoint: Checkpoint) -> None:
        with transaction.atomic():
            if checkpoint.epoch:
                _hold(run_uuid, checkpoint.epoch)
            StreamCheckpoint.objects.update_or_create(
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

    async def get(self, run_id: str, *, epoch: int | None = None) -> Checkpoint | None:
        run_uuid = _run_uuid(run_id)
        if run_uuid is None:
            return None
        try:
            row = await StreamCheckpoint.objects.aget(run_id=run_uuid)
        except StreamCheckpoint.DoesNotExist:
            return None
        checkpoint = Checkpoint.from_dict(row.data)
        return checkpoint if checkpoint.is_fresh(self.ttl_s) else None

    async def delete(self, run_id: str, *, epoch: int | None = None) -> None:
        run_uuid = _run_uuid(run_id)
        if run_uuid is not None:
            await sync_to_async(self._delete)(run_uuid, epoch)

    def _delete(self, run_uuid: uuid.UUID, epoch: int | None) -> None:
        with transaction.atomic():
            if epoch:
                _hold(run_uuid, epoch)
            StreamCheckpoint.objects.filter(run_id=run_uuid).delete()

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

    Fenced calls (an ``epoch``) run as Lua scripts that compare and raise the run's highest
    epoch (``fence_key``) and write in one step, so no write of an older claim can land after
    a newer claim's first read or write. Writes of all the runs on a loop leave together, one
    script call per round trip (``checkpoint_puts``).
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
        self._puts: CheckpointPuts | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"RedisCheckpointStore(ttl_s={self.ttl_s!r}, prefix={self.prefix!r})"  # the URL may hold a password

    def key(self, run_id: str) -> str:
        return f"{self.prefix}{run_id}"

    def fence_key(self, run_id: str) -> str:
        """The highest claim epoch seen for the run."""
        return f"{self.prefix}fence:{run_id}"

    @property
    def index_key(self) -> str:
        """The set of run ids that have (or had, until their TTL) a checkpoint."""
        return f"{self.prefix}index"

    def _redis(self) -> Redis:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            self._client = shared_async_client(
                self.url,
                socket_connect_timeout=self._connect_timeout_s,
                socket_timeout=self._timeout_s,
                retry=Retry(NoBackoff(), 1),
            )
            self._puts = CheckpointPuts(self._client, self.index_key, max(1, math.ceil(self.ttl_s)), FENCE_TTL_S)
            self._loop = loop
        return self._client

    def _batched(self) -> CheckpointPuts:
        self._redis()
        assert self._puts is not None
        return self._puts

    async def put(self, checkpoint: Checkpoint) -> None:
        run_id, epoch = checkpoint.run_id, checkpoint.epoch
        # with every other write of this loop's runs, in one call (``checkpoint_puts``)
        if not await self._batched().put(self.key(run_id), self.fence_key(run_id), run_id, epoch, _encoded(checkpoint)):
            raise _refused(run_id, epoch)

    async def get(self, run_id: str, *, epoch: int | None = None) -> Checkpoint | None:
        if epoch:
            raw = await self._redis().eval(_GET, 2, self.key(run_id), self.fence_key(run_id), epoch, FENCE_TTL_S)
        else:
            raw = await self._redis().get(self.key(run_id))
        if raw is None:
            return None
        checkpoint = Checkpoint.from_json(raw)
        return checkpoint if checkpoint.is_fresh(self.ttl_s) else None

    async def delete(self, run_id: str, *, epoch: int | None = None) -> None:
        from redis.exceptions import ConnectionError, TimeoutError

        await self._batched().barrier()  # a put staged before this delete lands before it
        for delay in (*DELETE_RETRY_DELAYS_S, None):
            try:
                if epoch:
                    keys = [self.key(run_id), self.fence_key(run_id), self.index_key]
                    if not await self._redis().eval(_DELETE, 3, *keys, epoch, run_id, FENCE_TTL_S):
                        raise _refused(run_id, epoch)
                    return
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
            if self._puts is not None and self._loop is asyncio.get_running_loop():
                await self._puts.barrier()
            await self._client.aclose()
            self._client = None
            self._puts = None
            self._loop = None


# KEYS: checkpoint, fence. ARGV: epoch, fence ttl. Raises the fence, returns the checkpoint.
_GET = """
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) > seen then redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2]) end
return redis.call('GET', KEYS[1])
"""

# KEYS: checkpoint, fence, index. ARGV: epoch, run id, fence ttl. 0: an older claim.
_DELETE = """
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
local epoch = tonumber(ARGV[1])
if seen > epoch then return 0 end
if epoch > seen then redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3]) end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], ARGV[2])
return 1
"""


class FencedCheckpointStore:
    """The store a worker hands the engine: every call carries its claim's epoch, and nothing
    is written once the claim is lost or past its lease (``runs.fence``)."""

    def __init__(self, store: CheckpointStore, fence: Fence, *, own_store: bool = True) -> None:
        self.store = store
        self.fence = fence
        self.own_store = own_store  # False: a store shared by the loop's runs, never closed by one

    async def put(self, checkpoint: Checkpoint) -> None:
        await self.fence.ensure()
        checkpoint.epoch = self.fence.epoch
        try:
            await self.store.put(checkpoint)
        except ClaimLost:
            raise self.fence.lose() from None

    async def get(self, run_id: str) -> Checkpoint | None:
        """The run's checkpoint; None when it has none, or only one that cannot be read."""
        self.fence.check()
        try:
            return await self._get(run_id)
        except UnreadableCheckpoint as exc:
            # Corrupt, or written by a version with another schema: no resume can use it, and
            # left in place it would stop every claim of the run at this read until the run
            # fails as too_many_claims. Discarded as a checkpoint that no longer matches the
            # history is: the turn starts over from what the thread holds (nothing committed is
            # in a checkpoint).
            log.warning("checkpoint_unreadable", run_id=run_id, epoch=self.fence.epoch, error=str(exc))
            try:
                await self.delete(run_id)
            except Exception:  # the store is away: the turn's first checkpoint overwrites it
                log.exception("checkpoint_delete_failed", run_id=run_id)
            return None

    async def _get(self, run_id: str) -> Checkpoint | None:
        getter: Any = self.store.get
        if _takes_epoch(getter):
            return cast(Checkpoint | None, await getter(run_id, epoch=self.fence.epoch))
        return await self.store.get(run_id)  # a store of the host's own that knows no epochs

    async def delete(self, run_id: str) -> None:
        await self.fence.ensure()
        deleter: Any = self.store.delete
        try:
            if _takes_epoch(deleter):
                await deleter(run_id, epoch=self.fence.epoch)
            else:
                await self.store.delete(run_id)
        except ClaimLost:
            raise self.fence.lose() from None

    async def aclose(self) -> None:
        close = getattr(self.store, "aclose", None) if self.own_store else None
        if close is not None:
            await close()


def _takes_epoch(method: Callable[..., Any]) -> bool:
    try:
        return "epoch" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _settled_run_ids(run_ids: Iterable[str]) -> Iterable[str]:
    """Those of ``run_ids`` whose run is terminal or no longer exists (not a run id: settled too)."""
    by_uuid = {uuid_: run_id for run_id in run_ids if (uuid_ := _run_uuid(run_id)) is not None}
    active = set(Run.objects.filter(pk__in=list(by_uuid)).active().values_list("pk", flat=True))
    return [run_id for run_id in run_ids if (uuid_ := _run_uuid(run_id)) is None or uuid_ not in active]


_memory_store = InMemoryCheckpointStore()


_shared_redis_stores: dict[tuple[str, float], RedisCheckpointStore] = {}


def checkpoint_store_from_settings(*, shared: bool = False) -> CheckpointStore:
    """The store ``STREAMRECOVER['CHECKPOINT_STORE']`` names; ``memory`` is one per process.

    ``shared`` (the runs of a worker's shared loop): one Redis store, so one Redis client and
    connection, for them all, where each run used to open its own (a client's command table
    alone is some 15 KiB); the caller must not close it."""
    kind = app_settings.CHECKPOINT_STORE
    if kind == "memory":
        return _memory_store
    if kind == "orm":
        return DjangoCheckpointStore(ttl_s=float(app_settings.CHECKPOINT_TTL))
    key = (app_settings.REDIS_URL, float(app_settings.CHECKPOINT_TTL))
    if not shared:
        return RedisCheckpointStore(*key)
    if key not in _shared_redis_stores:
        _shared_redis_stores[key] = RedisCheckpointStore(*key)
    return _shared_redis_stores[key]


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
