"""The event bus: in-process and Redis Streams deliver every event, Redis to one consumer each."""

from __future__ import annotations

import asyncio

import pytest

from jupyterhub_backendai.common.events import InProcessEventBus, RedisEventBus


async def _collect(bus, n, got):
    done = asyncio.Event()

    async def handler(name, payload):
        got.append((name, payload))
        if len(got) >= n:
            done.set()

    await bus.start_consuming(handler)
    return done


@pytest.mark.parametrize("kind", ["inprocess", "redis"])
def test_events_arrive_in_order(kind, request):
    url = request.getfixturevalue("redis_server").fresh_url() if kind == "redis" else None
    asyncio.run(_in_order(url))


async def _in_order(url):
    bus = RedisEventBus(url, stream="t-order") if url else InProcessEventBus()
    got: list = []
    done = await _collect(bus, 3, got)
    for i in range(3):
        await bus.publish("kernel_terminated", {"kernel_id": f"k{i}", "exit_code": i})
    await asyncio.wait_for(done.wait(), 10)
    await bus.close()
    assert got == [("kernel_terminated", {"kernel_id": f"k{i}", "exit_code": i}) for i in range(3)]


def test_redis_consumer_group_delivers_each_event_once(redis_server):
    asyncio.run(_group(redis_server.fresh_url()))


async def _group(url):
    a = RedisEventBus(url, stream="t-group")
    b = RedisEventBus(url, stream="t-group")
    b.consumer += "-b"
    seen: list = []

    async def handler(name, payload):
        seen.append(payload["i"])

    await a.start_consuming(handler)
    await b.start_consuming(handler)
    pub = RedisEventBus(url, stream="t-group")
    for i in range(50):
        await pub.publish("x", {"i": i})
    for _ in range(100):
        if len(seen) >= 50:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    for bus in (a, b, pub):
        await bus.close()
    assert sorted(seen) == list(range(50))


class _RestartableRedis:
    """A redis-server of this test's own that can be killed and started again on the
    same port, with its data (append-only file) or without."""

    def __init__(self, tmp_path, persist: bool):
        from tests.services import free_port

        self.dir = str(tmp_path)
        self.port = free_port()
        self.persist = persist
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self):
        import subprocess

        from tests.services import wait_port

        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        wait_port(self.port, proc=self.proc)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        from tests.services import stop_process

        stop_process(self.proc)


@pytest.mark.parametrize("persist", [False, True], ids=["without-data", "with-data"])
def test_redis_restart_later_events_still_delivered(tmp_path, persist):
    """Redis killed and started again (empty, or from its append-only file): the
    consumer recreates its group when it is gone, and events published after the
    restart are delivered, each once."""
    server = _RestartableRedis(tmp_path, persist)
    server.start()
    try:
        asyncio.run(_restart(server, persist))
    finally:
        server.stop()


async def _restart(server, persist):
    import redis.asyncio as aioredis

    bus = RedisEventBus(server.url, stream="t-restart")
    seen: list = []
    arrived = asyncio.Event()

    async def handler(name, payload):
        seen.append(payload["i"])
        arrived.set()

    await bus.start_consuming(handler)
    pub = RedisEventBus(server.url, stream="t-restart")
    await pub.publish("x", {"i": 0})
    await asyncio.wait_for(arrived.wait(), 10)
    assert seen == [0]

    server.kill()
    server.start()
    probe = aioredis.from_url(server.url, decode_responses=True)
    groups = await probe.xinfo_groups("t-restart") if persist else []
    assert [g["name"] for g in groups] == (["manager"] if persist else [])

    # Published right after the restart, possibly before the consumer noticed it.
    for i in range(1, 6):
        for _ in range(100):
            try:
                await pub.publish("x", {"i": i})
                break
            except Exception:
                await asyncio.sleep(0.05)  # the publisher's pool reconnects
    for _ in range(400):
        if len(seen) >= 6:
            break
        await asyncio.sleep(0.05)
    # Nothing is left pending in the group: every event was acknowledged.
    for _ in range(100):
        pending = (await probe.xpending("t-restart", "manager"))["pending"]
        if pending == 0:
            break
        await asyncio.sleep(0.05)
    await probe.aclose()
    await bus.close()
    await pub.close()
    assert seen == [0, 1, 2, 3, 4, 5]
    assert pending == 0
