"""Validators: may this session be placed now? Each says no with a reason.

A validator is a class with a ``code`` (the reason label on metrics, one of
:data:`REASONS`) and one method, ``check(session, ctx) -> Verdict | None``.
``None`` means "no objection". A :class:`Verdict` either makes the session
wait, its message shown to the user as the spawn progress, or (``cancel=True``)
ends it, for what waiting cannot fix (a failed dependency).

Quota validators see usage that includes every session placed earlier in the
same pass (the allocator charges it), so one pass never places past a quota.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from ..common.types import DEAD_STATUSES
from .state import PassContext, PendingSession, Verdict, first_excess, fmt_amount, slot_limit

#: Every reason label the scheduler uses (metrics and ``scheduler_stats``).
REASONS = (
    "retry_backoff",
    "starts_at",
    "dependencies",
    "dependency_failed",
    "permission",
    "cluster_size",
    "concurrency",
    "quota_keypair",
    "quota_user",
    "quota_project",
    "quota_domain",
    "no_resources",
    "pending_timeout",
)


def quota_message(level: str, limit_name: str, slot: str, used: Decimal, lim: Decimal,
                  need: Decimal) -> str:
    return (
        f"quota exceeded: {level} {limit_name} ({slot} {fmt_amount(slot, used)} of "
        f"{fmt_amount(slot, lim)} in use, {fmt_amount(slot, need)} requested)"
    )


class RetryBackoffValidator:
    """A session back in the queue after a failed start waits before its next try.

    The wait is ``retry_backoff * 2**(retries - 1)`` seconds from when it went
    back to PENDING (capped at 10 minutes). The manager's message ("start
    failed (...); retry n of m") stays visible meanwhile.
    """

    code = "retry_backoff"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        if sess.retries <= 0:
            return None
        since = sess.status_history.get("PENDING")
        if not since:
            return None
        try:
            requeued = dt.datetime.fromisoformat(since)
        except (TypeError, ValueError):
            return None
        if requeued.tzinfo is None:
            requeued = requeued.replace(tzinfo=dt.UTC)
        delay = min(ctx.options.retry_backoff * 2 ** (sess.retries - 1), Decimal(600))
        ready = requeued + dt.timedelta(seconds=float(delay))
        if ctx.now >= ready:
            return None
        msg = sess.status_info if sess.status_info.startswith("start failed") else (
            f"start failed; retry {sess.retries} after {ready.isoformat(timespec='seconds')}")
        return Verdict(self.code, msg)


class StartsAtValidator:
    """Batch sessions booked for later wait until their start time."""

    code = "starts_at"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        if sess.starts_at is not None and sess.starts_at > ctx.now:
            return Verdict(self.code, f"waiting for the start time {sess.starts_at.isoformat()}")
        return None


class DependenciesValidator:
    """Wait until every dependency ended with SUCCESS; one that did not cancels this one."""

    code = "dependencies"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        waiting = []
        for _dep_id, name, status, result in sess.dependencies:
            if status in DEAD_STATUSES:
                if result != "SUCCESS":
                    return Verdict(
                        "dependency_failed",
                        f"cancelled: dependency {name} ended {status} with result {result}",
                        cancel=True,
                    )
            else:
                waiting.append(name)
        if waiting:
            return Verdict(self.code, f"waiting for dependencies: {', '.join(sorted(waiting))}")
        return None


class ResourceGroupPermissionValidator:
    """The group is public, or allows the session's domain, project or keypair."""

    code = "permission"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        g = ctx.group
        if g.permits(sess.domain_name, sess.project_id, sess.access_key,
                     ctx.project_names.get(sess.project_id or "")):
            return None
        return Verdict(
            self.code,
            f"cancelled: resource group {g.name} is not allowed for this domain, project or keypair",
            cancel=True,
        )


class ContainersPerSessionValidator:
    """``cluster_size`` within the keypair policy's ``max_containers_per_session``."""

    code = "cluster_size"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        p = ctx.policy(sess)
        if sess.cluster_size > p.max_containers_per_session:
            return Verdict(
                self.code,
                f"quota exceeded: keypair max_containers_per_session "
                f"({sess.cluster_size} requested, limit {p.max_containers_per_session})",
            )
        return None


class ConcurrencyValidator:
    """Live placed sessions of the keypair below ``max_concurrent_sessions``."""

    code = "concurrency"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        p = ctx.policy(sess)
        n = ctx.usage.sessions_per_keypair.get(sess.access_key, 0)
        if n >= p.max_concurrent_sessions:
            return Verdict(
                self.code,
                f"quota exceeded: keypair max_concurrent_sessions "
                f"({n} of {p.max_concurrent_sessions} in use)",
            )
        return None


class KeypairSlotsValidator:
    """The keypair's placed slots plus this session within its policy's ``total_resource_slots``."""

    code = "quota_keypair"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        p = ctx.policy(sess)
        used = ctx.usage.keypair.get(sess.access_key) or {}
        need = sess.need
        hit = first_excess(used, need, lambda s: slot_limit(
            p.total_resource_slots, s, p.default_for_unspecified))
        if hit:
            slot, u, lim = hit
            return Verdict(self.code, quota_message("keypair", "total_resource_slots", slot, u, lim, need[slot]))
        return None


class UserSlotsValidator:
    """All the user's sessions (any keypair) together within the tightest of the
    user's active keypairs' policies, slot by slot."""

    code = "quota_user"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        policies = ctx.user_policies.get(sess.user_id) or [ctx.policy(sess)]
        used = ctx.usage.user.get(sess.user_id) or {}
        need = sess.need

        def limit(slot):
            lims = [slot_limit(p.total_resource_slots, slot, p.default_for_unspecified)
                    for p in policies]
            lims = [x for x in lims if x is not None]
            return min(lims) if lims else None

        hit = first_excess(used, need, limit)
        if hit:
            slot, u, lim = hit
            return Verdict(self.code, quota_message("user", "total_resource_slots", slot, u, lim, need[slot]))
        return None


class ProjectSlotsValidator:
    """The project's placed slots plus this session within ``Project.total_resource_slots``."""

    code = "quota_project"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        if sess.project_id is None:
            return None
        limits = ctx.project_limits.get(sess.project_id)
        dfu = ctx.policy(sess).default_for_unspecified
        used = ctx.usage.project.get(sess.project_id) or {}
        need = sess.need
        hit = first_excess(used, need, lambda s: slot_limit(limits, s, dfu))
        if hit:
            slot, u, lim = hit
            return Verdict(self.code, quota_message("project", "total_resource_slots", slot, u, lim, need[slot]))
        return None


class DomainSlotsValidator:
    """The domain's placed slots plus this session within ``Domain.total_resource_slots``."""

    code = "quota_domain"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        limits = ctx.domain_limits.get(sess.domain_name)
        dfu = ctx.policy(sess).default_for_unspecified
        used = ctx.usage.domain.get(sess.domain_name) or {}
        need = sess.need
        hit = first_excess(used, need, lambda s: slot_limit(limits, s, dfu))
        if hit:
            slot, u, lim = hit
            return Verdict(self.code, quota_message("domain", "total_resource_slots", slot, u, lim, need[slot]))
        return None


#: Run in this order; the first objection wins (cheap and final ones first).
VALIDATORS = {
    v.code: v
    for v in (
        RetryBackoffValidator(),
        StartsAtValidator(),
        DependenciesValidator(),
        ResourceGroupPermissionValidator(),
        ContainersPerSessionValidator(),
        ConcurrencyValidator(),
        KeypairSlotsValidator(),
        UserSlotsValidator(),
        ProjectSlotsValidator(),
        DomainSlotsValidator(),
    )
}


def validate(sess: PendingSession, ctx: PassContext) -> Verdict | None:
    for v in VALIDATORS.values():
        verdict = v.check(sess, ctx)
        if verdict is not None:
            return verdict
    return None


_PREFIXES = (
    ("start failed", "retry_backoff"),
    ("waiting for the start time", "starts_at"),
    ("waiting for dependencies", "dependencies"),
    ("cancelled: dependency", "dependency_failed"),
    ("cancelled: resource group", "permission"),
    ("quota exceeded: keypair max_containers_per_session", "cluster_size"),
    ("quota exceeded: keypair max_concurrent_sessions", "concurrency"),
    ("quota exceeded: keypair", "quota_keypair"),
    ("quota exceeded: user", "quota_user"),
    ("quota exceeded: project", "quota_project"),
    ("quota exceeded: domain", "quota_domain"),
    ("waiting for resources", "no_resources"),
    ("cancelled: pending timeout", "pending_timeout"),
)


def reason_code(status_info: str) -> str:
    """The reason label of a pending session's ``status_info`` ("new" before any pass)."""
    for prefix, code in _PREFIXES:
        if (status_info or "").startswith(prefix):
            return code
    return "new"
