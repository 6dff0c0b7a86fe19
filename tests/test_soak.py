"""Fault injection, bounded (issue 11): for ``BACKENDAI_SOAK_SECONDS`` (default 60;
CI keeps the default, run longer by hand) sessions start, finish and are stopped
while an agent daemon, Redis and a hub's manager process are killed (``kill -9``)
and started again at random. The random choices come from a seeded RNG; the seed
is printed (``BACKENDAI_SOAK_SEED`` replays a run).

The cluster: PostgreSQL, etcd, a Redis that may lose its data, two
``backendai-agent`` daemons (mutual TLS, registered in etcd; one of them is the
victim), and two managers: one in the test process (the test's client, never
killed) and one in a subprocess, the victim (this module run as a script), both
scheduling and driving sessions, so the victim's claims are what its death leaves
behind. At the end, with every part running again and every session stopped: no
session in a transient state, no leaked slots (``check_consistency`` and zero
occupied slots), no kernel process left on either agent.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

from sqlalchemy import select
from traitlets.config import Config

from jupyterhub_backendai.common.errors import BackendAIError
from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.manager.core import BackendAIManager
from jupyterhub_backendai.manager.scheduler import check_consistency
from jupyterhub_backendai.models import Agent, Session

from .cluster_nodes import Cluster
from .inproc import make_user

TRANSIENT = ("SCHEDULED", "PREPARING", "CREATING", "TERMINATING")
DEAD = ("TERMINATED", "ERROR", "CANCELLED")


def _manager_config(settings: dict) -> Config:
    c = Config()
    for section, values in settings.items():
        for k, v in values.items():
            setattr(c[section], k, v)
    return c


class VictimHub:
    """A manager in a subprocess (``python -m tests.test_soak SETTINGS``): killed with
    SIGKILL and started again."""

    def __init__(self, root, settings: dict):
        self.settings = json.dumps(settings)
        self.ready = os.path.join(str(root), "victim.ready")
        self.log = os.path.join(str(root), "victim.log")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.test_soak", self.settings, self.ready],
                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                stdout=log, stderr=subprocess.STDOUT)

    async def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.ready):
            assert self.proc.poll() is None, self.tail()
            assert time.monotonic() < deadline, self.tail()
            await asyncio.sleep(0.1)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()[-3000:]


async def _until(cond, timeout: float, what: str):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


def test_soak_faults(postgres, tmp_path):
    seconds = float(os.environ.get("BACKENDAI_SOAK_SECONDS", "60"))
    seed = int(os.environ.get("BACKENDAI_SOAK_SEED", str(random.SystemRandom().randrange(2**32))))
    print(f"soak: seed={seed} seconds={seconds:g} (BACKENDAI_SOAK_SEED={seed} replays it)")
    rng = random.Random(seed)
    cl = Cluster(tmp_path, slots="{'cpu': 2, 'mem': '2g'}")
    steady, victim_agent = cl.daemons
    db_url = postgres.new_database("t_soak")
    settings = {
        "BackendAIManager": {
            "db_url": db_url, "redis_url": cl.redis.url, "embedded_agent": False,
            "schedule_interval": 0.5, "agent_lost_timeout": 3.0, "agent_lost_grace": 3.0,
            "reconcile_interval": 2.0, "claim_lease": 6.0, "start_retries": 2,
            "storage_volumes": {"volume1": {"backend": "vfs",
                                            "path": str(tmp_path / "vfroot" / "volume1")}},
        },
        "BackendAICluster": {"etcd_url": cl.etcd.url, "tls": cl.certs["hub"]},
    }
    hub = VictimHub(tmp_path, settings)
    cl.start()
    counts: dict[str, int] = {}

    def count(what: str) -> None:
        counts[what] = counts.get(what, 0) + 1

    async def run():
        mgr = BackendAIManager(config=_manager_config(settings))
        await mgr.ready()
        hub.start()
        await hub.wait_ready()
        bg: set[asyncio.Task] = set()
        try:
            async def agents_alive():
                rows = await mgr.db_read(lambda s: {a.id: a.status for a in s.scalars(select(Agent))})
                return all(rows.get(d.agent_id) == "ALIVE" for d in cl.daemons)

            await _until(agents_alive, 60, "both agents ALIVE")
            user = await make_user(mgr)
            sessions: list[str] = []
            agent_down_until = hub_down_until = None
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds
            n = 0
            while loop.time() < end:
                now = loop.time()
                if agent_down_until is not None and now >= agent_down_until:
                    victim_agent.start()
                    agent_down_until = None
                if hub_down_until is not None and now >= hub_down_until:
                    hub.start()
                    hub_down_until = None
                r = rng.random()
                if r < 0.40:
                    n += 1
                    command = rng.choice(["sleep 600", "sleep 600", "sleep 1", "exit 3"])
                    try:
                        sessions.append(await mgr.enqueue(
                            username=user, name=f"soak-{n}", image="local/python",
                            slots=ResourceSlot(cpu=0.5, mem=128 * 2**20), environ={},
                            service_prefix="/", session_type="batch", startup_command=command))
                        count("start")
                    except BackendAIError as e:  # e.g. no live agent for a moment
                        count(f"refused: {e.detail[:40]}")
                elif r < 0.65 and sessions:
                    sid = rng.choice(sessions)
                    t = asyncio.create_task(mgr.destroy_session(sid))
                    bg.add(t)
                    t.add_done_callback(bg.discard)
                    count("stop")
                elif r < 0.75 and agent_down_until is None:
                    victim_agent.kill()
                    agent_down_until = now + rng.uniform(1, 10)  # back in the grace, or not
                    count("kill agent")
                elif r < 0.85 and hub_down_until is None:
                    hub.kill()
                    hub_down_until = now + rng.uniform(0.5, 5)
                    count("kill hub")
                elif r < 0.95:
                    wipe = rng.random() < 0.5
                    cl.redis.kill()
                    cl.redis.start(wipe=wipe)
                    count("restart redis" + (" without data" if wipe else ""))
                await asyncio.sleep(rng.uniform(0.2, 1.5))
            print(f"soak: {counts}")

            # Everything running again, every session stopped by its user.
            if agent_down_until is not None:
                victim_agent.start()
            if hub_down_until is not None:
                hub.start()
            await hub.wait_ready()
            await _until(agents_alive, 60, "both agents ALIVE at the end")
            await asyncio.gather(*bg, return_exceptions=True)

            async def settled():
                rows = await mgr.db_read(lambda s: [(r.id, r.status) for r in s.scalars(
                    select(Session).where(Session.status.not_in(DEAD)))])
                if not rows:
                    return True
                for sid, _ in rows:
                    try:
                        await mgr.destroy_session(sid)
                    except BackendAIError:
                        pass
                return False

            await _until(settled, 120, "every session ended")

            async def no_kernels():
                return not steady.kernels() and not victim_agent.kernels()

            await _until(no_kernels, 60, "no kernel left on the agents")

            # The verdict.
            stuck = await mgr.db_read(lambda s: [(r.id, r.status, r.status_info) for r in s.scalars(
                select(Session).where(Session.status.in_(TRANSIENT)))])
            assert stuck == []
            assert check_consistency(mgr.sm) == []
            occupied = await mgr.db_read(lambda s: {a.id: a.occupied_slots.nonzero()
                                                    for a in s.scalars(select(Agent))})
            assert all(v == {} for v in occupied.values()), occupied
            assert steady.kernels() == victim_agent.kernels() == []
            ended = await mgr.db_read(lambda s: list(s.execute(
                select(Session.status, Session.status_info).where(Session.status.in_(DEAD)))))
            summary: dict[str, int] = {}
            for st, info in ended:
                key = f"{st}: {' '.join((info or '').split()[:4])}"
                summary[key] = summary.get(key, 0) + 1
            print(f"soak: ended {summary}")
            assert len(ended) == len(sessions)
            assert all(info for _, info in ended)  # each ended with a reason
            assert counts.get("start", 0) > 0
        finally:
            for t in bg:
                t.cancel()
            hub.stop()
            await mgr.stop()

    try:
        asyncio.run(run())
    finally:
        hub.stop()
        cl.stop()


async def _victim(settings: dict, ready: str) -> None:
    mgr = BackendAIManager(config=_manager_config(settings))
    await mgr.ready()
    with open(ready, "w") as f:
        f.write(str(os.getpid()))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await mgr.stop()


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_victim(json.loads(sys.argv[1]), sys.argv[2]))
