"""The lifecycle's writes: every change of a session's or kernel's status, every claim
on a session's step, every release of slots, each inside the caller's transaction with
the session row locked. Nothing outside :mod:`..lifecycle` (and the scheduler's
placement commit, :mod:`..scheduler.allocator`, for PENDING -> SCHEDULED/CANCELLED)
writes a session's status.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from sqlalchemy import or_, select, update
from sqlalchemy.orm import selectinload

from ...agent.backends.base import BATCH
from ...common.slots import ResourceSlot
from ...common.types import (
    ALIVE_STATUSES,
    DEAD_STATUSES,
    STARTING_STATUSES,
    AgentStatus,
    SessionStatus,
    UserStatus,
)
from ...models import Agent, Kernel, Keypair, KeypairResourcePolicy, Session, User
from ...models.base import utcnow

SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
LOST_MARK = "agent lost: "


def set_status(sess: Session, status: str, info: str | None = None) -> None:
    """Set an ORM session's status (and reason), stamping the time in its history."""
    sess.status = status
    if info is not None:
        sess.status_info = info
    hist = dict(sess.status_history or {})
    hist[status] = utcnow().isoformat()
    sess.status_history = hist


def release_kernels(db, sess: Session, kernel_status: str) -> None:
    """Give back what the session's kernels hold on their agents (caller holds the transaction)."""
    agent_ids = sorted({k.agent_id for k in sess.kernels if k.agent_id and any(k.occupied_slots.values())})
    agents = {
        a.id: a
        for a in db.scalars(select(Agent).where(Agent.id.in_(agent_ids)).order_by(Agent.id).with_for_update())
    } if agent_ids else {}
    now = utcnow()
    for k in sess.kernels:
        if k.agent_id in agents and any(k.occupied_slots.values()):
            a = agents[k.agent_id]
            a.occupied_slots = (a.occupied_slots - k.occupied_slots).nonzero()
            k.occupied_slots = ResourceSlot()
        if k.status not in (SessionStatus.TERMINATED, SessionStatus.ERROR, SessionStatus.CANCELLED):
            k.status = kernel_status
            k.terminated_at = now


def new_kernels(slots: ResourceSlot, cluster_size: int) -> list[Kernel]:
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


def queue(sess: Session, slots: ResourceSlot) -> None:
    """A new session (not yet added): PENDING, with one kernel row per cluster index."""
    set_status(sess, SessionStatus.PENDING, "waiting for the scheduler")
    sess.kernels.extend(new_kernels(slots, sess.cluster_size))


def load_session(s, sid: str) -> Session | None:
    return s.scalar(select(Session).where(Session.id == sid).options(selectinload(Session.kernels)))


# -- transitions -------------------------------------------------------------------------


def lock_session(s, sid: str) -> Session | None:
    """The session row locked for a state change, with its kernels read fresh."""
    return s.scalar(
        select(Session)
        .where(Session.id == sid)
        .options(selectinload(Session.kernels))
        .with_for_update(of=Session)
        .execution_options(populate_existing=True)
    )


def transition(s, sid: str, frm: Iterable[str], to: str, info: str = "", *,
               owner: str | None = None, lease: float | None = None) -> bool:
    """``frm`` -> ``to`` for the session and its kernels; False when it is elsewhere.
    With ``owner``, the step is claimed for ``lease`` seconds."""
    sess = s.get(Session, sid, with_for_update=True, populate_existing=True)
    if sess is None or sess.status not in set(frm):
        return False
    set_status(sess, to, info)
    for k in sess.kernels:
        k.status = to
    if owner is not None:
        sess.owner = owner
        sess.lease_until = utcnow() + dt.timedelta(seconds=lease or 0)
    return True


def begin_termination(s, sid: str, status: str, info: str, owner: str, lease: float) -> bool:
    """Any alive status -> TERMINATING, remembering the status it will end in."""
    sess = s.get(Session, sid, with_for_update=True, populate_existing=True)
    if sess is None or sess.status not in ALIVE_STATUSES:
        return False
    if sess.status != SessionStatus.TERMINATING:
        set_status(sess, SessionStatus.TERMINATING, info)
        for k in sess.kernels:
            k.status = SessionStatus.TERMINATING
        sess.end_status = status
    sess.owner = owner
    sess.lease_until = utcnow() + dt.timedelta(seconds=lease)
    return True


def terminate(s, sid: str, status: str, info: str, result: str | None = None,
              logs: dict[str, str] | None = None) -> bool:
    """Mark dead and free the slots. False when it was dead already."""
    sess = lock_session(s, sid)
    if sess is None or sess.status in DEAD_STATUSES:
        return False
    release_kernels(s, sess, status)
    for k in sess.kernels:
        if logs and logs.get(k.id) and not k.logs:
            k.logs = logs[k.id]
    set_status(sess, status, info)
    sess.alive_marker = None
    sess.terminated_at = utcnow()
    sess.result = result or (SUCCESS if status == SessionStatus.TERMINATED else FAILURE)
    sess.owner = sess.lease_until = sess.awaited_until = None
    return True


def start_failed(s, sid: str, reason: str, limit: int,
                 counted: bool = True) -> tuple[str, str] | None:
    """Release the slots; back to PENDING for another try (fresh kernel rows), or ERROR
    once ``limit`` retries are used; not ``counted``, back to PENDING without using a
    try. Returns (resource group, "retry" | "requeued" | "error")."""
    sess = lock_session(s, sid)
    if sess is None or sess.status not in STARTING_STATUSES:
        return None
    release_kernels(s, sess, SessionStatus.ERROR)
    sess.owner = sess.lease_until = None
    if not counted or sess.retries < limit:
        if counted:
            sess.retries += 1
        # Fresh kernel rows (new ids): late events about the failed containers
        # cannot touch the next attempt.
        slots = sess.kernels[0].requested_slots
        for k in list(sess.kernels):
            s.delete(k)
        s.flush()
        s.expire(sess, ["kernels"])
        for k in new_kernels(slots, sess.cluster_size):
            k.session_id = sess.id
            s.add(k)
        if not counted:
            set_status(sess, SessionStatus.PENDING, f"back in the queue: {reason}")
            return sess.resource_group, "requeued"
        set_status(sess, SessionStatus.PENDING, f"start failed ({reason}); retry {sess.retries} of {limit}")
        return sess.resource_group, "retry"
    tries = sess.retries + 1
    set_status(sess, SessionStatus.ERROR,
               f"failed to start: {reason}" + (f" (after {tries} attempts)" if tries > 1 else ""))
    sess.alive_marker = None
    sess.terminated_at = utcnow()
    sess.result = FAILURE
    sess.awaited_until = None
    return sess.resource_group, "error"


def claim(s, sid: str, statuses: Iterable[str], owner: str, lease: float,
          dead_owner: str | None = None) -> bool:
    """Take the session's claim when it is in ``statuses`` and unclaimed, claimed by
    ``owner`` already, expired, or held by ``dead_owner`` (known dead). One UPDATE:
    of several managers, exactly one wins."""
    now = utcnow()
    free = or_(Session.owner.is_(None), Session.owner == owner, Session.lease_until.is_(None),
               Session.lease_until < now)
    if dead_owner:
        free = or_(free, Session.owner == dead_owner)
    n = s.execute(
        update(Session)
        .where(Session.id == sid, Session.status.in_(list(statuses)), free)
        .values(owner=owner, lease_until=now + dt.timedelta(seconds=lease))
        .execution_options(synchronize_session=False)
    ).rowcount
    return n == 1


def renew(s, sids: list[str], owner: str, lease: float) -> None:
    if sids:
        s.execute(
            update(Session)
            .where(Session.id.in_(sids), Session.owner == owner)
            .values(lease_until=utcnow() + dt.timedelta(seconds=lease))
            .execution_options(synchronize_session=False)
        )


def await_session(s, sid: str, seconds: float | None) -> None:
    """A spawner waits (``seconds`` from now), or JupyterHub knows it (None)."""
    s.execute(
        update(Session)
        .where(Session.id == sid, Session.alive_marker.is_not(None))
        .values(awaited_until=None if seconds is None else utcnow() + dt.timedelta(seconds=seconds))
        .execution_options(synchronize_session=False)
    )


# -- what needs a handler ------------------------------------------------------------------


def due_sessions(s, now: dt.datetime) -> list[tuple[str, str, str | None, dt.datetime | None, dict]]:
    """(id, status, owner, lease_until, status_history) of sessions in a transient
    status (SCHEDULED .. TERMINATING): the candidates of the status handlers."""
    return [tuple(r) for r in s.execute(
        select(Session.id, Session.status, Session.owner, Session.lease_until, Session.status_history)
        .where(Session.status.in_([*STARTING_STATUSES, SessionStatus.TERMINATING]))
    )]


def abandoned_sessions(s, now: dt.datetime) -> list[str]:
    """Alive sessions whose spawner stopped waiting before JupyterHub knew them."""
    return list(s.scalars(
        select(Session.id).where(Session.alive_marker.is_not(None), Session.awaited_until.is_not(None),
                                 Session.awaited_until < now)
    ))


def sessions_on_lost_agents(s) -> list[tuple[str, str, str, dt.datetime]]:
    """(session id, status_info, agent id, agent's last heartbeat) for every RUNNING
    session with a kernel on a LOST agent."""
    rows = s.execute(
        select(Session.id, Session.status_info, Agent.id, Agent.last_heartbeat)
        .join(Kernel, Kernel.session_id == Session.id)
        .join(Agent, Agent.id == Kernel.agent_id)
        .where(Session.status == SessionStatus.RUNNING, Agent.status == AgentStatus.LOST)
    ).all()
    seen, out = set(), []
    for sid, info, aid, hb in rows:
        if sid not in seen:
            seen.add(sid)
            out.append((sid, info, aid, hb))
    return out


def mark_lost(s, sid: str, info: str) -> bool:
    """Say in a RUNNING session's status_info that its agent is lost (once)."""
    return s.execute(
        update(Session)
        .where(Session.id == sid, Session.status == SessionStatus.RUNNING,
               ~Session.status_info.startswith(LOST_MARK))
        .values(status_info=info)
        .execution_options(synchronize_session=False)
    ).rowcount == 1


def unmark_returned(s) -> list[str]:
    """RUNNING sessions marked lost whose agents are all ALIVE again: 'running' again."""
    rows = s.execute(
        select(Session.id, Agent.status)
        .join(Kernel, Kernel.session_id == Session.id)
        .join(Agent, Agent.id == Kernel.agent_id)
        .where(Session.status == SessionStatus.RUNNING, Session.status_info.startswith(LOST_MARK))
    ).all()
    lost = {sid for sid, st in rows if st != AgentStatus.ALIVE}
    back = sorted({sid for sid, _ in rows} - lost)
    if back:
        s.execute(
            update(Session)
            .where(Session.id.in_(back), Session.status_info.startswith(LOST_MARK))
            .values(status_info="running")
            .execution_options(synchronize_session=False)
        )
    return back


def kernels_on(s, agent_id: str) -> dict[str, tuple[str, str]]:
    """Kernel id -> (session id, session status) of alive sessions' kernels on an agent."""
    return {
        kid: (sid, st)
        for kid, sid, st in s.execute(
            select(Kernel.id, Session.id, Session.status)
            .join(Session, Session.id == Kernel.session_id)
            .where(Kernel.agent_id == agent_id, Session.alive_marker.is_not(None))
        )
    }


def last_words(logs: str | None, limit: int = 400) -> str:
    """The last lines of a kernel's output (what it said before it ended), to follow a
    failure's reason: '' when it said nothing."""
    lines = [line.strip() for line in (logs or "").splitlines() if line.strip()]
    if not lines:
        return ""
    tail = " / ".join(lines[-3:])
    return f"; its last output: {tail[-limit:]}"


def kernel_ended(s, kernel_id: str, exit_code: int | None, logs: str | None):
    """Record a kernel's exit code and output; returns (session id, session status,
    session type, role, hostname, exit code), or None for an unknown kernel."""
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


def mark_running(s, sid: str, created: dict[str, dict]) -> tuple[str, str | None]:
    """CREATING -> RUNNING once every kernel was created (``created``: kernel id -> the
    agent's record of it). Returns ("running", id of a batch main kernel that already
    ended, or None), ("failed", reason) when a kernel ended while starting, or
    ("gone", None) when the session is no longer CREATING."""
    se = s.get(Session, sid, with_for_update=True, populate_existing=True)
    if se is None or se.status != SessionStatus.CREATING:
        return "gone", None
    rows = {k.id: k for k in s.scalars(select(Kernel).where(Kernel.session_id == sid))}
    exited = [k for k in rows.values() if k.exit_code is not None]
    if exited and (se.session_type != BATCH or any(k.cluster_role != "main" for k in exited)):
        k = exited[0]
        return "failed", (f"kernel {k.cluster_hostname} exited with code {k.exit_code} while "
                          f"starting{last_words(k.logs)}")
    for kid, rec in created.items():
        k = rows[kid]
        k.container_id = rec["container_id"]
        k.kernel_host = rec["host"]
        k.service_ports = rec["service_ports"]
        k.attached_devices = {"cuda": rec.get("cuda_devices", [])}
        k.status = SessionStatus.RUNNING
    set_status(se, SessionStatus.RUNNING, "running")
    se.owner = se.lease_until = None  # the start is done
    return "running", exited[0].id if exited else None


def end_of_kernel(session_type: str, role: str, hostname: str, code: int | None) -> tuple[str, str, str]:
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


def batches_past_timeout(s, now: dt.datetime) -> list[str]:
    """RUNNING batch sessions whose batch_timeout (from RUNNING) has passed."""
    late = []
    for sid, history, timeout in s.execute(
        select(Session.id, Session.status_history, Session.batch_timeout).where(
            Session.status == SessionStatus.RUNNING,
            Session.session_type == BATCH,
            Session.batch_timeout.is_not(None),
        )
    ):
        since = (history or {}).get(SessionStatus.RUNNING)
        if since and dt.datetime.fromisoformat(since) + dt.timedelta(seconds=timeout) <= now:
            late.append(sid)
    return late


def past_policy_limits(s, now: dt.datetime) -> list[tuple[str, str, str, str]]:
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
            policy.max_session_lifetime, policy.idle_timeout, Session.lifetime_extension,
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
    for sid, stype, history, last_activity, lifetime, idle, extension in rows:
        since = (history or {}).get(SessionStatus.RUNNING)
        if not since:
            continue
        running_since = dt.datetime.fromisoformat(since)
        # Issue 29: the owner's extensions (manager/sessions.py extend_lifetime) move the end.
        if lifetime and running_since + dt.timedelta(seconds=lifetime + (extension or 0)) <= now:
            info = f"reached max_session_lifetime ({lifetime} s, keypair policy" + (
                f", extended by {extension} s)" if extension else ")")
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


def record_activity(s, sid: str, when: dt.datetime) -> int:
    """Move ``last_activity`` forward to ``when`` (never back); 1 when it moved."""
    return s.execute(
        update(Session)
        .where(Session.id == sid, or_(Session.last_activity.is_(None), Session.last_activity < when))
        .values(last_activity=when)
        .execution_options(synchronize_session=False)
    ).rowcount


# Issue 12/22: the entries of a main kernel's service ports that its published sshd has.
SSH_PORT_NAMES = ("sshd", "sftp")


def _is_ssh_port(sp: dict) -> bool:
    return sp.get("name") in SSH_PORT_NAMES and sp.get("protocol") == "tcp"


def ssh_to_withdraw(s, resource_groups: Iterable[str]) -> list[tuple[str, str, str, str, str]]:
    """Issue 22: (session id, access key, main kernel id, its agent id, the agent's
    address) of every RUNNING session of ``resource_groups`` whose keypair is inactive
    or gone, or whose user is not active, and whose main kernel still lists its sshd
    (the key was not withdrawn yet: :func:`ssh_withdrawn` takes the entries away).
    One query; the few candidates are filtered here (JSON is not compared in SQL)."""
    groups = list(resource_groups or ())
    if not groups:
        return []
    rows = s.execute(
        select(Session.id, Session.access_key, Kernel.id, Kernel.agent_id, Agent.addr,
               Kernel.service_ports)
        .join(Kernel, Kernel.session_id == Session.id)
        .outerjoin(Agent, Agent.id == Kernel.agent_id)
        .outerjoin(Keypair, Keypair.access_key == Session.access_key)
        .outerjoin(User, User.id == Session.user_id)
        .where(Session.status == SessionStatus.RUNNING, Session.resource_group.in_(groups),
               Kernel.cluster_role == "main",
               or_(Keypair.access_key.is_(None), Keypair.is_active.is_not(True),
                   User.id.is_(None), User.status != UserStatus.ACTIVE))
    ).all()
    return [(sid, ak, kid, aid, addr or "") for sid, ak, kid, aid, addr, ports in rows
            if aid and any(_is_ssh_port(sp) for sp in ports or [])]


def ssh_withdrawn(s, kernel_id: str) -> bool:
    """Issue 22: the kernel's key was withdrawn: its sshd leaves its service ports (the
    API stops listing it, ``ssh-key`` answers 404, :func:`ssh_to_withdraw` skips it).
    The sshd itself keeps listening for the kernel's other keys (a cluster's own)."""
    k = s.get(Kernel, kernel_id, with_for_update=True)
    if k is None:
        return False
    ports = [sp for sp in k.service_ports or [] if not _is_ssh_port(sp)]
    if len(ports) == len(k.service_ports or []):
        return False
    k.service_ports = ports
    return True
