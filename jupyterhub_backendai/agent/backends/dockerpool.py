"""The Docker backend's half of the warm pool (issue 30; agent/warmpool.py has the
waiter, the host directories and how binding works): whether this backend can keep a
pool, a warming kernel's readiness, and binding a pooled kernel to a session.

A mixin of :class:`~.docker.DockerBackend` (the engine client, its containers, the
kernels' environment and their CPU burst are the backend's)."""

from __future__ import annotations

import asyncio
import json
import logging

from aiodocker.exceptions import DockerError

from ...common.errors import AgentError, NotFound
from .. import warmpool as pool
from .base import INTERACTIVE, ImageInfo, KernelRecord, ServicePort
from .labels import L_KERNEL, L_PORTS, L_SESSION

log = logging.getLogger(__name__)


class DockerPool:
    @property
    def pools(self) -> bool:
        """Whether this backend can keep pooled kernels (a pool root, bridge networks)."""
        return self.pool_root is not None and not self.use_host_network

    async def _wait_pool_ready(self, container, timeout: float = 120.0) -> None:
        """Until the pooled kernel's waiter has imported the server's modules: its
        output followed as Docker streams it (one request, no polling: a warming pool
        of five once cost the hub a quarter of its CPU in log reads); the stream ends
        when the container does."""
        out = ""
        try:
            async with asyncio.timeout(timeout):
                async for piece in container.log(stdout=True, stderr=True, follow=True):
                    out = (out + piece)[-2000:]
                    if pool.READY_LINE in out:
                        return
        except TimeoutError:
            raise AgentError(f"the pooled kernel was not ready within {timeout:g} s") from None
        raise AgentError("the pooled kernel ended before it was ready: " + out[-500:])

    async def unbound_pooled(self, kernel_id: str) -> tuple[KernelRecord, dict] | None:
        """The unbound pooled kernel ``kernel_id`` of this installation, if there is one,
        and its container's listing (for :meth:`bind_pooled`): the engine asked for that
        one container (a bind once listed every kernel of the agent, each read as a
        record, then listed it again)."""
        for c in await self._containers(f"{L_KERNEL}={kernel_id}", own=True):
            rec = self._record(c)
            if rec.pooled:
                return rec, c
        return None

    async def bind_pooled(self, spec: dict, image: ImageInfo, c: dict) -> KernelRecord:
        """Bind the pooled kernel ``spec["kernel_id"]``, listed as ``c`` by
        :meth:`unbound_pooled`, to the session of ``spec``: its folders mounted, the
        server started with its environment (agent/warmpool.py). Once: a kernel bound,
        or being bound, is refused; a failure removes it."""
        kid = spec["kernel_id"]
        if c.get("State") != "running" or kid in self._binding \
                or self.pool_root.bound_mounts(kid) is not None:
            raise NotFound(f"no unbound pooled kernel {kid} on this agent")
        labels = c.get("Labels") or {}
        self._binding.add(kid)
        container = self.docker.containers.container(c["Id"])
        bound = json.loads(labels.get(L_PORTS) or "[]")
        ports = [ServicePort(p["name"], p["protocol"], p["container_port"], p.get("host_port"))
                 for p in bound]
        main = ports[0]
        nano_cpus = int(float(spec["slots"].get("cpu", 1)) * 1e9)
        burst = 0
        try:
            await asyncio.to_thread(self.pool_root.bind, kid, list(spec["mounts"]))
            env = self._server_environ(dict(spec.get("environ") or {}), image, main,
                                       spec["service_prefix"])
            async def rename():  # beside the server's start: nobody waits for the name
                try:
                    await container.rename(f"backendai-{spec.get('owner', 'x')}-{kid[:12]}")
                except DockerError as e:
                    log.debug("pooled kernel %s keeps its name: %s", kid, e.message)

            burst = self._take_burst(kid, nano_cpus, spec.get("starts_beside", 0)) \
                if main.host_port else 0
            # Its CPU before its server starts (which it does once its environment is in
            # the inbox): the burst when there is one, else its own limit and the weight
            # of every kernel, which a warmed kernel has already (docker.py); the
            # engine's update (a runc run, about 12 ms of its CPU) only where needed.
            cpu = (await container.show())["HostConfig"]
            if burst or cpu.get("NanoCpus") != nano_cpus or cpu.get("CpuShares") != self.cpu_shares:
                await self._set_cpus(c["Id"], burst or nano_cpus, shares=self.cpu_shares)
            await asyncio.gather(asyncio.to_thread(self.pool_root.deliver, kid, env), rename())
            if burst:
                await self._end_burst(c["Id"], nano_cpus, main.host_port, spec["service_prefix"])
        except BaseException as e:
            # (the pooled kernel's own session: its network, not the user's session's).
            # Shielded, as create_kernel's: a second cancellation does not cut it short.
            await asyncio.shield(self._undo_start(
                {"kernel_id": kid, "session_id": labels.get(L_SESSION, "")}, container,
                network=True, pooled=True))
            if isinstance(e, (AgentError, asyncio.CancelledError)):
                raise
            if isinstance(e, DockerError):
                raise AgentError(f"docker could not bind the pooled kernel: {e.message}") from None
            if isinstance(e, OSError):
                raise AgentError(f"the pooled kernel could not be bound (its folders or its "
                                 f"environment): {e.strerror}") from None
            raise
        finally:
            self._bursting.pop(kid, None)
            self._binding.discard(kid)
        return KernelRecord(
            kernel_id=kid, session_id=spec["session_id"], container_id=c["Id"],
            host=self.bind_host, service_ports=bound, kernel_type=INTERACTIVE,
            slots=dict(spec["slots"]),
        )

    def _real_mounts(self, c: dict) -> dict:
        """A container's listing with a bound pooled kernel's folders as its mounts."""
        if self.pool_root is None or not (c.get("Labels") or {}).get(pool.POOL_LABEL):
            return c
        bound = self.pool_root.bound_mounts((c.get("Labels") or {}).get(L_KERNEL, ""))
        return dict(c, Mounts=bound) if bound is not None else c

    def _pooled_key(self, labels: dict) -> str:
        """The warm pool of an unbound pooled kernel, "" for any other kernel."""
        key = labels.get(pool.POOL_LABEL) or ""
        if key and self.pool_root is not None \
                and self.pool_root.bound_mounts(labels.get(L_KERNEL, "")) is not None:
            return ""
        return key
