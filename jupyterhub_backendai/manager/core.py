"""The manager: owns the record and drives sessions through their states.

One instance per hub process (a traitlets singleton, configured from
``jupyterhub_config.py`` as ``c.BackendAIManager``). Database work runs in worker
threads so that the hub's event loop never waits on it; Docker and agent calls
are async end to end.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import selectinload
from traitlets import Bool, Float, Integer, Unicode, default
from traitlets.config import SingletonConfigurable

from ..agent.core import Agent as LocalAgent
from ..common.errors import AgentError, BackendAIError, Conflict, InvalidRequest, NotFound
from ..common.events import make_event_bus
from ..common.slots import CPU, CUDA, KNOWN_SLOTS, MEM, ResourceSlot, parse_decimal, parse_size
from ..common.types import (
    ALIVE_STATUSES,
    DEAD_STATUSES,
    STARTING_STATUSES,
    AgentStatus,
    SessionStatus,
    UserStatus,
)
from ..models import Agent, Kernel, ResourceGroup, Session, User
from ..models.base import utcnow
from ..models.db import make_engine, make_sessionmaker, upgrade
from ..scheduler.dispatcher import (
    check_consistency,
    lost_agents,
    release_kernels,
    schedule_pass,
    set_status,
)
from . import tenancy
from .agent_client import AgentClient, HTTPAgentClient, InProcessAgentClient


class BackendAIManager(SingletonConfigurable):
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
    ).tag(config=True)
    agent_lost_timeout = Float(
        60.0, help="An agent silent this many seconds is LOST and gets no new kernels."
    ).tag(config=True)
    status_poll_interval = Float(
        0.1, help="Seconds between state checks while a spawner waits on its session."
    ).tag(config=True)
    max_slots_per_session = Integer(
        0, help="Reject requests of more than this many CPU cores (0: only agent capacity limits)."
    ).tag(config=True)

    def __init__(self, **kw):
        super().__init__(**kw)
        self.engine = make_engine(self.db_url)
        self.sm = make_sessionmaker(self.engine)
        self.bus = make_event_bus(self.redis_url or None)
        self.agent: LocalAgent | None = None
        self._wake = asyncio.Event()
        self._start_tasks: dict[str, asyncio.Task] = {}
        self._loop_task: asyncio.Task | None = None
        self._started: asyncio.Future | None = None

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
        await self.db(tenancy.ensure_defaults)
        await self.bus.start_consuming(self.handle_event)
        if self.embedded_agent:
            self.agent = LocalAgent(self.bus, parent=self)
            await self.agent.start()
            # Register before anything else so that reconciling and scheduling see it.
            await self.db(_upsert_agent, self.agent.info())
            await self.reconcile(self.agent.agent_id, await self.agent.list_kernels())
        self._loop_task = asyncio.create_task(self._scheduler_loop())

    async def stop(self) -> None:
        if self._loop_task:
            self._loop_task.cancel()
        for t in list(self._start_tasks.values()):
            t.cancel()
        if self.agent:
            await self.agent.stop()
        await self.bus.close()
        self.engine.dispose()

    async def db(self, fn, *args, **kw):
        """Run ``fn(db_session, ...)`` in one transaction in a worker thread."""

        def work():
            with self.sm.begin() as s:
                return fn(s, *args, **kw)

        return await asyncio.to_thread(work)

    # -- agents ---------------------------------------------------------------

    def agent_client(self, agent_id: str, addr: str = "") -> AgentClient:
        if self.agent is not None and agent_id == self.agent.agent_id:
            return InProcessAgentClient(self.agent)
        if not addr:
            raise AgentError(f"agent {agent_id} has no address")
        return HTTPAgentClient(addr, self.agent_token)

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

    async def list_images(self, resource_group: str = "default") -> list[str]:
        names: set[str] = set()
        for c in await self.agent_clients(resource_group):
            try:
                names.update(i["name"] for i in await c.list_images())
            except AgentError:
                continue
        return sorted(names)

    async def reconcile(self, agent_id: str, records: list[dict]) -> None:
        """Make the record and the agent agree after a restart of either."""
        alive = {r["kernel_id"] for r in records if r.get("alive")}
        present = {r["kernel_id"] for r in records}

        def find(s):
            kernels = s.scalars(
                select(Kernel)
                .join(Session)
                .where(Kernel.agent_id == agent_id, Session.status.in_(list(ALIVE_STATUSES)))
            ).all()
            lost, interrupted = [], []
            for k in kernels:
                if k.session.status in STARTING_STATUSES:
                    interrupted.append(k.session_id)
                elif k.id not in alive:
                    lost.append(k.session_id)
            known_alive = {k.id for k in kernels if k.session.status == SessionStatus.RUNNING}
            return lost, interrupted, known_alive

        lost, interrupted, known_alive = await self.db(find)
        for sid in lost:
            await self._terminate(sid, SessionStatus.ERROR, "kernel lost while the manager was away")
        for sid in interrupted:
            if sid not in self._start_tasks:
                await self.destroy_session(sid, SessionStatus.ERROR, "start interrupted by a restart")
        client = self.agent_client(agent_id, "")
        for kid in present - known_alive:
            self.log.info("removing orphan kernel %s on %s", kid, agent_id)
            await client.destroy_kernel(kid)

    # -- events ---------------------------------------------------------------

    async def handle_event(self, name: str, payload: dict) -> None:
        if name == "agent_heartbeat":
            await self.db(_upsert_agent, payload)
            self._wake.set()
        elif name == "kernel_terminated":
            await self._kernel_exited(payload["kernel_id"], payload.get("exit_code"))

    async def _kernel_exited(self, kernel_id: str, exit_code: int | None) -> None:
        def find(s):
            k = s.get(Kernel, kernel_id)
            if k is None:
                return None
            s.execute(
                Kernel.__table__.update().where(Kernel.id == kernel_id).values(exit_code=exit_code)
            )
            return k.session_id, k.session.status

        found = await self.db(find)
        if not found:
            return
        sid, status = found
        if status == SessionStatus.RUNNING:
            ok = exit_code == 0
            await self._terminate(
                sid,
                SessionStatus.TERMINATED if ok else SessionStatus.ERROR,
                f"kernel exited with code {exit_code}",
            )

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
        if self.agent is not None:
            await self.db(_touch_agent, self.agent.agent_id)
        await asyncio.to_thread(lost_agents, self.sm, self.agent_lost_timeout)
        groups = await self.db(
            lambda s: list(s.scalars(select(ResourceGroup.name).where(ResourceGroup.is_active)))
        )
        placed = []
        for g in groups:
            placed += await asyncio.to_thread(schedule_pass, self.sm, g)
        for sid in placed:
            self._start_tasks[sid] = asyncio.create_task(self._start_session(sid))
        return placed

    def consistency_problems(self) -> list[str]:
        return check_consistency(self.sm)

    # -- sessions ---------------------------------------------------------------

    def parse_request(self, options: dict) -> tuple[str, ResourceSlot]:
        """Validate user options into (image, slots per kernel); raise InvalidRequest."""
        if not isinstance(options, dict):
            raise InvalidRequest("options must be an object")
        unknown = set(options) - {"image", "cpu", "mem", "gpu", "resource_group"}
        if unknown:
            raise InvalidRequest(f"unknown option(s): {', '.join(sorted(unknown))}")
        image = options.get("image")
        if not isinstance(image, str) or not image.strip():
            raise InvalidRequest("image is required")
        cpu = parse_decimal("cpu", options.get("cpu", 1))
        mem = parse_size(options.get("mem", "1g"))
        gpu = parse_decimal("gpu", options.get("gpu", 0))
        if cpu <= 0:
            raise InvalidRequest(f"cpu must be positive, not {cpu}")
        if cpu != cpu.quantize(Decimal("0.01")):
            raise InvalidRequest("cpu takes at most two decimal places")
        if mem < 64 * 2**20:
            raise InvalidRequest("mem must be at least 64m")
        if gpu < 0 or gpu != gpu.to_integral_value():
            raise InvalidRequest(f"gpu must be a whole number >= 0, not {gpu}")
        slots = ResourceSlot({CPU: cpu, MEM: mem})
        if gpu:
            slots[CUDA] = gpu
        return image.strip(), slots

    async def validate(self, image: str, slots: ResourceSlot, resource_group: str) -> None:
        """Reject what can never run: unknown image, below image minimum, beyond any agent."""
        assert set(slots) <= set(KNOWN_SLOTS)
        caps = await self.db(
            lambda s: [
                a.available_slots
                for a in s.scalars(
                    select(Agent).where(
                        Agent.resource_group == resource_group, Agent.status == AgentStatus.ALIVE
                    )
                )
            ]
        )
        if not caps:
            raise InvalidRequest(f"resource group {resource_group!r} has no live agent")
        if not any(slots.fits_in(c) for c in caps):
            largest = max(caps, key=lambda c: (c.get(CPU, 0), c.get(MEM, 0)))
            raise InvalidRequest(
                f"requested {slots.nonzero().describe()} exceeds what any agent has "
                f"(largest: {largest.describe()})"
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
        for key, value in info["labels"].items():
            if key.startswith(prefix):
                slot = key[len(prefix) :]
                minimum = parse_size(value) if slot == MEM else Decimal(value)
                if slots.get(slot, Decimal(0)) < minimum:
                    raise InvalidRequest(f"image {image} needs at least {slot}={value}")

    async def enqueue(
        self,
        *,
        username: str,
        name: str,
        image: str,
        slots: ResourceSlot,
        environ: dict,
        service_prefix: str,
        resource_group: str = "default",
        session_type: str = "interactive",
        project: str | None = None,
        cluster_size: int = 1,
        cluster_mode: str = "single-node",
        priority: int | None = None,
        startup_command: str | None = None,
        batch_timeout: int | None = None,
        starts_at=None,
        dependencies: list[str] | tuple = (),
        designated_agents: list[str] | tuple = (),
        architecture: str | None = None,
    ) -> str:
        """Validate and record a PENDING session; returns its id.

        ``slots`` are per kernel; the session has ``cluster_size`` kernels.
        ``project`` is a project id or name in the user's domain (default: the
        user's first project). Raises a :class:`BackendAIError` (4xx) for
        anything the caller got wrong; nothing is created then.
        """
        await self.validate(image, slots, resource_group)

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
            if project is None:
                proj = user.projects[0] if user.projects else None
            else:
                proj = next((p for p in user.projects if project in (p.id, p.name)), None)
                if proj is None:
                    raise InvalidRequest(f"user {username!r} is not a member of project {project!r}")
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
            )
            if priority is not None:
                sess.priority = priority
            for dep in dependencies:
                other = s.get(Session, dep)
                if other is None or other.access_key != kp.access_key:
                    raise InvalidRequest(f"unknown dependency session {dep!r}")
                sess.dependencies.append(other)
            set_status(sess, SessionStatus.PENDING, "waiting for the scheduler")
            for idx in range(cluster_size):
                role = "main" if idx == 0 else "sub"
                sess.kernels.append(
                    Kernel(
                        requested_slots=slots,
                        status=SessionStatus.PENDING,
                        cluster_role=role,
                        cluster_idx=idx,
                        cluster_hostname=f"{role}{idx if idx else 1}",
                    )
                )
            s.add(sess)
            s.flush()
            return sess.id

        sid = await self.db(create)
        self.wake()
        return sid

    async def scheduler_status(self) -> dict:
        """Per resource group: queue length and what the scheduler last did (admin API, metrics)."""

        def work(s):
            out = {}
            for g in s.scalars(select(ResourceGroup)):
                pending = s.scalars(
                    select(Session.id).where(
                        Session.resource_group == g.name, Session.status == SessionStatus.PENDING
                    )
                ).all()
                out[g.name] = {"scheduler": g.scheduler, "pending": len(pending)}
            return out

        return await self.db(work)

    async def _transition(self, sid: str, frm: set, to: str, info: str = "") -> bool:
        def work(s):
            sess = s.get(Session, sid, with_for_update=True)
            if sess is None or sess.status not in frm:
                return False
            set_status(sess, to, info)
            for k in sess.kernels:
                k.status = to
            return True

        return await self.db(work)

    async def _start_session(self, sid: str) -> None:
        try:
            sess = await self.db(_load_session, sid)
            kernel = sess.kernels[0]
            addr = await self.db(lambda s: s.get(Agent, kernel.agent_id).addr)
            client = self.agent_client(kernel.agent_id, addr)
            if not await self._transition(sid, {SessionStatus.SCHEDULED}, SessionStatus.PREPARING, "checking the image"):
                return
            await client.image_info(sess.image)
            if not await self._transition(sid, {SessionStatus.PREPARING}, SessionStatus.CREATING, "starting the container"):
                return
            user = await self.db(lambda s: s.get(User, sess.user_id).username)
            rec = await client.create_kernel(
                {
                    "kernel_id": kernel.id,
                    "session_id": sid,
                    "owner": user,
                    "image": sess.image,
                    "slots": kernel.requested_slots.to_json(),
                    "environ": sess.environ,
                    "service_prefix": sess.service_prefix,
                }
            )

            def running(s):
                se = s.get(Session, sid, with_for_update=True)
                if se.status != SessionStatus.CREATING:
                    return False
                k = s.get(Kernel, kernel.id)
                k.container_id = rec["container_id"]
                k.kernel_host = rec["host"]
                k.service_ports = rec["service_ports"]
                k.attached_devices = {"cuda": rec.get("cuda_devices", [])}
                k.status = SessionStatus.RUNNING
                set_status(se, SessionStatus.RUNNING, "running")
                return True

            if not await self.db(running):
                await client.destroy_kernel(kernel.id)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            reason = e.detail if isinstance(e, BackendAIError) else f"{type(e).__name__}: {e}"
            self.log.error("session %s failed to start: %s", sid, reason)
            await self.destroy_session(sid, SessionStatus.ERROR, f"failed to start: {reason}")
        finally:
            self._start_tasks.pop(sid, None)

    async def _terminate(self, sid: str, status: str, info: str) -> None:
        """Mark dead and free the slots, in one transaction."""

        def work(s):
            sess = s.scalar(
                select(Session)
                .where(Session.id == sid)
                .options(selectinload(Session.kernels))
                .with_for_update(of=Session)
            )
            if sess is None or sess.status in DEAD_STATUSES:
                return
            release_kernels(s, sess, status)
            set_status(sess, status, info)
            sess.alive_marker = None
            sess.terminated_at = utcnow()

        await self.db(work)
        self.wake()

    async def destroy_session(
        self, sid: str, status: str = SessionStatus.TERMINATED, info: str = "stopped"
    ) -> None:
        """Stop whatever the session has become, remove its kernels, free its slots."""
        task = self._start_tasks.pop(sid, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        sess = await self.db(_load_session, sid)
        if sess is None or sess.status in DEAD_STATUSES:
            return
        if sess.status == SessionStatus.PENDING:
            await self._terminate(sid, SessionStatus.CANCELLED if status == SessionStatus.TERMINATED else status, info)
            return
        await self._transition(sid, ALIVE_STATUSES, SessionStatus.TERMINATING, info)
        for k in sess.kernels:
            if not k.agent_id:
                continue
            addr = await self.db(lambda s, a=k.agent_id: s.get(Agent, a).addr)
            try:
                await self.agent_client(k.agent_id, addr).destroy_kernel(k.id)
            except AgentError as e:
                self.log.warning("could not destroy kernel %s: %s", k.id, e.detail)
        await self._terminate(sid, status, info)

    async def get_session(self, sid: str) -> Session | None:
        return await self.db(_load_session, sid)

    async def watch(self, sid: str) -> AsyncIterator[Session]:
        """Yield the session each time its status or status_info changes, until it is dead."""
        last = None
        while True:
            sess = await self.get_session(sid)
            if sess is None:
                return
            key = (sess.status, sess.status_info)
            if key != last:
                last = key
                yield sess
            if sess.status in DEAD_STATUSES:
                return
            await asyncio.sleep(self.status_poll_interval)


def _load_session(s, sid):
    return s.scalar(select(Session).where(Session.id == sid).options(selectinload(Session.kernels)))


def _upsert_agent(s, info: dict) -> None:
    """Insert-or-update atomically: heartbeats may race with registration (and other managers)."""
    if s.bind.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    rg = info["resource_group"]
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


def _touch_agent(s, agent_id: str) -> None:
    a = s.get(Agent, agent_id)
    if a is not None:
        a.last_heartbeat = utcnow()
        a.status = AgentStatus.ALIVE
