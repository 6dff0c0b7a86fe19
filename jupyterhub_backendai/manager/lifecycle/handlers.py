"""The status handlers: one class per row of the status table (docs/architecture.md).

Each declares the statuses of the sessions it takes (``takes``) and the status
changes it may write (``writes``); :meth:`Handler.transition` refuses any other, so
the table and the code cannot drift apart silently. The :class:`~.driver.Driver` runs
them every scheduler loop from what the record says, never from a task's memory, the
way Backend.AI's Sokovan lifecycle handlers do.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import ClassVar

from ...common.types import ALIVE_STATUSES, SessionStatus
from . import claims, record
from .start import fault_hold
from .steps import START, TIMER

S = SessionStatus
DEAD = (S.TERMINATED, S.ERROR, S.CANCELLED)
# Ending a session: any alive status -> TERMINATING -> dead, PENDING -> CANCELLED/dead.
ENDS = frozenset({(a, S.TERMINATING) for a in ALIVE_STATUSES if a != S.TERMINATING}
                 | {(S.TERMINATING, d) for d in DEAD}
                 | {(S.PENDING, d) for d in DEAD})


class LifecycleError(RuntimeError):
    """A handler wrote a status change it does not declare (a bug, not a user's error)."""


class Handler:
    """One row of the status table."""

    takes: ClassVar[frozenset[str]] = frozenset()
    writes: ClassVar[frozenset[tuple[str, str]]] = frozenset()
    # False: the handler changes no status (``writes`` stays empty, on purpose).
    changes_status: ClassVar[bool] = True
    # "before": ahead of the scheduler's pass (frees capacity for it); "after": behind it
    stage: ClassVar[str] = "after"

    def __init__(self, driver) -> None:
        self.driver = driver
        self.mgr = driver.mgr

    async def run(self, rnd: Round) -> None:
        raise NotImplementedError

    async def transition(self, sid: str, frm: set, to: str, info: str = "") -> bool:
        """``frm`` -> ``to`` (:func:`.record.transition`), this process claiming the step."""
        undeclared = {(f, to) for f in frm} - self.writes
        if undeclared:
            raise LifecycleError(f"{type(self).__name__} does not declare {sorted(undeclared)}")
        mgr = self.mgr
        done = await mgr.db(record.transition, sid, frm, to, info, owner=mgr.owner_id,
                            lease=mgr.claim_lease)
        if done:
            mgr.changed(sid, to)
            await fault_hold(mgr.log, to)
        return done

    def end(self, sid: str, status: str, info: str, result: str | None = None) -> bool:
        """End ``sid`` in the background unless this process is ending it already."""
        return self.driver.end_once(sid, status, info, result)


class Round:
    """What one run of the driver read: the time, the sessions in a transient status
    (SCHEDULED .. TERMINATING), and those already given to a handler this round."""

    def __init__(self, now: dt.datetime, due: list) -> None:
        self.now = now
        self.due = due
        self.handled: set[str] = set()

    def free(self, driver, status_set, owner_check: bool = True):
        """(sid, status, dead owner, history) of due sessions in ``status_set`` that no
        live manager drives: unclaimed, claimed by this process, expired, or held by a
        process of this host that died."""
        mgr = driver.mgr
        for sid, status, owner, lease, history in self.due:
            if status not in status_set or sid in self.handled or driver.steps.driving(sid):
                continue
            dead = owner if claims.owner_is_dead(owner, mgr.owner_id) else None
            if owner_check and not (owner is None or owner == mgr.owner_id or dead
                                    or lease is None or lease < self.now):
                continue  # another live manager drives it
            yield sid, status, dead, history


class PolicyLimits(Handler):
    """RUNNING past its keypair policy's max_session_lifetime or idle_timeout: ended
    (TERMINATED; a batch session past its lifetime ERROR), at most every
    ``lifetime_check_interval`` seconds."""

    takes = frozenset({S.RUNNING})
    writes = ENDS
    stage = "before"

    def __init__(self, driver) -> None:
        super().__init__(driver)
        self._checked = 0.0  # loop time of the last sweep

    async def run(self, rnd: Round) -> None:
        await self.sweep()

    async def sweep(self, force: bool = False) -> list[str]:
        """End the sessions past their limits; returns the ids being ended. Another
        manager may find the same sessions: ending one already dead does nothing."""
        mgr = self.mgr
        loop_now = asyncio.get_running_loop().time()
        if not force and loop_now - self._checked < mgr.lifetime_check_interval:
            return []
        self._checked = loop_now
        ending = []
        for sid, status, info, result in await mgr.db_read(record.past_policy_limits, record.utcnow()):
            if self.end(sid, status, info, result):
                ending.append(sid)
        return ending


class BatchTimeout(Handler):
    """RUNNING batch session past its batch_timeout that no timer of this process
    watches (after a restart, or started by another manager): ERROR, FAILURE."""

    takes = frozenset({S.RUNNING})
    writes = ENDS
    stage = "before"

    async def run(self, rnd: Round) -> None:
        steps = self.driver.steps
        for sid in await self.mgr.db_read(record.batches_past_timeout, record.utcnow()):
            if steps.get(TIMER, sid) is None:
                self.end(sid, S.ERROR, "batch timeout", record.FAILURE)


class InterruptedStart(Handler):
    """PREPARING or CREATING whose start nobody drives any more (its manager died) or
    that took longer than ``start_deadline``: what was created is removed, then the
    start is retried (PENDING) or ends in ERROR with the reason."""

    takes = frozenset({S.PREPARING, S.CREATING})
    writes = frozenset({(f, t) for f in (S.PREPARING, S.CREATING) for t in (S.PENDING, S.ERROR)})

    async def run(self, rnd: Round) -> None:
        mgr, starter = self.mgr, self.driver.starter
        deadline = dt.timedelta(seconds=mgr.start_deadline)
        for sid, status, _owner, _lease, history in rnd.due:
            scheduled_at = (history or {}).get(S.SCHEDULED)
            if status in self.takes and scheduled_at and (
                    dt.datetime.fromisoformat(scheduled_at) + deadline <= rnd.now):
                rnd.handled.add(sid)
                mgr.background(starter.recover(
                    sid, None, f"it did not start within start_deadline ({mgr.start_deadline:g} s)"))
        for sid, _status, dead, _ in rnd.free(self.driver, self.takes):
            rnd.handled.add(sid)
            mgr.background(starter.recover(sid, dead, "start interrupted: the manager starting it stopped"))


class Start(Handler):
    """SCHEDULED: start it (claim, then PREPARING -> CREATING -> RUNNING, every kernel
    or none; a failure releases the slots and retries or ends in ERROR)."""

    takes = frozenset({S.SCHEDULED})
    writes = frozenset({(S.SCHEDULED, S.PREPARING), (S.PREPARING, S.CREATING),
                        (S.CREATING, S.RUNNING)}
                       | {(f, t) for f in (S.SCHEDULED, S.PREPARING, S.CREATING)
                          for t in (S.PENDING, S.ERROR)})

    async def run(self, rnd: Round) -> None:
        for sid, _status, dead, _ in rnd.free(self.driver, self.takes):
            rnd.handled.add(sid)
            self.begin(sid, dead)

    def begin(self, sid: str, dead_owner: str | None = None) -> None:
        self.driver.steps.spawn(START, sid, self.driver.starter.start(sid, dead_owner))


class Termination(Handler):
    """TERMINATING whose end nobody drives any more: the kernels are removed and the
    session ends with the status recorded when its end began (``end_status``)."""

    takes = frozenset({S.TERMINATING})
    writes = ENDS

    async def run(self, rnd: Round) -> None:
        for sid, _status, dead, _ in rnd.free(self.driver, self.takes):
            rnd.handled.add(sid)
            self.mgr.background(self.finish(sid, dead))

    async def finish(self, sid: str, dead_owner: str | None) -> None:
        mgr = self.mgr
        if not await mgr.db(record.claim, sid, {S.TERMINATING}, mgr.owner_id, mgr.claim_lease,
                            dead_owner):
            return
        sess = await mgr.db(record.load_session, sid)
        if sess is None or sess.status != S.TERMINATING:
            return
        await self.driver.ending.end(sid, sess.end_status or S.ERROR, sess.status_info)


class LostAgent(Handler):
    """RUNNING with a kernel on a LOST agent: said in ``status_info`` at once; past
    ``agent_lost_grace`` ended (ERROR, slots freed); an agent that returns in time
    keeps it ("running" again)."""

    takes = frozenset({S.RUNNING})
    writes = ENDS

    async def run(self, rnd: Round) -> None:
        mgr = self.mgr
        limit = mgr.agent_lost_timeout + mgr.agent_lost_grace
        for sid, info, aid, hb in await mgr.db_read(record.sessions_on_lost_agents):
            silent = (rnd.now - hb).total_seconds()
            if silent >= limit:
                self.end(sid, S.ERROR,
                         f"agent {aid} was lost: no heartbeat for {silent:.0f} s "
                         f"(agent_lost_timeout {mgr.agent_lost_timeout:g} s + "
                         f"agent_lost_grace {mgr.agent_lost_grace:g} s)")
            elif not (info or "").startswith(record.LOST_MARK):
                ends = hb + dt.timedelta(seconds=limit)
                if await mgr.db(record.mark_lost, sid,
                                f"{record.LOST_MARK}{aid} is silent since {hb:%H:%M:%S} UTC; "
                                f"the session ends at {ends:%H:%M:%S} UTC unless it returns"):
                    mgr.changed(sid, S.RUNNING)
        for sid in await mgr.db(record.unmark_returned):
            mgr.changed(sid, S.RUNNING)


class Abandoned(Handler):
    """Any alive status with ``awaited_until`` past: JupyterHub no longer waits for it
    (the hub died while it started, and the new one does not know it): ended."""

    takes = frozenset(ALIVE_STATUSES)
    writes = ENDS

    async def run(self, rnd: Round) -> None:
        for sid in await self.mgr.db_read(record.abandoned_sessions, rnd.now):
            if sid in rnd.handled:
                continue  # its handler first (a start's leftovers removed); ended next round
            if sid in self.mgr.sessions.waited_here:
                continue  # a spawner of this process waits on it: its renewal is late, not gone
            self.end(sid, S.TERMINATED,
                     "JupyterHub no longer waits for this server (the hub stopped while it "
                     "was starting); start it again", record.FAILURE)


class KernelExit(Handler):
    """RUNNING, one of its kernels ended (an agent's event or a reconciliation): ended
    as the kernel's exit says (a batch command's exit code 0: TERMINATED, SUCCESS)."""

    takes = frozenset({S.RUNNING})
    writes = ENDS

    async def run(self, rnd: Round) -> None:
        return None  # driven by events, not by the record

    async def exited(self, kernel_id: str, exit_code: int | None, logs: str | None) -> None:
        found = await self.mgr.db(record.kernel_ended, kernel_id, exit_code, logs)
        if not found:
            return
        sid, status, session_type, role, hostname, code = found
        if status != S.RUNNING:
            return  # starting (the start notices) or already on its way out
        status, result, info = record.end_of_kernel(session_type, role, hostname, code)
        self.mgr.background(self.driver.ending.end(sid, status, info, result=result))


class SSHWithdrawal(Handler):
    """RUNNING in an SSH resource group (``ssh_resource_groups``), its keypair inactive or
    deleted or its user not active, its main kernel's sshd still listed: the keypair's
    SSH key is withdrawn from the kernel by its agent (the authorized_keys line, the
    connections it opened), then the sshd leaves the kernel's service ports (what marks
    it done, in the record: every manager sees it, and a reactivated keypair does not get
    the key back). The session keeps running. One query at most every ``interval``
    seconds, whoever deactivated it (API, CLI, SQL); a failed withdrawal is retried
    after ``retry_after`` seconds."""

    takes = frozenset({S.RUNNING})
    writes = frozenset()
    changes_status = False
    interval: ClassVar[float] = 2.0
    retry_after: ClassVar[float] = 10.0

    def __init__(self, driver) -> None:
        super().__init__(driver)
        self._checked = float("-inf")  # loop time of the last query
        self._busy: set[str] = set()  # sessions being withdrawn by this process
        self._retry: dict[str, float] = {}  # session -> loop time of its next try

    async def run(self, rnd: Round) -> None:
        mgr = self.mgr
        groups = list(mgr.ssh_resource_groups or ())
        loop_now = asyncio.get_running_loop().time()
        if not groups or loop_now - self._checked < self.interval:
            return
        self._checked = loop_now
        found = await mgr.db_read(record.ssh_to_withdraw, groups)
        self._retry = {sid: t for sid, t in self._retry.items() if any(f[0] == sid for f in found)}
        for sid, ak, kid, aid, addr in found:
            if sid in self._busy or self._retry.get(sid, loop_now) > loop_now:
                continue
            self._busy.add(sid)
            mgr.background(self.withdraw(sid, ak, kid, aid, addr))

    async def withdraw(self, sid: str, access_key: str, kernel_id: str, agent_id: str,
                       addr: str) -> None:
        mgr = self.mgr
        try:
            done = await mgr.agents.client(agent_id, addr).revoke_ssh_key(kernel_id, access_key)
            await mgr.db(record.ssh_withdrawn, kernel_id)
            self._retry.pop(sid, None)
            mgr.log.info("session %s: SSH key of keypair %s withdrawn (its keypair or user is "
                         "no longer active): %s line(s) removed, %s connection(s) ended",
                         sid, access_key, done.get("removed"), len(done.get("ended") or []))
        except Exception as e:
            self._retry[sid] = asyncio.get_running_loop().time() + self.retry_after
            mgr.log.warning("session %s: withdrawing the SSH key of keypair %s on agent %s "
                            "failed (retried in %g s): %s", sid, access_key, agent_id,
                            self.retry_after, e)
        finally:
            self._busy.discard(sid)


# The status table, in the order the driver runs the rows.
HANDLERS: tuple[type[Handler], ...] = (
    PolicyLimits, BatchTimeout, InterruptedStart, Start, Termination, LostAgent, Abandoned,
    KernelExit, SSHWithdrawal,
)

