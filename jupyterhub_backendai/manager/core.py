"""The manager: the record, and the rooms that drive sessions through their states.

One instance per hub process (a traitlets singleton, configured from
``jupyterhub_config.py`` as ``c.BackendAIManager``). This module keeps the settings
and the wiring; the work is done in the rooms (docs/architecture.md):

- :mod:`.sessions`: a request checked against the record and queued; what the front
  ends read of sessions
- :mod:`.scheduler`: which pending session goes where (one transaction per pass)
- :mod:`.lifecycle`: every status change after that, one handler per row of the
  status table, and this process's steps
- :mod:`.reconcile`: agents, their heartbeats and events, and the record agreeing
  with them
- :mod:`.broadcast`: a session's change, heard here and by every other manager
- :mod:`.admin`, :mod:`.vfolders`, the operations the front ends call by name
  (:mod:`.ops`)

Database work runs in worker threads so that the hub's event loop never waits on it;
Docker and agent calls are async end to end.
"""

from __future__ import annotations

import asyncio
import math
import os

from traitlets import Bool, Dict, Float, Integer, List, Unicode, default
from traitlets.config import SingletonConfigurable

from ..agent.core import Agent as LocalAgent
from ..common.events import make_event_bus
from ..common.tasks import wait_set
from ..common.types import SessionStatus
from ..models.db import (
    in_transaction,
    make_engine,
    make_read_sessionmaker,
    make_sessionmaker,
    upgrade,
)
from ..storageproxy.client import make_storage_registry
from . import lifecycle, tenancy
from .agent_client import close_agent_clients
from .broadcast import SESSION_CHANGED, SessionChanges
from .discovery import BackendAICluster
from .lifecycle.start import START_FAILURES
from .operations import Operations
from .reconcile import Agents, active_groups
from .reflector import SessionReflector
from .registries import Registries
from .scheduler import check_consistency, schedule_pass, scheduler_stats
from .scheduler.metrics import PLACEMENTS, REJECTIONS, counter_by, counter_value
from .session_lists import SessionLists
from .sessions import CheckedRequest, Sessions
from .usage import UsageSampler
from .warmpool import WarmPools

#: Seconds between the scheduler loop's sweeps when wakes come faster (_scheduler_loop).
SWEEP_GAP = 1.0

__all__ = ["SESSION_CHANGED", "BackendAIManager", "CheckedRequest"]


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
    image_catalogue = Bool(
        True, help="""Only images in the catalogue (and not hidden) can be started
        (docs/images.md); the agents' own images are catalogued by a rescan of ``local``,
        the first one made by the hub itself. Off: any labelled image an agent holds
        starts too; catalogued images from a registry are pulled either way."""
    ).tag(config=True)
    first_default_image = Unicode(
        help="""The image a fresh catalogue makes its default when the hub first
        catalogues the agents' images (if one of them; env BACKENDAI_DEFAULT_IMAGE, else
        the kernel image images/build.sh builds). An admin's choice wins afterwards."""
    ).tag(config=True)

    @default("first_default_image")
    def _first_default_image_default(self):
        return os.environ.get("BACKENDAI_DEFAULT_IMAGE", "backendai/python-kernel:latest")
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

    warm_pool_interval = Float(
        5.0, help="""Issue 30: seconds between the warm pools' rounds (manager/warmpool.py:
        what the agents hold, eviction, refill); a pooled kernel taken triggers one at once.""",
    ).tag(config=True, cluster=True)
    commit_registry = Unicode(
        "", help="""Issue 27: the container registry (its name in the catalogue's
        registries) that `session commit` pushes images to; empty: the registry the
        session's own image came from.""",
    ).tag(config=True, cluster=True)
    usage_sample_interval = Float(
        60.0, help="""Seconds between two samples of the kernels' live use for usage
        accounting (manager/usage.py: what was used beside what was allocated); 0: none.""",
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
        self._bg: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._started: asyncio.Future | None = None
        # This process's name in the record's claims, and its session-change events.
        self.owner_id = lifecycle.new_owner_id()
        self.events = lifecycle.SessionEvents()
        self.changes = SessionChanges(self)
        # The rooms.
        self.sessions = Sessions(self)
        self.lifecycle = lifecycle.Driver(self)
        self.agents = Agents(self)
        # What the spawners' polls read, one query for all of them (reflector.py).
        self.reflector = SessionReflector(self)
        # The API's lists of a user's sessions, kept current by changes (session_lists.py).
        self.session_lists = SessionLists(self)
        # The front ends' façade: named operations instead of manager.db(fn) (ops.py).
        self.ops = Operations(self)
        self.session_lists.attach(self.sm)
        self.registries = Registries(self)  # issue 25: container registries, their rescans
        self.warmpool = WarmPools(self)  # issue 30: kernels started before they are asked for
        self.usage_sampler = UsageSampler(self)  # what kernels used, for usage accounting

    @classmethod
    def of(cls, handler) -> BackendAIManager:
        """The manager a JupyterHub request handler works with: its authenticator's, else
        this process's (made from the hub's configuration)."""
        auth = getattr(handler, "authenticator", None)
        if auth is not None and hasattr(auth, "manager"):
            return auth.manager
        return cls.instance(config=handler.settings.get("config"))

    # -- starting and stopping --------------------------------------------------------

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
        await self.bus.subscribe(self.changes.heard, self.changes.missed)
        await self.cluster.start(self)  # [issue 11] agents/storage proxies from etcd (cluster mode)
        if self.embedded_agent:
            self.agent = LocalAgent(self.bus, parent=self)
            await self.attach_agent(self.agent)
            await self.registries.catalogue_local_first()
        self._loop_task = asyncio.create_task(self._scheduler_loop())

    async def attach_agent(self, agent: LocalAgent) -> None:
        """Run ``agent`` inside this process: start it, register it, reconcile its kernels.

        The embedded default has one; more than one lets a single process hold a
        multi-node cluster (tests, demos). Their kernels are reached directly,
        not over HTTP.
        """
        await self.agents.attach(agent)

    async def stop(self) -> None:
        lifecycle.owner_gone(self.owner_id)
        self.changes.closed = True
        if self._loop_task:
            self._loop_task.cancel()
        self.lifecycle.stop()
        for t in self._bg:
            t.cancel()
        for agent in self.local_agents.values():
            await agent.stop()
        await self.cluster.stop()  # [issue 11]
        await close_agent_clients()
        await self.bus.close()
        await self.storage.close()
        self.engine.dispose()

    # -- the record ---------------------------------------------------------------------

    async def db(self, fn, *args, **kw):
        """Run ``fn(db_session, ...)`` in one transaction in a worker thread; one that
        the database aborted as a deadlock is run again (:func:`.db.in_transaction`:
        ``fn`` does only database work)."""
        return await asyncio.to_thread(in_transaction, self.sm, fn, *args, **kw)

    async def db_read(self, fn, *args, **kw):
        """Like :meth:`db` for ``fn`` that only reads: on SQLite it neither waits for
        nor blocks writers (the API's GETs, status polls)."""

        def work():
            with self.sm_read() as s:
                return fn(s, *args, **kw)

        return await asyncio.to_thread(work)

    def background(self, coro) -> asyncio.Task:
        """Run ``coro`` beside the caller (event handlers must not block the bus); its
        task is cancelled when the manager stops, before its agents close."""
        task = asyncio.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        return task

    # -- session changes (broadcast.py) ------------------------------------------------

    def changed(self, sid: str, status: str | None = None) -> None:
        """Session ``sid`` changed (committed): wake its readers here and elsewhere."""
        self.changes.changed(sid, status)

    def changed_many(self, sids: list[str], status: str) -> None:
        self.changes.changed_many(sids, status)

    async def wait_change(self, sid: str, timeout: float) -> frozenset:
        """Wait until session ``sid`` changes or ``timeout`` passes: the statuses the
        changes said (None for one that did not; empty, false, when none came)."""
        return await self.events.wait(sid, timeout)

    # -- the scheduler loop -------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    async def _scheduler_loop(self) -> None:
        loop = asyncio.get_running_loop()
        swept = -math.inf
        while True:
            await wait_set(self._wake, self.schedule_interval)
            self._wake.clear()
            # The sweeps (liveness, the lifecycle's handlers) find what time or another
            # process brought about, not what woke this loop (an arrival, a release):
            # at most once a SWEEP_GAP (or schedule_interval, if shorter). In a rush of
            # five starts the loop ran four times in 0.6 s, each sweep nine transactions.
            sweep = loop.time() - swept >= min(self.schedule_interval, SWEEP_GAP)
            if sweep:
                swept = loop.time()
            try:
                await self.schedule_once(sweep=sweep)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("scheduler pass failed")

    async def schedule_once(self, sweep: bool = True) -> list[str]:
        """One round: agents' liveness, the handlers that free capacity, a pass per
        resource group, the starts of what it placed, the other handlers. Without
        ``sweep`` only the passes and the starts of what they placed."""
        if sweep:
            await self.agents.touch_local()
            await self.agents.check_liveness()
            await self.lifecycle.run("before")
        placed: list[str] = []
        told: list[tuple[str, str]] = []  # waiting sessions' new reasons, cancellations
        for g in await self.db_read(active_groups):
            placed += await asyncio.to_thread(schedule_pass, self.sm, g, told=told)
        self.changed_many(placed, "SCHEDULED")
        for status in (SessionStatus.PENDING, SessionStatus.CANCELLED):
            ids = [sid for sid, said in told if said == status]
            if ids:
                self.changed_many(ids, status)
        for sid in placed:
            self.lifecycle.begin_start(sid)
        if sweep:
            await self.drive_lifecycle()
        self.warmpool.kick()
        self.usage_sampler.kick()
        return placed

    async def drive_lifecycle(self) -> None:
        """The status handlers that follow the pass (:mod:`.lifecycle.handlers`), then a
        reconciliation with every agent when one is due."""
        await self.lifecycle.run("after")
        self.agents.reconcile_when_due()

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
            st["placements"] = int(counter_value(PLACEMENTS, resource_group=rg))
            st["rejections"] = counter_by(REJECTIONS, "reason", resource_group=rg)
            st["start_failures"] = counter_by(START_FAILURES, "reason", resource_group=rg)
        return out

    # -- the rooms' public face (what the spawner, the API and the CLI call) ---------------

    async def check_request(self, request) -> CheckedRequest:
        return await self.sessions.check_request(request)

    async def validate(self, *args, **kw) -> None:
        await self.sessions.validate(*args, **kw)

    async def enqueue(self, request=None, **kw) -> str:
        return await self.sessions.enqueue(request, **kw)

    async def destroy_session(self, sid: str, status: str = "TERMINATED", info: str = "stopped",
                              *, result: str | None = None) -> None:
        await self.lifecycle.end(sid, status, info, result=result)

    async def restart_session(self, sid: str) -> str:
        return await self.sessions.restart(sid)

    async def get_session(self, sid: str):
        return await self.sessions.get_session(sid)

    def watch(self, sid: str):
        return self.sessions.watch(sid)

    async def wait_for(self, sid: str, statuses):
        return await self.sessions.wait_for(sid, statuses)

    async def session_logs(self, sid: str, kernel_idx: int = 0) -> str:
        return await self.sessions.session_logs(sid, kernel_idx)

    async def record_activity(self, sid: str, when) -> bool:
        return await self.sessions.record_activity(sid, when)

    async def end_abandoned(self, username: str, name: str) -> list[str]:
        return await self.sessions.end_abandoned(username, name)

    async def await_session(self, sid: str, seconds: float | None) -> None:
        await self.sessions.await_session(sid, seconds)

    def waiting_here(self, sid: str):
        return self.sessions.waiting_here(sid)

    def answering(self, sid: str, agent_id: str | None = None):
        return self.sessions.answering(sid, agent_id)

    def starts_in_flight(self) -> int:
        """Session starts this process drives now: from SCHEDULED until RUNNING, and
        then until a spawner's server answers."""
        return len(self.lifecycle.starting() | set(self.sessions.answering_here))

    def starts_beside(self, sid: str, agent_id: str) -> int:
        """The other session starts in flight here (:meth:`starts_in_flight`) that may
        use ``agent_id``'s CPU now: their kernels are on it, or not read yet. A starting
        kernel's burst is shared with them (KernelSpec ``starts_beside``), and the
        spawner's first look at a server waits for them (``spawner.READY_HOLD``)."""
        agents_of = self.lifecycle.starter.agents_of
        answering = self.sessions.answering_here
        beside = 0
        for other in self.lifecycle.starting() | set(answering):
            if other == sid:
                continue
            where = agents_of.get(other) or ({answering[other]} if answering.get(other) else None)
            if where is None or agent_id in where:
                beside += 1
        return beside

    async def user_projects(self, username: str) -> list[str]:
        return await self.sessions.user_projects(username)

    async def mountable_folders(self, username: str, project: str | None = None) -> list[dict]:
        return await self.sessions.mountable_folders(username, project)

    async def check_mounts(self, username: str, project: str | None, mounts) -> list[dict]:
        return await self.sessions.check_mounts(username, project, mounts)

    async def list_images(self, resource_group: str = "default") -> list[str]:
        return await self.agents.list_images(resource_group)

    async def agent_clients(self, resource_group: str):
        return await self.agents.clients(resource_group)

    def agent_client(self, agent_id: str, addr: str = ""):
        return self.agents.client(agent_id, addr)

    async def reconcile(self, agent_id: str, records: list[dict], before=None) -> None:
        await self.agents.reconcile(agent_id, records, before)

    async def reconcile_agent(self, agent_id: str) -> None:
        await self.agents.reconcile_agent(agent_id)

    async def reconcile_all(self) -> None:
        await self.agents.reconcile_all()

    async def handle_event(self, name: str, payload: dict) -> None:
        await self.agents.handle_event(name, payload)
