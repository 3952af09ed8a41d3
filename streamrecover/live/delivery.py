"""Group names and ``group_send`` for run frames, safe across threads in embedded mode.

Channels' in-memory layer keeps ``asyncio.Queue``s that belong to the event loop serving
the sockets (Daphne's). In embedded mode a run executes in a thread with its own loop, and
putting into those queues from there would not wake Daphne's loop. The consumer records
that loop (``bind_home_loop``); ``group_send`` then hands each message over to it. Redis
layers need none of this: each loop has its own connections.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from typing import Any

from channels.layers import InMemoryChannelLayer

GROUP_PREFIX = "streamrecover.run."
FRAME_EVENT = "run.frame"  # handled by RunConsumer.run_frame

_home_loops: weakref.WeakKeyDictionary[Any, asyncio.AbstractEventLoop] = weakref.WeakKeyDictionary()


def run_hex(run_id: str | uuid.UUID) -> str:
    """The run id spelt one way, whoever names it (a URL's ``<uuid:run_id>`` and a worker's task
    argument differ): every name derived from a run id goes through here."""
    return uuid.UUID(str(run_id)).hex


def group_name(run_id: str | uuid.UUID) -> str:
    """``streamrecover.run.<hex>``: valid for every layer (``^[a-zA-Z\\d\\-_.]+$``, < 100 chars)."""
    return GROUP_PREFIX + run_hex(run_id)


def bind_home_loop(layer: Any) -> None:
    """Remember the running loop as the one that serves ``layer``'s receivers (in-memory only)."""
    if isinstance(layer, InMemoryChannelLayer):
        _home_loops[layer] = asyncio.get_running_loop()


async def group_send(layer: Any, group: str, message: dict[str, Any]) -> None:
    """``layer.group_send``, run on the receivers' loop when that is another thread's."""
    home = _home_loops.get(layer) if isinstance(layer, InMemoryChannelLayer) else None
    if home is not None and home is not asyncio.get_running_loop() and home.is_running():
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(layer.group_send(group, message), home))
        return
    await layer.group_send(group, message)
