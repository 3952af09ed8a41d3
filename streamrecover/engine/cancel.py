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
    """Set from any thread or task; awaited by the runner during streaming and backoff.

    A stop resolves one future, which the runner races against its work directly
    (``asyncio.wait`` takes it as it is): no task per wait, and no ``asyncio.Event``, whose
    waiters' deque alone is 600 bytes of every active run."""

    def __init__(self) -> None:
        self._kind: StopKind | None = None
        self.reason: str = ""
        self._stopped: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self) -> None:
        """Attach to the running loop (the runner calls this; again on the same loop is a no-op)."""
        loop = asyncio.get_running_loop()
        if self._stopped is not None and self._loop is loop:
            return
        self._loop = loop
        self._stopped = loop.create_future()
        if self._kind is not None:
            self._stopped.set_result(None)

    def stop(self, kind: StopKind = StopKind.CANCEL, reason: str = "") -> None:
        if self._kind is not None:
            return
        self._kind = kind
        self.reason = reason or kind.value
        if self._stopped is not None and self._loop is not None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                self._resolve()
            else:
                self._loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

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

    def stopped_future(self) -> asyncio.Future[None]:
        """Resolved when the token is stopped. Race it (``asyncio.wait``), never cancel it."""
        if self._stopped is None:
            self.bind()
        assert self._stopped is not None
        return self._stopped

    async def sleep(self, seconds: float) -> bool:
        """Sleep unless stopped first; True when the sleep was interrupted by a stop."""
        if self._kind is not None:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self.stopped_future()), timeout=max(seconds, 0.0))
        except TimeoutError:
            return False
        return True

    async def wait(self) -> None:
        await asyncio.shield(self.stopped_future())
