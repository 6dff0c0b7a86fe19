"""CUDA devices and how they are linked, discovered through NVML (``nvidia-ml-py``).

:class:`NVMLDeviceSource` asks the driver through the ``pynvml`` module, or through
any object with pynvml's functions (the stand-in of :mod:`.nvml_standin` in tests).
It finds each GPU's index, UUID, name, memory, PCI bus id, NUMA node and nearby
CPUs, its MIG mode and MIG instances, and for every pair of GPUs their PCIe common
ancestor (``nvmlDeviceGetTopologyCommonAncestor``) and NVLinks.

:class:`StaticDeviceSource` reports devices given in configuration
(``Agent.fake_cuda_devices``) and is never chosen automatically.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from dataclasses import asdict, dataclass, field, replace

from ...common.slots import mig_slot  # cuda.mig-<profile>: one definition of slot names

log = logging.getLogger(__name__)

# nvmlDeviceGetTopologyCommonAncestor levels, named as ``nvidia-smi topo -m`` does.
TOPOLOGY_NAMES = {0: "BOARD", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# Words of 64 CPUs asked for in nvmlDeviceGetCpuAffinity (1024 CPUs).
CPU_SET_WORDS = 16


@dataclass(frozen=True)
class MIGInstance:
    """One MIG instance: a slot of its own (``cuda.mig-<profile>``)."""

    uuid: str
    profile: str
    parent_index: int
    parent_uuid: str
    memory_bytes: int
    gpu_instance: int | None = None
    compute_instance: int | None = None

    @property
    def slot(self) -> str:
        return mig_slot(self.profile)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CUDADevice:
    index: int
    uuid: str
    name: str
    memory_bytes: int
    numa_node: int | None = None
    pci_bus_id: str | None = None
    # The CPUs next to the device (NVML's CPU affinity: its NUMA node's CPUs).
    cpus: tuple[int, ...] = ()
    mig_enabled: bool = False
    mig_instances: tuple[MIGInstance, ...] = ()

    def to_json(self) -> dict:
        d = asdict(self)
        d["cpus"] = format_cpuset(self.cpus)
        d["mig_instances"] = [m.to_json() for m in self.mig_instances]
        return d


@dataclass(frozen=True)
class Link:
    """How two GPUs reach each other."""

    nvlinks: int = 0
    # NVML topology level of the PCIe common ancestor (0 board ... 50 system), None: unknown.
    pcie_level: int | None = None
    via_nvswitch: bool = False

    @property
    def label(self) -> str:
        """As ``nvidia-smi topo -m`` prints it: NV<n>, PIX, PXB, PHB, NODE or SYS."""
        if self.nvlinks:
            return f"NV{self.nvlinks}"
        return TOPOLOGY_NAMES.get(self.pcie_level, "?")


@dataclass
class GPUTopology:
    devices: list[CUDADevice] = field(default_factory=list)
    # {(i, j): Link} for device indices i < j.
    links: dict[tuple[int, int], Link] = field(default_factory=dict)
    driver: str = ""
    # Why nothing was found, when nothing was.
    problem: str = ""

    def link(self, i: int, j: int) -> Link:
        if i == j:
            return Link(pcie_level=0)
        return self.links.get((min(i, j), max(i, j)), Link())

    def without(self, mask) -> GPUTopology:
        """This topology less the GPUs and MIG instances in ``mask`` (indices or UUIDs,
        as Backend.AI's device mask names them): a masked GPU goes with its instances.
        Indices stay as NVML gives them."""
        mask = _mask(mask)
        if not mask:
            return self
        keep = []
        for d in self.devices:
            if str(d.index) in mask or d.uuid in mask:
                continue
            migs = tuple(m for m in d.mig_instances if m.uuid not in mask)
            keep.append(d if migs == d.mig_instances else replace(d, mig_instances=migs))
        kept = {d.index for d in keep}
        return GPUTopology(
            devices=keep, driver=self.driver, problem=self.problem,
            links={k: v for k, v in self.links.items() if k[0] in kept and k[1] in kept})

    def unknown(self, mask) -> list[str]:
        """The entries of ``mask`` that name no GPU (index or UUID) or MIG instance here."""
        named = {n for d in self.devices for n in (str(d.index), d.uuid)} | {
            m.uuid for d in self.devices for m in d.mig_instances}
        return sorted(_mask(mask) - named)

    def to_json(self) -> dict:
        return {
            "driver": self.driver,
            "devices": [d.to_json() for d in self.devices],
            "links": [
                {"a": i, "b": j, "link": ln.label, "nvlinks": ln.nvlinks,
                 "pcie": TOPOLOGY_NAMES.get(ln.pcie_level), "via_nvswitch": ln.via_nvswitch}
                for (i, j), ln in sorted(self.links.items())
            ],
        }


def _mask(mask) -> set[str]:
    """A device mask's entries as the names they are compared with."""
    return {str(m).strip() for m in mask or ()} - {""}


def format_cpuset(cpus) -> str:
    """CPU numbers as Docker's CpusetCpus and Linux's cpulist write them: ``0-3,8``."""
    out, run = [], []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_cpuset(text: str) -> list[int]:
    cpus = []
    for part in (text or "").strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _bus_id(v) -> str:
    """PCI bus ids as NVML writes them (domain of 8 hex digits, upper case)."""
    s = _text(v).strip().upper()
    if s.count(":") == 2:
        dom, rest = s.split(":", 1)
        try:
            return f"{int(dom, 16):08X}:{rest}"
        except ValueError:
            pass
    return s


# Why a device has no utilisation figure (said in the statistics and the console).
NO_MIG_UTIL = "NVML gives no utilisation under MIG"
NO_UTIL = "NVML gives no utilisation for this device"


def use_entry(index: int, uuid: str, name: str, *, parent_index: int | None = None,
              util_pct: float | None = None, mem_used_bytes: int | None = None,
              mem_total_bytes: int | None = None, note: str = "") -> dict:
    """One GPU's or MIG instance's live use, as the statistics carry it (:mod:`..stats`)."""
    return {"index": index, "uuid": uuid, "name": name, "parent_index": parent_index,
            "util_pct": util_pct, "mem_used_bytes": mem_used_bytes,
            "mem_total_bytes": mem_total_bytes, "note": note}


class DeviceSource:
    fake = False

    def devices(self) -> list[CUDADevice]:
        return self.topology().devices

    def live_use(self) -> list[dict]:
        """Each GPU's and MIG instance's live use (:func:`use_entry`); [] when unknown."""
        return []

    def topology(self) -> GPUTopology:
        raise NotImplementedError


class NVMLDeviceSource(DeviceSource):
    """Devices from NVML. ``nvml``: the pynvml module (default) or a stand-in with the
    same functions; a stand-in marks itself with ``STAND_IN = True`` and its devices
    are then fake (nothing is handed to containers)."""

    def __init__(self, nvml=None):
        self._nvml = nvml

    @property
    def fake(self) -> bool:
        return bool(getattr(self._nvml, "STAND_IN", False))

    def _module(self):
        if self._nvml is not None:
            return self._nvml
        try:
            import pynvml
        except ImportError:
            return None
        return pynvml

    def utilization(self) -> dict[str, float]:
        """GPU utilisation (percent, NVML's last sample period) by device UUID; MIG
        instances report their parent's, where it has one. {} when NVML is not there."""
        out: dict[str, float] = {}
        by_index: dict[int, float] = {}
        for d in self.live_use():
            pct = d["util_pct"]
            if pct is None and d["parent_index"] is not None:
                pct = by_index.get(d["parent_index"])
            if pct is not None:
                out[d["uuid"]] = pct
                if d["parent_index"] is None:
                    by_index[d["index"]] = pct
        return out

    def live_use(self) -> list[dict]:
        """One NVML pass: for each GPU, then its MIG instances, utilisation (percent,
        ``nvmlDeviceGetUtilizationRates``: None where NVML gives none, as under MIG,
        with a note saying so) and memory used and total (``nvmlDeviceGetMemoryInfo``).
        MIG instances carry their parent's index in ``parent_index`` and their own
        ``index`` among its instances. [] when NVML is not there."""
        nvml = self._module()
        if nvml is None:
            return []
        try:
            nvml.nvmlInit()
        except nvml.NVMLError:
            return []
        try:
            out: list[dict] = []
            for i in range(nvml.nvmlDeviceGetCount()):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                migs = []
                try:
                    if nvml.nvmlDeviceGetMigMode(h)[0] == nvml.NVML_DEVICE_MIG_ENABLE:
                        for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                            try:
                                migs.append((j, nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)))
                            except nvml.NVMLError:
                                continue
                except (nvml.NVMLError, AttributeError):
                    pass
                out.append(self._use(nvml, i, h, None, NO_MIG_UTIL if migs else NO_UTIL))
                out += [self._use(nvml, j, m, i, NO_MIG_UTIL) for j, m in migs]
            return out
        finally:
            nvml.nvmlShutdown()

    @staticmethod
    def _use(nvml, index: int, h, parent: int | None, why_none: str) -> dict:
        util, used, total, note = None, None, None, ""
        try:
            util = float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        except (nvml.NVMLError, AttributeError):
            note = why_none
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            used, total = int(mem.used), int(mem.total)
        except (nvml.NVMLError, AttributeError):
            pass
        return use_entry(index, _text(nvml.nvmlDeviceGetUUID(h)),
                         _text(nvml.nvmlDeviceGetName(h)), parent_index=parent, util_pct=util,
                         mem_used_bytes=used, mem_total_bytes=total, note=note)

    def topology(self) -> GPUTopology:
        nvml = self._module()
        if nvml is None:
            return GPUTopology(problem="the pynvml module (nvidia-ml-py) is not installed")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            log.info("NVML not available (%s): no CUDA devices", e)
            return GPUTopology(problem=f"NVML is not available: {e}")
        try:
            try:
                driver = _text(nvml.nvmlSystemGetDriverVersion())
            except nvml.NVMLError:
                driver = ""
            handles, devices = [], []
            for i in range(nvml.nvmlDeviceGetCount()):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                handles.append(h)
                devices.append(self._device(nvml, i, h))
            return GPUTopology(devices, self._links(nvml, handles, devices), driver)
        finally:
            nvml.nvmlShutdown()

    def _device(self, nvml, i: int, h) -> CUDADevice:
        uuid = _text(nvml.nvmlDeviceGetUUID(h))
        bus = None
        try:
            bus = _bus_id(nvml.nvmlDeviceGetPciInfo(h).busId)
        except nvml.NVMLError:
            pass
        numa = None
        try:
            numa = nvml.nvmlDeviceGetNumaNodeId(h)
        except (nvml.NVMLError, AttributeError):
            numa = _sysfs_numa(bus)
        if numa is not None and numa < 0:
            numa = None
        cpus: tuple[int, ...] = ()
        try:
            words = nvml.nvmlDeviceGetCpuAffinity(h, CPU_SET_WORDS)
            cpus = tuple(w * 64 + b for w, word in enumerate(words) for b in range(64)
                         if int(word) >> b & 1)
        except nvml.NVMLError:
            pass
        if not cpus and numa is not None and not self.fake:
            cpus = numa_cpus(numa)
        mig_on = False
        try:
            mig_on = nvml.nvmlDeviceGetMigMode(h)[0] == nvml.NVML_DEVICE_MIG_ENABLE
        except nvml.NVMLError:
            pass
        migs = self._mig_instances(nvml, i, uuid, h) if mig_on else ()
        return CUDADevice(
            index=i, uuid=uuid, name=_text(nvml.nvmlDeviceGetName(h)),
            memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(h).total), numa_node=numa,
            pci_bus_id=bus, cpus=cpus, mig_enabled=mig_on, mig_instances=migs,
        )

    def _mig_instances(self, nvml, i: int, parent_uuid: str, h) -> tuple[MIGInstance, ...]:
        found = []
        for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except nvml.NVMLError:
                continue  # no instance at this index
            name = _text(nvml.nvmlDeviceGetName(m))
            match = re.search(r"MIG\s+(\S+)\s*$", name)
            profile = match.group(1) if match else _profile_from_attributes(nvml, m)
            ids = []
            for fn in ("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"):
                try:
                    ids.append(getattr(nvml, fn)(m))
                except (nvml.NVMLError, AttributeError):
                    ids.append(None)
            found.append(MIGInstance(
                uuid=_text(nvml.nvmlDeviceGetUUID(m)), profile=profile, parent_index=i,
                parent_uuid=parent_uuid, memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(m).total),
                gpu_instance=ids[0], compute_instance=ids[1],
            ))
        return tuple(found)

    def _links(self, nvml, handles, devices) -> dict[tuple[int, int], Link]:
        by_bus = {d.pci_bus_id: d.index for d in devices if d.pci_bus_id}
        nv: dict[tuple[int, int], int] = {}
        to_switch: dict[int, int] = {}
        for d, h in zip(devices, handles, strict=True):
            for port in range(nvml.NVML_NVLINK_MAX_LINKS):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(h, port) != nvml.NVML_FEATURE_ENABLED:
                        continue
                    remote = _bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, port).busId)
                except nvml.NVMLError as e:
                    if getattr(e, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                        break  # this GPU has no NVLink at all
                    continue  # past the GPU's last port
                j = by_bus.get(remote)
                if j is not None and j != d.index:
                    nv[(d.index, j)] = nv.get((d.index, j), 0) + 1
                    continue
                try:
                    kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, port)
                except (nvml.NVMLError, AttributeError):
                    kind = nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
                if kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                    to_switch[d.index] = to_switch.get(d.index, 0) + 1
        links = {}
        for a, b in itertools.combinations(range(len(devices)), 2):
            try:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
            except (nvml.NVMLError, AttributeError):
                level = None
            direct = nv.get((a, b), 0)
            switched = min(to_switch.get(a, 0), to_switch.get(b, 0))
            links[(a, b)] = Link(
                nvlinks=direct or switched, pcie_level=level,
                via_nvswitch=not direct and switched > 0,
            )
        return links


def _profile_from_attributes(nvml, m) -> str:
    try:
        a = nvml.nvmlDeviceGetAttributes(m)
        return f"{a.gpuInstanceSliceCount}g.{round(a.memorySizeMB / 1024)}gb"
    except (nvml.NVMLError, AttributeError):
        return "unknown"


def _sysfs_numa(bus: str | None) -> int | None:
    if not bus:
        return None
    dom, rest = bus.split(":", 1)
    path = f"/sys/bus/pci/devices/{int(dom, 16):04x}:{rest.lower()}/numa_node"
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def numa_cpus(node: int) -> tuple[int, ...]:
    """The CPUs of a NUMA node of this machine (empty when unknown)."""
    try:
        with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
            return tuple(parse_cpuset(f.read()))
    except (OSError, ValueError):
        return ()


class StaticDeviceSource(DeviceSource):
    """Devices from configuration: whole GPUs with a NUMA node each, linked by
    nothing better than that (the simple stand-in of ``Agent.fake_cuda_devices``)."""

    fake = True

    def __init__(self, devices: list[dict]):
        self._devices = [
            CUDADevice(
                index=int(d.get("index", i)),
                uuid=str(d.get("uuid", f"GPU-fake-{i}")),
                name=str(d.get("name", "Fake GPU")),
                memory_bytes=int(d.get("memory_bytes", 16 * 2**30)),
                numa_node=d.get("numa_node"),
                pci_bus_id=d.get("pci_bus_id"),
                cpus=tuple(parse_cpuset(d["cpus"])) if d.get("cpus") else (),
            )
            for i, d in enumerate(devices)
        ]

    def topology(self) -> GPUTopology:
        return GPUTopology(list(self._devices))

    def live_use(self) -> list[dict]:
        """Configured devices: no figures (nothing measures them), said so."""
        return [use_entry(d.index, d.uuid, d.name, mem_total_bytes=d.memory_bytes,
                          note="configured device (Agent.fake_cuda_devices): no figures")
                for d in self._devices]


def host_cpus() -> frozenset[int]:
    """The CPUs this process may run on (what a cpuset can be made of)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))
