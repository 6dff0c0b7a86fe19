"""Node-to-node calls are mutually authenticated (issue 11): an agent daemon and a
storage proxy daemon with certificates from the cluster CA (made by the documented
command) refuse a caller without a client certificate, with one from another CA,
with the old shared token, and with a node's certificate that is not the hub's;
a hub with its certificate starts a session on the agent and makes a folder on the
storage proxy."""

from __future__ import annotations

import asyncio
import os
import ssl
import sys
import uuid

import aiohttp
import pytest

from jupyterhub_backendai.common.errors import AgentError, Forbidden
from jupyterhub_backendai.common.httpbase import TLSFiles
from jupyterhub_backendai.manager.agent_client import HTTPAgentClient, close_agent_clients
from jupyterhub_backendai.storageproxy.client import HTTPStorageClient

from .cluster_nodes import AgentDaemon, TLSStorageDaemon, make_certs
from .inproc import assert_consistent, make_user, occupied, running_manager, wait_status
from .services import agent_id as new_agent_id


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, redis_server):
    root = tmp_path_factory.mktemp("nodeauth")
    certs = make_certs(root / "pki", "agent1", "storage1")
    rogue = make_certs(root / "rogue-pki")  # another CA, a certificate named "hub"
    bus = redis_server.fresh_url()
    agent = AgentDaemon(root / "agent1", new_agent_id("tls"), bus, certs["agent1"])
    storage = TLSStorageDaemon(root / "storage1", certs["storage1"])
    os.makedirs(storage.root, exist_ok=True)
    agent.start()
    storage.start()
    try:
        yield {"certs": certs, "rogue": rogue, "agent": agent, "storage": storage, "bus": bus, "root": root}
    finally:
        agent.stop()
        storage.stop()


def _ctx(ca: str, files: dict | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if files:
        ctx.load_cert_chain(files["cert"], files["key"])
    return ctx


async def _get(url: str, ctx, headers=None) -> tuple[int, dict] | str:
    """The status and problem body, or the name of the error when no answer came."""
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            async with s.get(url, headers=headers or {}) as r:
                return r.status, await r.json(content_type=None)
    except (aiohttp.ClientError, ssl.SSLError) as e:
        return type(e).__name__


@pytest.mark.parametrize("node", ["agent", "storage"])
def test_unauthenticated_and_wrong_callers_are_refused(cluster, node):
    certs, rogue = cluster["certs"], cluster["rogue"]
    daemon = cluster[node]
    path = "/v1/kernels" if node == "agent" else "/v1/volumes"
    url = daemon.url + path
    ca = certs["hub"]["ca"]

    async def run():
        # no client certificate: the TLS handshake fails, no answer
        got = await _get(url, _ctx(ca))
        assert isinstance(got, str) and got in ("ClientOSError", "ClientConnectorError",
                                                "ServerDisconnectedError", "ClientSSLError",
                                                "ClientConnectorSSLError", "SSLError"), got
        # the old shared token, without a certificate: refused the same way
        got = await _get(url, _ctx(ca), {"Authorization": "Bearer anything"})
        assert isinstance(got, str), got
        # a certificate named "hub" from another CA: refused in the handshake
        got = await _get(url, _ctx(ca, rogue["hub"]))
        assert isinstance(got, str), got
        # plain HTTP with a token: the daemon speaks only TLS
        got = await _get(url.replace("https:", "http:"), None, {"Authorization": "Bearer x"})
        assert isinstance(got, str) or got[0] == 400, got
        # a certificate of the cluster CA that is not the hub's (a node's): 403 problem+json
        other = certs["storage1" if node == "agent" else "agent1"]
        status, body = await _get(url, _ctx(ca, other))
        assert status == 403 and body["error"] == "Forbidden" and body["status"] == 403
        assert "may not call this node (allowed: hub)" in body["detail"]
        # the hub's certificate: served
        status, _body = await _get(url, _ctx(ca, certs["hub"]))
        assert status == 200

    asyncio.run(run())


def test_hub_clients_refused_without_the_right_certificate(cluster):
    """The hub's own clients with a wrong identity get a clear error and change nothing."""
    certs = cluster["certs"]
    scope, folder = f"user:{uuid.uuid4().hex}", uuid.uuid4().hex
    vol = cluster["storage"].volumes["volume1"]["path"]

    async def run():
        as_agent = TLSFiles(**{k: certs["agent1"][k] for k in ("cert", "key", "ca")})
        storage = HTTPStorageClient(cluster["storage"].url, tls=as_agent)
        try:
            with pytest.raises(Forbidden):
                await storage.create_folder("volume1", scope, folder)
        finally:
            await storage.close()
        assert not os.path.exists(os.path.join(vol, "user", scope[5:]))
        agent = HTTPAgentClient(cluster["agent"].url, tls=as_agent)
        with pytest.raises(AgentError) as e:
            await agent.list_kernels()
        assert "may not call this node" in e.value.detail
        rogue = cluster["rogue"]["hub"]
        agent = HTTPAgentClient(cluster["agent"].url, tls=TLSFiles(**rogue))
        with pytest.raises(AgentError) as e:
            await agent.list_kernels()
        assert "unreachable" in e.value.detail
        await close_agent_clients()

    asyncio.run(run())


def test_hub_works_with_the_cluster_certificates(cluster, tmp_path):
    """End to end: the manager (its certificate from the documented command) runs a
    two-node session on its embedded agent and the TLS agent daemon, and makes a
    folder on the TLS storage proxy."""
    certs, agent, storage = cluster["certs"], cluster["agent"], cluster["storage"]

    def cluster_mode(c):
        c.BackendAIManager.redis_url = cluster["bus"]
        c.BackendAICluster.tls = certs["hub"]
        c.BackendAIManager.storage_proxies = {"storage1": {"url": storage.url}}

    async def run():
        from .test_multikernel import _run_cluster

        async with running_manager(f"sqlite:///{tmp_path}/tls.sqlite", tmp_path, "local",
                                   slots={"cpu": 1, "mem": "2g"}, configure=cluster_mode) as mgr:
            for _ in range(400):  # the daemon's heartbeat registers it
                if agent.agent_id in await occupied(mgr):
                    break
                await asyncio.sleep(0.05)
            assert agent.agent_id in await occupied(mgr)
            user = await make_user(mgr, max_containers=2)
            sid, sess = await _run_cluster(mgr, "local", user, "multi-node", "1")
            assert {k.agent_id for k in sess.kernels} == {mgr.agent.agent_id, agent.agent_id}
            scope, folder = f"user:{uuid.uuid4().hex}", uuid.uuid4().hex
            await mgr.storage.create_folder("storage1:volume1", scope, folder)
            path = await mgr.storage.mount_path("storage1:volume1", scope, folder)
            assert os.path.isdir(path) and path.startswith(storage.volumes["volume1"]["path"])
            assert "storage1:volume1" in await mgr.storage.hosts()
            await mgr.destroy_session(sid)
            sess = await wait_status(mgr, sid, ("TERMINATED", "ERROR", "CANCELLED"))
            assert await occupied(mgr) == {mgr.agent.agent_id: {}, agent.agent_id: {}}
            assert_consistent(mgr)

    asyncio.run(run())


def test_certs_command_keeps_the_ca_and_adds_nodes(tmp_path):
    import subprocess

    a = make_certs(tmp_path, "agent1")
    ca = open(a["hub"]["ca"]).read()
    b = make_certs(tmp_path, "agent2")
    assert open(b["hub"]["ca"]).read() == ca  # run again: the same CA, a node added
    assert os.stat(b["agent2"]["key"]).st_mode & 0o777 == 0o600
    for n in ("hub", "agent2"):
        r = subprocess.run(["openssl", "verify", "-CAfile", b[n]["ca"], b[n]["cert"]],
                           capture_output=True, text=True)
        assert r.stdout.strip() == f"{b[n]['cert']}: OK"
    r = subprocess.run([sys.executable, "-m", "jupyterhub_backendai.common.certs", str(tmp_path),
                        "--node", "../evil"], capture_output=True, text=True)
    assert r.returncode == 2 and "not '../evil'" in r.stderr
