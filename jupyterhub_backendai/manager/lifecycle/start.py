"""Starting a session: SCHEDULED -> PREPARING -> CREATING -> RUNNING, every kernel or none.

Run by :class:`.handlers.Start` with the session's claim (of several managers, one
starts it). Kernels are created concurrently on their agents. If any fails, the ones
created are removed and the session goes back to the queue (bounded by
``start_retries``) with its slots released, or ends in ERROR with the reason.
"""

from __future__ import annotations

import asyncio
import os
import time
from urllib.parse import urlsplit

from prometheus_client import Counter
from sqlalchemy import select

from ...agent.backends.base import BATCH, IDLE, INTERACTIVE
from ...common.errors import (
    AgentError,
    BackendAIError,
    DevicesHeldElsewhere,
    ImageNotFound,
    KernelCannotStart,
    PullRefused,
)
from ...common.kernelspec import KernelSpec
from ...common.types import SessionStatus, VFolderStatus
from ...models import Agent, Kernel, Session, User, VFolder
from .. import images, sshkeys
from .. import mounts as vfmounts
from ..vfolders import mount_permission
from . import record

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


class KernelExitedWhileStarting(AgentError):
    """A kernel of a starting session ended before the session was running."""


class VFolderUnavailable(BackendAIError):
    """A vfolder of a starting session is gone or its storage does not answer."""

    status_code = 409
    title = "Vfolder unavailable"


def failure_reason(e: BaseException) -> str:
    """A start failure's metric label: one of a few fixed words."""
    if isinstance(e, ImageNotFound):
        return "image_missing"
    if isinstance(e, PullRefused):
        return "pull_refused"
    if isinstance(e, KernelExitedWhileStarting):
        return "kernel_exited"
    if isinstance(e, AgentError):
        return "agent_error"
    if isinstance(e, VFolderUnavailable):
        return "vfolder_unavailable"
    return "other"


async def fault_hold(log, status: str) -> None:
    """Fault injection for tests: ``BACKENDAI_FAULT_HOLD=CREATING=60`` holds every
    session this many seconds once it reaches that status (so a test can kill the
    hub there). Never set in production."""
    spec = os.environ.get("BACKENDAI_FAULT_HOLD", "")
    for part in filter(None, spec.split(",")):
        st, _, secs = part.partition("=")
        if st.strip() == status:
            log.warning("BACKENDAI_FAULT_HOLD: holding in %s for %s s", status, secs)
            await asyncio.sleep(float(secs))


class Starter:
    """The start of one session at a time (one per call of :meth:`start`)."""

    #: How often in a row one session's start may be refused for devices another
    #: installation holds and go back to the queue without using a try. The refusal
    #: makes the agent report the claim at once, after which the scheduler no longer
    #: places the session there; a session refused again and again means that report
    #: does not arrive (the event bus away), and each later refusal uses a try, with
    #: the retries' back-off, until the tries are used up and it ends in ERROR.
    HELD_ELSEWHERE_REQUEUES = 3
    #: Refusals further apart than this many seconds are not "in a row": the report
    #: arrived in between, and a later race with the other installation starts anew.
    HELD_ELSEWHERE_WINDOW = 60.0

    def __init__(self, driver) -> None:
        self.driver = driver
        self.mgr = driver.mgr
        # The Start handler's transition (it declares the changes a start makes).
        self.transition = None
        # session id -> (refusals in a row, when the last was)
        self._held_elsewhere: dict[str, tuple[int, float]] = {}
        # session id -> its kernels' agents, from its start's first read to its end
        # (manager.starts_beside)
        self.agents_of: dict[str, set[str]] = {}

    async def start(self, sid: str, dead_owner: str | None = None) -> None:
        mgr = self.mgr
        created: dict[str, str] = {}  # kernel id -> agent id
        try:
            await fault_hold(mgr.log, SessionStatus.SCHEDULED)
            if not await mgr.db(record.claim, sid, {SessionStatus.SCHEDULED}, mgr.owner_id,
                                mgr.claim_lease, dead_owner):
                return

            def load(s):
                sess = record.load_session(s, sid)
                if sess is None:
                    return None, {}, None
                ids = {k.agent_id for k in sess.kernels}
                agents = {a.id: (a.addr, a.backend)
                          for a in s.scalars(select(Agent).where(Agent.id.in_(ids)))}
                # What the kernels' specs need of the record besides the session, in the
                # same read (three more reads before, each a hop to a worker thread):
                # its owner's name, its kernels' bounds and the state of its folders.
                return sess, agents, (s.get(User, sess.user_id).username,
                                      kernel_bounds(s, sess.access_key, sess.project_id),
                                      folder_states(s, sess))

            sess, agents, facts = await mgr.db_read(load)
            if sess is None:
                return
            self.agents_of[sid] = set(agents)
            owner, bounds, folders = facts
            kernels = list(sess.kernels)
            clients = {aid: mgr.agents.client(aid, addr) for aid, (addr, _) in agents.items()}
            if not await self.transition(
                sid, {SessionStatus.SCHEDULED}, SessionStatus.PREPARING, "checking the image"
            ):
                return

            async def prepare():
                """What the kernels' specs need besides the image: the folders checked
                (and their mount points made) while the image is pulled."""
                mounts = await self.mount_specs(
                    sess, folders, mount_points=any(b != "local" for _, b in agents.values()))
                ssh_key = None
                if sess.resource_group in mgr.ssh_resource_groups:  # issue 12: opted in
                    ssh_key = await mgr.db_read(
                        sshkeys.session_public_key, sess, mgr.ssh_resource_groups)
                return mounts, ssh_key

            # Issue 25: the pull and the rest of the preparation side by side. Both run to
            # their end; the pull's failure is the one reported when both fail.
            pulled, prepared = await asyncio.gather(
                images.ensure_on_agents(mgr, sid, sess.image, clients), prepare(),
                return_exceptions=True)
            for outcome in (pulled, prepared):
                if isinstance(outcome, BaseException):
                    raise outcome
            mounts, ssh_key = prepared
            n = len(kernels)
            what = "starting the container" if n == 1 else f"starting {n} containers"
            if not await self.transition(
                sid, {SessionStatus.PREPARING}, SessionStatus.CREATING, what
            ):
                return
            # Issue 30: a warm pool's kernel, when one matches (its id becomes the kernel's).
            pooled = await mgr.warmpool.take(sess, kernels, mounts, bounds, ssh_key)
            specs = self.kernel_specs(sess, kernels, agents, owner, mounts, ssh_key=ssh_key,
                                      bounds=bounds)

            async def create(k, spec):
                created[k.id] = k.agent_id  # a pooled kernel that fails to bind is removed
                rec = await mgr.warmpool.create(clients[k.agent_id], spec, pooled)
                return rec

            results = await asyncio.gather(
                *(create(k, spec) for k, spec in zip(kernels, specs, strict=True)),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]
            recs = dict(zip([k.id for k in kernels], results, strict=True))
            outcome, detail = await mgr.db(record.mark_running, sid, recs)
            self._held_elsewhere.pop(sid, None)
            mgr.changed(sid, SessionStatus.RUNNING if outcome == "running" else None)
            if outcome == "gone":
                await self.destroy_kernels(created)
                return
            if outcome == "failed":
                raise KernelExitedWhileStarting(detail)
            if sess.session_type == BATCH:
                self.driver.arm_batch_timer(sid, sess.batch_timeout)
                if detail:  # the command finished before the session was marked running
                    main = await mgr.db(lambda s: s.get(Kernel, detail))
                    await self.driver.kernel_exited(main.id, main.exit_code, None)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            reason = e.detail if isinstance(e, BackendAIError) else f"{type(e).__name__}: {e}"
            mgr.log.error("session %s failed to start: %s", sid, reason)
            await self.destroy_kernels(created)
            if isinstance(e, DevicesHeldElsewhere):
                # Another installation's kernel holds the GPUs: no fault of this start.
                # Back to the queue without counting a try; the agent reports the
                # devices at once, and the scheduler counts them as taken until freed.
                now = time.monotonic()
                refused, last = self._held_elsewhere.pop(sid, (0, now))
                refused = refused + 1 if now - last < self.HELD_ELSEWHERE_WINDOW else 1
                if refused <= self.HELD_ELSEWHERE_REQUEUES:
                    self._held_elsewhere[sid] = (refused, now)
                    if len(self._held_elsewhere) > 10_000:  # ended while queued: forgotten
                        del self._held_elsewhere[next(iter(self._held_elsewhere))]
                    await self.failed(sid, reason, "devices_held_elsewhere", counted=False)
                    return
                reason += (f" (refused {refused} times in a row: the agent's report of "
                           "the devices did not reach the scheduler)")
                await self.failed(sid, reason, "devices_held_elsewhere")
                return
            self._held_elsewhere.pop(sid, None)
            # A failure the agent says would come again (its own setup) ends the start now.
            await self.failed(sid, reason, failure_reason(e),
                              retry=not isinstance(e, KernelCannotStart))
        finally:
            self.agents_of.pop(sid, None)

    async def recover(self, sid: str, dead_owner: str | None, reason: str) -> None:
        """A start nobody drives any more (or past its deadline): remove what it created,
        then retry or fail with ``reason``."""
        mgr = self.mgr
        starting = {SessionStatus.PREPARING, SessionStatus.CREATING}
        if not await mgr.db(record.claim, sid, starting, mgr.owner_id, mgr.claim_lease, dead_owner):
            return
        await self.driver.steps.cancel("start", sid)
        sess = await mgr.db(record.load_session, sid)
        if sess is None or sess.status not in starting:
            return
        mgr.log.warning("session %s: %s", sid, reason)
        await self.destroy_kernels({k.id: k.agent_id for k in sess.kernels if k.agent_id})
        await self.failed(sid, reason, "interrupted")

    async def failed(self, sid: str, reason: str, kind: str = "other", retry: bool = True,
                     counted: bool = True) -> None:
        """Release the slots; back to PENDING for another try, or ERROR once tries are used
        up (at once without ``retry``). Not ``counted``: back to PENDING, no try used."""
        mgr = self.mgr
        done = await mgr.db(record.start_failed, sid, reason, mgr.start_retries if retry else 0,
                            counted)
        if done:
            rg, outcome = done
            START_FAILURES.labels(resource_group=rg, reason=kind).inc()
            if outcome == "retry":
                START_RETRIES.labels(resource_group=rg).inc()
        mgr.changed(sid, (SessionStatus.ERROR if done[1] == "error" else SessionStatus.PENDING)
                    if done else None)
        mgr.wake()

    async def destroy_kernels(self, kernels: dict[str, str]) -> None:
        """Remove kernels (id -> agent id) on their agents, concurrently; failures are logged."""
        mgr = self.mgr

        async def one(kid, aid):
            try:
                await (await mgr.agents.client_for(aid)).destroy_kernel(kid)
            except BackendAIError as e:
                mgr.log.warning("could not destroy kernel %s on %s: %s", kid, aid, e.detail)

        await asyncio.gather(*(one(k, a) for k, a in kernels.items()))

    async def mount_specs(self, sess: Session, found: dict,
                          mount_points: bool = False) -> list[dict]:
        """The session's vfolders as the agents mount them (``spec["mounts"]``), by
        their states as read at the start (``found``: :func:`folder_states`).

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
        storage = self.mgr.storage
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
                source = await storage.mount_path(m["host"], m["quota_scope_id"], m["id"])
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
                    await storage.mkdir(home["host"], home["quota_scope_id"], home["id"],
                                        name, parents=True)
                except BackendAIError as e:
                    raise VFolderUnavailable(
                        f"vfolder {m['name']!r} cannot be mounted at {m['target']} in your home "
                        f"folder: {e.detail}") from None
                except OSError as e:
                    raise VFolderUnavailable(
                        f"vfolder {m['name']!r} cannot be mounted at {m['target']}: {e}") from None
        return out

    def kernel_specs(self, sess: Session, kernels: list[Kernel], agents: dict, owner: str,
                     mounts: list[dict] = (), ssh_key: str | None = None,
                     bounds: dict | None = None) -> list[KernelSpec]:
        """What each agent gets: the main kernel serves Jupyter (or runs the batch
        command), the others idle; all know the session's cluster and mount the
        session's vfolders. ``ssh_key``: the public key the main kernel's sshd is
        published for (issue 12, :func:`sshkeys.session_public_key`)."""
        local_agents = self.mgr.local_agents
        hosts = [_cluster_host(k, sess.id, *agents[k.agent_id], local_agents) for k in kernels]
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
            specs.append(KernelSpec(
                kernel_id=k.id,
                session_id=sess.id,
                owner=owner,
                image=sess.image,
                slots=k.requested_slots,
                environ=env,
                service_prefix=sess.service_prefix,
                kernel_type=kernel_type,
                command=sess.startup_command if kernel_type == BATCH else None,
                cluster_hostname=k.cluster_hostname,
                network_alias=_network_alias(k, sess.id),
                mounts=tuple(dict(m) for m in mounts),
                cluster_role=k.cluster_role,
                cluster_agents=n_agents,
                cluster_ssh=cluster_ssh,
                ssh_public_key=ssh_key if main and ssh_key else None,
                starts_beside=self.mgr.starts_beside(sess.id, k.agent_id),
                **(bounds or {}),
            ))
        return specs


def folder_states(s, sess: Session) -> dict:
    """{folder id: (status, the session's user's permission)} of the session's folders."""
    if not sess.vfolder_mounts:
        return {}
    user = s.get(User, sess.user_id)
    return {f.id: (f.status, mount_permission(s, user, f)) for f in s.scalars(
        select(VFolder).where(VFolder.id.in_([m["id"] for m in sess.vfolder_mounts])))}


def kernel_bounds(s, access_key: str, project_id: str | None = None) -> dict:
    """The kernel bounds of a keypair's resource policy (issue 24): ``pids_limit`` and
    ``tmp_size`` where the policy sets them (else the agent's own defaults apply); and
    the container ids of the keypair's user (issue 27, Backend.AI 26.09's
    ``container_uid``, ``container_main_gid``, ``container_gids``) where set, and the
    dotfiles of that user, the session's project and the user's domain (issue 27)."""
    from ...models import Keypair, KeypairResourcePolicy
    from ..templates import session_dotfiles

    kp = s.get(Keypair, access_key)
    policy = s.get(KeypairResourcePolicy, kp.resource_policy) if kp is not None else None
    out = {}
    user = s.get(User, kp.user_id) if kp is not None else None
    for field in ("container_uid", "container_main_gid"):
        if user is not None and getattr(user, field) is not None:
            out[field] = getattr(user, field)
    if user is not None and user.container_gids:
        out["container_gids"] = tuple(user.container_gids)
    dotfiles = session_dotfiles(s, user.id, project_id) if user is not None else []
    if dotfiles:
        out["dotfiles"] = tuple(dotfiles)
    if policy is not None and policy.max_pids_per_kernel:
        out["pids_limit"] = policy.max_pids_per_kernel
    if policy is not None and policy.max_tmp_size:
        out["tmp_size"] = policy.max_tmp_size
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
