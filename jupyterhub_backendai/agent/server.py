"""``backendai-agent``: the agent as its own daemon (cluster mode).

It serves a small JSON API for the manager (create/destroy/list kernels, images),
authenticated with a shared token, and publishes heartbeats and kernel events on
the Redis event bus.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import signal

from tornado import web
from traitlets import Integer, Unicode, default
from traitlets.config import Application

from ..common.errors import BackendAIError
from ..common.events import make_event_bus
from .core import Agent


class _Handler(web.RequestHandler):
    def prepare(self):
        token = self.settings["token"]
        got = self.request.headers.get("Authorization", "")
        if not token or not hmac.compare_digest(got, f"Bearer {token}"):
            raise web.HTTPError(401)

    @property
    def agent(self) -> Agent:
        return self.settings["agent"]

    def write_json(self, data, status=200):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def write_error(self, status_code, **kw):
        exc = kw.get("exc_info", (None, None))[1]
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"type": type(exc).__name__, "detail": str(exc) if exc else ""}))

    def body(self):
        return json.loads(self.request.body or b"{}")

    async def _guard(self, coro):
        try:
            return await coro
        except BackendAIError as e:
            self.set_status(e.status_code)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"type": type(e).__name__, "detail": e.detail}))
            return None


class KernelsHandler(_Handler):
    async def get(self):
        self.write_json(await self.agent.list_kernels())

    async def post(self):
        rec = await self._guard(self.agent.create_kernel(self.body()))
        if rec is not None:
            self.write_json(rec, 201)


class KernelHandler(_Handler):
    async def delete(self, kernel_id):
        await self.agent.destroy_kernel(kernel_id)
        self.set_status(204)
        self.finish()


class KernelLogsHandler(_Handler):
    async def get(self, kernel_id):
        logs = await self._guard(self.agent.kernel_logs(kernel_id))
        if logs is None and not self._finished:
            self.write_json({"type": "NotFound", "detail": f"no kernel {kernel_id}"}, 404)
        elif logs is not None:
            self.write_json({"logs": logs})


class ImagesHandler(_Handler):
    async def get(self):
        self.write_json([{"name": i.name, "labels": i.labels} for i in await self.agent.list_images()])


class ImageInspectHandler(_Handler):
    async def post(self):
        info = await self._guard(self.agent.image_info(self.body()["name"]))
        if info is not None:
            self.write_json({"name": info.name, "labels": info.labels})


class InfoHandler(_Handler):
    async def get(self):
        self.write_json(self.agent.info())


def make_app(agent: Agent, token: str) -> web.Application:
    return web.Application(
        [
            (r"/v1/info", InfoHandler),
            (r"/v1/kernels", KernelsHandler),
            (r"/v1/kernels/([0-9a-f]+)", KernelHandler),
            (r"/v1/kernels/([0-9a-f]+)/logs", KernelLogsHandler),
            (r"/v1/images", ImagesHandler),
            (r"/v1/images/inspect", ImageInspectHandler),
        ],
        agent=agent,
        token=token,
    )


class AgentApp(Application):
    name = "backendai-agent"
    description = "Run kernels for jupyterhub-backendai on this node."
    config_file = Unicode("", help="Config file to load.").tag(config=True)
    listen_host = Unicode("127.0.0.1", help="Address the agent API listens on.").tag(config=True)
    listen_port = Integer(6001, help="Port the agent API listens on.").tag(config=True)
    redis_url = Unicode(
        os.environ.get("BACKENDAI_REDIS_URL", ""),
        help="Redis URL of the event bus shared with the managers.",
    ).tag(config=True)
    token = Unicode(
        help="Shared secret the manager presents (env BACKENDAI_AGENT_TOKEN).",
    ).tag(config=True)

    @default("token")
    def _token_default(self):
        # Read when first used, not at import: `--help-all` must not print the secret.
        return os.environ.get("BACKENDAI_AGENT_TOKEN", "")
    aliases = {
        "config": "AgentApp.config_file",
        "port": "AgentApp.listen_port",
        "host": "AgentApp.listen_host",
        "redis": "AgentApp.redis_url",
        "backend": "Agent.backend",
        "id": "Agent.agent_id",
        "resource-group": "Agent.resource_group",
        "state-dir": "Agent.state_dir",
    }
    classes = [Agent]

    def initialize(self, argv=None):
        super().initialize(argv)
        if self.config_file:
            self.load_config_file(self.config_file)

    async def run(self):
        if not self.token:
            raise SystemExit("backendai-agent: set a token (BACKENDAI_AGENT_TOKEN or --AgentApp.token)")
        if not self.redis_url:
            raise SystemExit("backendai-agent: set the event bus (--redis or BACKENDAI_REDIS_URL)")
        bus = make_event_bus(self.redis_url)
        agent = Agent(bus, parent=self)
        addr = f"http://{self.listen_host}:{self.listen_port}"
        agent.addr = addr
        app = make_app(agent, self.token)
        server = app.listen(self.listen_port, self.listen_host)
        await agent.start()
        self.log.info("backendai-agent %s listening on %s", agent.agent_id, addr)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.stop()
        await agent.stop()
        await bus.close()


def main(argv=None):
    logging.basicConfig(level=logging.INFO)
    app = AgentApp()
    app.initialize(argv)
    asyncio.run(app.run())
