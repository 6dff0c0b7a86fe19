"""Skip a scheduler pass when nothing it depends on changed since the last one.

A pass over a queue that cannot move (80,000 sessions waiting on full agents)
reads and re-decides every waiting session to reach the same verdicts. Before
running a pass, :func:`fingerprint` reads a few aggregates that change with
everything a pass's outcome depends on:

- *arrivals and departures*: per status, the number of sessions, their latest
  ``created_at`` and ``terminated_at`` (over all groups: quotas and
  dependencies span groups; one index-only scan);
- *releases and agents*: the group's agents (status, schedulable, capacity,
  occupied slots, architecture);
- *policy*: the group row (scheduler, options, allowed lists), resource
  policies, keypairs (active, policy), project and domain limits, session
  dependencies.

This is the scheduler's generation counter, kept by the database itself: any
writer (this manager, another manager, the API, an operator's SQL) changes it,
so no hook can be forgotten and several managers agree. A pass whose
fingerprint matches the one recorded after the last pass that changed nothing
is skipped, unless a time-based rule came due meanwhile (pending timeout,
starvation threshold, retry back-off, a batch start time): :func:`next_due`
gives the earliest such moment from the last pass's waiting sessions.

When the only change is new PENDING sessions (:func:`arrivals_since`), the pass
decides only them, against what the last pass remembered (its agents, usage,
policies and the request shapes that did not fit): the sessions that waited
then would wait again for the same reasons. See ``dispatcher._arrivals_pass``.

When the only change is outside the queue (a release, an agent change:
:func:`released_since`), the pass re-reads agents and usage and decides again
only the remembered sessions whose verdict can have changed: those whose request
shape now fits somewhere, and those that waited on a limit or a dependency. See
``dispatcher._released_pass``. So does a pass when sessions only left the queue
(cancelled: :func:`left_since`), with them taken out of what it remembered.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import weakref
from dataclasses import dataclass

from sqlalchemy import String, func, select, text
from sqlalchemy.orm import Session as DBSession

from ...common.types import SessionStatus
from .snapshot import KP, POL, RG, SD, A, D, P, S
from .state import PassContext, PendingSession, Verdict
from .validators import RetryBackoffValidator


def _digest(rows) -> str:
    h = hashlib.blake2b(digest_size=16)
    for r in rows:
        h.update(repr(tuple(r)).encode())
        h.update(b"\0")
    return h.hexdigest()


def fingerprint(db: DBSession, group: str) -> tuple:
    """What the outcome of a pass over ``group`` depends on, condensed."""
    sessions = db.execute(
        select(S.c.status, func.count(), func.max(S.c.created_at), func.max(S.c.terminated_at))
        .group_by(S.c.status).order_by(S.c.status)
    ).all()
    if db.get_bind().dialect.name == "postgresql":
        # Digest in the database: 10,000 agents' slot maps are not decoded in Python.
        agents = db.execute(text(
            "SELECT count(*), md5(string_agg(id || ':' || coalesce(status, '') || ':' ||"
            " coalesce(schedulable::text, '') || ':' || coalesce(architecture, '') || ':' ||"
            " coalesce(available_slots::text, '') || ':' || coalesce(occupied_slots::text, '')"
            " || ':' || coalesce(away_slots::text, ''),"
            " ',' ORDER BY id)) FROM agents WHERE resource_group = :g"), {"g": group}).all()
    else:
        agents = db.execute(
            select(A.c.id, A.c.status, A.c.schedulable, A.c.architecture,
                   A.c.available_slots.cast(String), A.c.occupied_slots.cast(String),
                   A.c.away_slots.cast(String))
            .where(A.c.resource_group == group).order_by(A.c.id)
        ).all()
    grp = db.execute(select(RG).where(RG.c.name == group)).all()
    pols = db.execute(select(POL).order_by(POL.c.name)).all()
    kps = db.execute(
        select(KP.c.access_key, KP.c.is_active, KP.c.resource_policy).order_by(KP.c.access_key)
    ).all()
    limits = db.execute(select(P.c.id, P.c.total_resource_slots).order_by(P.c.id)).all() + \
        db.execute(select(D.c.name, D.c.total_resource_slots).order_by(D.c.name)).all()
    deps = db.execute(select(func.count()).select_from(SD)).scalar()
    # The group row carries scheduler_state, which the pass itself writes: leave it out
    # (reservations follow from the rest).
    grp = [{k: v for k, v in r._mapping.items() if k != "scheduler_state"} for r in grp]
    return (
        # The per-status rows as they are (a handful): arrivals_since reads them.
        tuple(tuple(r) for r in sessions), _digest(agents), repr(grp), _digest(pols),
        _digest(kps), _digest(limits), deps,
    )


def arrivals_since(db: DBSession, before: tuple, after: tuple) -> dt.datetime | None:
    """If the only change from fingerprint ``before`` to ``after`` is new PENDING
    sessions, the ``created_at`` after which they all are; else None.

    Every other status's count and times are unchanged (so no session left PENDING:
    it would have arrived somewhere else), nothing else changed, and the PENDING count
    grew by exactly the number of PENDING sessions created after the last pass's
    newest one (a session committed late with an older ``created_at`` fails this)."""
    if before[1:] != after[1:]:
        return None
    old = {r[0]: r for r in before[0]}
    new = {r[0]: r for r in after[0]}
    pending = SessionStatus.PENDING
    if {k: v for k, v in old.items() if k != pending} != {
            k: v for k, v in new.items() if k != pending}:
        return None
    if pending not in old or pending not in new:
        return None  # no queue before (a full pass is cheap) or none now
    _, n_old, newest, _ = old[pending]
    _, n_new, _, _ = new[pending]
    if n_new <= n_old or newest is None:
        return None
    n = db.execute(select(func.count()).select_from(S).where(
        S.c.status == pending, S.c.created_at > newest)).scalar()
    return newest if n == n_new - n_old else None


def released_since(before: tuple, after: tuple) -> bool:
    """Whether what changed from fingerprint ``before`` to ``after`` is only sessions
    outside the queue (a session ended, one went on starting or stopping) and agents
    (slots given back, an agent joined, left or changed): no session arrived in the
    queue or left it (the PENDING counts and times are equal), and the group, the
    policies, keypairs, limits and dependencies are as they were. The queue the last
    pass remembered is then the queue (the caller checks its rows too: a priority or
    a retry count changes no aggregate)."""
    if before == after or before[2:] != after[2:]:
        return False
    pending = SessionStatus.PENDING
    old = next((r for r in before[0] if r[0] == pending), None)
    new = next((r for r in after[0] if r[0] == pending), None)
    return old is not None and old == new


def left_since(before: tuple, after: tuple) -> bool:
    """Whether, from fingerprint ``before`` to ``after``, sessions may only have left
    the queue (cancelled) while others may have ended or agents changed: fewer PENDING
    sessions, and the group, the policies, keypairs, limits and dependencies as they
    were. The caller checks the queue against the one remembered without the sessions
    that left (row by row on SQLite; on PostgreSQL the sessions cancelled since, then
    the queue's digest): anything else (an arrival, a session placed by another
    manager on PostgreSQL) makes it a full pass."""
    if before[2:] != after[2:]:
        return False
    pending = SessionStatus.PENDING
    old = next((r for r in before[0] if r[0] == pending), None)
    new = next((r for r in after[0] if r[0] == pending), None)
    return old is not None and new is not None and new[1] < old[1]


def next_due(ctx: PassContext, waiting: list[tuple[PendingSession, Verdict]]) -> dt.datetime | None:
    """The earliest moment a waiting session's verdict can change by time alone."""
    opts = ctx.options
    now = ctx.now
    due: dt.datetime | None = None

    def at(t: dt.datetime) -> None:
        nonlocal due
        if t > now and (due is None or t < due):
            due = t

    timeout = dt.timedelta(seconds=float(opts.pending_timeout)) if opts.pending_timeout > 0 else None
    starve = dt.timedelta(seconds=float(opts.starvation_threshold)) if opts.max_reservations > 0 else None
    for s, _ in waiting:
        if timeout is not None:
            at(s.created_at + timeout)
        if starve is not None:
            at(s.created_at + starve)
        if s.starts_at is not None:
            at(s.starts_at)
        if s.retries > 0:
            ready = RetryBackoffValidator.ready_at(s, ctx)
            if ready is not None:
                at(ready)
    return due


@dataclass
class Quiet:
    """A pass that changed nothing: its fingerprint and when time alone changes things."""

    fingerprint: tuple
    due: dt.datetime | None
    #: What that pass knew (:class:`.dispatcher.Memory`): a pass that finds only
    #: arrivals decides them against it instead of re-reading the queue.
    memory: object = None
    #: The fingerprint was read after the pass's own writes (it placed sessions), so it
    #: may also hold what another transaction committed while the pass ran, which the
    #: pass never saw (PostgreSQL reads committed data statement by statement). An
    #: equal fingerprint then does not skip the next pass: it decides the remembered
    #: queue again on fresh agents and usage, as after a release, with the queue checked
    #: against the remembered sessions; only a pass that wrote nothing leaves a fingerprint read before its
    #: reads, which a skip can trust.
    tainted: bool = False


#: engine -> {group: Quiet}; weak so that a disposed engine's entries go with it.
_QUIET: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def quiet_for(engine) -> dict[str, Quiet]:
    d = _QUIET.get(engine)
    if d is None:
        d = _QUIET[engine] = {}
    return d


def forget(engine=None) -> None:
    """Make the next pass run in full (for ``engine``, or everywhere)."""
    if engine is None:
        _QUIET.clear()
    else:
        _QUIET.pop(engine, None)
