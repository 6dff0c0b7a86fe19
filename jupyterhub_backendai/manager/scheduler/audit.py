"""The scheduler seen from outside its passes: :func:`check_consistency` verifies after
the fact what :mod:`.dispatcher` guarantees (no over-commit, nothing held by a dead
session, every quota level kept), and :func:`scheduler_stats` is the per-group view of
the admin API. Both only read the record."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from ...common.slots import ResourceSlot
from ...common.types import ALIVE_STATUSES, SessionStatus
from ...models import (
    Agent,
    Domain,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ResourceGroup,
    Session,
)
from ...models.base import utcnow
from .options import SchedulerOptions
from .snapshot import HOLDING_STATUSES
from .state import LIMITED, fmt_amount, slot_limit
from .validators import reason_code


def check_consistency(sm: sessionmaker) -> list[str]:
    """Problems with the record, as sentences (empty: consistent). Cheap enough for production.

    - every agent's occupied slots equal the sum of its kernels' occupied slots,
      and fit within its available slots (no over-commit);
    - no kernel of a dead (or still pending) session holds slots;
    - at every level (keypair, user, project, domain) the placed, live sessions
      stay within ``total_resource_slots``, and keypairs within
      ``max_concurrent_sessions``. (Lowering a limit below current use is
      reported too: it is over quota, whoever caused it.)
    """
    problems: list[str] = []
    with sm() as db:
        if db.get_bind().dialect.name == "postgresql":
            # One snapshot for every query below: passes and releases commit meanwhile.
            db.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        rows = db.execute(
            select(Kernel.id, Kernel.agent_id, Kernel.occupied_slots, Session.id, Session.status,
                   Session.access_key, Session.user_id, Session.project_id, Session.domain_name)
            .join(Session, Kernel.session_id == Session.id)
        ).all()
        per_agent: dict[str, ResourceSlot] = defaultdict(ResourceSlot)
        usage = {lvl: defaultdict(ResourceSlot) for lvl in ("keypair", "user", "project", "domain")}
        live_sessions: dict[str, set] = defaultdict(set)
        # (access key, project, domain) -> slots its live kernels hold: for limits that
        # leave a slot out, whether that is allowed depends on the keypair's policy.
        held: dict[tuple, ResourceSlot] = defaultdict(ResourceSlot)
        for kid, aid, occ, sid, status, ak, uid, pid, dom in rows:
            occ = (occ or ResourceSlot()).nonzero()
            if aid and occ:
                per_agent[aid] = per_agent[aid] + occ
            if occ and status not in HOLDING_STATUSES:
                problems.append(f"kernel {kid} of {status} session {sid} holds {occ.describe()}")
            if status in HOLDING_STATUSES:
                live_sessions[ak].add(sid)
                held[(ak, pid, dom)] = held[(ak, pid, dom)] + occ
                for lvl, subject in (("keypair", ak), ("user", uid), ("project", pid),
                                     ("domain", dom)):
                    if subject is not None:
                        usage[lvl][subject] = usage[lvl][subject] + occ
        for a in db.scalars(select(Agent)):
            occ = a.occupied_slots.nonzero()
            total = per_agent.get(a.id, ResourceSlot()).nonzero()
            if total != occ:
                problems.append(
                    f"agent {a.id}: occupied {occ.to_json()} != kernels {total.to_json()}"
                )
            if not occ.fits_in(a.available_slots):
                problems.append(
                    f"agent {a.id} over capacity: occupied {occ.describe()} > "
                    f"available {a.available_slots.nonzero().describe()}"
                )
        kps = {
            k.access_key: (k.user_id, k.is_active, p)
            for k, p in db.execute(
                select(Keypair, KeypairResourcePolicy)
                .join(KeypairResourcePolicy, Keypair.resource_policy == KeypairResourcePolicy.name)
            )
        }
        user_pols: dict[str, list] = defaultdict(list)
        for uid, active, p in kps.values():
            if active:
                user_pols[uid].append(p)

        def over(level, subject, used, limit_of):
            for slot, v in sorted(used.items()):
                lim = limit_of(slot)
                if v > 0 and lim is not None and v > lim:
                    problems.append(
                        f"quota exceeded: {level} {subject} total_resource_slots: "
                        f"{slot} {fmt_amount(slot, v)} in use > limit {fmt_amount(slot, lim)}"
                    )

        for ak, used in usage["keypair"].items():
            _, _, p = kps[ak]
            over("keypair", ak, used,
                 lambda s, p=p: slot_limit(p.total_resource_slots, s, p.default_for_unspecified))
            n = len(live_sessions[ak])
            if n > p.max_concurrent_sessions:
                problems.append(f"quota exceeded: keypair {ak} max_concurrent_sessions: "
                                f"{n} live > limit {p.max_concurrent_sessions}")
        for uid, used in usage["user"].items():
            pols = user_pols.get(uid, [])

            def ulimit(s, pols=pols):
                lims = [slot_limit(p.total_resource_slots, s, p.default_for_unspecified)
                        for p in pols]
                lims = [x for x in lims if x is not None]
                return min(lims) if lims else None

            over("user", uid, used, ulimit)
        # Project and domain limits: the sum of what is held within each slot they name;
        # a slot they leave out is unlimited for keypairs whose policy says UNLIMITED and
        # zero for LIMITED ones (as the validators decide it per session).
        project_limits = dict(db.execute(select(Project.id, Project.total_resource_slots)).all())
        domain_limits = dict(db.execute(select(Domain.name, Domain.total_resource_slots)).all())
        for pid, limits in project_limits.items():
            if limits and pid in usage["project"]:
                over("project", pid, usage["project"][pid], lambda s, L=limits: L.get(s))
        for name, limits in domain_limits.items():
            if limits and name in usage["domain"]:
                over("domain", name, usage["domain"][name], lambda s, L=limits: L.get(s))
        for (ak, pid, dom), slots in held.items():
            if kps[ak][2].default_for_unspecified != LIMITED:
                continue
            for level, subject, limits in (("project", pid, project_limits.get(pid)),
                                           ("domain", dom, domain_limits.get(dom))):
                if not limits:
                    continue
                for slot, v in sorted(slots.items()):
                    if v > 0 and slot not in limits:
                        problems.append(
                            f"quota exceeded: {level} {subject} total_resource_slots: keypair "
                            f"{ak} (LIMITED) holds {slot} {fmt_amount(slot, v)}, which the "
                            f"limit leaves out"
                        )
    return problems


def scheduler_stats(sm: sessionmaker) -> dict:
    """Per resource group: sequencer, selector, queue length, oldest wait (s),
    pending sessions by reason, reservations, live (placed) sessions. For the admin API."""
    now = utcnow()
    out: dict = {}
    with sm() as db:
        for g in db.scalars(select(ResourceGroup).order_by(ResourceGroup.name)):
            opts = SchedulerOptions.lenient(g.scheduler_opts)
            out[g.name] = {
                "scheduler": g.scheduler,
                "agent_selector": opts.agent_selector,
                "options_problems": list(opts.problems),
                "pending": 0,
                "oldest_wait_s": 0.0,
                "reasons": {},
                "reservations": dict((g.scheduler_state or {}).get("reservations") or {}),
                "live": 0,
            }
        for rg, created, info in db.execute(
            select(Session.resource_group, Session.created_at, Session.status_info)
            .where(Session.status == SessionStatus.PENDING)
        ):
            st = out.get(rg)
            if st is None:
                continue
            st["pending"] += 1
            st["oldest_wait_s"] = max(st["oldest_wait_s"], (now - created).total_seconds())
            code = reason_code(info)
            st["reasons"][code] = st["reasons"].get(code, 0) + 1
        for rg, n in db.execute(
            select(Session.resource_group, func.count())
            .where(Session.status.in_([s for s in ALIVE_STATUSES if s != SessionStatus.PENDING]))
            .group_by(Session.resource_group)
        ):
            if rg in out:
                out[rg]["live"] = n
    return out
