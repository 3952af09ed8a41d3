"""The cancel token: cancellation that beats recovery.

A user cancel, an explicit abort or an interceptor's yield stops the run at the next chunk
or backoff tick, and no continuation follows.
"""

from __future__ import annotations

import asyncio
import enum


class StopKind(enum.StrEnum):
    CANCEL = "cancel"
    ABORT = "abort"
    YIELD = "yield"


class CancelToken:
    """Set from any thread or task; awaited by the runner during streaming and backoff."""

    def __init__(self) -> None:
        self._kind: StopKind | None = None
        self.reason: str = ""
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self) -> None:
        """Attach to the running loop (the runner calls this)."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        if self._kind is not None:
            self._event.set()

    def stop(self, kind: StopKind = StopKind.CANCEL, reason: str = "") -> None:
        if self._kind is not None:
            return
        self._kind = kind
        self.reason = reason or kind.value
        if self._event is not None and self._loop is not None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                self._event.set()
            else:
                self._loop.call_soon_threadsafe(self._event.set)

    def cancel(self, reason: str = "") -> None:
        self.stop(StopKind.CANCEL, reason)

    def abort(self, reason: str = "") -> None:
        self.stop(StopKind.ABORT, reason)

    def yield_(self, reason: str = "") -> None:
        self.stop(StopKind.YIELD, reason)

    @property
    def kind(self) -> StopKind | None:
        return self._kind

    @property
    def stopped(self) -> bool:
        return self._kind is not None

    async def sleep(self, seconds: float) -> bool:
        """Sleep unless stopped first; True when the sleep was interrupted by a stop."""
        if self._kind is not None:
            return True
        if self._event is None:
            self.bind()
        assert self._event is not None
        try:
            await asyncio.wait_for(self._event.wait(), timeout=max(seconds, 0.0))
        except TimeoutError:
            return False
        return True

    async def wait(self) -> None:
        if self._event is None:
            self.bind()
        assert self._event is not None
        await self._event.wait()
