"""The agent: resources of one node, kernels on it, heartbeats to the managers.

It runs inside the hub (embedded default) or as the ``backendai-agent`` daemon
(cluster mode); either way the manager talks to it through an agent client and
hears from it on the event bus. It never imports the hub.
"""

from __future__ import annotations

import asyncio
import os
import platform
import socket
from decimal import Decimal

from traitlets import Bool, Dict, Float, Integer, List, Tuple, Unicode, default
from traitlets.config import LoggingConfigurable

from .. import __version__
from ..common.errors import AgentError, InvalidRequest
from ..common.events import EventBus
from ..common.slots import CPU, CUDA, MEM, ResourceSlot, parse_size
from .backends.base import BATCH, INTERACTIVE, KERNEL_TYPES, Backend, ImageInfo, KernelRecord
from .resources import hostinfo
from .resources.cuda import DeviceSource, NVMLDeviceSource, StaticDeviceSource


class Agent(LoggingConfigurable):
    agent_id = Unicode(
        help="Unique id of this agent. Default: the host name.",
    ).tag(config=True)

    @default("agent_id")
    def _agent_id_default(self):
        return "i-" + socket.gethostname()

    resource_group = Unicode("default", help="Resource group (agent pool) this agent joins.").tag(
        config=True
    )
    backend = Unicode(
        "auto",
        help="""How kernels run: 'docker', 'local' (unisolated processes) or 'auto'
        (Docker when an engine answers, local processes otherwise).""",
    ).tag(config=True)
    docker_url = Unicode(
        None, allow_none=True, help="Docker engine URL (default: DOCKER_HOST or the local socket)."
    ).tag(config=True)
    use_host_network = Bool(
        False,
        help="""Run containers on the host network (Backend.AI's use_host_network).
        Default: a bridge network of the agent's own, with service ports published
        on `bind_host`.""",
    ).tag(config=True)
    network = Unicode("backendai", help="Docker bridge network the agent creates and uses.").tag(
        config=True
    )
    bind_host = Unicode(
        "127.0.0.1",
        help="""Host address that service ports are published on. The hub's proxy must
        reach it; keep loopback unless the proxy runs on another node.""",
    ).tag(config=True)
    port_range = Tuple(
        Integer(),
        Integer(),
        default_value=(30000, 31000),
        help="Host ports [first, last] that service ports are published from.",
    ).tag(config=True)
    slots = Dict(
        help="""Override detected capacity, e.g. {"cpu": 4, "mem": "8g", "cuda.device": 1}.
        Useful to reserve part of a node for the system.""",
    ).tag(config=True)
    reserved_mem = Unicode("512m", help="Memory kept back for the node itself.").tag(config=True)
    fake_cuda_devices = List(
        Dict(),
        help="""CUDA devices to pretend exist (NVML stand-in for machines without a GPU,
        e.g. CI). Non-empty disables NVML discovery and real device mapping.""",
    ).tag(config=True)
    state_dir = Unicode(help="Where the agent keeps its state.").tag(config=True)

    @default("state_dir")
    def _state_dir_default(self):
        return os.path.abspath("backendai-agent-state")

    local_work_root = Unicode(help="Local backend: parent of each user's working directory.").tag(
        config=True
    )

    @default("local_work_root")
    def _local_work_root_default(self):
        return os.path.join(self.state_dir, "home")

    local_cmd = List(
        Unicode(),
        help="Local backend: command that starts a kernel's Jupyter server.",
    ).tag(config=True)
    local_image = Unicode("local/python", help="Local backend: the one image name it offers.").tag(
        config=True
    )
    heartbeat_interval = Float(10.0, help="Seconds between heartbeats.").tag(config=True)
    log_tail_bytes = Integer(
        64 * 1024,
        help="""How much of a kernel's output (the last bytes) is reported when it exits
        and when its logs are asked for; a batch session's output is kept that long.""",
    ).tag(config=True)
    extra_host_config = Dict(
        help="Docker backend: extra HostConfig merged into every container (operator policy)."
    ).tag(config=True)

    def __init__(self, event_bus: EventBus, **kw):
        super().__init__(**kw)
        self.event_bus = event_bus
        self.impl: Backend | None = None
        self.device_source: DeviceSource = (
            StaticDeviceSource(self.fake_cuda_devices)
            if self.fake_cuda_devices
            else NVMLDeviceSource()
        )
        self.devices = []
        self.capacity = ResourceSlot()
        self._used_ports: set[int] = set()
        self._device_owner: dict[int, str] = {}
        self._kernel_ports: dict[str, list[int]] = {}
        self._lock = asyncio.Lock()
        self._hb_task: asyncio.Task | None = None
        # Where managers reach this agent's API; empty when it runs inside the hub.
        self.addr = ""

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        self.impl = await self._make_backend()
        self.devices = self.device_source.devices()
        self.capacity = self._detect_capacity()
        await self.impl.init(self._on_kernel_exit)
        for rec in await self.impl.list_kernels():
            self._adopt(rec)
        self.log.info(
            "agent %s up: backend=%s capacity=%s", self.agent_id, self.impl.name,
            self.capacity.describe(),
        )
        await self.heartbeat()
        self._hb_task = asyncio.create_task(self._heartbeat_loop())

    async def stop(self) -> None:
        if self._hb_task:
            self._hb_task.cancel()
        if self.impl:
            await self.impl.close()

    async def _make_backend(self) -> Backend:
        from .backends.docker import DockerBackend
        from .backends.local import LocalBackend

        kind = self.backend
        if kind == "auto":
            kind = "docker" if await DockerBackend.available(self.docker_url) else "local"
            self.log.info("agent backend: %s (auto)", kind)
        if kind == "docker":
            return DockerBackend(
                self.agent_id,
                network=self.network,
                use_host_network=self.use_host_network,
                bind_host=self.bind_host,
                docker_url=self.docker_url,
                extra_host_config=self.extra_host_config,
            )
        if kind == "local":
            return LocalBackend(
                self.agent_id,
                state_dir=self.state_dir,
                work_root=self.local_work_root,
                cmd=list(self.local_cmd) or None,
                bind_host=self.bind_host,
                image_name=self.local_image,
            )
        raise ValueError(f"unknown agent backend {kind!r}")

    def _detect_capacity(self) -> ResourceSlot:
        mem = hostinfo.total_memory() - parse_size(self.reserved_mem)
        cap = ResourceSlot({CPU: hostinfo.cpu_count(), MEM: max(mem, Decimal(0))})
        if self.devices:
            cap[CUDA] = Decimal(len(self.devices))
        for k, v in self.slots.items():
            cap[k] = parse_size(v) if k == MEM else Decimal(str(v))
        return cap

    def info(self) -> dict:
        return {
            "id": self.agent_id,
            "addr": self.addr,
            "resource_group": self.resource_group,
            "backend": self.impl.name if self.impl else "",
            "architecture": platform.machine(),
            "available_slots": self.capacity.to_json(),
            "version": __version__,
            "devices": [d.to_json() for d in self.devices],
        }

    async def heartbeat(self) -> None:
        await self.event_bus.publish("agent_heartbeat", self.info())

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self.heartbeat()
            except Exception:
                self.log.exception("heartbeat failed")

    # -- kernels -------------------------------------------------------------

    def _adopt(self, rec: KernelRecord) -> None:
        ports = [p["host_port"] for p in rec.service_ports if p.get("host_port")]
        self._kernel_ports[rec.kernel_id] = ports
        self._used_ports.update(ports)
        for d in rec.cuda_devices:
            self._device_owner[d] = rec.kernel_id

    def _release(self, kernel_id: str) -> None:
        for p in self._kernel_ports.pop(kernel_id, []):
            self._used_ports.discard(p)
        for d in [d for d, k in self._device_owner.items() if k == kernel_id]:
            del self._device_owner[d]

    def _take_ports(self, n: int) -> list[int]:
        lo, hi = self.port_range
        got = []
        for port in range(lo, hi + 1):
            if len(got) == n:
                break
            if port in self._used_ports or not _port_free(self.bind_host, port):
                continue
            got.append(port)
        if len(got) < n:
            raise AgentError(f"no free host port left in {lo}-{hi}")
        return got

    def _take_devices(self, n: int) -> list[int]:
        free = [d.index for d in self.devices if d.index not in self._device_owner]
        if len(free) < n:
            raise AgentError(f"only {len(free)} free CUDA devices, {n} requested")
        # Prefer devices on one NUMA node when possible.
        by_node: dict = {}
        for d in self.devices:
            if d.index in free:
                by_node.setdefault(d.numa_node, []).append(d.index)
        for idxs in sorted(by_node.values(), key=len):
            if len(idxs) >= n:
                return sorted(idxs)[:n]
        return sorted(free)[:n]

    async def image_info(self, name: str) -> ImageInfo:
        return await self.impl.inspect_image(name)

    async def list_images(self) -> list[ImageInfo]:
        return await self.impl.list_images()

    async def create_kernel(self, spec: dict) -> dict:
        """Start one kernel. ``spec``: kernel_id, session_id, owner, image, slots, environ,
        service_prefix, and optionally kernel_type (interactive, batch, idle), command
        (batch), cluster_hostname and network_alias (multi-kernel sessions), mounts
        (vfolders, see :func:`check_mounts`). Returns the kernel record (host,
        service ports, container id)."""
        kernel_type = spec.get("kernel_type", INTERACTIVE)
        if kernel_type not in KERNEL_TYPES:
            raise InvalidRequest(f"unknown kernel type {kernel_type!r}")
        if kernel_type == BATCH and not (spec.get("command") or "").strip():
            raise InvalidRequest("a batch kernel needs a command")
        spec = dict(spec, mounts=check_mounts(spec.get("mounts")))
        image = await self.impl.inspect_image(spec["image"])
        slots = ResourceSlot.from_json(spec["slots"])
        n_gpu = int(slots.get(CUDA, 0))
        if n_gpu != slots.get(CUDA, 0):
            raise InvalidRequest("cuda.device must be a whole number of devices")
        # Only a kernel that serves Jupyter needs host ports.
        n_ports = len(image.service_ports) if kernel_type == INTERACTIVE else 0
        async with self._lock:
            ports = self._take_ports(n_ports)
            devices = self._take_devices(n_gpu) if n_gpu else []
            self._kernel_ports[spec["kernel_id"]] = ports
            self._used_ports.update(ports)
            for d in devices:
                self._device_owner[d] = spec["kernel_id"]
        try:
            rec = await self.impl.create_kernel(
                spec, image, ports, devices, fake_devices=self.device_source.fake
            )
        except BaseException:
            self._release(spec["kernel_id"])
            raise
        await self.event_bus.publish(
            "kernel_started",
            {"agent_id": self.agent_id, "kernel_id": rec.kernel_id, "session_id": rec.session_id},
        )
        return rec.to_json()

    async def destroy_kernel(self, kernel_id: str) -> None:
        await self.impl.destroy_kernel(kernel_id)
        self._release(kernel_id)

    async def list_kernels(self) -> list[dict]:
        return [r.to_json() for r in await self.impl.list_kernels()]

    async def kernel_logs(self, kernel_id: str) -> str | None:
        """The tail (``log_tail_bytes``) of a kernel's output, None when it is unknown."""
        return await self.impl.kernel_logs(kernel_id, self.log_tail_bytes)

    async def _on_kernel_exit(self, kernel_id: str, exit_code: int | None) -> None:
        self._release(kernel_id)
        # Read the output before anyone removes the kernel: it is what a batch
        # session leaves behind, and it says why a server died.
        try:
            logs = await self.kernel_logs(kernel_id)
        except Exception as e:  # a kernel being removed right now has no logs to give
            self.log.debug("no logs for exited kernel %s: %s", kernel_id, e)
            logs = None
        await self.event_bus.publish(
            "kernel_terminated",
            {"agent_id": self.agent_id, "kernel_id": kernel_id, "exit_code": exit_code, "logs": logs},
        )


MOUNT_ROOT = "/home/work"
MOUNT_MODES = ("ro", "rw")


def check_mounts(mounts) -> list[dict]:
    """Check a kernel's ``mounts``: ``[{"source": a directory on this node, "target":
    "/home/work/<name>", "mode": "ro" | "rw"}]``; raise InvalidRequest otherwise.

    A target is one path component under /home/work (what the backends can
    place: a bind mount, or a link in the local backend's working folder), and
    two mounts never share one.
    """
    if mounts is None:
        return []
    if not isinstance(mounts, list):
        raise InvalidRequest("mounts must be a list")
    out, targets = [], set()
    for m in mounts:
        if not isinstance(m, dict) or set(m) - {"source", "target", "mode"}:
            raise InvalidRequest(f"a mount is {{source, target, mode}}, not {m!r}")
        source, target, mode = m.get("source"), m.get("target"), m.get("mode", "rw")
        if mode not in MOUNT_MODES:
            raise InvalidRequest(f"mount mode must be ro or rw, not {mode!r}")
        if not isinstance(target, str) or not target.startswith(MOUNT_ROOT + "/"):
            raise InvalidRequest(f"mount target must be {MOUNT_ROOT}/<name>, not {target!r}")
        name = target[len(MOUNT_ROOT) + 1:]
        if not name or "/" in name or name in (".", "..") or "\0" in name:
            raise InvalidRequest(
                f"mount target must be one folder directly under {MOUNT_ROOT}, not {target!r}")
        if target in targets:
            raise InvalidRequest(f"two mounts at {target}")
        if not isinstance(source, str) or not os.path.isabs(source):
            raise InvalidRequest(f"mount source must be an absolute path, not {source!r}")
        if not os.path.isdir(source):
            raise InvalidRequest(f"mount source {source} of {target} is not a directory on this agent")
        targets.add(target)
        out.append({"source": os.path.normpath(source), "target": target, "mode": mode})
    return out


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
