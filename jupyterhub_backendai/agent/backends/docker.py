"""Kernels as Docker containers, through the engine's API with aiodocker (async end to end)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from urllib.parse import urlsplit, urlunsplit

import aiodocker
from aiodocker.exceptions import DockerError

from ...common.errors import AgentError, ImageNotFound
from .base import (
    BATCH,
    IDLE,
    INTERACTIVE,
    Backend,
    ExitCallback,
    ImageInfo,
    KernelRecord,
    tail_text,
)

log = logging.getLogger(__name__)

L_KERNEL = "ai.backend.kernel-id"
L_SESSION = "ai.backend.session-id"
L_OWNER = "ai.backend.owner"
L_AGENT = "ai.backend.agent-id"
L_PORTS = "ai.backend.service-ports-bound"
L_DEVICES = "ai.backend.cuda-devices"
L_TYPE = "ai.backend.kernel-type"
LOOPBACKS = {"127.0.0.1", "localhost", "::1"}
# Entrypoints that already are an init (reap zombies, forward signals).
INIT_PROGRAMS = {"tini", "tini-static", "dumb-init", "catatonit"}


def _exit_code(container: dict) -> int | None:
    """The exit code of an exited container from the list API's status ("Exited (3) 2 minutes ago")."""
    if container.get("State") != "exited":
        return None
    m = re.match(r"Exited \((-?\d+)\)", container.get("Status") or "")
    return int(m.group(1)) if m else None


def _rewrite_host(url: str, host: str) -> str:
    parts = urlsplit(url)
    if parts.hostname in LOOPBACKS:
        netloc = host + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


class DockerBackend(Backend):
    name = "docker"

    def __init__(
        self,
        agent_id: str,
        *,
        network: str = "backendai",
        use_host_network: bool = False,
        bind_host: str = "127.0.0.1",
        docker_url: str | None = None,
        extra_host_config: dict | None = None,
    ):
        self.agent_id = agent_id
        self.network = network
        self.use_host_network = use_host_network
        self.bind_host = bind_host
        self.docker_url = docker_url
        self.extra_host_config = extra_host_config or {}
        self.docker: aiodocker.Docker | None = None
        self.gateway: str | None = None
        self._watch_task: asyncio.Task | None = None

    @staticmethod
    async def available(docker_url: str | None = None) -> bool:
        try:
            d = aiodocker.Docker(url=docker_url)
        except Exception:
            return False
        try:
            await asyncio.wait_for(d.version(), 5)
            return True
        except Exception:
            return False
        finally:
            await d.close()

    async def init(self, on_exit: ExitCallback) -> None:
        self.docker = aiodocker.Docker(url=self.docker_url)
        await self.docker.version()
        if not self.use_host_network:
            self.gateway = await self._ensure_network()
        self._watch_task = asyncio.create_task(self._watch(on_exit))

    async def close(self) -> None:
        if self._watch_task:
            self._watch_task.cancel()
            try:
                await self._watch_task
            except (asyncio.CancelledError, Exception):
                pass
        if self.docker:
            await self.docker.close()

    async def _ensure_network(self) -> str:
        try:
            net = await self.docker.networks.get(self.network)
            info = await net.show()
        except DockerError as e:
            if e.status != 404:
                raise
            log.info("creating docker network %s", self.network)
            net = await self.docker.networks.create(
                {
                    "Name": self.network,
                    "Driver": "bridge",
                    "Labels": {"ai.backend.network": "agent"},
                }
            )
            info = await net.show()
        configs = info.get("IPAM", {}).get("Config") or []
        for cfg in configs:
            if cfg.get("Gateway"):
                return cfg["Gateway"]
        raise AgentError(f"docker network {self.network} has no gateway")

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
                    if kid:
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

    async def create_kernel(self, spec, image, host_ports, cuda_devices, fake_devices):
        kernel_type = spec.get("kernel_type", INTERACTIVE)
        ports = image.service_ports if kernel_type == INTERACTIVE else []
        bound = []
        for sp, hp in zip(ports, host_ports, strict=True):
            sp.host_port = hp
            bound.append(sp.to_json())
        env = dict(spec.get("environ") or {})
        if kernel_type == INTERACTIVE:
            main = ports[0]
            prefix = spec["service_prefix"]
            if self.use_host_network:
                env["JUPYTERHUB_SERVICE_URL"] = f"http://{self.bind_host}:{main.host_port}{prefix}"
            else:
                env["JUPYTERHUB_SERVICE_URL"] = f"http://0.0.0.0:{main.container_port}{prefix}"
                for key in ("JUPYTERHUB_API_URL", "JUPYTERHUB_ACTIVITY_URL"):
                    if key in env:
                        env[key] = _rewrite_host(env[key], self.gateway)
        if cuda_devices:
            visible = ",".join(str(i) for i in cuda_devices)
            env["BACKENDAI_CUDA_DEVICES"] = visible
            if fake_devices:
                env["CUDA_VISIBLE_DEVICES"] = visible
        slots = spec["slots"]
        host_config = {
            "NanoCpus": int(float(slots.get("cpu", 1)) * 1e9),
            "Memory": int(slots.get("mem", 0)) or 0,
            "MemorySwap": int(slots.get("mem", 0)) or 0,
            "PidsLimit": 4096,
            "SecurityOpt": ["no-new-privileges"],
        }
        # The kernel image brings its own init (tini as entrypoint); an image without
        # one gets Docker's, so that zombies are reaped and signals reach the kernel.
        if not image.has_init:
            host_config["Init"] = True
        config_extra: dict = {}
        if self.use_host_network:
            host_config["NetworkMode"] = "host"
        else:
            host_config["NetworkMode"] = self.network
            host_config["PortBindings"] = {
                f"{p.container_port}/tcp": [{"HostIp": self.bind_host, "HostPort": str(p.host_port)}]
                for p in ports
            }
            alias = spec.get("network_alias")
            if alias:
                # The name under which the other kernels of the session reach this one.
                config_extra["NetworkingConfig"] = {
                    "EndpointsConfig": {self.network: {"Aliases": [alias]}}
                }
        if cuda_devices and not fake_devices:
            host_config["DeviceRequests"] = [
                {
                    "Driver": "nvidia",
                    "DeviceIDs": [str(i) for i in cuda_devices],
                    "Capabilities": [["gpu"]],
                }
            ]
        if spec.get("mounts"):
            # vfolders: bind mounts of the storage's directories (the same paths on
            # every node); "ro" ones read-only in the kernel, whoever runs there.
            host_config["Mounts"] = [
                {"Type": "bind", "Source": m["source"], "Target": m["target"],
                 "ReadOnly": m["mode"] == "ro"}
                for m in spec["mounts"]
            ]
        host_config.update(self.extra_host_config)
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
                L_PORTS: json.dumps(bound),
                L_DEVICES: ",".join(str(i) for i in cuda_devices),
                L_TYPE: kernel_type,
            },
            "ExposedPorts": {f"{p.container_port}/tcp": {} for p in ports},
            "HostConfig": host_config,
            **config_extra,
        }
        if kernel_type == BATCH:
            # Through the image's shell, as the image's (unprivileged) user, in /home/work.
            config["Cmd"] = [image.shell, "-c", spec["command"]]
        elif kernel_type == IDLE:
            config["Cmd"] = ["sleep", "infinity"]
        name = f"backendai-{spec.get('owner', 'x')}-{spec['kernel_id'][:12]}"
        container = None
        try:
            container = await self.docker.containers.create(config=config, name=name)
            await container.start()
        except (DockerError, asyncio.CancelledError) as e:
            if container is not None:
                try:
                    await container.delete(force=True)
                except DockerError:
                    pass
            if isinstance(e, asyncio.CancelledError):
                raise
            raise AgentError(f"docker could not start the kernel: {e.message}") from None
        host = self.bind_host
        return KernelRecord(
            kernel_id=spec["kernel_id"],
            session_id=spec["session_id"],
            container_id=container.id,
            host=host,
            service_ports=bound,
            cuda_devices=list(cuda_devices),
            kernel_type=kernel_type,
        )

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

    async def _containers(self, *labels: str) -> list[dict]:
        found = await self.docker.containers.list(
            all=True, filters={"label": [f"{L_AGENT}={self.agent_id}", *labels]}
        )
        return [c._container for c in found]

    async def destroy_kernel(self, kernel_id: str) -> None:
        for c in await self._containers(f"{L_KERNEL}={kernel_id}"):
            try:
                await self.docker.containers.container(c["Id"]).delete(force=True, v=True)
            except DockerError as e:
                if e.status != 404:
                    raise AgentError(f"docker could not remove the kernel: {e.message}") from None

    async def list_kernels(self) -> list[KernelRecord]:
        out = []
        for c in await self._containers():
            labels = c.get("Labels") or {}
            devices = [int(x) for x in (labels.get(L_DEVICES) or "").split(",") if x]
            out.append(
                KernelRecord(
                    kernel_id=labels.get(L_KERNEL, ""),
                    session_id=labels.get(L_SESSION, ""),
                    container_id=c["Id"],
                    host=self.bind_host,
                    service_ports=json.loads(labels.get(L_PORTS) or "[]"),
                    cuda_devices=devices,
                    alive=c.get("State") == "running",
                    kernel_type=labels.get(L_TYPE, INTERACTIVE),
                    exit_code=_exit_code(c),
                )
            )
        return out
