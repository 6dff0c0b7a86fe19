"""A session changed: who hears of it, in this process and in every other manager.

A committed change of a session wakes three readers in this process (the waiters of
:mod:`.lifecycle.events`, the API's lists in :mod:`.session_lists`, the spawners'
:mod:`.reflector`) at once, and is broadcast on the event bus (``session_changed``,
:mod:`..common.events`) so that the other managers' readers wake too. The broadcast
runs in the background: a transition never waits on the bus, and a lost broadcast
(Redis away) is covered by the waiters' safety poll and by :meth:`missed`, which the
bus calls after a gap.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any, Protocol

# The broadcast of a session's state change to every manager (common/events.py).
SESSION_CHANGED = "session_changed"

# Ids per broadcast of a scheduler pass's placements.
BATCH = 1000


class Manager(Protocol):
    """What the fan-out needs of its manager (:class:`.core.BackendAIManager`): the three
    readers, the bus, its id, and a way to run a broadcast in the background."""

    owner_id: str
    events: Any  # lifecycle.events: the waiters
    session_lists: Any  # session_lists: the API's lists
    reflector: Any  # reflector: the spawners'
    bus: Any  # common.events: the event bus
    log: logging.Logger

    def background(self, coro: Coroutine) -> Any: ...


class SessionChanges:
    """The fan-out of session changes for one manager (``manager.changes``)."""

    def __init__(self, manager: Manager):
        self.m = manager
        self.closed = False

    def _wake(self, sid: str, status: str | None = None) -> None:
        self.m.events.changed(sid, status)
        self.m.session_lists.session_changed(sid)
        self.m.reflector.changed(sid)

    def changed(self, sid: str, status: str | None = None) -> None:
        """Session ``sid`` changed (committed): wake this process's readers now and tell
        every other manager, in the background."""
        self._wake(sid, status)
        if not self.closed:
            self.m.background(self._broadcast({"id": sid}, status))

    def changed_many(self, sids: list[str], status: str) -> None:
        """Like :meth:`changed` for many sessions: one broadcast per ``BATCH`` ids."""
        for sid in sids:
            self._wake(sid, status)
        if self.closed:
            return
        for i in range(0, len(sids), BATCH):
            self.m.background(self._broadcast({"ids": sids[i:i + BATCH]}, status))

    async def _broadcast(self, which: dict, status: str | None) -> None:
        payload = {"status": status, "origin": self.m.owner_id, **which}
        try:
            await self.m.bus.broadcast(SESSION_CHANGED, payload)
        except Exception as e:  # Redis away: the others' safety poll sees it
            self.m.log.debug("could not broadcast the change of session(s) %s: %s",
                             which.get("id") or which.get("ids"), e)

    async def heard(self, name: str, payload: dict) -> None:
        """Another manager's broadcast: wake this process's readers of those sessions."""
        if name != SESSION_CHANGED or payload.get("origin") == self.m.owner_id:
            return
        status = payload.get("status")
        for sid in payload.get("ids") or ([payload["id"]] if payload.get("id") else []):
            self._wake(sid, status if isinstance(status, str) else None)

    def missed(self) -> None:
        """The bus had a gap (Redis away): any session may have changed meanwhile."""
        self.m.events.changed_all()
        self.m.session_lists.invalidate_all()
        self.m.reflector.changed_all()
