"""Which GPUs a kernel gets: the best-linked free ones, and the CPUs next to them.

Policy, in order (see docs/gpus.md):

1. whole devices only from GPUs not in MIG mode; MIG instances only as
   ``cuda.mig-<profile>`` slots, so one GPU is never both;
2. among the free devices, the set whose weakest pair link is best: NVLink (more
   links better), then one PCIe switch (PIX), several switches (PXB), one host
   bridge (PHB), one NUMA node (NODE), across sockets (SYS);
3. then the set on the fewest NUMA nodes, then the best links overall;
4. then the set that breaks the fewest good links of the devices left free (so a
   single-GPU kernel takes a GPU whose partner is already busy, and pairs and
   groups stay whole for the kernels that need them);
5. then the lowest indices (deterministic).

The kernel's CPU set is the CPUs next to its devices (their NUMA node) that this
agent may use, unless that is fewer CPUs than the kernel asked for.

Ownership is by UUID, rebuilt from the kernels' records when the agent restarts,
so a device is never given to two kernels. Across the agents of one host (two
installations on one GPU machine) a device is claimed host-wide while a kernel has it
(``claims``, :mod:`..hostclaims`): one another agent holds is passed over as if busy,
and a request that then finds too few says so.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from ...common.errors import AgentError, DevicesHeldElsewhere, InvalidRequest
from ...common.slots import CUDA, MIG_PREFIX
from ..hostclaims import HostClaims
from .cuda import CUDADevice, GPUTopology, MIGInstance, format_cpuset

log = logging.getLogger(__name__)

# Pair ranks (lower is better).
NVLINK, PIX, PXB, PHB, NODE, SYS = range(6)
_LEVEL_RANK = {0: PIX, 10: PIX, 20: PXB, 30: PHB, 40: NODE, 50: SYS}


@dataclass
class GPUAllocation:
    indices: list[int] = field(default_factory=list)  # whole devices
    mig: list[MIGInstance] = field(default_factory=list)
    uuids: list[str] = field(default_factory=list)  # what the container gets
    cpuset: str | None = None  # "0-19,40-59": CPUs next to the devices, or None


class GPUAllocator:
    """Keeps which kernel owns which device (by UUID) and picks devices for new ones.

    ``host_cpus``: the CPUs a cpuset may use (None: any the devices name).
    ``search_limit``: most device sets compared exhaustively; beyond it a greedy
    search from every free device is used.
    ``claims``: host-wide claims by UUID (None: this agent's books only, for devices
    that are described, not handed to containers).
    """

    def __init__(self, topology: GPUTopology, host_cpus: Iterable[int] | None = None,
                 search_limit: int = 20000, claims: HostClaims | None = None):
        self.topology = topology
        self.whole = {d.index: d for d in topology.devices if not d.mig_enabled}
        self.migs = {m.uuid: m for d in topology.devices for m in d.mig_instances}
        self.by_index = {d.index: d for d in topology.devices}  # (a mask leaves gaps)
        self.host_cpus = frozenset(host_cpus) if host_cpus is not None else None
        self.search_limit = search_limit
        self.claims = claims
        self._owner: dict[str, str] = {}

    # -- state -------------------------------------------------------------------

    def capacity(self) -> dict[str, Decimal]:
        cap: dict[str, Decimal] = {}
        if self.whole:
            cap[CUDA] = Decimal(len(self.whole))
        for m in self.migs.values():
            cap[m.slot] = cap.get(m.slot, Decimal(0)) + 1
        return cap

    def away(self) -> dict[str, Decimal]:
        """The devices and MIG instances (by slot) another agent of this host holds now:
        not this agent's to offer while that agent's kernels have them ({} without
        claims or when none is held elsewhere)."""
        if self.claims is None:
            return {}
        uuids = {d.uuid: CUDA for d in self.whole.values()} | {
            u: m.slot for u, m in self.migs.items()}
        out: dict[str, Decimal] = {}
        for u in self.claims.held_elsewhere(u for u in uuids if u not in self._owner):
            out[uuids[u]] = out.get(uuids[u], Decimal(0)) + 1
        return out

    def owners(self) -> dict[str, str]:
        """{device or MIG instance UUID: kernel id}"""
        return dict(self._owner)

    def owned(self, kernel_id: str) -> list[str]:
        """UUIDs of the devices and MIG instances ``kernel_id`` holds."""
        return sorted(u for u, k in self._owner.items() if k == kernel_id)

    def busy_indices(self) -> list[int]:
        return sorted(i for i, d in self.whole.items() if d.uuid in self._owner)

    def free_indices(self) -> list[int]:
        return sorted(i for i, d in self.whole.items() if d.uuid not in self._owner)

    def adopt(self, kernel_id: str, devices: Iterable) -> None:
        """A running kernel's devices (UUIDs; bare indices from older records) are its
        own again after a restart."""
        for dev in devices:
            if isinstance(dev, int) or (isinstance(dev, str) and dev.isdigit()):
                d = self.whole.get(int(dev))
                key = d.uuid if d else f"index:{dev}"
            else:
                key = str(dev)
            holder = self._owner.setdefault(key, kernel_id)
            if holder != kernel_id:
                log.error("device %s is recorded for kernels %s and %s", key, holder, kernel_id)
            elif self.claims is not None and not self.claims.take(key):
                log.error("device %s of kernel %s is claimed by another agent of this host "
                          "too (two installations given the same GPUs: see Agent.device_mask)",
                          key, kernel_id)

    def release(self, kernel_id: str) -> None:
        keys = [k for k, v in self._owner.items() if v == kernel_id]
        for key in keys:
            del self._owner[key]
        if self.claims is not None:
            self.claims.give_back(*keys)

    def release_all(self) -> None:
        """The host-wide claims given back (the agent stops); its books stay."""
        if self.claims is not None:
            self.claims.give_back_all()

    # -- choosing ------------------------------------------------------------------

    def take(self, kernel_id: str, n: int, mig: dict[str, int] | None = None,
             cpu: Decimal | float | None = None) -> GPUAllocation:
        """Pick ``n`` whole devices and ``mig`` ({profile: count}) instances for a kernel
        and mark them its own, claimed host-wide; raise AgentError (nothing taken) when
        they are not free. A device another agent of the host claims is passed over and
        the choice made again without it."""
        elsewhere: set[str] = set()  # UUIDs another agent of this host holds
        while True:
            alloc = self._choose_alloc(n, mig, cpu, elsewhere)
            refused = self._claim(alloc.uuids)
            if refused is None:
                break
            elsewhere.add(refused)
        for u in alloc.uuids:
            self._owner[u] = kernel_id
        return alloc

    def _choose_alloc(self, n: int, mig: dict[str, int] | None, cpu,
                      elsewhere: set[str]) -> GPUAllocation:
        free = [i for i in self.free_indices() if self.whole[i].uuid not in elsewhere]
        if n > len(free):
            held = sum(d.uuid in elsewhere for d in self.whole.values())
            raise _refusal(held, n <= len(free) + held)(
                f"only {len(free)} free CUDA devices, {n} requested" + _held_elsewhere(held))
        chosen = self.choose(n, free) if n else []
        instances = []
        for profile, count in sorted((mig or {}).items()):
            instances += self._choose_mig(profile, count,
                                          taken={m.uuid for m in instances} | elsewhere)
        alloc = GPUAllocation(
            indices=chosen, mig=instances,
            uuids=[self.whole[i].uuid for i in chosen] + [m.uuid for m in instances],
        )
        alloc.cpuset = self._cpuset([self.whole[i] for i in chosen] + [
            self.by_index[m.parent_index] for m in instances], cpu)
        return alloc

    def _claim(self, uuids: list[str]) -> str | None:
        """Claims ``uuids`` host-wide, all or none: the first another agent holds (with
        none of them taken), or None."""
        if self.claims is None:
            return None
        taken = []
        for u in uuids:
            if not self.claims.take(u):
                self.claims.give_back(*taken)
                return u
            taken.append(u)
        return None

    def rank(self, a: int, b: int) -> int:
        link = self.topology.link(a, b)
        if link.nvlinks:
            return NVLINK
        if link.pcie_level is not None:
            return _LEVEL_RANK.get(link.pcie_level, SYS)
        na, nb = self.whole[a].numa_node, self.whole[b].numa_node
        return NODE if na is not None and na == nb else SYS

    def _key(self, combo: tuple[int, ...], free: list[int]) -> tuple:
        pairs = list(itertools.combinations(combo, 2))
        ranks = [self.rank(a, b) for a, b in pairs]
        nvs = [self.topology.link(a, b).nvlinks for a, b in pairs]
        worst = max(ranks, default=NVLINK)
        weakest = min(nvs, default=0) if worst == NVLINK else 0
        nodes = len({self.whole[i].numa_node for i in combo})
        rest = [r for r in free if r not in combo]
        damage = sum((SYS - self.rank(c, r)) + self.topology.link(c, r).nvlinks
                     for c in combo for r in rest)
        return (worst, -weakest, nodes, sum(ranks), -sum(nvs), damage, combo)

    def choose(self, n: int, free: list[int]) -> list[int]:
        """The best ``n`` of the ``free`` whole devices (policy in the module doc)."""
        if n >= len(free):
            return sorted(free)[:n]
        if math.comb(len(free), n) <= self.search_limit:
            candidates = itertools.combinations(sorted(free), n)
        else:
            candidates = (self._greedy(seed, n, free) for seed in free)
        return list(min(candidates, key=lambda c: self._key(c, free)))

    def _greedy(self, seed: int, n: int, free: list[int]) -> tuple[int, ...]:
        got = [seed]
        while len(got) < n:
            nxt = min((d for d in free if d not in got),
                      key=lambda d: self._key(tuple(sorted([*got, d])), free))
            got.append(nxt)
        return tuple(sorted(got))

    def _choose_mig(self, profile: str, count: int, taken: set[str]) -> list[MIGInstance]:
        free = [m for m in self.migs.values()
                if m.profile == profile and m.uuid not in self._owner and m.uuid not in taken]
        if count > len(free):
            held = sum(m.profile == profile and m.uuid in taken and m.uuid not in self._owner
                       for m in self.migs.values())
            raise _refusal(held, count <= len(free) + held)(
                f"only {len(free)} free MIG instances of profile {profile} "
                f"({MIG_PREFIX}{profile}), {count} requested" + _held_elsewhere(held))
        # Fill GPUs that are partly used first, so that whole partitions stay free.
        busy = {}
        for u in self._owner:
            if u in self.migs:
                busy[self.migs[u].parent_index] = busy.get(self.migs[u].parent_index, 0) + 1
        free.sort(key=lambda m: (-busy.get(m.parent_index, 0), m.parent_index,
                                 m.gpu_instance if m.gpu_instance is not None else 0, m.uuid))
        return free[:count]

    def _cpuset(self, devices: list[CUDADevice], cpu) -> str | None:
        cpus = set()
        for d in devices:
            cpus.update(d.cpus)
        if self.host_cpus is not None:
            cpus &= self.host_cpus
        if not cpus:
            return None
        if cpu is not None and len(cpus) < Decimal(str(cpu)):
            return None  # pinning would give the kernel fewer cores than it asked for
        return format_cpuset(cpus)


def _refusal(held: int, would_fit: bool) -> type[AgentError]:
    """What a request that finds too few devices raises: DevicesHeldElsewhere when the
    devices another agent of the host holds are what it lacks (it then waits for them),
    else AgentError."""
    return DevicesHeldElsewhere if held and would_fit else AgentError


def _held_elsewhere(n: int) -> str:
    if not n:
        return ""
    return (f"; {n} more held by another agent of this host (another installation on "
            "the same GPUs: give each agent its own with Agent.device_mask)")


def mig_request(slots: dict) -> dict[str, int]:
    """{profile: count} from a kernel's slots (``cuda.mig-<profile>``: whole numbers)."""
    out = {}
    for k, v in slots.items():
        if not k.startswith(MIG_PREFIX) or not v:
            continue
        n = int(v)
        if n != v or n < 0:
            raise InvalidRequest(f"{k} must be a whole number of MIG instances, not {v}")
        out[k[len(MIG_PREFIX):]] = n
    return out
