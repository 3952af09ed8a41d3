"""In-flight stream checkpoints: the contract, an in-memory store, and the coalescing writer.

A checkpoint holds only what recovery may reuse (partial text, completed tool calls, kept
thinking) plus enough bookkeeping to resume after the process died. Stores are async and
keyed by run id; ``put`` is an idempotent upsert.

Fencing: a checkpoint carries the ``epoch`` of the claim that wrote it (0: unfenced). A store
remembers the highest epoch it has seen for a run (a ``get`` or ``delete`` with ``epoch`` counts
too) and refuses, with ``ClaimLost``, a ``put`` or ``delete`` of an older one: a worker whose
claim was taken over can neither overwrite nor delete the new owner's checkpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .errors import ClaimLost
from .notices import ToolNotice


class UnreadableCheckpoint(ValueError):
    """A stored checkpoint that cannot be read back: bytes that are not JSON, or a schema this
    version cannot build (an older one without a field it needs). It is of no use to a resume:
    the reader discards it and the turn starts over from the committed history."""


# The fields a resume reads before anything else, with the types they must have: a checkpoint
# whose values are not of them fails later, somewhere less clear, if it is let through.
_CHECKED_TYPES: dict[str, type | tuple[type, ...]] = {
    "run_id": str,
    "turn": int,
    "history_len": int,
    "blocks": list,
    "seq": int,
    "updated_at": (int, float),
    "dropped_output": int,
    "received_bytes": int,
    "pauses": int,
}


@dataclass(slots=True)
class Checkpoint:
    run_id: str
    turn: int  # index of the assistant turn within the run
    history_len: int  # committed messages at the time; a resume checks it still matches
    # canonical content (``Block.to_checkpoint``): text (even partial), complete tool calls, kept
    # thinking; a refusal's text block says ``"refusal": true`` (absent in older ones: not one)
    blocks: list[dict[str, Any]]
    in_flight_tool: dict[str, Any] | None = None  # {"id", "name", "partial_input_bytes"}, for the record only
    attempt: int = 0
    continuation: int = 0
    seq: int = 0  # last client frame sequence number published
    # native resume: {"response_id", "after", "open_text"}: ``blocks`` are the provider-side
    # response's state after event ``after`` (its last text block still open when
    # ``open_text``); another worker re-attaches there (None: it continues instead)
    native: dict[str, Any] | None = None
    updated_at: float = field(default_factory=time.time)
    epoch: int = 0  # the claim that wrote it (the run's fencing token); 0: not fenced
    # set once the turn's answer is complete (it ended with this stop reason): a resume commits
    # ``blocks`` as the answer, asking the provider nothing
    stop_reason: str | None = None
    discarded_tools: list[ToolNotice] = field(default_factory=list)  # cut-off calls: the model's notices
    # output tokens of answers the turn dropped to start over: billed, so a resumed turn's
    # max_tokens still counts them (0 in a checkpoint from before this field)
    dropped_output: int = 0
    # output tokens the answer ``blocks`` belong to cost since it last started over (an upper
    # bound), and the bytes of output received for it: what the blocks hold and what they do not
    # (thinking cut off, a tool call half received), the attempt streaming then included. A
    # resume counts them as the worker that wrote them would have; None in a checkpoint from
    # before these fields: its blocks are all it counts.
    output_used: int | None = None
    received_bytes: int = 0
    # set once the turn ended before its answer did: ``{"status", "error"}`` (cancelled, failed,
    # exhausted), ``blocks`` then what it commits (the text its client was shown); a resume
    # ends the turn so, asking the provider nothing
    ending: dict[str, Any] | None = None
    # how often the provider paused the turn (``pause_turn``) before the request ``blocks`` are
    # the answer of: each request counts against max_turns, and a resume counts these too
    # (0 in a checkpoint from before this field)
    pauses: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """``to_dict`` as compact JSON, without its deep copy: encoded at once, nothing to protect."""
        return json.dumps({name: getattr(self, name) for name in self.__dataclass_fields__}, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Checkpoint:
        """The checkpoint ``to_dict`` stored; ``UnreadableCheckpoint`` when ``data`` is not one."""
        if not isinstance(data, dict):
            raise UnreadableCheckpoint(f"a checkpoint is a JSON object, not {type(data).__name__}")
        try:
            checkpoint = cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except TypeError as exc:  # a field this version needs is missing
            raise UnreadableCheckpoint(str(exc)) from None
        for name, types in _CHECKED_TYPES.items():
            value = getattr(checkpoint, name)
            if not isinstance(value, types) or isinstance(value, bool):
                raise UnreadableCheckpoint(f"checkpoint field {name!r} is a {type(value).__name__}")
        used = checkpoint.output_used
        if used is not None and (not isinstance(used, int) or isinstance(used, bool)):
            raise UnreadableCheckpoint(f"checkpoint field 'output_used' is a {type(used).__name__}")
        ending = checkpoint.ending
        if ending is not None and not (isinstance(ending, dict) and isinstance(ending.get("status"), str)):
            raise UnreadableCheckpoint("checkpoint field 'ending' is not an ending")
        return checkpoint

    @classmethod
    def from_json(cls, raw: str | bytes) -> Checkpoint:
        """The checkpoint ``to_json`` stored; ``UnreadableCheckpoint`` for anything else."""
        try:
            data = json.loads(raw)
        except ValueError as exc:  # not JSON, or not UTF-8
            raise UnreadableCheckpoint(f"a checkpoint is not JSON: {exc}") from None
        return cls.from_dict(data)

    def is_fresh(self, ttl_s: float, now: float | None = None) -> bool:
        return ((now if now is not None else time.time()) - self.updated_at) <= ttl_s


class CheckpointStore(Protocol):
    async def put(self, checkpoint: Checkpoint) -> None: ...

    async def get(self, run_id: str) -> Checkpoint | None: ...

    async def delete(self, run_id: str) -> None: ...


class InMemoryCheckpointStore:
    """One process only: tests and the embedded demo."""

    def __init__(self) -> None:
        self._items: dict[str, dict[str, Any]] = {}
        self._fences: dict[str, int] = {}  # the highest epoch seen per run
        self.writes = 0

    def _fence(self, run_id: str, epoch: int | None) -> None:
        if not epoch:
            return
        if self._fences.get(run_id, 0) > epoch:
            raise ClaimLost(f"run {run_id}: checkpoint of claim {epoch} refused, a newer claim holds the run")
        self._fences[run_id] = epoch

    async def put(self, checkpoint: Checkpoint) -> None:
        self._fence(checkpoint.run_id, checkpoint.epoch)
        self.writes += 1
        self._items[checkpoint.run_id] = checkpoint.to_dict()

    async def get(self, run_id: str, *, epoch: int | None = None) -> Checkpoint | None:
        if epoch:
            self._fences[run_id] = max(self._fences.get(run_id, 0), epoch)
        data = self._items.get(run_id)
        return Checkpoint.from_dict(data) if data is not None else None

    async def delete(self, run_id: str, *, epoch: int | None = None) -> None:
        self._fence(run_id, epoch)
        self._items.pop(run_id, None)


@dataclass(slots=True)
class CoalescePolicy:
    """Write when any threshold is passed since the last write (and always on interruption)."""

    every_deltas: int = 64
    every_bytes: int = 16_384
    every_seconds: float = 1.0


StoreFailed = Callable[[str, BaseException], None]
"""Told of a store call that raised: what failed (``checkpoint_put_failed``, ...) and why."""


class CheckpointWriter:
    """Decides when to write; the store does the writing. A failing store never kills a run."""

    def __init__(self, store: CheckpointStore, policy: CoalescePolicy, on_error: StoreFailed | None = None) -> None:
        self.store = store
        self.policy = policy
        self.on_error = on_error
        self._deltas = 0
        self._bytes = 0
        self._last = time.monotonic()
        self.writes = 0

    def note(self, delta_bytes: int) -> bool:
        """Count one delta; True when a write is due."""
        self._deltas += 1
        self._bytes += delta_bytes
        p = self.policy
        return (
            self._deltas >= p.every_deltas
            or self._bytes >= p.every_bytes
            or (time.monotonic() - self._last) >= p.every_seconds
        )

    async def write(self, checkpoint: Checkpoint) -> None:
        self._deltas = 0
        self._bytes = 0
        self._last = time.monotonic()
        checkpoint.updated_at = time.time()
        try:
            await self.store.put(checkpoint)
            self.writes += 1
        except Exception as exc:
            if self.on_error is not None:
                self.on_error("checkpoint_put_failed", exc)

    async def delete(self, run_id: str) -> None:
        try:
            await self.store.delete(run_id)
        except Exception as exc:
            if self.on_error is not None:
                self.on_error("checkpoint_delete_failed", exc)
