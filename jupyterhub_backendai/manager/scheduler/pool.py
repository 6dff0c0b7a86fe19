"""The agents of one pass, indexed by free capacity so that a placement costs O(log agents).

Each architecture has a sorted list of keys ``(free[d0], free[d1], ..., agent id)``,
the dimensions being the group's resource priority followed by every other slot
name seen. Finding the agent with the least (or most) free capacity that still
holds a request is a *skip scan*: bisect to the request; when a key falls short
in dimension j, jump past every key that shares its prefix up to j. The number
of jumps is bounded by the distinct free amounts in the leading dimensions (a
handful: GPUs, cores), not by the number of agents, so a placement costs
O(log n) bisections and an O(log n) re-insertion (``SortedList``), where a
linear scan would cost O(n). Agents held for a reservation leave the index.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from sortedcontainers import SortedList

from ...common.slots import ResourceSlot

ZERO = Decimal(0)


@dataclass(slots=True)
class PoolAgent:
    id: str
    architecture: str
    available: ResourceSlot
    occupied: ResourceSlot
    free: ResourceSlot
    #: What the agent holds, from its heartbeat (issues 25 and 30): the labelled images
    #: on its engine (None: it did not say) and its ready pooled kernels per warm pool
    #: key, less those the sessions starting there will take.
    images: frozenset | None = None
    ready: dict | None = None
    #: Its backend: a "docker" agent may pull an image it lacks.
    backend: str = "docker"


class AgentPool:
    def __init__(self, agents: Iterable[PoolAgent], resource_priority: tuple[str, ...]):
        self.agents: dict[str, PoolAgent] = {a.id: a for a in agents}
        extra = sorted(
            {s for a in self.agents.values() for s in a.available} - set(resource_priority)
        )
        self.dims: tuple[str, ...] = tuple(resource_priority) + tuple(extra)
        self._zeros = (ZERO,) * len(self.dims)
        self._index: dict[str, SortedList] = {}
        self._keys: dict[str, tuple] = {}
        self.held: set[str] = set()
        for a in self.agents.values():
            self._insert(a)
        #: Agent ids in order, for round-robin.
        self.ordered_ids: list[str] = sorted(self.agents)
        #: id(request) -> (request, its vector or None if no agent has one of its slots):
        #: requests are slot objects shared by many sessions of a pass (never modified).
        self._requests: dict[int, tuple] = {}
        #: The group's warm pools: (image, slots key) -> pool key (:func:`slots_key`).
        self.warm: dict[tuple, str] = {}
        #: image -> the agents holding it and those that may pull it (computed once).
        self._holders: dict[str, tuple[frozenset, frozenset]] = {}

    # -- keys ---------------------------------------------------------------

    def vector(self, slots: ResourceSlot) -> tuple:
        return tuple(map(slots.get, self.dims, self._zeros))

    def covers_dims(self, need: ResourceSlot) -> bool:
        """A request naming a slot no agent has can only fit if it asks for zero of it."""
        return all(v <= 0 or k in self.dims for k, v in need.items())

    def _request_vector(self, need: ResourceSlot) -> tuple | None:
        got = self._requests.get(id(need))
        if got is None or got[0] is not need:
            got = self._requests[id(need)] = (
                need, self.vector(need) if self.covers_dims(need) else None)
        return got[1]

    def _insert(self, a: PoolAgent) -> None:
        key = self.vector(a.free) + (a.id,)
        self._keys[a.id] = key
        self._index.setdefault(a.architecture, SortedList()).add(key)

    def _remove(self, a: PoolAgent) -> None:
        self._index[a.architecture].remove(self._keys.pop(a.id))

    def key(self, agent_id: str) -> tuple:
        return self._keys.get(agent_id) or (self.vector(self.agents[agent_id].free) + (agent_id,))

    # -- changes ------------------------------------------------------------

    def take(self, agent_id: str, slots: ResourceSlot) -> None:
        a = self.agents[agent_id]
        key = self._keys.get(agent_id)
        occupied, free = a.occupied, a.free
        for k, v in slots.items():
            occupied[k] = occupied.get(k, ZERO) + v
            free[k] = free.get(k, ZERO) - v
        if key is not None:
            index = self._index[a.architecture]
            index.remove(key)
            key = self._keys[agent_id] = self.vector(free) + (agent_id,)
            index.add(key)

    def give(self, agent_id: str, slots: ResourceSlot) -> None:
        self.take(agent_id, ResourceSlot({k: -v for k, v in slots.items()}))

    def hold(self, agent_ids: Iterable[str]) -> None:
        """Take agents out of the index: reserved for a starving session."""
        for aid in agent_ids:
            if aid in self._keys:
                self._remove(self.agents[aid])
            self.held.add(aid)

    # -- queries ------------------------------------------------------------

    def fits(self, agent_id: str, need: ResourceSlot) -> bool:
        return need.fits_in(self.agents[agent_id].free)

    def _archs(self, architecture: str | None) -> list[str]:
        if architecture is None:
            return list(self._index)
        return [architecture] if architecture in self._index else []

    def fitting(self, need: ResourceSlot, architecture: str | None,
                exclude: set[str] = frozenset(), most: bool = False) -> str | None:
        """The agent with the least (``most``: the most) free capacity (by resource
        priority) that holds ``need``."""
        vec = self._request_vector(need)
        if vec is None:
            return None
        fit, better = (_last_fit, operator.gt) if most else (_first_fit, operator.lt)
        best = None
        for arch in self._archs(architecture):
            key = fit(self._index[arch], vec, exclude)
            if key is not None and (best is None or better(key, best)):
                best = key
        return best[-1] if best else None

    def least_fitting(self, need: ResourceSlot, architecture: str | None,
                      exclude: set[str] = frozenset()) -> str | None:
        return self.fitting(need, architecture, exclude)

    def most_fitting(self, need: ResourceSlot, architecture: str | None,
                     exclude: set[str] = frozenset()) -> str | None:
        return self.fitting(need, architecture, exclude, most=True)

    def candidates(self, ids: Iterable[str], need: ResourceSlot, architecture: str | None,
                   exclude: set[str] = frozenset()) -> list[str]:
        """Of ``ids`` (designated agents), those in the index that match and hold ``need``."""
        out = []
        for aid in ids:
            a = self.agents.get(aid)
            if (
                a is not None
                and aid in self._keys
                and aid not in exclude
                and (architecture is None or a.architecture == architecture)
                and need.fits_in(a.free)
            ):
                out.append(aid)
        return out

    def indexed(self, agent_id: str) -> bool:
        return agent_id in self._keys

    # -- what agents hold (issues 25 and 30) ----------------------------------

    def pool_key(self, image: str, kernels: list) -> str | None:
        """The warm pool a session of ``image`` and ``kernels`` matches (one kernel of
        the pool's image and exactly its preset's slots), or None."""
        if not self.warm or len(kernels) != 1:
            return None
        return self.warm.get((image, slots_key(kernels[0][1])))

    def tiers(self, image: str, kernels: list) -> list[frozenset]:
        """The agents a session prefers, best first: those with a ready pooled kernel of
        its warm pool, those holding its image, those holding it or able to pull it. A
        tier naming every agent of the pool is left out with the ones after it (no
        preference then: the selector's own rule decides among all)."""
        out: list[frozenset] = []
        everyone = len(self.agents)
        key = self.pool_key(image, kernels)
        if key is not None:
            ready = frozenset(a.id for a in self.agents.values() if a.ready and a.ready.get(key, 0) > 0)
            if ready:
                if len(ready) == everyone:
                    return out
                out.append(ready)
        if not image:
            return out
        got = self._holders.get(image)
        if got is None:
            holders = frozenset(a.id for a in self.agents.values()
                                if a.images is not None and image in a.images)
            may_pull = holders | frozenset(a.id for a in self.agents.values()
                                           if a.images is None or a.backend == "docker")
            got = self._holders[image] = (holders, may_pull)
        for tier in got:
            if len(tier) == everyone:
                return out
            if tier and (not out or tier != out[-1]):
                out.append(tier)
        return out

    def took_pooled(self, image: str, kernels: list, agent_id: str) -> None:
        """A session of a warm pool was placed on ``agent_id``: it takes one of the
        agent's ready pooled kernels (the next session of the pass looks elsewhere)."""
        key = self.pool_key(image, kernels)
        a = self.agents.get(agent_id)
        if key is not None and a is not None and a.ready and a.ready.get(key, 0) > 0:
            a.ready = dict(a.ready, **{key: a.ready[key] - 1})

    def prefer(self, tier: frozenset, need: ResourceSlot, architecture: str | None,
               exclude: set[str], most: bool) -> str | None:
        """The agent of ``tier`` with the least (``most``: the most) free capacity that
        holds ``need``. Costs O(min(tier, agents outside it)): a small tier is scanned,
        a large one searched in the index with the others excluded."""
        outside = len(self.agents) - len(tier)
        if len(tier) <= outside:
            c = self.candidates(tier, need, architecture, exclude)
            if not c:
                return None
            return max(c, key=self.key) if most else min(c, key=self.key)
        skip = set(exclude) | (self.agents.keys() - tier)
        return self.fitting(need, architecture, skip, most)


def slots_key(slots: ResourceSlot) -> frozenset:
    """A request's slots as a key (zeros left out), to match it with a preset's."""
    return frozenset((k, v) for k, v in slots.items() if v)


def _first_fit(keys: SortedList, vec: tuple, exclude) -> tuple | None:
    d = len(vec)
    i = keys.bisect_left(vec)
    n = len(keys)
    while i < n:
        k = keys[i]
        for j in range(d):
            if k[j] < vec[j]:
                # Every key with prefix k[:j] and a smaller j-th amount falls short too.
                i = keys.bisect_left(k[:j] + vec[j:])
                break
        else:
            if k[-1] not in exclude:
                return k
            i += 1
    return None


def _last_fit(keys: SortedList, vec: tuple, exclude) -> tuple | None:
    d = len(vec)
    i = len(keys) - 1
    while i >= 0:
        k = keys[i]
        for j in range(d):
            if k[j] < vec[j]:
                # Keys before this one with the prefix k[:j] have no more of dimension j.
                i = keys.bisect_left(k[:j]) - 1
                break
        else:
            if k[-1] not in exclude:
                return k
            i -= 1
        if i >= 0 and keys[i] < vec:
            return None
    return None

