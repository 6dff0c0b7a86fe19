"""Session state changes are events across hubs (issue 11): every transition is
broadcast on the event bus, and a watcher in one manager process (what ``start()``,
``progress()`` and the readiness wait use) is woken by a transition another manager
process made, long before its safety poll. Real PostgreSQL, real Redis, real kernels.
"""

from __future__ import annotations

import asyncio

import pytest
from traitlets.config import Config

from jupyterhub_backendai.common.events import InProcessEventBus, RedisEventBus
from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.manager.core import SESSION_CHANGED, BackendAIManager

from .inproc import make_user, running_manager

# The watching manager's safety poll: the test's bounds stay far below it, so only a
# broadcast from the other manager can wake the watcher in time.
POLL = 60.0
BOUND = 20.0


def test_a_transition_in_one_hub_wakes_a_watcher_in_another(postgres, redis_server, tmp_path):
    """Manager A starts and stops a session; manager B (same PostgreSQL and Redis,
    status_poll_interval 60 s) watches it and sees PENDING .. RUNNING, then TERMINATED,
    each within 20 s: woken by A's ``session_changed`` broadcasts, not by its poll."""
    db_url = postgres.new_database("t_sessev")
    bus = redis_server.fresh_url()

    def cluster(c):
        c.BackendAIManager.redis_url = bus

    async def run():
        async with running_manager(db_url, tmp_path, "local", slots={"cpu": 2, "mem": "2g"},
                                   configure=cluster) as a:
            c = Config()
            c.BackendAIManager.db_url = db_url
            c.BackendAIManager.redis_url = bus
            c.BackendAIManager.embedded_agent = False
            c.BackendAIManager.status_poll_interval = POLL
            c.BackendAIManager.storage_volumes = a.test_config.BackendAIManager.storage_volumes
            b = BackendAIManager(config=c)
            await b.ready()
            # B only serves watchers here: its scheduler would compete for A's
            # in-process agent, which B cannot reach.
            b._loop_task.cancel()
            try:
                user = await make_user(a)
                sid = await a.enqueue(
                    username=user, name="watched", image="local/python",
                    slots=ResourceSlot(cpu=1, mem=256 * 2**20), environ={}, service_prefix="/",
                    session_type="batch", startup_command="sleep 300")
                loop = asyncio.get_running_loop()
                watch = b.watch(sid)
                seen = []
                t0 = loop.time()
                while not seen or seen[-1] != "RUNNING":
                    sess = await asyncio.wait_for(anext(watch), BOUND)
                    seen.append(sess.status)
                    assert sess.status not in ("ERROR", "CANCELLED", "TERMINATED"), sess.status_info
                assert loop.time() - t0 < POLL
                assert seen[-1] == "RUNNING" and len(seen) >= 2, seen

                stop = asyncio.create_task(a.destroy_session(sid))
                t0 = loop.time()
                while seen[-1] != "TERMINATED":
                    sess = await asyncio.wait_for(anext(watch), BOUND)
                    seen.append(sess.status)
                assert loop.time() - t0 < POLL
                await stop
                assert (sess.status, sess.status_info) == ("TERMINATED", "stopped")
                await watch.aclose()

                # B's readiness-style wait is woken the same way, told the new status
                # (a start's steps are waited past unread: issue 30).
                sid2 = await a.enqueue(
                    username=user, name="waited", image="local/python",
                    slots=ResourceSlot(cpu=1, mem=256 * 2**20), environ={}, service_prefix="/",
                    session_type="batch", startup_command="sleep 300")
                changes = await b.wait_change(sid2, BOUND)
                assert changes and changes <= {"PENDING", "SCHEDULED", "PREPARING", "CREATING",
                                               "RUNNING"}, changes
                # A wait for RUNNING in B: woken by A's broadcasts (its poll is 60 s).
                t0 = loop.time()
                sess = await asyncio.wait_for(b.wait_for(sid2, {"RUNNING"}), BOUND)
                assert sess.status == "RUNNING" and loop.time() - t0 < POLL
                stop = asyncio.create_task(a.destroy_session(sid2))
                sess = await asyncio.wait_for(b.wait_for(sid2, ()), BOUND)  # its end
                assert sess.status == "TERMINATED" and loop.time() - t0 < POLL
                await stop
            finally:
                await b.stop()

    asyncio.run(run())


def test_redis_broadcasts_reach_every_subscriber(redis_server):
    """Unlike the work queue (one manager per event), a broadcast reaches every
    subscribed process, once, in order; a subscriber hears nothing of its own past."""
    url = redis_server.fresh_url()

    async def run():
        buses = [RedisEventBus(url) for _ in range(3)]
        got: list[list] = [[] for _ in buses]
        try:
            await buses[0].broadcast(SESSION_CHANGED, {"id": "before", "status": None})
            for bus, box in zip(buses, got, strict=True):
                async def handler(name, payload, box=box):
                    box.append((name, payload["id"]))
                await bus.subscribe(handler)
            for i in range(20):
                await buses[i % 3].broadcast(SESSION_CHANGED, {"id": f"s{i}", "status": "RUNNING"})
            want = [(SESSION_CHANGED, f"s{i}") for i in range(20)]
            for _ in range(200):
                if all(len(box) >= 20 for box in got):
                    break
                await asyncio.sleep(0.05)
            assert got == [want, want, want]
        finally:
            for bus in buses:
                await bus.close()

    asyncio.run(run())


@pytest.mark.parametrize("persist", [False, True], ids=["without-data", "with-data"])
def test_broadcasts_after_a_redis_restart(tmp_path, persist):
    """Redis killed and started again (with or without its data): the subscriber is
    told of the gap (its waiters re-read the record) and hears later broadcasts."""
    from .test_events import _RestartableRedis

    server = _RestartableRedis(tmp_path, persist)
    server.start()

    async def run():
        sub, pub = RedisEventBus(server.url), RedisEventBus(server.url)
        got, gaps = [], []

        async def handler(name, payload):
            got.append(payload["id"])

        try:
            await sub.subscribe(handler, lambda: gaps.append(1))
            await pub.broadcast(SESSION_CHANGED, {"id": "one"})
            for _ in range(200):
                if got:
                    break
                await asyncio.sleep(0.05)
            assert got == ["one"]
            server.kill()
            server.start()
            for _ in range(200):
                if gaps:
                    break
                await asyncio.sleep(0.05)
            assert gaps == [1]
            await pub.broadcast(SESSION_CHANGED, {"id": "two"})
            for _ in range(200):
                if "two" in got:
                    break
                await asyncio.sleep(0.05)
            assert got == ["one", "two"]
        finally:
            await sub.close()
            await pub.close()
            server.stop()

    asyncio.run(run())


def test_in_process_bus_broadcasts_to_subscribers():
    async def run():
        bus = InProcessEventBus()
        got = []

        async def handler(name, payload):
            got.append((name, payload))

        await bus.subscribe(handler)
        await bus.broadcast(SESSION_CHANGED, {"id": "x", "status": "RUNNING"})
        assert got == [(SESSION_CHANGED, {"id": "x", "status": "RUNNING"})]

    asyncio.run(run())


def test_events_a_killed_consumer_left_are_handled_by_another(redis_server):
    """A manager killed after reading an event and before acknowledging it (a new
    process is a new consumer, so it never sees it again): a live consumer takes the
    event over once it has been idle ``claim_idle`` seconds, and handles it once."""
    url = redis_server.fresh_url()

    async def run():
        import redis.asyncio as aioredis

        dead = RedisEventBus(url)
        dead.consumer = "killed-manager"
        await dead._ensure_group()
        await dead.publish("kernel_terminated", {"kernel_id": "k1"})
        # What a killed manager leaves: the event read (pending on it), never acknowledged.
        got = await dead.redis.xreadgroup(dead.group, dead.consumer, {dead.stream: ">"}, count=10)
        assert got
        await dead.redis.aclose()

        live = RedisEventBus(url)
        live.claim_idle, live.claim_interval = 0.5, 0.2
        seen = []

        async def handler(name, payload):
            seen.append((name, payload))

        await live.start_consuming(handler)
        try:
            for _ in range(200):
                if seen:
                    break
                await asyncio.sleep(0.05)
            assert seen == [("kernel_terminated", {"kernel_id": "k1"})]
            probe = aioredis.from_url(url, decode_responses=True)
            pending = await probe.xpending(live.stream, live.group)
            await probe.aclose()
            assert pending["pending"] == 0
        finally:
            await live.close()

    asyncio.run(run())



def test_a_wait_for_running_reads_the_record_only_when_running_may_have_come(db_url, tmp_path):
    """Issue 30: a spawner's wait for its session read the session and its kernels at
    every change (seven times a pooled start, the most of the record's reads in a rush
    of five). ``wait_for`` reads first, then only after a change that says RUNNING or an
    end, or says nothing. Driven by hand on a session that waits (the scheduler
    stopped): the changes a start says, one that says nothing, and its end."""

    async def run():
        async with running_manager(db_url, tmp_path, "local",
                                   slots={"cpu": 2, "mem": "2g"}) as mgr:
            mgr._loop_task.cancel()  # nothing places it: it stays PENDING
            user = await make_user(mgr)
            sid = await mgr.enqueue(
                username=user, name="waited", image="local/python",
                slots=ResourceSlot(cpu=1, mem=256 * 2**20), environ={}, service_prefix="/",
                session_type="batch", startup_command="sleep 300")
            reads = [0]
            own = mgr.sessions.get_session

            async def counted(s):
                if asyncio.current_task() is waiter:
                    reads[0] += 1
                return await own(s)

            mgr.sessions.get_session = counted
            mgr.status_poll_interval = POLL  # only the changes wake it
            waiter = asyncio.create_task(mgr.wait_for(sid, {"RUNNING"}))

            async def settle():
                for _ in range(20):
                    await asyncio.sleep(0.01)

            await settle()
            assert reads[0] == 1  # the first read
            for step in ("SCHEDULED", "PREPARING", "CREATING"):
                mgr.changed(sid, step)
                await settle()
            assert reads[0] == 1  # waited past unread
            mgr.changed(sid)  # a change that does not say its status
            await settle()
            assert reads[0] == 2 and not waiter.done()
            mgr.changed(sid, "RUNNING")  # said, but not so in the record: read, waits on
            await settle()
            assert reads[0] == 3 and not waiter.done()
            await mgr.destroy_session(sid)  # its end, said by the change
            sess = await asyncio.wait_for(waiter, BOUND)
            assert sess.status in ("CANCELLED", "TERMINATED") and reads[0] == 4

    asyncio.run(run())


def test_a_pass_tells_the_watchers_of_the_sessions_it_gave_a_reason_or_cancelled(db_url, tmp_path):
    """A pass told every watcher of every session to read again (it may have written a
    waiting session's reason), which made each spawner waiting on a start read its
    session at each pass of a rush. It now tells those whose reason it wrote (PENDING)
    or that it cancelled, saying so: a session that cannot fit now gets its reason in
    its watch, long before the watch's poll, by a change that says PENDING (which a
    wait for RUNNING waits past unread)."""

    async def run():
        async with running_manager(db_url, tmp_path, "local",
                                   slots={"cpu": 2, "mem": "2g"}) as mgr:
            mgr._loop_task.cancel()  # the passes are this test's
            mgr.status_poll_interval = POLL
            user = await make_user(mgr)
            taker = await mgr.enqueue(
                username=user, name="taker", image="local/python",
                slots=ResourceSlot(cpu=2, mem=256 * 2**20), environ={}, service_prefix="/",
                session_type="batch", startup_command="sleep 300")
            assert await mgr.schedule_once() == [taker]  # it takes the agent's CPUs
            sid = await mgr.enqueue(
                username=user, name="waiting", image="local/python",
                slots=ResourceSlot(cpu=1, mem=256 * 2**20), environ={}, service_prefix="/",
                session_type="batch", startup_command="sleep 300")
            watch = mgr.watch(sid)
            first = await asyncio.wait_for(anext(watch), BOUND)
            assert (first.status, first.status_info) == ("PENDING", "waiting for the scheduler")
            changes = asyncio.create_task(mgr.wait_change(sid, BOUND))
            await asyncio.sleep(0.05)
            await mgr.schedule_once()
            assert await changes == {"PENDING"}
            sess = await asyncio.wait_for(anext(watch), BOUND)  # woken, not polled
            assert sess.status == "PENDING" and sess.status_info != first.status_info
            await watch.aclose()
            for s in (sid, taker):
                await mgr.destroy_session(s)

    asyncio.run(run())
