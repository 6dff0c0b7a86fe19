"""Agent selectors: which agent(s) get a session's kernels.

A selector is a class with a ``name`` and one method,
``select(session, pool, ctx) -> list[agent_id] | None``: one agent per kernel
(in ``cluster_idx`` order), or None when the session does not fit now. It only
chooses; the allocator commits. Every selector honours the session's
``architecture`` and ``designated_agents`` and the cluster mode:
``single-node`` puts all kernels on one agent (the sum of their slots must fit),
``multi-node`` puts each kernel on a different agent. Agents compare by free
capacity in the group's ``resource_priority`` order (GPUs, then cores, then
memory by default), so a CPU-only session packs onto agents without free GPUs
before it touches a GPU node.

Among the agents that fit, every selector first looks at those that hold what the
session needs (:meth:`.pool.AgentPool.tiers`, from the agents' heartbeats): an agent
with a ready pooled kernel of the session's warm pool (issue 30: the session binds it
instead of starting a container), then one holding the session's image, then one that
holds it or may pull it (issue 25); within a tier the selector's own rule decides, and
when no agent of a tier fits, the next tier (at last every agent) is tried.
"""

from __future__ import annotations

from bisect import bisect_right

from ...common.slots import ResourceSlot
from .options import AGENT_SELECTORS
from .pool import AgentPool
from .state import PassContext, PendingSession


def _tiers(sess: PendingSession, pool: AgentPool) -> list[frozenset]:
    """The session's preferred agents, best first, within its designated agents."""
    tiers = pool.tiers(sess.image, sess.kernels)
    if tiers and sess.designated_agents:
        allowed = frozenset(sess.designated_agents)
        tiers = [t & allowed for t in tiers]
    return tiers


def _by_rank(sess: PendingSession, pool: AgentPool, most: bool, pick_any):
    """``pick(need, exclude)``: the best agent of the first preferred tier with one that
    fits (least or ``most`` free capacity), else ``pick_any``'s."""
    tiers = _tiers(sess, pool)
    if not tiers:
        return pick_any

    def pick(need: ResourceSlot, exclude: set[str]) -> str | None:
        for tier in tiers:
            aid = pool.prefer(tier, need, sess.architecture, exclude, most)
            if aid is not None:
                return aid
        return pick_any(need, exclude)

    return pick


def _plan(sess: PendingSession, pick) -> list[str] | None:
    """Apply ``pick(need, exclude) -> agent | None`` per the cluster mode."""
    if sess.cluster_mode == "multi-node" and len(sess.kernels) > 1:
        chosen: list[str] = []
        for _, slots in sess.kernels:
            aid = pick(slots, set(chosen))
            if aid is None:
                return None
            chosen.append(aid)
        return chosen
    aid = pick(sess.need, set())
    return None if aid is None else [aid] * len(sess.kernels)


class _ByCapacity:
    """The agent with the least (``most``: the most) free capacity that holds the
    request."""

    most = False

    def select(self, sess: PendingSession, pool: AgentPool, ctx: PassContext) -> list[str] | None:
        def pick(need: ResourceSlot, exclude: set[str]) -> str | None:
            if sess.designated_agents:
                c = pool.candidates(sess.designated_agents, need, sess.architecture, exclude)
                return (max if self.most else min)(c, key=pool.key) if c else None
            return pool.fitting(need, sess.architecture, exclude, self.most)

        return _plan(sess, _by_rank(sess, pool, self.most, pick))


class ConcentratedSelector(_ByCapacity):
    """Pack: the agent with the least free capacity that holds the request."""

    name = "concentrated"


class DispersedSelector(_ByCapacity):
    """Spread: the agent with the most free capacity that holds the request."""

    name = "dispersed"
    most = True


class RoundRobinSelector:
    """Take turns: the first agent after the last one used (by id) that holds the
    request. The cursor lives in ``ResourceGroup.scheduler_state["rr_cursor"]``,
    written in the scheduling transaction, so turns survive restarts and are
    shared by managers. Costs O(agents) per placement at worst (a scan in id order)."""

    name = "roundrobin"

    def select(self, sess: PendingSession, pool: AgentPool, ctx: PassContext) -> list[str] | None:
        state = ctx.group.scheduler_state
        ids = list(sess.designated_agents) if sess.designated_agents else pool.ordered_ids
        if sess.designated_agents:
            ids = sorted(ids)
        cursor = state.get("rr_cursor", "")
        tiers = _tiers(sess, pool)

        def turn(need: ResourceSlot, exclude: set[str], tier) -> str | None:
            nonlocal cursor
            start = bisect_right(ids, cursor)
            n = len(ids)
            for step in range(n):
                aid = ids[(start + step) % n]
                a = pool.agents.get(aid)
                if (
                    a is not None
                    and (tier is None or aid in tier)
                    and pool.indexed(aid)
                    and aid not in exclude
                    and (sess.architecture is None or a.architecture == sess.architecture)
                    and need.fits_in(a.free)
                ):
                    cursor = aid
                    return aid
            return None

        def pick(need: ResourceSlot, exclude: set[str]) -> str | None:
            for tier in tiers:  # the next in turn among the preferred agents first
                aid = turn(need, exclude, tier)
                if aid is not None:
                    return aid
            return turn(need, exclude, None)

        chosen = _plan(sess, pick)
        if chosen is not None:
            state["rr_cursor"] = cursor
        return chosen


SELECTORS = {s.name: s for s in (ConcentratedSelector(), DispersedSelector(), RoundRobinSelector())}
assert sorted(SELECTORS) == sorted(AGENT_SELECTORS), "options.AGENT_SELECTORS names every selector"
