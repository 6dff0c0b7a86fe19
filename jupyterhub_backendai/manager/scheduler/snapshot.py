"""Read what one pass needs, under the pass's locks, with a fixed handful of queries.

Core queries (no ORM objects): a pass over 10,000 pending sessions reads
10,000 rows, it does not build and track 10,000 ORM instances.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import Text, cast, func, or_, select, text
from sqlalchemy.orm import Session as DBSession

from ...common.slots import ResourceSlot
from ...common.types import AgentStatus, SessionStatus
from ...models import (
    Agent,
    Domain,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ResourceGroup,
    Session,
    session_dependencies,
)
from ...models.base import utcnow
from .options import SchedulerOptions
from .pool import ZERO, AgentPool, PoolAgent
from .state import GroupInfo, PassContext, PendingSession, Policy, Usage

S = Session.__table__
K = Kernel.__table__
A = Agent.__table__
RG = ResourceGroup.__table__
KP = Keypair.__table__
POL = KeypairResourcePolicy.__table__
P = Project.__table__
D = Domain.__table__
SD = session_dependencies

#: Sessions whose kernels hold slots on agents.
HOLDING_STATUSES = (
    SessionStatus.SCHEDULED,
    SessionStatus.PREPARING,
    SessionStatus.CREATING,
    SessionStatus.RUNNING,
    SessionStatus.TERMINATING,
)

#: One PostgreSQL advisory lock key for every scheduler pass of every manager:
#: keypair, user, project and domain quotas span resource groups, so passes that
#: check them must not interleave ("BAIS" in ASCII).
ADVISORY_LOCK_KEY = 0x42414953


def dialect(db: DBSession) -> str:
    return db.get_bind().dialect.name


def lock_scheduler(db: DBSession) -> None:
    """Serialise passes across managers: advisory lock on PostgreSQL (SQLite's
    ``BEGIN IMMEDIATE`` already serialises writers)."""
    if dialect(db) == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_LOCK_KEY})


@dataclass
class Snapshot:
    ctx: PassContext
    pending: list[PendingSession]
    pool: AgentPool
    state_before: dict


def load_group(db: DBSession, name: str) -> GroupInfo | None:
    row = db.execute(select(RG).where(RG.c.name == name).with_for_update()).mappings().first()
    if row is None:
        return None
    return GroupInfo(
        name=row["name"],
        scheduler=row["scheduler"] or "fifo",
        is_public=bool(row["is_public"]),
        allowed_domains=list(row["allowed_domains"] or []),
        allowed_projects=list(row["allowed_projects"] or []),
        allowed_keypairs=list(row["allowed_keypairs"] or []),
        scheduler_state=dict(row["scheduler_state"] or {}),
        scheduler_opts=row["scheduler_opts"] if isinstance(row["scheduler_opts"], dict) else {},
    )


class SlotCache:
    """JSON text of a slot map -> its :class:`ResourceSlot` (zeros dropped), parsed once.

    A queue holds a handful of distinct shapes; parsing 100,000 kernels' slots one by
    one (JSON, then a Decimal per amount) was a third of a large pass's load. The
    objects are shared: callers must not modify them."""

    def __init__(self):
        self._by_text: dict[str, ResourceSlot] = {}

    def __call__(self, text) -> ResourceSlot:
        if text is None:
            return ResourceSlot()
        if not isinstance(text, str):  # a driver that decoded the JSON already
            return ResourceSlot.from_json(text).nonzero()
        got = self._by_text.get(text)
        if got is None:
            got = self._by_text[text] = ResourceSlot.from_json(json.loads(text)).nonzero()
        return got


def _as_text(col):
    """A JSON column read as its text: the driver does not decode it (we decode lazily,
    or once per distinct value)."""
    return cast(col, Text)


def _awaited():
    """A PENDING session is placed only while someone waits for it: a JupyterHub
    spawner's wait (``awaited_until``) that lapsed means the hub that asked stopped,
    and the lifecycle's ``Abandoned`` handler ends the session (CANCELLED). Placing it
    in between would start a server nobody will use (and end it TERMINATED later).
    The wall clock, not a pass's ``now`` (a test's time for its rules)."""
    return or_(S.c.awaited_until.is_(None), S.c.awaited_until >= utcnow())


def load_pending(db: DBSession, group: str,
                 since: dt.datetime | None = None) -> list[PendingSession]:
    """The group's PENDING sessions (created after ``since`` if given) that someone
    still waits for (:func:`_awaited`), locked."""
    pending_cond = (S.c.status == SessionStatus.PENDING, S.c.resource_group == group, _awaited())
    if since is not None:
        pending_cond += (S.c.created_at > since,)
    rows = db.execute(
        select(
            S.c.id, S.c.name, S.c.user_id, S.c.access_key, S.c.domain_name, S.c.project_id,
            S.c.priority, S.c.created_at, S.c.status_info, _as_text(S.c.status_history),
            S.c.cluster_size, S.c.cluster_mode, S.c.starts_at, S.c.architecture,
            _as_text(S.c.designated_agents), S.c.retries, S.c.image,
        )
        .where(*pending_cond)
        .with_for_update(skip_locked=True)
    )
    sessions = {}
    for (sid, name, uid, ak, dom, pid, prio, created, info, hist, size, mode, starts, arch,
         designated, retries, image) in rows:
        sessions[sid] = PendingSession(
            id=sid, name=name, user_id=uid, access_key=ak, domain_name=dom, project_id=pid,
            priority=prio if prio is not None else 50, created_at=created,
            status_info=info or "", history_raw=hist, cluster_size=size or 1,
            cluster_mode=mode or "single-node", starts_at=starts, architecture=arch or None,
            designated_agents=_designated(designated), retries=retries or 0,
            image=image or "",
        )
    if not sessions:
        return []
    parse = SlotCache()
    for kid, sid, slots in db.execute(
        select(K.c.id, K.c.session_id, _as_text(K.c.requested_slots))
        .select_from(K.join(S, K.c.session_id == S.c.id))
        .where(*pending_cond)
        .order_by(K.c.session_id, K.c.cluster_idx)
    ):
        s = sessions.get(sid)
        if s is not None:
            s.kernels.append((kid, parse(slots)))
    dep = S.alias("dep")
    me = S.alias("me")
    for sid, dep_id, dep_name, dep_status, dep_result in db.execute(
        select(SD.c.session_id, dep.c.id, dep.c.name, dep.c.status, dep.c.result)
        .select_from(SD.join(me, me.c.id == SD.c.session_id).join(dep, dep.c.id == SD.c.depends_on))
        .where(me.c.status == SessionStatus.PENDING, me.c.resource_group == group,
               *((me.c.created_at > since,) if since is not None else ()))
    ):
        s = sessions.get(sid)
        if s is not None:
            s.dependencies.append((dep_id, dep_name, dep_status, dep_result))
    return list(sessions.values())


def pending_keys(db: DBSession, group: str) -> dict[str, tuple]:
    """The group's PENDING sessions: id -> (priority, retries, starts_at), what a pass
    decides on that a writer may change while they wait (not locked: a pass that
    reuses what it remembered compares them, and locks the rows it writes)."""
    return {sid: (prio, retries, starts) for sid, prio, retries, starts in db.execute(
        select(S.c.id, S.c.priority, S.c.retries, S.c.starts_at)
        .where(S.c.status == SessionStatus.PENDING, S.c.resource_group == group))}


def queue_digest(db: DBSession, group: str) -> tuple | None:
    """On PostgreSQL, the group's PENDING sessions condensed by the database: their
    count and the sum of a hash of each one's (id, priority, retries, starts_at), which
    any cancellation, arrival, new priority or retry changes (None elsewhere: then
    :func:`pending_keys` is compared row by row)."""
    if dialect(db) != "postgresql":
        return None
    return tuple(db.execute(text(
        f"SELECT count(*), {_DIGEST_SUM} FROM sessions WHERE status = :p AND resource_group = :g"),
        {"p": SessionStatus.PENDING, "g": group}).one())


_DIGEST_SUM = ("coalesce(sum(hashtext(id || ':' || coalesce(priority, 50) || ':' ||"
               " coalesce(retries, 0) || ':' || coalesce(starts_at::text, ''))), 0)")


def queue_digest_without(db: DBSession, digest: tuple | None, ids: list[str]) -> tuple | None:
    """``digest`` (of :func:`queue_digest`) with the sessions ``ids`` taken out, read by
    their keys (a few rows, not the queue): what the digest of the queue is once a
    pass placed them, if nothing else changed."""
    if digest is None or not ids:
        return digest
    n, total = db.execute(text(
        f"SELECT count(*), {_DIGEST_SUM} FROM sessions WHERE id = ANY(:ids)"),
        {"ids": list(ids)}).one()
    return (digest[0] - n, digest[1] - total)


def load_dependencies(db: DBSession, group: str) -> dict[str, list[tuple]]:
    """What the group's PENDING sessions wait for: id -> [(id, name, status, result)]."""
    dep = S.alias("dep")
    me = S.alias("me")
    out: dict[str, list[tuple]] = defaultdict(list)
    for sid, dep_id, dep_name, dep_status, dep_result in db.execute(
        select(SD.c.session_id, dep.c.id, dep.c.name, dep.c.status, dep.c.result)
        .select_from(SD.join(me, me.c.id == SD.c.session_id).join(dep, dep.c.id == SD.c.depends_on))
        .where(me.c.status == SessionStatus.PENDING, me.c.resource_group == group)
    ):
        out[sid].append((dep_id, dep_name, dep_status, dep_result))
    return out


def lock_pending(db: DBSession, ids: list[str]) -> set[str]:
    """Lock those of ``ids`` that are still PENDING, still awaited (:func:`_awaited`)
    and not locked by another transaction (a cancellation under way); return them."""
    got: set[str] = set()
    awaited = _awaited()
    for i in range(0, len(ids), 5000):
        got.update(db.scalars(
            select(S.c.id).where(S.c.id.in_(ids[i:i + 5000]), S.c.status == SessionStatus.PENDING,
                                 awaited)
            .with_for_update(skip_locked=True)))
    return got


def _designated(text) -> tuple[str, ...]:
    if not text:
        return ()
    if isinstance(text, str):
        if text.strip() == "[]":
            return ()
        text = json.loads(text)
    return tuple(text or ())


def _copy_slots(slots: ResourceSlot) -> ResourceSlot:
    """A copy of a (valid) ResourceSlot without re-checking every amount."""
    out = ResourceSlot()
    dict.update(out, slots)
    return out


def load_agents(db: DBSession, group: str) -> list[PoolAgent]:
    out = []
    parse = _FullSlotCache()
    held = _JSONCache()
    for aid, arch, avail, occ, backend, images, ready, away in db.execute(
        select(A.c.id, A.c.architecture, _as_text(A.c.available_slots),
               _as_text(A.c.occupied_slots), A.c.backend, _as_text(A.c.images),
               _as_text(A.c.pool_ready), _as_text(A.c.away_slots))
        .where(
            A.c.resource_group == group,
            A.c.status == AgentStatus.ALIVE,
            A.c.schedulable.is_(True),
        )
        .order_by(A.c.id)
        .with_for_update()
    ):
        # Agents are mostly alike: each distinct text is parsed once; the pool changes
        # ``occupied`` and ``free`` in place, so those are the agent's own copies.
        avail, occ, free = parse(avail, occ)
        free = _copy_slots(free)
        if away is not None:  # its GPUs another agent of its host holds now: taken
            for slot, amount in (held(away, dict) or {}).items():
                if slot in free:
                    free[slot] = max(free[slot] - Decimal(str(amount)), ZERO)
        out.append(PoolAgent(aid, arch or "", avail, _copy_slots(occ), free,
                             held(images, frozenset), held(ready, dict), backend or ""))
    return out


class _JSONCache:
    """JSON text -> ``kind`` of its value (None for NULL or JSON null), each distinct text
    decoded once (agents of a group mostly hold the same images)."""

    def __init__(self):
        self._seen: dict = {}

    def __call__(self, text, kind):
        if text is None:
            return None
        got = self._seen.get((text, kind))
        if got is None and (text, kind) not in self._seen:
            value = json.loads(text) if isinstance(text, str) else text
            got = self._seen[(text, kind)] = kind(value) if isinstance(value, (list, dict)) else None
        return got if kind is frozenset else (dict(got) if got is not None else None)


def load_warm(db: DBSession, group: str, pool: AgentPool) -> None:
    """The group's warm pools into ``pool.warm`` ((image, slots key) -> pool key), and
    each agent's ready pooled kernels less those its starting sessions of the pool will
    bind (placed, no container yet: the agent's next heartbeat has not counted them)."""
    from ...models import ResourcePreset, WarmPool
    from ..warmpool import pool_key
    from .pool import slots_key

    W, PR = WarmPool.__table__, ResourcePreset.__table__
    rows = db.execute(select(W.c.image, W.c.preset, _as_text(PR.c.resource_slots))
                      .select_from(W.join(PR, PR.c.name == W.c.preset))
                      .where(W.c.resource_group == group, W.c.size > 0)).all()
    pool.warm = {(image, slots_key(ResourceSlot.from_json(json.loads(slots)))):
                 pool_key(group, image, preset) for image, preset, slots in rows}
    if not pool.warm or not any(a.ready for a in pool.agents.values()):
        return
    for aid, image, slots in db.execute(
        select(K.c.agent_id, S.c.image, _as_text(K.c.requested_slots))
        .select_from(K.join(S, K.c.session_id == S.c.id))
        .where(S.c.resource_group == group, S.c.cluster_size == 1,
               S.c.status.in_((SessionStatus.SCHEDULED, SessionStatus.PREPARING,
                               SessionStatus.CREATING)),
               K.c.agent_id.is_not(None), K.c.container_id.is_(None))
    ):
        key = pool.warm.get((image, slots_key(ResourceSlot.from_json(json.loads(slots)))))
        a = pool.agents.get(aid)
        if key is not None and a is not None and a.ready and a.ready.get(key, 0) > 0:
            a.ready[key] -= 1


class _FullSlotCache:
    """(available text, occupied text) -> (available, occupied, available - occupied),
    as the SlotsType column would give them (zeros kept)."""

    def __init__(self):
        self._slots: dict[str, ResourceSlot] = {}
        self._pairs: dict[tuple, tuple] = {}

    def _one(self, text) -> ResourceSlot:
        if text is None:
            return ResourceSlot()
        if not isinstance(text, str):
            return ResourceSlot.from_json(text)
        got = self._slots.get(text)
        if got is None:
            got = self._slots[text] = ResourceSlot.from_json(json.loads(text))
        return got

    def __call__(self, avail, occ) -> tuple:
        key = (avail if isinstance(avail, str) else None, occ if isinstance(occ, str) else None)
        got = self._pairs.get(key) if None not in key else None
        if got is None:
            a, o = self._one(avail), self._one(occ)
            got = (a, o, a - o)
            if None not in key:
                self._pairs[key] = got
        return got


def load_usage(db: DBSession, group: str) -> Usage:
    """What placed, live kernels hold, per quota subject, summed by the database: one
    row per (keypair, user, project, domain, in this group?, slot map) with its count
    of kernels, and the live sessions per (keypair, user). A busy cluster's 100,000
    live kernels come back as a few hundred rows (kernels share a handful of shapes)."""
    usage = Usage()
    parse = SlotCache()
    in_group = (S.c.resource_group == group).label("in_group")
    occ = _as_text(K.c.occupied_slots).label("occ")
    holding = S.c.status.in_(HOLDING_STATUSES)
    for ak, uid, pid, dom, here, text_, n in db.execute(
        select(S.c.access_key, S.c.user_id, S.c.project_id, S.c.domain_name, in_group, occ,
               func.count())
        .select_from(K.join(S, K.c.session_id == S.c.id))
        .where(holding)
        .group_by(S.c.access_key, S.c.user_id, S.c.project_id, S.c.domain_name, in_group, occ)
    ):
        slots = parse(text_)
        if n != 1 and slots:
            slots = ResourceSlot({k: v * n for k, v in slots.items()})
        usage.charge(ak, uid, pid, dom, slots, in_group=bool(here), new_session=False)
    # Live sessions: each holding session counts (one that lost its kernels still would).
    for ak, uid, n in db.execute(
        select(S.c.access_key, S.c.user_id, func.count())
        .where(holding)
        .group_by(S.c.access_key, S.c.user_id)
    ):
        usage.sessions_per_keypair[ak] += n
        usage.sessions_per_user[uid] += n
    return usage


def load_policies(db: DBSession, pending: list[PendingSession]):
    users = sorted({s.user_id for s in pending})
    keys = {s.access_key for s in pending}
    policies: dict[str, Policy] = {}
    user_policies: dict[str, list[Policy]] = defaultdict(list)
    by_name: dict[str, Policy] = {}
    for i in range(0, len(users), 500):
        chunk = users[i : i + 500]
        for r in db.execute(
            select(KP.c.access_key, KP.c.user_id, KP.c.is_active, POL)
            .select_from(KP.join(POL, KP.c.resource_policy == POL.c.name))
            .where(KP.c.user_id.in_(chunk))
        ).mappings():
            pol = by_name.get(r["name"])
            if pol is None:
                pol = by_name[r["name"]] = Policy(
                    name=r["name"],
                    total_resource_slots=(r["total_resource_slots"] or ResourceSlot()).copy(),
                    default_for_unspecified=r["default_for_unspecified"] or "UNLIMITED",
                    max_concurrent_sessions=r["max_concurrent_sessions"],
                    max_containers_per_session=r["max_containers_per_session"],
                    max_priority=r["max_priority"] if r["max_priority"] is not None else 100,
                )
            policies[r["access_key"]] = pol
            if r["is_active"]:
                user_policies[r["user_id"]].append(pol)
    missing = keys - set(policies)
    if missing:  # a keypair without a policy row cannot exist (FK), but be explicit
        raise RuntimeError(f"keypairs without a resource policy: {sorted(missing)}")
    return policies, dict(user_policies)


def load_limits(db: DBSession):
    project_limits, project_names, domain_limits = {}, {}, {}
    for pid, name, slots in db.execute(select(P.c.id, P.c.name, P.c.total_resource_slots)):
        project_names[pid] = name
        if slots:
            project_limits[pid] = slots
    for name, slots in db.execute(select(D.c.name, D.c.total_resource_slots)):
        if slots:
            domain_limits[name] = slots
    return project_limits, project_names, domain_limits


def unread_levels(ctx: PassContext) -> frozenset:
    """The usage sums this pass never reads, so that placing need not add to them:
    a level where no subject has a slot limit (the validators return at once), and
    the per-user shares in the group unless the sequencer is DRF."""
    unread = set()
    if not any(p.total_resource_slots for p in ctx.policies.values()):
        unread.add("keypair")
        if not any(p.total_resource_slots for ps in ctx.user_policies.values() for p in ps):
            unread.add("user")
    if not ctx.project_limits:
        unread.add("project")
    if not ctx.domain_limits:
        unread.add("domain")
    if ctx.group.scheduler != "drf":
        unread.add("group_user")
    return frozenset(unread)


def load_snapshot(db: DBSession, group: GroupInfo, options: SchedulerOptions,
                  now: dt.datetime) -> Snapshot:
    pending = load_pending(db, group.name)
    agents = load_agents(db, group.name) if pending else []
    capacity = ResourceSlot()
    for a in agents:
        capacity = capacity + a.available
    if pending:
        usage = load_usage(db, group.name)
        policies, user_policies = load_policies(db, pending)
        project_limits, project_names, domain_limits = load_limits(db)
    else:
        usage, policies, user_policies = Usage(), {}, {}
        project_limits, project_names, domain_limits = {}, {}, {}
    ctx = PassContext(
        group=group, options=options, now=now, capacity=capacity.nonzero(), usage=usage,
        policies=policies, user_policies=user_policies, project_limits=project_limits,
        project_names=project_names, domain_limits=domain_limits,
    )
    usage.unread = unread_levels(ctx)
    pool = AgentPool(agents, options.resource_priority)
    if pending:
        load_warm(db, group.name, pool)
    return Snapshot(ctx=ctx, pending=pending, pool=pool,
                    state_before=dict(group.scheduler_state))
