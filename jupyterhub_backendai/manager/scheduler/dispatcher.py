"""The scheduler pass: sequencer -> validators -> agent selector -> allocator, per resource group.

One pass handles one resource group in **one transaction**: read the queue and
the agents under locks, decide in memory (:mod:`.pipeline`), write the decisions back
in bulk.

Pipeline (each part a small class with one method, looked up by name):

- the group's ``scheduler`` column names the *sequencer* (``fifo``, ``lifo``,
  ``drf``: :mod:`.sequencers`); priority bands come first in all of them;
- *validators* (:mod:`.validators`) make a session wait or cancel it, with the
  reason in ``Session.status_info`` (the spawn progress shows it);
- ``scheduler_opts["agent_selector"]`` names the *selector*
  (``concentrated``, ``dispersed``, ``roundrobin``: :mod:`.agent_selectors`)
  that picks agents from an index over free capacity (:mod:`.pool`);
- the *allocator* (:mod:`.allocator`) commits.

**No head-of-line blocking.** A session that does not fit is skipped, not
waited on: everything behind it that fits is placed in the same pass
(backfilling). After a pass no session waits "for resources" while an agent
it could use has room for it.

**No starvation.** Backfilling alone would let a stream of small sessions keep
a large one out forever. So a session that has waited longer than
``scheduler_opts["starvation_threshold"]`` seconds (default 300) and still does
not fit gets a *reservation*: the agent(s) closest to holding it (least
shortfall, among those whose capacity can hold it) are held for it, and
nothing else is placed on them. Sessions on those agents end, their slots come
back, and the session is placed as soon as they add up, typically within one
session lifetime. The ``max_reservations`` (default 1) oldest starving sessions
(that pass the validators) are considered first in every pass, ahead of the
sequencer (so even a low priority or a LIFO queue cannot starve one); the rest
keep the sequencer's order. Reservations are kept in
``ResourceGroup.scheduler_state`` so that they are stable across passes and
managers. The rest of the group keeps backfilling.

**No over-commit.** The pass holds a PostgreSQL advisory lock shared by every
manager's passes (quotas span groups, so quota-checked allocations are
serialised), ``FOR UPDATE`` on the group row and its agent rows, and takes
pending sessions with ``SKIP LOCKED`` (a session being cancelled is skipped,
not waited on). On SQLite, ``BEGIN IMMEDIATE`` serialises writers. Validators
see usage that includes what the pass placed before, so a pass never places
past a quota either. :func:`.audit.check_consistency` verifies all of this after the fact.

**Pending timeout.** ``scheduler_opts["pending_timeout"]`` (seconds, 0 = none):
a session pending longer is CANCELLED with the reason; it held nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import heapq
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from decimal import Decimal

from sqlalchemy import event, select
from sqlalchemy.orm import sessionmaker

from ...common.slots import ResourceSlot
from ...common.types import SessionStatus
from ...models.base import utcnow
from . import allocator, changes, metrics
from .agent_selectors import SELECTORS
from .allocator import Allocation, PlacementWriter, commit
from .options import SchedulerOptions
from .pipeline import (
    Shapes,
    ever_fits,
    never_fits_message,
    no_fit_message,
    run_pipeline,
    starving_first,
)
from .pool import AgentPool
from .sequencers import SEQUENCERS
from .snapshot import (
    S,
    load_agents,
    load_dependencies,
    load_group,
    load_pending,
    load_policies,
    load_snapshot,
    load_usage,
    load_warm,
    lock_pending,
    lock_scheduler,
    pending_keys,
    queue_digest,
    queue_digest_without,
    unread_levels,
)
from .state import GroupInfo, PassContext, PendingSession, Verdict
from .validators import validate

log = logging.getLogger("jupyterhub_backendai.scheduler")



def schedule_pass(sm: sessionmaker, resource_group: str, *,
                  now: dt.datetime | None = None, force: bool = False,
                  told: list | None = None) -> list[str]:
    """Run one pass over ``resource_group``; return the ids that became SCHEDULED,
    in placement order. ``now`` is for tests (time-dependent rules); default: the clock.
    ``told``: gets ``(id, status)`` of the other sessions the pass changed, for their
    watchers: PENDING for a waiting one's new reason, CANCELLED for one it cancelled.

    The pass is skipped (returns ``[]`` after a few aggregate reads) when nothing it
    depends on changed since the last pass that changed nothing, and no time-based
    rule came due (:mod:`.changes`); ``force`` runs it anyway. When only new sessions
    arrived since such a pass, only they are read and decided (:func:`_arrivals_pass`),
    unless one of them can be placed or must be cancelled: then the pass runs in full.
    When only sessions outside the queue or agents changed (a release), the remembered
    queue is decided again on fresh agents and usage (:func:`_released_pass`)."""
    t0 = time.perf_counter()
    now = now or utcnow()
    with sm.begin() as db:
        lock_scheduler(db)
        quiet = changes.quiet_for(db.get_bind())
        fp = changes.fingerprint(db, resource_group)
        last = quiet.get(resource_group)
        recent = not force and last is not None and (last.due is None or now < last.due)
        if recent and last.fingerprint == fp and not last.tainted:
            LAST_PASS.clear()
            LAST_PASS.update(group=resource_group, skipped=True,
                             total_s=time.perf_counter() - t0)
            metrics.SKIPPED_PASSES.labels(resource_group).inc()
            return []
        quiet.pop(resource_group, None)
        group = load_group(db, resource_group)
        if group is None:
            return []
        if recent and last.memory is not None:
            since = changes.arrivals_since(db, last.fingerprint, fp)
            if since is not None and _arrivals_pass(db, resource_group, last, fp, since, now,
                                                    quiet, t0, told):
                return []
            left = since is None and changes.left_since(last.fingerprint, fp)
            if since is None and (left or changes.released_since(last.fingerprint, fp) or (
                    last.tainted and last.fingerprint == fp)):
                placed = _released_pass(db, group, last, fp, now, quiet, t0, left=left,
                                        told=told)
                if placed is not None:
                    return placed
            # Else (something else changed, or an arrival may be placed): a full pass.
        options = SchedulerOptions.lenient(group.scheduler_opts)
        if options.problems:
            log.warning("resource group %s: %s (defaults used)", resource_group,
                        "; ".join(options.problems))
        with gc_paused():
            t1, c1 = time.perf_counter(), time.process_time()
            snap = load_snapshot(db, group, options, now)
            t2, c2 = time.perf_counter(), time.process_time()
            # Enough to place for the writer thread to pay off: write while deciding.
            writer = (PlacementWriter.for_pass(db, now)
                      if len(snap.pending) >= allocator.STREAM_BATCH else None)
            try:
                alloc = run_pipeline(snap.ctx, snap.pending, snap.pool, writer=writer)
                t3, c3 = time.perf_counter(), time.process_time()
                if writer is not None:
                    alloc.flush()
                    writer.finish()  # the placements' rows are written (or this raises)
                commit(db, alloc, snap.pool, snap.ctx, snap.state_before, told)
                # (Nothing left waiting: the next pass reads an empty queue, cheaper.)
                remember = bool(alloc.waiting) and not alloc.cancelled and (
                    snap.ctx.group.scheduler_state.get("reservations")
                    == snap.state_before.get("reservations")) and (
                    not alloc.placed or not alloc.guarded)
                fp_after = None
                if remember and alloc.placed:
                    # What this pass wrote is the record now: remember it with the
                    # fingerprint that includes the writes (tainted: read after them),
                    # unless a policy, keypair, limit or the group changed meanwhile.
                    fp_after = changes.fingerprint(db, resource_group)
                    remember = fp_after[2:] == fp[2:]
                # The queue condensed, for a later pass that reuses what this one knew.
                queue = queue_digest(db, resource_group) if remember else None
            finally:
                if writer is not None:
                    writer.close()  # never leave a thread on the connection
            t4, c4 = time.perf_counter(), time.process_time()
    t5 = time.perf_counter()
    if not alloc.placed and not alloc.cancelled and (
            snap.ctx.group.scheduler_state.get("reservations")
            == snap.state_before.get("reservations")):
        # This pass changed nothing the fingerprint sees: the next one may be skipped
        # until something changes. (A pass that cancelled or moved a reservation leaves
        # no entry, so the next pass runs in full and finds out whether it can move
        # further.) An empty queue loads no agents or usage: nothing to remember then.
        quiet[resource_group] = changes.Quiet(
            fp, changes.next_due(snap.ctx, alloc.waiting),
            Memory(snap.ctx, snap.pool, Waiting(alloc.waiting), alloc.failed_shapes,
                   Shapes(snap.pool), queue=queue)
            if snap.pending else None)
    elif fp_after is not None and remember:
        # It placed sessions: the rest of the queue waits on what is left, which the
        # next pass decides again from this memory (as after a release), not in full.
        quiet[resource_group] = changes.Quiet(
            fp_after, changes.next_due(snap.ctx, alloc.waiting),
            Memory(snap.ctx, snap.pool, Waiting(alloc.waiting), alloc.failed_shapes,
                   Shapes(snap.pool), queue=queue), tainted=True)
    LAST_PASS.clear()
    LAST_PASS.update(
        group=resource_group, skipped=False, pending=len(snap.pending), agents=len(snap.pool.agents),
        placed=len(alloc.placed), lock_s=t1 - t0, load_s=t2 - t1, decide_s=t3 - t2,
        write_s=t4 - t3, commit_s=t5 - t4, total_s=t5 - t0,
        # This process's CPU time (all threads) in load, decide and write: the rest of
        # the wall time is the database's work, or waiting for a CPU.
        load_cpu_s=c2 - c1, decide_cpu_s=c3 - c2, write_cpu_s=c4 - c3,
        streamed_batches=writer.batches if writer is not None else 0,
    )
    _record_metrics(resource_group, snap.ctx, snap.pending, alloc, t5 - t0)
    return [s.id for s, _ in alloc.placed]


#: Where the time of the last pass in this process went (benchmarks, debugging).
LAST_PASS: dict = {}


class Waiting:
    """The sessions a pass left waiting, kept for the pass after a release. Those that
    wait for room are grouped by their request (:func:`_request_key`) and reason: a
    group whose request still fits nowhere is carried over whole, its sessions not
    looked at one by one (80,000 waiting sessions are a few dozen groups). The others
    (waiting on a limit or a dependency) are in ``rest``, decided again each time."""

    __slots__ = ("groups", "rest", "count", "ordered")

    def __init__(self, items=()):
        #: (request key, reason) -> (the verdict, the sessions)
        self.groups: dict[tuple, tuple[Verdict, list[PendingSession]]] = {}
        self.rest: list[tuple[PendingSession, Verdict]] = []
        self.count = 0
        #: The groups whose sessions are in the sequencer's order (sorted once, kept).
        self.ordered: set[tuple] = set()
        self.extend(items)

    def add(self, s: PendingSession, v: Verdict) -> None:
        if v.code == "no_resources" and not s.dependencies:
            self.add_group(_request_key(s), v, [s])
        else:
            self.rest.append((s, v))
            self.count += 1

    def add_group(self, key: tuple, v: Verdict, sessions: list[PendingSession],
                  ordered: bool = False) -> None:
        """Sessions of one request (``key``), waiting for room with verdict ``v``
        (``ordered``: in the sequencer's order)."""
        k = (key, v.message)
        got = self.groups.get(k)
        if got is None:
            self.groups[k] = (v, sessions)
            if ordered:
                self.ordered.add(k)
        else:
            got[1].extend(sessions)
            self.ordered.discard(k)
        self.count += len(sessions)

    def extend(self, items) -> None:
        for s, v in items:
            self.add(s, v)

    def discard(self, ids: set[str]) -> set[str]:
        """Forget those of the sessions ``ids`` that are here (they left the queue);
        return them."""
        if not ids:
            return set()
        gone: set[str] = set()
        for k, (v, sessions) in list(self.groups.items()):
            kept = [s for s in sessions if s.id not in ids]
            if len(kept) != len(sessions):
                gone.update(s.id for s in sessions if s.id in ids)
                if kept:
                    self.groups[k] = (v, kept)  # a subsequence keeps its order
                else:
                    del self.groups[k]
                    self.ordered.discard(k)
        kept_rest = [(s, v) for s, v in self.rest if s.id not in ids]
        gone.update(s.id for s, _ in self.rest if s.id in ids)
        self.rest = kept_rest
        self.count -= len(gone)
        return gone

    def __iter__(self):
        for v, sessions in self.groups.values():
            for s in sessions:
                yield s, v
        yield from self.rest

    def __len__(self) -> int:
        return self.count


@dataclass
class Memory:
    """What a pass that changed nothing knew at its end: its context (usage, policies,
    limits), the agent index (with the reservations' agents held), what waits and the
    request shapes that did not fit. Kept with the pass's fingerprint
    (:class:`.changes.Quiet`)."""

    ctx: PassContext
    pool: AgentPool
    waiting: Waiting
    failed_shapes: dict
    shapes: Shapes
    #: The oldest waiting session's ``created_at`` (computed on first use).
    oldest: dt.datetime | None = None
    #: :func:`.snapshot.queue_digest` of the waiting sessions (PostgreSQL), or None.
    queue: tuple | None = None


def _arrivals_pass(db, group: str, last: changes.Quiet, fp: tuple, since: dt.datetime,
                   now: dt.datetime, quiet: dict, t0: float, told: list | None) -> bool:
    """A pass when the only change since a pass that changed nothing is new sessions.

    Everything else is as that pass left it (the fingerprint says so), so the sessions
    that waited then would wait again for the same reasons: only the arrivals are read
    and decided, against the remembered agents, usage and policies. If each of them
    waits too (the queue cannot move: 80,000 waiting, a few arriving per loop), their
    reasons are written and True is returned; the pass costs the arrivals, not the
    queue. If one could be placed or must be cancelled, or a time-based rule applies
    to it, False: the caller runs a full pass (in the same transaction)."""
    mem: Memory = last.memory
    ctx, pool = mem.ctx, mem.pool
    with gc_paused():
        t1 = time.perf_counter()
        arrivals = load_pending(db, group, since)
        missing = [s for s in arrivals if s.access_key not in ctx.policies]
        if missing:  # keypairs did not change (fingerprint): only not read before
            policies, user_policies = load_policies(db, missing)
            ctx.policies.update(policies)
            ctx.user_policies.update(user_policies)
        t2 = time.perf_counter()
        ctx.now = now
        opts = ctx.options
        selector = SELECTORS[opts.agent_selector]
        waiting: list[tuple[PendingSession, Verdict]] = []
        for s in arrivals:
            if (opts.pending_timeout > 0 and ctx.waited(s) > opts.pending_timeout) or (
                    opts.max_reservations > 0 and ctx.waited(s) >= opts.starvation_threshold):
                return False
            verdict = validate(s, ctx)
            if verdict is None:
                shape = mem.shapes(s)
                msg = mem.failed_shapes.get(shape)
                if msg is None:
                    if selector.select(s, pool, ctx) is not None:
                        return False  # it fits: the full pass places it
                    msg = mem.failed_shapes[shape] = (
                        no_fit_message(s) if ever_fits(s, pool) else never_fits_message(s, pool))
                verdict = Verdict("no_resources", msg)
            elif verdict.cancel:
                return False
            waiting.append((s, verdict))
        t3 = time.perf_counter()
        reasons = [(s, v) for s, v in waiting if s.status_info != v.message]
        allocator.bulk_update(db, allocator.S, [
            {"id": s.id, "status_info": v.message} for s, v in reasons])
        if told is not None:
            told += [(s.id, SessionStatus.PENDING) for s, _ in reasons]
        queue = queue_digest(db, group) if mem.queue is not None else None
        t4 = time.perf_counter()
    mem.waiting.extend(waiting)
    mem.queue = queue
    due = changes.next_due(ctx, waiting)
    if last.due is not None and (due is None or last.due < due):
        due = last.due
    # Remembered once the reasons are committed (as a full pass's, after its commit).
    event.listen(db, "after_commit",
                 lambda _db: quiet.__setitem__(group, changes.Quiet(fp, due, mem, last.tainted)),
                 once=True)
    t5 = time.perf_counter()
    LAST_PASS.clear()
    LAST_PASS.update(
        group=group, skipped=False, arrivals_only=True, pending=len(arrivals),
        agents=len(pool.agents), placed=0, lock_s=t1 - t0, load_s=t2 - t1, decide_s=t3 - t2,
        write_s=t4 - t3, commit_s=t5 - t4, total_s=t5 - t0,
    )
    metrics.PASS_SECONDS.labels(group).observe(t5 - t0)
    counts: dict[str, int] = defaultdict(int)
    for _, v in waiting:
        counts[v.code] += 1
    for code, n in counts.items():
        metrics.REJECTIONS.labels(group, code).inc(n)
    metrics.QUEUE_LENGTH.labels(group).set(len(mem.waiting))
    oldest = min((s.created_at for s, _ in mem.waiting), default=None) \
        if mem.oldest is None else mem.oldest
    mem.oldest = oldest
    if oldest is not None:
        metrics.OLDEST_WAIT.labels(group).set(max(0.0, (now - oldest).total_seconds()))
    return True


#: Sequencers whose order of a subset of the queue is that subset's order in the
#: whole queue (DRF's depends on what is placed on the way: a full pass).
_SUBSET_ORDER = ("fifo", "lifo")


def _released_pass(db, group: GroupInfo, last: changes.Quiet, fp: tuple, now: dt.datetime,
                   quiet: dict, t0: float, left: bool = False,
                   told: list | None = None) -> list[str] | None:
    """A pass when, since a pass that changed nothing or only placed sessions, only
    sessions outside the queue or agents changed (a session ended and gave its slots
    back, an agent joined, left or changed), or nothing did but that pass read its
    fingerprint after its own writes (:attr:`.changes.Quiet.tainted`): the queue is
    the one that pass remembered.

    Its rows are checked (the same sessions, with the same priority, retry count and
    start time: a cancellation or a new priority makes this return None, and the caller
    runs a full pass), then agents and usage are read again (policies, limits and the
    group did not change: the fingerprint says so). Decided again, in the sequencer's
    order, are only the sessions whose verdict can have changed: the starvation guard's
    oldest (as a full pass does), those that waited on a limit or a dependency, and
    those whose request shape now fits on some agent; a shape that does not fit at the
    start of the pass cannot fit later in it, so those sessions keep waiting (with the
    message a full pass would give). One difference from a full pass: once a shape
    fails again in this pass, the later sessions of that shape that waited for resources
    are not validated again (they wait for resources either way). The sessions that
    waited for room come in groups of one request and reason (:class:`Waiting`): a
    group whose request fits nowhere is carried over whole, and a group whose request
    fits is merged into the sequencer's order and stops at its first session that no
    longer fits, so a release costs the groups and the sessions placed, not the
    queue. Rows are written only
    after the sessions placed, cancelled or given a new reason are locked as PENDING
    (``SKIP LOCKED``): if one is not, None (a full pass)."""
    mem: Memory = last.memory
    if group.scheduler not in _SUBSET_ORDER:
        return None
    old_ctx = mem.ctx
    options = SchedulerOptions.lenient(group.scheduler_opts)
    with gc_paused():
        t1 = time.perf_counter()
        if mem.queue is not None and left:
            # PostgreSQL, sessions left the queue: those cancelled since the last pass
            # are taken out, and the rest must be the queue (its digest says so; if
            # not, e.g. one was placed by another manager, a full pass).
            since = max((r[3] for r in last.fingerprint[0] if r[3] is not None), default=None)
            cond = [S.c.resource_group == group.name, S.c.status == SessionStatus.CANCELLED]
            if since is not None:
                cond.append(S.c.terminated_at > since)
            gone = mem.waiting.discard(set(db.scalars(select(S.c.id).where(*cond))))
            expected = queue_digest_without(db, mem.queue, list(gone))
            queue = queue_digest(db, group.name)
            if queue != expected or queue[0] != len(mem.waiting):
                return None
            mem.queue = queue
        elif mem.queue is not None:  # PostgreSQL: condensed by the database
            # The count is checked against the sessions remembered too, not only the
            # digest read when they were: a pass skips rows locked by another
            # transaction (a cancellation under way), which its digest still counts.
            queue = queue_digest(db, group.name)
            if queue != mem.queue or queue[0] != len(mem.waiting):
                return None  # arrived, cancelled, reprioritised or put back meanwhile
        else:  # SQLite: row by row (and which sessions left the queue)
            keys = pending_keys(db, group.name)
            gone: set[str] = set()
            for s, _ in mem.waiting:
                k = keys.get(s.id)
                if k is None:
                    gone.add(s.id)
                elif (50 if k[0] is None else k[0]) != s.priority or (
                        (k[1] or 0) != s.retries or k[2] != s.starts_at):
                    return None  # reprioritised or put back meanwhile
            if len(keys) != len(mem.waiting) - len(gone) or (gone and not left):
                return None  # arrived (or left, with other changes) meanwhile
            if gone:  # they left the queue (cancelled): they held nothing
                mem.waiting.discard(gone)
        if last.fingerprint[6]:  # some session waits for another (deps count)
            deps = load_dependencies(db, group.name)
            for s, _ in mem.waiting.rest:  # a session with dependencies is never grouped
                if s.dependencies or s.id in deps:
                    s.dependencies = deps.get(s.id, [])
        agents = load_agents(db, group.name)
        capacity = ResourceSlot()
        for a in agents:
            capacity = capacity + a.available
        ctx = PassContext(
            group=replace(group, scheduler_state=dict(group.scheduler_state)), options=options,
            now=now, capacity=capacity.nonzero(), usage=load_usage(db, group.name),
            policies=old_ctx.policies, user_policies=old_ctx.user_policies,
            project_limits=old_ctx.project_limits, project_names=old_ctx.project_names,
            domain_limits=old_ctx.domain_limits)
        ctx.usage.unread = unread_levels(ctx)
        pool = AgentPool(agents, options.resource_priority)
        load_warm(db, group.name, pool)
        t2 = time.perf_counter()

        alloc = Allocation()
        selector = SELECTORS[options.agent_selector]
        done: set[str] = set()
        if options.max_reservations > 0:
            threshold = options.starvation_threshold
            cutoff = now - dt.timedelta(seconds=float(threshold) - 1)
            starving = [s for _, lst in mem.waiting.groups.values() for s in lst
                        if s.created_at <= cutoff]
            starving += [s for s, _ in mem.waiting.rest if s.created_at <= cutoff]
            starving.sort(key=lambda s: (s.created_at, s.id))
            done = starving_first(ctx, (s for s in starving if ctx.waited(s) >= threshold),
                                   pool, alloc, selector)
        old_of: dict[str, Verdict] = {}  # the sessions decided one by one
        waiting = Waiting()
        changed: list[tuple[PendingSession, Verdict]] = []
        fits: dict[tuple, object] = {}  # request key -> True (may fit) or its message
        # Sessions to decide, in streams each in the sequencer's order: a group of
        # sessions of one request that waited for room (ends once the request fails),
        # and those that waited on anything else (decided one by one).
        streams: list[tuple[tuple | None, Verdict | None, list[PendingSession]]] = []
        ordered = []  # per stream: already in the sequencer's order
        for (key, msg), (v, lst) in mem.waiting.groups.items():
            if done:
                for s in lst:
                    if s.id in done:
                        old_of[s.id] = v
                lst = [s for s in lst if s.id not in done]
                if not lst:
                    continue
            got = fits.get(key)
            if got is None:
                s = lst[0]
                got = fits[key] = True if _may_fit(s, pool) else (
                    no_fit_message(s) if ever_fits(s, pool) else never_fits_message(s, pool))
            if got is True:
                streams.append((key, v, lst))
                ordered.append((key, msg) in mem.waiting.ordered)
            elif got == msg:  # carried over as it is: not looked at
                waiting.add_group(key, v, lst, (key, msg) in mem.waiting.ordered)
            else:
                v = Verdict("no_resources", got)
                waiting.add_group(key, v, lst, (key, msg) in mem.waiting.ordered)
                changed.extend([(s, v) for s in lst])
        rest = []
        for s, v in mem.waiting.rest:
            old_of[s.id] = v
            if s.id not in done:
                rest.append(s)
        if rest:
            streams.append((None, None, rest))
            ordered.append(False)
        for s, v in alloc.waiting:  # the starvation guard's
            waiting.add(s, v)
            if v.message != old_of[s.id].message:
                changed.append((s, v))
        order = SEQUENCERS[group.scheduler].sort_key(ctx)
        heap = []
        for i, (_, _, lst) in enumerate(streams):
            if not ordered[i]:
                lst.sort(key=order)
            heap.append((order(lst[0]), i, 0))
        heapq.heapify(heap)
        decided = len(done)
        failed: dict[tuple, str] = {}  # request key -> why it did not fit
        failed_rep: dict[tuple, PendingSession] = {}
        while heap:
            _, i, pos = heapq.heappop(heap)
            key, old, lst = streams[i]
            s = lst[pos]
            decided += 1
            if key is None:  # waited on a limit or a dependency: decided again
                old = old_of[s.id]
                key = _request_key(s)
                verdict = validate(s, ctx)
                msg = failed.get(key)
                if verdict is not None:
                    if verdict.cancel:
                        alloc.cancelled.append((s, verdict))
                        verdict = False
                elif msg is None:
                    agents = selector.select(s, pool, ctx)
                    if agents is not None:
                        alloc.place(s, agents, pool, ctx)
                        verdict = False
                    else:
                        msg = failed[key] = (no_fit_message(s) if ever_fits(s, pool)
                                             else never_fits_message(s, pool))
                        failed_rep[key] = s
                if verdict is not False:
                    v = verdict or (old if old.message == msg else Verdict("no_resources", msg))
                    waiting.add(s, v)
                    if v.message != old.message:
                        changed.append((s, v))
            else:  # one of a request's sessions that waited for room, which may fit now
                msg = failed.get(key)
                if msg is None:
                    verdict = validate(s, ctx)
                    if verdict is not None:
                        if verdict.cancel:
                            alloc.cancelled.append((s, verdict))
                        else:
                            waiting.add(s, verdict)
                            changed.append((s, verdict))
                    else:
                        agents = selector.select(s, pool, ctx)
                        if agents is not None:
                            alloc.place(s, agents, pool, ctx)
                        else:
                            msg = failed[key] = (no_fit_message(s) if ever_fits(s, pool)
                                                 else never_fits_message(s, pool))
                            failed_rep[key] = s
                if msg is not None:
                    # The request does not fit any more (free room only shrinks within a
                    # pass): this session and the rest of its group wait, not looked at.
                    left = lst[pos:]
                    v = old if old.message == msg else Verdict("no_resources", msg)
                    waiting.add_group(key, v, left, ordered=True)
                    if v is not old:
                        changed.extend([(x, v) for x in left])
                    decided += len(left) - 1
                    continue
            if pos + 1 < len(lst):
                heapq.heappush(heap, (order(lst[pos + 1]), i, pos + 1))
        t3 = time.perf_counter()
        ids = [s.id for s, _ in alloc.placed] + [s.id for s, _ in alloc.cancelled] + [
            s.id for s, _ in changed]
        if ids and len(lock_pending(db, ids)) != len(set(ids)):
            return None  # one is being cancelled, or is no longer PENDING: a full pass
        allocator.bulk_update(db, allocator.S, [
            {"id": s.id, "status_info": v.message} for s, v in changed])
        if told is not None:
            told += [(s.id, SessionStatus.PENDING) for s, _ in changed]
        # Reasons are written above, for the locked rows only (``commit`` would compare
        # with what these objects read when they were loaded, and write unlocked rows).
        alloc.waiting = []
        commit(db, alloc, pool, ctx, dict(group.scheduler_state), told)
        for s, v in changed:
            s.status_info = v.message
        t4 = time.perf_counter()
        if not alloc.cancelled and (not alloc.placed or not done) and (
                ctx.group.scheduler_state.get("reservations")
                == group.scheduler_state.get("reservations")):
            # Placements included, what this pass wrote is the record now, and the next
            # pass would decide as this one did (the starvation guard decided nothing
            # or placed nothing, reservations unchanged): remember it, once committed.
            # The next moment time changes things can only be later than the last
            # one's (fewer sessions).
            shape_of = Shapes(pool)
            memory = Memory(ctx, pool, waiting,
                            {shape_of(s): failed[key] for key, s in failed_rep.items()}, shape_of,
                            queue=mem.queue)
            if alloc.placed and not len(waiting):
                remembered = None  # nothing left waiting: an empty queue is cheaper to read
            elif not alloc.placed:
                # Nothing the fingerprint sees was written (reasons are not in it): the
                # one read before this pass's reads holds, and the queue is the one
                # checked above. The next pass may be skipped.
                remembered = changes.Quiet(fp, last.due, memory)
            else:
                # The fingerprint that includes the writes, read after them (tainted:
                # see changes.Quiet), unless a policy, keypair, limit or the group
                # changed while this pass ran.
                fp2 = changes.fingerprint(db, group.name)
                memory.queue = queue_digest_without(db, mem.queue, [s.id for s, _ in alloc.placed])
                remembered = (changes.Quiet(fp2, last.due, memory, tainted=True)
                              if fp2[2:] == fp[2:] else None)
            if remembered is not None:
                event.listen(db, "after_commit", lambda _db: quiet.__setitem__(
                    group.name, remembered), once=True)
    t5 = time.perf_counter()
    LAST_PASS.clear()
    LAST_PASS.update(
        group=group.name, skipped=False, released_only=True, pending=decided,
        waiting=len(waiting), agents=len(pool.agents), placed=len(alloc.placed),
        lock_s=t1 - t0, load_s=t2 - t1, decide_s=t3 - t2, write_s=t4 - t3, commit_s=t5 - t4,
        total_s=t5 - t0,
    )
    metrics.PASS_SECONDS.labels(group.name).observe(t5 - t0)
    if alloc.placed:
        metrics.PLACEMENTS.labels(group.name).inc(len(alloc.placed))
        hist = metrics.WAIT_SECONDS.labels(group.name)
        for s, _ in alloc.placed:
            hist.observe(max(0.0, (now - s.created_at).total_seconds()))
    metrics.QUEUE_LENGTH.labels(group.name).set(len(waiting))
    return [s.id for s, _ in alloc.placed]


def _request_key(s: PendingSession) -> tuple:
    """Sessions with equal keys ask for the same (kernels' slot objects are shared by
    sessions read together): a cheaper key than :class:`Shapes`' within one pass."""
    k = s.kernels
    return (s.cluster_mode, s.architecture, s.designated_agents,
            id(k[0][1]) if len(k) == 1 else tuple([id(slots) for _, slots in k]))


def _may_fit(s: PendingSession, pool: AgentPool) -> bool:
    """False only if no selector can place ``s`` on the pool as it is: some kernel's
    request (or, on one node, the whole request) fits on no eligible agent."""
    multi = s.cluster_mode == "multi-node" and len(s.kernels) > 1
    for need in ({id(slots): slots for _, slots in s.kernels}.values() if multi else (s.need,)):
        if s.designated_agents:
            if not pool.candidates(s.designated_agents, need, s.architecture):
                return False
        elif pool.least_fitting(need, s.architecture) is None:
            return False
    return True


_gc_lock = threading.Lock()
_gc_users = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection while a pass builds its objects. A large pass
    allocates hundreds of thousands of objects (sessions, rows, slot maps) and none of
    them in cycles worth collecting; the collector ran some 1,700 times in a pass over
    100,000 sessions (a sixth of its CPU time). Passes in other threads count too: the
    collector comes back when the last one ends."""
    global _gc_users, _gc_was_enabled
    with _gc_lock:
        if _gc_users == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_users += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0 and _gc_was_enabled:
                gc.enable()


def _record_metrics(group: str, ctx: PassContext, pending: list[PendingSession],
                    alloc: Allocation, seconds: float) -> None:
    metrics.PASS_SECONDS.labels(group).observe(seconds)
    if alloc.placed:
        metrics.PLACEMENTS.labels(group).inc(len(alloc.placed))
        hist = metrics.WAIT_SECONDS.labels(group)
        now = ctx.now
        for s, _ in alloc.placed:  # floats here: ctx.waited's Decimal is for the rules
            hist.observe(max(0.0, (now - s.created_at).total_seconds()))
    counts: dict[str, int] = defaultdict(int)
    for _, v in alloc.waiting:
        counts[v.code] += 1
    for _, v in alloc.cancelled:
        counts[v.code] += 1
    for code, n in counts.items():
        metrics.REJECTIONS.labels(group, code).inc(n)
    still = [s for s, _ in alloc.waiting]
    metrics.QUEUE_LENGTH.labels(group).set(len(still))
    metrics.OLDEST_WAIT.labels(group).set(
        float(max((ctx.waited(s) for s in still), default=Decimal(0)))
    )
