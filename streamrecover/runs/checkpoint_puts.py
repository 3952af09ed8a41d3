"""Many runs' checkpoint writes to Redis in one script call per round trip.

Each run of a worker's shared loop writes its checkpoint about once a second. As one command
each, 250 runs on a loop made 250 commands a second, each through the pool's checkout and
release, its retry wrapper and its own reply: a quarter of the loop thread's time at 500 streams,
and under that load some writers waited past the pool's timeout for a connection and their
checkpoint was lost. Here a write is staged and awaited (``staged``); one flusher task per loop
sends what has gathered since its last call in one Lua script (its arguments packed as one
msgpack array), and each write learns its own outcome: written, or refused because a newer claim
holds the run.

Writes leave in the order they were staged, so a run's later checkpoint never lands before an
earlier one. A write whose caller was cancelled before it left is dropped, never sent late.
Not for Redis Cluster: one call writes many runs' keys (as the live outbox does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgpack

from .staged import StagedBatches

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


@dataclass(frozen=True, slots=True)
class _Put:
    key: str
    fence_key: str
    run_id: str
    epoch: int
    value: str


class CheckpointPuts(StagedBatches[_Put, bool]):
    """One per store and event loop: ``put`` stages a write and waits for its own outcome."""

    max_batch = MAX_BATCH

    def __init__(self, client: Redis, index_key: str, ttl_s: int, fence_ttl_s: int) -> None:
        super().__init__()
        self._client = client
        self._script = client.register_script(_PUT_MANY)
        self._index_key = index_key
        self._ttl_s = ttl_s
        self._fence_ttl_s = fence_ttl_s

    async def put(self, key: str, fence_key: str, run_id: str, epoch: int, value: str) -> bool:
        """Write ``value``; False when the fence refused it (an older claim than the run's)."""
        return await self._stage(_Put(key, fence_key, run_id, epoch, value))

    async def _send(self, items: Sequence[_Put]) -> list[bool | BaseException]:
        args: list[str | int] = [self._ttl_s, self._fence_ttl_s, self._index_key]
        for put in items:
            args += [put.key, put.fence_key, put.run_id, put.epoch, put.value]
        # use_bin_type=False: Redis' Lua msgpack reads the old raw strings, not the bin type.
        written = await self._script(args=[msgpack.packb(args, use_bin_type=False)], client=self._client)
        return [bool(ok) for ok in written]
