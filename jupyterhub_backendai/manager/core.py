"""The manager: owns the record and drives sessions through their states.

One instance per hub process (a traitlets singleton, configured from
``jupyterhub_config.py`` as ``c.BackendAIManager``). Database work runs in worker
threads so that the hub's event loop never waits on it; Docker and agent calls
are async end to end.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
import weakref
from collections.abc import AsyncIterator
from decimal import Decimal
from urllib.parse import urlsplit

from prometheus_client import Counter
from sqlalchemy import or_, select, update
from sqlalchemy.orm import selectinload
from traitlets import Bool, Dict, Float, Integer, List, Unicode, default
from traitlets.config import SingletonConfigurable

from ..agent.backends.base import BATCH, IDLE, INTERACTIVE
from ..agent.core import Agent as LocalAgent
from ..common import session_request
from ..common.errors import (
    AgentError,
    BackendAIError,
    Conflict,
    ImageNotFound,
    InvalidRequest,
    NotFound,
)
from ..common.events import make_event_bus
from ..common.session_request import ClusterMode, SessionRequest, SessionType
from ..common.slots import (
    CPU,
    CUDA,
    MEM,
    MIG_PREFIX,
    ResourceSlot,
    format_bytes,
    format_cores,
    format_slots,
    is_known_slot,
    parse_size,
)
from ..common.types import (
    DEAD_STATUSES,
    AgentStatus,
    SessionStatus,
    UserStatus,
    VFolderOwnership,
    VFolderStatus,
)
from ..models import (
    Agent,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ResourceGroup,
    Session,
    User,
    VFolder,
)
from ..models.base import utcnow
from ..models.db import make_engine, make_read_sessionmaker, make_sessionmaker, upgrade
from ..storageproxy.client import make_storage_registry
from . import lifecycle, sshkeys, tenancy
from . import mounts as vfmounts
from .agent_client import AgentClient, HTTPAgentClient, InProcessAgentClient, close_agent_clients
from .discovery import BackendAICluster
from .ops import Operations
from .scheduler import (
    admit,
    check_consistency,
    lost_agents,
    schedule_pass,
    scheduler_stats,
    set_status,
)
from .scheduler.metrics import PLACEMENTS, REJECTIONS
from .session_lists import SessionLists
from .vfolders import mount_permission

# Why sessions failed to start, by a fixed set of reasons (bounded label values).
START_FAILURES = Counter(
    "backendai_session_start_failures",
    "Sessions whose start failed (each attempt; retried or ended in ERROR), by reason",
    ["resource_group", "reason"],
)
START_RETRIES = Counter(
    "backendai_session_start_retries",
    "Sessions sent back to PENDING after a failed start",
    ["resource_group"],
)

SESSION_TYPES = tuple(t.value for t in SessionType)
# The broadcast of a session's state change to every manager (common/events.py).
SESSION_CHANGED = "session_changed"
CLUSTER_MODES = tuple(m.value for m in ClusterMode)
# Requests check_request passed (enqueue does not check them again); by identity, while alive.
_CHECKED_REQUESTS: weakref.WeakSet = weakref.WeakSet()
# Session.result once a session is dead: dependencies start only after SUCCESS.
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"


class BackendAIManager(SingletonConfigurable):
    """The manager: the record, the scheduler loop, the lifecycle, the agents.

    Settings tagged ``cluster=True`` are cluster-wide: in cluster mode (with
    ``c.BackendAICluster.etcd_url``) a value under ``<prefix>/config/manager/<name>``
    in etcd overrides this hub's configuration, live, for every hub of the cluster
    (manager/discovery.py); the embedded default takes them from the config only.
    """

    db_url = Unicode(
        help="""Database of the platform's record. SQLite (embedded default) or
        postgresql+psycopg2://... (cluster mode). Env: BACKENDAI_DB_URL.""",
    ).tag(config=True)

    @default("db_url")
    def _db_url_default(self):
        return os.environ.get("BACKENDAI_DB_URL", "sqlite:///backendai.sqlite")

    redis_url = Unicode(
        help="""Redis URL for the event bus (cluster mode). Empty: in-process bus
        (embedded default). Env: BACKENDAI_REDIS_URL.""",
    ).tag(config=True)

    @default("redis_url")
    def _redis_url_default(self):
        return os.environ.get("BACKENDAI_REDIS_URL", "")

    embedded_agent = Bool(
        True, help="Run one agent inside the hub process (embedded default)."
    ).tag(config=True)
    agent_token = Unicode(
        help="Shared secret for agent daemons' APIs (env BACKENDAI_AGENT_TOKEN)."
    ).tag(config=True)

    @default("agent_token")
    def _agent_token_default(self):
        return os.environ.get("BACKENDAI_AGENT_TOKEN", "")

    schedule_interval = Float(
        2.0, help="Seconds between scheduler passes when nothing wakes the scheduler."
    ).tag(config=True, cluster=True)
    agent_lost_timeout = Float(
        60.0, help="An agent silent this many seconds is LOST and gets no new kernels."
    ).tag(config=True, cluster=True)
    status_poll_interval = Float(
        2.0,
        help="""Safety poll while a spawner waits on its session: start(), progress()
        and the readiness wait are woken by the session's state changes, made in this
        process or by another manager (broadcast on the event bus: Redis in cluster
        mode), and re-read the record at least this often in case a broadcast was
        lost (Redis restarting).""",
    ).tag(config=True, cluster=True)
    claim_lease = Float(
        30.0,
        help="""Seconds a manager's claim on a session's current step (a start, a
        destroy) lasts without renewal (renewed every third of it while the step
        runs). Past it another manager, or this one restarted, takes the step over
        from what the record says. A claim of a process on this host that no longer
        exists is taken over at once.""",
    ).tag(config=True, cluster=True)
    start_deadline = Float(
        900.0,
        help="""A session still PREPARING or CREATING this many seconds after it was
        SCHEDULED is given up: what was created is removed and the start is retried
        (start_retries) or ends in ERROR with the reason.""",
    ).tag(config=True, cluster=True)
    agent_lost_grace = Float(
        60.0,
        help="""Seconds a RUNNING session on a LOST agent (silent past
        agent_lost_timeout) is kept, marked with the reason, in case the agent comes
        back with its kernels alive. Past it the session ends in ERROR and its slots
        are freed; kernels that reappear later are removed.""",
    ).tag(config=True, cluster=True)
    reconcile_interval = Float(
        30.0,
        help="""Seconds between reconciliations with every live agent (its kernels
        against the record: kernels the record does not know are removed, RUNNING
        sessions whose kernel vanished end in ERROR), so a lost event leaves nothing
        stuck. An agent that comes back from LOST is reconciled at once.""",
    ).tag(config=True, cluster=True)
    spawner_wait_lease = Float(
        30.0,
        help="""Seconds a session started by a JupyterHub spawner stays alive without
        the spawner waiting on it (start() renews it) before JupyterHub has
        taken the server over (its first poll()). A hub killed while a server was
        starting forgets that server; the session is then ended with the reason,
        instead of running where JupyterHub does not know it.""",
    ).tag(config=True, cluster=True)
    max_slots_per_session = Integer(
        0,
        help="""Refuse (400) a session of more than this many CPU cores in all its
        kernels (0: only agents' capacity and the policies limit it).""",
    ).tag(config=True, cluster=True)
    start_retries = Integer(
        2,
        help="""How many times a session that failed to start (agent error, image
        missing, container failure) goes back to PENDING to be placed again, with
        its slots released and the reason in its status; after that it ends in
        ERROR with the reason.""",
    ).tag(config=True, cluster=True)
    lifetime_check_interval = Float(
        10.0,
        help="""Seconds between checks of the keypair policies' idle_timeout and
        max_session_lifetime (done in the scheduler loop, so at most as often as
        it runs: see schedule_interval). A session past either is ended with the
        reason in its status_info: an idle interactive session TERMINATED, a
        session past its lifetime TERMINATED (interactive) or ERROR/FAILURE
        (batch, as a batch timeout). Idleness counts from the newest activity the
        hub reported for the user's server (Session.last_activity), or from
        RUNNING when there was none; batch sessions are never idle. Activity
        reaches the manager up to c.JupyterHub.last_activity_interval (300 s)
        plus c.Spawner.poll_interval (30 s) late: keep idle_timeout well above
        both, or lower them.""",
    ).tag(config=True, cluster=True)

    session_list_ttl = Float(
        2.0,
        help="""Seconds at most that the API answers a user's GET /sessions from memory
        (manager/session_lists.py). Every change of the user's sessions made or
        announced (session_changed broadcasts) drops the copy at once; this bounds
        how long a change that went unannounced (a lost broadcast) stays unseen.
        0: read the database on every request.""",
    ).tag(config=True, cluster=True)

    storage_proxies = Dict(
        help="""Storage proxy daemons (cluster mode) by name:
        {"nfs1": {"url": "http://storage1:6021", "token": "..."}}. A vfolder host is
        "<proxy>:<volume>". The proxy named "local" runs inside the hub unless it is
        listed here.""",
    ).tag(config=True)
    storage_volumes = Dict(
        help="""Volumes of the storage proxy inside the hub ("local"), by name:
        {"volume1": {"backend": "vfs", "path": "/srv/vfroot/volume1"}}. Default: one
        vfs volume "volume1" under ./backendai-vfroot. Agents bind-mount folders
        from these paths, so they must be the same on every node (an NFS mount)
        when agents run elsewhere.""",
    ).tag(config=True)

    @default("storage_volumes")
    def _storage_volumes_default(self):
        return {"volume1": {"backend": "vfs", "path": os.path.abspath("backendai-vfroot/volume1")}}

    default_vfolder_host = Unicode(
        tenancy.DEFAULT_VFOLDER_HOST,
        help="""Where new vfolders go when the request names no host; the default
        domain of a new installation may use it fully.""",
    ).tag(config=True, cluster=True)
    ssh_resource_groups = List(
        Unicode(),
        help="""Issue 12: resource groups whose sessions get SSH/SFTP from outside: the
        main kernel's sshd is published on a host port of its agent's range, for a key
        derived from the session's keypair (manager/sshkeys.py). Default: none (see
        docs/service-ports.md for the trade-off).""",
    ).tag(config=True, cluster=True)

    def __init__(self, **kw):
        super().__init__(**kw)
        # [issue 11 cluster plumbing, manager/discovery.py] node TLS and etcd discovery
        self.cluster = BackendAICluster(parent=self)
        self.storage = make_storage_registry(
            self.storage_proxies, self.storage_volumes, tls=self.cluster.tls_files()
        )
        self.engine = make_engine(self.db_url)
        self.sm = make_sessionmaker(self.engine)
        self.sm_read = make_read_sessionmaker(self.engine)
        self.bus = make_event_bus(self.redis_url or None)
        self.agent: LocalAgent | None = None
        # Agents running in this process (the embedded one and any attached), by id.
        self.local_agents: dict[str, LocalAgent] = {}
        self._wake = asyncio.Event()
        self._start_tasks: dict[str, asyncio.Task] = {}
        self._batch_timers: dict[str, asyncio.Task] = {}
        self._bg: set[asyncio.Task] = set()
        self._expiring: set[str] = set()  # batch sessions being ended for their timeout
        self._ending: set[str] = set()  # sessions being ended for their keypair policy's limits
        self._lifetime_checked = 0.0  # loop time of the last idle/lifetime sweep
        self._destroying: dict[str, asyncio.Future] = {}  # session id -> its destroy in flight
        self._loop_task: asyncio.Task | None = None
        self._started: asyncio.Future | None = None
        # This process's name in the record's claims, and its session-change events.
        self.owner_id = lifecycle.new_owner_id()
        self.events = lifecycle.SessionEvents()
        # The API's lists of a user's sessions, kept current by changes (session_lists.py).
        self.session_lists = SessionLists(self)
        # The front ends' façade: named operations instead of manager.db(fn) (ops.py).
        self.ops = Operations(self)
        self.session_lists.attach(self.sm)
        self._renewed = 0.0  # loop time of the last claim renewal
        self._reconciled = 0.0  # loop time of the last reconciliation with every agent
        self._reconciling: set[str] = set()  # agents being reconciled
        self._stale_said: dict[str, float] = {}  # agent id -> when its stale heartbeat was logged
        # Per agent, kernels its last reconciliation found ended without an exit code.
        self._dead_kernels: dict[str, set[str]] = {}
        self._stopped = False

    # -- lifecycle -------------------------------------------------------------

    def ensure_started(self) -> asyncio.Future:
        """Start once (idempotent); await the result before using the manager."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        return self._started

    async def ready(self) -> None:
        await self.ensure_started()

    async def _start(self) -> None:
        await asyncio.to_thread(upgrade, self.engine)
        await self.cluster.read_settings(self)  # cluster-wide settings from etcd, if any
        await self.db(tenancy.ensure_defaults, self.default_vfolder_host)
        await self.bus.start_consuming(self.handle_event)
        # Other managers' session changes wake this process's waiters; after a gap
        # (Redis away) every waiter re-reads the record.
        await self.bus.subscribe(self._on_broadcast, self._missed_broadcasts)
        await self.cluster.start(self)  # [issue 11] agents/storage proxies from etcd (cluster mode)
        if self.embedded_agent:
            self.agent = LocalAgent(self.bus, parent=self)
            await self.attach_agent(self.agent)
        self._loop_task = asyncio.create_task(self._scheduler_loop())

    async def attach_agent(self, agent: LocalAgent) -> None:
        """Run ``agent`` inside this process: start it, register it, reconcile its kernels.

        The embedded default has one; more than one lets a single process hold a
        multi-node cluster (tests, demos). Their kernels are reached directly,
        not over HTTP.
        """
        self.local_agents[agent.agent_id] = agent
        if agent.impl is None:
            await agent.start()
        # Register before anything else so that reconciling and scheduling see it.
        await self.db(_upsert_agent, agent.info())
        await self.reconcile(agent.agent_id, await agent.list_kernels())

    async def stop(self) -> None:
        lifecycle.owner_gone(self.owner_id)
        self._stopped = True
        if self._loop_task:
            self._loop_task.cancel()
        for t in [*self._start_tasks.values(), *self._batch_timers.values(), *self._bg]:
            t.cancel()
        for agent in self.local_agents.values():
            await agent.stop()
        await self.cluster.stop()  # [issue 11]
        await close_agent_clients()
        await self.bus.close()
        await self.storage.close()
        self.engine.dispose()

    async def db(self, fn, *args, **kw):
        """Run ``fn(db_session, ...)`` in one transaction in a worker thread."""

        def work():
            with self.sm.begin() as s:
                return fn(s, *args, **kw)

        return await asyncio.to_thread(work)

    async def db_read(self, fn, *args, **kw):
        """Like :meth:`db` for ``fn`` that only reads: on SQLite it neither waits for
        nor blocks writers (the API's GETs, status polls)."""

        def work():
            with self.sm_read() as s:
                return fn(s, *args, **kw)

        return await asyncio.to_thread(work)

    def _background(self, coro) -> None:
        """Run ``coro`` beside the caller (event handlers must not block the bus)."""
        task = asyncio.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _changed(self, sid: str, status: str | None = None) -> None:
        """Session ``sid`` changed (committed): wake this process's waiters now and
        tell every other manager (``session_changed`` broadcast, in the background:
        a transition never waits on the bus)."""
        self.events.changed(sid)
        self.session_lists.session_changed(sid)
        if self._stopped:
            return
        self._background(self._broadcast_change(sid, status))

    def _changed_many(self, sids: list[str], status: str) -> None:
        """Like :meth:`_changed` for many sessions (a scheduler pass's placements): one
        broadcast per 1,000 ids."""
        for sid in sids:
            self.events.changed(sid)
            self.session_lists.session_changed(sid)
        if self._stopped:
            return
        for i in range(0, len(sids), 1000):
            self._background(self._broadcast_change(None, status, sids[i:i + 1000]))

    async def _broadcast_change(self, sid: str | None, status: str | None,
                                many: list[str] | None = None) -> None:
        payload = {"status": status, "origin": self.owner_id}
        payload.update({"ids": many} if many is not None else {"id": sid})
        try:
            await self.bus.broadcast(SESSION_CHANGED, payload)
        except Exception as e:  # Redis away: the others' safety poll sees it
            self.log.debug("could not broadcast the change of session(s) %s: %s", sid or many, e)

    async def _on_broadcast(self, name: str, payload: dict) -> None:
        if name != SESSION_CHANGED or payload.get("origin") == self.owner_id:
            return
        for sid in payload.get("ids") or ([payload["id"]] if payload.get("id") else []):
            self.events.changed(sid)
            self.session_lists.session_changed(sid)

    def _missed_broadcasts(self) -> None:
        """The bus had a gap (Redis away): any session may have changed meanwhile."""
        self.events.changed_all()
        self.session_lists.invalidate_all()

    # -- agents ---------------------------------------------------------------

    def agent_client(self, agent_id: str, addr: str = "") -> AgentClient:
        if agent_id in self.local_agents:
            return InProcessAgentClient(self.local_agents[agent_id])
        if not addr:
            raise AgentError(f"agent {agent_id} has no address")
        return HTTPAgentClient(addr, self.agent_token, tls=self.cluster.tls_files())

    async def agent_clients(self, resource_group: str) -> list[AgentClient]:
        rows = await self.db(
            lambda s: [
                (a.id, a.addr)
                for a in s.scalars(
                    select(Agent).where(
                        Agent.resource_group == resource_group, Agent.status == AgentStatus.ALIVE
                    )
                )
            ]
        )
        return [self.agent_client(i, addr) for i, addr in rows]

    async def _client_for(self, agent_id: str) -> AgentClient:
        if agent_id in self.local_agents:
            return self.agent_client(agent_id)

        def addr(s):
            row = s.get(Agent, agent_id)
            return row.addr if row else ""

        return self.agent_client(agent_id, await self.db(addr))

    async def list_images(self, resource_group: str = "default") -> list[str]:
        names: set[str] = set()
        for c in await self.agent_clients(resource_group):
            try:
                names.update(i["name"] for i in await c.list_images())
            except AgentError:
                continue
        return sorted(names)

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
        destroys are left to their claim holders (:mod:`.lifecycle`).
        """
        alive = {r["kernel_id"] for r in records if r.get("alive")}
        present = {r["kernel_id"] for r in records}
        ended_codes = {
            r["kernel_id"]: r["exit_code"]
            for r in records
            if not r.get("alive") and r.get("exit_code") is not None
        }
        if before is None:
            before = await self.db_read(lifecycle.kernels_on, agent_id)
        known = await self.db_read(lifecycle.kernels_on, agent_id)
        running = {kid for kid, (_, st) in before.items() if st == SessionStatus.RUNNING
                   and known.get(kid, (None, None))[1] == SessionStatus.RUNNING}
        ended = sorted(running & set(ended_codes))
        # A kernel that ended without an exit code in the list (the local backend's when
        # the agent restarted meanwhile):
        # its exit event is likely on its way and says how it ended. Only one still
        # so at the agent's next reconciliation is taken as lost.
        dead = present - alive - set(ended_codes)
        dead_before = self._dead_kernels.get(agent_id, set())
        self._dead_kernels[agent_id] = dead
        vanished = {known[kid][0] for kid in running - present}
        # A session this process is starting or ending right now is its claim holder's
        # (a start that cleans up, an exit being handled): the next reconciliation
        # looks again if the kernel is still missing then.
        lost = sorted(sid for sid in vanished
                      if sid not in self._destroying and sid not in self._start_tasks)
        dead_lost = sorted({known[kid][0] for kid in running & dead & dead_before} - vanished)
        client = await self._client_for(agent_id)
        for kid in ended:
            await self._kernel_exited(kid, ended_codes[kid], await client.kernel_logs(kid))
        for sid in lost:
            await self.destroy_session(
                sid, SessionStatus.ERROR, f"kernel lost: agent {agent_id} no longer has it"
            )
        for sid in dead_lost:
            await self.destroy_session(
                sid, SessionStatus.ERROR,
                f"kernel lost: it ended on agent {agent_id} and no exit code was reported")
        for kid in sorted(present - set(known)):
            self.log.info("removing orphan kernel %s on %s", kid, agent_id)
            try:
                await client.destroy_kernel(kid)
            except BackendAIError as e:
                self.log.warning("could not remove orphan kernel %s on %s: %s", kid, agent_id, e.detail)

    async def reconcile_agent(self, agent_id: str) -> None:
        """Reconcile with one agent (in process or over HTTP); errors are logged."""
        if agent_id in self._reconciling:
            return
        self._reconciling.add(agent_id)
        try:
            before = await self.db_read(lifecycle.kernels_on, agent_id)
            records = await (await self._client_for(agent_id)).list_kernels()
            await self.reconcile(agent_id, records, before)
        except BackendAIError as e:
            self.log.warning("could not reconcile with agent %s: %s", agent_id, e.detail)
        except Exception:
            self.log.exception("could not reconcile with agent %s", agent_id)
        finally:
            self._reconciling.discard(agent_id)

    async def reconcile_all(self) -> None:
        """Reconcile with every live agent (every ``reconcile_interval`` seconds)."""
        ids = await self.db_read(lambda s: list(s.scalars(
            select(Agent.id).where(Agent.status == AgentStatus.ALIVE))))
        # H-agents: a few agents at a time. All at once queued 2-3 DB jobs per agent in the
        # worker threads, and every heartbeat's update waited behind them (p99 0.5 s at
        # 200 agents, benchmarks/agents.py).
        sem = asyncio.Semaphore(4)

        async def one(agent_id: str) -> None:
            async with sem:
                await self.reconcile_agent(agent_id)

        await asyncio.gather(*(one(a) for a in ids))

    # -- events ---------------------------------------------------------------

    async def handle_event(self, name: str, payload: dict) -> None:
        if name == "agent_heartbeat":
            if self._stale_heartbeat(payload):
                return
            # H-agents: a routine heartbeat is one autocommit UPDATE (manager/discovery.py).
            before = await self.cluster.record_heartbeat(self, payload)
            if before != AgentStatus.ALIVE and payload.get("id") not in self.local_agents:
                # New, or back from LOST (it may have restarted): agree with it now.
                self._background(self.reconcile_agent(payload["id"]))
            # H-agents: only a join or a return wakes the scheduler (a routine heartbeat
            # changes nothing a pass depends on; the periodic pass sees capacity changes).
            if before != AgentStatus.ALIVE:
                self._wake.set()
        elif name == "kernel_terminated":
            await self._kernel_exited(
                payload["kernel_id"], payload.get("exit_code"), payload.get("logs")
            )

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
        if age <= self.agent_lost_timeout:
            return False
        aid = str(payload.get("id"))
        now = time.monotonic()
        if now - self._stale_said.get(aid, -3600.0) >= 600:  # once per agent per 10 min
            self._stale_said[aid] = now
            self.log.warning(
                "heartbeat of agent %s is %.0f s old, past agent_lost_timeout (%g s): "
                "ignored. It was waiting in the event stream while no hub read it, or that "
                "agent's clock is behind this hub's; if the agent is alive and this repeats, "
                "synchronise the clocks (NTP)", aid, age, self.agent_lost_timeout)
        return True

    async def _kernel_exited(self, kernel_id: str, exit_code: int | None, logs: str | None) -> None:
        """Record a kernel's end; a running session whose kernel ended is over."""

        def record(s):
            k = s.get(Kernel, kernel_id)
            if k is None:
                return None
            # Lock the session: a start in flight decides on the same row.
            sess = s.get(Session, k.session_id, with_for_update=True, populate_existing=True)
            if k.exit_code is None and exit_code is not None:
                k.exit_code = exit_code
            if logs:
                k.logs = logs
            return sess.id, sess.status, sess.session_type, k.cluster_role, k.cluster_hostname, k.exit_code

        found = await self.db(record)
        if not found:
            return
        sid, status, session_type, role, hostname, code = found
        if status != SessionStatus.RUNNING:
            return  # starting (the start notices) or already on its way out
        status, result, info = _end_of_kernel(session_type, role, hostname, code)
        self._background(self.destroy_session(sid, status, info, result=result))

    # -- scheduling -------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    async def _scheduler_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.schedule_interval)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.schedule_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("scheduler pass failed")

    async def schedule_once(self) -> list[str]:
        for agent_id in self.local_agents:
            await self.db(_touch_agent, agent_id)
        await asyncio.to_thread(lost_agents, self.sm, self.agent_lost_timeout)
        await self._expire_batches()
        await self._enforce_lifetimes()
        groups = await self.db(
            lambda s: list(s.scalars(select(ResourceGroup.name).where(ResourceGroup.is_active)))
        )
        placed = []
        for g in groups:
            placed += await asyncio.to_thread(schedule_pass, self.sm, g)
        self._changed_many(placed, SessionStatus.SCHEDULED)
        for sid in placed:
            self._begin_start(sid)
        await self.drive_lifecycle()
        # A pass may have changed waiting sessions' reasons: their watchers re-read.
        self.events.changed_all()
        return placed

    def _begin_start(self, sid: str, dead_owner: str | None = None) -> None:
        if sid not in self._start_tasks:
            self._start_tasks[sid] = asyncio.create_task(self._start_session(sid, dead_owner))

    def _end_once(self, sid: str, status: str, info: str, result: str | None = None) -> None:
        """End ``sid`` in the background unless this process is ending it already."""
        if sid in self._ending or sid in self._destroying:
            return
        self._ending.add(sid)
        self.log.info("ending session %s: %s", sid, info)
        task = asyncio.create_task(self.destroy_session(sid, status, info, result=result))
        self._bg.add(task)
        task.add_done_callback(lambda t, sid=sid: (self._bg.discard(t), self._ending.discard(sid)))

    async def drive_lifecycle(self) -> None:
        """The status handlers (:mod:`.lifecycle`): drive forward every session whose
        step nobody drives, from what the record says. Run by the scheduler loop."""
        loop_now = asyncio.get_running_loop().time()
        if loop_now - self._renewed >= self.claim_lease / 3:
            self._renewed = loop_now
            await self.db(lifecycle.renew, [*self._start_tasks, *self._destroying],
                          self.owner_id, self.claim_lease)
        now = utcnow()
        handled: set[str] = set()  # sessions given to a handler in this round
        for sid, status, owner, lease, history in await self.db_read(lifecycle.due_sessions, now):
            scheduled_at = (history or {}).get(SessionStatus.SCHEDULED)
            late = status in (SessionStatus.PREPARING, SessionStatus.CREATING) and scheduled_at and (
                dt.datetime.fromisoformat(scheduled_at) + dt.timedelta(seconds=self.start_deadline) <= now)
            if late:
                handled.add(sid)
                self._background(self._recover_start(
                    sid, None, f"it did not start within start_deadline ({self.start_deadline:g} s)"))
                continue
            if sid in self._start_tasks or sid in self._destroying:
                continue  # this process drives it
            dead = owner if lifecycle.owner_is_dead(owner, self.owner_id) else None
            if not (owner is None or owner == self.owner_id or dead or lease is None or lease < now):
                continue  # another live manager drives it
            handled.add(sid)
            if status == SessionStatus.SCHEDULED:
                self._begin_start(sid, dead)
            elif status in (SessionStatus.PREPARING, SessionStatus.CREATING):
                self._background(self._recover_start(
                    sid, dead, "start interrupted: the manager starting it stopped"))
            elif status == SessionStatus.TERMINATING:
                self._background(self._finish_termination(sid, dead))
        await self._handle_lost_agents(now)
        for sid in await self.db_read(lifecycle.abandoned_sessions, now):
            if sid in handled:
                continue  # its handler first (a start's leftovers removed); ended next round
            self._end_once(sid, SessionStatus.TERMINATED,
                           "JupyterHub no longer waits for this server (the hub stopped while it "
                           "was starting); start it again", FAILURE)
        if loop_now - self._reconciled >= self.reconcile_interval:
            self._reconciled = loop_now
            self._background(self.reconcile_all())

    async def _recover_start(self, sid: str, dead_owner: str | None, reason: str) -> None:
        """A start nobody drives any more (or past its deadline): remove what it created,
        then retry or fail with ``reason``."""
        starting = {SessionStatus.PREPARING, SessionStatus.CREATING}
        if not await self.db(lifecycle.claim, sid, starting, self.owner_id, self.claim_lease,
                             dead_owner):
            return
        task = self._start_tasks.pop(sid, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        sess = await self.db(_load_session, sid)
        if sess is None or sess.status not in starting:
            return
        self.log.warning("session %s: %s", sid, reason)
        await self._destroy_kernels({k.id: k.agent_id for k in sess.kernels if k.agent_id})
        await self._start_failed(sid, reason, "interrupted")

    async def _finish_termination(self, sid: str, dead_owner: str | None) -> None:
        """A destroy nobody drives any more: finish it, ending as it was meant to."""
        if not await self.db(lifecycle.claim, sid, {SessionStatus.TERMINATING}, self.owner_id,
                             self.claim_lease, dead_owner):
            return
        sess = await self.db(_load_session, sid)
        if sess is None or sess.status != SessionStatus.TERMINATING:
            return
        await self.destroy_session(sid, sess.end_status or SessionStatus.ERROR, sess.status_info)

    async def _handle_lost_agents(self, now: dt.datetime) -> None:
        """RUNNING sessions on LOST agents: marked with the reason at once, ended (ERROR,
        slots freed) after ``agent_lost_grace``; unmarked when their agent returns."""
        for sid, info, aid, hb in await self.db_read(lifecycle.sessions_on_lost_agents):
            silent = (now - hb).total_seconds()
            if silent >= self.agent_lost_timeout + self.agent_lost_grace:
                self._end_once(sid, SessionStatus.ERROR,
                               f"agent {aid} was lost: no heartbeat for {silent:.0f} s "
                               f"(agent_lost_timeout {self.agent_lost_timeout:g} s + "
                               f"agent_lost_grace {self.agent_lost_grace:g} s)")
            elif not (info or "").startswith(lifecycle.LOST_MARK):
                ends = hb + dt.timedelta(seconds=self.agent_lost_timeout + self.agent_lost_grace)
                if await self.db(lifecycle.mark_lost, sid,
                                 f"{lifecycle.LOST_MARK}{aid} is silent since {hb:%H:%M:%S} UTC; "
                                 f"the session ends at {ends:%H:%M:%S} UTC unless it returns"):
                    self._changed(sid, SessionStatus.RUNNING)
        for sid in await self.db(lifecycle.unmark_returned):
            self._changed(sid, SessionStatus.RUNNING)

    def consistency_problems(self) -> list[str]:
        return check_consistency(self.sm)

    async def scheduler_status(self) -> dict:
        """Per resource group: queue length, oldest wait, pending sessions by reason,
        placements and rejections by reason, start failures by reason (admin API).

        The counters are the Prometheus metrics served on ``/hub/metrics``, as this
        process counted them since it started; the queue figures are read from the record.
        """
        out = await asyncio.to_thread(scheduler_stats, self.sm)
        for rg, st in out.items():
            st["placements"] = int(_counter_value(PLACEMENTS, resource_group=rg))
            st["rejections"] = _counter_by(REJECTIONS, "reason", resource_group=rg)
            st["start_failures"] = _counter_by(START_FAILURES, "reason", resource_group=rg)
        return out

    # -- sessions ---------------------------------------------------------------

    def parse_request(self, options: dict) -> tuple[str, ResourceSlot]:
        """Validate user options into (image, slots per kernel); raise InvalidRequest."""
        if not isinstance(options, dict):
            raise InvalidRequest("options must be an object")
        unknown = {k for k in options
                   if k not in ("image", "cpu", "mem", "gpu", "resource_group")
                   and not k.startswith(MIG_PREFIX)}  # MIG names: checked by resources()
        if unknown:
            raise InvalidRequest(f"unknown option(s): {', '.join(sorted(unknown))}")
        return session_request.resources(options)

    async def check_request(self, request: SessionRequest) -> SessionRequest:
        """What of ``request`` depends on the record (:meth:`validate`: the image, an
        agent that could ever fit it), checked once: :meth:`enqueue` does not check a
        request again that passed here."""
        await self.validate(
            request.image, request.slots, request.resource_group,
            cluster_size=request.cluster_size, cluster_mode=request.cluster_mode.value,
            architecture=request.architecture, designated_agents=request.designated_agents)
        _CHECKED_REQUESTS.add(request)
        return request

    async def validate(
        self,
        image: str,
        slots: ResourceSlot,
        resource_group: str,
        *,
        cluster_size: int = 1,
        cluster_mode: str = "single-node",
        architecture: str | None = None,
        designated_agents: list[str] | tuple = (),
    ) -> None:
        """Reject what can never run: unknown image, below image minimum, beyond any agent.

        ``slots`` are per kernel. A single-node session needs all its kernels on
        one agent; a multi-node one needs ``cluster_size`` distinct agents that
        each fit one kernel.
        """
        assert all(is_known_slot(k) for k in slots)
        cores = slots.get(CPU, 0) * cluster_size
        if self.max_slots_per_session and cores > self.max_slots_per_session:
            raise InvalidRequest(
                f"a session may use at most {self.max_slots_per_session} CPU cores here "
                f"(max_slots_per_session); {cores:g} requested")
        rows = await self.db(
            lambda s: [
                (a.id, a.architecture, a.available_slots)
                for a in s.scalars(
                    select(Agent).where(
                        Agent.resource_group == resource_group, Agent.status == AgentStatus.ALIVE
                    )
                )
            ]
        )
        if not rows:
            raise InvalidRequest(f"resource group {resource_group!r} has no live agent")
        if designated_agents:
            unknown = sorted(set(designated_agents) - {r[0] for r in rows})
            if unknown:
                raise InvalidRequest(
                    f"designated agent(s) {', '.join(unknown)} not alive in resource group "
                    f"{resource_group!r}"
                )
            rows = [r for r in rows if r[0] in designated_agents]
        if architecture:
            rows = [r for r in rows if r[1] == architecture]
            if not rows:
                raise InvalidRequest(
                    f"no agent with architecture {architecture!r} in resource group {resource_group!r}"
                )
        caps = [r[2] for r in rows]
        if cluster_mode == "single-node":
            need = ResourceSlot()
            for _ in range(cluster_size):
                need = need + slots
            if not any(need.fits_in(c) for c in caps):
                largest = max(caps, key=lambda c: (c.get(CPU, 0), c.get(MEM, 0)))
                over = _beyond_every_agent(need, caps)
                if over:
                    raise InvalidRequest(over)
                what = "requested" if cluster_size == 1 else f"{cluster_size} kernels on one agent need"
                raise InvalidRequest(
                    f"{what} {need.nonzero().human()} exceeds what any agent has "
                    f"(largest: {largest.nonzero().human()})"
                )
        else:
            fitting = sum(1 for c in caps if slots.fits_in(c))
            if fitting < cluster_size:
                raise InvalidRequest(
                    f"a multi-node session of {cluster_size} kernels of {slots.nonzero().describe()} "
                    f"needs {cluster_size} agents that each fit one; {fitting} do"
                )
        info = None
        errors = []
        for client in await self.agent_clients(resource_group):
            try:
                info = await client.image_info(image)
                break
            except BackendAIError as e:
                errors.append(e.detail)
        if info is None:
            raise InvalidRequest(f"unknown image {image!r}: {errors[0] if errors else ''}".strip(": "))
        prefix = "ai.backend.resource.min."
        minimums = ResourceSlot()
        for key, value in info["labels"].items():
            if key.startswith(prefix):
                slot = key[len(prefix) :]
                minimums[slot] = parse_size(value) if slot == MEM else Decimal(value)
        if any(slots.get(slot, Decimal(0)) < v for slot, v in minimums.items()):
            # "needs at least 0.25 cores and 256 MiB memory": every minimum, in human units.
            words = format_slots(minimums.nonzero()).rsplit(", ", 1)
            raise InvalidRequest(f"image {image} needs at least {' and '.join(words)}")

    async def enqueue(
        self,
        request: SessionRequest | None = None,
        *,
        username: str,
        name: str,
        environ: dict,
        service_prefix: str,
        home_folder: str | None = None,
        awaited_for: float | None = None,
        **fields,
    ) -> str:
        """Record a PENDING session of ``request`` (a :class:`SessionRequest`, or its
        fields as keywords, which build one); returns its id.

        ``slots`` are per kernel; the session has ``cluster_size`` kernels.
        ``project`` is a project id or name in the user's domain (default: the
        user's first project). ``mounts``: vfolders (names or ids) mounted in
        every kernel at ``/home/work/<name>``, checked against what the user may
        mount in that project (:func:`.mounts.resolve_mounts`); the user's folders
        named ``.<name>`` are mounted too (automount). ``home_folder``: the name
        of the user's home folder, made when missing (:func:`.mounts.ensure_home`)
        and mounted at ``/home/work`` itself. ``awaited_for``: a JupyterHub spawner
        waits on the session (seconds, renewed by :meth:`await_session`; see
        ``spawner_wait_lease``). Raises a
        :class:`BackendAIError` (4xx) for
        anything the caller got wrong, including what the scheduler's admission
        refuses (pending limits, containers per session, priority cap, resource
        group permission); nothing is created then.
        """
        if request is None:
            # The request's fields as keywords (image=, slots=, session_type=, project=,
            # cluster_size=, ... as SessionRequest): the one validation, here.
            try:
                request = SessionRequest(**fields)
            except TypeError as e:
                raise TypeError(f"enqueue: {e}") from None
        elif fields:
            raise TypeError(f"enqueue: a request and its fields ({', '.join(sorted(fields))})")
        if request not in _CHECKED_REQUESTS:
            await self.check_request(request)
        r = request
        image, slots, resource_group, project = r.image, r.slots, r.resource_group, r.project
        session_type, cluster_mode = r.session_type.value, r.cluster_mode.value
        cluster_size, priority, starts_at = r.cluster_size, r.priority, r.starts_at
        startup_command, batch_timeout, architecture = (
            r.startup_command, r.batch_timeout, r.architecture)
        dependencies, designated_agents, mounts = (
            list(r.dependencies), list(r.designated_agents), list(r.mounts))
        if home_folder:
            # Kept when the session is refused below: it is the user's, like any folder.
            await vfmounts.ensure_home(self, username, home_folder)

        def create(s):
            user = s.scalar(select(User).where(User.username == username))
            if user is None:
                raise NotFound(f"no Backend.AI user {username!r}")
            if user.status != UserStatus.ACTIVE:
                raise InvalidRequest(f"user {username!r} is {user.status}")
            kp = tenancy.default_keypair(s, user)
            if kp is None:
                raise InvalidRequest(f"user {username!r} has no active keypair")
            live = s.scalar(
                select(Session).where(
                    Session.access_key == kp.access_key,
                    Session.name == name,
                    Session.alive_marker.is_not(None),
                )
            )
            if live is not None:
                raise Conflict(f"session {name!r} already exists ({live.status})")
            proj = _session_project(user, project)
            resolved = vfmounts.session_mounts(s, user, proj, mounts, kp, home_folder)
            sess = Session(
                name=name,
                session_type=session_type,
                user_id=user.id,
                access_key=kp.access_key,
                domain_name=user.domain_name,
                project_id=proj.id if proj else None,
                resource_group=resource_group,
                image=image,
                cluster_size=cluster_size,
                cluster_mode=cluster_mode,
                requested_slots=slots,
                environ=environ,
                service_prefix=service_prefix,
                startup_command=startup_command,
                batch_timeout=batch_timeout,
                starts_at=starts_at,
                designated_agents=list(designated_agents),
                architecture=architecture,
                vfolder_mounts=resolved,
                retries=0,
                result="UNDEFINED",
            )
            if awaited_for is not None:
                sess.awaited_until = utcnow() + dt.timedelta(seconds=awaited_for)
            sess.priority = 50 if priority is None else priority
            for dep in dependencies:
                other = s.get(Session, dep)
                if other is None or other.access_key != kp.access_key:
                    raise InvalidRequest(f"unknown dependency session {dep!r}")
                sess.dependencies.append(other)
            set_status(sess, SessionStatus.PENDING, "waiting for the scheduler")
            sess.kernels.extend(_new_kernels(slots, cluster_size))
            # Still transient here: admission sees the request, not a queued row.
            admit(s, sess)
            s.add(sess)
            s.flush()
            return sess.id

        sid = await self.db(create)
        self._changed(sid, SessionStatus.PENDING)
        self.wake()
        return sid

    async def _transition(self, sid: str, frm: set, to: str, info: str = "") -> bool:
        """``frm`` -> ``to`` (:func:`.lifecycle.transition`), this process claiming the step."""
        done = await self.db(lifecycle.transition, sid, frm, to, info, owner=self.owner_id,
                             lease=self.claim_lease)
        if done:
            self._changed(sid, to)
            await self._fault_hold(to)
        return done

    async def _fault_hold(self, status: str) -> None:
        """Fault injection for tests: ``BACKENDAI_FAULT_HOLD=CREATING=60`` holds every
        session this many seconds once it reaches that status (so a test can kill the
        hub there). Never set in production."""
        spec = os.environ.get("BACKENDAI_FAULT_HOLD", "")
        for part in filter(None, spec.split(",")):
            st, _, secs = part.partition("=")
            if st.strip() == status:
                self.log.warning("BACKENDAI_FAULT_HOLD: holding in %s for %s s", status, secs)
                await asyncio.sleep(float(secs))

    async def _start_session(self, sid: str, dead_owner: str | None = None) -> None:
        """SCHEDULED -> PREPARING -> CREATING -> RUNNING, every kernel or none.

        Only with the session's claim (:func:`.lifecycle.claim`): of several managers,
        one starts it. Kernels are created concurrently on their agents. If any
        fails, the ones created are removed and the session goes back to the queue
        (bounded by ``start_retries``) with its slots released.
        """
        created: dict[str, str] = {}  # kernel id -> agent id
        try:
            await self._fault_hold(SessionStatus.SCHEDULED)
            if not await self.db(lifecycle.claim, sid, {SessionStatus.SCHEDULED}, self.owner_id,
                                 self.claim_lease, dead_owner):
                return
            sess = await self.db(_load_session, sid)
            if sess is None:
                return
            kernels = list(sess.kernels)
            agents = await self.db(
                lambda s: {
                    a.id: (a.addr, a.backend)
                    for a in s.scalars(select(Agent).where(Agent.id.in_({k.agent_id for k in kernels})))
                }
            )
            clients = {aid: self.agent_client(aid, addr) for aid, (addr, _) in agents.items()}
            if not await self._transition(
                sid, {SessionStatus.SCHEDULED}, SessionStatus.PREPARING, "checking the image"
            ):
                return
            await asyncio.gather(*(c.image_info(sess.image) for c in clients.values()))
            mounts = await self._mount_specs(
                sess, mount_points=any(b != "local" for _, b in agents.values()))
            n = len(kernels)
            what = "starting the container" if n == 1 else f"starting {n} containers"
            if not await self._transition(
                sid, {SessionStatus.PREPARING}, SessionStatus.CREATING, what
            ):
                return
            owner = await self.db(lambda s: s.get(User, sess.user_id).username)
            ssh_key = None
            if sess.resource_group in self.ssh_resource_groups:  # issue 12: opted in
                ssh_key = await self.db_read(
                    sshkeys.session_public_key, sess, self.ssh_resource_groups)
            specs = self._kernel_specs(sess, kernels, agents, owner, mounts, ssh_key=ssh_key)

            async def create(k, spec):
                rec = await clients[k.agent_id].create_kernel(spec)
                created[k.id] = k.agent_id
                return rec

            results = await asyncio.gather(
                *(create(k, spec) for k, spec in zip(kernels, specs, strict=True)),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]
            recs = dict(zip([k.id for k in kernels], results, strict=True))

            def running(s):
                se = s.get(Session, sid, with_for_update=True, populate_existing=True)
                if se is None or se.status != SessionStatus.CREATING:
                    return "gone", None
                rows = {k.id: k for k in s.scalars(select(Kernel).where(Kernel.session_id == sid))}
                exited = [k for k in rows.values() if k.exit_code is not None]
                if exited and (se.session_type != BATCH or any(k.cluster_role != "main" for k in exited)):
                    k = exited[0]
                    return "failed", f"kernel {k.cluster_hostname} exited with code {k.exit_code} while starting"
                for kid, rec in recs.items():
                    k = rows[kid]
                    k.container_id = rec["container_id"]
                    k.kernel_host = rec["host"]
                    k.service_ports = rec["service_ports"]
                    k.attached_devices = {"cuda": rec.get("cuda_devices", [])}
                    k.status = SessionStatus.RUNNING
                set_status(se, SessionStatus.RUNNING, "running")
                se.owner = se.lease_until = None  # the start is done
                return "running", exited[0].id if exited else None

            outcome, detail = await self.db(running)
            self._changed(sid, SessionStatus.RUNNING if outcome == "running" else None)
            if outcome == "gone":
                await self._destroy_kernels(created)
                return
            if outcome == "failed":
                raise KernelExitedWhileStarting(detail)
            if sess.session_type == BATCH:
                self._arm_batch_timer(sid, sess.batch_timeout)
                if detail:  # the command finished before the session was marked running
                    main = await self.db(lambda s: s.get(Kernel, detail))
                    await self._kernel_exited(main.id, main.exit_code, None)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            reason = e.detail if isinstance(e, BackendAIError) else f"{type(e).__name__}: {e}"
            self.log.error("session %s failed to start: %s", sid, reason)
            await self._destroy_kernels(created)
            await self._start_failed(sid, reason, _failure_reason(e))
        finally:
            if self._start_tasks.get(sid) is asyncio.current_task():
                del self._start_tasks[sid]

    async def _mount_specs(self, sess: Session, mount_points: bool = False) -> list[dict]:
        """The session's vfolders as the agents mount them (``spec["mounts"]``).

        Checked again at each start: a folder deleted (or being deleted) since the
        session was queued, one its user may no longer mount, or a storage proxy that
        does not answer fails the start with the reason, and the start is retried
        like any other failure. The mode follows the user's permission at start.

        With a home folder at /home/work and ``mount_points`` (container backends),
        the directories the other folders mount on are made in the home first,
        owned like the home's files: otherwise the engine makes them, owned by
        root, and they stay behind (a root-owned ``~/.local`` breaks ``pip install
        --user`` once that folder is gone).
        """
        if not sess.vfolder_mounts:
            return []

        def states(s):
            user = s.get(User, sess.user_id)
            return {f.id: (f.status, mount_permission(s, user, f)) for f in s.scalars(
                select(VFolder).where(VFolder.id.in_([m["id"] for m in sess.vfolder_mounts])))}

        found = await self.db_read(states)
        out = []
        for m in sess.vfolder_mounts:
            status, permission = found.get(m["id"], (None, None))
            if status is None:
                raise VFolderUnavailable(f"vfolder {m['name']!r} was deleted")
            if status != VFolderStatus.READY:
                raise VFolderUnavailable(f"vfolder {m['name']!r} is {status}")
            if permission is None:  # unshared, or the user left the project, since enqueue
                raise VFolderUnavailable(f"vfolder {m['name']!r} may no longer be mounted by its user")
            try:
                source = await self.storage.mount_path(m["host"], m["quota_scope_id"], m["id"])
            except BackendAIError as e:
                raise VFolderUnavailable(
                    f"vfolder {m['name']!r} on {m['host']} is unreachable: {e.detail}") from None
            except OSError as e:
                raise VFolderUnavailable(
                    f"vfolder {m['name']!r} on {m['host']} is unreachable: {e}") from None
            # The permission of now: a share narrowed to ro since enqueue mounts ro.
            out.append({"source": source, "target": m["target"],
                        "mode": "ro" if permission == "ro" else "rw"})
        home = next((m for m in sess.vfolder_mounts if m["target"] == vfmounts.MOUNT_ROOT), None)
        if home is not None and mount_points:
            for m in sess.vfolder_mounts:
                if m is home:
                    continue
                name = m["target"][len(vfmounts.MOUNT_ROOT) + 1:]
                try:
                    await self.storage.mkdir(home["host"], home["quota_scope_id"], home["id"],
                                             name, parents=True)
                except BackendAIError as e:
                    raise VFolderUnavailable(
                        f"vfolder {m['name']!r} cannot be mounted at {m['target']} in your home "
                        f"folder: {e.detail}") from None
                except OSError as e:
                    raise VFolderUnavailable(
                        f"vfolder {m['name']!r} cannot be mounted at {m['target']}: {e}") from None
        return out

    def _kernel_specs(self, sess: Session, kernels: list[Kernel], agents: dict, owner: str,
                      mounts: list[dict] = (), ssh_key: str | None = None) -> list[dict]:
        """What each agent gets: the main kernel serves Jupyter (or runs the batch
        command), the others idle; all know the session's cluster and mount the
        session's vfolders. ``ssh_key``: the public key the main kernel's sshd is
        published for (issue 12, :func:`sshkeys.session_public_key`)."""
        hosts = [_cluster_host(k, sess.id, *agents[k.agent_id], self.local_agents) for k in kernels]
        cluster_env = {
            "BACKENDAI_SESSION_ID": sess.id,
            "BACKENDAI_SESSION_TYPE": sess.session_type,
            "BACKENDAI_CLUSTER_SIZE": str(len(kernels)),
            "BACKENDAI_CLUSTER_MODE": sess.cluster_mode,
            "BACKENDAI_CLUSTER_HOSTNAMES": ",".join(k.cluster_hostname for k in kernels),
            "BACKENDAI_CLUSTER_HOSTS": ",".join(hosts),
        }
        # multinode (issue 15): one SSH keypair per session start for its kernels
        # (main1 -> sub1 without a password), and how many agents the kernels span
        # (more than one: the agents put them on a Swarm overlay network).
        cluster_ssh = _cluster_ssh_keypair(sess.id) if len(kernels) > 1 else None
        n_agents = len({k.agent_id for k in kernels})
        specs = []
        for k, host in zip(kernels, hosts, strict=True):
            main = k.cluster_role == "main"
            env = dict(sess.environ or {})
            if not main:
                # Only the main kernel talks to the hub as the user's server.
                env = {key: v for key, v in env.items() if not key.startswith("JUPYTERHUB_")}
            env.update(cluster_env)
            env.update(
                BACKENDAI_KERNEL_ID=k.id,
                BACKENDAI_CLUSTER_ROLE=k.cluster_role,
                BACKENDAI_CLUSTER_IDX=str(k.cluster_idx),
                BACKENDAI_CLUSTER_HOST=k.cluster_hostname,
                BACKENDAI_CLUSTER_ADDR=host,
            )
            kernel_type = IDLE
            if main:
                kernel_type = BATCH if sess.session_type == BATCH else INTERACTIVE
            specs.append(
                {
                    "kernel_id": k.id,
                    "session_id": sess.id,
                    "owner": owner,
                    "image": sess.image,
                    "slots": k.requested_slots.to_json(),
                    "environ": env,
                    "service_prefix": sess.service_prefix,
                    "kernel_type": kernel_type,
                    "command": sess.startup_command if kernel_type == BATCH else None,
                    "cluster_hostname": k.cluster_hostname,
                    "network_alias": _network_alias(k, sess.id),
                    "mounts": [dict(m) for m in mounts],
                    "cluster_role": k.cluster_role,
                    "cluster_agents": n_agents,
                    "cluster_ssh": cluster_ssh,
                    **({"ssh_public_key": ssh_key} if main and ssh_key else {}),
                }
            )
        return specs

    async def _destroy_kernels(self, kernels: dict[str, str]) -> None:
        """Remove kernels (id -> agent id) on their agents, concurrently; failures are logged."""

        async def one(kid, aid):
            try:
                await (await self._client_for(aid)).destroy_kernel(kid)
            except BackendAIError as e:
                self.log.warning("could not destroy kernel %s on %s: %s", kid, aid, e.detail)

        await asyncio.gather(*(one(k, a) for k, a in kernels.items()))

    async def _start_failed(self, sid: str, reason: str, kind: str = "other") -> None:
        """Release the slots; back to PENDING for another try, or ERROR once tries are used up."""
        done = await self.db(lifecycle.start_failed, sid, reason, self.start_retries, _new_kernels)
        if done:
            rg, outcome = done
            START_FAILURES.labels(resource_group=rg, reason=kind).inc()
            if outcome == "retry":
                START_RETRIES.labels(resource_group=rg).inc()
        self._changed(sid, (SessionStatus.PENDING if done[1] == "retry" else SessionStatus.ERROR)
                      if done else None)
        self.wake()

    # -- batch sessions ------------------------------------------------------------

    def _arm_batch_timer(self, sid: str, timeout: int | None) -> None:
        if not timeout:
            return

        async def expire():
            await asyncio.sleep(timeout)
            self._batch_timers.pop(sid, None)
            await self.destroy_session(sid, SessionStatus.ERROR, "batch timeout", result=FAILURE)

        old = self._batch_timers.pop(sid, None)
        if old:
            old.cancel()
        self._batch_timers[sid] = asyncio.create_task(expire())

    async def _expire_batches(self) -> None:
        """Fail batch sessions past their timeout that no timer here watches (after a restart,
        or started by another manager)."""

        def find(s):
            now = utcnow()
            late = []
            for sess in s.scalars(
                select(Session).where(
                    Session.status == SessionStatus.RUNNING,
                    Session.session_type == BATCH,
                    Session.batch_timeout.is_not(None),
                )
            ):
                since = (sess.status_history or {}).get(SessionStatus.RUNNING)
                if since and dt.datetime.fromisoformat(since) + dt.timedelta(
                    seconds=sess.batch_timeout
                ) <= now:
                    late.append(sess.id)
            return late

        for sid in await self.db(find):
            if sid in self._batch_timers or sid in self._expiring:
                continue
            self._expiring.add(sid)
            task = asyncio.create_task(
                self.destroy_session(sid, SessionStatus.ERROR, "batch timeout", result=FAILURE)
            )
            self._bg.add(task)
            task.add_done_callback(lambda t, sid=sid: (self._bg.discard(t), self._expiring.discard(sid)))

    # -- keypair policy limits: idle_timeout, max_session_lifetime --------------------

    async def record_activity(self, sid: str, when: dt.datetime) -> bool:
        """Note activity of session ``sid`` at ``when`` (naive means UTC).

        Only ever moves ``last_activity`` forward: a late or repeated report of
        older activity changes nothing. True when the record moved.
        """
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)

        def work(s):
            return s.execute(
                update(Session)
                .where(
                    Session.id == sid,
                    or_(Session.last_activity.is_(None), Session.last_activity < when),
                )
                .values(last_activity=when)
                .execution_options(synchronize_session=False)
            ).rowcount

        return bool(await self.db(work))

    async def _enforce_lifetimes(self, force: bool = False) -> list[str]:
        """End RUNNING sessions past their keypair policy's max_session_lifetime, and
        interactive ones idle longer than its idle_timeout; at most every
        ``lifetime_check_interval`` seconds unless ``force``. Returns the ids being ended.

        Another manager may find the same sessions: ``destroy_session`` of a session
        already dead does nothing, so each is ended once.
        """
        loop_now = asyncio.get_running_loop().time()
        if not force and loop_now - self._lifetime_checked < self.lifetime_check_interval:
            return []
        self._lifetime_checked = loop_now
        found = await self.db_read(_past_policy_limits, utcnow())
        ending = []
        for sid, status, info, result in found:
            if sid in self._ending or sid in self._destroying:
                continue
            self._ending.add(sid)
            ending.append(sid)
            self.log.info("ending session %s: %s", sid, info)
            task = asyncio.create_task(self.destroy_session(sid, status, info, result=result))
            self._bg.add(task)
            task.add_done_callback(lambda t, sid=sid: (self._bg.discard(t), self._ending.discard(sid)))
        return ending

    async def session_logs(self, sid: str, kernel_idx: int = 0) -> str:
        """A kernel's output (the main one by default): live from its agent while it
        runs, else what was kept when it ended ("" when nothing was)."""
        sess = await self.get_session(sid)
        if sess is None:
            raise NotFound(f"no session {sid!r}")
        kernel = next((k for k in sess.kernels if k.cluster_idx == kernel_idx), None)
        if kernel is None:
            raise NotFound(f"session {sid!r} has no kernel {kernel_idx}")
        if sess.status in (SessionStatus.RUNNING, SessionStatus.TERMINATING) and kernel.agent_id:
            try:
                live = await (await self._client_for(kernel.agent_id)).kernel_logs(kernel.id)
            except BackendAIError as e:
                self.log.warning("could not read logs of kernel %s: %s", kernel.id, e.detail)
                live = None
            if live is not None:
                return live
            sess = await self.get_session(sid)  # it may have ended meanwhile
            kernel = next(k for k in sess.kernels if k.cluster_idx == kernel_idx)
        return kernel.logs or ""

    # -- ending ---------------------------------------------------------------------

    async def _terminate(
        self, sid: str, status: str, info: str, result: str | None = None,
        logs: dict[str, str] | None = None,
    ) -> None:
        """Mark dead and free the slots, in one transaction (:func:`.lifecycle.terminate`)."""
        if await self.db(lifecycle.terminate, sid, status, info, result, logs):
            self._changed(sid, status)
        else:
            self.events.changed(sid)
        self.wake()

    async def destroy_session(
        self,
        sid: str,
        status: str = SessionStatus.TERMINATED,
        info: str = "stopped",
        *,
        result: str | None = None,
    ) -> None:
        """Stop whatever the session has become, remove its kernels, free its slots.

        ``result`` (SUCCESS / FAILURE) defaults from ``status``: a stopped
        interactive session succeeded, a batch session stopped before its
        command finished did not, an error is a failure.

        One destroy per session at a time: a second caller (a user's stop beside a
        batch timeout, say) waits for the one in flight, then finds the session dead.
        Two at once would race, and the one that lost the kernels' logs could end it.
        """
        while (inflight := self._destroying.get(sid)) is not None:
            await asyncio.shield(inflight)
        done = asyncio.get_running_loop().create_future()
        self._destroying[sid] = done
        try:
            await self._destroy_session(sid, status, info, result)
        finally:
            del self._destroying[sid]
            done.set_result(None)

    async def _destroy_session(self, sid: str, status: str, info: str, result: str | None) -> None:
        task = self._start_tasks.pop(sid, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        timer = self._batch_timers.pop(sid, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        sess = await self.db(_load_session, sid)
        if sess is None or sess.status in DEAD_STATUSES:
            return
        if result is None and sess.session_type == BATCH and status == SessionStatus.TERMINATED:
            result = FAILURE
        if sess.status == SessionStatus.PENDING:
            await self._terminate(
                sid,
                SessionStatus.CANCELLED if status == SessionStatus.TERMINATED else status,
                info,
                result=result or FAILURE,
            )
            return
        if await self.db(lifecycle.begin_termination, sid, status, info, self.owner_id,
                         self.claim_lease):
            self._changed(sid, SessionStatus.TERMINATING)
            await self._fault_hold(SessionStatus.TERMINATING)
        placed = {k.id: k.agent_id for k in sess.kernels if k.agent_id}
        logs: dict[str, str] = {}
        if sess.session_type == BATCH or status == SessionStatus.ERROR:
            # Keep what the kernels printed: a batch session's output, a failure's clues.
            for kid, aid in placed.items():
                try:
                    text = await (await self._client_for(aid)).kernel_logs(kid)
                except BackendAIError:
                    text = None
                if text:
                    logs[kid] = text
        await self._destroy_kernels(placed)
        await self._terminate(sid, status, info, result=result, logs=logs)

    async def user_projects(self, username: str) -> list[str]:
        """Names of the active projects a user may start sessions in (the spawner's choice)."""

        def work(s):
            user = s.scalar(select(User).where(User.username == username))
            return sorted(p.name for p in user.projects if p.is_active) if user else []

        return await self.db(work)

    async def mountable_folders(self, username: str, project: str | None = None) -> list[dict]:
        """The vfolders ``username`` may mount in a session of ``project`` (id or name;
        None: every project of theirs), for the spawner's form: id, name, owner
        (a username, or "project <name>"), permission and project (None for user folders)."""

        def work(s):
            user = s.scalar(select(User).where(User.username == username))
            if user is None:
                return []
            if project is None:
                projects = [p for p in user.projects if p.is_active] or [None]
            else:
                projects = [_session_project(user, project)]
            seen, out = set(), []
            for proj in projects:
                for f, perm in vfmounts.mountable_folders(s, user, proj):
                    if f.id in seen:
                        continue
                    seen.add(f.id)
                    if f.ownership_type == VFolderOwnership.PROJECT:
                        owner = f"project {proj.name}"
                    else:
                        row = s.get(User, f.user_id)
                        owner = row.username if row is not None else ""
                    out.append({"id": f.id, "name": f.name, "owner": owner, "permission": perm,
                                "project": proj.name if f.ownership_type == VFolderOwnership.PROJECT
                                else None})
            return sorted(out, key=lambda d: (d["name"], d["owner"]))

        return await self.db_read(work)

    async def check_mounts(self, username: str, project: str | None, mounts) -> list[dict]:
        """What :meth:`enqueue` would mount for this request; raises InvalidRequest
        with the reason (the spawner checks before anything is created)."""

        def work(s):
            user = s.scalar(select(User).where(User.username == username))
            if user is None:
                raise NotFound(f"no Backend.AI user {username!r}")
            return vfmounts.resolve_mounts(
                s, user, _session_project(user, project), mounts, tenancy.default_keypair(s, user))

        return await self.db_read(work)

    async def get_session(self, sid: str) -> Session | None:
        return await self.db_read(_load_session, sid)

    async def watch(self, sid: str) -> AsyncIterator[Session]:
        """Yield the session each time its status or status_info changes, until it is dead.

        Woken by every change of the session, this process's and (``session_changed``
        broadcasts on the event bus) other managers' (:class:`.lifecycle.SessionEvents`);
        re-reads at least every ``status_poll_interval`` seconds in case a broadcast
        was lost."""
        last = None
        with self.events.listen(sid) as changed:
            while True:
                changed.clear()  # before the read: a change after it is not missed
                sess = await self.get_session(sid)
                if sess is None:
                    return
                key = (sess.status, sess.status_info)
                if key != last:
                    last = key
                    yield sess
                if sess.status in DEAD_STATUSES:
                    return
                try:
                    await asyncio.wait_for(changed.wait(), self.status_poll_interval)
                except TimeoutError:
                    pass

    async def end_abandoned(self, username: str, name: str) -> list[str]:
        """End the live session ``name`` of ``username`` that a JupyterHub spawner
        started but JupyterHub never took over (the hub stopped while it was
        starting): JupyterHub is starting that server again. Returns the ids ended."""

        def find(s):
            return list(s.scalars(
                select(Session.id).join(User, User.id == Session.user_id).where(
                    User.username == username, Session.name == name,
                    Session.alive_marker.is_not(None), Session.awaited_until.is_not(None))))

        ended = await self.db_read(find)
        for sid in ended:
            await self.destroy_session(sid, SessionStatus.TERMINATED,
                                       "replaced: JupyterHub started this server again", result=FAILURE)
        return ended

    async def wait_change(self, sid: str, timeout: float) -> bool:
        """Wait until session ``sid`` changes (True) or ``timeout`` passes."""
        return await self.events.wait(sid, timeout)

    async def await_session(self, sid: str, seconds: float | None) -> None:
        """A spawner waits on ``sid`` for ``seconds`` more (renewed while it waits), or
        None: JupyterHub knows the server now (see ``spawner_wait_lease``)."""
        await self.db(lifecycle.await_session, sid, seconds)


_SLOT_WORDS = {CPU: ("CPU", format_cores), MEM: ("Memory", format_bytes),
               CUDA: ("GPUs", lambda v: f"{v} GPU" + ("" if v == 1 else "s"))}


def _beyond_every_agent(need: ResourceSlot, caps: list) -> str:
    """``Memory: 300 GiB is more than the 24 GiB this resource group offers`` for each
    slot that exceeds every agent of the group; "" when each slot alone fits somewhere."""
    out = []
    for k, v in sorted(need.nonzero().items()):
        most = max((Decimal(c.get(k, 0)) for c in caps), default=Decimal(0))
        if v <= most:
            continue
        label, fmt = _SLOT_WORDS.get(k, (k, str))
        if most == 0:
            out.append(f"{label}: this resource group has none ({fmt(v)} requested)")
        else:
            out.append(f"{label}: {fmt(v)} is more than the {fmt(most)} this resource group offers")
    return "; ".join(out)


def _failure_reason(e: BaseException) -> str:
    """A start failure's metric label: one of a few fixed words."""
    if isinstance(e, ImageNotFound):
        return "image_missing"
    if isinstance(e, KernelExitedWhileStarting):
        return "kernel_exited"
    if isinstance(e, AgentError):
        return "agent_error"
    if isinstance(e, VFolderUnavailable):
        return "vfolder_unavailable"
    return "other"


def _samples(metric, **labels):
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                yield sample


def _counter_value(metric, **labels) -> float:
    return sum(s.value for s in _samples(metric, **labels))


def _counter_by(metric, label: str, **labels) -> dict[str, int]:
    out: dict[str, int] = {}
    for sample in _samples(metric, **labels):
        key = sample.labels[label]
        out[key] = out.get(key, 0) + int(sample.value)
    return out


class KernelExitedWhileStarting(AgentError):
    """A kernel of a starting session ended before the session was running."""


class VFolderUnavailable(BackendAIError):
    """A vfolder of a starting session is gone or its storage does not answer."""

    status_code = 409
    title = "Vfolder unavailable"


def _session_project(user: User, project: str | None) -> Project | None:
    """The project a session of ``user`` runs in: ``project`` (id or name), else their first."""
    if project is None:
        return user.projects[0] if user.projects else None
    proj = next((p for p in user.projects if project in (p.id, p.name)), None)
    if proj is None:
        raise InvalidRequest(f"user {user.username!r} is not a member of project {project!r}")
    return proj


def _new_kernels(slots: ResourceSlot, cluster_size: int) -> list[Kernel]:
    """One PENDING kernel row per cluster index: main1, sub1, sub2, ..."""
    out = []
    for idx in range(cluster_size):
        role = "main" if idx == 0 else "sub"
        out.append(
            Kernel(
                requested_slots=ResourceSlot(slots),
                occupied_slots=ResourceSlot(),
                status=SessionStatus.PENDING,
                cluster_role=role,
                cluster_idx=idx,
                cluster_hostname=f"{role}{idx if idx else 1}",
            )
        )
    return out


def _cluster_ssh_keypair(session_id: str) -> dict:
    """multinode: a fresh Ed25519 keypair (OpenSSH format) for a cluster session's kernels."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return {"private_key": private, "public_key": f"{public} backendai-session-{session_id[:12]}\n"}


def _network_alias(kernel: Kernel, session_id: str) -> str:
    """A name unique to the kernel on a shared container network (main1-<session>)."""
    return f"{kernel.cluster_hostname}-{session_id[:12]}"


def _cluster_host(kernel: Kernel, session_id: str, addr: str, backend: str, local_agents: dict) -> str:
    """Where the other kernels of the session reach this one.

    Containers on an agent network find each other by alias (agents that share
    a node, or an overlay network, share it); local-process kernels share their
    agent's address.
    """
    if backend == "docker":
        return _network_alias(kernel, session_id)
    if kernel.agent_id in local_agents:
        return local_agents[kernel.agent_id].bind_host
    return urlsplit(addr).hostname or "127.0.0.1"


def _end_of_kernel(session_type: str, role: str, hostname: str, code: int | None) -> tuple[str, str, str]:
    """(status, result, reason) of a running session one of whose kernels ended."""
    if role != "main":
        return SessionStatus.ERROR, FAILURE, f"kernel {hostname} exited with code {code}"
    if session_type == BATCH:
        if code == 0:
            return SessionStatus.TERMINATED, SUCCESS, "batch command finished (exit code 0)"
        return SessionStatus.ERROR, FAILURE, f"batch command failed with exit code {code}"
    if code == 0:
        return SessionStatus.TERMINATED, SUCCESS, "kernel exited with code 0"
    return SessionStatus.ERROR, FAILURE, f"kernel exited with code {code}"


def _past_policy_limits(s, now: dt.datetime) -> list[tuple[str, str, str, str]]:
    """(session id, status, reason, result) of each RUNNING session past its keypair
    policy's max_session_lifetime or idle_timeout, found by one query.

    The query keeps only sessions whose policy sets a limit that applies to them;
    the times come from the JSON status history, compared here (the same on
    SQLite and PostgreSQL).
    """
    policy = KeypairResourcePolicy
    rows = s.execute(
        select(
            Session.id, Session.session_type, Session.status_history, Session.last_activity,
            policy.max_session_lifetime, policy.idle_timeout,
        )
        .join(Keypair, Keypair.access_key == Session.access_key)
        .join(policy, policy.name == Keypair.resource_policy)
        .where(
            Session.status == SessionStatus.RUNNING,
            or_(
                policy.max_session_lifetime > 0,
                (policy.idle_timeout > 0) & (Session.session_type != BATCH),
            ),
        )
    )
    out = []
    for sid, stype, history, last_activity, lifetime, idle in rows:
        since = (history or {}).get(SessionStatus.RUNNING)
        if not since:
            continue
        running_since = dt.datetime.fromisoformat(since)
        if lifetime and running_since + dt.timedelta(seconds=lifetime) <= now:
            info = f"reached max_session_lifetime ({lifetime} s, keypair policy)"
            if stype == BATCH:
                out.append((sid, SessionStatus.ERROR, info, FAILURE))
            else:
                out.append((sid, SessionStatus.TERMINATED, info, SUCCESS))
            continue
        if idle and stype != BATCH:
            active = max(running_since, last_activity) if last_activity else running_since
            if active + dt.timedelta(seconds=idle) <= now:
                info = f"idle for more than {idle} s (keypair policy idle_timeout)"
                out.append((sid, SessionStatus.TERMINATED, info, SUCCESS))
    return out


def _load_session(s, sid):
    return s.scalar(select(Session).where(Session.id == sid).options(selectinload(Session.kernels)))


def _upsert_agent(s, info: dict) -> str | None:
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
                last_heartbeat=utcnow())
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
    return before


def _touch_agent(s, agent_id: str) -> None:
    a = s.get(Agent, agent_id)
    if a is not None:
        a.last_heartbeat = utcnow()
        a.status = AgentStatus.ALIVE
