"""An authenticated bus that is believed only as far as the agents vouch for it
(issue 24, row 3).

Real parts: a Redis server with ACL users (the setup docs/cluster.md documents: no
anonymous user, the hub's user, one user per agent limited to its own keys and
commands), a ``backendai-agent`` daemon (local backend) on its own user, an
in-process manager on the hub's user, SQLite.

- Without credentials, nothing reaches the bus; an agent's user can add events and
  write its own statistics, nothing else.
- Events that pass anyway (a node that was broken into holds an agent's password) are
  hints: a heartbeat of an agent that does not exist, carrying the real agent's
  address and 1,000 CPUs, is refused (the agent at that address is another); one with
  the real agent's id and 1,000 CPUs records the capacity the agent itself answers a
  direct call; a ``kernel_terminated`` for a kernel its agent still runs ends nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
import redis as redis_sync

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.models import Agent

from .conftest import _kill_local_kernels
from .inproc import make_user, running_manager, wait_status
from .services import Redis, free_port
from .services import agent_id as new_agent_id
from .test_faults import _kill_group, _start_daemon


def _acl(path, agent: str, hub_pw: str, agent_pw: str) -> None:
    path.write_text(
        "user default off\n"
        f"user hub on >{hub_pw} ~* &* +@all -@dangerous\n"
        f"user {agent} on >{agent_pw} resetchannels -@all +xadd +del +hset +pexpire +multi "
        "+exec +ping +select "
        f"%W~backendai.events %W~backendai.agent-stats.{agent}\n")


def test_the_bus_needs_credentials_and_its_events_are_vouched_for(tmp_path):
    agent_id = new_agent_id("bus")
    hub_pw, agent_pw = os.urandom(12).hex(), os.urandom(12).hex()
    _acl(tmp_path / "users.acl", agent_id, hub_pw, agent_pw)
    server = Redis("--aclfile", str(tmp_path / "users.acl"))
    hub_url = f"redis://hub:{hub_pw}@127.0.0.1:{server.port}/0"
    agent_url = f"redis://{agent_id}:{agent_pw}@127.0.0.1:{server.port}/0"
    anonymous = f"redis://127.0.0.1:{server.port}/0"
    token = "t-" + os.urandom(8).hex()
    port = free_port()
    daemon = _start_daemon(tmp_path, agent_url, token, agent_id, port)

    # Who may do what on the bus itself.
    with pytest.raises(redis_sync.AuthenticationError):
        redis_sync.Redis.from_url(anonymous).xadd("backendai.events", {"name": "agent_heartbeat"})
    as_agent = redis_sync.Redis.from_url(agent_url)
    with pytest.raises(redis_sync.exceptions.NoPermissionError):
        as_agent.xrange("backendai.events")  # no reading other nodes' events
    with pytest.raises(redis_sync.exceptions.NoPermissionError):
        as_agent.hset("backendai.agent-stats.i-someone-else", "ts", "1")
    with pytest.raises(redis_sync.exceptions.NoPermissionError):
        as_agent.flushdb()

    def cluster(c):
        c.BackendAIManager.redis_url = hub_url
        c.BackendAIManager.agent_token = token
        c.BackendAIManager.reconcile_interval = 1.0

    def forge(name: str, payload: dict) -> None:
        as_agent.xadd("backendai.events", {"name": name, "payload": json.dumps(payload)})

    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/a.sqlite", tmp_path, "local",
                                   configure=cluster) as mgr:
            row = None
            for _ in range(400):
                row = await mgr.db_read(lambda s: s.get(Agent, agent_id))
                if row is not None:
                    break
                await asyncio.sleep(0.05)
            assert row is not None and row.status == "ALIVE", "the daemon did not join"
            real = row.available_slots.to_json()
            addr = row.addr

            # A heartbeat of an agent that does not exist, with the real one's address.
            ghost = new_agent_id("ghost")
            forge("agent_heartbeat", {"id": ghost, "addr": addr, "resource_group": "default",
                                      "available_slots": {"cpu": "1000", "mem": str(2**40)},
                                      "ts": time.time()})
            # The real agent's id with 1,000 CPUs.
            forge("agent_heartbeat", {"id": agent_id, "addr": addr, "resource_group": "default",
                                      "available_slots": {"cpu": "1000", "mem": str(2**40)},
                                      "ts": time.time()})
            await asyncio.sleep(2)
            assert await mgr.db_read(lambda s: s.get(Agent, ghost)) is None
            row = await mgr.db_read(lambda s: s.get(Agent, agent_id))
            assert row.available_slots.to_json() == real, row.available_slots

            # A session on the daemon, then a forged end of its kernel.
            user = await make_user(mgr)
            sid = await mgr.enqueue(
                username=user, name="kept", image="local/python",
                slots=ResourceSlot(cpu="0.5", mem=256 * 2**20), environ={}, service_prefix="/",
                session_type="batch", startup_command="sleep 300", designated_agents=[agent_id])
            sess = await wait_status(mgr, sid, ("RUNNING", "ERROR"))
            assert sess.status == "RUNNING", sess.status_info
            forge("kernel_terminated", {"agent_id": agent_id, "kernel_id": sess.kernels[0].id,
                                        "exit_code": 137, "logs": "forged"})
            await asyncio.sleep(2)
            sess = await mgr.get_session(sid)
            assert (sess.status, sess.status_info) == ("RUNNING", "running"), sess.status_info
            # The real end still counts.
            await mgr.destroy_session(sid)
            assert (await mgr.get_session(sid)).status == "TERMINATED"

    try:
        asyncio.run(run())
    finally:
        _kill_group(daemon)
        _kill_local_kernels(str(tmp_path / "daemon" / "local-kernels"))
        server.stop()
