"""Agents are cluster nodes (issue 11): ``backendai-agent`` registers in a real etcd
under a lease, the hub learns the join through etcd (not a heartbeat: the daemon's
Redis bus is not the hub's), a ``kill -9`` is noticed once the lease expires, an
etcd restarted (with and without its data) gets the agent's registration again,
and storage proxies come from the cluster's configuration in etcd."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

import pytest
from sqlalchemy import select

from jupyterhub_backendai.common.etcdreg import agent_key
from jupyterhub_backendai.manager.access import Principal
from jupyterhub_backendai.models import Agent

from .cluster_nodes import AgentDaemon, RestartableEtcd, TLSStorageDaemon, make_certs
from .inproc import running_manager
from .services import agent_id as new_agent_id

TTL = 3.0
ROOT = Principal(user_id="root", username="root", email="root@example.com", role="superadmin",
                 domain="default")


async def _agents(mgr) -> dict[str, tuple[str, str]]:
    def work(s):
        return {a.id: (a.status, a.addr) for a in s.scalars(select(Agent))}

    return await mgr.db(work)


async def _until(cond, timeout: float):
    """Poll ``cond`` (a bound for hangs; the times asserted are the lease's own)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await cond():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


def test_agent_joins_and_leaves_through_etcd(redis_server, tmp_path):
    etcd = RestartableEtcd()
    etcd.start()
    certs = make_certs(tmp_path / "pki", "agent1", "storage1")
    # The daemon's event bus is another Redis database than the hub's: the hub can
    # learn of it only through etcd.
    hub_bus = redis_server.fresh_url()
    agent = AgentDaemon(tmp_path / "agent1", new_agent_id("etcd"), redis_server.fresh_url(),
                        certs["agent1"], etcd_url=etcd.url, lease_ttl=TTL)
    storage = TLSStorageDaemon(tmp_path / "storage1", certs["storage1"])
    etcd.put("/backendai/config/storage-proxies/nfs1", {"url": storage.url})
    storage.start()
    key = agent_key("/backendai", agent.agent_id).decode()

    def cluster_mode(c):
        c.BackendAIManager.redis_url = hub_bus
        c.BackendAICluster.tls = certs["hub"]
        c.BackendAICluster.etcd_url = etcd.url

    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/etcd.sqlite", tmp_path, "local",
                                   slots={"cpu": 1, "mem": "2g"}, configure=cluster_mode) as mgr:
            changes = []
            mgr.cluster.subscribe(lambda kind, aid, info: _record(changes, kind, aid))
            # storage proxies and their volumes from etcd
            assert "nfs1:volume1" in await mgr.storage.hosts()
            scope, folder = f"user:{uuid.uuid4().hex}", uuid.uuid4().hex
            await mgr.storage.create_folder("nfs1:volume1", scope, folder)

            agent.start()

            async def alive():
                return (await _agents(mgr)).get(agent.agent_id, ("", ""))[0] == "ALIVE"

            assert await _until(alive, 60), agent.tail()
            assert (await _agents(mgr))[agent.agent_id] == ("ALIVE", agent.url)
            reg = etcd.get_prefix(key)[key]
            assert reg["id"] == agent.agent_id and reg["addr"] == agent.url
            assert reg["resource_group"] == "default" and reg["images"] == ["local/python"]
            # Listeners hear of the join after the record says ALIVE.
            assert await _until(lambda: _at_least(changes, 1), 10), changes
            assert changes == [("join", agent.agent_id)]

            # etcd killed and started again with its data, then without: the agent
            # registers again; the hub follows.
            for wipe in (False, True):
                regs = mgr.cluster.resyncs
                etcd.kill()
                etcd.start(wipe=wipe)

                async def back(regs=regs):
                    return key in etcd.get_prefix(key) and mgr.cluster.resyncs > regs and await alive()

                assert await _until(back, 60), (wipe, agent.tail())
                assert mgr.cluster.agents[agent.agent_id]["addr"] == agent.url
                # Missing from a wiped etcd until it registered again is not a leave:
                # the agent never went LOST (its sessions were never in doubt).
                assert ("leave", agent.agent_id) not in changes, (wipe, changes)

            # kill -9: the lease expires, the hub marks the agent LOST
            changes.clear()
            agent.kill()
            loop = asyncio.get_running_loop()
            t0 = loop.time()

            async def lost():
                return (await _agents(mgr))[agent.agent_id][0] == "LOST"

            assert await _until(lost, 60)
            noticed = loop.time() - t0
            assert noticed <= TTL + 5, noticed
            # The record says LOST first, then the listeners hear of it: a loaded machine
            # can show the one before the other.

            async def heard():
                return bool(changes)

            assert await _until(heard, 10), changes
            assert changes == [("leave", agent.agent_id)]
            assert key not in etcd.get_prefix(key)

    try:
        asyncio.run(run())
    finally:
        agent.stop()
        storage.stop()
        etcd.stop()


@pytest.mark.parametrize("own_registration", [True, False], ids=["registers", "registered"])
def test_a_registration_vouched_for_late_is_still_a_join(redis_server, tmp_path, own_registration):
    """A registration whose agent does not answer yet (here: written before the daemon
    listens, as a stale one of a restarting agent would be) is no join. Once the agent
    answers, it joins, and listeners hear that once: through its own registration
    (``registers``), or, where it writes none, through the hub asking again while the
    registration stands (``registered``; the agent's event bus is not the hub's, so no
    heartbeat can do it). CI once saw an agent recorded ALIVE without a join: the first
    registration's direct call had failed."""
    etcd, certs, agent = _etcd_and_agent(redis_server, tmp_path, "late", own_registration)
    key = agent_key("/backendai", agent.agent_id).decode()

    async def run():
        async with _hub_seeing_a_written_registration(redis_server, tmp_path, certs, etcd,
                                                      agent) as (mgr, changes):
            assert agent.agent_id not in await _agents(mgr) and changes == []

            agent.start()

            async def alive():
                return (await _agents(mgr)).get(agent.agent_id, ("", ""))[0] == "ALIVE"

            assert await _until(alive, 60), agent.tail()

            async def heard():
                return bool(changes)

            assert await _until(heard, 10), changes
            if own_registration:
                # Its own registration (under its lease) replaced the hand-written one:
                # the hub may have vouched for either first.
                async def own():
                    return "version" in etcd.get_prefix(key).get(key, {})

                assert await _until(own, 60), agent.tail()
            assert changes == [("join", agent.agent_id)]

            agent.stop()  # its lease revoked: the key goes, the agent does not answer
            if not own_registration:
                etcd.delete(key)

            async def lost():
                return (await _agents(mgr))[agent.agent_id][0] == "LOST"

            assert await _until(lost, 60)
            assert await _until(lambda: _at_least(changes, 2), 10), changes
            assert changes == [("join", agent.agent_id), ("leave", agent.agent_id)]

    try:
        asyncio.run(run())
    finally:
        agent.stop()
        etcd.stop()


def test_a_registration_gone_before_its_agent_answers_is_not_asked_again(redis_server, tmp_path):
    """The hub asks again only while the registration it could not vouch for stands:
    one removed before its agent answered (a stale key the operator deleted) is
    forgotten, and the agent, listening later but registering nowhere, is never
    recorded nor heard of (its event bus is not the hub's)."""
    etcd, certs, agent = _etcd_and_agent(redis_server, tmp_path, "gone", registers=False)
    key = agent_key("/backendai", agent.agent_id).decode()

    async def run():
        async with _hub_seeing_a_written_registration(redis_server, tmp_path, certs, etcd,
                                                      agent) as (mgr, changes):
            etcd.delete(key)

            async def forgotten():
                return agent.agent_id not in mgr.cluster.agents

            assert await _until(forgotten, 30)
            agent.start()
            # longer than the longest wait between two tries, and the first try's
            await asyncio.sleep(mgr.cluster.REVOUCH_MAX + 2)
            assert agent.agent_id not in await _agents(mgr) and changes == []

    try:
        asyncio.run(run())
    finally:
        agent.stop()
        etcd.stop()


@contextlib.asynccontextmanager
async def _hub_seeing_a_written_registration(redis_server, tmp_path, certs, etcd, agent):
    """A hub in cluster mode, with the list its join and leave listeners write to, once
    it has seen a registration of ``agent`` written by hand (no lease; the daemon is not
    started, so nothing vouches for it)."""
    async with running_manager(f"sqlite:///{tmp_path}/hub.sqlite", tmp_path, "local",
                               slots={"cpu": 1, "mem": "2g"},
                               configure=_hub_config(redis_server, certs, etcd)) as mgr:
        changes = []
        mgr.cluster.subscribe(lambda kind, aid, info: _record(changes, kind, aid))
        etcd.put(agent_key("/backendai", agent.agent_id).decode(),
                 {"id": agent.agent_id, "addr": agent.url, "resource_group": "default"})

        async def seen():
            return agent.agent_id in mgr.cluster.agents

        assert await _until(seen, 30)
        yield mgr, changes


async def _at_least(changes, n):
    return len(changes) >= n


async def _record(changes, kind, aid):
    changes.append((kind, aid))


def test_registration_value_is_json(tmp_path):
    """The documented key layout: agents' keys under <prefix>/nodes/agents/."""
    assert agent_key("/backendai/", "i-1") == b"/backendai/nodes/agents/i-1"
    assert json.loads(json.dumps({"id": "i-1"})) == {"id": "i-1"}


def test_an_agent_daemon_moved_to_another_group_keeps_it(redis_server, tmp_path):
    """Issue 29 in cluster mode: the manager moves a ``backendai-agent`` daemon to another
    resource group over its mutual-TLS API (``PUT /v1/resource-group``); the daemon says
    so in its etcd registration at once, the record follows, and a restarted daemon
    still belongs there (its state directory wins over its configuration)."""
    from jupyterhub_backendai.models import ResourceGroup

    etcd, certs, agent = _etcd_and_agent(redis_server, tmp_path, "move")
    key = agent_key("/backendai", agent.agent_id).decode()
    cluster_mode = _hub_config(redis_server, certs, etcd)

    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/move.sqlite", tmp_path, "local",
                                   slots={"cpu": 1, "mem": "2g"}, configure=cluster_mode) as mgr:
            await mgr.db(lambda s: s.add(ResourceGroup(name="gpu", is_active=True,
                                                      is_public=True)))
            agent.start()

            async def group_is(name):
                rows = await mgr.db(lambda s: {a.id: (a.status, a.resource_group)
                                               for a in s.scalars(select(Agent))})
                return rows.get(agent.agent_id) == ("ALIVE", name)

            assert await _until(lambda: group_is("default"), 60), agent.tail()
            await mgr.agents.move(ROOT, agent.agent_id, "gpu")
            # The registration says it at once (not only at the next lease).
            assert etcd.get_prefix(key)[key]["resource_group"] == "gpu"
            await mgr.ops.update_agent(ROOT, agent.agent_id, {"resource_group": "gpu"})
            assert await group_is("gpu")
            agent.stop()
            agent.start()
            assert await _until(lambda: _registered_in(etcd, key, "gpu"), 60), agent.tail()

            async def hub_saw_it():  # the hub read the restarted daemon's registration
                return mgr.cluster.agents.get(agent.agent_id, {}).get("resource_group") == "gpu"

            assert await _until(hub_saw_it, 60), agent.tail()
            assert await group_is("gpu"), agent.tail()

    try:
        asyncio.run(run())
    finally:
        agent.stop()
        etcd.stop()


def _etcd_and_agent(redis_server, tmp_path, name: str, registers: bool = True):
    """A started etcd, the cluster's certificates, and a ``backendai-agent`` daemon (not
    yet started) registering there (unless not ``registers``), on a Redis database of
    its own."""
    etcd = RestartableEtcd()
    etcd.start()
    certs = make_certs(tmp_path / "pki", "agent1")
    agent = AgentDaemon(tmp_path / "agent1", new_agent_id(name), redis_server.fresh_url(),
                        certs["agent1"], etcd_url=etcd.url if registers else "", lease_ttl=TTL)
    return etcd, certs, agent


def _hub_config(redis_server, certs, etcd, **manager):
    """The hub's configuration in cluster mode: a Redis database that is not the agent's
    (it learns of agents through etcd only), the hub's certificate, ``manager`` settings."""
    bus = redis_server.fresh_url()

    def configure(c):
        c.BackendAIManager.redis_url = bus
        for name, value in manager.items():
            setattr(c.BackendAIManager, name, value)
        c.BackendAICluster.tls = certs["hub"]
        c.BackendAICluster.etcd_url = etcd.url

    return configure


async def _registered_in(etcd, key, group) -> bool:
    reg = etcd.get_prefix(key).get(key)
    return bool(reg) and reg["resource_group"] == group


def test_the_first_agent_to_join_fills_a_fresh_catalogue(redis_server, tmp_path):
    """Issue 25, the catalogue enforced by default: a hub with no agent of its own whose
    catalogue is empty catalogues the images of the first agent daemon that joins
    (through etcd), at the join, with no admin's rescan and no request, so that the
    images the node holds can start."""
    etcd, certs, agent = _etcd_and_agent(redis_server, tmp_path, "cat")
    cluster_mode = _hub_config(redis_server, certs, etcd, embedded_agent=False)

    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/cat.sqlite", tmp_path, "local",
                                   configure=cluster_mode) as mgr:
            assert mgr.image_catalogue and not mgr.local_agents
            assert await mgr.ops.list_catalogue(ROOT, True) == []
            agent.start()

            # Catalogued, and the first catalogue over (its default is settled after the
            # images are recorded, and CI once looked in between): both, polled.
            async def catalogued():
                return [(i["name"], i["source"]) for i in
                        await mgr.ops.list_catalogue(ROOT, True)] == [
                            ("local/python", "local")] and mgr.registries.local_known

            assert await _until(catalogued, 60), (await mgr.ops.list_catalogue(ROOT, True),
                                                  mgr.registries.local_known, agent.tail())

    try:
        asyncio.run(run())
    finally:
        agent.stop()
        etcd.stop()
