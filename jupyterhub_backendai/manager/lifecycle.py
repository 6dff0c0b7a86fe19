"""The session lifecycle, driven by the record.

Every status change and every slot change of a session goes through the
functions here (each runs inside the caller's transaction, the session row
locked). What drives a session forward is what the record says, never a task's
memory: each scheduler loop re-reads the sessions whose step nobody drives and
hands them to the handler for their status, the way Backend.AI's Sokovan
handlers do.

| status | handler |
|---|---|
| SCHEDULED | start it (claim, then PREPARING -> CREATING -> RUNNING) |
| PREPARING, CREATING | the start's owner died, or the start took longer than ``start_deadline``: remove what was created, retry or fail with the reason |
| TERMINATING | the destroy's owner died: destroy the kernels, end with the recorded ``end_status`` |
| RUNNING on a LOST agent | say so in ``status_info``; after ``agent_lost_grace`` end it (ERROR) and free its slots; an agent that returns in time keeps it |
| any, ``awaited_until`` past | JupyterHub no longer waits for it (the hub died while it started, and the new one does not know it): end it |

**Claims.** A step is driven by the manager process that holds the session's claim
(``Session.owner`` and ``Session.lease_until``, renewed while the step runs). Taking
a claim is one conditional UPDATE that succeeds for one process only, on SQLite and
PostgreSQL alike, so several hubs on one database never start a session twice. A
claim whose lease ran out, or whose owner was a process on this host that no longer
exists (a hub killed and restarted), is taken over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import socket
import uuid
from collections.abc import Iterable

from sqlalchemy import or_, select, update
from sqlalchemy.orm import selectinload

from ..common.types import (
    ALIVE_STATUSES,
    DEAD_STATUSES,
    STARTING_STATUSES,
    AgentStatus,
    SessionStatus,
)
from ..models import Agent, Kernel, Session
from ..models.base import utcnow
from .scheduler.dispatcher import release_kernels, set_status

SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
LOST_MARK = "agent lost: "

_HOST = socket.gethostname()
# Owner ids of the managers alive in this process (tests run several in one).
_LIVE_OWNERS: set[str] = set()


def new_owner_id() -> str:
    """A manager's name in claims: host, pid and a nonce; alive until :func:`owner_gone`."""
    owner = f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    _LIVE_OWNERS.add(owner)
    return owner


def owner_gone(owner: str) -> None:
    """The manager named ``owner`` stopped: its claims are taken over at once."""
    _LIVE_OWNERS.discard(owner)


def owner_is_dead(owner: str | None, me: str) -> bool:
    """Whether ``owner`` is a process of this host that no longer runs (or an earlier
    life of this pid): its claim needs no waiting for the lease."""
    if not owner or owner == me:
        return False
    try:
        host, pid, _ = owner.rsplit(":", 2)
        pid = int(pid)
    except ValueError:
        return False
    if host != _HOST:
        return False
    if pid == os.getpid():
        return owner not in _LIVE_OWNERS  # an earlier manager in this process (tests)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# -- in-process session events -------------------------------------------------------


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
                await asyncio.wait_for(ev.wait(), timeout)
                return True
            except TimeoutError:
                return False


# -- transitions (inside the caller's transaction) -------------------------------------


def lock_session(s, sid: str) -> Session | None:
    """The session row locked for a state change, with its kernels read fresh."""
    return s.scalar(
        select(Session)
        .where(Session.id == sid)
        .options(selectinload(Session.kernels))
        .with_for_update(of=Session)
        .execution_options(populate_existing=True)
    )


def transition(s, sid: str, frm: Iterable[str], to: str, info: str = "", *,
               owner: str | None = None, lease: float | None = None) -> bool:
    """``frm`` -> ``to`` for the session and its kernels; False when it is elsewhere.
    With ``owner``, the step is claimed for ``lease`` seconds."""
    sess = s.get(Session, sid, with_for_update=True, populate_existing=True)
    if sess is None or sess.status not in set(frm):
        return False
    set_status(sess, to, info)
    for k in sess.kernels:
        k.status = to
    if owner is not None:
        sess.owner = owner
        sess.lease_until = utcnow() + dt.timedelta(seconds=lease or 0)
    return True


def begin_termination(s, sid: str, status: str, info: str, owner: str, lease: float) -> bool:
    """Any alive status -> TERMINATING, remembering the status it will end in."""
    sess = s.get(Session, sid, with_for_update=True, populate_existing=True)
    if sess is None or sess.status not in ALIVE_STATUSES:
        return False
    if sess.status != SessionStatus.TERMINATING:
        set_status(sess, SessionStatus.TERMINATING, info)
        for k in sess.kernels:
            k.status = SessionStatus.TERMINATING
        sess.end_status = status
    sess.owner = owner
    sess.lease_until = utcnow() + dt.timedelta(seconds=lease)
    return True


def terminate(s, sid: str, status: str, info: str, result: str | None = None,
              logs: dict[str, str] | None = None) -> bool:
    """Mark dead and free the slots. False when it was dead already."""
    sess = lock_session(s, sid)
    if sess is None or sess.status in DEAD_STATUSES:
        return False
    release_kernels(s, sess, status)
    for k in sess.kernels:
        if logs and logs.get(k.id) and not k.logs:
            k.logs = logs[k.id]
    set_status(sess, status, info)
    sess.alive_marker = None
    sess.terminated_at = utcnow()
    sess.result = result or (SUCCESS if status == SessionStatus.TERMINATED else FAILURE)
    sess.owner = sess.lease_until = sess.awaited_until = None
    return True


def start_failed(s, sid: str, reason: str, limit: int, new_kernels) -> tuple[str, str] | None:
    """Release the slots; back to PENDING for another try (fresh kernel rows), or ERROR
    once ``limit`` retries are used. Returns (resource group, "retry" | "error")."""
    sess = lock_session(s, sid)
    if sess is None or sess.status not in STARTING_STATUSES:
        return None
    release_kernels(s, sess, SessionStatus.ERROR)
    sess.owner = sess.lease_until = None
    if sess.retries < limit:
        sess.retries += 1
        # Fresh kernel rows (new ids): late events about the failed containers
        # cannot touch the next attempt.
        slots = sess.kernels[0].requested_slots
        for k in list(sess.kernels):
            s.delete(k)
        s.flush()
        s.expire(sess, ["kernels"])
        for k in new_kernels(slots, sess.cluster_size):
            k.session_id = sess.id
            s.add(k)
        set_status(sess, SessionStatus.PENDING, f"start failed ({reason}); retry {sess.retries} of {limit}")
        return sess.resource_group, "retry"
    tries = sess.retries + 1
    set_status(sess, SessionStatus.ERROR,
               f"failed to start: {reason}" + (f" (after {tries} attempts)" if tries > 1 else ""))
    sess.alive_marker = None
    sess.terminated_at = utcnow()
    sess.result = FAILURE
    sess.awaited_until = None
    return sess.resource_group, "error"


def claim(s, sid: str, statuses: Iterable[str], owner: str, lease: float,
          dead_owner: str | None = None) -> bool:
    """Take the session's claim when it is in ``statuses`` and unclaimed, claimed by
    ``owner`` already, expired, or held by ``dead_owner`` (known dead). One UPDATE:
    of several managers, exactly one wins."""
    now = utcnow()
    free = or_(Session.owner.is_(None), Session.owner == owner, Session.lease_until.is_(None),
               Session.lease_until < now)
    if dead_owner:
        free = or_(free, Session.owner == dead_owner)
    n = s.execute(
        update(Session)
        .where(Session.id == sid, Session.status.in_(list(statuses)), free)
        .values(owner=owner, lease_until=now + dt.timedelta(seconds=lease))
        .execution_options(synchronize_session=False)
    ).rowcount
    return n == 1


def renew(s, sids: list[str], owner: str, lease: float) -> None:
    if sids:
        s.execute(
            update(Session)
            .where(Session.id.in_(sids), Session.owner == owner)
            .values(lease_until=utcnow() + dt.timedelta(seconds=lease))
            .execution_options(synchronize_session=False)
        )


def await_session(s, sid: str, seconds: float | None) -> None:
    """A spawner waits (``seconds`` from now), or JupyterHub knows it (None)."""
    s.execute(
        update(Session)
        .where(Session.id == sid, Session.alive_marker.is_not(None))
        .values(awaited_until=None if seconds is None else utcnow() + dt.timedelta(seconds=seconds))
        .execution_options(synchronize_session=False)
    )


# -- what needs a handler ------------------------------------------------------------------


def due_sessions(s, now: dt.datetime) -> list[tuple[str, str, str | None, dt.datetime | None, dict]]:
    """(id, status, owner, lease_until, status_history) of sessions in a transient
    status (SCHEDULED .. TERMINATING): the candidates of the status handlers."""
    return [tuple(r) for r in s.execute(
        select(Session.id, Session.status, Session.owner, Session.lease_until, Session.status_history)
        .where(Session.status.in_([*STARTING_STATUSES, SessionStatus.TERMINATING]))
    )]


def abandoned_sessions(s, now: dt.datetime) -> list[str]:
    """Alive sessions whose spawner stopped waiting before JupyterHub knew them."""
    return list(s.scalars(
        select(Session.id).where(Session.alive_marker.is_not(None), Session.awaited_until.is_not(None),
                                 Session.awaited_until < now)
    ))


def sessions_on_lost_agents(s) -> list[tuple[str, str, str, dt.datetime]]:
    """(session id, status_info, agent id, agent's last heartbeat) for every RUNNING
    session with a kernel on a LOST agent."""
    rows = s.execute(
        select(Session.id, Session.status_info, Agent.id, Agent.last_heartbeat)
        .join(Kernel, Kernel.session_id == Session.id)
        .join(Agent, Agent.id == Kernel.agent_id)
        .where(Session.status == SessionStatus.RUNNING, Agent.status == AgentStatus.LOST)
    ).all()
    seen, out = set(), []
    for sid, info, aid, hb in rows:
        if sid not in seen:
            seen.add(sid)
            out.append((sid, info, aid, hb))
    return out


def mark_lost(s, sid: str, info: str) -> bool:
    """Say in a RUNNING session's status_info that its agent is lost (once)."""
    return s.execute(
        update(Session)
        .where(Session.id == sid, Session.status == SessionStatus.RUNNING,
               ~Session.status_info.startswith(LOST_MARK))
        .values(status_info=info)
        .execution_options(synchronize_session=False)
    ).rowcount == 1


def unmark_returned(s) -> list[str]:
    """RUNNING sessions marked lost whose agents are all ALIVE again: 'running' again."""
    rows = s.execute(
        select(Session.id, Agent.status)
        .join(Kernel, Kernel.session_id == Session.id)
        .join(Agent, Agent.id == Kernel.agent_id)
        .where(Session.status == SessionStatus.RUNNING, Session.status_info.startswith(LOST_MARK))
    ).all()
    lost = {sid for sid, st in rows if st != AgentStatus.ALIVE}
    back = sorted({sid for sid, _ in rows} - lost)
    if back:
        s.execute(
            update(Session)
            .where(Session.id.in_(back), Session.status_info.startswith(LOST_MARK))
            .values(status_info="running")
            .execution_options(synchronize_session=False)
        )
    return back


def kernels_on(s, agent_id: str) -> dict[str, tuple[str, str]]:
    """Kernel id -> (session id, session status) of alive sessions' kernels on an agent."""
    return {
        kid: (sid, st)
        for kid, sid, st in s.execute(
            select(Kernel.id, Session.id, Session.status)
            .join(Session, Session.id == Kernel.session_id)
            .where(Kernel.agent_id == agent_id, Session.alive_marker.is_not(None))
        )
    }
