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
    url = request.getfixturevalue("redis_server").url if kind == "redis" else None
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
    asyncio.run(_group(redis_server.url))


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
