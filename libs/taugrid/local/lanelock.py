"""A lock whose high priority lane goes first: the local cluster's one lock, which deletes, the control loop, pod
reports and an apply's due platform refresh share.

Applies held it for their whole round trips until session 12 (they now take it only for that refresh): with a
plain ``asyncio.Lock`` a high-lane apply waited behind every ordinary one queued on it. Here a waiter of the
high lane is handed the lock before any ordinary one;
within a lane the order stays first come, first served. The lock is handed over on release (never left free for
a newcomer to take), so an ordinary newcomer cannot overtake a high-lane waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType


class LaneLock:
    def __init__(self) -> None:
        self._held = False
        self._waiting: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())

    def locked(self) -> bool:
        return self._held

    async def acquire(self, *, high: bool = False) -> None:
        if not self._held and not any(self._waiting):
            self._held = True
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting[0 if high else 1]
        queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed the lock just as it was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(turn)
            raise

    def release(self) -> None:
        if not self._held:
            raise RuntimeError("LaneLock released while not held")
        for queue in self._waiting:
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)  # handed over: it stays held
                    return
        self._held = False

    @contextlib.asynccontextmanager
    async def first(self, high: bool = True) -> AsyncIterator[None]:
        """``async with lock.first(high)``: held for a request of the high lane when ``high``."""
        await self.acquire(high=high)
        try:
            yield
        finally:
            self.release()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()
