"""The Docker backend's CPU burst (issue 30): a starting interactive kernel may use
``startup_cpus`` until its server answers, then its own limit; starts at once share the
host's cores.

A mixin of :class:`~.docker.DockerBackend` (the engine client and the kernels in their
burst, ``_bursting``, are the backend's)."""

from __future__ import annotations

import asyncio
import json
import logging
import os

from aiodocker.exceptions import DockerError

from ...common.errors import AgentError
from .labels import L_NANO_CPUS

log = logging.getLogger(__name__)


class CPUBurst:
    async def _answers(self, port: int, prefix: str) -> bool:
        """Whether the kernel's server answers HTTP on its published port (Docker's
        proxy accepts connections before the server listens: a status line is needed)."""
        host = "127.0.0.1" if self.bind_host in ("0.0.0.0", "") else self.bind_host
        host = "::1" if host == "::" else host
        try:
            async with asyncio.timeout(1):
                reader, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError):
            return False
        try:
            writer.write(f"GET {prefix.rstrip('/')}/api HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            async with asyncio.timeout(2):
                line = await reader.readline()
            return line.startswith(b"HTTP/")
        except (OSError, TimeoutError):
            return False
        finally:
            writer.close()

    async def _set_cpus(self, container_id: str, nano_cpus: int, shares: int | None = None) -> None:
        """The container's CPU limit now; with ``shares``, also its weight."""
        update: dict = {"NanoCpus": nano_cpus}
        if shares is not None:
            update["CpuShares"] = shares
        await self.docker._query_json(
            f"containers/{container_id}/update", method="POST",
            data=json.dumps(update), headers={"Content-Type": "application/json"},
        )

    def _take_burst(self, kernel_id: str, nano_cpus: int, beside: int = 0) -> int:
        """The NanoCpus a starting kernel may use until its server answers, 0 for none
        (issue 30). One start alone gets ``startup_cpus``; starts together share the
        host's cores: a burst takes only what no other start is bursting into (none
        when they have all of it), and at most the kernel's share of the cores among
        the ``beside`` other starts its manager drives on this agent now (whose kernels
        come a moment later). Before, five kernels starting together on two cores each
        got two, and their bursts fought each other; then the first of them got both
        cores, its server was no faster beside four others, and its session was the
        last to run (the burst's end, a poll and an engine update, comes first)."""
        want = int(self.startup_cpus * 1e9)
        if want <= nano_cpus:
            return 0
        cores = (os.cpu_count() or 1) * 10**9
        free = cores - sum(self._bursting.values())
        burst = min(want, free, cores // (beside + 1))
        if burst <= nano_cpus:
            return 0
        self._bursting[kernel_id] = burst
        return burst

    async def _end_burst(self, container_id: str, nano_cpus: int, port: int, prefix: str) -> None:
        """Wait until the kernel's server answers (or ``startup_cpu_timeout``, or the
        container stops), then give it its own CPU limit."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_cpu_timeout
        next_check = loop.time() + 1
        delay = 0.01  # a bound pooled kernel answers within a few tenths: look often first
        while loop.time() < deadline:
            if await self._answers(port, prefix):
                break
            if loop.time() >= next_check:
                next_check = loop.time() + 1
                info = await self.docker.containers.container(container_id).show()
                if not info["State"].get("Running"):
                    break
            await asyncio.sleep(delay)
            delay = min(delay * 1.3, 0.05)
        else:
            log.warning("kernel container %s: its server did not answer within %g s; "
                        "its CPU limit applies now", container_id[:12], self.startup_cpu_timeout)
        try:
            await self._set_cpus(container_id, nano_cpus)
        except DockerError as e:
            if e.status == 404:
                return
            # A stopped container cannot run anyway; anything else is an error.
            info = await self.docker.containers.container(container_id).show()
            if info["State"].get("Running"):
                raise AgentError(f"docker could not apply the kernel's CPU limit: {e.message}") from None

    async def _end_bursts(self) -> None:
        """After a restart: kernels left with their startup burst get their own limit."""
        for c in await self._containers(L_NANO_CPUS, own=True):
            want = int((c.get("Labels") or {}).get(L_NANO_CPUS) or 0)
            if not want or c.get("State") != "running":
                continue
            try:
                info = await self.docker.containers.container(c["Id"]).show()
                if info["HostConfig"].get("NanoCpus") != want:
                    log.info("kernel container %s: applying its CPU limit left from a start",
                             c["Id"][:12])
                    await self._set_cpus(c["Id"], want)
            except DockerError as e:
                log.warning("kernel container %s: %s", c["Id"][:12], e.message)
