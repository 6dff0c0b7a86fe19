"""Sessions as users ask for them: a request checked against the record and queued
(PENDING), and what the front ends read of a user's sessions.

Checks are layered, each once: the request's *form* when it is built
(:class:`..common.session_request.SessionRequest`), what depends on the record here
(:meth:`Sessions.check_request`: the image, an agent that could ever fit it; the
tenancy and admission in :meth:`Sessions.enqueue`), capacity in the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator
from decimal import Decimal

from sqlalchemy import select

from ..common.errors import BackendAIError, Conflict, InvalidRequest, NotFound
from ..common.session_request import SessionRequest
from ..common.slots import (
    CPU,
    CUDA,
    MEM,
    ResourceSlot,
    format_bytes,
    format_cores,
    format_slots,
    parse_size,
)
from ..common.tasks import wait_set
from ..common.types import DEAD_STATUSES, SessionStatus, UserStatus, VFolderOwnership
from ..models import Project, Session, User
from ..models.base import utcnow
from . import lifecycle, tenancy
from . import mounts as vfmounts
from .lifecycle import record
from .reconcile import live_agents
from .scheduler import admit


@dataclasses.dataclass(frozen=True)
class CheckedRequest:
    """A :class:`SessionRequest` that :meth:`Sessions.check_request` passed: what it
    returns, and what :meth:`Sessions.enqueue` takes without checking again."""

    request: SessionRequest


class Sessions:
    def __init__(self, mgr) -> None:
        self.mgr = mgr
        # Sessions a spawner of this process is waiting on now (start() running): never
        # abandoned here, however late its renewals of ``awaited_until`` come: a hub starved
        # of CPU can renew a short wait late, and its own round would end the session it is
        # starting ("JupyterHub no longer waits ..."). The lease judges other processes.
        self.waited_here: set[str] = set()
        # Sessions whose Jupyter server a spawner of this process waits to answer (the
        # session RUNNING, its server starting): with the lifecycle's starts, what the
        # warm pool's refill yields to (manager/warmpool.py).
        self.answering_here: dict[str, str | None] = {}  # session id -> its main kernel's agent

    # -- the request ---------------------------------------------------------------------

    async def check_request(self, request: SessionRequest | CheckedRequest) -> CheckedRequest:
        """What of ``request`` depends on the record (:meth:`validate`: the image, an
        agent that could ever fit it), checked once: :meth:`enqueue` does not check
        the :class:`CheckedRequest` returned again."""
        if isinstance(request, CheckedRequest):
            return request
        # Issue 25: the catalogue names the image (an alias resolves to it); a hidden
        # one never starts; with image_catalogue on, nothing else starts (manager/images.py).
        entry = await self.mgr.ops.resolve_image(request.image)
        if entry is None:  # a fresh catalogue: the agents' images first (manager/registries.py)
            await self.mgr.registries.catalogue_local_first()
            entry = await self.mgr.ops.resolve_image(request.image)
        if (entry is not None and entry["hidden"]) or (self.mgr.image_catalogue and entry is None):
            why = "is hidden" if entry else "is not in the catalogue"
            raise InvalidRequest(f"image {request.image!r} {why}: choose one of the images "
                                 "listed (GET /hub/api/backendai/images)")
        if entry is not None and entry["name"] != request.image:
            request = request.model_copy(update={"image": entry["name"]})
        pulled = entry is not None and entry["source"] != "local"
        await self.validate(
            request.image, request.slots, request.resource_group,
            cluster_size=request.cluster_size, cluster_mode=request.cluster_mode.value,
            architecture=request.architecture, designated_agents=request.designated_agents,
            labels=entry["labels"] if pulled else None)
        return CheckedRequest(request)

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
        labels: dict | None = None,
    ) -> None:
        """Reject what can never run: unknown image, below image minimum, beyond any agent.
        ``labels``: the catalogue's labels of an image agents pull (no agent need hold it).

        ``slots`` are per kernel. A single-node session needs all its kernels on
        one agent; a multi-node one needs ``cluster_size`` distinct agents that
        each fit one kernel.
        """
        mgr = self.mgr
        cores = slots.get(CPU, 0) * cluster_size
        if mgr.max_slots_per_session and cores > mgr.max_slots_per_session:
            raise InvalidRequest(
                f"a session may use at most {mgr.max_slots_per_session} CPU cores here "
                f"(max_slots_per_session); {cores:g} requested")
        live = await mgr.db_read(live_agents, resource_group)
        rows = [(aid, arch, caps) for aid, _, arch, caps in live]
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
        info = {"labels": labels} if labels is not None else None
        errors = []
        # (the agents read above: asking the record again cost a start a second read)
        for client in [] if info else [mgr.agents.client(aid, addr) for aid, addr, _, _ in live]:
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
        request: SessionRequest | CheckedRequest | None = None,
        *,
        username: str,
        name: str,
        environ: dict,
        service_prefix: str,
        home_folder: str | None = None,
        awaited_for: float | None = None,
        **fields,
    ) -> str:
        """Record a PENDING session of ``request`` (a :class:`CheckedRequest`, a
        :class:`SessionRequest`, or its fields as keywords, which build one); returns
        its id.

        ``slots`` are per kernel; the session has ``cluster_size`` kernels.
        ``project`` is a project id or name in the user's domain (default: the
        user's first project). ``mounts``: vfolders (names or ids) mounted in
        every kernel at ``/home/work/<name>``, checked against what the user may
        mount in that project (:func:`.mounts.resolve_mounts`); the user's folders
        named ``.<name>`` are mounted too (automount). ``home_folder``: the name
        of the user's home folder, made when missing (:func:`.mounts.ensure_home`)
        and mounted at ``/home/work`` itself. ``awaited_for``: a JupyterHub spawner
        waits on the session (seconds, renewed by :meth:`await_session`; see
        ``spawner_wait_lease``). Raises a :class:`BackendAIError` (4xx) for
        anything the caller got wrong, including what the scheduler's admission
        refuses (pending limits, containers per session, priority cap, resource
        group permission); nothing is created then.
        """
        mgr = self.mgr
        if request is None:
            # The request's fields as keywords (image=, slots=, session_type=, project=,
            # cluster_size=, ... as SessionRequest): the one validation, here.
            try:
                request = SessionRequest(**fields)
            except TypeError as e:
                raise TypeError(f"enqueue: {e}") from None
        elif fields:
            raise TypeError(f"enqueue: a request and its fields ({', '.join(sorted(fields))})")
        r = (await self.check_request(request)).request
        refusal = await mgr.ops.image_refusal(r.image, username)
        if refusal is not None:  # another user's committed session (issue 27)
            raise InvalidRequest(refusal)
        if home_folder:
            # Kept when the session is refused below: it is the user's, like any folder.
            await vfmounts.ensure_home(mgr, username, home_folder)

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
            proj = _session_project(user, r.project)
            resolved = vfmounts.session_mounts(s, user, proj, list(r.mounts), kp, home_folder)
            sess = Session(
                name=name,
                session_type=r.session_type.value,
                user_id=user.id,
                access_key=kp.access_key,
                domain_name=user.domain_name,
                project_id=proj.id if proj else None,
                resource_group=r.resource_group,
                image=r.image,
                cluster_size=r.cluster_size,
                cluster_mode=r.cluster_mode.value,
                requested_slots=r.slots,
                environ=environ,
                service_prefix=service_prefix,
                startup_command=r.startup_command,
                batch_timeout=r.batch_timeout,
                starts_at=r.starts_at,
                designated_agents=list(r.designated_agents),
                architecture=r.architecture,
                vfolder_mounts=resolved,
                retries=0,
                result="UNDEFINED",
            )
            if awaited_for is not None:
                sess.awaited_until = utcnow() + dt.timedelta(seconds=awaited_for)
            sess.priority = 50 if r.priority is None else r.priority
            for dep in r.dependencies:
                other = s.get(Session, dep)
                if other is None or other.access_key != kp.access_key:
                    raise InvalidRequest(f"unknown dependency session {dep!r}")
                sess.dependencies.append(other)
            record.queue(sess, r.slots)
            # Still transient here: admission sees the request, not a queued row.
            admit(s, sess)
            s.add(sess)
            s.flush()
            return sess.id

        sid = await mgr.db(create)
        mgr.changed(sid, SessionStatus.PENDING)
        mgr.wake()
        return sid

    async def restart(self, sid: str) -> str:
        """Session ``sid`` stopped and queued again under its name with the request it
        was made with (image, resources, cluster, resource group, project, folders and
        home folder, environment, command, batch timeout, priority); returns the new
        session's id. The kernels' state is gone; the folders keep their files. A batch
        session runs its command again. Not for JupyterHub's servers: the hub restarts
        those with the options it keeps (``api/restart.py``).

        The request is checked (the image still offered, the folders still the user's
        to mount) before anything stops: a refusal leaves the session running. What
        only the queue decides (a quota changed meanwhile) can still refuse the new
        one after the old stopped; the error says so."""

        def read(s):
            sess = s.get(Session, sid)
            if sess is None:
                raise NotFound(f"no session {sid}")
            if sess.status != SessionStatus.RUNNING:
                raise Conflict(f"session {sess.name!r} is {sess.status}: only a running "
                               "session is restarted")
            user = s.get(User, sess.user_id)
            mounted = list(sess.vfolder_mounts or [])
            home = next((m["name"] for m in mounted if m["target"] == vfmounts.MOUNT_ROOT), None)
            request = SessionRequest(
                image=sess.image, slots={k: str(v) for k, v in sess.requested_slots.items()},
                session_type=sess.session_type, resource_group=sess.resource_group,
                project=sess.project_id, cluster_size=sess.cluster_size,
                cluster_mode=sess.cluster_mode, priority=sess.priority,
                startup_command=sess.startup_command, batch_timeout=sess.batch_timeout,
                designated_agents=tuple(sess.designated_agents or ()),
                architecture=sess.architecture,
                mounts=tuple(m["id"] for m in mounted if m["target"] != vfmounts.MOUNT_ROOT))
            return dict(request=request, username=user.username, name=sess.name,
                        environ=dict(sess.environ or {}), service_prefix=sess.service_prefix,
                        home_folder=home)

        spec = await self.mgr.db_read(read)
        checked = await self.check_request(spec.pop("request"))
        await self.check_mounts(spec["username"], checked.request.project,
                                list(checked.request.mounts))
        await self.mgr.destroy_session(sid, info="restarted")
        try:
            return await self.enqueue(checked, **spec)
        except BackendAIError as e:
            raise type(e)(f"session {spec['name']!r} stopped but was not started again: "
                          f"{e.detail}", status_code=e.status_code) from None

    # -- what the front ends read ------------------------------------------------------------

    async def user_projects(self, username: str) -> list[str]:
        """Names of the active projects a user may start sessions in (the spawner's choice)."""
        return await self.mgr.db_read(tenancy.active_project_names, username)

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

        return await self.mgr.db_read(work)

    async def check_mounts(self, username: str, project: str | None, mounts) -> list[dict]:
        """What :meth:`enqueue` would mount for this request; raises InvalidRequest
        with the reason (the spawner checks before anything is created)."""

        def work(s):
            user = s.scalar(select(User).where(User.username == username))
            if user is None:
                raise NotFound(f"no Backend.AI user {username!r}")
            return vfmounts.resolve_mounts(
                s, user, _session_project(user, project), mounts, tenancy.default_keypair(s, user))

        return await self.mgr.db_read(work)

    async def get_session(self, sid: str) -> Session | None:
        return await self.mgr.db_read(lifecycle.load_session, sid)

    async def watch(self, sid: str) -> AsyncIterator[Session]:
        """Yield the session each time its status or status_info changes, until it is dead.

        Woken by every change of the session, this process's and (``session_changed``
        broadcasts on the event bus) other managers' (:class:`.lifecycle.SessionEvents`);
        re-reads at least every ``status_poll_interval`` seconds in case a broadcast
        was lost."""
        last = None
        with self.mgr.events.listen(sid) as changed:
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
                await wait_set(changed, self.mgr.status_poll_interval)

    async def wait_for(self, sid: str, statuses) -> Session | None:
        """The session once its status is one of ``statuses`` or dead (None: it is
        gone). Read at first, then only after a change that may have brought one of
        them (:class:`.lifecycle.events.Change`): a start's SCHEDULED, PREPARING and
        CREATING, said by their changes, are waited past unread (a session's read with
        its kernels was most of what five spawners waiting together cost the record);
        and at least every ``status_poll_interval`` seconds, in case a broadcast was
        lost."""
        wanted = frozenset(str(s) for s in (*statuses, *DEAD_STATUSES))
        with self.mgr.events.listen(sid) as changed:
            while True:
                changed.clear()  # before the read: a change after it is not missed
                sess = await self.get_session(sid)
                if sess is None or sess.status in wanted:
                    return sess
                try:
                    async with asyncio.timeout(self.mgr.status_poll_interval):
                        await changed.wait()
                        while not changed.may_be(wanted):
                            changed.clear()
                            await changed.wait()
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

        ended = await self.mgr.db_read(find)
        for sid in ended:
            await self.mgr.lifecycle.end(sid, SessionStatus.TERMINATED,
                                         "replaced: JupyterHub started this server again",
                                         result=record.FAILURE)
        return ended

    async def await_session(self, sid: str, seconds: float | None) -> None:
        """A spawner waits on ``sid`` for ``seconds`` more (renewed while it waits), or
        None: JupyterHub knows the server now (see ``spawner_wait_lease``)."""
        await self.mgr.db(record.await_session, sid, seconds)

    @contextlib.contextmanager
    def answering(self, sid: str, agent_id: str | None = None):
        """While the body runs, a spawner of this process waits for the server of
        ``sid`` (on agent ``agent_id``) to answer (:attr:`answering_here`)."""
        self.answering_here[sid] = agent_id
        try:
            yield
        finally:
            self.answering_here.pop(sid, None)

    @contextlib.contextmanager
    def waiting_here(self, sid: str):
        """While the body runs, a spawner of this process waits on ``sid``: this
        process's passes do not end it as abandoned (:attr:`waited_here`)."""
        self.waited_here.add(sid)
        try:
            yield
        finally:
            self.waited_here.discard(sid)

    async def record_activity(self, sid: str, when: dt.datetime) -> bool:
        """Note activity of session ``sid`` at ``when`` (naive means UTC).

        Only ever moves ``last_activity`` forward: a late or repeated report of
        older activity changes nothing. True when the record moved.
        """
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        return bool(await self.mgr.db(record.record_activity, sid, when))

    async def session_logs(self, sid: str, kernel_idx: int = 0) -> str:
        """A kernel's output (the main one by default): live from its agent while it
        runs, else what was kept when it ended ("" when nothing was)."""
        mgr = self.mgr
        sess = await self.get_session(sid)
        if sess is None:
            raise NotFound(f"no session {sid!r}")
        kernel = next((k for k in sess.kernels if k.cluster_idx == kernel_idx), None)
        if kernel is None:
            raise NotFound(f"session {sid!r} has no kernel {kernel_idx}")
        if sess.status in (SessionStatus.RUNNING, SessionStatus.TERMINATING) and kernel.agent_id:
            try:
                live = await (await mgr.agents.client_for(kernel.agent_id)).kernel_logs(kernel.id)
            except BackendAIError as e:
                mgr.log.warning("could not read logs of kernel %s: %s", kernel.id, e.detail)
                live = None
            if live is not None:
                return live
            sess = await self.get_session(sid)  # it may have ended meanwhile
            kernel = next(k for k in sess.kernels if k.cluster_idx == kernel_idx)
        return kernel.logs or ""


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


def _session_project(user: User, project: str | None) -> Project | None:
    """The project a session of ``user`` runs in: ``project`` (id or name), else their first."""
    if project is None:
        return user.projects[0] if user.projects else None
    proj = next((p for p in user.projects if project in (p.id, p.name)), None)
    if proj is None:
        raise InvalidRequest(f"user {user.username!r} is not a member of project {project!r}")
    return proj
