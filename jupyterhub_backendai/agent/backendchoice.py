"""How an agent runs kernels (:class:`BackendChoice`): the backend it makes at start,
Docker or local processes, and the ``auto`` rule between them.

``auto`` takes Docker when an engine answers, waits ``docker_wait`` seconds for one that
is configured but silent and then refuses to start, and takes local processes
(unisolated) only when no engine is configured and the agent is not root: it never falls
back to unisolated kernels silently. A root agent's local kernels run as
``local_kernel_user`` (:func:`_parse_user`), never as root unless the operator says so.

A mixin of :class:`~.core.Agent`, whose configuration it reads.
"""

from __future__ import annotations

import asyncio
import os

from ..common.errors import AgentError
from ..common.slots import parse_size
from .backends.base import Backend

DOCKER_SOCKET = "/var/run/docker.sock"


class BackendChoice:
    def docker_configured(self) -> str | None:
        """Where a Docker engine is expected (a configured URL, DOCKER_HOST, or the
        local socket that exists), None when nothing says there is one."""
        if self.docker_url:
            return self.docker_url
        if os.environ.get("DOCKER_HOST"):
            return os.environ["DOCKER_HOST"]
        if os.path.exists(DOCKER_SOCKET):
            return "unix://" + DOCKER_SOCKET
        return None

    async def _auto_backend(self) -> str:
        from .backends.docker import DockerBackend

        engine = self.docker_configured()
        deadline = asyncio.get_running_loop().time() + self.docker_wait
        while engine:
            if await DockerBackend.available(self.docker_url):
                return "docker"
            if asyncio.get_running_loop().time() >= deadline:
                raise AgentError(
                    f"the Docker engine at {engine} does not answer (waited "
                    f"{self.docker_wait:g} s). Refusing to fall back to local processes, "
                    "which would run kernels unisolated beside the hub's data: start the "
                    "engine, or choose a backend with c.Agent.backend ('docker', or "
                    "'local' for unisolated kernels)."
                )
            self.log.warning("Docker engine at %s does not answer yet; waiting", engine)
            await asyncio.sleep(1)
        if os.geteuid() == 0:
            raise AgentError(
                "no Docker engine is configured (no Agent.docker_url, no DOCKER_HOST, no "
                f"{DOCKER_SOCKET}) and the agent runs as root: refusing to run kernels as "
                "local processes (unisolated) automatically. Install Docker, or set "
                "c.Agent.backend = 'local' to choose unisolated kernels (they run as "
                "Agent.local_kernel_user)."
            )
        return "local"

    async def _make_backend(self) -> Backend:
        from .backends.docker import DockerBackend
        from .backends.local import LocalBackend

        kind = self.backend
        if kind == "auto":
            kind = await self._auto_backend()
            self.log.info("agent backend: %s (auto)", kind)
        if kind == "docker":
            return DockerBackend(
                self.agent_id,
                installation_id=self.installation_id,
                network=self.network,
                use_host_network=self.use_host_network,
                bind_host=self.bind_host,
                docker_url=self.docker_url,
                extra_host_config=self.extra_host_config,
                session_subnets=self.session_subnets,
                session_prefix=self.session_subnet_prefix,
                startup_cpus=self.startup_cpus,
                startup_cpu_timeout=self.startup_cpu_timeout,
                overlay_encrypted=self.overlay_encrypted,
                isolation_guard=self.isolation_guard,
                pids_limit=self.kernel_pids_limit,
                tmp_size=int(parse_size(self.kernel_tmp_size)),
                pool_root=os.path.join(self.state_dir, "pool"),
                lxcfs=self.lxcfs,
            )
        if kind == "local":
            run_as = None
            if os.geteuid() == 0:
                if self.unsafe_local_kernels_as_root:
                    self.log.warning(
                        "UNSAFE: local backend kernels run as root "
                        "(Agent.unsafe_local_kernels_as_root): every user's code can read "
                        "and change the hub's databases, keys and everyone's files")
                else:
                    run_as = _parse_user(self.local_kernel_user)
            self.log.warning(
                "local backend: kernels are NOT isolated (no container, no limits; they "
                "run as uid %s and see this machine's files and network)",
                run_as[0] if run_as else os.geteuid())
            return LocalBackend(
                self.agent_id,
                state_dir=self.state_dir,
                work_root=self.local_work_root,
                cmd=list(self.local_cmd) or None,
                bind_host=self.bind_host,
                image_name=self.local_image,
                run_as=run_as,
            )
        raise ValueError(f"unknown agent backend {kind!r}")


def _parse_user(spec: str) -> tuple[int, int]:
    """"uid:gid", "uid" or a user name -> (uid, gid); root is refused."""
    import pwd

    spec = spec.strip()
    try:
        if spec.replace(":", "").isdigit():
            uid, _, gid = spec.partition(":")
            ids = (int(uid), int(gid or uid))
        else:
            pw = pwd.getpwnam(spec)
            ids = (pw.pw_uid, pw.pw_gid)
    except (KeyError, ValueError):
        raise AgentError(
            f"Agent.local_kernel_user {spec!r} is neither uid:gid nor a user of this machine"
        ) from None
    if 0 in ids:
        raise AgentError(
            f"Agent.local_kernel_user {spec!r} is root: local kernels never run as root "
            "(see Agent.unsafe_local_kernels_as_root)")
    return ids

