"""The contract between the agent and a way of running kernels."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields

from ...common.errors import InvalidRequest

LABEL_PREFIX = "ai.backend."
SERVICE_PORTS_LABEL = "ai.backend.service-ports"

# What a kernel runs. The main kernel of an interactive session serves Jupyter;
# a batch session's main kernel runs its startup command to completion; the
# other kernels of a multi-kernel session idle so that the main one can use them.
INTERACTIVE = "interactive"
BATCH = "batch"
IDLE = "idle"
KERNEL_TYPES = (INTERACTIVE, BATCH, IDLE)


def _fields_json(obj, exclude: tuple[str, ...] = ()) -> dict:
    """A dataclass's fields (but ``exclude``), in their order, as they are (not copied)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj) if f.name not in exclude}


@dataclass
class ServicePort:
    name: str
    protocol: str
    container_port: int
    host_port: int | None = None

    def to_json(self) -> dict:
        return _fields_json(self)


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
    # The image's login shell (its SHELL env), used to run batch commands.
    shell: str = "/bin/sh"
    # True when the image's entrypoint is an init already (e.g. tini).
    has_init: bool = False

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
    kernel_type: str = INTERACTIVE
    # How a kernel that is no longer alive ended, when the backend knows.
    exit_code: int | None = None
    # gpu-topology: UUIDs of the GPUs and MIG instances the kernel was given (what the
    # agent rebuilds device ownership from after a restart).
    cuda_uuids: list[str] = field(default_factory=list)
    # The slots the kernel was started with (for the agent's live statistics; not
    # in to_json). Empty when the backend cannot tell.
    slots: dict = field(default_factory=dict)
    # Whether the kernel carries this agent's installation label (Docker). A container
    # with the agent's id and no installation label at all (made before installations
    # had identities) is listed and kept, but never removed as an orphan.
    own: bool = True
    # Issue 30: the warm pool of a pooled kernel not bound to a session yet ("": none).
    pooled: str = ""

    def to_json(self) -> dict:
        return _fields_json(self, exclude=("slots",))


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
        """Start one kernel; ``host_ports`` has one port, for the first service port (the
        Jupyter server, which proxies the image's other apps), when it serves.

        ``spec`` keys: kernel_id, session_id, owner, image, slots, environ,
        service_prefix, kernel_type (see KERNEL_TYPES), command (batch),
        cluster_hostname (the kernel's host name, e.g. ``main1``) and
        network_alias (a name unique to this kernel under which the other
        kernels of its session reach it), and mounts: virtual folders as
        ``[{"source": host path, "target": "/home/work/<name>", "mode": "ro"|"rw"}]``
        (the source exists on this node; the agent checks the target).
        gpu-topology: ``cuda_uuids`` (the devices and MIG instances to hand to the
        kernel, by UUID; ``cuda_devices`` has the whole devices' indices) and
        ``cpuset`` (CPUs next to them, "0-19,40-59", or None: no pinning).
        """
        raise NotImplementedError

    async def destroy_kernel(self, kernel_id: str) -> None:
        raise NotImplementedError

    async def kernel_logs(self, kernel_id: str, limit: int) -> str | None:
        """The last ``limit`` bytes of the kernel's output (None: no such kernel).

        Works after the kernel exited and until it is destroyed, so that a batch
        kernel's output can be kept in the record.
        """
        raise NotImplementedError

    async def list_kernels(self) -> list[KernelRecord]:
        raise NotImplementedError

    async def commit_kernel(self, kernel_id: str, ref: str, auth: dict | None = None) -> dict:
        """Issue 27: the running kernel written to image ``ref`` and pushed
        (``{"ref", "digest"}``); a backend without containers cannot."""
        raise InvalidRequest("this agent's backend runs no containers, so a session on it "
                             "cannot be committed to an image (the Docker backend can)")

    async def revoke_ssh_key(self, kernel_id: str, access_key: str) -> dict:
        """Issue 22: take away the SSH key derived from keypair ``access_key`` from a
        running kernel (its authorized_keys line, and the connections it opened);
        ``{"removed": lines, "ended": connections}``. A backend that publishes no
        sshd has nothing to take away."""
        return {"removed": 0, "ended": []}

    async def bridge_address(self, container_id: str) -> str | None:
        """The kernel's address on a bridge network of this host, which the host routes
        to straight (the app front's fast path); None where there is none."""
        return None

    async def kernel_stats(self) -> dict[str, dict]:
        """Raw usage of the running kernels: {kernel id: {"cpu_ns": CPU time used so
        far, "mem_bytes", "mem_limit_bytes"}} (a backend that cannot tell: {})."""
        return {}


def tail_text(data: bytes, limit: int) -> str:
    """The last ``limit`` bytes of output as text (a cut multi-byte character is replaced)."""
    return data[-limit:].decode("utf-8", errors="replace") if limit > 0 else ""
