"""A manager with real in-process agents (Docker or local processes) on a real database.

For tests that drive sessions through the manager directly, without a hub: batch
sessions (API only), multi-kernel sessions, start failures. Everything is real:
the database, the agents, the containers or processes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from contextlib import asynccontextmanager

from sqlalchemy import select
from traitlets.config import Config

from jupyterhub_backendai.agent.core import Agent as LocalAgent
from jupyterhub_backendai.manager import tenancy
from jupyterhub_backendai.manager.core import BackendAIManager
from jupyterhub_backendai.manager.scheduler import check_consistency
from jupyterhub_backendai.models import Agent, KeypairResourcePolicy, Session

from .hub import KERNEL_IMAGE
from .services import agent_id as new_agent_id
from .services import port_block

DEAD = ("TERMINATED", "ERROR", "CANCELLED")


def agent_config(c: Config, tmp_path, backend: str, *, slots: dict, name: str) -> str:
    """Point ``c.Agent`` at a fresh agent of its own; returns its id."""
    agent_id = new_agent_id(f"test-{name}")
    c.Agent.agent_id = agent_id
    c.Agent.backend = backend
    c.Agent.state_dir = str(tmp_path / agent_id)
    c.Agent.slots = slots
    lo = port_block(50)
    c.Agent.port_range = (lo, lo + 50)
    return agent_id


@asynccontextmanager
async def running_manager(db_url: str, tmp_path, backend: str, *, slots=None, retries: int = 2,
                          configure=None, config: Config | None = None, keep_kernels: bool = False):
    """A started manager with one embedded agent; stops it and removes what is left.

    ``configure(config)`` may adjust the configuration (e.g. the agent's port range);
    ``config`` reuses the one of an earlier manager (``mgr.test_config``: same agent, a
    restart); ``keep_kernels`` stops without removing the kernels (they outlive it)."""
    if config is None:
        c = Config()
        c.BackendAIManager.db_url = db_url
        c.BackendAIManager.schedule_interval = 0.2
        c.BackendAIManager.status_poll_interval = 0.05
        c.BackendAIManager.start_retries = retries
        # The in-hub storage proxy's volume, out of the checkout.
        c.BackendAIManager.storage_volumes = {
            "volume1": {"backend": "vfs", "path": str(tmp_path / "vfroot" / "volume1")}}
        agent_config(c, tmp_path, backend, slots=slots or {"cpu": 4, "mem": "8g"}, name="a")
        if configure:
            configure(c)
    else:
        c = config
    mgr = BackendAIManager(config=c)
    mgr.test_config = c
    await mgr.ready()
    try:
        yield mgr
    finally:
        ids = list(mgr.local_agents)
        if not keep_kernels:
            for agent in mgr.local_agents.values():
                for k in await agent.list_kernels():  # what a failed test left running
                    await agent.destroy_kernel(k["kernel_id"])
        await mgr.stop()
        if not keep_kernels:
            for agent_id in ids:
                remove_containers(agent_id)


async def add_agent(mgr: BackendAIManager, tmp_path, backend: str, *, slots: dict, name: str) -> LocalAgent:
    """A second in-process agent beside the embedded one (a multi-node cluster in one process)."""
    c = Config()
    c.merge(mgr.test_config)
    agent_config(c, tmp_path, backend, slots=slots, name=name)
    agent = LocalAgent(mgr.bus, config=c)
    await mgr.attach_agent(agent)
    return agent


def image_for(backend: str) -> str:
    return KERNEL_IMAGE if backend == "docker" else "local/python"


async def make_user(mgr: BackendAIManager, email: str = "alice@example.com",
                    max_containers: int | None = None) -> str:
    """A user with a default keypair; ``max_containers`` raises the default policy's
    max_containers_per_session (1 out of the box) for multi-kernel sessions."""

    def work(s):
        user, _, _ = tenancy.create_user(s, email=email, password="password1")
        if max_containers is not None:
            s.get(KeypairResourcePolicy, "default").max_containers_per_session = max_containers
        return user.username

    return await mgr.db(work)


async def wait_status(mgr: BackendAIManager, sid: str, statuses, timeout: float = 90) -> Session:
    """Wait until the session is in one of ``statuses`` (a bound for hangs, not a speed
    check): read again at each change the manager announces (``mgr.events``, as the
    spawner waits), and every quarter second in case one was not."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    with mgr.events.listen(sid) as changed:
        while True:
            changed.clear()
            sess = await mgr.get_session(sid)
            if sess.status in statuses:
                return sess
            if loop.time() > deadline:
                raise AssertionError(f"session {sid} stuck in {sess.status}: {sess.status_info}")
            try:
                async with asyncio.timeout(0.25):
                    await changed.wait()
            except TimeoutError:
                pass


async def until(cond, timeout: float = 20.0, interval: float = 0.05) -> bool:
    """Poll ``await cond()`` until true (True) or ``timeout`` (False): a bound for hangs."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await cond():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(interval)
    return True


async def occupied(mgr: BackendAIManager) -> dict:
    def work(s):
        return {a.id: a.occupied_slots.nonzero() for a in s.scalars(select(Agent))}

    return await mgr.db(work)


def assert_consistent(mgr: BackendAIManager) -> None:
    assert check_consistency(mgr.sm) == []


async def assert_nothing_left(mgr: BackendAIManager) -> None:
    """No container or process left on the manager's agent, no slots held, record consistent."""
    assert leftovers(mgr.agent) == []
    assert await occupied(mgr) == {mgr.agent.agent_id: {}}
    assert_consistent(mgr)


def containers_of(agent_id: str) -> list[str]:
    r = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=ai.backend.agent-id={agent_id}"],
        capture_output=True, text=True,
    )
    return r.stdout.split() if r.returncode == 0 else []


def remove_containers(agent_id: str) -> None:
    left = containers_of(agent_id)
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
    remove_session_networks(agent_id)


def remove_session_networks(agent_id: str) -> None:
    """Session networks an agent made (the product removes them with their last
    kernel; a test that removes containers behind its back leaves them)."""
    r = subprocess.run(
        ["docker", "network", "ls", "-q", "--filter", "label=ai.backend.network=session",
         "--filter", f"label=ai.backend.agent-id={agent_id}"],
        capture_output=True, text=True,
    )
    nets = r.stdout.split() if r.returncode == 0 else []
    if nets:
        subprocess.run(["docker", "network", "rm", *nets], capture_output=True)


def local_kernels(agent: LocalAgent) -> list[str]:
    """Kernel state files of a local-backend agent (one per live kernel process)."""
    d = os.path.join(agent.state_dir, "local-kernels")
    return sorted(f for f in os.listdir(d) if f.endswith(".json")) if os.path.isdir(d) else []


def leftovers(agent: LocalAgent) -> list[str]:
    """What an agent still runs: containers (Docker) or kernel processes (local)."""
    if agent.impl.name == "docker":
        return containers_of(agent.agent_id)
    return local_kernels(agent)


async def gpu_batch(mgr: BackendAIManager, user: str, name: str, slots: dict) -> str:
    """A batch session on the local backend that prints the devices it was given
    (``VISIBLE=<CUDA_VISIBLE_DEVICES> NV=<NVIDIA_VISIBLE_DEVICES>``), then stays until
    it is destroyed."""
    return await mgr.enqueue(
        username=user, name=name, image="local/python", environ={}, service_prefix="/",
        slots={"cpu": "0.5", "mem": str(256 * 2**20), **slots}, session_type="batch",
        startup_command='echo "VISIBLE=$CUDA_VISIBLE_DEVICES NV=$NVIDIA_VISIBLE_DEVICES"; '
                        "sleep 120")
