"""The bounded per-run replay buffer: the frames a reconnecting client may have missed.

Channel layers keep nothing (and channels_redis drops messages over capacity silently), so
every published frame is also kept here, read back by ``seq``. Beside the
frames, each run has its ``RunState`` (the client's view at the last frame), so a snapshot
needs one database read on connect and never one per frame.

- ``RedisFrameBuffer`` (distributed): a Redis stream per run whose entry ids are the frame
  seqs (``XADD <seq>-0 ... MAXLEN ~ REPLAY_BUFFER_FRAMES``), and a hash with the state as of
  some seq, rewritten every few frames; a reader replays the frames after it, in one Lua
  call so the two agree. Keys expire ``FINISHED_TTL_S`` after the run ends.
- ``InMemoryFrameBuffer`` (embedded): the same in a dict guarded by a lock, because the
  run's thread appends while Daphne's loop reads.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import msgpack
import structlog

from ..conf import app_settings
from ..engine.protocol import FrameKind, frame_span
from ..redisclients import shared_async_client
from .state import RunState

if TYPE_CHECKING:  # redis is the distributed extra: imported only where a Redis buffer is used
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

log = structlog.get_logger("streamrecover.live")

FINISHED_TTL_S = 600  # a client reconnecting within 10 minutes of the end gets a replay
ACTIVE_TTL_S = 86400  # safety net for a run whose worker died without finishing
KEY_PREFIX = "streamrecover:live:"
# Frames that change what a snapshot shows wholesale: the state is saved right after them.
_SAVE_AFTER = frozenset(
    {
        FrameKind.MESSAGE_COMMITTED,
        FrameKind.STREAM_RESET,
        FrameKind.RUN_STATUS,
        FrameKind.TOOL_CALL_CANCEL,
        FrameKind.BLOCK_CANCEL,
    }
)


class FrameBuffer(Protocol):
    """What the publisher writes and the consumer reads."""

    async def append(self, run_id: str, frame: dict[str, Any]) -> None:
        """Keep ``frame`` (seqs must increase per run; an older one is dropped)."""
        ...

    async def last_seq(self, run_id: str) -> int:
        """The highest seq kept for the run (0: none)."""
        ...

    async def last_seqs(self, run_ids: list[str]) -> dict[str, int]:
        """``last_seq`` of each of ``run_ids``, in one read."""
        ...

    async def frames_after(self, run_id: str, after: int) -> list[dict[str, Any]] | None:
        """Exactly the frames with seq > ``after``, or None when some of them are gone."""
        ...

    async def state(self, run_id: str) -> RunState | None:
        """The client's view at the last kept frame, or None when nothing is kept."""
        ...

    async def finish(self, run_id: str) -> None:
        """The run ended: let its frames expire after ``FINISHED_TTL_S``."""
        ...

    async def discard(self, run_id: str) -> None:
        """Forget the run now (what expiry does later)."""
        ...

    async def aclose(self) -> None: ...


def _replay_complete(frames: list[dict[str, Any]], after: int, last: int) -> bool:
    """True when ``frames`` are all the frames after ``after``: nothing trimmed before them, and
    no hole between them (frames a Redis outage kept from the buffer)."""
    if not frames:
        return last == after
    expected = after + 1
    for frame in frames:
        first, seq = frame_span(frame)
        if first != expected:
            return False
        expected = seq + 1
    return True


def _max_frames() -> int:
    return max(1, int(app_settings.REPLAY_BUFFER_FRAMES))


# ---- in memory ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Kept:
    frames: deque[dict[str, Any]]
    state: RunState = field(default_factory=RunState)
    expires_at: float | None = None


class InMemoryFrameBuffer:
    """One process: the run's thread appends, the sockets' loop reads; a lock keeps them apart."""

    def __init__(
        self,
        max_frames: int | None = None,
        finished_ttl_s: float = FINISHED_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_frames = max_frames
        self.finished_ttl_s = finished_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._runs: dict[str, _Kept] = {}

    def _get(self, run_id: str) -> _Kept | None:
        now = self._clock()
        for key in [k for k, v in self._runs.items() if v.expires_at is not None and v.expires_at <= now]:
            del self._runs[key]
        return self._runs.get(run_id)

    async def append(self, run_id: str, frame: dict[str, Any]) -> None:
        with self._lock:
            kept = self._get(run_id)
            if kept is None:
                kept = self._runs[run_id] = _Kept(deque(maxlen=self._max_frames or _max_frames()))
            if frame_span(frame)[1] <= kept.state.seq:
                log.warning("live_frame_out_of_order", run_id=run_id, seq=frame.get("seq"), last_seq=kept.state.seq)
                return
            kept.frames.append(frame)
            kept.state.apply(frame)
            kept.expires_at = None

    async def last_seq(self, run_id: str) -> int:
        return (await self.last_seqs([run_id]))[run_id]

    async def last_seqs(self, run_ids: list[str]) -> dict[str, int]:
        with self._lock:
            return {run_id: kept.state.seq if (kept := self._get(run_id)) else 0 for run_id in run_ids}

    async def frames_after(self, run_id: str, after: int) -> list[dict[str, Any]] | None:
        with self._lock:
            kept = self._get(run_id)
            if kept is None:
                return None
            frames = [f for f in kept.frames if frame_span(f)[1] > after]
            return frames if _replay_complete(frames, after, kept.state.seq) else None

    async def state(self, run_id: str) -> RunState | None:
        with self._lock:
            kept = self._get(run_id)
            return kept.state.copy() if kept else None

    async def finish(self, run_id: str) -> None:
        with self._lock:
            kept = self._get(run_id)
            if kept is not None:
                kept.expires_at = self._clock() + self.finished_ttl_s

    async def discard(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    async def aclose(self) -> None:
        return None


# ---- Redis --------------------------------------------------------------------------------

# KEYS: frame streams. Each one's last entry id ("" when empty or absent). Like the outbox's
# script, one call reads many runs' keys: not for Redis Cluster.
_LAST_IDS = """
local ids = {}
for i, key in ipairs(KEYS) do
  local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  ids[i] = last[1] and last[1][1] or ''
end
return ids
"""

# The saved state and the frames after it, read atomically (exclusive XRANGE: Redis >= 6.2).
_READ_STATE = """
local seq = redis.call('HGET', KEYS[1], 'seq')
local data = redis.call('HGET', KEYS[1], 'data')
local start = '-'
if seq then start = '(' .. seq .. '-0' end
return {data, redis.call('XRANGE', KEYS[2], start, '+')}
"""


# Every frame of a batch in one script call, its arguments packed as one msgpack array: one
# command to encode and one reply to parse per batch, where a pipeline of XADD and PUBLISH had
# two (and more when the state was saved) per frame, and where one argument per field made
# redis-py's command packing (a Python loop over every argument) the largest Redis cost left.
# The array: the TTL and the stream cap, then per frame its stream key, its state hash key, the
# entry id ("": publish only), the frame's JSON, the channel ("": keep only), the pub/sub
# message, the state to save ("" "": none), and its claim's floor (``_FENCE``). A frame of an
# earlier claim than the state hash's floor, or whose XADD is refused (a later seq already
# there), is neither kept nor sent; the others go on. Not for Redis Cluster: one call writes
# many runs' keys (as the pipeline did, over one client).
FLUSH_SCRIPT = """
local v = cmsgpack.unpack(ARGV[1])
local ttl, cap, refused, first_error = v[1], v[2], 0, ''
for a = 3, #v, 9 do
  local stream, state, id = v[a], v[a + 1], v[a + 2]
  local send = true
  if id ~= '' then
    local floor = tonumber(redis.call('HGET', state, 'floor') or '0')
    if floor > v[a + 8] then
      send = false
      refused = refused + 1
      if first_error == '' then first_error = 'a frame of an earlier claim of the run' end
    else
      local ok = redis.pcall('XADD', stream, 'MAXLEN', '~', cap, id, 'f', v[a + 3])
      if type(ok) == 'table' and ok.err then
        send = false
        refused = refused + 1
        if first_error == '' then first_error = ok.err end
      elseif v[a + 6] ~= '' then
        redis.call('HSET', state, 'seq', v[a + 6], 'data', v[a + 7])
        redis.call('EXPIRE', stream, ttl)
        redis.call('EXPIRE', state, ttl)
      end
    end
  end
  if send and v[a + 4] ~= '' then redis.call('PUBLISH', v[a + 4], v[a + 5]) end
end
if refused > 0 then return {refused, first_error} end
return {}
"""

# A claim of the run starts writing: its floor (the seq after the last one kept) goes in the
# state hash, read with that last seq in one step, so a frame an earlier claim still sends (its
# process stalled past its lease with frames in its outbox) is refused by FLUSH_SCRIPT, never
# taking a seq of the new claim's. KEYS: state hash, frame stream; ARGV: the TTL.
_FENCE = """
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local seq = 0
if last[1] then seq = tonumber(string.match(last[1][1], '^(%d+)')) end
redis.call('HSET', KEYS[1], 'floor', seq + 1)
redis.call('EXPIRE', KEYS[1], ARGV[1])
return seq
"""


class PlannedWrite(NamedTuple):
    """One frame's writes to the replay buffer: its stream entry, and the state when due."""

    state_key: str
    frames_key: str
    entry_id: str  # "<seq>-0"
    text: str  # the frame's JSON
    save: tuple[int, str] | None  # (seq, state JSON) when the state is saved with this frame
    floor: int  # the first seq of the claim writing it (``_FENCE``)


def flush_fields(write: PlannedWrite | None, channel: str = "", message: str | bytes = "") -> list[Any]:
    """One frame's nine fields in ``FLUSH_SCRIPT``'s array: ``write`` kept (None: nothing kept)
    and ``message`` published on ``channel`` ("": nothing published)."""
    if write is None:
        return ["", "", "", "", channel, message, "", "", 0]
    saved = write.save or ("", "")
    return [write.frames_key, write.state_key, write.entry_id, write.text, channel, message, *saved, write.floor]


def _decode_entries(entries: list[Any]) -> list[dict[str, Any]]:
    frames = []
    for _id, fields in entries:
        values = dict(zip(fields[::2], fields[1::2], strict=True)) if isinstance(fields, list) else fields
        frames.append(json.loads(values[b"f"]))
    return frames


class RedisFrameBuffer:
    """A Redis stream per run (ids are seqs) and a hash with its state; one client per loop."""

    def __init__(
        self,
        url: str,
        *,
        max_frames: int | None = None,
        save_every: int | None = None,
        finished_ttl_s: int = FINISHED_TTL_S,
        active_ttl_s: int = ACTIVE_TTL_S,
        prefix: str = KEY_PREFIX,
    ) -> None:
        self.url = url
        self._max_frames = max_frames
        self._save_every = save_every
        self.finished_ttl_s = finished_ttl_s
        self.active_ttl_s = active_ttl_s
        self.prefix = prefix
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Redis] = weakref.WeakKeyDictionary()
        self._writing: dict[str, RunState] = {}  # runs this instance appends to
        self._unsaved: dict[str, int] = {}
        self._floors: dict[str, int] = {}  # each such run's claim's floor (``_FENCE``)
        self._flush: AsyncScript | None = None

    def __repr__(self) -> str:
        return f"RedisFrameBuffer(prefix={self.prefix!r})"  # the URL may hold a password

    def keys(self, run_id: str) -> tuple[str, str]:
        """(state hash, frame stream); the ``{run}`` hash tag keeps both in one cluster slot."""
        return f"{self.prefix}{{{run_id}}}:state", f"{self.prefix}{{{run_id}}}:frames"

    @property
    def max_frames(self) -> int:
        return self._max_frames or _max_frames()

    @property
    def save_every(self) -> int:
        """Save the state at least this often, well inside the stream's cap, so a reader
        always finds every frame after the saved state."""
        return self._save_every or max(1, min(64, self.max_frames // 4))

    def _redis(self) -> Redis:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = shared_async_client(self.url, socket_connect_timeout=2, socket_timeout=5)
            self._clients[loop] = client
        return client

    async def flush(self, fields: list[Any]) -> list[Any]:
        """Run ``FLUSH_SCRIPT`` on this loop's client over ``fields`` (``flush_fields`` of each
        frame, after the TTL and the stream cap): ``[refused, first error]``, or empty."""
        client = self._redis()
        if self._flush is None:
            self._flush = client.register_script(FLUSH_SCRIPT)
        # use_bin_type=False: Redis' Lua msgpack reads the old raw strings, not the bin type.
        packed = msgpack.packb([self.active_ttl_s, self.max_frames, *fields], use_bin_type=False)
        return await self._flush(args=[packed], client=client)

    async def _writer_state(self, run_id: str) -> RunState:
        state = self._writing.get(run_id)
        if state is None:
            # fenced first: the state read next holds every frame an earlier claim kept
            last = await self._redis().eval(_FENCE, 2, *self.keys(run_id), self.active_ttl_s)
            self._floors[run_id] = int(last) + 1
            state = await self.state(run_id) or RunState()
            self._writing[run_id] = state
            self._unsaved[run_id] = self.save_every  # save with the first frame
        return state

    async def prepare(self, run_id: str) -> RunState:
        """Fence out earlier claims' writers and load the run's writer state, so
        ``planned_write`` can be called without awaiting; the state is the publisher's handle
        for ``release``."""
        return await self._writer_state(run_id)

    def fenced_seq(self, run_id: str) -> int:
        """The last seq kept when this writer fenced the run (after ``prepare``)."""
        return self._floors[run_id] - 1

    def release(self, run_id: str, state: RunState | None = None) -> None:
        """Forget the run's writer state, leaving its keys in Redis alone: a claim of the run
        starts (what this buffer kept of an earlier claim is stale when another worker streamed
        the run since), or one was lost (its state would stay for the worker's life). With
        ``state``: only while it is still that one, not a newer claim's on this buffer."""
        if state is not None and self._writing.get(run_id) is not state:
            return
        self._writing.pop(run_id, None)
        self._unsaved.pop(run_id, None)
        self._floors.pop(run_id, None)

    def planned_write(self, run_id: str, frame: dict[str, Any], text: str | None = None) -> PlannedWrite | None:
        """Apply ``frame`` to the run's writer state (after ``prepare``) and say what to write:
        the stream entry (``text``, its JSON, when already encoded) and, now and then, the state.
        None when the frame is older than the last one kept (dropped)."""
        state = self._writing[run_id]
        first, seq = frame_span(frame)
        if seq <= state.seq:
            log.warning("live_frame_out_of_order", run_id=run_id, seq=seq, first_seq=first, last_seq=state.seq)
            return None
        state.apply(frame)
        self._unsaved[run_id] += 1
        encoded = text if text is not None else json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
        save = None
        if self._unsaved[run_id] >= self.save_every or frame.get("type") in _SAVE_AFTER:
            save = (state.seq, state.to_json())
            self._unsaved[run_id] = 0
        return PlannedWrite(*self.keys(run_id), f"{seq}-0", encoded, save, self._floors[run_id])

    def skip(self, run_id: str, frame: dict[str, Any]) -> None:
        """A frame that is not written (Redis is away): the writer's state still applies it, and
        is saved whole with the next frame written, so a reader's snapshot never lacks it."""
        state = self._writing.get(run_id)
        if state is None or frame_span(frame)[1] <= state.seq:
            return
        state.apply(frame)
        self.unsaved(run_id)

    def unsaved(self, run_id: str) -> None:
        """Frames the writer's state applied never reached Redis (a write failed, or was
        skipped): save the whole state with the next frame written, so a reader that builds its
        state from the saved one plus the frames after it does not build it across the hole."""
        if run_id in self._unsaved:
            self._unsaved[run_id] = self.save_every

    async def append(self, run_id: str, frame: dict[str, Any]) -> None:
        await self._writer_state(run_id)
        write = self.planned_write(run_id, frame)
        if write is None:
            return
        try:
            refused = await self.flush(flush_fields(write))
        except Exception:
            self.unsaved(run_id)
            raise
        if refused:  # an earlier claim's frame, or another worker wrote a later seq for this run
            first, seq = frame_span(frame)
            error = refused[1].decode(errors="replace") if isinstance(refused[1], bytes) else str(refused[1])
            log.warning("live_buffer_append_refused", run_id=run_id, seq=seq, first_seq=first, error=error)

    async def last_seq(self, run_id: str) -> int:
        return (await self.last_seqs([run_id]))[run_id]

    async def last_seqs(self, run_ids: list[str]) -> dict[str, int]:
        """``last_seq`` of many runs in one round trip: each stream's last entry id (``<seq>-0``),
        not the frame itself (decoding 500 frames held a Daphne's loop for some 8 ms)."""
        found = {run_id: self._writing[run_id].seq for run_id in run_ids if run_id in self._writing}
        others = [run_id for run_id in run_ids if run_id not in found]
        if others:
            ids = await self._redis().eval(_LAST_IDS, len(others), *(self.keys(r)[1] for r in others))
            for run_id, entry_id in zip(others, ids, strict=True):
                found[run_id] = int(entry_id.split(b"-", 1)[0]) if entry_id else 0
        return found

    async def frames_after(self, run_id: str, after: int) -> list[dict[str, Any]] | None:
        _, frames_key = self.keys(run_id)
        pipe = self._redis().pipeline(transaction=True)
        pipe.xrange(frames_key, min=f"{after + 1}-0", max="+")
        pipe.xrevrange(frames_key, count=1)
        entries, last = await pipe.execute()
        if not last:
            return None
        frames = _decode_entries(entries)
        last_seq = frame_span(_decode_entries(last)[0])[1]
        return frames if _replay_complete(frames, after, last_seq) else None

    async def state(self, run_id: str) -> RunState | None:
        client = self._redis()
        data, entries = await client.eval(_READ_STATE, 2, *self.keys(run_id))
        if data is None and not entries:
            return None
        state = RunState.from_json(data) if data is not None else RunState()
        for frame in _decode_entries(entries):
            state.apply(frame)
        return state

    async def finish(self, run_id: str) -> None:
        self._writing.pop(run_id, None)
        self._unsaved.pop(run_id, None)
        self._floors.pop(run_id, None)
        pipe = self._redis().pipeline(transaction=True)
        for key in self.keys(run_id):
            pipe.expire(key, self.finished_ttl_s)
        await pipe.execute()

    async def discard(self, run_id: str) -> None:
        self._writing.pop(run_id, None)
        self._unsaved.pop(run_id, None)
        self._floors.pop(run_id, None)
        await self._redis().delete(*self.keys(run_id))

    async def aclose(self) -> None:
        """Close this loop's client (other loops close theirs)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()


# ---- choosing by settings -------------------------------------------------------------------

_memory = InMemoryFrameBuffer()
_readers: dict[str, RedisFrameBuffer] = {}


def uses_redis() -> bool:
    """Redis when frames cross processes: a channels_redis layer, or runs on Celery workers."""
    from django.conf import settings

    from ..conf import app_settings

    backend = str(getattr(settings, "CHANNEL_LAYERS", {}).get("default", {}).get("BACKEND", ""))
    return backend.startswith("channels_redis") or app_settings.EXECUTION == "celery"


def writer_buffer() -> FrameBuffer:
    """For one run's publisher: its own Redis client (closed with the publisher), or the
    process's in-memory buffer."""
    from ..conf import app_settings

    return RedisFrameBuffer(app_settings.REDIS_URL) if uses_redis() else _memory


_writers: dict[str, RedisFrameBuffer] = {}


def shared_writer_buffer() -> FrameBuffer:
    """For the publishers of every run on one long-lived loop (a worker's shared loop): one
    Redis client for them all, never closed by a run; or the in-memory buffer."""
    from ..conf import app_settings

    if not uses_redis():
        return _memory
    url = app_settings.REDIS_URL
    if url not in _writers:
        _writers[url] = RedisFrameBuffer(url)
    return _writers[url]


def reader_buffer() -> FrameBuffer:
    """For consumers: one per process (per Redis URL), shared by every socket."""
    from ..conf import app_settings

    if not uses_redis():
        return _memory
    url = app_settings.REDIS_URL
    if url not in _readers:
        _readers[url] = RedisFrameBuffer(url)
    return _readers[url]
