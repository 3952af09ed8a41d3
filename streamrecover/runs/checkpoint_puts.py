"""Many runs' checkpoint writes to Redis in one script call per round trip.

Each run of a worker's shared loop writes its checkpoint about once a second. As one command
each, 250 runs on a loop made 250 commands a second, each through the pool's checkout and
release, its retry wrapper and its own reply: a quarter of the loop thread's time at 500 streams,
and under that load some writers waited past the pool's timeout for a connection and their
checkpoint was lost. Here a write is staged and awaited; one flusher task per loop sends what has
gathered since its last call in one Lua script (its arguments packed as one msgpack array), and
each write learns its own outcome: written, or refused because a newer claim holds the run.

Writes leave in the order they were staged, so a run's later checkpoint never lands before an
earlier one. A write whose caller was cancelled before it left is dropped, never sent late.
Not for Redis Cluster: one call writes many runs' keys (as the live outbox does).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

if TYPE_CHECKING:
    from redis.asyncio import Redis

MAX_BATCH = 500  # writes per script call: one call never holds Redis for long

# ARGV[1]: msgpack array: the TTL, the fence TTL, the index key, then per write its checkpoint
# key, fence key, run id, epoch (0: unfenced) and value. Returns 1 (written) or 0 (refused: the
# fence holds a newer epoch) per write, in order: a run's highest epoch seen is raised as by a
# fenced get or delete (checkpoints._GET, _DELETE).
_PUT_MANY = """
local v = cmsgpack.unpack(ARGV[1])
local ttl, fence_ttl, index = v[1], v[2], v[3]
local out = {}
for a = 4, #v, 5 do
  local key, fence, run_id, epoch, value = v[a], v[a + 1], v[a + 2], tonumber(v[a + 3]), v[a + 4]
  local ok = 1
  if epoch > 0 then
    local seen = tonumber(redis.call('GET', fence) or '0')
    if seen > epoch then
      ok = 0
    elseif epoch > seen then
      redis.call('SET', fence, epoch, 'EX', fence_ttl)
    end
  end
  if ok == 1 then
    redis.call('SET', key, value, 'EX', ttl)
    redis.call('SADD', index, run_id)
  end
  out[#out + 1] = ok
end
return out
"""


@dataclass(slots=True)
class _Put:
    key: str
    fence_key: str
    run_id: str
    epoch: int
    value: str
    outcome: asyncio.Future[bool]


class CheckpointPuts:
    """One per store and event loop: ``put`` stages a write and waits for its own outcome."""

    def __init__(self, client: Redis, index_key: str, ttl_s: int, fence_ttl_s: int) -> None:
        self._client = client
        self._script = client.register_script(_PUT_MANY)
        self._index_key = index_key
        self._ttl_s = ttl_s
        self._fence_ttl_s = fence_ttl_s
        self._pending: list[_Put] = []
        self._flusher: asyncio.Task[None] | None = None
        self.calls = 0  # script calls sent

    async def put(self, key: str, fence_key: str, run_id: str, epoch: int, value: str) -> bool:
        """Write ``value``; False when the fence refused it (an older claim than the run's)."""
        outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append(_Put(key, fence_key, run_id, epoch, value, outcome))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_all())
        # A cancelled caller cancels ``outcome``: not sent yet, the write is skipped
        return await outcome

    async def barrier(self) -> None:
        """Return once every write staged so far has been sent (or has failed)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _flush_all(self) -> None:
        while self._pending:
            staged = [put for put in self._pending[:MAX_BATCH] if not put.outcome.done()]
            del self._pending[:MAX_BATCH]
            if not staged:
                continue
            try:
                written = await self._send(staged)
            except asyncio.CancelledError:  # the loop is closing: nothing staged waits forever
                for put in [*staged, *self._pending]:
                    put.outcome.cancel()
                raise
            except Exception as exc:  # each writer logs its own failure and carries on
                for put in staged:
                    if not put.outcome.done():
                        put.outcome.set_exception(exc)
                continue
            for put, ok in zip(staged, written, strict=True):
                if not put.outcome.done():
                    put.outcome.set_result(bool(ok))

    async def _send(self, staged: list[_Put]) -> list[Any]:
        args: list[str | int] = [self._ttl_s, self._fence_ttl_s, self._index_key]
        for put in staged:
            args += [put.key, put.fence_key, put.run_id, put.epoch, put.value]
        # use_bin_type=False: Redis' Lua msgpack reads the old raw strings, not the bin type.
        written = await self._script(args=[msgpack.packb(args, use_bin_type=False)], client=self._client)
        self.calls += 1
        return list(written)
