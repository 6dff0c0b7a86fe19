"""An NVML stand-in: pynvml's functions answered from a described machine.

This is NOT a GPU and not NVML. It exists so that the real discovery code
(:class:`~.cuda.NVMLDeviceSource`) and the topology-aware allocator can be run
and tested where no GPU is at hand (CI). Every answer comes from one of the
machine descriptions below, which copy real topologies:

- :func:`dgx1_v100`: 8 GPUs on two sockets, NVLink hybrid cube-mesh (DGX-1V),
  a PCIe switch per GPU pair;
- :func:`pcie_4gpu`: 4 PCIe GPUs on one socket, two PCIe switches, no NVLink;
- :func:`a100_mig`: two A100s on an NVSwitch, the first partitioned with MIG.

Only the functions the agent calls are faked; constants and the error classes
are pynvml's own, so ``except pynvml.NVMLError`` works unchanged.

Live use (utilisation and memory in use) is whatever a test sets with
:meth:`StandInNVML.set_use` (0 until then): made-up figures, never measured. As
on a real driver, a MIG instance and a GPU in MIG mode answer
``nvmlDeviceGetUtilizationRates`` with NOT_SUPPORTED; their memory in use is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml

GiB = 2**30
MiB = 2**20


@dataclass
class FakeMIG:
    profile: str
    uuid: str
    memory_bytes: int
    gpu_instance: int
    compute_instance: int = 0
    # Set by tests (StandInNVML.set_use), not measured.
    mem_used_bytes: int = 0


@dataclass
class FakeGPU:
    name: str
    uuid: str
    memory_bytes: int
    bus_id: str
    numa_node: int
    cpus: list[int]
    # (socket, host bridge, upper PCIe switch, PCIe switch): where the GPU hangs.
    pcie_path: tuple[int, int, int, int]
    nvlink_ports: int = 0
    mig_capable: bool = False
    mig: list[FakeMIG] | None = None  # None: MIG off
    # Live use, set by tests (StandInNVML.set_use), not measured.
    util_pct: int = 0
    mem_util_pct: int = 0
    mem_used_bytes: int = 0

    @property
    def mig_enabled(self) -> bool:
        return self.mig is not None


@dataclass
class FakeMachine:
    name: str
    gpus: list[FakeGPU]
    # {(i, j): number of NVLinks between GPU i and GPU j}
    nvlinks: dict[tuple[int, int], int] = field(default_factory=dict)
    # {i: number of GPU i's NVLinks that go to an NVSwitch}
    nvswitch_links: dict[int, int] = field(default_factory=dict)
    driver: str = "550.54.15 (stand-in)"


@dataclass(frozen=True)
class _Handle:
    gpu: int
    mig: int | None = None


class _PciInfo:
    def __init__(self, bus_id: str):
        # pynvml's structure holds C chars: bytes.
        self.busId = bus_id.encode()


class _MemoryInfo:
    def __init__(self, total: int, used: int = 0):
        self.total = total
        self.used = min(used, total)
        self.free = total - self.used


class _Utilization:
    """As pynvml's c_nvmlUtilization_t: percents over NVML's last sample period."""

    def __init__(self, gpu: int, memory: int):
        self.gpu = gpu
        self.memory = memory


class StandInNVML:
    """Acts as the ``pynvml`` module for one :class:`FakeMachine`."""

    STAND_IN = True
    NVMLError = pynvml.NVMLError

    def __init__(self, machine: FakeMachine):
        self.machine = machine
        self.initialized = 0
        # Each GPU's NVLink ports: remote bus id, or "switch".
        self._ports: list[list[str]] = [[] for _ in machine.gpus]
        for (i, j), n in sorted(machine.nvlinks.items()):
            self._ports[i] += [machine.gpus[j].bus_id] * n
            self._ports[j] += [machine.gpus[i].bus_id] * n
        for i, n in machine.nvswitch_links.items():
            self._ports[i] += ["switch"] * n
        for g, ports in zip(machine.gpus, self._ports, strict=True):
            assert len(ports) <= g.nvlink_ports, f"{g.uuid}: more NVLinks than ports"

    def __getattr__(self, name: str):
        if name.startswith("NVML_"):
            return getattr(pynvml, name)
        raise AttributeError(f"the NVML stand-in does not fake {name}")

    def _err(self, code: int):
        return pynvml.NVMLError(code)

    def _check(self) -> None:
        if not self.initialized:
            raise self._err(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, h: _Handle) -> FakeGPU:
        self._check()
        return self.machine.gpus[h.gpu]

    def _mig(self, h: _Handle) -> FakeMIG | None:
        g = self._gpu(h)
        return None if h.mig is None else g.mig[h.mig]

    def set_use(self, uuid: str, *, util_pct: int | None = None,
                mem_used_bytes: int | None = None, mem_util_pct: int | None = None) -> None:
        """Set the made-up live figures of a GPU or MIG instance (by UUID) that the
        stand-in answers from then on (a MIG instance has no utilisation)."""
        for g in self.machine.gpus:
            for d in [g, *(g.mig or [])]:
                if d.uuid != uuid:
                    continue
                if util_pct is not None or mem_util_pct is not None:
                    if not isinstance(d, FakeGPU):
                        raise ValueError(f"{uuid}: NVML gives no utilisation for MIG instances")
                    d.util_pct = d.util_pct if util_pct is None else int(util_pct)
                    d.mem_util_pct = d.mem_util_pct if mem_util_pct is None else int(mem_util_pct)
                if mem_used_bytes is not None:
                    if not 0 <= mem_used_bytes <= d.memory_bytes:
                        raise ValueError(f"{uuid}: memory in use must be 0 to {d.memory_bytes}")
                    d.mem_used_bytes = int(mem_used_bytes)
                return
        raise ValueError(f"the stand-in has no GPU or MIG instance {uuid!r}")

    # -- the faked functions ----------------------------------------------------

    def nvmlInit(self) -> None:
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.machine.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.machine.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check()
        if not 0 <= index < len(self.machine.gpus):
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        g, m = self._gpu(h), self._mig(h)
        return f"{g.name} MIG {m.profile}" if m else g.name

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        m = self._mig(h)
        return m.uuid if m else self._gpu(h).uuid

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version=None) -> _MemoryInfo:
        d = self._mig(h) or self._gpu(h)
        return _MemoryInfo(d.memory_bytes, d.mem_used_bytes)

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> _Utilization:
        g = self._gpu(h)
        if h.mig is not None or g.mig_enabled:  # as the driver: none under MIG
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _Utilization(g.util_pct, g.mem_util_pct)

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> _PciInfo:
        return _PciInfo(self._gpu(h).bus_id)

    def nvmlDeviceGetNumaNodeId(self, h: _Handle) -> int:
        return self._gpu(h).numa_node

    def nvmlDeviceGetCpuAffinity(self, h: _Handle, cpu_set_size: int) -> list[int]:
        words = [0] * cpu_set_size
        for c in self._gpu(h).cpus:
            if c // 64 < cpu_set_size:
                words[c // 64] |= 1 << (c % 64)
        return words

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        g = self._gpu(h)
        if not g.mig_capable:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if g.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        g = self._gpu(h)
        if not g.mig_capable:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, index: int) -> _Handle:
        g = self._gpu(h)
        if not g.mig_enabled or not 0 <= index < 7:
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(g.mig):
            raise self._err(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(h.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, h: _Handle) -> int:
        m = self._mig(h)
        if m is None:
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return m.gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, h: _Handle) -> int:
        m = self._mig(h)
        if m is None:
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return m.compute_instance

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: _Handle, h2: _Handle) -> int:
        a, b = self._gpu(h1).pcie_path, self._gpu(h2).pcie_path
        if h1.gpu == h2.gpu:
            return pynvml.NVML_TOPOLOGY_INTERNAL
        if a == b:
            return pynvml.NVML_TOPOLOGY_SINGLE
        if a[:3] == b[:3]:
            return pynvml.NVML_TOPOLOGY_MULTIPLE
        if a[:2] == b[:2]:
            return pynvml.NVML_TOPOLOGY_HOSTBRIDGE
        if a[:1] == b[:1]:
            return pynvml.NVML_TOPOLOGY_NODE
        return pynvml.NVML_TOPOLOGY_SYSTEM

    def _port(self, h: _Handle, link: int) -> str | None:
        g = self._gpu(h)
        if not g.nvlink_ports:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < g.nvlink_ports:
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        ports = self._ports[h.gpu]
        return ports[link] if link < len(ports) else None

    def nvmlDeviceGetNvLinkState(self, h: _Handle, link: int) -> int:
        used = self._port(h, link) is not None
        return pynvml.NVML_FEATURE_ENABLED if used else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: _Handle, link: int) -> _PciInfo:
        remote = self._port(h, link)
        if remote is None:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _PciInfo("00000000:C0:00.0" if remote == "switch" else remote)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: _Handle, link: int) -> int:
        remote = self._port(h, link)
        if remote is None:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if remote == "switch":
            return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        return pynvml.NVML_NVLINK_DEVICE_TYPE_GPU


def _uuid(machine: int, i: int, kind: str = "GPU") -> str:
    return f"{kind}-5ba1d000-{machine:04x}-4000-8000-{i:012x}"


def dgx1_v100() -> FakeMachine:
    """DGX-1 with V100s: two sockets (NUMA 0: GPUs 0-3, NUMA 1: GPUs 4-7), a PCIe
    switch per GPU pair (0-1, 2-3, 4-5, 6-7), and NVLink in the hybrid cube-mesh of
    ``nvidia-smi topo -m`` on that box: each socket's four GPUs all linked (NV1 or
    NV2), and one cross-socket link per GPU (0-4, 1-5 NV2; 2-6, 3-7 NV1)."""
    numa_cpus = {0: [*range(0, 20), *range(40, 60)], 1: [*range(20, 40), *range(60, 80)]}
    bus = ["06", "07", "0A", "0B", "85", "86", "89", "8A"]
    gpus = []
    for i in range(8):
        socket = i // 4
        switch = i // 2
        gpus.append(FakeGPU(
            name="Tesla V100-SXM2-32GB", uuid=_uuid(1, i), memory_bytes=32 * GiB,
            bus_id=f"00000000:{bus[i]}:00.0", numa_node=socket, cpus=numa_cpus[socket],
            pcie_path=(socket, socket, switch, switch), nvlink_ports=6,
        ))
    nvlinks = {
        (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
        (1, 2): 2, (1, 3): 1, (1, 5): 2,
        (2, 3): 2, (2, 6): 1,
        (3, 7): 1,
        (4, 5): 1, (4, 6): 1, (4, 7): 2,
        (5, 6): 2, (5, 7): 1,
        (6, 7): 2,
    }
    return FakeMachine("dgx1-v100", gpus, nvlinks)


def pcie_4gpu() -> FakeMachine:
    """A workstation-class server: one socket, four PCIe GPUs, two PCIe switches
    (GPUs 0-1 and 2-3) under one host bridge, no NVLink."""
    cpus = list(range(32))
    gpus = [
        FakeGPU(name="NVIDIA RTX A6000", uuid=_uuid(2, i), memory_bytes=48 * GiB,
                bus_id=f"00000000:{0x41 + i:02X}:00.0", numa_node=0, cpus=cpus,
                pcie_path=(0, 0, i // 2, i // 2))
        for i in range(4)
    ]
    return FakeMachine("pcie-4gpu", gpus)


def a100_mig() -> FakeMachine:
    """Two A100-SXM4-80GB on an NVSwitch (12 links each), one socket. GPU 0 is in MIG
    mode, partitioned into 2 x 1g.10gb, 1 x 2g.20gb and 1 x 3g.40gb (all seven
    slices); GPU 1 is a whole device."""
    cpus = list(range(64))
    mig = [
        FakeMIG("3g.40gb", _uuid(3, 0x30, "MIG"), 40192 * MiB, gpu_instance=2),
        FakeMIG("2g.20gb", _uuid(3, 0x20, "MIG"), 19968 * MiB, gpu_instance=3),
        FakeMIG("1g.10gb", _uuid(3, 0x11, "MIG"), 9728 * MiB, gpu_instance=9),
        FakeMIG("1g.10gb", _uuid(3, 0x12, "MIG"), 9728 * MiB, gpu_instance=10),
    ]
    gpus = [
        FakeGPU(name="NVIDIA A100-SXM4-80GB", uuid=_uuid(3, i), memory_bytes=80 * GiB,
                bus_id=f"00000000:{0x07 + i * 8:02X}:00.0", numa_node=0, cpus=cpus,
                pcie_path=(0, 0, i, i), nvlink_ports=12, mig_capable=True,
                mig=mig if i == 0 else None)
        for i in range(2)
    ]
    return FakeMachine("a100-mig", gpus, nvswitch_links={0: 12, 1: 12})


MACHINES = {"dgx1-v100": dgx1_v100, "pcie-4gpu": pcie_4gpu, "a100-mig": a100_mig}


def stand_in(name: str) -> StandInNVML:
    """The stand-in for one of :data:`MACHINES` by name."""
    try:
        return StandInNVML(MACHINES[name]())
    except KeyError:
        raise ValueError(
            f"no NVML stand-in machine {name!r} (known: {', '.join(MACHINES)})") from None
