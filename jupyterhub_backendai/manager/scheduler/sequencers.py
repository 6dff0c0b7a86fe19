"""Sequencers: in which order the queue is considered.

A sequencer is a class with a ``name`` (the value of ``ResourceGroup.scheduler``)
and one method, ``sequence(sessions, ctx) -> Iterator[PendingSession]``. It is
a generator on purpose: the dispatcher places (or skips) each session before
asking for the next one, so a sequencer that depends on what was placed (DRF)
sees the up-to-date usage in ``ctx``.

Every sequencer orders by priority band first (``Session.priority`` 0-100,
capped by the keypair policy's ``max_priority``; higher first).
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Iterator

from .state import PassContext, PendingSession


class FIFOSequencer:
    """Oldest first within a priority band."""

    name = "fifo"

    def sort_key(self, ctx: PassContext):
        """The order as a sort key (a pass may merge lists sorted by it)."""
        return lambda s: (-ctx.effective_priority(s), s.created_at, s.id)

    def sequence(self, sessions: list[PendingSession], ctx: PassContext) -> Iterator[PendingSession]:
        yield from sorted(sessions, key=self.sort_key(ctx))


class LIFOSequencer:
    """Newest first within a priority band (interactive users who just asked
    go first; the starvation guard in the dispatcher still bounds the wait of the
    oldest)."""

    name = "lifo"

    def sort_key(self, ctx: PassContext):
        """The order as a sort key (a pass may merge lists sorted by it)."""
        return lambda s: (-ctx.effective_priority(s), -s.created_at.timestamp(), s.id)

    def sequence(self, sessions: list[PendingSession], ctx: PassContext) -> Iterator[PendingSession]:
        yield from sorted(sessions, key=self.sort_key(ctx))


class DRFSequencer:
    """Dominant resource fairness across users (Ghodsi et al., NSDI 2011).

    A user's dominant share is the largest fraction, over the slot types, of the
    group's capacity that the user's live kernels in this group hold. Next comes
    the oldest session of the user with the lowest share (within the highest
    priority band present); after each placement that user's share is
    recomputed, so a pass is DRF's progressive filling.
    """

    name = "drf"

    def sequence(self, sessions: list[PendingSession], ctx: PassContext) -> Iterator[PendingSession]:
        per_user: dict[str, deque[PendingSession]] = defaultdict(deque)
        for s in sorted(sessions, key=lambda s: (-ctx.effective_priority(s), s.created_at, s.id)):
            per_user[s.user_id].append(s)

        def entry(user_id: str):
            head = per_user[user_id][0]
            return (
                -ctx.effective_priority(head),
                ctx.dominant_share(user_id),
                head.created_at,
                head.id,
                user_id,
            )

        heap = [entry(u) for u in per_user]
        heapq.heapify(heap)
        while heap:
            user_id = heapq.heappop(heap)[-1]
            yield per_user[user_id].popleft()
            if per_user[user_id]:
                heapq.heappush(heap, entry(user_id))


SEQUENCERS = {s.name: s for s in (FIFOSequencer(), LIFOSequencer(), DRFSequencer())}
