"""Async Redis clients shared by many runs or sockets at once: their pool waits for a free connection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.asyncio import Redis

# One client serves every run of a worker's shared loop, or every socket of a Daphne process:
# hundreds of callers at once. redis-py's default pool raises MaxConnectionsError as soon as
# 100 connections are in use, which failed checkpoints, runs and snapshot reads under load.
# This pool caps the connections and makes a caller wait for one to come back instead (a
# command holds its connection for well under a millisecond); only a wait this long fails.
MAX_CONNECTIONS = 64
WAIT_SECONDS = 10.0


def shared_async_client(url: str, **options: Any) -> Redis:
    """An asyncio Redis client on a ``BlockingConnectionPool``; closing it closes its pool."""
    from redis.asyncio import BlockingConnectionPool, Redis

    pool = BlockingConnectionPool.from_url(url, max_connections=MAX_CONNECTIONS, timeout=WAIT_SECONDS, **options)
    return Redis.from_pool(pool)
