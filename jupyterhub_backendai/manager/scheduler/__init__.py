"""Scheduling: which pending session goes to which agent, committed in one transaction.

A pipeline in the shape of Backend.AI's Sokovan: a sequencer orders the queue
(:mod:`.sequencers`), validators hold back or cancel with a reason
(:mod:`.validators`), an agent selector picks agents from an index over free
capacity (:mod:`.agent_selectors`, :mod:`.pool`), the allocator commits
(:mod:`.allocator`); :mod:`.pipeline` decides a pass with them in memory.
:mod:`.dispatcher` runs a pass in its transaction and documents the guarantees (no
head-of-line blocking, no starvation, no over-commit);
:mod:`.admission` refuses at enqueue what could never be placed; :mod:`.audit` checks
the record after the fact and reports per group.
"""

from .admission import admit
from .audit import check_consistency, scheduler_stats
from .dispatcher import schedule_pass

__all__ = [
    "admit",
    "check_consistency",
    "schedule_pass",
    "scheduler_stats",
]
