"""How the manager reaches an agent: in the same process, or over HTTP to ``backendai-agent``."""

from __future__ import annotations

import asyncio
import json
import ssl
import weakref

import aiohttp

from ..common.errors import AgentError, BackendAIError, InvalidRequest, NotFound
from ..common.httpbase import ERRORS, NodeClient, TLSFiles


class AgentClient:
    async def create_kernel(self, spec: dict) -> dict:
        raise NotImplementedError

    async def destroy_kernel(self, kernel_id: str) -> None:
        raise NotImplementedError

    async def bind_kernel(self, spec: dict) -> dict:
        """Issue 30: bind a pooled kernel to a session (agent/warmpool.py)."""
        raise NotImplementedError

    async def list_kernels(self) -> list[dict]:
        raise NotImplementedError

    async def kernel_logs(self, kernel_id: str) -> str | None:
        """The tail of the kernel's output; None when the agent does not know the kernel."""
        raise NotImplementedError

    async def commit_kernel(self, kernel_id: str, ref: str, auth: dict | None) -> dict:
        """Issue 27: the running kernel as image ``ref``, pushed (``{"ref", "digest"}``)."""
        raise NotImplementedError

    async def revoke_ssh_key(self, kernel_id: str, access_key: str) -> dict:
        """Issue 22: withdraw keypair ``access_key``'s SSH key from a running kernel
        (``{"removed", "ended"}``); NotFound when the agent has no such running kernel."""
        raise NotImplementedError

    async def set_resource_group(self, name: str) -> dict:
        """Move the agent to resource group ``name`` (it keeps it); its info after."""
        raise NotImplementedError

    async def info(self) -> dict:
        """What the agent says of itself (its id, address, group, capacity): a direct
        call, the second witness of its liveness besides its heartbeats."""
        raise NotImplementedError

    async def image_info(self, name: str) -> dict:
        raise NotImplementedError

    async def list_images(self) -> list[dict]:
        raise NotImplementedError

    async def pull_image(self, name: str, auth: dict | None = None, policy: str = "tag",
                         on_progress=None, session_id: str | None = None) -> bool:
        """Issue 25: make ``name`` present on the agent, pulling it when missing
        (``on_progress(dict)``); ``session_id``: the session whose kernels follow, whose
        network the agent makes meanwhile (agent/core.py ``pull_image``)."""
        raise NotImplementedError


class InProcessAgentClient(AgentClient):
    def __init__(self, agent):
        self.agent = agent

    async def create_kernel(self, spec):
        return await self.agent.create_kernel(spec)

    async def destroy_kernel(self, kernel_id):
        await self.agent.destroy_kernel(kernel_id)

    async def bind_kernel(self, spec):
        return await self.agent.bind_kernel(spec)

    async def list_kernels(self):
        return await self.agent.list_kernels()

    async def kernel_logs(self, kernel_id):
        return await self.agent.kernel_logs(kernel_id)

    async def revoke_ssh_key(self, kernel_id, access_key):
        return await self.agent.revoke_ssh_key(kernel_id, access_key)

    async def commit_kernel(self, kernel_id, ref, auth):
        return await self.agent.commit_kernel(kernel_id, ref, auth)

    async def info(self):
        return self.agent.info()

    async def set_resource_group(self, name):
        return await self.agent.set_resource_group(name)

    async def image_info(self, name):
        info = await self.agent.image_info(name)
        return {"name": info.name, "labels": info.labels}

    async def list_images(self):
        return [{"name": i.name, "labels": i.labels} for i in await self.agent.list_images()]

    async def pull_image(self, name, auth=None, policy="tag", on_progress=None,
                         session_id=None):
        return await self.agent.pull_image(name, auth, policy, on_progress, session_id)


_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
PULL_TIMEOUT = 3600.0  # seconds one image pull may take (issue 25)


def _node_client(addr: str, token: str, tls: TLSFiles | None, timeout: float) -> NodeClient:
    """One keep-alive pool per agent address (and event loop), shared by the
    short-lived :class:`HTTPAgentClient` objects the manager makes per call."""
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    key = (addr, token, tls and (tls.cert, tls.key, tls.ca), timeout)
    client = per_loop.get(key)
    if client is None:
        client = per_loop[key] = NodeClient(
            addr, tls=tls, token=token, timeout=timeout, what="agent", unreachable=AgentError
        )
    return client


async def close_agent_clients() -> None:
    """Close the pools of this event loop (the manager's stop)."""
    for client in _clients.pop(asyncio.get_running_loop(), {}).values():
        await client.close()


class HTTPAgentClient(AgentClient):
    """Talks to the agent daemon's small JSON API through the hub's one node client
    (``common/httpbase.py``): mutual TLS when ``tls`` is given and the address is
    https://, else the deprecated shared token; problem+json errors come back as
    their :class:`BackendAIError` class (anything else: :class:`AgentError`)."""

    def __init__(self, addr: str, token: str = "", timeout: float = 120, tls: TLSFiles | None = None):
        self.base = addr.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.tls = tls if self.base.startswith("https:") else None

    async def _call(self, method: str, path: str, body=None):
        node = _node_client(self.base, self.token, self.tls, self.timeout)
        try:
            return await node.call(method, path, body=body, default=AgentError)
        except (AgentError, InvalidRequest, NotFound):
            raise
        except BackendAIError as e:  # refused (401/403) or anything else: the agent failed
            raise AgentError(f"agent at {self.base}: {e.detail}") from None

    async def create_kernel(self, spec):
        return await self._call("POST", "/v1/kernels", spec)

    async def destroy_kernel(self, kernel_id):
        await self._call("DELETE", f"/v1/kernels/{kernel_id}")

    async def bind_kernel(self, spec):
        return await self._call("POST", f"/v1/kernels/{spec['kernel_id']}/bind", spec)

    async def list_kernels(self):
        return await self._call("GET", "/v1/kernels")

    async def info(self):
        return await self._call("GET", "/v1/info")

    async def set_resource_group(self, name):
        return await self._call("PUT", "/v1/resource-group", {"name": name})

    async def kernel_logs(self, kernel_id):
        try:
            return (await self._call("GET", f"/v1/kernels/{kernel_id}/logs"))["logs"]
        except NotFound:
            return None

    async def revoke_ssh_key(self, kernel_id, access_key):
        return await self._call("POST", f"/v1/kernels/{kernel_id}/revoke-ssh-key",
                                {"access_key": access_key})

    async def commit_kernel(self, kernel_id, ref, auth):
        return await self._call("POST", f"/v1/kernels/{kernel_id}/commit",
                                {"ref": ref, "auth": auth})

    async def image_info(self, name):
        return await self._call("POST", "/v1/images/inspect", {"name": name})

    async def list_images(self):
        return await self._call("GET", "/v1/images")

    async def pull_image(self, name, auth=None, policy="tag", on_progress=None,
                         session_id=None):
        """The agent's stream of JSON lines (agent/server.py ``ImagePullHandler``):
        progress to ``on_progress``, then the outcome. A pull may take long: its own
        pool with an hour's limit."""
        node = _node_client(self.base, self.token, self.tls, max(self.timeout, PULL_TIMEOUT))
        body = {"name": name, "auth": auth, "policy": policy, "session_id": session_id}
        try:
            async with node.session().post(node.base + "/v1/images/pull", json=body) as resp:
                await node.raise_for(resp, AgentError)
                async for raw in resp.content:
                    if not raw.strip():
                        continue
                    line = json.loads(raw)
                    if "progress" in line:
                        if on_progress is not None:
                            on_progress(line["progress"])
                    elif "error" in line:
                        err = line["error"]
                        # The agent's class by name (ImageNotInRegistry, PullRefused: the
                        # start is not retried), any other as an AgentError.
                        cls = ERRORS.get(err.get("type"), AgentError)
                        if not issubclass(cls, AgentError):
                            cls = AgentError
                        raise cls(err.get("detail") or f"pulling {name} failed")
                    elif "pulled" in line:
                        return bool(line["pulled"])
        except (TimeoutError, aiohttp.ClientError, ssl.SSLError) as e:
            raise node.unreachable(e) from None
        raise AgentError(f"agent at {self.base} ended the pull of {name} without an outcome")
