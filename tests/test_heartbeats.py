"""Heartbeats in cluster mode on PostgreSQL (manager/discovery.py ``HeartbeatWriter``).

A routine heartbeat (an ALIVE agent, same resource group) is one autocommit UPDATE
on a connection kept for heartbeats; a new agent, one back from LOST or one that
moved to another group goes through the manager's full upsert. The heartbeat
connection lost (PostgreSQL terminated it) costs nothing but a fallback, and it is
given back when the manager stops.
"""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import text
from traitlets.config import Config

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.common.types import AgentStatus
from jupyterhub_backendai.manager.core import BackendAIManager
from jupyterhub_backendai.models import Agent


def info(aid: str, **kw) -> dict:
    return {"id": aid, "addr": "http://127.0.0.1:1", "resource_group": "default",
            "backend": "docker", "architecture": "x86_64", "version": "t",
            "available_slots": {"cpu": "4", "mem": str(8 << 30)}, **kw}


def test_heartbeats_routine_and_not(postgres, redis_server):
    db_url = postgres.new_database("t_" + uuid.uuid4().hex[:12])
    c = Config()
    c.BackendAIManager.db_url = db_url
    c.BackendAIManager.redis_url = redis_server.fresh_url()
    c.BackendAIManager.embedded_agent = False

    async def run():
        mgr = BackendAIManager(config=c)
        await mgr.ready()
        try:
            hb = mgr.cluster.record_heartbeat

            async def agent(aid):
                return await mgr.db_read(lambda s: s.get(Agent, aid))

            async def backends():
                return await mgr.db_read(lambda s: s.scalar(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND backend_type = 'client backend'")))

            assert await hb(mgr, info("a1")) is None  # new: the full upsert
            first = await agent("a1")
            assert first.status == AgentStatus.ALIVE
            assert mgr.cluster._heartbeats is not None

            # Routine: the heartbeat connection; the record follows the payload.
            assert await hb(mgr, info("a1", addr="http://127.0.0.1:2",
                                      available_slots={"cpu": "8", "mem": "1"})) == AgentStatus.ALIVE
            a = await agent("a1")
            assert a.addr == "http://127.0.0.1:2"
            assert a.available_slots == ResourceSlot({"cpu": 8, "mem": 1})
            assert a.last_heartbeat > first.last_heartbeat
            assert mgr.cluster._heartbeats.failures == 0

            # Back from LOST: the full path says it was LOST, and it is ALIVE again.
            await mgr.db(lambda s: s.get(Agent, "a1").__setattr__("status", AgentStatus.LOST))
            assert await hb(mgr, info("a1")) == AgentStatus.LOST
            assert (await agent("a1")).status == AgentStatus.ALIVE

            # Moved to another group: not routine either.
            assert await hb(mgr, info("a1", resource_group="g2")) == AgentStatus.ALIVE
            assert (await agent("a1")).resource_group == "g2"

            # PostgreSQL drops the heartbeat connection: that heartbeat is still
            # recorded (the regular way), the next one is routine again.
            before = (await agent("a1")).last_heartbeat
            await mgr.db(lambda s: s.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
                "pg_backend_pid() AND datname = current_database() AND state = 'idle'"
                " AND query LIKE 'UPDATE agents SET addr%'")))
            assert await hb(mgr, info("a1", resource_group="g2")) == AgentStatus.ALIVE
            assert (await agent("a1")).last_heartbeat > before
            assert mgr.cluster._heartbeats.failures == 1
            assert await hb(mgr, info("a1", resource_group="g2")) == AgentStatus.ALIVE
            assert mgr.cluster._heartbeats.failures == 1
            assert await backends() >= 2  # ours and the heartbeat connection
        finally:
            await mgr.stop()
        # Stopped: the heartbeat connection is closed too (a database can be dropped).
        for _ in range(50):
            n = postgres.psql("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                              f"'{db_url.rsplit('/', 1)[1]}'").stdout.strip()
            if n == "0":
                break
            await asyncio.sleep(0.1)
        assert n == "0"

    asyncio.run(run())
