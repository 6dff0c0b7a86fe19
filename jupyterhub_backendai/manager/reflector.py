"""What JupyterHub's spawners poll, read for all of them at once.

JupyterHub polls every server it knows (``Spawner.poll``, every
``c.Spawner.poll_interval``, and all of them together when the hub starts). Each poll
reading the record alone costs one query per server; the reflector answers every poll
from one copy of the polled sessions' states, in the manner of KubeSpawner's
reflector:

- a poll of a session whose state is older than ``status_poll_interval`` (or that
  changed: the manager's own change events and other managers' ``session_changed``
  broadcasts mark it) waits for the next read, and one read (one query) answers every
  poll waiting at that moment, together with every other polled session whose state has
  aged;
- a gap in the bus (Redis away) marks everything.

A poll therefore never reports a state older than ``status_poll_interval`` plus one read.
"""

from __future__ import annotations

import asyncio
import dataclasses

from sqlalchemy import select

from ..common.types import DEAD_STATUSES
from ..models import Kernel, Session


@dataclasses.dataclass(frozen=True)
class SessionState:
    status: str
    # The main kernel's exit code (None while it runs, or when none was reported).
    exit_code: int | None
    # Whether a spawner's start still waits on it (JupyterHub has not polled it yet).
    awaited: bool

    @property
    def dead(self) -> bool:
        return self.status in DEAD_STATUSES


def session_states(s, sids: list[str]) -> dict[str, SessionState]:
    """One query: the state of each of ``sids`` that exists."""
    rows = s.execute(
        select(Session.id, Session.status, Session.awaited_until, Kernel.exit_code)
        .outerjoin(Kernel, (Kernel.session_id == Session.id) & (Kernel.cluster_idx == 0))
        .where(Session.id.in_(sids))
    )
    return {sid: SessionState(status, code, awaited is not None)
            for sid, status, awaited, code in rows}


class SessionReflector:
    def __init__(self, mgr) -> None:
        self.mgr = mgr
        self._states: dict[str, tuple[float, SessionState | None]] = {}  # sid -> (read at, state)
        self._stale: set[str] = set()
        self._wanted: set[str] = set()
        self._read: asyncio.Task | None = None
        self._dropped: set[str] = set()  # forgotten while a read was in flight
        self.reads = 0  # queries made (tests, metrics)

    async def state(self, sid: str) -> SessionState | None:
        """The session's state, at most ``status_poll_interval`` old (None: no such session)."""
        loop = asyncio.get_running_loop()
        known = self._states.get(sid)
        if known is not None and sid not in self._stale \
                and loop.time() - known[0] < self.mgr.status_poll_interval:
            return known[1]
        self._wanted.add(sid)
        while True:
            if self._read is None:
                self._read = asyncio.ensure_future(self._read_wanted())
            # The read's own answer, not ``_states``: a spawner's stop may forget ``sid``
            # between the read and this waiter's turn. A sid wanted after the read began
            # is not in its answer: the next read takes it.
            read = await asyncio.shield(self._read)
            if sid in read:
                return read[sid]
            self._wanted.add(sid)

    def forget(self, sid: str) -> None:
        """No spawner polls ``sid`` any more (it stopped)."""
        self._states.pop(sid, None)
        self._stale.discard(sid)
        if self._read is not None:
            self._dropped.add(sid)  # the read in flight answers it but does not keep it

    def changed(self, sid: str) -> None:
        if sid in self._states:
            self._stale.add(sid)

    def changed_all(self) -> None:
        self._stale.update(self._states)

    async def _read_wanted(self) -> dict[str, SessionState | None]:
        """One query for every wanted, aged or changed session; its answer by sid."""
        try:
            await asyncio.sleep(0)  # the polls of this moment join the read
            loop = asyncio.get_running_loop()
            now = loop.time()
            aged = {sid for sid, (at, _) in self._states.items()
                    if now - at >= self.mgr.status_poll_interval}
            sids = self._wanted | aged | (self._stale & set(self._states))
            self._wanted = set()
            self._stale -= sids
            found = await self.mgr.db_read(session_states, sorted(sids))
            self.reads += 1
            now = loop.time()
            read = {sid: found.get(sid) for sid in sids}
            for sid, st in read.items():
                if sid not in self._dropped:
                    self._states[sid] = (now, st)
            return read
        finally:
            self._read = None
            self._dropped.clear()
