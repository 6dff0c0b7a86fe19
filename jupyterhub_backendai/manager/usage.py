"""Usage accounting from the record (issue 29 point 7): each session's allocated slots
over its running time, as core-hours, GiB-hours and GPU-hours, per user, project,
domain or resource group, for any period.

A session counts from the moment it became RUNNING (``status_history``) until it was
freed (``terminated_at``; a session still alive counts until now), with the slots its
kernels were given (the sum of their ``requested_slots``: what the scheduler allocated
and held on the agents for that whole time). Only the part of that interval inside the
period counts, so a session that spans the period's start or end is cut there: the same
session's hours over two adjacent periods add up to its hours over both. Everything is
read from the database, so the figures are the same after a restart and on every hub.

Who sees what is :func:`.access.session_filter`: a user their own sessions, a domain
admin or monitor their domain's, a superadmin everything.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from sqlalchemy import or_, select

from ..common.errors import InvalidRequest
from ..common.slots import CPU, CUDA, MEM, is_mig_slot
from ..common.types import SessionStatus
from ..models import Domain, Kernel, Project, Session, User
from . import access
from .access import Principal
from .ops import reads

GROUP_BY = ("user", "project", "domain", "resource_group")
MAX_PERIOD = dt.timedelta(days=3660)
_GIB = Decimal(1 << 30)


def parse_period(start: str | None, end: str | None, now: dt.datetime) -> tuple[dt.datetime,
                                                                               dt.datetime]:
    """``start`` and ``end`` (ISO dates or times; naive ones are UTC) as UTC datetimes;
    the defaults: the current month so far. A 400 in words for anything else."""
    def one(field: str, value: str) -> dt.datetime:
        try:
            t = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InvalidRequest(f"{field}: {value!r} is not a date or time (e.g. 2026-11-01 "
                                 "or 2026-11-01T08:00:00Z)") from None
        return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)

    lo = one("start", start) if start else now.replace(day=1, hour=0, minute=0, second=0,
                                                        microsecond=0)
    hi = one("end", end) if end else now
    if hi <= lo:
        raise InvalidRequest(f"end ({hi.isoformat()}) must be after start ({lo.isoformat()})")
    if hi - lo > MAX_PERIOD:
        raise InvalidRequest("the period may be at most ten years long")
    return lo, hi


def _utc(value) -> dt.datetime | None:
    if value in (None, ""):
        return None
    t = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def running_interval(sess: Session, now: dt.datetime) -> tuple[dt.datetime, dt.datetime] | None:
    """When ``sess`` held its slots running: from RUNNING to its end (now if alive)."""
    began = _utc((sess.status_history or {}).get(SessionStatus.RUNNING))
    if began is None:
        return None
    ended = _utc(sess.terminated_at)
    if ended is None:
        ended = now if sess.status not in (SessionStatus.TERMINATED, SessionStatus.CANCELLED,
                                           SessionStatus.ERROR) else began
    return (began, max(began, ended))


def _amounts(slots: dict) -> tuple[Decimal, Decimal, Decimal]:
    """(cores, GiB, GPUs) of one allocation; MIG instances count as GPUs."""
    cpu = Decimal(slots.get(CPU, 0) or 0)
    mem = Decimal(slots.get(MEM, 0) or 0) / _GIB
    gpu = Decimal(slots.get(CUDA, 0) or 0) + sum(
        (Decimal(v or 0) for k, v in slots.items() if is_mig_slot(k)), Decimal(0))
    return cpu, mem, gpu


@reads
def usage_report(db, p: Principal, start: dt.datetime, end: dt.datetime, group_by: str,
                 now: dt.datetime | None = None) -> dict:
    """Rows per ``group_by`` key of the sessions ``p`` may see that ran inside
    [start, end): sessions, running hours, core-hours, GiB-hours, GPU-hours (rounded to
    4 places), the biggest first; and the totals."""
    if group_by not in GROUP_BY:
        raise InvalidRequest(f"group_by must be one of {', '.join(GROUP_BY)}, not {group_by!r}")
    now = now or dt.datetime.now(dt.UTC)
    # Sessions that may have run in the period: created before its end, not freed
    # before its start (the exact cut is made below, from the record's times).
    sessions = db.scalars(select(Session).where(
        access.session_filter(p), Session.created_at < end,
        or_(Session.terminated_at.is_(None), Session.terminated_at > start))).all()
    slots: dict[str, list] = {}
    ids = [s.id for s in sessions]
    for chunk in range(0, len(ids), 500):
        for sid, req in db.execute(select(Kernel.session_id, Kernel.requested_slots).where(
                Kernel.session_id.in_(ids[chunk:chunk + 500]))):
            slots.setdefault(sid, []).append(req or {})
    rows: dict[str, dict] = {}
    for s in sessions:
        span = running_interval(s, now)
        if span is None:
            continue
        lo, hi = max(span[0], start), min(span[1], end)
        if hi <= lo:
            continue
        hours = Decimal((hi - lo).total_seconds()) / 3600
        cpu = mem = gpu = Decimal(0)
        for k in slots.get(s.id) or [s.requested_slots or {}]:
            c, m, g = _amounts(k)
            cpu, mem, gpu = cpu + c, mem + m, gpu + g
        key = {"user": s.user_id, "project": s.project_id, "domain": s.domain_name,
               "resource_group": s.resource_group}[group_by] or ""
        r = rows.setdefault(key, {"key": key, "sessions": 0, "hours": Decimal(0),
                                  "cpu_hours": Decimal(0), "mem_gib_hours": Decimal(0),
                                  "gpu_hours": Decimal(0)})
        r["sessions"] += 1
        r["hours"] += hours
        r["cpu_hours"] += cpu * hours
        r["mem_gib_hours"] += mem * hours
        r["gpu_hours"] += gpu * hours
    names = _names(db, group_by, set(rows))
    figures = ("hours", "cpu_hours", "mem_gib_hours", "gpu_hours")
    none = f"(no {group_by.replace('_', ' ')})"
    items = sorted(({**r, "name": names.get(r["key"], r["key"]) or none,
                     **{f: round(float(r[f]), 4) for f in figures}} for r in rows.values()),
                   key=lambda r: (-r["cpu_hours"], -r["gpu_hours"], r["name"]))
    total = {"sessions": sum(r["sessions"] for r in rows.values()),
             **{f: round(float(sum((r[f] for r in rows.values()), Decimal(0))), 4)
                for f in figures}}
    return {"start": start.isoformat(), "end": end.isoformat(), "group_by": group_by,
            "items": items, "total": total}


def _names(db, group_by: str, keys: set[str]) -> dict[str, str]:
    """A key in words: a user's name, a project's DOMAIN/NAME; domains and groups are
    their names already."""
    keys = {k for k in keys if k}
    if group_by == "user" and keys:
        return dict(db.execute(select(User.id, User.username).where(User.id.in_(keys))).all())
    if group_by == "project" and keys:
        return {pid: f"{dom}/{name}" for pid, dom, name in db.execute(
            select(Project.id, Project.domain_name, Project.name).where(Project.id.in_(keys)))}
    if group_by == "domain" and keys:
        return {d: d for d in db.scalars(select(Domain.name).where(Domain.name.in_(keys)))}
    return {k: k for k in keys}
