"""The agent: resources of one node, kernels on it, heartbeats to the managers.

It runs inside the hub (embedded default) or as the ``backendai-agent`` daemon
(cluster mode); either way the manager talks to it through an agent client and
hears from it on the event bus. It never imports the hub.

This module holds :class:`Agent`'s configuration (the traits an operator sets, and
their defaults), its lifecycle (start, stop, the resource group it joins, its
capacity) and its kernel operations (create, bind, destroy, commit, logs, the end of a
kernel). The backend it makes is :mod:`.backendchoice`'s, and what it reports to the
managers :mod:`.reporting`'s.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import re
from decimal import Decimal

from traitlets import Bool, Dict, Enum, Float, Integer, List, Tuple, Unicode, default
from traitlets.config import LoggingConfigurable

from ..common import installation
from ..common.errors import AgentError, InvalidRequest, NotFound
from ..common.events import EventBus
from ..common.kernelspec import KernelSpec
from ..common.slots import CPU, CUDA, MEM, ResourceSlot, parse_size
from .backendchoice import BackendChoice
from .backends.base import INTERACTIVE, Backend, ImageInfo, KernelRecord
from .backends.pull import Puller
from .hostclaims import HostClaims
from .hubrelay import serve_hub_api_on
from .mountpoints import MOUNT_ROOT, check_mounts
from .portclaims import HostPorts
from .reporting import AgentReporting
from .resources import hostinfo
from .resources.cuda import (
    DeviceSource,
    GPUTopology,
    NVMLDeviceSource,
    StaticDeviceSource,
    host_cpus,
)
from .resources.gpu_alloc import GPUAllocator, mig_request
from .stats import stats_key


class Agent(AgentReporting, BackendChoice, LoggingConfigurable):
    agent_id = Unicode(
        help="""Unique id of this agent. Default: ``i-<hostname>-<first 8 of the
        installation id>``, unique to the installation (two installations on one host
        never share it); an installation older than identities keeps ``i-<hostname>``
        (common/installation.py). Env (packaged config): BACKENDAI_AGENT_ID.""",
    ).tag(config=True)

    @default("agent_id")
    def _agent_id_default(self):
        inst = self._installation()
        if self.installation_id != inst.id:  # an installation id configured by hand
            return installation.derived_agent_id(self.installation_id)
        return inst.default_agent_id()

    installation_dir = Unicode(
        help="""The state directory whose installation this agent belongs to (its
        ``installation-id`` file is read, or made once). The packaged config sets the
        hub's state directory; default: `state_dir`.""",
    ).tag(config=True)
    installation_id = Unicode(
        help="""This agent's installation: every container and network it makes carries
        it (label ``ai.backend.installation``), and it lists, reconciles and removes
        nothing that carries another. Default: the id kept in `installation_dir`.""",
    ).tag(config=True)

    @default("installation_id")
    def _installation_id_default(self):
        return self._installation().id

    def _installation(self) -> installation.Installation:
        if getattr(self, "_installation_cache", None) is None:
            self._installation_cache = installation.ensure(self.installation_dir or self.state_dir)
        return self._installation_cache

    resource_group = Unicode("default", help="Resource group (agent pool) this agent joins.").tag(
        config=True
    )
    backend = Unicode(
        "auto",
        help="""How kernels run: 'docker', 'local' (UNISOLATED processes) or 'auto':
        Docker when an engine answers; local processes only when no engine is
        configured (no `docker_url`, no DOCKER_HOST, no /var/run/docker.sock) and the
        agent does not run as root. An engine that is configured but does not answer
        is waited for (`docker_wait`), then the agent refuses to start: it never
        falls back to unisolated kernels silently.""",
    ).tag(config=True)
    docker_wait = Float(
        30.0,
        help="""Backend 'auto': seconds to wait for a configured Docker engine that does
        not answer yet (e.g. started at the same time as the hub) before giving up
        with an error.""",
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
    network = Unicode(
        help="""Docker bridge network the agent creates (inter-container traffic off).
        No kernel joins it: its gateway is the host address where kernels reach the
        hub's API (the hub inside which the agent runs listens there too). Shared by
        every agent and installation on the engine that names it, and never removed.
        Default: ``backendai``; env: BACKENDAI_AGENT_NETWORK.""",
    ).tag(config=True)

    @default("network")
    def _network_default(self):
        return os.environ.get("BACKENDAI_AGENT_NETWORK") or "backendai"

    session_subnets = Unicode(
        "172.30.0.0/16",
        help="""Docker backend: address pool of the sessions' networks. Every session
        gets a bridge network of its own (its kernels reach each other by name, never
        another session's kernels), with a subnet of `session_subnet_prefix` from this
        pool. Pick a range that no network of the site uses.""",
    ).tag(config=True)
    session_subnet_prefix = Integer(
        26,
        help="""Docker backend: size of a session network's subnet (/26: 61 kernels per
        session, 1024 sessions per /16 pool).""",
    ).tag(config=True)
    startup_cpus = Float(
        2.0,
        help="""Docker backend: CPU cores an interactive kernel may use while its server
        starts (the import of jupyterhub-singleuser takes ~3.5 s at 0.5 CPU, ~1.5 s at
        2), when more than it asked for. The kernel's own CPU limit (NanoCpus) is applied
        with a container update as soon as its server answers HTTP, before the agent
        reports the kernel started, so the user never gets a server with more than it
        asked for. Starts at once share the cores: a burst takes only what no other
        start is bursting into, and at most the kernel's share of the cores among the
        other starts its manager drives on this agent now (none where that share is not
        above its own limit). 0: no burst, the limit applies from the first instruction.""",
    ).tag(config=True)
    startup_cpu_timeout = Float(
        30.0,
        help="""Docker backend: the longest an interactive kernel keeps `startup_cpus`
        when its server does not answer (a broken or hanging image): after this many
        seconds its own CPU limit is applied anyway.""",
    ).tag(config=True)
    isolation_guard = Enum(
        ["auto", "required", "off"],
        "auto",
        help="""Docker backend: the netfilter rules that keep session networks apart
        with no window while networks are made and removed (agent/backends/netguard.py,
        docs/security.md). auto: installed where the agent can (root, iptables, the
        engine's bridges in its network namespace), a warning where not; required: the
        agent does not start without them; off: Docker's own rules only.""",
    ).tag(config=True)
    kernel_pids_limit = Integer(
        1024,
        help="""Processes and threads one kernel may run (Docker's pids limit): a fork
        bomb stops there instead of at the host's pid_max. A keypair resource policy's
        `max_pids_per_kernel` lowers or raises it for its users' kernels.""",
    ).tag(config=True)
    kernel_tmp_size = Unicode(
        "1g",
        help="""Docker backend: size of the tmpfs mounted at /tmp and /var/tmp of each
        kernel (each; it is memory, charged to the kernel's memory limit, so it never
        exceeds that either). A keypair resource policy's `max_tmp_size` sets it per
        user. Writes past it fail with ENOSPC in the kernel; nothing reaches the host's
        disk.""",
    ).tag(config=True)
    lxcfs = Unicode(
        "auto",
        help="""Docker backend: where LXCFS is mounted, whose /proc files (meminfo,
        cpuinfo, stat, uptime, ...) are laid over each kernel's, so that `free`, `top`
        and os.cpu_count() in a session see its own limits instead of the host's
        (agent/backends/lxcfs.py). auto: /var/lib/lxcfs where Debian's `lxcfs` service
        mounts it, nothing where it does not run; "": never; a path: that mount, which
        must be LXCFS (the agent does not start otherwise).""",
    ).tag(config=True)
    overlay_encrypted = Bool(
        False,
        help="""Docker backend in a Swarm: make the overlay networks of multi-node
        sessions with Docker's `encrypted` option (IPsec ESP between the nodes; the
        nodes' kernels need ESP and AES-GCM support). See docs/multinode.md.""",
    ).tag(config=True)
    hub_api_on_gateway = Bool(
        True,
        help="""When the agent runs inside the hub, with the Docker backend on bridge
        networks, and the hub's API listens on loopback only (JupyterHub.hub_ip):
        also listen on the agent network's gateway, the address where kernels reach
        the hub. The API then listens on loopback and that gateway, nowhere else.""",
    ).tag(config=True)
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
    nvml_stand_in = Unicode(
        help="""For tests and demos on machines without a GPU: the name of an NVML
        STAND-IN machine (agent.resources.nvml_standin.MACHINES, e.g. a100-mig) read
        instead of the driver. Its devices are described, not real (nothing is handed
        to containers) and its live figures are made up.""",
    ).tag(config=True)
    device_mask = List(
        Unicode(),
        help="""GPUs and MIG instances this agent leaves alone, by index or UUID (as the
        device mask of Backend.AI's accelerator plugins): not in its capacity, never
        handed out. Two installations on one GPU host each get their own GPUs this way;
        without it, the devices a kernel of one holds are claimed host-wide, and the
        other's requests for them wait until they are free rather than share a GPU.""",
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
    local_kernel_user = Unicode(
        "1000:1000",
        help="""Local backend, agent running as root: the unprivileged user kernels run
        as, "uid:gid" or a user name (default 1000:1000, the kernel image's user and
        the owner of vfolders). It must be able to enter the working folders
        (`local_work_root`) and the volumes; kernels are refused otherwise. Never
        root. An agent that is not root runs kernels as its own user.""",
    ).tag(config=True)
    unsafe_local_kernels_as_root = Bool(
        help="""UNSAFE. Local backend, agent running as root: run kernels as root too,
        able to read and change everything the hub has (its databases, every user's
        secret keys and files). For throw-away test machines only. Default: the
        environment variable BACKENDAI_UNSAFE_LOCAL_KERNELS_AS_ROOT=1, else off.""",
    ).tag(config=True)

    @default("unsafe_local_kernels_as_root")
    def _unsafe_root_default(self):
        return os.environ.get("BACKENDAI_UNSAFE_LOCAL_KERNELS_AS_ROOT", "") in ("1", "true", "yes")

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
        self.puller = Puller(self)  # issue 25: images pulled on demand, one pull per image
        self.device_source: DeviceSource = (
            StaticDeviceSource(self.fake_cuda_devices)
            if self.fake_cuda_devices
            else NVMLDeviceSource()
        )
        if self.nvml_stand_in:  # a described machine, not a GPU (tests, demos)
            from .resources.nvml_standin import stand_in

            self.device_source = NVMLDeviceSource(stand_in(self.nvml_stand_in))
        self.devices = []
        # GPUs: what NVML found and which kernel owns which (gpu-topology).
        self.topology = GPUTopology()
        self.gpus = GPUAllocator(self.topology)
        self.capacity = ResourceSlot()
        # The kernels' host ports, claimed host-wide while a kernel has them: another
        # installation's agent on this host skips them even before the kernel's server
        # binds them (portclaims.py).
        self.ports = HostPorts()
        self._lock = asyncio.Lock()
        #: kernel id -> the slots it asked for (free slots in the statistics).
        self._kernel_slots: dict[str, ResourceSlot] = {}
        #: kernel id -> (wall seconds, CPU ns) of the last sample (CPU percent).
        self._cpu_samples: dict[str, tuple[float, int]] = {}
        #: The statistics of the last heartbeat (:mod:`.stats`), also without Redis.
        self.last_stats: dict = {}
        self._hb_task: asyncio.Task | None = None
        self._hub_listen_task: asyncio.Task | None = None
        # Where managers reach this agent's API; empty when it runs inside the hub.
        self.addr = ""
        # Events the bus could not take yet (publish), oldest first.
        self._outbox: collections.deque = collections.deque(maxlen=10_000)
        self._outbox_task: asyncio.Task | None = None
        # Issues 25 and 30: pooled kernels not ready yet (being started) or being bound,
        # which the heartbeat does not count as ready; a heartbeat asked for soon.
        self._pool_busy: set[str] = set()
        self._report_task: asyncio.Task | None = None
        self._report_again = self._report_images = False  # reporting.py: report_soon
        self._report_hurry = asyncio.Event()
        self._images_said: list[str] | None = None  # the images the last listing found
        # Called after a move to another resource group (the etcd registration).
        self.on_regroup: list = []

    # -- the resource group an admin moved this agent to (issue 29) -------------------

    @property
    def _group_file(self) -> str:
        return os.path.join(self.state_dir, "resource-group")

    def _moved_group(self) -> str | None:
        try:
            with open(self._group_file) as f:
                return f.read().strip() or None
        except FileNotFoundError:
            return None

    async def set_resource_group(self, name: str) -> dict:
        """Join resource group ``name`` (an admin's move, as Backend.AI's
        ``update_scaling_group``): kept in the state directory, so that it outlives a
        restart and wins over the configured ``resource_group``; the next heartbeat
        and the etcd registration (``on_regroup``) say it. Returns :meth:`info`."""
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][\w.-]{0,63}", name):
            raise InvalidRequest("a resource group's name is required")
        os.makedirs(self.state_dir, exist_ok=True)
        tmp = self._group_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(name + "\n")
        os.replace(tmp, self._group_file)
        before, self.resource_group = self.resource_group, name
        self.log.info("agent %s moved from resource group %s to %s", self.agent_id, before, name)
        for hook in list(self.on_regroup):
            try:
                await hook()
            except Exception as e:  # (etcd away: the move stands; the record follows it)
                self.log.warning("the move to %s not yet in the registration: %s", name, e)
        try:
            await self._announce()
        except Exception as e:  # the periodic heartbeat says it later
            self.log.warning("heartbeat after the move not sent: %s", e)
        return self.info()

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        moved = self._moved_group()
        if moved and moved != self.resource_group:
            self.log.info("resource group %s (an admin moved this agent; the configuration "
                          "says %s)", moved, self.resource_group)
            self.resource_group = moved
        self.impl = await self._make_backend()
        found = self.device_source.topology()
        self.topology = found.without(self.device_mask)
        if stray := found.unknown(self.device_mask):
            self.log.warning("Agent.device_mask names no GPU or MIG instance of this host: %s "
                             "(its devices: %s)", ", ".join(stray),
                             ", ".join(f"{d.index} {d.uuid}" for d in found.devices) or "none")
        self.devices = self.topology.devices
        # Real devices are claimed host-wide while a kernel has them (hostclaims.py): an
        # agent of another installation on this host passes over them. Described ones
        # (a stand-in, Agent.fake_cuda_devices) are nobody's to share.
        self.gpus = GPUAllocator(
            self.topology, host_cpus=host_cpus(),
            claims=None if self.device_source.fake else HostClaims("gpu"))
        self.capacity = self._detect_capacity()
        await self.impl.init(self._on_kernel_exit)
        gateway = getattr(self.impl, "gateway", None)
        if gateway and self.hub_api_on_gateway:
            self._hub_listen_task = asyncio.create_task(serve_hub_api_on(gateway, self.log))
        for rec in await self.impl.list_kernels():
            self._adopt(rec)
        self.log.info(
            "agent %s up: backend=%s capacity=%s", self.agent_id, self.impl.name,
            self.capacity.describe(),
        )
        try:
            await self.heartbeat()
        except Exception as e:  # the bus away: the agent still serves; the loop retries
            self.log.warning("first heartbeat not sent (%s); retrying every %g s",
                             e, self.heartbeat_interval)
        self._hb_task = asyncio.create_task(self._heartbeat_loop())

    async def stop(self) -> None:
        if self._hb_task:
            self._hb_task.cancel()
        if self._outbox_task:
            self._outbox_task.cancel()
        if self._report_task:
            self._report_task.cancel()
        redis = getattr(self.event_bus, "redis", None)
        if redis is not None:
            try:  # a stopped agent has no live statistics
                await redis.delete(stats_key(self.agent_id))
            except Exception:
                self.log.warning("could not remove this agent's statistics from Redis")
        if self._hub_listen_task:
            self._hub_listen_task.cancel()
        if self.impl:
            await self.impl.close()
        self.ports.release_all()
        self.gpus.release_all()

    def _detect_capacity(self) -> ResourceSlot:
        mem = hostinfo.total_memory() - parse_size(self.reserved_mem)
        cap = ResourceSlot({CPU: hostinfo.cpu_count(), MEM: max(mem, Decimal(0))})
        cap.update(self.gpus.capacity())  # cuda.device (whole GPUs), cuda.mig-<profile>
        for k, v in self.slots.items():
            cap[k] = parse_size(v) if k == MEM else Decimal(str(v))
        return cap

    # -- kernels -------------------------------------------------------------

    def _adopt(self, rec: KernelRecord) -> None:
        self.ports.adopt(rec.kernel_id,
                         [p["host_port"] for p in rec.service_ports if p.get("host_port")])
        # Devices by UUID (older records: indices), so none is handed out twice.
        self.gpus.adopt(rec.kernel_id, rec.cuda_uuids or rec.cuda_devices)
        if rec.alive:
            self._kernel_slots[rec.kernel_id] = ResourceSlot.from_json(rec.slots or {})

    def _release(self, kernel_id: str) -> None:
        self.ports.release(kernel_id)
        self.gpus.release(kernel_id)
        self._kernel_slots.pop(kernel_id, None)

    async def image_info(self, name: str) -> ImageInfo:
        return await self.impl.inspect_image(name)

    async def list_images(self) -> list[ImageInfo]:
        return await self.impl.list_images()

    async def pull_image(self, ref: str, auth: dict | None = None, policy: str = "tag",
                         on_progress=None, session_id: str | None = None) -> bool:
        """Issue 25: make ``ref`` present, pulling it (shared) when missing (backends/pull.py).

        ``session_id``: the session whose kernels this agent creates next; its network
        is made while the image is pulled (a backend with ``prepare_session``), and
        removed again when the pull fails."""
        prepare = getattr(self.impl, "prepare_session", None)
        ready = asyncio.ensure_future(prepare(session_id)) if prepare and session_id else None
        try:
            pulled = await self.puller.ensure(ref, auth, policy, on_progress)
        except BaseException:
            if ready is not None:
                await asyncio.gather(ready, return_exceptions=True)
                await self.impl.unprepare_session(session_id)
            raise
        if ready is not None:
            await ready
        if pulled:
            self.report_soon(images=True)  # the image is here now
        return pulled

    async def create_kernel(self, spec: dict | KernelSpec) -> dict:
        """Start one kernel. ``spec``: a :class:`KernelSpec` or its wire form: kernel_id, session_id, owner, image, slots, environ,
        service_prefix, and optionally kernel_type (interactive, batch, idle), command
        (batch), cluster_hostname and network_alias (multi-kernel sessions), mounts
        (vfolders, see :func:`check_mounts`), ssh_public_key (issue 12: publish the
        kernel's sshd for this key, where the backend can). Returns the kernel record (host,
        service ports, container id)."""
        # The typed spec's wire form (common/kernelspec.py): its version and shape are
        # checked here, before anything is taken; the agent works on the JSON form.
        spec = KernelSpec.from_wire(spec).to_wire()
        spec["environ"] = thread_environ(spec["slots"], spec["environ"])
        kernel_type = spec["kernel_type"]
        spec["mounts"] = check_mounts(list(spec["mounts"]))
        if spec.get("pool"):
            self._check_poolable(spec)
        image = await self.impl.inspect_image(spec["image"])
        slots = ResourceSlot.from_json(spec["slots"])
        n_gpu = int(slots.get(CUDA, 0))
        if n_gpu != slots.get(CUDA, 0):
            raise InvalidRequest("cuda.device must be a whole number of devices")
        n_mig = mig_request(slots)
        # Only a kernel that serves Jupyter needs a host port, and only one: its Jupyter
        # server (the first service port) proxies every other app of the image.
        n_ports = 1 if kernel_type == INTERACTIVE and image.service_ports else 0
        # Issue 12: SSH/SFTP from outside, where the manager asks for it (the session's
        # resource group opted in) and the backend can publish the kernel's sshd: one
        # more host port from the range, the last one (released with the others).
        if spec.get("ssh_public_key") and getattr(self.impl, "publishes_ssh", False):
            n_ports += 1
        else:
            spec.pop("ssh_public_key", None)
        async with self._lock:
            ports = self.ports.take(spec["kernel_id"], n_ports, self.port_range,
                                    self.bind_host)
            # All or nothing: raises with nothing taken when the devices are not free.
            try:
                gpu = self.gpus.take(spec["kernel_id"], n_gpu, n_mig, cpu=slots.get(CPU))
            except BaseException as e:
                self.ports.release(spec["kernel_id"])
                if isinstance(e, AgentError) and self.gpus.away():
                    # Devices another agent of this host holds: the scheduler hears of
                    # them now, not at the next heartbeat, so that the session's retry
                    # waits for them in the queue instead of meeting the claim again.
                    self.report_soon(at_once=True)
                raise
            devices = gpu.indices
            self._kernel_slots[spec["kernel_id"]] = slots
        # Backends hand devices to the kernel by UUID; cpuset: the CPUs next to them.
        spec = dict(spec, cuda_uuids=gpu.uuids, cpuset=gpu.cpuset)
        if spec.get("pool"):
            self._pool_busy.add(spec["kernel_id"])  # ready once create_kernel returns
        try:
            rec = await self.impl.create_kernel(
                spec, image, ports, devices, fake_devices=self.device_source.fake
            )
        except BaseException:
            self._release(spec["kernel_id"])
            raise
        finally:
            if spec.get("pool"):
                self._pool_busy.discard(spec["kernel_id"])
                self.report_soon()
        if not spec.get("pool"):  # a pooled kernel is nobody's until it is bound
            await self.publish(
                "kernel_started",
                {"agent_id": self.agent_id, "kernel_id": rec.kernel_id, "session_id": rec.session_id},
            )
        return rec.to_json()

    def _check_poolable(self, spec: dict) -> None:
        if not getattr(self.impl, "pools", False):
            raise InvalidRequest(
                f"agent {self.agent_id} keeps no warm pool (the {self.impl.name} backend"
                + (" on the host network" if self.use_host_network else "") + " cannot bind one)")
        if spec["kernel_type"] != INTERACTIVE or spec["mounts"] or spec.get("ssh_public_key") \
                or int(ResourceSlot.from_json(spec["slots"]).get(CUDA, 0)) \
                or mig_request(ResourceSlot.from_json(spec["slots"])):
            raise InvalidRequest("a pooled kernel is interactive, without folders, GPUs or SSH")

    async def bind_kernel(self, spec: dict | KernelSpec) -> dict:
        """Issue 30: bind the pooled kernel ``spec.kernel_id`` to the session of ``spec``
        (its folders, environment and token: agent/warmpool.py). The spec must ask for
        exactly what the pooled kernel has (image, slots, the agent's kernel bounds) and
        have a home folder; NotFound when the kernel is not an unbound pooled one here
        (the manager starts a fresh kernel then)."""
        spec = KernelSpec.from_wire(spec).to_wire()
        spec["environ"] = thread_environ(spec["slots"], spec["environ"])
        spec["mounts"] = check_mounts(list(spec["mounts"]))
        kid = spec["kernel_id"]
        if not getattr(self.impl, "pools", False):
            raise NotFound(f"agent {self.agent_id} keeps no warm pool")
        if spec["kernel_type"] != INTERACTIVE or spec.get("ssh_public_key") \
                or spec.get("cluster_ssh") or int(spec.get("cluster_agents") or 1) != 1 \
                or spec.get("pids_limit") or spec.get("tmp_size") \
                or spec.get("container_uid") or spec.get("container_main_gid") \
                or spec.get("container_gids") or spec.get("dotfiles") \
                or not any(m["target"] == MOUNT_ROOT for m in spec["mounts"]):
            raise InvalidRequest("this kernel cannot be bound to a pooled one (several kernels, "
                                 "SSH, a batch command, kernel bounds of a policy, or no home "
                                 "folder)")
        found = await self.impl.unbound_pooled(kid)
        if found is None:
            raise NotFound(f"no unbound pooled kernel {kid} on agent {self.agent_id}")
        mine, listing = found
        if mine.pooled.split("|")[1:2] != [spec["image"]] or \
                ResourceSlot.from_json(mine.slots or {}) != ResourceSlot.from_json(spec["slots"]):
            raise InvalidRequest(f"pooled kernel {kid} is of another image or other resources than asked for")
        image = await self.impl.inspect_image(spec["image"])
        self._pool_busy.add(kid)  # no longer ready for anyone else
        self.report_soon()
        try:
            rec = await self.impl.bind_pooled(spec, image, listing)
        except BaseException:
            self._release(kid)
            raise
        finally:
            self._pool_busy.discard(kid)
        await self.publish(
            "kernel_started",
            {"agent_id": self.agent_id, "kernel_id": rec.kernel_id, "session_id": rec.session_id},
        )
        return rec.to_json()

    async def destroy_kernel(self, kernel_id: str) -> None:
        await self.impl.destroy_kernel(kernel_id)
        self._release(kernel_id)
        if getattr(self.impl, "pools", False):
            self.report_soon()  # it may have been a ready pooled kernel

    async def list_kernels(self) -> list[dict]:
        return [r.to_json() for r in await self.impl.list_kernels()]

    async def commit_kernel(self, kernel_id: str, ref: str, auth: dict | None = None) -> dict:
        """Issue 27: write the running kernel to image ``ref`` and push it with ``auth``
        (the registry's credentials); ``{"ref", "digest"}``."""
        return await self.impl.commit_kernel(kernel_id, ref, auth)

    async def revoke_ssh_key(self, kernel_id: str, access_key: str) -> dict:
        """Issue 22: withdraw the SSH key derived from keypair ``access_key`` from a
        running kernel: its line leaves the kernel's authorized_keys and the sshd
        connections it opened end; the kernel, its listening sshd and its other keys
        stay. Returns ``{"removed": lines removed, "ended": connections ended}``."""
        return await self.impl.revoke_ssh_key(kernel_id, access_key)

    async def bridge_address(self, container_id: str) -> str | None:
        """The kernel's address on a bridge network of this host (None: none)."""
        return await self.impl.bridge_address(container_id)

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
        await self.publish(
            "kernel_terminated",
            {"agent_id": self.agent_id, "kernel_id": kernel_id, "exit_code": exit_code, "logs": logs},
        )


# What numeric libraries read to size their thread pools (Backend.AI's agent sets the
# same): without them a 1-core kernel starts one thread per host core and spends its
# quota switching between them. GNU nproc reads OMP_NUM_THREADS too.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "NUMEXPR_MAX_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMBA_NUM_THREADS", "GOTO_NUM_THREADS", "BLIS_NUM_THREADS")


def thread_environ(slots: dict, environ: dict) -> dict:
    """``environ`` with the kernel's CPU allotment announced to libraries: the cores
    it asked for, rounded up (at least 1). A value the user set wins."""
    cores = max(1, math.ceil(Decimal(str(slots.get(CPU, 1) or 1))))
    out = {k: str(cores) for k in THREAD_VARS}
    out.update(environ)
    return out

