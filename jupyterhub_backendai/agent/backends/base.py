"""The contract between the agent and a way of running kernels."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ...common.errors import InvalidRequest

LABEL_PREFIX = "ai.backend."
SERVICE_PORTS_LABEL = "ai.backend.service-ports"


@dataclass
class ServicePort:
    name: str
    protocol: str
    container_port: int
    host_port: int | None = None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "protocol": self.protocol,
            "container_port": self.container_port,
            "host_port": self.host_port,
        }


def parse_service_ports(label: str | None) -> list[ServicePort]:
    """Parse Backend.AI's ``name:protocol:port[,...]`` image label."""
    if not label:
        return []
    ports = []
    for item in label.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            name, proto, port = item.split(":")
            ports.append(ServicePort(name, proto, int(port)))
        except ValueError:
            raise InvalidRequest(f"malformed service port declaration {item!r} in image") from None
    return ports


@dataclass
class ImageInfo:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    architecture: str = "x86_64"

    @property
    def service_ports(self) -> list[ServicePort]:
        return parse_service_ports(self.labels.get(SERVICE_PORTS_LABEL))

    def min_slots(self) -> dict[str, str]:
        prefix = "ai.backend.resource.min."
        return {k[len(prefix) :]: v for k, v in self.labels.items() if k.startswith(prefix)}


@dataclass
class KernelRecord:
    """What a backend knows about one running kernel (survives agent restarts)."""

    kernel_id: str
    session_id: str
    container_id: str
    host: str
    service_ports: list[dict]
    cuda_devices: list[int] = field(default_factory=list)
    alive: bool = True

    def to_json(self) -> dict:
        return {
            "kernel_id": self.kernel_id,
            "session_id": self.session_id,
            "container_id": self.container_id,
            "host": self.host,
            "service_ports": self.service_ports,
            "cuda_devices": self.cuda_devices,
            "alive": self.alive,
        }


ExitCallback = Callable[[str, int | None], Awaitable[None]]


class Backend:
    """One way of running kernels. Implementations: Docker, local processes."""

    name = "base"

    async def init(self, on_exit: ExitCallback) -> None:
        """Connect, then call ``on_exit(kernel_id, exit_code)`` whenever a kernel dies."""

    async def close(self) -> None:
        pass

    async def list_images(self) -> list[ImageInfo]:
        raise NotImplementedError

    async def inspect_image(self, name: str) -> ImageInfo:
        """Raise :class:`ImageNotFound` when the image is not on this node."""
        raise NotImplementedError

    async def create_kernel(
        self,
        spec: dict,
        image: ImageInfo,
        host_ports: list[int],
        cuda_devices: list[int],
        fake_devices: bool,
    ) -> KernelRecord:
        raise NotImplementedError

    async def destroy_kernel(self, kernel_id: str) -> None:
        raise NotImplementedError

    async def list_kernels(self) -> list[KernelRecord]:
        raise NotImplementedError
