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

Beside what was allocated, what was **used**: the hub samples the agents' live
statistics (agent/stats.py: each kernel's CPU percent over the agent's last heartbeat
interval, its memory in use, its GPUs' utilisation) every
``c.BackendAIManager.usage_sample_interval`` seconds (:class:`UsageSampler`) and adds
each kernel's figures, times the seconds since the previous sample counted, to its row
of the hour (``kernel_usage``). A sample is counted once however many hubs read it: a
hub counts it only if it moves ``kernels.usage_sampled_at`` (the agent's time of the
last sample counted) forward, in one conditional update. A gap longer than three
intervals (a hub or the agent away) is not filled in: what nobody sampled is not
guessed, and ``sampled_hours`` says how much was seen. A report cuts an hour's row at
the period's edges in proportion.

Who sees what is :func:`.access.session_filter`: a user their own sessions, a domain
admin or monitor their domain's, a superadmin everything.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from decimal import Decimal

from sqlalchemy import or_, select, update

from ..common.errors import InvalidRequest
from ..common.slots import CPU, CUDA, MEM, is_mig_slot
from ..common.types import SessionStatus
from ..models import Agent, Domain, Kernel, KernelUsage, Project, Session, User
from . import access
from .access import Principal
from .ops import reads, writes

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
    spans = {s.id: span for s in sessions if (span := running_interval(s, now)) is not None}
    used = _used(db, spans, start, end)
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
        r = rows.setdefault(key, {"key": key, "sessions": 0,
                                  **{f: Decimal(0) for f in FIGURES}})
        r["sessions"] += 1
        r["hours"] += hours
        r["cpu_hours"] += cpu * hours
        r["mem_gib_hours"] += mem * hours
        r["gpu_hours"] += gpu * hours
        for f, v in used.get(s.id, {}).items():
            r[f] += v
    names = _names(db, group_by, set(rows))
    figures = FIGURES
    none = f"(no {group_by.replace('_', ' ')})"
    items = sorted(({**r, "name": names.get(r["key"], r["key"]) or none,
                     **{f: round(float(r[f]), 4) for f in figures}} for r in rows.values()),
                   key=lambda r: (-r["cpu_hours"], -r["gpu_hours"], r["name"]))
    total = {"sessions": sum(r["sessions"] for r in rows.values()),
             **{f: round(float(sum((r[f] for r in rows.values()), Decimal(0))), 4)
                for f in figures}}
    return {"start": start.isoformat(), "end": end.isoformat(), "group_by": group_by,
            "items": items, "total": total}


FIGURES = ("hours", "cpu_hours", "mem_gib_hours", "gpu_hours", "sampled_hours",
           "used_cpu_hours", "used_mem_gib_hours", "used_gpu_hours")
_HOUR = dt.timedelta(hours=1)


def _overlap(a: tuple[dt.datetime, dt.datetime], b: tuple[dt.datetime, dt.datetime]) -> float:
    return max(0.0, (min(a[1], b[1]) - max(a[0], b[0])).total_seconds())


def _used(db, spans: dict[str, tuple[dt.datetime, dt.datetime]], start: dt.datetime,
          end: dt.datetime) -> dict:
    """Per session (``spans``: its running interval), its kernels' sampled use inside
    [start, end) in hours. An hour's row that the period's edge cuts counts in the
    proportion of the session's running time in that hour that lies inside the period."""
    out: dict[str, dict] = {}
    lo = start.replace(minute=0, second=0, microsecond=0)
    ids = list(spans)
    for chunk in range(0, len(ids), 500):
        for u in db.scalars(select(KernelUsage).where(
                KernelUsage.session_id.in_(ids[chunk:chunk + 500]),
                KernelUsage.hour >= lo, KernelUsage.hour < end)):
            h = _utc(u.hour)
            bucket = (h, h + _HOUR)
            ran = _overlap(bucket, spans[u.session_id])
            inside = (_overlap(bucket, (max(start, spans[u.session_id][0]),
                                        min(end, spans[u.session_id][1]))) / ran if ran
                      else _overlap(bucket, (start, end)) / 3600)
            share = Decimal(min(1.0, inside))
            if not share:
                continue
            r = out.setdefault(u.session_id, {f: Decimal(0) for f in FIGURES[4:]})
            r["sampled_hours"] += share * Decimal(u.sampled_seconds) / 3600
            r["used_cpu_hours"] += share * Decimal(u.cpu_seconds) / 3600
            r["used_mem_gib_hours"] += share * Decimal(u.mem_byte_seconds) / 3600 / _GIB
            r["used_gpu_hours"] += share * Decimal(u.gpu_seconds) / 3600
    return out


def _spans(t0: float, t1: float) -> list[tuple[dt.datetime, float]]:
    """[t0, t1) (Unix seconds) cut at UTC hours: (hour, seconds in it)."""
    out = []
    while t1 > t0:
        h = dt.datetime.fromtimestamp(t0, dt.UTC).replace(minute=0, second=0, microsecond=0)
        edge = min(t1, (h + _HOUR).timestamp())
        out.append((h, edge - t0))
        t0 = edge
    return out


@writes
def record_samples(db, samples: list[tuple[str, float, dict]], max_gap: float) -> int:
    """Count live samples ``(kernel id, the agent's time, its statistics entry)`` of
    running kernels, each once (the module's text); how many were counted."""
    counted = 0
    ids = [k for k, _, _ in samples]
    kernels = {k.id: k for k in db.scalars(select(Kernel).where(
        Kernel.id.in_(ids), Kernel.status == SessionStatus.RUNNING))}
    for kid, ts, st in samples:
        k = kernels.get(kid)
        if k is None:
            continue
        prev = k.usage_sampled_at
        if prev is not None and ts <= prev:
            continue  # counted already (here or by another hub)
        moved = db.execute(
            update(Kernel).where(Kernel.id == kid, Kernel.usage_sampled_at.is_(None)
                                 if prev is None else Kernel.usage_sampled_at == prev)
            .values(usage_sampled_at=ts).execution_options(synchronize_session=False)).rowcount
        if not moved or prev is None or st.get("cpu_pct") is None:
            continue  # another hub's, or the first sample: where counting begins
        seconds = min(ts - prev, max_gap)
        _, _, gpus = _amounts(k.requested_slots or {})
        cpu = float(st.get("cpu_pct") or 0) / 100
        mem = int(st.get("mem_bytes") or 0)
        gpu = float(st.get("gpu_util_pct") or 0) / 100 * float(gpus)
        for hour, part in _spans(ts - seconds, ts):
            row = db.get(KernelUsage, (kid, hour))
            if row is None:
                row = KernelUsage(kernel_id=kid, hour=hour, session_id=k.session_id,
                                  sampled_seconds=0.0, cpu_seconds=0.0,
                                  mem_byte_seconds=0.0, gpu_seconds=0.0, mem_peak_bytes=0)
                db.add(row)
            row.sampled_seconds += part
            row.cpu_seconds += cpu * part
            row.mem_byte_seconds += mem * part
            row.gpu_seconds += gpu * part
            row.mem_peak_bytes = max(row.mem_peak_bytes, mem)
        counted += 1
    return counted


class UsageSampler:
    """Reads the agents' live statistics every ``usage_sample_interval`` seconds (kicked
    by the scheduler loop) and records them (:func:`record_samples`)."""

    def __init__(self, manager):
        self.manager = manager
        self._last = 0.0
        self._task: asyncio.Task | None = None

    def kick(self) -> None:
        every = self.manager.usage_sample_interval
        if every <= 0 or (self._task is not None and not self._task.done()):
            return
        if time.monotonic() - self._last < every:
            return
        self._last = time.monotonic()
        self._task = self.manager.background(self.sample())  # cancelled when it stops

    async def sample(self) -> int:
        from ..agent.stats import live_stats

        mgr = self.manager
        try:
            agents = await mgr.db_read(_alive_agents)
            stats = await live_stats(mgr, agents)
            samples = [(kid, float(st["ts"]), entry)
                       for st in stats.values() if st.get("ts") is not None
                       for kid, entry in (st.get("kernels") or {}).items()]
            if not samples:
                return 0
            return await mgr.ops.record_samples(samples, 3 * mgr.usage_sample_interval)
        except Exception:  # a bad round must not stop the next
            mgr.log.exception("usage sample failed")
            return 0


def _alive_agents(s) -> list[str]:
    return list(s.scalars(select(Agent.id).where(Agent.status == "ALIVE")))


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
