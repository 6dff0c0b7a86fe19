"""Build scheduler scenarios directly in a real database (no manager, no agents running).

Rows are inserted the way the manager creates them (a session with one kernel
row per cluster_idx, slots per kernel), so the scheduler sees what it sees in
production. Users get a fixed password hash: bcrypt per user would dominate
the property tests' runtime.
"""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal

from sqlalchemy import delete, select

from jupyterhub_backendai.common.slots import CPU, CUDA, MEM, ResourceSlot, parse_size
from jupyterhub_backendai.manager.lifecycle.record import release_kernels, set_status
from jupyterhub_backendai.models import (
    Agent,
    Domain,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ResourceGroup,
    Session,
    User,
    project_members,
    session_dependencies,
)
from jupyterhub_backendai.models.base import utcnow

GiB = 2**30


def slots(cpu=None, mem=None, gpu=None, **extra) -> ResourceSlot:
    out = ResourceSlot()
    if cpu is not None:
        out[CPU] = Decimal(str(cpu))
    if mem is not None:
        out[MEM] = parse_size(mem)
    if gpu is not None:
        out[CUDA] = Decimal(str(gpu))
    for k, v in extra.items():
        out[k] = Decimal(str(v))
    return out


class World:
    def __init__(self, sm):
        self.sm = sm
        self.keys: dict[str, str] = {}  # user name -> default access key
        self.uids: dict[str, str] = {}
        self.ids: dict[str, str] = {}  # session name -> id
        self.clock = utcnow()
        self._n = itertools.count()

    # -- setup --------------------------------------------------------------

    def agent(self, aid: str, group: str = "default", arch: str = "x86_64", **cap) -> None:
        with self.sm.begin() as s:
            self._group(s, group)
            s.add(Agent(id=aid, resource_group=group, architecture=arch,
                        available_slots=slots(**cap), occupied_slots=ResourceSlot()))

    def _group(self, s, name: str) -> ResourceGroup:
        g = s.get(ResourceGroup, name)
        if g is None:
            g = ResourceGroup(name=name)
            s.add(g)
            s.flush()
        return g

    def group(self, name: str = "default", **kw) -> None:
        with self.sm.begin() as s:
            g = self._group(s, name)
            for k, v in kw.items():
                setattr(g, k, v)

    def policy(self, name: str, total=None, **kw) -> None:
        with self.sm.begin() as s:
            p = s.get(KeypairResourcePolicy, name) or KeypairResourcePolicy(name=name)
            p.total_resource_slots = ResourceSlot(total or {})
            for k, v in kw.items():
                setattr(p, k, v)
            s.add(p)

    def project(self, name: str, domain: str = "default", total=None) -> str:
        with self.sm.begin() as s:
            if s.get(Domain, domain) is None:
                s.add(Domain(name=domain))
                s.flush()
            p = s.scalar(select(Project).where(Project.name == name, Project.domain_name == domain))
            if p is None:
                p = Project(name=name, domain_name=domain)
                s.add(p)
            p.total_resource_slots = ResourceSlot(total or {})
            s.flush()
            return p.id

    def domain(self, name: str = "default", total=None) -> None:
        with self.sm.begin() as s:
            d = s.get(Domain, name) or Domain(name=name)
            d.total_resource_slots = ResourceSlot(total or {})
            s.add(d)

    def user(self, name: str, policy: str = "default", project: str = "default",
             domain: str = "default") -> str:
        """Create a user with one default keypair; returns its access key."""
        with self.sm.begin() as s:
            n = next(self._n)
            u = User(email=f"{name}@example.com", username=name, password="x" * 60,
                     domain_name=domain)
            s.add(u)
            s.flush()
            p = s.scalar(select(Project).where(Project.name == project, Project.domain_name == domain))
            s.execute(project_members.insert().values(project_id=p.id, user_id=u.id))
            ak = f"AK{n:06d}{name[:10].upper()}"[:20]
            s.add(Keypair(access_key=ak, secret_key="s" * 40, user_id=u.id, is_default=True,
                          resource_policy=policy))
            self.keys[name] = ak
            self.uids[name] = u.id
            return ak

    def keypair(self, user: str, policy: str = "default") -> str:
        with self.sm.begin() as s:
            n = next(self._n)
            ak = f"AK{n:06d}X{user[:9].upper()}"[:20]
            s.add(Keypair(access_key=ak, secret_key="s" * 40, user_id=self.uids[user],
                          resource_policy=policy))
            return ak

    # -- sessions -----------------------------------------------------------

    def enqueue(self, user: str, name: str, cpu=1, mem="1g", gpu=None, *, group="default",
                cluster_size=1, mode="single-node", priority=50, created_at=None,
                starts_at=None, deps=(), arch=None, designated=(), access_key=None,
                project: str | None = "default") -> str:
        self.clock += dt.timedelta(milliseconds=1)
        per = slots(cpu=cpu, mem=mem, gpu=gpu)
        with self.sm.begin() as s:
            pid = None
            if project is not None:
                u = s.get(User, self.uids[user])
                pid = s.scalar(select(Project.id).where(Project.name == project,
                                                        Project.domain_name == u.domain_name))
            sess = Session(
                name=name, user_id=self.uids[user], access_key=access_key or self.keys[user],
                domain_name=s.get(User, self.uids[user]).domain_name, project_id=pid,
                resource_group=group, image="img", requested_slots=per,
                cluster_size=cluster_size, cluster_mode=mode, priority=priority,
                created_at=created_at or self.clock, starts_at=starts_at, architecture=arch,
                designated_agents=list(designated),
            )
            set_status(sess, "PENDING", "waiting for the scheduler")
            for idx in range(cluster_size):
                sess.kernels.append(Kernel(requested_slots=per, cluster_idx=idx,
                                           cluster_role="main" if idx == 0 else "sub"))
            for d in deps:
                sess.dependencies.append(s.get(Session, self.ids[d]))
            s.add(sess)
            s.flush()
            self.ids[name] = sess.id
            return sess.id

    def finish(self, name: str, status: str = "TERMINATED", result: str = "SUCCESS") -> None:
        """End a session the way the manager does: free its slots and mark it dead, at once."""
        with self.sm.begin() as s:
            sess = s.get(Session, self.ids.get(name, name), with_for_update=True)
            release_kernels(s, sess, status)
            set_status(sess, status, "ended")
            sess.result = result
            sess.alive_marker = None
            sess.terminated_at = utcnow()

    def session(self, name: str) -> Session:
        with self.sm() as s:
            sess = s.get(Session, self.ids[name])
            _ = sess.kernels
            return sess

    def status(self, name: str) -> str:
        return self.session(name).status

    def info(self, name: str) -> str:
        return self.session(name).status_info

    def statuses(self) -> dict[str, str]:
        with self.sm() as s:
            return {x.name: x.status for x in s.scalars(select(Session))}

    def agents_of(self, name: str) -> list[str | None]:
        return [k.agent_id for k in self.session(name).kernels]

    def occupied(self, aid: str) -> ResourceSlot:
        with self.sm() as s:
            return s.get(Agent, aid).occupied_slots.nonzero()

    def names(self, ids) -> list[str]:
        rev = {v: k for k, v in self.ids.items()}
        return [rev[i] for i in ids]

    def group_state(self, name: str = "default") -> dict:
        with self.sm() as s:
            return dict(s.get(ResourceGroup, name).scheduler_state or {})

    def wipe(self) -> None:
        """Remove everything but the default rows (between property-test examples)."""
        with self.sm.begin() as s:
            s.execute(delete(session_dependencies))
            s.execute(delete(Kernel))
            s.execute(delete(Session))
            s.execute(delete(Agent))
            s.execute(delete(Keypair))
            s.execute(delete(project_members))
            s.execute(delete(User))
            s.execute(delete(Project).where(Project.name != "default"))
            s.execute(delete(ResourceGroup).where(ResourceGroup.name != "default"))
            s.execute(delete(KeypairResourcePolicy).where(KeypairResourcePolicy.name != "default"))
            s.execute(delete(Domain).where(Domain.name != "default"))
            g = s.get(ResourceGroup, "default")
            g.scheduler, g.scheduler_opts, g.scheduler_state = "fifo", {}, {}
            g.is_public = True
            s.get(Domain, "default").total_resource_slots = ResourceSlot()
            p = s.scalar(select(Project).where(Project.name == "default"))
            p.total_resource_slots = ResourceSlot()
        self.keys.clear()
        self.uids.clear()
        self.ids.clear()
