"""Kernels as Docker containers, through the engine's API with aiodocker (async end to end)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import ipaddress
import json
import logging
import os
import re
import tarfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiodocker
from aiodocker.exceptions import DockerError

from ...common.errors import AgentError, ImageNotFound, InvalidRequest, NotFound, PullRefused
from .. import mountpoints
from .. import warmpool as pool
from . import lxcfs as lxcfs_mounts
from . import sshrevoke
from .base import (
    BATCH,
    IDLE,
    INTERACTIVE,
    SERVICE_PORTS_LABEL,
    Backend,
    ExitCallback,
    ImageInfo,
    KernelRecord,
    ServicePort,
    tail_text,
)
from .cpuburst import CPUBurst
from .dockerpool import DockerPool
from .labels import (
    L_AGENT,
    L_DEVICES,
    L_INSTALLATION,
    L_KERNEL,
    L_NANO_CPUS,
    L_OWNER,
    L_PORTS,
    L_SESSION,
    L_SLOTS,
    L_TYPE,
    L_UUIDS,
)
from .networks import DockerNetworks, name_lock

log = logging.getLogger(__name__)

# multinode: where a cluster session's SSH key goes in each kernel (Backend.AI's place),
# and the uid/gid of the image's user who owns it (its sshd runs as that user).
CLUSTER_SSH_DIR = "home/config/ssh"
# Issue 12: the port of the kernel's sshd (images/kernel/backendai-sshd.conf).
SSH_CONTAINER_PORT = 2200
KERNEL_UID = 1000
# CPU weights (cgroup cpu.shares): every kernel's, and a warming pooled kernel's (the
# least there is: it runs on what nobody else wants).
DEFAULT_CPU_SHARES = 1024
POOL_CPU_SHARES = 2
# Issue 22: what withdraws a keypair's SSH key inside a kernel (run there by python3).
_SSHREVOKE = Path(sshrevoke.__file__).read_text()
LOOPBACKS = {"127.0.0.1", "localhost", "::1"}
# Entrypoints that already are an init (reap zombies, forward signals).
INIT_PROGRAMS = {"tini", "tini-static", "dumb-init", "catatonit"}


def _exit_code(container: dict) -> int | None:
    """The exit code of an exited container from the list API's status ("Exited (3) 2 minutes ago")."""
    if container.get("State") != "exited":
        return None
    m = re.match(r"Exited \((-?\d+)\)", container.get("Status") or "")
    return int(m.group(1)) if m else None


def _json_dict(text: str | None) -> dict:
    try:
        d = json.loads(text or "{}")
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def _rewrite_host(url: str, host: str) -> str:
    parts = urlsplit(url)
    if parts.hostname in LOOPBACKS:
        netloc = host + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _dotfiles_archive(dotfiles, uid: int, gid: int) -> bytes:
    """Issue 27: a tar of Backend.AI's dotfiles (paths under /home/work, checked by the
    manager), owned by the kernel's user, with their permissions."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs: set[str] = set()
        for d in dotfiles:
            parts = d["path"].split("/")
            for i in range(1, len(parts)):
                sub = "/".join(parts[:i])
                if sub not in dirs:
                    dirs.add(sub)
                    info = tarfile.TarInfo(sub)
                    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, gid
                    tar.addfile(info)
            data = d["data"].encode()
            info = tarfile.TarInfo(d["path"])
            info.size, info.mode, info.uid, info.gid = len(data), int(d["permission"], 8), uid, gid
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _cluster_ssh_archive(keys: dict | None, user_key: str | None = None) -> bytes:
    """multinode: a tar of /home/config/ssh for a cluster session's kernel: the session's
    private key (id_cluster), its public key (id_cluster.pub) and authorized_keys, owned
    by the image's user (its sshd and ssh run as that user; sshd checks the modes).
    Issue 12: ``user_key``, the public key derived from the owner's keypair (SSH/SFTP
    from outside, manager/sshkeys.py), is authorized too (beside the cluster key)."""
    entries = [("home/config", 0o755, None), (CLUSTER_SSH_DIR, 0o700, None)]
    authorized = b""
    if keys:
        public = keys["public_key"].encode()
        entries += [(f"{CLUSTER_SSH_DIR}/id_cluster", 0o600, keys["private_key"].encode()),
                    (f"{CLUSTER_SSH_DIR}/id_cluster.pub", 0o644, public)]
        authorized += public
    if user_key:
        authorized += user_key.rstrip("\n").encode() + b"\n"
    entries.append((f"{CLUSTER_SSH_DIR}/authorized_keys", 0o600, authorized))
    return pool.tar_archive([(path, mode, data, KERNEL_UID) for path, mode, data in entries])


class DockerBackend(DockerNetworks, DockerPool, CPUBurst, Backend):
    name = "docker"

    def __init__(
        self,
        agent_id: str,
        *,
        installation_id: str = "",
        network: str = "backendai",
        use_host_network: bool = False,
        bind_host: str = "127.0.0.1",
        docker_url: str | None = None,
        extra_host_config: dict | None = None,
        session_subnets: str = "172.30.0.0/16",
        session_prefix: int = 26,
        startup_cpus: float = 0.0,
        startup_cpu_timeout: float = 30.0,
        overlay_encrypted: bool = False,
        isolation_guard: str = "auto",
        pids_limit: int = 1024,
        tmp_size: int = 1 << 30,
        pool_root: str = "",
        lxcfs: str = "auto",
    ):
        self.agent_id = agent_id
        # Issue 29: the kernels' /proc as their cgroup sees it (agent/backends/lxcfs.py).
        self.lxcfs_root = lxcfs_mounts.resolve(lxcfs)
        # Issue 30: where pooled kernels' /home/work lie on the host (agent/warmpool.py).
        self.pool_root = pool.PoolRoot(pool_root) if pool_root else None
        self._binding: set[str] = set()
        self.isolation_guard = isolation_guard
        self.pids_limit = pids_limit
        # Kernels in their startup burst now -> the NanoCpus they were given.
        self._bursting: dict[str, int] = {}
        self.tmp_size = tmp_size
        self._agent_bridge = ""
        # The installation this agent belongs to (common/installation.py): every
        # container and network it makes carries it; it touches nothing labelled with
        # another installation's.
        self.installation_id = installation_id
        # multinode: Docker's `encrypted` option on the sessions' overlay networks.
        self.overlay_encrypted = overlay_encrypted
        # Whether this engine is a Swarm manager (it can make overlay networks), a
        # Swarm worker, or in no Swarm (None): read at init.
        self.swarm_role: str | None = None
        self._bg: set[asyncio.Task] = set()
        # Sessions whose network was made while their image was pulled, and no kernel of
        # theirs came yet (prepare_session): their network goes if none comes.
        self._prepared: set[str] = set()
        self.startup_cpus = startup_cpus
        self.startup_cpu_timeout = startup_cpu_timeout
        self.network = network
        self.session_subnets = ipaddress.ip_network(session_subnets)
        self.session_prefix = session_prefix
        if not self.session_subnets.prefixlen <= session_prefix <= 29:
            raise AgentError(
                f"session network prefix /{session_prefix} must lie between the pool's "
                f"/{self.session_subnets.prefixlen} and /29")
        self.use_host_network = use_host_network
        self.bind_host = bind_host
        self.docker_url = docker_url
        self.extra_host_config = extra_host_config or {}
        # Every kernel's CPU weight (Docker's default, unless the operator set one).
        self.cpu_shares = int(self.extra_host_config.get("CpuShares") or DEFAULT_CPU_SHARES)
        self.docker: aiodocker.Docker | None = None
        self._engine: str | None = None
        self.gateway: str | None = None
        self._watch_task: asyncio.Task | None = None

    @staticmethod
    async def available(docker_url: str | None = None) -> bool:
        try:
            d = aiodocker.Docker(url=docker_url)
        except Exception:
            return False
        try:
            async with asyncio.timeout(5):
                await d.version()
            return True
        except Exception:
            return False
        finally:
            await d.close()

    async def init(self, on_exit: ExitCallback) -> None:
        self.docker = aiodocker.Docker(url=self.docker_url)
        await self.docker.version()
        info = await self.docker.system.info()
        self._engine = info.get("ID") or self.docker_url or ""
        swarm = info.get("Swarm") or {}
        if swarm.get("LocalNodeState") == "active":
            self.swarm_role = "manager" if swarm.get("ControlAvailable") else "worker"
        if not self.use_host_network:
            try:
                self.gateway = await self._ensure_network()
            except DockerError as e:  # said at login and in the log, not as a traceback
                raise AgentError(f"the Docker engine refused the agent network "
                                 f"{self.network}: {e.message}") from e
            await self._guard_isolation()
            await self._remove_idle_session_networks()
        self._watch_task = asyncio.create_task(self._watch(on_exit))
        await self._end_bursts()

    async def close(self) -> None:
        for task in list(self._bg):
            task.cancel()
        if self._watch_task:
            self._watch_task.cancel()
            try:
                await self._watch_task
            except (asyncio.CancelledError, Exception):
                pass
        if self.docker:
            await self.docker.close()
        if self.pool_root is not None:  # issue 30: no mount of ours outlives the pool
            try:
                await asyncio.to_thread(self.pool_root.close)
            except OSError as e:
                log.warning("the warm pool's root stays mounted: %s", e)

    async def _watch(self, on_exit: ExitCallback) -> None:
        """Report containers of this agent that die, whatever killed them."""
        while True:
            try:
                subscriber = self.docker.events.subscribe(
                    create_task=True,
                    filters={
                        "type": ["container"],
                        "event": ["die"],
                        "label": [f"{L_AGENT}={self.agent_id}"],
                    },
                )
                while True:
                    ev = await subscriber.get()
                    if ev is None:
                        break
                    attrs = ev.get("Actor", {}).get("Attributes", {})
                    kid = attrs.get(L_KERNEL)
                    if kid and self._ours(attrs):
                        code = attrs.get("exitCode")
                        await on_exit(kid, int(code) if code is not None else None)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("docker event stream failed; reconnecting")
                await asyncio.sleep(1)

    def _image_info(self, name: str, data: dict) -> ImageInfo:
        config = data.get("Config") or {}
        labels = config.get("Labels") or {}
        env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        entrypoint = [os.path.basename(x) for x in config.get("Entrypoint") or []]
        return ImageInfo(
            name=name,
            labels=dict(labels),
            architecture=data.get("Architecture", ""),
            shell=env.get("SHELL") or "/bin/sh",
            has_init=bool(entrypoint) and entrypoint[0] in INIT_PROGRAMS,
        )

    async def list_images(self) -> list[ImageInfo]:
        out = []
        for img in await self.docker.images.list(filters={"label": ["ai.backend.kernelspec"]}):
            for tag in img.get("RepoTags") or []:
                if tag and tag != "<none>:<none>":
                    out.append(ImageInfo(name=tag, labels=dict(img.get("Labels") or {})))
        return sorted(out, key=lambda i: i.name)

    async def inspect_image(self, name: str) -> ImageInfo:
        try:
            data = await self.docker.images.inspect(name)
        except DockerError as e:
            if e.status == 404:
                raise ImageNotFound(f"image {name!r} is not available on this agent") from None
            raise AgentError(f"docker could not inspect image {name!r}: {e.message}") from None
        info = self._image_info(name, data)
        if not info.service_ports:
            raise ImageNotFound(
                f"image {name!r} declares no service ports (label ai.backend.service-ports)"
            )
        return info

    @property
    def publishes_ssh(self) -> bool:
        """Issue 12: whether this backend can publish a kernel's sshd (port 2200 of the
        container) on a host port of its own; not on the host's network (every kernel's
        sshd would want the host's port 2200)."""
        return not self.use_host_network

    async def create_kernel(self, spec, image, host_ports, cuda_devices, fake_devices):
        self._prepared.discard(spec["session_id"])  # its kernels own the network now
        kernel_type = spec.get("kernel_type", INTERACTIVE)
        ports = image.service_ports if kernel_type == INTERACTIVE else []
        # Issue 12: SSH/SFTP from outside (the agent took one more host port, the last).
        user_key = spec.get("ssh_public_key") if self.publishes_ssh else None
        ssh_port = host_ports[-1] if user_key and host_ports else None
        if ssh_port is None:
            user_key = None
        bound = []
        for i, sp in enumerate(ports):
            # Only the Jupyter server is published; it proxies the other apps.
            sp.host_port = host_ports[i] if i < len(host_ports) and host_ports[i] != ssh_port else None
            bound.append(sp.to_json())
        published = [p for p in ports if p.host_port]
        if ssh_port is not None:
            # One sshd, two entries: a shell (ssh) and files (its internal-sftp subsystem).
            for name in ("sshd", "sftp"):
                bound.append(ServicePort(name, "tcp", SSH_CONTAINER_PORT, ssh_port).to_json())
            published.append(ServicePort("sshd", "tcp", SSH_CONTAINER_PORT, ssh_port))
        pooled = spec.get("pool")
        env = dict(spec.get("environ") or {})
        if kernel_type == INTERACTIVE:
            env = self._server_environ(env, image, ports[0], spec["service_prefix"])
        uuids = list(spec.get("cuda_uuids") or [])  # gpu-topology: devices by UUID
        if cuda_devices or uuids:
            visible = ",".join(str(i) for i in cuda_devices)
            env["BACKENDAI_CUDA_DEVICES"] = visible
            if fake_devices:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids) or visible
        slots = spec["slots"]
        nano_cpus = int(float(slots.get("cpu", 1)) * 1e9)
        # CPU burst while the server starts: its own limit comes once it answers.
        probe = ports[0] if kernel_type == INTERACTIVE and ports and ports[0].host_port else None
        host_config = {
            "NanoCpus": nano_cpus,  # or a startup burst, decided just before the create
            "Memory": int(slots.get("mem", 0)) or 0,
            "MemorySwap": int(slots.get("mem", 0)) or 0,
            # Issue 24: a fork bomb stops at the kernel's limit, not at the host's
            # pid_max; scratch space is memory (charged to the kernel's limit), never
            # the host's disk.
            "PidsLimit": int(spec.get("pids_limit") or self.pids_limit),
            "Tmpfs": {path: f"rw,exec,nosuid,nodev,mode=1777,size={int(spec.get('tmp_size') or self.tmp_size)}"
                      for path in ("/tmp", "/var/tmp")},
            "SecurityOpt": ["no-new-privileges"],
        }
        # The kernel image brings its own init (tini as entrypoint); an image without
        # one gets Docker's, so that zombies are reaped and signals reach the kernel.
        if not image.has_init:
            host_config["Init"] = True
        config_extra: dict = {}
        network = None
        try:
            if self.use_host_network:
                host_config["NetworkMode"] = "host"
            else:
                # The session's own network: its kernels reach each other (by name too),
                # no other session's; the hub's API at the agent network's gateway and
                # whatever the host routes to (the internet the operator allows).
                if int(spec.get("cluster_agents") or 1) > 1 and self.swarm_role is not None:
                    # multinode: kernels on several engines share a Swarm overlay network.
                    network = await self._overlay_network(
                        spec["session_id"], main=spec.get("cluster_role", "main") == "main")
                else:
                    network = await self._session_network(spec["session_id"])
                host_config["NetworkMode"] = network
                host_config["PortBindings"] = {
                    f"{p.container_port}/tcp": [{"HostIp": self.bind_host, "HostPort": str(p.host_port)}]
                    for p in published
                }
                # The names under which the other kernels of the session reach this one.
                aliases = [a for a in (spec.get("network_alias"), spec.get("cluster_hostname")) if a]
                if aliases:
                    config_extra["NetworkingConfig"] = {
                        "EndpointsConfig": {network: {"Aliases": aliases}}
                    }
            if (cuda_devices or uuids) and not fake_devices:
                host_config["DeviceRequests"] = [
                    {
                        "Driver": "nvidia",
                        # gpu-topology: by UUID (GPU-... and MIG-...), stable across reboots.
                        "DeviceIDs": uuids or [str(i) for i in cuda_devices],
                        "Capabilities": [["gpu"]],
                    }
                ]
            if pooled:
                # Issue 30: an empty directory of the host at /home/work, into which binding
                # mounts the user's folders (propagation: agent/warmpool.py).
                await asyncio.to_thread(self.pool_root.ensure)
                work, inbox = await asyncio.to_thread(self.pool_root.slot, spec["kernel_id"])
                host_config["Mounts"] = [{"Type": "bind", "Source": work, "Target": "/home/work",
                                          "BindOptions": {"Propagation": "rslave"}},
                                         {"Type": "bind", "Source": inbox, "Target": pool.INBOX}]
            elif spec.get("mounts"):
                # vfolders: bind mounts of the storage's directories (the same paths on
                # every node); "ro" ones read-only in the kernel, whoever runs there.
                host_config["Mounts"] = [
                    {"Type": "bind", "Source": m["source"], "Target": m["target"],
                     "ReadOnly": m["mode"] == "ro"}
                    for m in spec["mounts"]
                ]
        except BaseException:
            # (cancelled while the session's network was made: it goes unless in use)
            await asyncio.shield(self._undo_start(spec, None, network=not self.use_host_network,
                                                  pooled=pooled))
            raise
        if self.lxcfs_root:
            host_config["Mounts"] = [*host_config.get("Mounts", []),
                                     *lxcfs_mounts.mounts(self.lxcfs_root)]
        if spec.get("cpuset"):  # gpu-topology: the CPUs next to the kernel's GPUs
            host_config["CpusetCpus"] = spec["cpuset"]
        host_config.update(self.extra_host_config)
        # Issue 30: a pooled kernel warms up on the CPU nobody else wants (the least
        # weight the kernel's scheduler has) and gets the weight every other kernel has
        # once its waiter is ready, set explicitly on all of them (so that it is the
        # same whatever the engine makes of a weight under cgroup v2). A pool refilling
        # during a rush of starts no longer takes the cores the starts' servers need.
        host_config["CpuShares"] = POOL_CPU_SHARES if pooled else self.cpu_shares
        config = {
            "Image": image.name,
            "Env": [f"{k}={v}" for k, v in env.items()],
            "WorkingDir": "/home/work",
            "Hostname": spec.get("cluster_hostname") or "main1",
            "Labels": {
                L_KERNEL: spec["kernel_id"],
                L_SESSION: spec["session_id"],
                L_OWNER: spec.get("owner", ""),
                L_AGENT: self.agent_id,
                **self._installation_label(),
                L_PORTS: json.dumps(bound),
                L_DEVICES: ",".join(str(i) for i in cuda_devices),
                L_UUIDS: ",".join(uuids),
                L_TYPE: kernel_type,
                L_SLOTS: json.dumps(slots, separators=(",", ":")),
                **({pool.POOL_LABEL: pooled} if pooled else {}),
            },
            "ExposedPorts": {f"{p.container_port}/tcp": {} for p in [*ports, *published]},
            "HostConfig": host_config,
            **config_extra,
        }
        # Issue 27: the owner's container ids (Backend.AI 26.09), else the image's user.
        uid, gid = spec.get("container_uid"), spec.get("container_main_gid")
        if uid is not None or gid is not None:
            config["User"] = f"{uid or KERNEL_UID}:{gid or KERNEL_UID}"
        if spec.get("container_gids"):
            host_config["GroupAdd"] = [str(g) for g in spec["container_gids"]]
        if kernel_type == BATCH:
            # Through the image's shell, as the image's (unprivileged) user, in /home/work.
            config["Cmd"] = [image.shell, "-c", spec["command"]]
        elif kernel_type == IDLE:
            config["Cmd"] = ["sleep", "infinity"]
        elif pooled:
            config["Cmd"] = [pool.WAITER_PATH]
        name = f"backendai-{spec.get('owner', 'x')}-{spec['kernel_id'][:12]}"
        container = None
        # Taken as late as possible (the share of the cores other starts leave free), and
        # given back whatever happens next.
        burst = self._take_burst(spec["kernel_id"], nano_cpus, spec.get("starts_beside", 0)) \
            if probe is not None and not pooled else 0
        if burst:
            host_config["NanoCpus"] = burst
            config["Labels"][L_NANO_CPUS] = str(nano_cpus)
        try:
            container = await self.docker.containers.create(config=config, name=name)
            if spec.get("cluster_ssh") or user_key:
                await container.put_archive(
                    "/", _cluster_ssh_archive(spec.get("cluster_ssh"), user_key))
            if pooled:
                await container.put_archive("/", pool.waiter_archive())
            if spec.get("dotfiles"):  # issue 27: into the home folder, as its user's
                await container.put_archive("/home/work", _dotfiles_archive(
                    spec["dotfiles"], uid or KERNEL_UID, gid or KERNEL_UID))
            await container.start()
            if pooled:
                await self._wait_pool_ready(container)
                # Warm: its waiting costs no CPU, and from here it has the weight of every
                # kernel, so that binding it needs no call to the engine (an update is a
                # runc run, about 12 ms of the engine's CPU, five of them in a rush).
                await self._set_cpus(container.id, nano_cpus, shares=self.cpu_shares)
            if burst:
                # Never hand over (or leave behind) a kernel with more CPU than it asked for.
                await self._end_burst(container.id, nano_cpus, probe.host_port,
                                      spec["service_prefix"])
                self._bursting.pop(spec["kernel_id"], None)
            if ssh_port is not None:
                await self._wait_sshd(container, ssh_port)
        except BaseException as e:
            # Whatever ends the start (the engine's refusal, a server or sshd that never
            # came, the caller giving up: a cancellation) takes all of it back: the burst,
            # the container, the session's network when no other kernel is on it, the
            # pooled kernel's slot. Shielded: a second cancellation does not cut it short.
            await asyncio.shield(self._undo_start(spec, container, network=network is not None,
                                                  pooled=pooled))
            if isinstance(e, DockerError):
                raise AgentError(f"docker could not start the kernel: {e.message}") from None
            raise
        host = self.bind_host
        return KernelRecord(
            kernel_id=spec["kernel_id"],
            session_id=spec["session_id"],
            container_id=container.id,
            host=host,
            service_ports=bound,
            cuda_devices=list(cuda_devices),
            kernel_type=kernel_type,
            cuda_uuids=uuids,
            slots=dict(slots),
        )

    async def _undo_start(self, spec: dict, container, *, network: bool, pooled) -> None:
        """What a failed or abandoned start made, taken back (``network``: the session's
        network, when no other kernel is on it)."""
        self._bursting.pop(spec["kernel_id"], None)
        if container is not None:
            try:
                await container.delete(force=True)
            except DockerError:
                pass
        if network:
            async with name_lock(self.session_network_name(spec["session_id"])):
                await self._remove_session_network(spec["session_id"])
        if pooled:
            await asyncio.to_thread(self.pool_root.release, spec["kernel_id"])

    def _server_environ(self, env: dict, image: ImageInfo, main: ServicePort, prefix: str) -> dict:
        """An interactive kernel's environment for its Jupyter server: where it listens,
        the image's apps, the hub's API at the agent network's gateway."""
        env = dict(env)
        # The kernel's Jupyter server turns the image's service ports into its
        # app proxy entries (images/kernel/backendai_kernel_services.py).
        env["BACKENDAI_SERVICE_PORTS"] = image.labels.get(SERVICE_PORTS_LABEL, "")
        if self.use_host_network:
            env["JUPYTERHUB_SERVICE_URL"] = f"http://{self.bind_host}:{main.host_port}{prefix}"
        else:
            env["JUPYTERHUB_SERVICE_URL"] = f"http://0.0.0.0:{main.container_port}{prefix}"
            for key in ("JUPYTERHUB_API_URL", "JUPYTERHUB_ACTIVITY_URL"):
                if key in env:
                    env[key] = _rewrite_host(env[key], self.gateway)
        return env

    async def _wait_sshd(self, container, port: int, timeout: float = 15.0) -> None:
        """Issue 12: until the kernel's sshd sends its banner on the published port (the
        init starts it a moment after the container; Docker's proxy accepts before), so
        that a RUNNING session takes SSH at once. Not fatal: a kernel whose sshd does not
        come up still runs (its log: /home/config/ssh/sshd.log); one that ended (a short
        batch command) is not waited for."""
        host = "127.0.0.1" if self.bind_host in ("0.0.0.0", "") else self.bind_host
        host = "::1" if host == "::" else host
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            try:
                async with asyncio.timeout(1):
                    reader, writer = await asyncio.open_connection(host, port)
            except (OSError, TimeoutError):
                try:
                    if not (await container.show())["State"].get("Running"):
                        return
                except DockerError:
                    return
                await asyncio.sleep(0.1)
                continue
            try:
                async with asyncio.timeout(2):
                    banner = await reader.readline()
                if banner.startswith(b"SSH-"):
                    return
            except (OSError, TimeoutError):
                pass
            finally:
                writer.close()
            await asyncio.sleep(0.1)
        log.warning("the sshd of the kernel on port %s did not answer in %ss", port, timeout)

    async def kernel_stats(self) -> dict[str, dict]:
        """One-shot ``docker stats`` of each running kernel (no 1 s sampling wait)."""

        async def one(c: dict):
            try:
                st = await self.docker._query_json(
                    f"containers/{c['Id']}/stats", params={"stream": "false", "one-shot": "true"})
            except DockerError:
                return None
            if not isinstance(st, dict):  # removed meanwhile: the engine answers null
                return None
            mem = st.get("memory_stats") or {}
            usage = int(mem.get("usage") or 0)
            # What the kernel holds, as docker stats shows it: page cache excluded.
            details = mem.get("stats") or {}
            usage -= int(details.get("inactive_file", details.get("total_inactive_file", 0)) or 0)
            return (c.get("Labels") or {}).get(L_KERNEL), {
                "cpu_ns": int(((st.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage") or 0),
                "mem_bytes": max(usage, 0),
                "mem_limit_bytes": int(mem.get("limit") or 0),
            }

        running = [c for c in await self._containers() if c.get("State") == "running"]
        got = await asyncio.gather(*(one(c) for c in running))
        return {kid: v for kid, v in (g for g in got if g) if kid}

    async def _running_kernel(self, kernel_id: str):
        """The container of the running kernel ``kernel_id`` (NotFound when none runs)."""
        found = [c for c in await self._containers(f"{L_KERNEL}={kernel_id}")
                 if c.get("State") == "running"]
        if not found:
            raise NotFound(f"no running kernel {kernel_id}")
        return self.docker.containers.container(found[0]["Id"])

    async def commit_kernel(self, kernel_id: str, ref: str, auth: dict | None = None) -> dict:
        """Issue 27 (``session commit``): the running kernel's container as image ``ref``
        (``host[:port]/repo:tag``; the container is paused while it is written), pushed
        to its registry with ``auth``. The engine keeps the image (this agent holds it
        now). ``{"ref", "digest"}``; a push the registry refuses is PullRefused, in its
        words, and the image is removed again."""
        repo, _, tag = ref.rpartition(":")
        if not repo or "/" in tag:
            raise InvalidRequest(f"not an image reference with a tag: {ref!r}")
        container = await self._running_kernel(kernel_id)
        try:
            await container.commit(repository=repo, tag=tag, pause=True,
                                   message=f"session commit of kernel {kernel_id}")
        except DockerError as e:
            raise AgentError(f"docker could not commit kernel {kernel_id}: {e.message}") from None
        digest = ""
        try:
            async for ev in self.docker.images.push(repo, tag=tag, auth=auth, stream=True):
                if ev.get("error"):
                    raise DockerError(500, {"message": ev["error"]})
                digest = (ev.get("aux") or {}).get("Digest") or digest
        except DockerError as e:
            with contextlib.suppress(DockerError):
                await self.docker.images.delete(ref, force=True)
            raise PullRefused(f"the registry refused the push of {ref}: {e.message}") from None
        return {"ref": ref, "digest": digest}

    async def revoke_ssh_key(self, kernel_id: str, access_key: str) -> dict:
        """Issue 22: :mod:`.sshrevoke` run in the kernel as its user (the owner of
        /home/config/ssh and of the sshd; root holds no capabilities there): the key's line leaves
        authorized_keys (a new file renamed over it), and the sshd connections that no
        remaining key accounts for end; the listening sshd and the kernel stay."""
        if not re.fullmatch(r"[A-Za-z0-9]{1,64}", access_key or ""):
            raise InvalidRequest(f"not an access key: {access_key!r}")
        container = await self._running_kernel(kernel_id)
        try:
            exe = await container.exec(["python3", "-c", _SSHREVOKE, access_key],
                                       user=f"{KERNEL_UID}:{KERNEL_UID}",
                                       stdout=True, stderr=True)
            out = bytearray()

            async def read() -> None:
                async with exe.start(detach=False) as stream:
                    while (msg := await stream.read_out()) is not None:
                        out.extend(msg.data)

            async with asyncio.timeout(60):
                await read()
            code = (await exe.inspect()).get("ExitCode")
        except TimeoutError:
            raise AgentError(f"withdrawing the SSH key in kernel {kernel_id} took over 60 s") from None
        except DockerError as e:
            raise AgentError(f"docker could not withdraw the SSH key: {e.message}") from None
        text = out.decode(errors="replace").strip()
        if code != 0:
            raise AgentError(f"withdrawing the SSH key in kernel {kernel_id} failed "
                             f"(exit {code}): {text[-500:]}")
        try:
            return json.loads(text.splitlines()[-1])
        except (ValueError, IndexError):
            raise AgentError(f"withdrawing the SSH key in kernel {kernel_id}: {text[-500:]!r}") from None

    async def bridge_address(self, container_id: str) -> str | None:
        info = await self.docker.containers.container(container_id).show()
        for net in (info.get("NetworkSettings") or {}).get("Networks", {}).values():
            if not net.get("IPAddress"):
                continue
            # Only a bridge on this host routes from here (an overlay's does not).
            driver = (await (await self.docker.networks.get(net["NetworkID"])).show()).get("Driver")
            if driver == "bridge":
                return net["IPAddress"]
        return None

    async def kernel_logs(self, kernel_id: str, limit: int) -> str | None:
        for c in await self._containers(f"{L_KERNEL}={kernel_id}"):
            try:
                # Docker tails by lines; ask for enough lines, then cut to bytes.
                chunks = await self.docker.containers.container(c["Id"]).log(
                    stdout=True, stderr=True, tail=str(max(limit // 8, 100))
                )
            except DockerError as e:
                if e.status in (404, 409):
                    return None
                raise AgentError(f"docker could not read the kernel's logs: {e.message}") from None
            return tail_text("".join(chunks).encode(), limit)
        return None

    def _installation_label(self) -> dict:
        return {L_INSTALLATION: self.installation_id} if self.installation_id else {}

    def _installation_filter(self) -> list[str]:
        return [f"{L_INSTALLATION}={self.installation_id}"] if self.installation_id else []

    def _ours(self, labels: dict, own: bool = False) -> bool:
        """Whether an object with these labels is this agent's: its installation's
        label (``own``), or, made before installations had identities, none at all
        (adopted: listed, stopped when the record says so, never reaped as an orphan).
        Another installation's object is never this agent's, whatever its agent id."""
        if labels.get(L_AGENT) not in (None, self.agent_id):
            return False
        label = labels.get(L_INSTALLATION)
        if label is None:
            return not own or not self.installation_id
        return label == self.installation_id

    async def _containers(self, *labels: str, own: bool = False) -> list[dict]:
        """This agent's containers (with ``labels``): its agent id and its
        installation's label, or no installation label at all unless ``own``."""
        found = await self.docker.containers.list(
            all=True, filters={"label": [f"{L_AGENT}={self.agent_id}", *labels]}
        )
        return [c._container for c in found if self._ours(c._container.get("Labels") or {}, own)]

    async def destroy_kernel(self, kernel_id: str) -> None:
        for c in await self._containers(f"{L_KERNEL}={kernel_id}"):
            try:
                await self.docker.containers.container(c["Id"]).delete(force=True, v=True)
            except DockerError as e:
                if e.status != 404:
                    raise AgentError(f"docker could not remove the kernel: {e.message}") from None
            sid = (c.get("Labels") or {}).get(L_SESSION)
            if sid and not self.use_host_network:
                await self._remove_session_network(sid)
            c = self._real_mounts(c)
            # Its folders' mount points in the home folder go with it (agent/mountpoints.py).
            if any(m.get("Destination") == mountpoints.MOUNT_ROOT for m in c.get("Mounts") or []):
                others = await self.docker.containers.list(
                    all=True, filters={"label": [f"{L_AGENT}={self.agent_id}"]})
                await asyncio.to_thread(mountpoints.remove_unused, c,
                                        [self._real_mounts(o._container) for o in others])
            if self.pool_root is not None and (c.get("Labels") or {}).get(pool.POOL_LABEL):
                await asyncio.to_thread(self.pool_root.release, kernel_id)

    async def list_kernels(self) -> list[KernelRecord]:
        return [self._record(c) for c in await self._containers()]

    def _record(self, c: dict) -> KernelRecord:
        """The kernel of a container listing."""
        labels = c.get("Labels") or {}
        return KernelRecord(
            kernel_id=labels.get(L_KERNEL, ""),
            session_id=labels.get(L_SESSION, ""),
            container_id=c["Id"],
            host=self.bind_host,
            service_ports=json.loads(labels.get(L_PORTS) or "[]"),
            cuda_devices=[int(x) for x in (labels.get(L_DEVICES) or "").split(",") if x],
            cuda_uuids=[x for x in (labels.get(L_UUIDS) or "").split(",") if x],
            alive=c.get("State") == "running",
            kernel_type=labels.get(L_TYPE, INTERACTIVE),
            exit_code=_exit_code(c),
            slots=_json_dict(labels.get(L_SLOTS)),
            own=self._ours(labels, own=True),
            pooled=self._pooled_key(labels),
        )
