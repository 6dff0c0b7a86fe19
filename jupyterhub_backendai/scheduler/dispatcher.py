"""Scheduler v0: FIFO over one resource group, slot check, allocation in one transaction.

A pass reads the group's PENDING sessions oldest first and its live agents, and
places every session that fits (a session that does not fit is skipped, so a
large head does not block small ones; a later scheduler adds reservations
against starvation). Agent rows are locked (``FOR UPDATE`` on PostgreSQL,
``BEGIN IMMEDIATE`` on SQLite) so that two schedulers never place beyond
capacity; pending rows are taken with ``SKIP LOCKED`` so that two schedulers
never place the same session.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.orm import selectinload, sessionmaker

from ..common.slots import ResourceSlot
from ..common.types import AgentStatus, SessionStatus
from ..models import Agent, Session
from ..models.base import utcnow


def set_status(sess: Session, status: str, info: str | None = None) -> None:
    sess.status = status
    if info is not None:
        sess.status_info = info
    hist = dict(sess.status_history or {})
    hist[status] = utcnow().isoformat()
    sess.status_history = hist


def schedule_pass(sm: sessionmaker, resource_group: str) -> list[str]:
    """Place what fits; return the ids of sessions that became SCHEDULED."""
    placed: list[str] = []
    with sm.begin() as db:
        pending = db.scalars(
            select(Session)
            .where(Session.status == SessionStatus.PENDING, Session.resource_group == resource_group)
            .order_by(Session.priority.desc(), Session.created_at, Session.id)
            .options(selectinload(Session.kernels))
            .with_for_update(skip_locked=True, of=Session)
        ).all()
        if not pending:
            return placed
        agents = db.scalars(
            select(Agent)
            .where(
                Agent.status == AgentStatus.ALIVE,
                Agent.schedulable.is_(True),
                Agent.resource_group == resource_group,
            )
            .order_by(Agent.id)
            .with_for_update()
        ).all()
        free = {a.id: a.available_slots - a.occupied_slots for a in agents}
        for sess in pending:
            need = ResourceSlot()
            for k in sess.kernels:
                need = need + k.requested_slots
            # Concentrated: the agent left with the least free after placing (pack).
            fitting = [a for a in agents if need.fits_in(free[a.id])]
            if not fitting:
                info = f"waiting for resources: no agent has {need.nonzero().describe()} free"
                if sess.status_info != info:
                    sess.status_info = info
                continue
            agent = min(fitting, key=lambda a: (sum((free[a.id] - need).values()), a.id))
            for k in sess.kernels:
                k.agent_id = agent.id
                k.occupied_slots = ResourceSlot(k.requested_slots)
                k.status = SessionStatus.SCHEDULED
            agent.occupied_slots = agent.occupied_slots + need
            free[agent.id] = free[agent.id] - need
            set_status(sess, SessionStatus.SCHEDULED, f"scheduled on {agent.id}")
            placed.append(sess.id)
    return placed


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


def check_consistency(sm: sessionmaker) -> list[str]:
    """Each agent's occupied slots must equal the sum over its live kernels. Returns problems."""
    problems = []
    with sm() as db:
        from ..models import Kernel

        for a in db.scalars(select(Agent)):
            total = ResourceSlot()
            for k in db.scalars(select(Kernel).where(Kernel.agent_id == a.id)):
                total = total + k.occupied_slots
            if total.nonzero() != a.occupied_slots.nonzero():
                problems.append(
                    f"agent {a.id}: occupied {a.occupied_slots.to_json()} != kernels {total.nonzero().to_json()}"
                )
    return problems


def lost_agents(sm: sessionmaker, timeout: float) -> list[str]:
    cutoff = utcnow() - dt.timedelta(seconds=timeout)
    with sm.begin() as db:
        lost = db.scalars(
            select(Agent).where(Agent.status == AgentStatus.ALIVE, Agent.last_heartbeat < cutoff)
        ).all()
        for a in lost:
            a.status = AgentStatus.LOST
        return [a.id for a in lost]
