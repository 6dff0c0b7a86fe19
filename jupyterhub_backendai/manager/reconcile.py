"""Agents as the manager sees them: their clients, their heartbeats and events, and the
reconciliation that makes the record and each agent agree."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

from sqlalchemy import select, update

from ..agent.core import Agent as LocalAgent
from ..common.errors import AgentError, BackendAIError
from ..common.slots import ResourceSlot
from ..common.types import AgentStatus, SessionStatus
from ..models import Agent, ResourceGroup
from ..models.base import utcnow
from . import lifecycle
from .agent_client import AgentClient, HTTPAgentClient, InProcessAgentClient


class Agents:
    def __init__(self, mgr) -> None:
        self.mgr = mgr
        self.log = mgr.log
        self._reconciling: set[str] = set()  # agents being reconciled
        self._reconciled = 0.0  # loop time of the last reconciliation with every agent
        self._stale_said: dict[str, float] = {}  # agent id -> when its stale heartbeat was logged
        # Per agent, kernels its last reconciliation found ended without an exit code.
        self._dead_kernels: dict[str, set[str]] = {}
        # Unlabelled containers not in the record, already reported (reconcile).
        self._left_said: set[str] = set()
        # Agents kept ALIVE by a direct call while their heartbeats were missing (said once).
        self._witnessed: set[str] = set()
        # Per agent, the (address, group, capacity) a direct call last confirmed.
        self._verified: dict[str, tuple] = {}
        self._refused_said: dict[str, float] = {}

    # -- clients ----------------------------------------------------------------------

    def client(self, agent_id: str, addr: str = "") -> AgentClient:
        mgr = self.mgr
        if agent_id in mgr.local_agents:
            return InProcessAgentClient(mgr.local_agents[agent_id])
        if not addr:
            raise AgentError(f"agent {agent_id} has no address")
        return HTTPAgentClient(addr, mgr.agent_token, tls=mgr.cluster.tls_files())

    async def clients(self, resource_group: str) -> list[AgentClient]:
        rows = await self.mgr.db_read(live_agents, resource_group)
        return [self.client(i, addr) for i, addr, _, _ in rows]

    async def client_for(self, agent_id: str) -> AgentClient:
        if agent_id in self.mgr.local_agents:
            return self.client(agent_id)
        return self.client(agent_id, await self.mgr.db_read(agent_addr, agent_id))

    async def move(self, principal, agent_id: str, group: str) -> None:
        """Issue 29: tell agent ``agent_id`` that it belongs to resource group ``group``
        now (as Backend.AI's ``update_scaling_group``): it keeps that across restarts
        and says so in its heartbeats and registration. Checked first
        (``check_agent_move``); the record follows (``update_agent``). An agent that
        does not answer is not moved (AgentError)."""
        if not await self.mgr.ops.check_agent_move(principal, agent_id, group):
            return
        client = await self.client_for(agent_id)
        await client.set_resource_group(group)

    async def list_images(self, resource_group: str = "default") -> list[str]:
        names: set[str] = set()
        for c in await self.clients(resource_group):
            try:
                names.update(i["name"] for i in await c.list_images())
            except AgentError:
                continue
        return sorted(names)

    async def app_address(self, sid: str) -> str | None:
        """Where session ``sid``'s main kernel is reached from this host straight (its
        container's address on a bridge network), for the app front's fast path; None
        for a kernel of another node, the host network or the local backend."""
        sess = await self.mgr.db_read(lifecycle.load_session, sid)
        if sess is None or sess.status != SessionStatus.RUNNING or not sess.kernels:
            return None
        kernel = min(sess.kernels, key=lambda k: k.cluster_idx)
        agent = self.mgr.local_agents.get(kernel.agent_id)
        if agent is None or not kernel.container_id:
            return None
        return await agent.bridge_address(kernel.container_id)

    async def attach(self, agent: LocalAgent) -> None:
        """Run ``agent`` inside this process: start it, register it, reconcile its kernels."""
        self.mgr.local_agents[agent.agent_id] = agent
        if agent.impl is None:
            await agent.start()
        # Register before anything else so that reconciling and scheduling see it.
        await self.mgr.db(upsert_agent, agent.info())
        await self.reconcile(agent.agent_id, await agent.list_kernels())

    async def touch_local(self) -> None:
        """Agents in this process are alive while it runs (they send no heartbeats)."""
        for agent_id in list(self.mgr.local_agents):  # one may be attached meanwhile
            await self.mgr.db(touch_agent, agent_id)

    # -- liveness: two witnesses --------------------------------------------------------

    async def ask(self, agent_id: str, addr: str) -> dict:
        """The agent at ``addr`` says what it is (a direct call, over mutual TLS where
        the cluster has it); AgentError when it does not answer as ``agent_id``."""
        if not addr:
            raise AgentError("it names no address to call")
        async with asyncio.timeout(5):
            info = await self.client(agent_id, addr).info()
        if not isinstance(info, dict) or info.get("id") != agent_id:
            other = info.get("id") if isinstance(info, dict) else "?"
            raise AgentError(f"the agent at {addr} is {other}")
        return info

    async def answers(self, agent_id: str, addr: str) -> bool:
        """The second witness of an agent's liveness: it answers :meth:`ask`."""
        try:
            await self.ask(agent_id, addr)
        except Exception:
            return False
        return True

    async def check_liveness(self) -> list[str]:
        """Agents silent past ``agent_lost_timeout`` (no heartbeat read: the agent died,
        or the event bus is away) are LOST only when a direct call fails too. One that
        answers stays ALIVE, its silence noted: a bus outage never ends sessions, and
        new sessions still find their agents. Returns the ids made LOST."""
        mgr = self.mgr
        silent = await mgr.db_read(silent_agents, mgr.agent_lost_timeout)
        if not silent:
            return []
        verdicts = await asyncio.gather(*(self.answers(aid, addr) for aid, addr in silent))
        alive = [aid for (aid, _), ok in zip(silent, verdicts, strict=True) if ok]
        dead = [aid for (aid, _), ok in zip(silent, verdicts, strict=True) if not ok]
        for aid in alive:
            if aid not in self._witnessed:
                self._witnessed.add(aid)
                self.log.warning(
                    "agent %s sent no heartbeat for %g s but answers a direct call: kept "
                    "ALIVE (is the event bus down?)", aid, mgr.agent_lost_timeout)
        if alive:
            await mgr.db(witnessed_agents, alive)
        lost = await mgr.db(lose_agents, dead, mgr.agent_lost_timeout) if dead else []
        for aid in lost:
            self._witnessed.discard(aid)
            self.log.warning("agent %s is LOST: no heartbeat for %g s and no answer to a "
                             "direct call", aid, mgr.agent_lost_timeout)
        return lost

    def heard(self, agent_id: str) -> None:
        """A heartbeat of ``agent_id`` was read: its silence (if any) is over."""
        if agent_id in self._witnessed:
            self._witnessed.discard(agent_id)
            self.log.info("agent %s: heartbeats are read again", agent_id)

    # -- events -----------------------------------------------------------------------

    async def handle_event(self, name: str, payload: dict) -> None:
        mgr = self.mgr
        if name == "agent_heartbeat":
            if self._stale_heartbeat(payload):
                return
            payload = await self._vouched(payload)
            if payload is None:
                return
            # H-agents: a routine heartbeat is one autocommit UPDATE (manager/discovery.py).
            before = await mgr.cluster.record_heartbeat(mgr, payload)
            self.heard(str(payload.get("id")))
            if before != AgentStatus.ALIVE and payload.get("id") not in mgr.local_agents:
                # New, or back from LOST (it may have restarted): agree with it now.
                self.arrived(payload["id"])
            # H-agents: only a join or a return wakes the scheduler (a routine heartbeat
            # changes nothing a pass depends on; the periodic pass sees capacity changes).
            if before != AgentStatus.ALIVE:
                mgr.wake()
        elif name == "kernel_terminated":
            if not await self._exit_confirmed(str(payload.get("kernel_id"))):
                return
            await mgr.lifecycle.kernel_exited(
                payload["kernel_id"], payload.get("exit_code"), payload.get("logs")
            )

    # The bus is a hint; facts come from the agent itself over a direct call (mutual
    # TLS in cluster mode). Anyone who can write to Redis can put an event there: a
    # heartbeat of an agent that does not exist, carrying a real agent's address and
    # 1,000 CPUs, joined as ALIVE and sessions were placed on the real node.

    @staticmethod
    def _facts(info: dict) -> tuple:
        import json

        return (info.get("addr", ""), info.get("resource_group"),
                json.dumps(info.get("available_slots"), sort_keys=True))

    async def _vouched(self, payload: dict) -> dict | None:
        """The heartbeat to record, or None to ignore it. A routine heartbeat (the same
        address, group and capacity as last confirmed) passes; anything new (a join, a
        return, another capacity) is confirmed by calling the agent at the address the
        heartbeat names: it must answer with the same id, and what it answers is what is
        recorded. In cluster mode the agent must also be registered in etcd."""
        mgr = self.mgr
        aid = str(payload.get("id"))
        if aid in mgr.local_agents:
            return payload
        if mgr.cluster.etcd_url and aid not in mgr.cluster.agents:
            self._refuse(aid, "it is not registered in etcd")
            return None
        if self._verified.get(aid) == self._facts(payload):
            return payload
        return await self.vouch(aid, payload)

    async def vouch(self, aid: str, payload: dict) -> dict | None:
        """What agent ``aid`` says of itself when called at the address ``payload``
        names (None, logged: no answer, or another agent answers)."""
        addr = payload.get("addr") or ""
        try:
            info = await self.ask(aid, addr)
        except Exception as e:
            self._refuse(aid, f"a direct call to {addr or 'it'} failed ({e})")
            return None
        # What it holds is no fact its /info gives (it changes between heartbeats): the
        # heartbeat's word is taken (it only orders agents that fit, issues 25 and 30).
        info = dict(info, addr=addr, ts=payload.get("ts"), images=payload.get("images"),
                    pool=payload.get("pool"))
        self._verified[aid] = self._facts(info)
        return info

    def _refuse(self, aid: str, why: str) -> None:
        now = time.monotonic()
        if len(self._refused_said) > 10_000:  # forged ids must not grow it without bound
            self._refused_said.clear()
        if now - self._refused_said.get(aid, -3600.0) >= 60:  # once a minute per agent
            self._refused_said[aid] = now
            self.log.warning("heartbeat of agent %s ignored: %s", aid[:80], why)

    async def _exit_confirmed(self, kernel_id: str) -> bool:
        """A kernel's end is believed when its agent no longer runs it (asked directly),
        or cannot be asked. A ``kernel_terminated`` for a kernel its agent still runs is
        forged or stale: ignored."""
        where = await self.mgr.db_read(kernel_agent, kernel_id)
        if where is None:
            return True  # not ours: the lifecycle ignores it
        aid, addr = where
        try:
            async with asyncio.timeout(5):
                records = await self.client(aid, addr).list_kernels()
        except Exception:
            return True
        if any(r.get("kernel_id") == kernel_id and r.get("alive", True) for r in records):
            self.log.warning("kernel_terminated for kernel %s ignored: agent %s still runs it "
                             "(a forged or stale event)", kernel_id, aid)
            return False
        return True

    def _stale_heartbeat(self, payload: dict) -> bool:
        """Whether a heartbeat is too old to say that its agent is alive now.

        Heartbeats travel through the Redis stream's consumer group, which keeps what no
        hub has read yet: a hub that starts (or comes back) is handed the heartbeats the
        agents sent while no hub was reading, minutes or hours old, of agents that may
        have died since. Counted as fresh, each would make its agent ALIVE again and the
        scheduler would place kernels on a dead node. A heartbeat older than
        ``agent_lost_timeout`` (by its ``ts``, the agent's clock) could not keep an agent
        alive when it was new; it is dropped. The agent's next heartbeat counts."""
        ts = payload.get("ts")
        if not isinstance(ts, (int, float)):
            return False  # an agent that does not say when: as before
        age = time.time() - ts
        limit = self.mgr.agent_lost_timeout
        if age <= limit:
            return False
        aid = str(payload.get("id"))
        now = time.monotonic()
        if now - self._stale_said.get(aid, -3600.0) >= 600:  # once per agent per 10 min
            self._stale_said[aid] = now
            self.log.warning(
                "heartbeat of agent %s is %.0f s old, past agent_lost_timeout (%g s): "
                "ignored. It was waiting in the event stream while no hub read it, or that "
                "agent's clock is behind this hub's; if the agent is alive and this repeats, "
                "synchronise the clocks (NTP)", aid, age, limit)
        return True

    # -- reconciliation -----------------------------------------------------------------

    async def reconcile(self, agent_id: str, records: list[dict],
                        before: dict[str, tuple[str, str]] | None = None) -> None:
        """Make the record and one agent agree, both ways (after a restart of either,
        an agent's return from LOST, and periodically).

        ``records`` is the agent's list of kernels; ``before`` what the record knew
        on that agent just before the list was taken (so a kernel started meanwhile is
        not taken for lost). A RUNNING session's kernel that ended with a known exit
        code (a batch command that finished) ends its session as if the manager had
        seen it; one that vanished makes its session ERROR with the reason. A kernel
        the record does not know (or whose session is over) is removed. Starts and
        ends are left to their claim holders (:mod:`.lifecycle`).
        """
        mgr = self.mgr
        # Issue 30: a warm pool's kernels are no session's (manager/warmpool.py).
        records = [r for r in records if not r.get("pooled")]
        alive = {r["kernel_id"] for r in records if r.get("alive")}
        present = {r["kernel_id"] for r in records}
        ended_codes = {
            r["kernel_id"]: r["exit_code"]
            for r in records
            if not r.get("alive") and r.get("exit_code") is not None
        }
        if before is None:
            before = await mgr.db_read(lifecycle.kernels_on, agent_id)
        known = await mgr.db_read(lifecycle.kernels_on, agent_id)
        running = {kid for kid, (_, st) in before.items() if st == SessionStatus.RUNNING
                   and known.get(kid, (None, None))[1] == SessionStatus.RUNNING}
        ended = sorted(running & set(ended_codes))
        # A kernel that ended without an exit code in the list (the local backend's when
        # the agent restarted meanwhile): its exit event is likely on its way and says
        # how it ended. Only one still so at the agent's next reconciliation is lost.
        dead = present - alive - set(ended_codes)
        dead_before = self._dead_kernels.get(agent_id, set())
        self._dead_kernels[agent_id] = dead
        vanished = {known[kid][0] for kid in running - present}
        # A session this process is starting or ending right now is its claim holder's
        # (a start that cleans up, an exit being handled): the next reconciliation
        # looks again if the kernel is still missing then.
        lost = sorted(sid for sid in vanished if not mgr.lifecycle.steps.driving(sid))
        dead_lost = sorted({known[kid][0] for kid in running & dead & dead_before} - vanished)
        client = await self.client_for(agent_id)
        for kid in ended:
            await mgr.lifecycle.kernel_exited(kid, ended_codes[kid], await client.kernel_logs(kid))
        for sid in lost:
            await mgr.lifecycle.end(
                sid, SessionStatus.ERROR, f"kernel lost: agent {agent_id} no longer has it"
            )
        for sid in dead_lost:
            await mgr.lifecycle.end(
                sid, SessionStatus.ERROR,
                f"kernel lost: it ended on agent {agent_id} and no exit code was reported")
        # Reaped only when it carries the agent's installation label (and its id: the
        # agent lists nothing else) and the record says it is gone. A container made
        # before installations had identities (no label) may be another installation's
        # that shared the old default agent id: it is left alone.
        foreign = {r["kernel_id"] for r in records if r.get("own") is False}
        for kid in sorted(present - set(known) - foreign):
            self.log.info("removing orphan kernel %s on %s", kid, agent_id)
            try:
                await client.destroy_kernel(kid)
            except BackendAIError as e:
                self.log.warning("could not remove orphan kernel %s on %s: %s", kid, agent_id, e.detail)
        for kid in sorted(((present - set(known)) & foreign) - self._left_said):
            self._left_said.add(kid)
            self.log.warning(
                "kernel %s on %s is not in the record and carries no installation label (made "
                "before installations had identities, perhaps by another installation with "
                "the same agent id): left alone; remove its container by hand if it is this "
                "installation's", kid, agent_id)

    def arrived(self, agent_id: str) -> None:
        """A remote agent is recorded ALIVE, new or back from LOST (a heartbeat or its
        etcd registration, vouched for): agree with it on its kernels, and catalogue its
        images if the catalogue holds none of the agents' yet (manager/registries.py)."""
        self.mgr.background(self.reconcile_agent(agent_id))
        if not self.mgr.registries.local_known:
            self.mgr.background(self.mgr.registries.catalogue_local_first(joined=True))

    async def reconcile_agent(self, agent_id: str) -> None:
        """Reconcile with one agent (in process or over HTTP); errors are logged."""
        if agent_id in self._reconciling:
            return
        self._reconciling.add(agent_id)
        try:
            before = await self.mgr.db_read(lifecycle.kernels_on, agent_id)
            records = await (await self.client_for(agent_id)).list_kernels()
            await self.reconcile(agent_id, records, before)
        except BackendAIError as e:
            self.log.warning("could not reconcile with agent %s: %s", agent_id, e.detail)
        except Exception:
            self.log.exception("could not reconcile with agent %s", agent_id)
        finally:
            self._reconciling.discard(agent_id)

    async def reconcile_all(self) -> None:
        """Reconcile with every live agent (every ``reconcile_interval`` seconds)."""
        ids = await self.mgr.db_read(alive_agent_ids)
        # H-agents: a few agents at a time. All at once queued 2-3 DB jobs per agent in the
        # worker threads, and every heartbeat's update waited behind them (p99 0.5 s at
        # 200 agents, benchmarks/agents.py).
        sem = asyncio.Semaphore(4)

        async def one(agent_id: str) -> None:
            async with sem:
                await self.reconcile_agent(agent_id)

        await asyncio.gather(*(one(a) for a in ids))

    def reconcile_when_due(self) -> None:
        """Start a reconciliation with every agent in the background when
        ``reconcile_interval`` has passed since the last."""
        loop_now = asyncio.get_running_loop().time()
        if loop_now - self._reconciled >= self.mgr.reconcile_interval:
            self._reconciled = loop_now
            self.mgr.background(self.reconcile_all())


# -- the record of agents (inside the caller's transaction) --------------------------------


def live_agents(s, resource_group: str) -> list[tuple[str, str, str, ResourceSlot]]:
    """(id, address, architecture, available slots) of the group's ALIVE agents."""
    return [
        (a.id, a.addr, a.architecture, a.available_slots)
        for a in s.scalars(select(Agent).where(
            Agent.resource_group == resource_group, Agent.status == AgentStatus.ALIVE))
    ]


def agent_addr(s, agent_id: str) -> str:
    row = s.get(Agent, agent_id)
    return row.addr if row else ""


def alive_agent_ids(s) -> list[str]:
    return list(s.scalars(select(Agent.id).where(Agent.status == AgentStatus.ALIVE)))


def active_groups(s) -> list[str]:
    return list(s.scalars(select(ResourceGroup.name).where(ResourceGroup.is_active)))


def upsert_agent(s, info: dict) -> str | None:
    """Insert-or-update atomically: heartbeats may race with registration (and other
    managers). Returns the agent's status before (None: it is new)."""
    if s.bind.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    rg = info["resource_group"]
    # H-agents: the common case, an ALIVE agent's routine heartbeat, is one UPDATE.
    done = s.execute(
        update(Agent)
        .where(Agent.id == info["id"], Agent.status == AgentStatus.ALIVE, Agent.resource_group == rg)
        .values(addr=info.get("addr", ""), architecture=info.get("architecture", ""),
                backend=info.get("backend", ""), version=info.get("version", ""),
                available_slots=ResourceSlot.from_json(info["available_slots"]),
                last_heartbeat=utcnow(), **_holdings(info))
        .execution_options(synchronize_session=False)
    )
    if done.rowcount == 1:
        return AgentStatus.ALIVE
    before = s.scalar(select(Agent.status).where(Agent.id == info["id"]))
    s.execute(insert(ResourceGroup).values(name=rg).on_conflict_do_nothing())
    s.execute(
        insert(Agent)
        .values(id=info["id"], resource_group=rg, occupied_slots=ResourceSlot(),
                available_slots=ResourceSlot(), first_contact=utcnow(), last_heartbeat=utcnow())
        .on_conflict_do_nothing()
    )
    a = s.get(Agent, info["id"], with_for_update=True, populate_existing=True)
    a.status = AgentStatus.ALIVE
    a.resource_group = info["resource_group"]
    a.addr = info.get("addr", "")
    a.architecture = info.get("architecture", "")
    a.backend = info.get("backend", "")
    a.available_slots = ResourceSlot.from_json(info["available_slots"])
    a.version = info.get("version", "")
    a.last_heartbeat = utcnow()
    for k, v in _holdings(info).items():
        setattr(a, k, v)
    return before


def _holdings(info: dict) -> dict:
    """What a heartbeat says the agent holds (issues 25 and 30), as the agent row's
    columns: the labelled images on its engine, its ready pooled kernels per warm pool,
    and its slots another agent of its host holds now. Only what it says: a registration
    (``info()``) leaves the row's as they are."""
    out = {}
    if "images" in info:
        images = info["images"]
        out["images"] = sorted(str(i) for i in images)[:10_000] if isinstance(images, list) else None
    if "pool" in info:
        pool = info["pool"]
        out["pool_ready"] = ({str(k): v for k, v in pool.items() if isinstance(v, int) and v > 0}
                             if isinstance(pool, dict) else None)
    if "away" in info:
        away = info["away"]
        try:
            slots = ResourceSlot.from_json(away).nonzero() if isinstance(away, dict) else None
        except Exception:
            slots = None  # (an agent's word that does not parse: as if it had not said)
        out["away_slots"] = slots.to_json() if slots else None
    return out


def kernel_agent(s, kernel_id: str) -> tuple[str, str] | None:
    """(agent id, its address) of a kernel in the record."""
    from ..models import Kernel

    row = s.execute(select(Kernel.agent_id, Agent.addr).join(Agent, Agent.id == Kernel.agent_id)
                    .where(Kernel.id == kernel_id)).first()
    return (row[0], row[1]) if row else None


def silent_agents(s, timeout: float) -> list[tuple[str, str]]:
    """(id, address) of ALIVE agents with no heartbeat for ``timeout`` seconds."""
    cutoff = utcnow() - dt.timedelta(seconds=timeout)
    return [(a.id, a.addr) for a in s.scalars(select(Agent).where(
        Agent.status == AgentStatus.ALIVE, Agent.last_heartbeat < cutoff))]


def witnessed_agents(s, ids: list[str]) -> None:
    """Agents that answered a direct call: alive as of now (the heartbeat's clock)."""
    s.execute(update(Agent).where(Agent.id.in_(ids), Agent.status == AgentStatus.ALIVE)
              .values(last_heartbeat=utcnow()).execution_options(synchronize_session=False))


def lose_agents(s, ids: list[str], timeout: float) -> list[str]:
    """Mark LOST those of ``ids`` still silent (a heartbeat may have come meanwhile)."""
    cutoff = utcnow() - dt.timedelta(seconds=timeout)
    lost = list(s.scalars(select(Agent).where(
        Agent.id.in_(ids), Agent.status == AgentStatus.ALIVE, Agent.last_heartbeat < cutoff)
        .with_for_update()))
    for a in lost:
        a.status = AgentStatus.LOST
    return [a.id for a in lost]


def touch_agent(s, agent_id: str) -> None:
    a = s.get(Agent, agent_id)
    if a is not None:
        a.last_heartbeat = utcnow()
        a.status = AgentStatus.ALIVE
