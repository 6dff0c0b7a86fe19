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
import re
from decimal import Decimal

from ...common.slots import CPU, CUDA, MEM, format_bytes, format_cores, format_slots
from ...common.times import parse_utc
from ...common.types import DEAD_STATUSES
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


def amount_words(slot: str, v: Decimal) -> tuple[str, bool]:
    """An amount of one slot for people and whether it takes a plural verb:
    ``("0.5 cores", True)``, ``("1 core", False)``, ``("4 GiB of memory", False)``,
    ``("1 GPU", False)``."""
    v = Decimal(v)
    if slot == CPU:
        return format_cores(v), v != 1
    if slot == MEM:
        return f"{format_bytes(v)} of memory", False
    if slot == CUDA:
        return format_slots({CUDA: v}), v != 1
    return f"{fmt_amount(slot, v)} {slot}", v != 1


def quota_message(limit: str, slot: str, used: Decimal, lim: Decimal, need: Decimal, tag: str) -> str:
    """``quota exceeded: your keypair's resource policy allows 0.5 cores in total; 0.5
    cores are in use and this session asks for 0.5 more (keypair policy 'tight',
    total_resource_slots)``: plain words and human units for the user, the level, its
    name and the policy's field in the parentheses for admins. ``limit`` says who
    allows how much, with ``{allowed}`` for the amount."""
    allowed, _ = amount_words(slot, lim)
    in_use, plural = amount_words(slot, used)
    more = format_bytes(need) if slot == MEM else fmt_amount(slot, need)
    return (
        f"quota exceeded: {limit.format(allowed=allowed)} in total; {in_use} "
        f"{'are' if plural else 'is'} in use and this session asks for {more} more "
        f"({tag}, total_resource_slots)"
    )


def _sessions(n: int) -> str:
    return f"{n} session" + ("" if n == 1 else "s")


class RetryBackoffValidator:
    """A session back in the queue after a failed start waits before its next try.

    The wait is ``retry_backoff * 2**(retries - 1)`` seconds from when it went
    back to PENDING (capped at 10 minutes). The manager's message ("start
    failed (...); retry n of m") stays visible meanwhile.
    """

    code = "retry_backoff"

    @staticmethod
    def ready_at(sess: PendingSession, ctx: PassContext) -> dt.datetime | None:
        """When the session may be tried again (None: no back-off applies)."""
        if sess.retries <= 0:
            return None
        requeued = parse_utc(sess.status_history.get("PENDING"))
        if requeued is None:
            return None
        delay = min(ctx.options.retry_backoff * 2 ** (sess.retries - 1), Decimal(600))
        return requeued + dt.timedelta(seconds=float(delay))

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        ready = self.ready_at(sess, ctx)
        if ready is None or ctx.now >= ready:
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
        if g.is_public:
            return None
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
                f"quota exceeded: your keypair's resource policy allows at most "
                f"{p.max_containers_per_session} "
                f"container{'' if p.max_containers_per_session == 1 else 's'} per session; "
                f"this session asks for {sess.cluster_size} "
                f"(keypair policy {p.name!r}, max_containers_per_session)",
            )
        return None


class ConcurrencyValidator:
    """Live placed sessions below ``max_concurrent_sessions``, counted twice: the
    keypair's sessions against its own policy, and all the user's sessions (whatever
    keypair or token started them) against the tightest policy among the user's active
    keypairs and this session's. A user who mints another keypair does not get
    another allowance (keypairs a user makes inherit the main keypair's policy too)."""

    code = "concurrency"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        p = ctx.policy(sess)
        n = ctx.usage.sessions_per_keypair.get(sess.access_key, 0)
        if n >= p.max_concurrent_sessions:
            return Verdict(
                self.code,
                f"quota exceeded: your keypair's resource policy allows "
                f"{_sessions(p.max_concurrent_sessions)} at a time and {n} "
                f"{'is' if n == 1 else 'are'} already running or starting; this one waits "
                f"until one ends (keypair policy {p.name!r}, max_concurrent_sessions)",
            )
        memo = ctx.memo
        key = ("tightest", sess.access_key, sess.user_id)
        tightest = memo.get(key)
        if tightest is None:
            tightest = memo[key] = min([p, *ctx.user_policies.get(sess.user_id, [])],
                                       key=lambda x: x.max_concurrent_sessions)
        lim = tightest.max_concurrent_sessions
        n = ctx.usage.sessions_per_user.get(sess.user_id, 0)
        if n >= lim:
            return Verdict(
                self.code,
                f"quota exceeded: you may have {_sessions(lim)} at a time across all your "
                f"keypairs and {n} {'is' if n == 1 else 'are'} already running or starting; "
                f"this one waits until one ends "
                f"(user limit from keypair policy {tightest.name!r}, max_concurrent_sessions)",
            )
        return None


def _within(code: str, sess: PendingSession, ctx: PassContext, limits, used,
            allows: str, source: str) -> Verdict | None:
    """``code``'s objection when what ``used`` holds plus the session's need exceeds
    ``limits`` in a slot (the session's keypair policy's ``default_for_unspecified``
    for the slots they do not name); None when it fits or there are no ``limits``."""
    if not limits:
        return None
    dfu = ctx.policy(sess).default_for_unspecified
    need = sess.need
    hit = first_excess(used or {}, need, lambda s: slot_limit(limits, s, dfu))
    if not hit:
        return None
    slot, u, lim = hit
    return Verdict(code, quota_message(allows, slot, u, lim, need[slot], source))


class KeypairSlotsValidator:
    """The keypair's placed slots plus this session within its policy's ``total_resource_slots``."""

    code = "quota_keypair"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        p = ctx.policy(sess)
        return _within(self.code, sess, ctx, p.total_resource_slots,
                       ctx.usage.keypair.get(sess.access_key),
                       "your keypair's resource policy allows {allowed}",
                       f"keypair policy {p.name!r}")


class UserSlotsValidator:
    """All the user's sessions (any keypair) together within the tightest of the
    user's active keypairs' policies, slot by slot."""

    code = "quota_user"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        policies = ctx.user_policies.get(sess.user_id) or [ctx.policy(sess)]
        if not any(p.total_resource_slots for p in policies):
            return None  # none of the policies limits slots
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
            tightest = next(p.name for p in policies if slot_limit(
                p.total_resource_slots, slot, p.default_for_unspecified) == lim)
            return Verdict(self.code, quota_message(
                "all your sessions together may use {allowed}", slot, u, lim, need[slot],
                f"user limit from keypair policy {tightest!r}"))
        return None


class ProjectSlotsValidator:
    """The project's placed slots plus this session within ``Project.total_resource_slots``."""

    code = "quota_project"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        if sess.project_id is None:
            return None
        name = ctx.project_names.get(sess.project_id) or sess.project_id
        return _within(self.code, sess, ctx, ctx.project_limits.get(sess.project_id),
                       ctx.usage.project.get(sess.project_id),
                       "your project allows {allowed}", f"project {name!r}")


class DomainSlotsValidator:
    """The domain's placed slots plus this session within ``Domain.total_resource_slots``."""

    code = "quota_domain"

    def check(self, sess: PendingSession, ctx: PassContext) -> Verdict | None:
        return _within(self.code, sess, ctx, ctx.domain_limits.get(sess.domain_name),
                       ctx.usage.domain.get(sess.domain_name),
                       "your domain allows {allowed}", f"domain {sess.domain_name!r}")


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
    # Records written before the messages were in plain words.
    ("quota exceeded: keypair max_containers_per_session", "cluster_size"),
    ("quota exceeded: keypair max_concurrent_sessions", "concurrency"),
    ("quota exceeded: keypair", "quota_keypair"),
    ("quota exceeded: user", "quota_user"),
    ("quota exceeded: project", "quota_project"),
    ("quota exceeded: domain", "quota_domain"),
    ("waiting for resources", "no_resources"),
    ("cancelled: pending timeout", "pending_timeout"),
)

#: The parenthesis that ends a quota message (level and policy field) -> reason label.
_QUOTA_TAG = re.compile(
    r"\((keypair policy|user limit from keypair policy|project|domain) ['\"].*['\"], "
    r"(max_containers_per_session|max_concurrent_sessions|total_resource_slots)\)$"
)
_QUOTA_CODES = {
    "max_containers_per_session": "cluster_size",
    "max_concurrent_sessions": "concurrency",
    "keypair policy": "quota_keypair",
    "user limit from keypair policy": "quota_user",
    "project": "quota_project",
    "domain": "quota_domain",
}


def reason_code(status_info: str) -> str:
    """The reason label of a pending session's ``status_info`` ("new" before any pass)."""
    info = status_info or ""
    m = _QUOTA_TAG.search(info) if info.startswith("quota exceeded: ") else None
    if m:
        level, field = m.groups()
        return _QUOTA_CODES[field if field != "total_resource_slots" else level]
    for prefix, code in _PREFIXES:
        if info.startswith(prefix):
            return code
    return "new"
