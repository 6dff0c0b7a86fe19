"""Placement that knows what agents hold (issues 25 and 30), against the real database.

The agents' rows say what their heartbeats reported (``images``: the labelled images on
their engine; ``pool_ready``: ready pooled kernels per warm pool); every selector
prefers, among the agents that fit, one with a ready pooled kernel of the session's
pool, then one holding its image, then one that may pull it, and keeps its own rule
within each tier and its other rules (designated agents, room) everywhere.
"""

from __future__ import annotations

import pytest
from sqlalchemy import update

from jupyterhub_backendai.manager.access import Principal
from jupyterhub_backendai.manager.scheduler import schedule_pass
from jupyterhub_backendai.manager.warmpool import pool_key
from jupyterhub_backendai.models import Agent, ResourcePreset, Session, WarmPool

from .scheduler_world import World, slots

ROOT = Principal(user_id="root", username="root", email="root@example.com",
                 role="superadmin", domain="default")

IMG = "registry.example/lab/python:3.11"


@pytest.fixture
def w(sm) -> World:
    w = World(sm)
    w.user("alice")
    return w


def holds(w: World, aid: str, images=None, ready=None, backend: str = "docker") -> None:
    """What agent ``aid``'s heartbeat said it holds."""
    with w.sm.begin() as s:
        s.execute(update(Agent).where(Agent.id == aid)
                  .values(images=images, pool_ready=ready, backend=backend))


def start(w: World, name: str, image: str = IMG, **kw) -> str:
    sid = w.enqueue("alice", name, **kw)
    with w.sm.begin() as s:
        s.execute(update(Session).where(Session.id == sid).values(image=image))
    return sid


def warm_pool(w: World, cpu=1, mem="1g") -> str:
    with w.sm.begin() as s:
        s.add(ResourcePreset(name="warm-small", resource_slots=slots(cpu=cpu, mem=mem)))
        s.flush()
        s.add(WarmPool(resource_group="default", image=IMG, preset="warm-small", size=2,
                       status_info=""))
    return pool_key("default", IMG, "warm-small")


@pytest.mark.parametrize("selector", ["concentrated", "dispersed", "roundrobin"])
def test_every_selector_prefers_the_agent_holding_the_image(w, sm, selector):
    # Without the image: concentrated would take a1 (least free), dispersed a3 (most
    # free), round-robin a1 (first in turn). Only a2 holds the image.
    w.group(scheduler_opts={"agent_selector": selector})
    w.agent("a1", cpu=4, mem="64g")
    w.agent("a2", cpu=6, mem="64g")
    w.agent("a3", cpu=8, mem="64g")
    holds(w, "a1", images=["other:1"])
    holds(w, "a2", images=["other:1", IMG])
    holds(w, "a3", images=["other:1"])
    start(w, "s1")
    start(w, "plain", image="other:1")  # every agent holds it: the selector's own rule
    schedule_pass(sm, "default")
    assert w.agents_of("s1") == ["a2"]
    assert w.agents_of("plain") == {"concentrated": ["a1"], "dispersed": ["a3"],
                                    "roundrobin": ["a3"]}[selector]


def test_a_holder_without_room_gives_way_to_the_rule(w, sm):
    w.agent("a1", cpu=4, mem="64g")
    w.agent("a2", cpu=1, mem="64g")
    holds(w, "a1", images=[])
    holds(w, "a2", images=[IMG])
    start(w, "big", cpu=2)
    start(w, "small", cpu=1)
    schedule_pass(sm, "default")
    assert w.agents_of("big") == ["a1"]  # a2 holds the image but has no room: a1 pulls
    assert w.agents_of("small") == ["a2"]


def test_designated_agents_stay_the_only_choice(w, sm):
    w.agent("a1", cpu=4, mem="64g")
    w.agent("a2", cpu=4, mem="64g")
    holds(w, "a1", images=[IMG])
    holds(w, "a2", images=[])
    start(w, "pinned", designated=["a2"])
    schedule_pass(sm, "default")
    assert w.agents_of("pinned") == ["a2"]


def test_an_agent_that_may_pull_goes_before_one_that_cannot(w, sm):
    # Nobody holds the image: the docker agent pulls it; the local-process agent, larger
    # (dispersed would take it), can run only its own image.
    w.group(scheduler_opts={"agent_selector": "dispersed"})
    w.agent("docker-node", cpu=2, mem="64g")
    w.agent("local-node", cpu=8, mem="64g")
    holds(w, "docker-node", images=["other:1"])
    holds(w, "local-node", images=["local/python"], backend="local")
    start(w, "s1")
    start(w, "local", image="local/python")
    schedule_pass(sm, "default")
    assert w.agents_of("s1") == ["docker-node"]
    assert w.agents_of("local") == ["local-node"]


def test_a_ready_pooled_kernel_draws_its_session_once(w, sm):
    key = warm_pool(w)
    w.group(scheduler_opts={"agent_selector": "dispersed"})
    w.agent("a1", cpu=4, mem="64g")
    w.agent("a2", cpu=8, mem="64g")
    w.agent("a3", cpu=16, mem="64g")
    holds(w, "a1", images=[IMG], ready={key: 1})
    holds(w, "a2", images=[IMG])
    holds(w, "a3", images=[])
    start(w, "first")                 # the preset's slots: a1's pooled kernel
    start(w, "other", cpu=2)          # not the preset: the image decides (a2)
    schedule_pass(sm, "default")
    assert w.agents_of("first") == ["a1"]
    assert w.agents_of("other") == ["a2"]
    # The next pass: a1's row still says 1 ready (its heartbeat has not come), but
    # "first" is starting there without a container: it will bind that kernel.
    start(w, "second")
    schedule_pass(sm, "default")
    assert w.agents_of("second") == ["a2"]


def test_within_one_pass_each_pooled_kernel_draws_one_session(w, sm):
    key = warm_pool(w)
    w.group(scheduler_opts={"agent_selector": "concentrated"})
    w.agent("a1", cpu=8, mem="64g")
    w.agent("a2", cpu=8, mem="64g")
    w.agent("a3", cpu=2, mem="64g")
    for a in ("a1", "a2", "a3"):
        holds(w, a, images=[IMG])
    holds(w, "a1", images=[IMG], ready={key: 1})
    holds(w, "a2", images=[IMG], ready={key: 2})
    for n in ("s1", "s2", "s3", "s4"):
        start(w, n)
    schedule_pass(sm, "default")
    placed = sorted(w.agents_of(n)[0] for n in ("s1", "s2", "s3", "s4"))
    # Three pooled kernels draw three sessions; the fourth packs by the rule (a3 is
    # the fullest that fits).
    assert placed == ["a1", "a2", "a2", "a3"]


# -- real agents: what their heartbeats report, where sessions go -------------------


async def _row(mgr, aid: str) -> Agent:
    return await mgr.db(lambda s: s.get(Agent, aid))


async def _row_saying(mgr, aid: str) -> Agent | None:
    """The agent's row once a heartbeat said what it holds."""
    row = await _row(mgr, aid)
    return row if row is not None and row.images is not None else None


async def _poll(fn, what: str, timeout: float = 120):
    """Until ``await fn()`` is truthy (a bound for hangs, not a speed check)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = await fn()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _selector(mgr, name: str) -> None:
    def work(s):
        from jupyterhub_backendai.models import ResourceGroup

        g = s.get(ResourceGroup, "default")
        g.scheduler_opts = dict(g.scheduler_opts or {}, agent_selector=name)
    await mgr.db(work)


def test_real_agents_report_their_images_and_a_session_goes_where_its_image_is(db_url, tmp_path):
    """A Docker agent (the kernel image on its engine) and a larger local-process agent
    (its one image): each heartbeat says what it holds; the dispersed selector would
    take the larger agent, the Docker image's session goes to the Docker agent and
    runs there, the local image's session to the local agent."""
    import asyncio

    from jupyterhub_backendai.common.slots import ResourceSlot

    from .hub import KERNEL_IMAGE
    from .inproc import DEAD, add_agent, assert_consistent, make_user, running_manager, wait_status

    async def run():
        async with running_manager(db_url, tmp_path, "docker",
                                   slots={"cpu": 2, "mem": "4g"}) as mgr:
            local = await add_agent(mgr, tmp_path, "local", slots={"cpu": 8, "mem": "16g"},
                                    name="b")
            dock = mgr.agent.agent_id
            await _selector(mgr, "dispersed")
            row = await _poll(lambda: _row_saying(mgr, dock), "the docker agent's images")
            assert KERNEL_IMAGE in (row.images or []), row.images
            lrow = await _poll(lambda: _row_saying(mgr, local.agent_id), "the local agent's images")
            assert lrow.images == [local.local_image] and KERNEL_IMAGE not in lrow.images
            # The catalogue holds what the first agent held; the second agent's own image
            # is catalogued by an admin's rescan of the agents' images (docs/images.md).
            await mgr.registries.rescan(ROOT, "local")
            user = await make_user(mgr)
            ids = {}
            for name, image in (("on-docker", KERNEL_IMAGE), ("on-local", local.local_image)):
                ids[name] = await mgr.enqueue(
                    username=user, name=name, image=image,
                    slots=ResourceSlot(cpu="1", mem=256 * 2**20), environ={},
                    service_prefix="/", session_type="batch", startup_command="echo ran here")
            done = {n: await wait_status(mgr, sid, DEAD) for n, sid in ids.items()}
            for n, s in done.items():
                assert (s.status, s.result) == ("TERMINATED", "SUCCESS"), (n, s.status_info)
                assert "ran here" in (s.kernels[0].logs or ""), n
            assert done["on-docker"].kernels[0].agent_id == dock
            assert done["on-local"].kernels[0].agent_id == local.agent_id
            await _poll(lambda: _nothing_left(mgr, dock, local), "nothing left")
            assert_consistent(mgr)

    asyncio.run(run())


async def _nothing_left(mgr, *agents) -> bool:
    from .inproc import leftovers, occupied

    ids = [a if isinstance(a, str) else a.agent_id for a in agents]
    used = await occupied(mgr)
    return all(not used.get(a) for a in ids) and all(
        leftovers(mgr.local_agents[a]) == [] for a in ids)


def test_a_session_goes_to_the_agent_with_its_pooled_kernel_and_binds_it(db_url, tmp_path):
    """Two Docker agents, a warm pool of one kernel: it fills on one of them, and that
    agent's heartbeat says so. The group's selector is set so that its own rule would
    take the other agent; the matching session goes to the pooled kernel's agent and
    takes the kernel (its id, a hit), and the pool refills."""
    import asyncio

    from jupyterhub_backendai.common.slots import ResourceSlot
    from jupyterhub_backendai.manager.scheduler.metrics import counter_value
    from jupyterhub_backendai.manager.warmpool import REQUESTS

    from .hub import KERNEL_IMAGE
    from .inproc import add_agent, assert_consistent, make_user, running_manager, wait_status

    def configure(c):
        c.BackendAIManager.warm_pool_interval = 0.5

    async def run():
        async with running_manager(db_url, tmp_path, "docker", slots={"cpu": 3, "mem": "6g"},
                                   configure=configure) as mgr:
            other = await add_agent(mgr, tmp_path, "docker", slots={"cpu": 3, "mem": "6g"},
                                    name="b")
            preset = f"wp-{other.agent_id[-8:]}"
            await mgr.ops.create_resource_preset(ROOT, {
                "name": preset, "resource_slots": {"cpu": "0.5", "mem": "512m"}})
            await mgr.ops.set_warm_pool(ROOT, {"resource_group": "default",
                                               "image": KERNEL_IMAGE, "preset": preset,
                                               "size": 1})
            key = pool_key("default", KERNEL_IMAGE, preset)
            mgr.warmpool.kick(now=True)

            async def reported():
                for aid in (mgr.agent.agent_id, other.agent_id):
                    row = await _row(mgr, aid)
                    if (row.pool_ready or {}).get(key):
                        return aid
                return None

            pooled_on = await _poll(reported, "a ready pooled kernel in a heartbeat", 180)
            pooled = [p.kernel_id for p in mgr.warmpool.kernels.values() if p.key == key]
            assert len(pooled) == 1
            # Both agents are empty and alike but for the pooled kernel (which the record
            # does not count): concentrated takes the first id, dispersed the last.
            first, last = sorted((mgr.agent.agent_id, other.agent_id))
            await _selector(mgr, "dispersed" if pooled_on == first else "concentrated")
            labels = {"resource_group": "default", "image": KERNEL_IMAGE, "preset": preset}
            hits = counter_value(REQUESTS, **labels, outcome="hit")
            user = await make_user(mgr)
            sid = await mgr.enqueue(
                username=user, name="warm", image=KERNEL_IMAGE,
                slots=ResourceSlot(cpu="0.5", mem=512 * 2**20), environ={},
                service_prefix="/", session_type="interactive", home_folder="home")
            sess = await wait_status(mgr, sid, ("RUNNING", "ERROR", "TERMINATED", "CANCELLED"),
                                     timeout=180)
            assert sess.status == "RUNNING", sess.status_info
            assert sess.kernels[0].agent_id == pooled_on
            assert sess.kernels[0].id == pooled[0]
            assert counter_value(REQUESTS, **labels, outcome="hit") == hits + 1
            # The pool refills (the bound kernel is no pooled kernel any more).
            await _poll(reported, "the pool refilled", 180)
            await mgr.ops.set_warm_pool(ROOT, {"resource_group": "default",
                                               "image": KERNEL_IMAGE, "preset": preset,
                                               "size": 0})
            await mgr.destroy_session(sid)
            await wait_status(mgr, sid, ("TERMINATED", "ERROR"))
            mgr.warmpool.kick(now=True)

            async def settled():
                return mgr.warmpool.settled() and await _nothing_left(
                    mgr, mgr.agent.agent_id, other) and mgr.warmpool.settled()

            await _poll(settled, "the pool gone, nothing left", 180)
            assert_consistent(mgr)

    asyncio.run(run())
    # The agents stopped with their pools empty: no mount of theirs stays on the host.
    with open("/proc/self/mountinfo") as f:
        assert not [line for line in f if str(tmp_path) in line]


def test_the_pool_refills_after_the_starts_in_flight_and_warms_up_on_spare_cpu(db_url, tmp_path):
    """Issue 30, the morning rush with a warm pool: a refill started beside five pooled
    starts took the CPU their servers needed (1.6 s for the five, 1.1 s once the refill
    waited). A refill now waits while this manager has a start in flight (from its
    placement until its spawner's server answers: ``Manager.answering``, what the
    spawner enters), and runs once it is over, or after ``warm_pool_interval`` all the
    same. The kernels it starts warm up at the least CPU weight the engine knows, and
    have every kernel's weight once warm (binding then needs no engine update)."""
    import asyncio
    import json
    import os
    import stat
    import subprocess
    import time

    from jupyterhub_backendai.agent.backends.docker import POOL_CPU_SHARES
    from jupyterhub_backendai.agent.warmpool import INBOX, READY_LINE

    from .hub import KERNEL_IMAGE
    from .inproc import running_manager

    def configure(c):
        c.BackendAIManager.warm_pool_interval = 60.0

    async def run():
        async with running_manager(db_url, tmp_path, "docker", slots={"cpu": 3, "mem": "6g"},
                                   configure=configure) as mgr:
            aid = mgr.agent.agent_id

            def pooled() -> list[str]:
                return subprocess.run(
                    ["docker", "ps", "-aq", "--filter", f"label=ai.backend.agent-id={aid}",
                     "--filter", "label=ai.backend.pool"],
                    capture_output=True, text=True, check=True).stdout.split()

            preset = f"wp-{aid[-8:]}"
            await mgr.ops.create_resource_preset(ROOT, {
                "name": preset, "resource_slots": {"cpu": "0.5", "mem": "512m"}})

            async def size(n: int) -> None:
                await mgr.ops.set_warm_pool(ROOT, {"resource_group": "default",
                                                   "image": KERNEL_IMAGE, "preset": preset,
                                                   "size": n})
                mgr.warmpool.kick(now=True)

            # A start in flight (a spawner waiting for its server): the refill waits ...
            with mgr.answering("a-session-starting"):
                await size(1)
                await _poll(lambda: _async(mgr.warmpool.settled()), "the round", 60)
                await asyncio.sleep(1.5)
                assert pooled() == [] and mgr.starts_in_flight() == 1
            # ... and runs once it is over (not after the 60 s interval).
            t0 = time.monotonic()
            await _poll(lambda: _async(pooled()), "the refill after the start", 30)
            assert time.monotonic() - t0 < 30
            [cid] = pooled()
            info = json.loads(subprocess.run(["docker", "inspect", cid], capture_output=True,
                                             text=True, check=True).stdout)[0]
            # It warms up on what nobody else wants.
            assert info["HostConfig"]["CpuShares"] == POOL_CPU_SHARES
            # Its inbox (the binding's environment, a session's token, comes there) lies
            # in a directory only root may enter.
            [inbox] = [m["Source"] for m in info["Mounts"] if m["Destination"] == INBOX]
            assert stat.S_IMODE(os.stat(os.path.dirname(inbox)).st_mode) == 0o700
            assert os.stat(inbox).st_uid == 1000 and os.listdir(inbox) == []
            # Once its waiter is ready (its imports done) it has every kernel's weight,
            # so that binding it needs no update from the engine.

            def warmed() -> bool:
                shares = json.loads(subprocess.run(
                    ["docker", "inspect", "-f", "{{json .HostConfig.CpuShares}}", cid],
                    capture_output=True, text=True, check=True).stdout)
                return shares == 1024

            await _poll(lambda: _async(warmed()), "the warmed kernel's weight", 120)
            logs = subprocess.run(["docker", "logs", cid], capture_output=True, text=True).stdout
            assert READY_LINE in logs

            # Starts that go on and on do not keep the pool from filling: after
            # warm_pool_interval it refills all the same.
            mgr.warm_pool_interval = 2.0
            with mgr.answering("a-start-that-goes-on"):
                t0 = time.monotonic()
                await size(2)
                await _poll(lambda: _async(len(pooled()) == 2), "the overdue refill", 60)
                assert time.monotonic() - t0 >= 1.5
            await size(0)
            await _poll(lambda: _async(pooled() == [] and mgr.warmpool.settled()),
                        "the pool emptied", 120)

    asyncio.run(run())


async def _async(value):
    return value
