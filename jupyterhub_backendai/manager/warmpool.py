"""The warm pool (issue 30): per resource group, kernels of an image and a preset kept
started and unassigned, taken by a matching session's start (docs/architecture.md).

- **The setting** (``warm_pools``, migration 0014; the admin API's ``/warm-pools``,
  superadmins): resource group, image, preset, size (0 by default: no pool).
- **Filling** (:meth:`WarmPools.tick`, in the background after scheduler rounds, at most
  every ``warm_pool_interval``): what each agent of the group holds is read from the
  agents themselves (their unbound pooled kernels, label ``ai.backend.pool``); a missing
  kernel is started on an ALIVE, schedulable agent whose free capacity in the record,
  less what the pool already holds there, fits the preset. Pooled kernels are no
  session: they count against no quota and no keypair, user or project limit.
- **Eviction first.** The record does not count pooled kernels: the scheduler places real
  sessions as if the pool were not there. Every round, an agent whose record's free
  capacity no longer covers the pool's kernels there (less those about to be bound by
  starting sessions) has pooled kernels removed until it does; a pool above its size, or
  of a setting removed, is trimmed.
- **Taking** (:meth:`WarmPools.take`, from the start, lifecycle/start.py): a session of
  one interactive kernel with the pool's image and exactly the preset's slots, a home
  folder, no GPU, no SSH, no kernel bounds of a policy, placed on an agent holding a
  ready pooled kernel, takes it: the record's kernel gets the pooled kernel's id (the
  primary key: of two managers, one wins), and the agent binds it
  (agent/warmpool.py). Any failure of the binding starts a fresh kernel instead.

Hits and misses are counted on ``/hub/metrics`` (``backendai_warm_pool_requests``);
the console shows the pool, its fill and why it cannot fill (``status_info``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from prometheus_client import Counter, Gauge
from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError

from ..common.errors import BackendAIError, InvalidRequest, NotFound
from ..common.ids import new_id
from ..common.kernelspec import KernelSpec
from ..common.slots import CUDA, ResourceSlot
from ..common.types import AgentStatus, SessionStatus
from ..models import Agent, Kernel, ResourceGroup, ResourcePreset, Session, WarmPool
from ..models.base import utcnow
from . import access
from . import mounts as vfmounts
from .ops import reads, writes
from .scheduler.metrics import counter_value

REQUESTS = Counter(
    "backendai_warm_pool_requests",
    "Session starts that matched a warm pool: hit (took a pooled kernel) or miss (none was "
    "ready on the session's agent, or the session could not be bound to one)",
    ["resource_group", "image", "preset", "outcome"],
)
EVICTIONS = Counter(
    "backendai_warm_pool_evictions",
    "Pooled kernels removed to give their room to sessions",
    ["resource_group"],
)
SIZE = Gauge("backendai_warm_pool_size", "Kernels a warm pool is set to keep",
             ["resource_group", "image", "preset"])
READY = Gauge("backendai_warm_pool_ready", "Pooled kernels started and unassigned",
              ["resource_group", "image", "preset"])

QUIET_POLL = 0.05  # seconds between looks for the starts in flight being over
STARTING = (SessionStatus.SCHEDULED, SessionStatus.PREPARING, SessionStatus.CREATING)


def pool_key(rg: str, image: str, preset: str) -> str:
    """The label a pooled kernel carries: which pool it belongs to."""
    return f"{rg}|{image}|{preset}"


@dataclass
class Pooled:
    kernel_id: str
    agent_id: str
    key: str


# -- the setting (operations the admin API calls) ------------------------------------


def _pool_body(row: WarmPool, ready: int | None = None) -> dict:
    labels = {"resource_group": row.resource_group, "image": row.image, "preset": row.preset}
    return {
        **labels,
        "size": row.size,
        "ready": int(READY.labels(**labels)._value.get()) if ready is None else ready,
        "hits": int(counter_value(REQUESTS, **labels, outcome="hit")),
        "misses": int(counter_value(REQUESTS, **labels, outcome="miss")),
        "status_info": row.status_info or "",
    }


@reads
def list_warm_pools(db, p, offset: int = 0, limit: int = 100) -> dict:
    access.require(p.is_superadmin, "read the warm pools")
    rows = db.scalars(select(WarmPool).order_by(WarmPool.resource_group, WarmPool.image,
                                                WarmPool.preset)).all()
    items = [_pool_body(r) for r in rows[offset:offset + limit]]
    return {"items": items, "total": len(rows), "offset": offset, "limit": limit}


@writes
def set_warm_pool(db, p, body: dict) -> dict:
    """Set how many kernels of an image and preset a resource group keeps warm (0: none,
    the setting goes and so do its kernels at the next round)."""
    access.require(access.may_change_installation(p), "change the warm pools")
    rg, image, preset = body["resource_group"], body["image"], body["preset"]
    if db.get(ResourceGroup, rg) is None:
        raise NotFound(f"resource group {rg!r} does not exist")
    row_preset = db.get(ResourcePreset, preset)
    if row_preset is None:
        raise NotFound(f"resource preset {preset!r} does not exist")
    if row_preset.resource_group not in (None, rg):
        raise InvalidRequest(f"resource preset {preset!r} is offered only in resource group "
                             f"{row_preset.resource_group!r}, not {rg!r}")
    slots = ResourceSlot(row_preset.resource_slots)
    if any(k == CUDA or k.startswith("cuda.") for k, v in slots.items() if v):
        raise InvalidRequest(f"resource preset {preset!r} asks for GPUs: a kernel with GPUs "
                             "cannot be kept warm (its devices would be held for nobody)")
    row = db.get(WarmPool, (rg, image, preset))
    if body["size"] == 0:
        if row is not None:
            db.delete(row)
            db.flush()
        return {"resource_group": rg, "image": image, "preset": preset, "size": 0, "ready": 0,
                "hits": 0, "misses": 0, "status_info": ""}
    if row is None:
        row = WarmPool(resource_group=rg, image=image, preset=preset, status_info="")
        db.add(row)
    row.size = body["size"]
    row.updated_at = utcnow()
    db.flush()
    return _pool_body(row)


def _configs(db) -> list[tuple[str, str, str, int, ResourceSlot, str]]:
    rows = db.execute(select(WarmPool, ResourcePreset.resource_slots)
                      .join(ResourcePreset, ResourcePreset.name == WarmPool.preset)
                      .where(WarmPool.size > 0)).all()
    return [(w.resource_group, w.image, w.preset, w.size, ResourceSlot(slots).nonzero(),
             w.status_info or "") for w, slots in rows]


def _agents(db, groups: set[str], ids: set[str] = frozenset(), every: bool = False
            ) -> list[tuple[str, str, str, ResourceSlot]]:
    """(id, group, backend, free capacity in the record) of the groups' ALIVE agents
    (``ids`` too; ``every``: all of them). An agent taken out of service
    (not schedulable) keeps no pool: it gets none, its kernels are evicted."""
    where = Agent.status == AgentStatus.ALIVE
    if not every:
        where = where & or_(Agent.resource_group.in_(groups), Agent.id.in_(ids))
    rows = db.scalars(select(Agent).where(where)).all()
    rows = [a for a in rows if a.schedulable or a.id in ids or every]
    return [(a.id, a.resource_group, a.backend,
             (ResourceSlot(a.available_slots) - ResourceSlot(a.occupied_slots))
             if a.schedulable else ResourceSlot()) for a in rows]


def _starting(db, groups: set[str]) -> list[tuple[str, str, str, ResourceSlot]]:
    """(agent, group, image, slots) of the single-kernel sessions starting now (each may
    take a pooled kernel of its agent)."""
    rows = db.execute(select(Kernel.agent_id, Session.resource_group, Session.image,
                             Kernel.requested_slots, Session.cluster_size)
                      .join(Session, Session.id == Kernel.session_id)
                      .where(Session.status.in_(STARTING), Session.resource_group.in_(groups),
                             Kernel.container_id.is_(None))).all()
    return [(a, rg, img, ResourceSlot(sl).nonzero()) for a, rg, img, sl, n in rows if n == 1]


def _swap_kernel_id(db, sid: str, old: str, new: str) -> bool:
    """The record's kernel ``old`` of a starting session becomes ``new`` (the pooled
    kernel's id). The id is the primary key: a pooled kernel goes to one session."""
    done = db.execute(update(Kernel).where(Kernel.id == old, Kernel.session_id == sid,
                                           Kernel.container_id.is_(None))
                      .values(id=new)).rowcount
    return done == 1


def _set_status_info(db, key: tuple[str, str, str], info: str) -> None:
    row = db.get(WarmPool, key)
    if row is not None and (row.status_info or "") != info:
        row.status_info = info


class WarmPools:
    """The manager's warm pools (one per manager process)."""

    def __init__(self, mgr) -> None:
        self.mgr = mgr
        # The pooled kernels the agents reported at the last round, by kernel id.
        self.kernels: dict[str, Pooled] = {}
        # Pooled kernels this process has given to a start (not offered again).
        self.taken: set[str] = set()
        self._task: asyncio.Task | None = None
        self._last = 0.0
        self._again = False
        self._configs: list = []
        self._first = True
        # A round that refills once this process's starts are over (_refill_waits).
        self._later: asyncio.Task | None = None
        self._overdue = False

    # -- the round ---------------------------------------------------------------------

    def kick(self, now: bool = False) -> None:
        """Run a round in the background (one at a time; at most every
        ``warm_pool_interval`` unless ``now``)."""
        if self._task is not None and not self._task.done():
            self._again = self._again or now
            return
        if not now and time.monotonic() - self._last < self.mgr.warm_pool_interval:
            return
        # One of the manager's background tasks: cancelled when it stops, before its
        # agents close (a round must not start or remove kernels on a closed engine).
        self._task = self.mgr.background(self._round())

    def settled(self) -> bool:
        """No round running or asked for."""
        return (self._task is None or self._task.done()) and not self._again

    async def _round(self) -> None:
        try:
            self._last = time.monotonic()
            await self.tick()
        except asyncio.CancelledError:
            raise
        except Exception:
            self.mgr.log.exception("warm pool round failed")
        if self._again:
            self._again = False
            self._task = None
            self.kick(now=True)

    def _refill_waits(self) -> bool:
        """Whether a refill waits for the session starts this process has in flight
        (from their placement until their servers answer): a refill starts kernels
        (engine calls, the hub's own work), and during a rush of starts that took the
        CPU their servers needed (five pooled starts at once: 1.6 s with the refill
        beside them, 1.1 s after it). A round runs once they are over, or after
        ``warm_pool_interval`` all the same (a steady stream of starts does not keep
        the pool empty). Eviction never waits."""
        if self._overdue or not self.mgr.starts_in_flight():
            return False
        if self._later is None or self._later.done():
            self._later = self.mgr.background(self._when_quiet())
        return True

    def _refill_soon(self) -> None:
        """A round to refill what a start took: once this process's starts are over
        (at once when none is, or the refill is overdue). A round at each take ran four
        times in a rush of five pooled starts, each reading the record and listing the
        agent's containers only to find that the refill waits."""
        if not self._refill_waits():
            self.kick(now=True)

    async def _when_quiet(self) -> None:
        deadline = time.monotonic() + self.mgr.warm_pool_interval
        while self.mgr.starts_in_flight():
            if time.monotonic() >= deadline:
                self._overdue = True
                break
            await asyncio.sleep(QUIET_POLL)
        self.kick(now=True)

    async def tick(self) -> None:
        """One round: learn what the agents hold, evict what sessions need, trim, refill."""
        mgr = self.mgr
        configs = await mgr.db_read(_configs)
        self._configs = configs
        wanted = {pool_key(rg, img, pre): (rg, img, pre, size, slots)
                  for rg, img, pre, size, slots, _ in configs}
        said = {(rg, img, pre): info for rg, img, pre, _, _, info in configs}
        groups = {rg for rg, *_ in configs}
        # Where pooled kernels may be: the pools' groups, the agents of the last round's
        # kernels, and at the first round every agent (kernels of a setting removed
        # while no hub ran).
        known = {p.agent_id for p in self.kernels.values()}
        if not groups and not known and not self._first:
            return
        agents = await mgr.db_read(_agents, groups, known, self._first)
        self._first = False
        held: dict[str, Pooled] = {}
        for aid, _, backend, _ in agents:
            if backend != "docker":
                continue
            try:
                records = await (await mgr.agents.client_for(aid)).list_kernels()
            except BackendAIError as e:
                mgr.log.warning("warm pool: agent %s did not list its kernels: %s", aid, e.detail)
                continue
            for r in records:
                if r.get("pooled") and r.get("alive") and r["kernel_id"] not in self.taken:
                    held[r["kernel_id"]] = Pooled(r["kernel_id"], aid, r["pooled"])
        self.kernels = held
        self.taken &= set(held) | self.taken  # forgotten once the record has them
        # Trim: pools removed or shrunk.
        count: dict[str, list[Pooled]] = {}
        for p in held.values():
            count.setdefault(p.key, []).append(p)
        for key, ps in count.items():
            size = wanted[key][3] if key in wanted else 0
            for p in ps[size:]:
                await self._remove(p, "trimmed")
        # Evict: the room the record gives each agent, less what starting sessions take.
        starting = await mgr.db_read(_starting, groups) if groups else []
        free = {aid: f for aid, _, _, f in agents}
        for aid in free:
            mine = [p for p in self.kernels.values() if p.agent_id == aid]
            spoken = []
            for a, rg, img, slots in starting:
                match = next((p for p in mine if a == aid and p not in spoken
                              and p.key in wanted and wanted[p.key][:2] == (rg, img)
                              and wanted[p.key][4] == slots), None)
                if match is not None:
                    spoken.append(match)
            room = free[aid] + sum((wanted[p.key][4] for p in spoken if p.key in wanted),
                                   ResourceSlot())
            for p in sorted(mine, key=lambda p: p in spoken):
                need = sum((wanted[q.key][4] for q in mine if q.key in wanted), ResourceSlot())
                if need.fits_in(room):
                    break
                await self._remove(p, "evicted")
                mine.remove(p)
                EVICTIONS.labels(resource_group=wanted.get(p.key, ("?",))[0]).inc()
            used = sum((wanted[q.key][4] for q in mine if q.key in wanted), ResourceSlot())
            free[aid] = room - used
        # Refill.
        waits: bool | None = None  # whether it waits for this process's starts
        by_key: dict[str, int] = {}
        for p in self.kernels.values():
            by_key[p.key] = by_key.get(p.key, 0) + 1
        for key, (rg, img, pre, size, slots) in wanted.items():
            have = by_key.get(key, 0)
            READY.labels(rg, img, pre).set(have)
            SIZE.labels(rg, img, pre).set(size)
            info = ""
            starts = []
            for _ in range(size - have):
                where = next((aid for aid, g, backend, _ in agents if g == rg and backend == "docker"
                              and slots.fits_in(free[aid])), None)
                if where is None:
                    dockers = [a for a in agents if a[1] == rg and a[2] == "docker"]
                    info = (f"cannot fill: no agent of resource group {rg!r} has room for "
                            f"{slots.human()} beside its sessions" if dockers else
                            f"cannot fill: resource group {rg!r} has no usable agent with "
                            "the docker backend")
                    break
                free[where] = free[where] - slots
                starts.append(where)
            if starts and waits is None:
                waits = self._refill_waits()
            if starts and waits:
                starts = []  # a round refills once the starts are over
            elif starts:
                errors = await asyncio.gather(*(self._start(key, img, slots, a) for a in starts))
                errors = [e for e in errors if e]
                if errors:
                    info = "cannot fill: " + errors[0]
            if said.get((rg, img, pre)) != info:  # (a write beside a rush of starts costs)
                await mgr.db(_set_status_info, (rg, img, pre), info)
        if waits is False:
            self._overdue = False
        for labels in list(READY._metrics):
            if pool_key(*labels) not in wanted:
                READY.labels(*labels).set(0)
                SIZE.labels(*labels).set(0)

    async def _start(self, key: str, image: str, slots: ResourceSlot, agent_id: str) -> str:
        kid = new_id()
        spec = KernelSpec(kernel_id=kid, session_id=f"pool-{kid}", image=image, slots=slots,
                          pool=key)
        try:
            await (await self.mgr.agents.client_for(agent_id)).create_kernel(spec.to_wire())
        except BackendAIError as e:
            self.mgr.log.warning("warm pool %s: agent %s: %s", key, agent_id, e.detail)
            return f"agent {agent_id}: {e.detail}"
        self.kernels[kid] = Pooled(kid, agent_id, key)
        return ""

    async def _remove(self, p: Pooled, why: str) -> None:
        self.kernels.pop(p.kernel_id, None)
        try:
            await (await self.mgr.agents.client_for(p.agent_id)).destroy_kernel(p.kernel_id)
            self.mgr.log.info("warm pool %s: kernel %s on %s %s", p.key, p.kernel_id,
                              p.agent_id, why)
        except BackendAIError as e:
            self.mgr.log.warning("warm pool: could not remove kernel %s on %s: %s",
                                 p.kernel_id, p.agent_id, e.detail)

    # -- taking ------------------------------------------------------------------------

    def _match(self, sess: Session, kernels: list, mounts: list, bounds: dict | None,
               ssh_key: str | None) -> tuple[tuple, bool] | None:
        """The pool a starting session matches ((rg, image, preset), bindable), or None."""
        if len(kernels) != 1:
            return None
        slots = ResourceSlot(kernels[0].requested_slots).nonzero()
        for rg, img, pre, _, pslots, _ in self._configs:
            if (rg, img) == (sess.resource_group, sess.image) and pslots == slots:
                ok = (sess.session_type == "interactive" and not ssh_key and not bounds
                      and any(m["target"] == vfmounts.MOUNT_ROOT for m in mounts))
                return (rg, img, pre), ok
        return None

    async def take(self, sess: Session, kernels: list, mounts: list, bounds: dict | None,
                   ssh_key: str | None) -> bool:
        """Give a starting session a pooled kernel of its agent: the record's kernel gets
        its id (``kernels[0].id`` too). False (a fresh kernel starts) when it matches no
        pool, cannot be bound, or none is ready there."""
        found = self._match(sess, kernels, mounts, bounds, ssh_key)
        if found is None:
            return False
        (rg, img, pre), ok = found
        k = kernels[0]
        key = pool_key(rg, img, pre)
        if ok:
            for p in list(self.kernels.values()):
                if p.key != key or p.agent_id != k.agent_id or p.kernel_id in self.taken:
                    continue
                self.taken.add(p.kernel_id)
                self.kernels.pop(p.kernel_id, None)
                try:
                    swapped = await self.mgr.db(_swap_kernel_id, sess.id, k.id, p.kernel_id)
                except IntegrityError:  # another manager's start took it
                    continue
                if not swapped:
                    break
                k.id = p.kernel_id
                REQUESTS.labels(resource_group=rg, image=img, preset=pre, outcome="hit").inc()
                self._refill_soon()
                return True
        REQUESTS.labels(resource_group=rg, image=img, preset=pre, outcome="miss").inc()
        return False

    async def create(self, client, spec: KernelSpec, pooled: bool) -> dict:
        """Start the kernel of ``spec``: bind the pooled kernel of its id when ``pooled``
        (a failure to bind starts a fresh kernel of the same id), else a fresh one."""
        if pooled:
            try:
                return await client.bind_kernel(spec.to_wire())
            except BackendAIError as e:
                self.mgr.log.warning("session %s: pooled kernel %s not bound (%s); starting "
                                     "a fresh kernel", spec.session_id, spec.kernel_id, e.detail)
        return await client.create_kernel(spec.to_wire())


__all__ = ["WarmPools", "list_warm_pools", "pool_key", "set_warm_pool"]
