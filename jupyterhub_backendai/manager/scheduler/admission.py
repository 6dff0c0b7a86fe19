"""Admission at enqueue: refuse with a 4xx what the scheduler would never place.

The manager calls :func:`admit` inside the transaction that creates the session,
before anything is committed, so a refused request leaves nothing behind. The
keypair row is locked first (``FOR UPDATE`` on PostgreSQL; SQLite's
``BEGIN IMMEDIATE`` already serialises), so two requests of one keypair at once
cannot both slip under a pending limit.
"""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session as DBSession

from ...common.errors import Forbidden, InvalidRequest, NotFound, QuotaExceeded
from ...common.slots import ResourceSlot
from ...common.types import SessionStatus
from ...models import (
    Domain,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ResourceGroup,
    Session,
    User,
)
from .. import access
from .state import GroupInfo, fmt_amount, slot_limit


def _need(session: Session) -> ResourceSlot:
    if session.kernels:
        total = ResourceSlot()
        for k in session.kernels:
            total = total + (k.requested_slots or ResourceSlot())
        return total.nonzero()
    per = ResourceSlot(session.requested_slots or {})
    return ResourceSlot({k: v * (session.cluster_size or 1) for k, v in per.items()}).nonzero()


def admit(db: DBSession, session: Session) -> None:
    """Raise a :class:`BackendAIError` (4xx) if ``session`` may not be queued.

    Checks: the resource group exists, is active and may be used by the
    session's domain, project or keypair (403 otherwise); ``priority`` within
    the keypair policy's ``max_priority``; ``cluster_size`` within
    ``max_containers_per_session``; the user, its domain and the project are
    active; the user's pending sessions (any keypair) within
    ``max_pending_session_count`` and ``max_pending_session_resource_slots``;
    and the request within every ``total_resource_slots`` limit (keypair,
    project, domain), which it could otherwise never start under.
    """
    with db.no_autoflush:
        kp = db.scalar(
            select(Keypair).where(Keypair.access_key == session.access_key).with_for_update()
        )
        if kp is None:
            raise InvalidRequest(f"unknown keypair {session.access_key!r}")
        policy = db.get(KeypairResourcePolicy, kp.resource_policy)
        rg = db.get(ResourceGroup, session.resource_group)
        if rg is None:
            raise NotFound(f"no resource group {session.resource_group!r}")
        if not rg.is_active:
            raise InvalidRequest(f"resource group {rg.name!r} is not active")
        project = db.get(Project, session.project_id) if session.project_id else None
        domain = db.get(Domain, session.domain_name)
        # Deactivated users, domains and projects start nothing, by any path (access.py).
        refusal = access.start_refusal(db.get(User, session.user_id), domain, project)
        if refusal is not None:
            raise Forbidden(f"no new sessions: {refusal}")
        group = GroupInfo(
            name=rg.name, scheduler=rg.scheduler, is_public=rg.is_public,
            allowed_domains=list(rg.allowed_domains or []),
            allowed_projects=list(rg.allowed_projects or []),
            allowed_keypairs=list(rg.allowed_keypairs or []),
            scheduler_state={},
        )
        if not group.permits(session.domain_name, session.project_id, session.access_key,
                             project.name if project else None):
            raise Forbidden(
                f"resource group {rg.name!r} is not allowed for this domain, project or keypair"
            )
        # The request's form (priority 0-100, cluster_size >= 1) was checked when it
        # was built (common/session_request.py); here only what the policies allow.
        priority = session.priority if session.priority is not None else 50
        if priority > policy.max_priority:
            raise QuotaExceeded(
                f"quota exceeded: keypair max_priority (priority {priority} requested, "
                f"limit {policy.max_priority})"
            )
        size = session.cluster_size or 1
        if size > policy.max_containers_per_session:
            raise QuotaExceeded(
                f"quota exceeded: keypair max_containers_per_session ({size} requested, "
                f"limit {policy.max_containers_per_session})"
            )
        need = _need(session)
        # Pending sessions of the user, whatever keypair queued them.
        mine = [Session.user_id == session.user_id, Session.status == SessionStatus.PENDING]
        if session.id is not None:
            mine.append(Session.id != session.id)
        if policy.max_pending_session_count is not None:
            n = len(db.scalars(select(Session.id).where(*mine)).all())
            if n >= policy.max_pending_session_count:
                raise QuotaExceeded(
                    f"quota exceeded: keypair max_pending_session_count "
                    f"({n} of {policy.max_pending_session_count} pending)"
                )
        if policy.max_pending_session_resource_slots:
            limits = policy.max_pending_session_resource_slots
            pending = ResourceSlot()
            for (slots,) in db.execute(
                select(Kernel.requested_slots).join(Session, Kernel.session_id == Session.id)
                .where(*mine)
            ):
                pending = pending + (slots or ResourceSlot())
            for slot in sorted(need):
                lim = slot_limit(limits, slot, policy.default_for_unspecified)
                used = pending.get(slot, Decimal(0))
                if lim is not None and used + need[slot] > lim:
                    raise QuotaExceeded(
                        f"quota exceeded: keypair max_pending_session_resource_slots ({slot} "
                        f"{fmt_amount(slot, used)} of {fmt_amount(slot, lim)} pending, "
                        f"{fmt_amount(slot, need[slot])} requested)"
                    )
        levels = [
            ("keypair", policy.total_resource_slots),
            ("project", project.total_resource_slots if project else None),
            ("domain", domain.total_resource_slots if domain else None),
        ]
        for level, limits in levels:
            for slot in sorted(need):
                lim = slot_limit(limits, slot, policy.default_for_unspecified)
                if lim is not None and need[slot] > lim:
                    raise QuotaExceeded(
                        f"quota exceeded: {level} total_resource_slots ({slot} "
                        f"{fmt_amount(slot, need[slot])} requested, limit "
                        f"{fmt_amount(slot, lim)}): it could never start"
                    )
