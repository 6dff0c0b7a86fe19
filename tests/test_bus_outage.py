"""Liveness from two witnesses (issue 24, row 2): a bus outage ends no session.

Real parts: a Redis server of this test's own (stopped and started again), two
``backendai-agent`` daemons (local backend) talking to an in-process manager over
that bus and over HTTP, SQLite. Before: with Redis away longer than
``agent_lost_timeout + agent_lost_grace`` every session on every daemon ended ERROR,
and a new one was refused ("resource group has no live agent").

Now an agent is LOST only when its heartbeats stop *and* a direct call fails: the
daemon that lives through the outage keeps its session, and a session asked for during
the outage starts on it; the daemon killed during the outage is LOST all the same and
its session ends after the grace.
"""

from __future__ import annotations

import asyncio
import os

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.manager.scheduler import check_consistency
from jupyterhub_backendai.models import Agent

from .conftest import _kill_local_kernels
from .inproc import make_user, running_manager, wait_status
from .services import Redis, free_port
from .services import agent_id as new_agent_id
from .test_faults import _kill_group, _start_daemon

TIMEOUT, GRACE = 2.0, 2.0


async def _agent_status(mgr, agent_id: str) -> str:
    return await mgr.db_read(lambda s: s.get(Agent, agent_id).status)


def test_a_bus_outage_ends_no_session_and_a_dead_agent_is_still_lost(tmp_path):
    redis = Redis()
    token = "t-" + os.urandom(8).hex()
    bus = redis.url
    ids = [new_agent_id("outage"), new_agent_id("dies")]
    ports = [free_port(), free_port()]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    daemons = [_start_daemon(tmp_path / "a", bus, token, ids[0], ports[0]),
               _start_daemon(tmp_path / "b", bus, token, ids[1], ports[1])]

    def cluster(c):
        c.BackendAIManager.redis_url = bus
        c.BackendAIManager.agent_token = token
        c.BackendAIManager.agent_lost_timeout = TIMEOUT
        c.BackendAIManager.agent_lost_grace = GRACE
        c.BackendAIManager.reconcile_interval = 1.0

    async def batch(mgr, user, name, agent):
        return await mgr.enqueue(
            username=user, name=name, image="local/python",
            slots=ResourceSlot(cpu="0.5", mem=256 * 2**20), environ={}, service_prefix="/",
            session_type="batch", startup_command="sleep 300", designated_agents=[agent])

    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/o.sqlite", tmp_path, "local",
                                   configure=cluster) as mgr:
            for _ in range(400):
                if all([await mgr.db_read(lambda s, a=a: s.get(Agent, a)) for a in ids]):
                    break
                await asyncio.sleep(0.05)
            user = await make_user(mgr)
            keep = await batch(mgr, user, "keep", ids[0])
            doomed = await batch(mgr, user, "doomed", ids[1])
            for sid in (keep, doomed):
                assert (await wait_status(mgr, sid, ("RUNNING", "ERROR"))).status == "RUNNING"

            redis.pause()
            _kill_group(daemons[1])  # dies while nobody can hear it
            await asyncio.sleep(TIMEOUT + 0.5)
            # Asked for during the outage: it starts on the agent that answers.
            late = await batch(mgr, user, "late", ids[0])
            sess = await wait_status(mgr, late, ("RUNNING", "ERROR", "CANCELLED"), timeout=60)
            assert sess.status == "RUNNING", sess.status_info
            # Three lost timeouts, past timeout + grace twice over.
            await asyncio.sleep(3 * (TIMEOUT + GRACE) - TIMEOUT)
            assert await _agent_status(mgr, ids[0]) == "ALIVE"
            for sid in (keep, late):
                sess = await mgr.get_session(sid)
                assert (sess.status, sess.status_info) == ("RUNNING", "running"), sess.status_info
            # The dead one is LOST all the same (no heartbeat, no answer), its session ended.
            assert await _agent_status(mgr, ids[1]) == "LOST"
            sess = await wait_status(mgr, doomed, ("ERROR",), timeout=30)
            assert sess.status_info.startswith(f"agent {ids[1]} was lost"), sess.status_info

            redis.resume()
            # Heartbeats are read again; the sessions live on and can be ended.
            await asyncio.sleep(2 * TIMEOUT)
            assert await _agent_status(mgr, ids[0]) == "ALIVE"
            for sid in (keep, late):
                assert (await mgr.get_session(sid)).status == "RUNNING"
                await mgr.destroy_session(sid)
                assert (await mgr.get_session(sid)).status == "TERMINATED"
            assert check_consistency(mgr.sm) == []

    try:
        asyncio.run(run())
    finally:
        for d in daemons:
            _kill_group(d)
        for d in ("a", "b"):  # a killed daemon leaves its kernel running, as a crash does
            _kill_local_kernels(str(tmp_path / d / "daemon" / "local-kernels"))
        redis.stop()
