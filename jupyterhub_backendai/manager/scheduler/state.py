"""What one pass knows: the queue, the agents, the quota subjects, and their usage.

Everything a pass decides on is read into these plain objects at the start of
its transaction (under the locks described in :mod:`.dispatcher`), so that the
pipeline parts work in memory and the pass writes back only what changed, in
bulk. Usage counts every placed, live kernel in *all* resource groups, because
keypair, user, project and domain limits are not per group.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from ...common.slots import MEM, ResourceSlot, format_size
from .options import SchedulerOptions

ZERO = Decimal(0)
UNLIMITED = "UNLIMITED"
LIMITED = "LIMITED"


@dataclass(slots=True)
class PendingSession:
    id: str
    name: str
    user_id: str
    access_key: str
    domain_name: str
    project_id: str | None
    priority: int
    created_at: dt.datetime
    status_info: str
    #: ``status_history`` as the database holds it (JSON text, decoded on first use:
    #: a pass over 100,000 sessions needs it for a few, and writes it as text).
    history_raw: str | dict | None
    cluster_size: int
    cluster_mode: str
    starts_at: dt.datetime | None
    architecture: str | None
    designated_agents: tuple[str, ...]
    #: Failed starts so far (the manager puts a failed start back in the queue).
    retries: int = 0
    #: (kernel id, requested slots), by cluster_idx.
    kernels: list[tuple[str, ResourceSlot]] = field(default_factory=list)
    #: (id, name, status, result) of each session this one waits for.
    dependencies: list[tuple[str, str, str, str]] = field(default_factory=list)
    #: Its image (agents holding it, or a pooled kernel of it, are preferred).
    image: str = ""
    _need: ResourceSlot | None = None
    _history: dict | None = None

    @property
    def need(self) -> ResourceSlot:
        """Slots of all kernels together (computed once: kernels do not change in a pass).
        Read-only: with one kernel it is that kernel's (shared) slots."""
        if self._need is None:
            if len(self.kernels) == 1:
                self._need = self.kernels[0][1]
            else:
                total = ResourceSlot()
                for _, slots in self.kernels:
                    add_into(total, slots)
                self._need = total.nonzero()
        return self._need

    @property
    def status_history(self) -> dict:
        """The session's status history (decoded once; do not modify)."""
        if self._history is None:
            raw = self.history_raw
            self._history = dict(json.loads(raw) if isinstance(raw, str) else (raw or {}))
        return self._history


@dataclass(slots=True)
class Policy:
    """The parts of a keypair resource policy the scheduler enforces."""

    name: str
    total_resource_slots: ResourceSlot
    default_for_unspecified: str
    max_concurrent_sessions: int
    max_containers_per_session: int
    max_priority: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a session is not placed now: it waits (``cancel=False``) or is CANCELLED."""

    code: str
    message: str
    cancel: bool = False


def add_into(target: dict, slots: dict) -> None:
    """``target += slots`` in place (a pass adds thousands of times; no new objects)."""
    for k, v in slots.items():
        target[k] = target.get(k, ZERO) + v


def slot_limit(limits: ResourceSlot | None, slot: str, default_for_unspecified: str) -> Decimal | None:
    """The limit on one slot (None: unlimited). Empty limits are unlimited; a slot
    missing from non-empty limits is unlimited or zero by ``default_for_unspecified``."""
    if not limits:
        return None
    if slot in limits:
        return limits[slot]
    return None if default_for_unspecified == UNLIMITED else Decimal(0)


def fmt_amount(slot: str, v: Decimal) -> str:
    """Amounts for messages: ``2``, ``0.5``, ``4g`` (never ``1E+1``)."""
    if slot == MEM:
        return format_size(v)
    return str(int(v)) if v == v.to_integral_value() else format(v.normalize(), "f")


def first_excess(
    used: ResourceSlot, need: ResourceSlot, limit_of
) -> tuple[str, Decimal, Decimal] | None:
    """The first slot (sorted) where ``used + need`` passes ``limit_of(slot)``."""
    for slot, n in sorted(need.items()):
        if n <= 0:
            continue
        lim = limit_of(slot)
        if lim is not None and used.get(slot, ZERO) + n > lim:
            return slot, used.get(slot, ZERO), lim
    return None


@dataclass
class Usage:
    """Slots held by placed, live kernels, per quota subject, plus live-session counts."""

    keypair: dict[str, ResourceSlot] = field(default_factory=lambda: defaultdict(ResourceSlot))
    user: dict[str, ResourceSlot] = field(default_factory=lambda: defaultdict(ResourceSlot))
    project: dict[str, ResourceSlot] = field(default_factory=lambda: defaultdict(ResourceSlot))
    domain: dict[str, ResourceSlot] = field(default_factory=lambda: defaultdict(ResourceSlot))
    #: Slots per user in *this* group only (DRF shares).
    group_user: dict[str, ResourceSlot] = field(default_factory=lambda: defaultdict(ResourceSlot))
    sessions_per_keypair: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: Live sessions per user, whatever keypair started them (user-level concurrency).
    sessions_per_user: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: Slot sums that nothing reads from here on (a pass sets this once loaded: a level
    #: without any limit, DRF shares under another sequencer) and :meth:`charge` skips.
    #: The session counts are always kept.
    unread: frozenset = frozenset()

    def charge(self, access_key, user_id, project_id, domain, slots, *, in_group: bool,
               new_session: bool) -> None:
        unread = self.unread
        if not unread:
            add_into(self.keypair[access_key], slots)
            add_into(self.user[user_id], slots)
            if project_id is not None:
                add_into(self.project[project_id], slots)
            add_into(self.domain[domain], slots)
            if in_group:
                add_into(self.group_user[user_id], slots)
        else:
            if "keypair" not in unread:
                add_into(self.keypair[access_key], slots)
            if "user" not in unread:
                add_into(self.user[user_id], slots)
            if project_id is not None and "project" not in unread:
                add_into(self.project[project_id], slots)
            if "domain" not in unread:
                add_into(self.domain[domain], slots)
            if in_group and "group_user" not in unread:
                add_into(self.group_user[user_id], slots)
        if new_session:
            self.sessions_per_keypair[access_key] += 1
            self.sessions_per_user[user_id] += 1


@dataclass
class GroupInfo:
    name: str
    scheduler: str
    is_public: bool
    allowed_domains: list
    allowed_projects: list
    allowed_keypairs: list
    scheduler_state: dict
    scheduler_opts: dict = field(default_factory=dict)

    def permits(self, domain: str, project_id: str | None, access_key: str,
                project_name: str | None = None) -> bool:
        """Public, or the union of the allow lists names the session's domain, project or keypair."""
        if self.is_public:
            return True
        if domain in (self.allowed_domains or []):
            return True
        projects = self.allowed_projects or []
        if project_id is not None and (project_id in projects or (project_name and project_name in projects)):
            return True
        return access_key in (self.allowed_keypairs or [])


@dataclass
class PassContext:
    """Shared by the pipeline parts of one pass; the allocator updates ``usage``."""

    group: GroupInfo
    options: SchedulerOptions
    now: dt.datetime
    capacity: ResourceSlot
    usage: Usage
    #: access_key -> its policy.
    policies: dict[str, Policy]
    #: user_id -> policies of the user's active keypairs (user-level limit: the minimum).
    user_policies: dict[str, list[Policy]]
    project_limits: dict[str, ResourceSlot]
    project_names: dict[str, str]
    domain_limits: dict[str, ResourceSlot]
    #: What validators compute once per pass and reuse (keyed by a tuple naming it).
    memo: dict = field(default_factory=dict)

    def policy(self, sess: PendingSession) -> Policy:
        return self.policies[sess.access_key]

    def effective_priority(self, sess: PendingSession) -> int:
        p = self.policies.get(sess.access_key)
        return min(sess.priority, p.max_priority) if p is not None else sess.priority

    def dominant_share(self, user_id: str) -> Decimal:
        used = self.usage.group_user.get(user_id)
        if not used:
            return Decimal(0)
        share = Decimal(0)
        for slot, cap in self.capacity.items():
            if cap > 0:
                share = max(share, used.get(slot, Decimal(0)) / cap)
        return share

    def waited(self, sess: PendingSession) -> Decimal:
        return Decimal(str(max(0.0, (self.now - sess.created_at).total_seconds())))
