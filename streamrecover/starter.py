"""Executing a run in this process with its frames published live (the Celery task and the thread)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

from django.db import close_old_connections

from .engine.agent import RunResult
from .live.publisher import make_publisher
from .runs import execution


@asynccontextmanager
async def live_publisher(run_id: str) -> AsyncIterator[execution.LiveSink]:
    """The run's live publisher (Channels) while the agent runs; closed (flushed) after."""
    publisher = await make_publisher(run_id)
    try:
        yield publisher
    finally:
        with suppress(Exception):
            await publisher.aclose()


async def execute_here(run_id: str, **options: Any) -> RunResult | None:
    """Claim and execute a run in this process, its frames published live.

    ``options`` are ``runs.execution.execute_run``'s (extra sinks, tools, a provider override).
    """
    return await execution.execute_run(run_id, live=live_publisher, **options)


THREAD_PREFIX = "streamrecover-run-"


def run_threads(run_id: object = None) -> list[threading.Thread]:
    """The live threads of this process executing a run (``run_id``'s, or every run's)."""
    if run_id is None:
        return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]
    name = f"{THREAD_PREFIX}{run_id}"
    return [t for t in threading.enumerate() if t.name == name]


def start_in_thread(run_id: str) -> threading.Thread:
    """Embedded mode: execute in a daemon thread (named by ``run_threads``) with its own event loop."""

    def target() -> None:
        try:
            asyncio.run(execute_here(run_id))
        finally:
            close_old_connections()

    thread = threading.Thread(target=target, name=f"{THREAD_PREFIX}{run_id}", daemon=True)
    thread.start()
    return thread
