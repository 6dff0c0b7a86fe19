"""A resource group's scheduler options (``ResourceGroup.scheduler_opts``, JSON).

Options live on the group row so that every manager instance schedules a group
the same way and an admin changes them without a restart. A bad value must not
stop a group from being scheduled: :meth:`SchedulerOptions.from_json` raises
:class:`InvalidRequest` (for the admin API to refuse it), while the pass uses
:meth:`SchedulerOptions.lenient`, which keeps the default for a bad field and
says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from ...common.errors import InvalidRequest
from ...common.session_request import whole_number
from ...common.slots import CPU, CUDA, MEM

# The agent selectors' names (agent_selectors.py implements one per name).
AGENT_SELECTORS = ("concentrated", "dispersed", "roundrobin")

DEFAULT_RESOURCE_PRIORITY = (CUDA, CPU, MEM)


@dataclass(frozen=True)
class SchedulerOptions:
    #: ``concentrated`` (pack), ``dispersed`` (spread) or ``roundrobin``.
    agent_selector: str = "concentrated"
    #: Slot names in the order the selectors compare agents' free capacity.
    resource_priority: tuple[str, ...] = DEFAULT_RESOURCE_PRIORITY
    #: Seconds a session may stay PENDING before it is CANCELLED (0: forever).
    pending_timeout: Decimal = Decimal(0)
    #: Seconds after which a session that does not fit gets agents reserved
    #: for it (nothing else is placed on them until it fits): the bound on
    #: starvation. Before that, smaller sessions are backfilled past it.
    starvation_threshold: Decimal = Decimal(300)
    #: How many starving sessions may hold a reservation at once.
    max_reservations: int = 1
    #: Seconds a session whose start failed waits before its next try, doubled
    #: on each further failure (capped at 10 minutes): a broken agent or image is
    #: not hammered, and a passing cause (a port in use) has time to clear.
    retry_backoff: Decimal = Decimal(2)
    problems: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_json(cls, data: dict | None) -> SchedulerOptions:
        """Strict parse: the first bad value raises :class:`InvalidRequest`."""
        opts = cls.lenient(data)
        if opts.problems:
            raise InvalidRequest("; ".join(opts.problems))
        return opts

    @classmethod
    def lenient(cls, data: dict | None) -> SchedulerOptions:
        """Parse what is valid, keep defaults for the rest, list the problems."""
        data = dict(data or {})
        problems: list[str] = []
        kw: dict = {}
        unknown = set(data) - {
            "agent_selector",
            "resource_priority",
            "pending_timeout",
            "starvation_threshold",
            "max_reservations",
            "retry_backoff",
        }
        if unknown:
            problems.append(f"unknown scheduler option(s): {', '.join(sorted(unknown))}")
        if "agent_selector" in data:
            if data["agent_selector"] in AGENT_SELECTORS:
                kw["agent_selector"] = data["agent_selector"]
            else:
                problems.append(
                    f"agent_selector must be one of {', '.join(sorted(AGENT_SELECTORS))}, "
                    f"not {data['agent_selector']!r}"
                )
        if "resource_priority" in data:
            rp = data["resource_priority"]
            if (
                isinstance(rp, list)
                and rp
                and all(isinstance(x, str) and x for x in rp)
                and len(set(rp)) == len(rp)
            ):
                kw["resource_priority"] = tuple(rp)
            else:
                problems.append("resource_priority must be a list of distinct slot names")
        for name in ("pending_timeout", "starvation_threshold", "retry_backoff"):
            if name in data:
                v = data[name]
                try:
                    if isinstance(v, bool):
                        raise ValueError
                    d = Decimal(str(v))
                    if not d.is_finite() or d < 0:
                        raise ValueError
                    kw[name] = d
                except (ValueError, ArithmeticError):
                    problems.append(f"{name} must be a number of seconds >= 0, not {v!r}")
        if "max_reservations" in data:
            try:
                kw["max_reservations"] = whole_number("max_reservations", data["max_reservations"],
                                                      minimum=0)
            except InvalidRequest as e:
                problems.append(e.detail)
        return cls(**kw, problems=tuple(problems))
