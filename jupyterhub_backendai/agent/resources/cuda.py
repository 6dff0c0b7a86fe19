"""CUDA devices, discovered through NVML (``nvidia-ml-py``).

:class:`NVMLDeviceSource` asks the real driver. :class:`StaticDeviceSource` is the
stand-in used where no GPU exists (CI): it reports devices given in configuration
and is never chosen automatically.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CUDADevice:
    index: int
    uuid: str
    name: str
    memory_bytes: int
    numa_node: int | None = None

    def to_json(self) -> dict:
        return asdict(self)


class DeviceSource:
    fake = False

    def devices(self) -> list[CUDADevice]:
        raise NotImplementedError


class NVMLDeviceSource(DeviceSource):
    def devices(self) -> list[CUDADevice]:
        try:
            import pynvml
        except ImportError:
            return []
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            log.info("NVML not available (%s): no CUDA devices", e)
            return []
        try:
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                uuid = pynvml.nvmlDeviceGetUUID(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
                numa = None
                try:
                    numa = pynvml.nvmlDeviceGetNumaNodeId(h)
                except (pynvml.NVMLError, AttributeError):
                    pass
                found.append(
                    CUDADevice(
                        index=i,
                        uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                        name=name.decode() if isinstance(name, bytes) else name,
                        memory_bytes=int(mem),
                        numa_node=numa,
                    )
                )
            return found
        finally:
            pynvml.nvmlShutdown()


class StaticDeviceSource(DeviceSource):
    """Devices from configuration: the NVML stand-in for machines without a GPU."""

    fake = True

    def __init__(self, devices: list[dict]):
        self._devices = [
            CUDADevice(
                index=int(d.get("index", i)),
                uuid=str(d.get("uuid", f"GPU-fake-{i}")),
                name=str(d.get("name", "Fake GPU")),
                memory_bytes=int(d.get("memory_bytes", 16 * 2**30)),
                numa_node=d.get("numa_node"),
            )
            for i, d in enumerate(devices)
        ]

    def devices(self) -> list[CUDADevice]:
        return list(self._devices)
