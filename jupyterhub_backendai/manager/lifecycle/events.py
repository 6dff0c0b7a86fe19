"""Wakes whoever waits on a session when it changes (in this process)."""

from __future__ import annotations

import asyncio
import contextlib

from ...common.tasks import wait_set


class Change(asyncio.Event):
    """An event that also keeps the new status each change said (None: a change that
    did not say, such as a reason's; or one of many at once, a gap of the bus), so that
    a waiter for some statuses reads the record only when one of them may have come."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: set[str | None] = set()

    def clear(self) -> None:
        super().clear()
        self.statuses = set()

    def may_be(self, statuses) -> bool:
        """Whether a change since the last clear may have brought one of ``statuses``."""
        return any(s is None or s in statuses for s in self.statuses)


class SessionEvents:
    """Wakes whoever waits on a session when it changes.

    ``start()``, ``progress()`` and the readiness wait block here instead of polling
    the database. The manager calls :meth:`changed` for its own changes and for those
    other managers broadcast on the event bus (``session_changed``); the waiter's slow
    safety poll covers a broadcast that was lost.
    """

    def __init__(self) -> None:
        self._listeners: dict[str, set[Change]] = {}

    def changed(self, sid: str, status: str | None = None) -> None:
        """``sid`` changed; ``status``: its status after the change, where the changer
        says it (its own or another manager's broadcast)."""
        said = str(status) if status is not None else None
        for ev in self._listeners.get(sid, ()):
            ev.statuses.add(said)
            ev.set()

    def changed_all(self) -> None:
        for evs in self._listeners.values():
            for ev in evs:
                ev.statuses.add(None)
                ev.set()

    def watching(self, sid: str) -> bool:
        return sid in self._listeners

    @contextlib.contextmanager
    def listen(self, sid: str):
        """An event set by every change of ``sid`` while the block runs: clear it
        before reading the record, so that no change after the read is missed."""
        ev = Change()
        self._listeners.setdefault(sid, set()).add(ev)
        try:
            yield ev
        finally:
            evs = self._listeners.get(sid)
            if evs is not None:
                evs.discard(ev)
                if not evs:
                    del self._listeners[sid]

    async def wait(self, sid: str, timeout: float) -> frozenset:
        """Wait until ``sid`` changes or ``timeout`` passes: the statuses the changes
        said (None for one that did not), empty (false) when none came."""
        with self.listen(sid) as ev:
            return frozenset(ev.statuses) if await wait_set(ev, timeout) else frozenset()
