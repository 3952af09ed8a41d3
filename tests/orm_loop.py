"""Awaiting many runs' ORM work on one event loop in a test, as a worker's shared loop does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections


async def gather_on_one_loop(*calls: Awaitable[Any]) -> list[Any]:
    """Each call's result or exception, in order; then the ORM thread's connection is closed
    (before the test's database teardown, which it would otherwise block)."""
    try:
        return await asyncio.gather(*calls, return_exceptions=True)
    finally:
        await sync_to_async(connections.close_all)()
