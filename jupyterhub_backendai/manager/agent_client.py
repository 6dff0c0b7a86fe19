"""How the manager reaches an agent: in the same process, or over HTTP to ``backendai-agent``."""

from __future__ import annotations

import json

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ..common.errors import AgentError, ImageNotFound, InvalidRequest, NotFound


class AgentClient:
    async def create_kernel(self, spec: dict) -> dict:
        raise NotImplementedError

    async def destroy_kernel(self, kernel_id: str) -> None:
        raise NotImplementedError

    async def list_kernels(self) -> list[dict]:
        raise NotImplementedError

    async def kernel_logs(self, kernel_id: str) -> str | None:
        """The tail of the kernel's output; None when the agent does not know the kernel."""
        raise NotImplementedError

    async def image_info(self, name: str) -> dict:
        raise NotImplementedError

    async def list_images(self) -> list[dict]:
        raise NotImplementedError


class InProcessAgentClient(AgentClient):
    def __init__(self, agent):
        self.agent = agent

    async def create_kernel(self, spec):
        return await self.agent.create_kernel(spec)

    async def destroy_kernel(self, kernel_id):
        await self.agent.destroy_kernel(kernel_id)

    async def list_kernels(self):
        return await self.agent.list_kernels()

    async def kernel_logs(self, kernel_id):
        return await self.agent.kernel_logs(kernel_id)

    async def image_info(self, name):
        info = await self.agent.image_info(name)
        return {"name": info.name, "labels": info.labels}

    async def list_images(self):
        return [{"name": i.name, "labels": i.labels} for i in await self.agent.list_images()]


_ERRORS = {"ImageNotFound": ImageNotFound, "InvalidRequest": InvalidRequest, "NotFound": NotFound}


class HTTPAgentClient(AgentClient):
    """Talks to the agent daemon's small JSON API, authenticated with a shared token."""

    def __init__(self, addr: str, token: str, timeout: float = 120):
        self.base = addr.rstrip("/")
        self.token = token
        self.timeout = timeout

    async def _call(self, method: str, path: str, body=None):
        req = HTTPRequest(
            self.base + path,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            body=json.dumps(body) if body is not None else None,
            request_timeout=self.timeout,
            allow_nonstandard_methods=True,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            detail = ""
            kind = ""
            if e.response is not None and e.response.body:
                try:
                    data = json.loads(e.response.body)
                    detail, kind = data.get("detail", ""), data.get("type", "")
                except ValueError:
                    detail = e.response.body.decode(errors="replace")
            raise _ERRORS.get(kind, AgentError)(detail or str(e)) from None
        except OSError as e:
            raise AgentError(f"agent at {self.base} unreachable: {e}") from None
        return json.loads(resp.body) if resp.body else None

    async def create_kernel(self, spec):
        return await self._call("POST", "/v1/kernels", spec)

    async def destroy_kernel(self, kernel_id):
        await self._call("DELETE", f"/v1/kernels/{kernel_id}")

    async def list_kernels(self):
        return await self._call("GET", "/v1/kernels")

    async def kernel_logs(self, kernel_id):
        try:
            return (await self._call("GET", f"/v1/kernels/{kernel_id}/logs"))["logs"]
        except NotFound:
            return None

    async def image_info(self, name):
        return await self._call("POST", "/v1/images/inspect", {"name": name})

    async def list_images(self):
        return await self._call("GET", "/v1/images")
