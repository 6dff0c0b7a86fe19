"""The hub under a cluster's heartbeats: N simulated agents, the hub's CPU, event lag, loss.

    python benchmarks/agents.py [--agents 200] [--interval 5] [--seconds 60] [--db postgres|sqlite]

Starts its own etcd, Redis, PostgreSQL (or SQLite) and a hub in cluster mode
(tests/hub.py: launcher, CHP; ``embedded_agent=False``, ``redis_url``, the
cluster's ``etcd_url``). Then N simulated agents, in this process, do what
``backendai-agent`` does:

- register in etcd under a lease (``common/etcdreg.AgentRegistration``, the
  daemon's own code and TTL, 10 s) with the daemon's description (id, address,
  resource group, slots, images);
- every ``--interval`` seconds publish ``agent_heartbeat`` on the hub's Redis
  stream (the daemon's payload, with its send time) and write their live
  statistics (``agent/stats.write_stats``: 4 kernels each with CPU, memory and
  GPU figures, free slots);
- answer the hub's calls from one small HTTP server they share, each under a path of
  its own (its address is ``http://127.0.0.1:PORT/a/<id>``): reconciliation
  (``GET /v1/kernels``: no kernels) and the direct call by which the hub confirms a
  join and, for a silent agent, its liveness (``GET /v1/info``: its own description;
  a killed agent no longer answers).

Heartbeats are spread evenly over the interval. Measured over ``--seconds`` after
a warm-up of one interval:

- ``hub_cpu_pct``: CPU time of the hub's Python process (not CHP, not the
  databases) over wall time, in percent of one core (psutil);
- ``event_lag_p99_ms``: from an agent's publish to the hub's handling of it,
  which stamps ``agents.last_heartbeat`` (read from the database every 0.25 s and
  matched with the send times; both clocks are this machine's);
- ``lost_detect_s``: then one agent is killed as ``kill -9`` would (heartbeats
  and lease refreshes stop, nothing is revoked): seconds from its last heartbeat
  until the database says LOST (``--lost-timeout``, the hub's
  ``agent_lost_timeout``, default 15 s; the etcd lease, 10 s, may tell first).

Last line: ``agents=<n> hub_cpu_pct=<f> event_lag_p99_ms=<f> lost_detect_s=<f>``.
Everything started is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import psutil  # noqa: E402
from aiohttp import web  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from jupyterhub_backendai.agent.stats import write_stats  # noqa: E402
from jupyterhub_backendai.common.etcdreg import AgentRegistration  # noqa: E402
from jupyterhub_backendai.common.events import RedisEventBus  # noqa: E402
from tests.hub import Hub  # noqa: E402
from tests.services import Etcd, Postgres, Redis, free_port  # noqa: E402

PREFIX = "/backendai"
LEASE_TTL = 10.0
TOKEN = "bench-agents-token"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class SimAgent:
    def __init__(self, i: int, addr: str, bus: RedisEventBus, etcd_url: str, interval: float):
        self.id = f"i-sim-{i:05d}"
        self.addr = f"{addr}/{self.id}"
        self.dead = False
        self.bus = bus
        self.interval = interval
        self.sent: list[float] = []
        self.reg = AgentRegistration(etcd_url, PREFIX, self.id, self.describe, ttl=LEASE_TTL)
        self.task: asyncio.Task | None = None
        self.kernels = {f"k{self.id[-5:]}-{j}": None for j in range(4)}

    def info(self) -> dict:
        return {
            "id": self.id, "addr": self.addr, "resource_group": "default", "backend": "docker",
            "architecture": "x86_64", "available_slots": {"cpu": "64", "mem": str(256 << 30),
                                                          "cuda.device": "8"},
            "version": "bench", "devices": [],
        }

    async def describe(self) -> dict:
        return dict(self.info(), images=["backendai/python-kernel:latest"])

    async def beat(self) -> None:
        ts = time.time()
        self.sent.append(ts)
        await self.bus.publish("agent_heartbeat", dict(self.info(), ts=ts))
        kernels = {
            k: {"cpu_pct": round(random.uniform(0, 400), 2), "mem_bytes": random.randint(1 << 28, 1 << 33),
                "mem_limit_bytes": 16 << 30, "gpu_util_pct": round(random.uniform(0, 100), 1)}
            for k in self.kernels
        }
        await write_stats(self.bus.redis, self.id, {
            "ts": ts, "available_slots": self.info()["available_slots"],
            "occupied_slots": {"cpu": "16", "mem": str(64 << 30), "cuda.device": "4"},
            "free_slots": {"cpu": "48", "mem": str(192 << 30), "cuda.device": "4"},
            "kernels": kernels,
        }, ttl=3 * self.interval)

    async def run(self, offset: float) -> None:
        await asyncio.sleep(offset)
        loop = asyncio.get_running_loop()
        nxt = loop.time()
        while True:
            try:
                await self.beat()
            except Exception as e:  # keep beating, as the daemon does
                log(f"{self.id}: heartbeat failed: {e}")
            nxt += self.interval
            await asyncio.sleep(max(0.0, nxt - loop.time()))

    async def kill(self) -> None:
        """As kill -9: stop beating and stop refreshing the lease, revoke nothing; its
        API no longer answers."""
        self.dead = True
        self.task.cancel()
        reg = self.reg
        if reg._task is not None:
            reg._task.cancel()
            try:
                await reg._task
            except (asyncio.CancelledError, Exception):
                pass
            reg._task = None


async def fake_agent_api(port: int, agents: dict[str, SimAgent]) -> web.AppRunner:
    def agent(request) -> SimAgent:
        a = agents.get(request.match_info["aid"])
        if a is None or a.dead:
            raise web.HTTPServiceUnavailable()
        return a

    async def kernels(request):
        agent(request)
        return web.json_response([])

    async def images(request):
        agent(request)
        return web.json_response([])

    async def info(request):
        return web.json_response(agent(request).info())

    app = web.Application()
    app.router.add_get("/a/{aid}/v1/kernels", kernels)
    app.router.add_get("/a/{aid}/v1/images", images)
    app.router.add_get("/a/{aid}/v1/info", info)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def hub_process(hub: Hub) -> psutil.Process:
    """The hub's Python process (the launcher runs JupyterHub in-process; CHP is a child)."""
    return psutil.Process(hub.proc.pid)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def bench(args, hub: Hub, redis_url: str, etcd_url: str, db_url: str) -> dict:
    api_port = free_port()
    bus = RedisEventBus(redis_url)
    base = f"http://127.0.0.1:{api_port}/a"
    agents = [SimAgent(i, base, bus, etcd_url, args.interval) for i in range(args.agents)]
    runner = await fake_agent_api(api_port, {a.id: a for a in agents})
    engine = create_engine(db_url)
    try:
        log(f"registering {len(agents)} agents in etcd ...")
        for i in range(0, len(agents), 20):
            await asyncio.gather(*(a.reg.start() for a in agents[i:i + 20]))
        for i, a in enumerate(agents):
            a.task = asyncio.create_task(a.run(args.interval * i / len(agents)))

        def alive() -> dict:
            with engine.connect() as c:
                return dict(c.execute(text("SELECT id, status FROM agents")).all())

        deadline = time.monotonic() + 120
        while True:
            st = await asyncio.to_thread(alive)
            n = sum(1 for a in agents if st.get(a.id) == "ALIVE")
            if n == len(agents):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"only {n} of {len(agents)} agents became ALIVE\n{hub.log()[-3000:]}")
            await asyncio.sleep(0.5)
        log(f"all {len(agents)} agents ALIVE; warm-up {args.interval:g} s")
        await asyncio.sleep(args.interval)

        proc = hub_process(hub)
        lags: list[float] = []
        seen: dict[str, float] = {}

        def beats() -> list:
            with engine.connect() as c:
                return c.execute(text("SELECT id, last_heartbeat FROM agents")).all()

        def collect(rows, since: float) -> None:
            by_id = {a.id: a for a in agents}
            for aid, hb in rows:
                a = by_id.get(aid)
                if a is None or hb is None:
                    continue
                if isinstance(hb, str):
                    hb = dt.datetime.fromisoformat(hb)
                if hb.tzinfo is None:
                    hb = hb.replace(tzinfo=dt.UTC)
                got = hb.timestamp()
                if seen.get(aid) == got:
                    continue
                seen[aid] = got
                sent = [s for s in a.sent if s <= got + 0.001]
                if sent and sent[-1] >= since:
                    lags.append(max(0.0, got - sent[-1]))

        t0 = time.monotonic()
        w0 = time.time()
        c0 = proc.cpu_times()
        while time.monotonic() - t0 < args.seconds:
            collect(await asyncio.to_thread(beats), w0)
            await asyncio.sleep(0.25)
        c1 = proc.cpu_times()
        wall = time.monotonic() - t0
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        hub_cpu_pct = 100.0 * cpu / wall
        log(f"measured {wall:.1f} s: hub CPU {cpu:.2f} s ({hub_cpu_pct:.2f} % of one core), "
            f"{len(lags)} heartbeats handled, lag p50 {1000 * pct(lags, 50):.1f} ms, "
            f"p99 {1000 * pct(lags, 99):.1f} ms, max {1000 * max(lags or [0]):.1f} ms; "
            f"load average {os.getloadavg()[0]:.2f}")

        victim = agents[len(agents) // 2]
        await victim.kill()
        last = victim.sent[-1]
        log(f"killed {victim.id} (last heartbeat {time.time() - last:.2f} s ago); waiting for LOST")

        def status() -> str:
            with engine.connect() as c:
                return c.execute(text("SELECT status FROM agents WHERE id = :i"),
                                 {"i": victim.id}).scalar()

        lost_at = None
        deadline = time.monotonic() + args.lost_timeout + 60
        while time.monotonic() < deadline:
            if await asyncio.to_thread(status) == "LOST":
                lost_at = time.time()
                break
            await asyncio.sleep(0.1)
        lost_detect_s = (lost_at - last) if lost_at else float("nan")
        log(f"LOST after {lost_detect_s:.2f} s (agent_lost_timeout {args.lost_timeout:g} s, "
            f"etcd lease {LEASE_TTL:g} s)")
        return dict(agents=len(agents), hub_cpu_pct=hub_cpu_pct,
                    event_lag_p99_ms=1000 * pct(lags, 99), event_lag_p50_ms=1000 * pct(lags, 50),
                    lost_detect_s=lost_detect_s, handled=len(lags))
    finally:
        for a in agents:
            if a.task is not None:
                a.task.cancel()
        await asyncio.gather(*(a.reg.stop() for a in agents), return_exceptions=True)
        await bus.close()
        await runner.cleanup()
        engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between heartbeats")
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window")
    ap.add_argument("--lost-timeout", type=float, default=15.0,
                    help="the hub's agent_lost_timeout (seconds)")
    ap.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    ap.add_argument("--hub-arg", action="append", default=[],
                    help="extra hub command-line option, e.g. --hub-arg=--BackendAIManager.reconcile_interval=600")
    args = ap.parse_args()
    services = []
    hub = None
    try:
        # The bus authenticated as docs/cluster.md sets it up: no anonymous user, the
        # hub's own, and the agents' (one shared user here; per agent in the docs).
        import secrets
        import tempfile

        hub_pw, agent_pw = secrets.token_hex(12), secrets.token_hex(12)
        acl = os.path.join(tempfile.mkdtemp(prefix="bai-acl-"), "users.acl")
        with open(acl, "w") as f:
            f.write("user default off\n"
                    f"user hub on >{hub_pw} ~* &* +@all -@dangerous\n"
                    f"user agents on >{agent_pw} resetchannels -@all +xadd +del +hset +pexpire "
                    "+multi +exec +ping +select %W~backendai.events %W~backendai.agent-stats.*\n")
        redis, etcd = Redis("--aclfile", acl), Etcd()
        services += [redis, etcd]
        hub_redis = f"redis://hub:{hub_pw}@127.0.0.1:{redis.port}/0"
        agents_redis = f"redis://agents:{agent_pw}@127.0.0.1:{redis.port}/0"
        if args.db == "postgres":
            pg = Postgres()
            services.append(pg)
            db_url = pg.new_database("bench_agents")
        else:
            db_url = None
        etcd_url = f"http://127.0.0.1:{etcd.port}"
        hub = Hub(
            db_url=db_url or "sqlite:///placeholder", backend="local",
            extra_env={"BACKENDAI_REDIS_URL": hub_redis, "BACKENDAI_ETCD_URL": etcd_url,
                       "BACKENDAI_AGENT_TOKEN": TOKEN},
            extra_args=["--BackendAIManager.embedded_agent=False",
                        f"--BackendAIManager.agent_lost_timeout={args.lost_timeout}",
                        *args.hub_arg],
        )
        if db_url is None:
            db_url = f"sqlite:///{hub.dir}/bench.sqlite"
            hub.env["BACKENDAI_DB_URL"] = db_url
        hub.start()
        log(f"hub up ({args.db}); {args.agents} agents every {args.interval:g} s")
        out = asyncio.run(bench(args, hub, agents_redis, etcd_url, db_url))
    finally:
        if hub is not None:
            hub.close()
        for s in services:
            s.stop()
    print(json.dumps(out))
    print(f"agents={out['agents']} hub_cpu_pct={out['hub_cpu_pct']:.2f} "
          f"event_lag_p99_ms={out['event_lag_p99_ms']:.2f} lost_detect_s={out['lost_detect_s']:.2f}")


if __name__ == "__main__":
    main()
