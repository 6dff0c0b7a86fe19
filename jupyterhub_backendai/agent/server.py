"""``backendai-agent``: the agent as its own daemon (cluster mode).

It serves a small JSON API for the manager (create/destroy/list kernels, images)
on the nodes' shared base (``common/httpbase.py``: mutual TLS with the cluster CA,
problem+json errors; a shared token only in the deprecated mode without TLS),
publishes heartbeats and kernel events on the Redis event bus and, with etcd,
registers itself under a lease (``common/etcdreg.py``) so that the hubs learn
that it joined, and that it left when the lease expires.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal

from tornado import web
from tornado.iostream import StreamClosedError
from traitlets import Float, Integer, Unicode, default
from traitlets.config import Application

from ..common.errors import BackendAIError, InvalidRequest, NotFound, ServiceUnavailable
from ..common.etcdreg import AgentRegistration
from ..common.events import make_event_bus
from ..common.httpbase import NodeAuth, NodeAuthConfig, NodeHandler, NotFoundHandler, listen
from .core import Agent


class _Handler(NodeHandler):
    @property
    def agent(self) -> Agent:
        return self.settings["agent"]

    def body(self):
        try:
            data = json.loads(self.request.body or b"{}")
        except ValueError as e:
            raise InvalidRequest(f"the body is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise InvalidRequest("the body must be a JSON object")
        return data

    async def _guard(self, coro):
        try:
            return await coro
        except BackendAIError as e:
            self.problem(e)
            return None


class KernelsHandler(_Handler):
    async def get(self):
        self.write_json(await self.agent.list_kernels())

    async def post(self):
        rec = await self._guard(self.agent.create_kernel(self.body()))
        if rec is not None:
            self.write_json(rec, 201)


class KernelBindHandler(_Handler):
    async def post(self, kernel_id):
        """Issue 30: bind the pooled kernel to the session of the spec (the body)."""
        spec = self.body()
        if spec.get("kernel_id") != kernel_id:
            self.problem(InvalidRequest("the spec's kernel_id is not the kernel of the path"))
            return
        rec = await self._guard(self.agent.bind_kernel(spec))
        if rec is not None:
            self.write_json(rec)


class KernelHandler(_Handler):
    async def delete(self, kernel_id):
        await self.agent.destroy_kernel(kernel_id)
        self.set_status(204)
        self.finish()


class KernelLogsHandler(_Handler):
    async def get(self, kernel_id):
        logs = await self._guard(self.agent.kernel_logs(kernel_id))
        if logs is None and not self._finished:
            self.problem(NotFound(f"no kernel {kernel_id}"))
        elif logs is not None:
            self.write_json({"logs": logs})


class KernelSSHKeyHandler(_Handler):
    async def post(self, kernel_id):
        """Issue 22: withdraw the SSH key of keypair ``access_key`` (the body) from the kernel."""
        access_key = self.body().get("access_key")
        if not isinstance(access_key, str):
            self.problem(InvalidRequest("access_key (a string) is required"))
            return
        done = await self._guard(self.agent.revoke_ssh_key(kernel_id, access_key))
        if done is not None:
            self.write_json(done)


class KernelCommitHandler(_Handler):
    async def post(self, kernel_id):
        """Issue 27: write the running kernel to image ``ref`` and push it (``auth``: the
        registry's credentials, as a pull takes them)."""
        body = self.body()
        ref, auth = body.get("ref"), body.get("auth")
        if not isinstance(ref, str) or not (auth is None or isinstance(auth, dict)):
            self.problem(InvalidRequest("ref (a string) is required; auth is an object"))
            return
        done = await self._guard(self.agent.commit_kernel(kernel_id, ref, auth))
        if done is not None:
            self.write_json(done)


class ImagesHandler(_Handler):
    async def get(self):
        self.write_json([{"name": i.name, "labels": i.labels} for i in await self.agent.list_images()])


class ImageInspectHandler(_Handler):
    async def post(self):
        info = await self._guard(self.agent.image_info(self.body()["name"]))
        if info is not None:
            self.write_json({"name": info.name, "labels": info.labels})


class ImagePullHandler(_Handler):
    async def post(self):
        """Issue 25: pull an image when missing (``{"name", "auth", "policy"}``, and
        ``"session_id"``: the session whose network is made meanwhile). The
        answer is a stream of JSON lines: ``{"progress": {...}}`` while it pulls, then
        ``{"pulled": bool}`` or ``{"error": {"type", "detail"}}``."""
        body = self.body()
        name, auth, sid = body.get("name"), body.get("auth"), body.get("session_id")
        if not isinstance(name, str) or not (auth is None or isinstance(auth, dict)) \
                or not (sid is None or (isinstance(sid, str) and 0 < len(sid) <= 64)):
            self.problem(InvalidRequest("name (a string) is required; auth is an object; "
                                        "session_id a string"))
            return
        queue: asyncio.Queue = asyncio.Queue()
        pull = asyncio.ensure_future(self.agent.pull_image(
            name, auth, body.get("policy") or "tag", queue.put_nowait, sid))
        self.set_header("Content-Type", "application/x-ndjson")
        while not pull.done() or not queue.empty():
            if queue.empty():
                got = asyncio.ensure_future(queue.get())
                await asyncio.wait({pull, got}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    got.cancel()
                    continue
                progress = got.result()
            else:
                progress = queue.get_nowait()
            self.write(json.dumps({"progress": progress}) + "\n")
            try:
                await self.flush()
            except StreamClosedError:
                pull.cancel()
                return
        try:
            self.write(json.dumps({"pulled": pull.result()}) + "\n")
        except BackendAIError as e:
            self.write(json.dumps({"error": {"type": type(e).__name__, "detail": e.detail}}) + "\n")
        self.finish()


class InfoHandler(_Handler):
    async def get(self):
        if self.settings.get("stopping"):
            # The hub's second witness (a direct call) must not keep a stopping agent
            # ALIVE once its etcd registration is gone.
            self.problem(ServiceUnavailable("this agent is stopping"))
            return
        self.write_json(self.agent.info())


class ResourceGroupHandler(_Handler):
    async def put(self):
        """Issue 29: the manager moves this agent to another resource group
        (``{"name"}``); the answer is the agent's info after."""
        info = await self._guard(self.agent.set_resource_group(self.body().get("name")))
        if info is not None:
            self.write_json(info)


def make_app(agent: Agent, auth: NodeAuth | str) -> web.Application:
    if isinstance(auth, str):
        auth = NodeAuth(token=auth)
    return web.Application(
        [
            (r"/v1/info", InfoHandler),
            (r"/v1/resource-group", ResourceGroupHandler),
            (r"/v1/kernels", KernelsHandler),
            (r"/v1/kernels/([0-9a-f]+)", KernelHandler),
            (r"/v1/kernels/([0-9a-f]+)/logs", KernelLogsHandler),
            (r"/v1/kernels/([0-9a-f]+)/bind", KernelBindHandler),
            (r"/v1/kernels/([0-9a-f]+)/revoke-ssh-key", KernelSSHKeyHandler),
            (r"/v1/kernels/([0-9a-f]+)/commit", KernelCommitHandler),
            (r"/v1/images", ImagesHandler),
            (r"/v1/images/inspect", ImageInspectHandler),
            (r"/v1/images/pull", ImagePullHandler),
        ],
        default_handler_class=NotFoundHandler,
        agent=agent,
        auth=auth,
    )


class AgentApp(NodeAuthConfig, Application):
    name = "backendai-agent"
    token_env = "BACKENDAI_AGENT_TOKEN"
    description = "Run kernels for jupyterhub-backendai on this node."
    config_file = Unicode("", help="Config file to load.").tag(config=True)
    listen_host = Unicode("127.0.0.1", help="Address the agent API listens on.").tag(config=True)
    listen_port = Integer(6001, help="Port the agent API listens on.").tag(config=True)
    redis_url = Unicode(
        help="""Redis URL of the event bus shared with the managers (env
        BACKENDAI_REDIS_URL; it may hold a password).""",
    ).tag(config=True)

    @default("redis_url")
    def _redis_url_default(self):
        # Read when first used, not at import: `--help-all` must not print a password.
        return os.environ.get("BACKENDAI_REDIS_URL", "")

    advertise_addr = Unicode(
        "",
        help="""URL the managers reach this agent's API at (registered in etcd and
        sent in heartbeats). Default: http(s)://<listen_host>:<listen_port>.""",
    ).tag(config=True)
    etcd_url = Unicode(
        help="""etcd endpoint (http://host:port) to register this agent in, under a
        lease (env BACKENDAI_ETCD_URL). Empty: no registration; the managers learn
        of the agent from its heartbeats only.""",
    ).tag(config=True)

    @default("etcd_url")
    def _etcd_url_default(self):
        return os.environ.get("BACKENDAI_ETCD_URL", "")

    etcd_prefix = Unicode(
        "/backendai", help="Key prefix of this cluster in etcd (docs/cluster.md)."
    ).tag(config=True)
    etcd_lease_ttl = Float(
        10.0,
        help="""Seconds the agent's etcd registration outlives the agent: it is
        refreshed every third of this; once the agent dies, the managers see it
        leave within this time.""",
    ).tag(config=True)

    aliases = {
        "config": "AgentApp.config_file",
        "port": "AgentApp.listen_port",
        "host": "AgentApp.listen_host",
        "redis": "AgentApp.redis_url",
        "etcd": "AgentApp.etcd_url",
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
        try:
            auth = self.node_auth()
        except ValueError as e:
            raise SystemExit(f"backendai-agent: {e}") from None
        tls = auth.tls
        if not self.redis_url:
            raise SystemExit("backendai-agent: set the event bus (--redis or BACKENDAI_REDIS_URL)")
        bus = make_event_bus(self.redis_url)
        agent = Agent(bus, parent=self)
        scheme = "https" if tls else "http"
        addr = self.advertise_addr or f"{scheme}://{self.listen_host}:{self.listen_port}"
        agent.addr = addr
        app = make_app(agent, auth)
        server = listen(app, self.listen_port, self.listen_host, auth)
        await agent.start()
        registration = None
        if self.etcd_url:

            async def describe():
                info = agent.info()
                info["images"] = sorted(i.name for i in await agent.list_images())
                return info

            registration = AgentRegistration(
                self.etcd_url, self.etcd_prefix, agent.agent_id, describe, ttl=self.etcd_lease_ttl
            )
            await registration.start()
            agent.on_regroup.append(registration.update)
        self.log.info("backendai-agent %s listening on %s", agent.agent_id, addr)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        app.settings["stopping"] = True  # /v1/info says so before the registration goes
        if registration is not None:
            await registration.stop()  # leave at once, not after the lease's TTL
        server.stop()
        await agent.stop()
        await bus.close()


def main(argv=None):
    logging.basicConfig(level=logging.INFO)
    app = AgentApp()
    app.initialize(argv)
    asyncio.run(app.run())
