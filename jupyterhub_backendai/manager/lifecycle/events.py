"""Wakes whoever waits on a session when it changes (in this process)."""

from __future__ import annotations

import asyncio
import contextlib


class SessionEvents:
    """Wakes whoever waits on a session when it changes.

    ``start()``, ``progress()`` and the readiness wait block here instead of polling
    the database. The manager calls :meth:`changed` for its own changes and for those
    other managers broadcast on the event bus (``session_changed``); the waiter's slow
    safety poll covers a broadcast that was lost.
    """

    def __init__(self) -> None:
        self._listeners: dict[str, set[asyncio.Event]] = {}

    def changed(self, sid: str) -> None:
        for ev in self._listeners.get(sid, ()):
            ev.set()

    def changed_all(self) -> None:
        for evs in self._listeners.values():
            for ev in evs:
                ev.set()

    def watching(self, sid: str) -> bool:
        return sid in self._listeners

    @contextlib.contextmanager
    def listen(self, sid: str):
        """An event set by every change of ``sid`` while the block runs: clear it
        before reading the record, so that no change after the read is missed."""
        ev = asyncio.Event()
        self._listeners.setdefault(sid, set()).add(ev)
        try:
            yield ev
        finally:
            evs = self._listeners.get(sid)
            if evs is not None:
                evs.discard(ev)
                if not evs:
                    del self._listeners[sid]

    async def wait(self, sid: str, timeout: float) -> bool:
        """Wait until ``sid`` changes (True) or ``timeout`` passes (False)."""
        with self.listen(sid) as ev:
            try:
                async with asyncio.timeout(timeout):
                    await ev.wait()
                return True
            except TimeoutError:
                return False
