"""Per-keypair rate limits: a sliding window of admitted requests, in process or in Redis.

The limiter tests use a short window (the behaviour does not depend on its
length); the HTTP tests run a real hub and lower a keypair's ``rate_limit``
through the API.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from jupyterhub_backendai.manager.ratelimit import (
    InProcessRateLimiter,
    InProcessSignatureMemory,
    RedisRateLimiter,
    RedisSignatureMemory,
    make_rate_limiter,
    make_signature_memory,
)

from .test_signing import API, hub_for, signed


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_in_process_window_slides():
    clock = Clock()
    lim = InProcessRateLimiter(window=10, clock=clock)
    seen = []
    for _ in range(3):
        r = await lim.hit("AK", 3)
        seen.append((r.allowed, r.remaining))
        clock.now += 2
    assert seen == [(True, 2), (True, 1), (True, 0)]
    # t=1006: all three still inside the window; refused, and refusals are not counted.
    r = await lim.hit("AK", 3)
    assert (r.allowed, r.remaining, r.limit, r.window) == (False, 0, 3, 10)
    assert r.reset == pytest.approx(4.0)  # the first request (t=1000) leaves at t=1010
    # t=1010: exactly one window after the first request, which no longer counts.
    clock.now = 1010.0
    r = await lim.hit("AK", 3)
    assert (r.allowed, r.remaining) == (True, 0)
    # Other keypairs have their own windows.
    r = await lim.hit("OTHER", 3)
    assert (r.allowed, r.remaining) == (True, 2)
    # After a whole quiet window everything is forgotten.
    clock.now = 1030.0
    assert (await lim.hit("AK", 3)).remaining == 2


async def test_in_process_headers():
    lim = InProcessRateLimiter(window=900, clock=Clock())
    h = (await lim.hit("AK", 5)).headers()
    assert h["X-RateLimit-Limit"] == "5"
    assert h["X-RateLimit-Remaining"] == "4"
    assert h["X-RateLimit-Window"] == "900"


def test_make_rate_limiter_picks_by_url(redis_server):
    assert isinstance(make_rate_limiter(None), InProcessRateLimiter)
    assert isinstance(make_rate_limiter(""), InProcessRateLimiter)
    r = make_rate_limiter(redis_server.url)
    assert isinstance(r, RedisRateLimiter)
    asyncio.run(r.close())


async def test_redis_window_remaining_and_refusal(redis_server):
    lim = RedisRateLimiter(redis_server.url, window=1.5)
    key = "AK" + uuid.uuid4().hex
    try:
        results = [await lim.hit(key, 3) for _ in range(4)]
        assert [(r.allowed, r.remaining) for r in results] == [
            (True, 2), (True, 1), (True, 0), (False, 0)
        ]
        assert 0 < results[-1].reset <= 1.5
        assert results[-1].window == 1
        await asyncio.sleep(1.6)
        r = await lim.hit(key, 3)
        assert (r.allowed, r.remaining) == (True, 2)
        # The sorted set expires with the window: nothing is left behind for idle keys.
        assert await lim.redis.pttl(lim.prefix + key) <= 1500
    finally:
        await lim.close()


async def test_redis_two_hubs_cannot_exceed_the_limit_together(redis_server):
    """Two limiters (two hubs' connections) hammering one keypair admit exactly the limit."""
    a = RedisRateLimiter(redis_server.url, window=60)
    b = RedisRateLimiter(redis_server.url, window=60)
    key = "AK" + uuid.uuid4().hex
    try:
        results = await asyncio.gather(*(lim.hit(key, 25) for _ in range(40) for lim in (a, b)))
        assert sum(r.allowed for r in results) == 25
        assert sorted(r.remaining for r in results if r.allowed) == list(range(25))
        assert await a.redis.zcard(a.prefix + key) == 25
    finally:
        await a.close()
        await b.close()


# -- over HTTP -------------------------------------------------------------------------


def _limited_keypair(hub, limit: int) -> tuple[str, str]:
    """A new keypair of the superadmin with a low rate limit, made through the API."""
    r = signed(hub, "POST", "/keypairs", *hub.admin_keys, json={})
    assert r.status_code == 201, r.text
    kp = r.json()
    ak, sk = kp["access_key"], kp["secret_key"]
    r = signed(hub, "PATCH", f"/keypairs/{ak}", *hub.admin_keys, json={"rate_limit": limit})
    assert r.status_code == 200, r.text
    return ak, sk


def _check_limit_over_http(hub) -> None:
    ak, sk = _limited_keypair(hub, 3)
    got = [signed(hub, "GET", "/whoami", ak, sk) for _ in range(3)]
    assert [r.status_code for r in got] == [200, 200, 200]
    assert [r.headers["X-RateLimit-Remaining"] for r in got] == ["2", "1", "0"]
    assert {r.headers["X-RateLimit-Limit"] for r in got} == {"3"}
    assert {r.headers["X-RateLimit-Window"] for r in got} == {"900"}
    r = signed(hub, "GET", "/whoami", ak, sk)
    assert r.status_code == 429, r.text
    assert r.headers["Content-Type"].startswith("application/problem+json")
    assert r.headers["X-RateLimit-Limit"] == "3"
    assert r.headers["X-RateLimit-Remaining"] == "0"
    assert r.headers["X-RateLimit-Window"] == "900"
    assert int(r.headers["Retry-After"]) > 0
    assert "rate limit" in r.json()["detail"]
    # Other keypairs are not affected.
    r = signed(hub, "GET", "/whoami", *hub.admin_keys)
    assert r.status_code == 200
    assert int(r.headers["X-RateLimit-Remaining"]) > 0


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def hub(request, tmp_path_factory):
    yield from hub_for(request, tmp_path_factory, request.param)


def test_http_limit_in_process(hub):
    _check_limit_over_http(hub)


@pytest.fixture(scope="module")
def redis_hub(request, tmp_path_factory, redis_server):
    yield from hub_for(request, tmp_path_factory, "postgresql",
                       extra_env={"BACKENDAI_REDIS_URL": redis_server.url})


def test_http_limit_in_redis(redis_hub, redis_server):
    _check_limit_over_http(redis_hub)
    # The window lives in Redis, where every hub of the cluster finds it.
    import redis

    r = redis.Redis.from_url(redis_server.url)
    assert any(k.startswith(b"backendai.ratelimit:") for k in r.keys("backendai.ratelimit:*"))
    r.close()


def test_http_concurrent_clients_on_redis_share_the_limit(redis_hub):
    ak, sk = _limited_keypair(redis_hub, 10)

    def call(_):
        return signed(redis_hub, "GET", "/whoami", ak, sk).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(call, range(24)))
    assert codes.count(200) == 10, codes
    assert codes.count(429) == 14, codes


def test_token_requests_count_against_the_main_keypair(hub):
    # The superadmin's main keypair is the one made with it (hub.admin_keys).
    before = signed(hub, "GET", "/whoami", *hub.admin_keys)
    r = requests.get(hub.base + API + "/whoami",
                     headers={"Authorization": f"token {hub.admin_token}"})
    assert r.status_code == 200, r.text
    assert r.headers["X-RateLimit-Limit"] == before.headers["X-RateLimit-Limit"]
    assert (int(r.headers["X-RateLimit-Remaining"])
            == int(before.headers["X-RateLimit-Remaining"]) - 1)


def test_in_process_memory_is_bounded_by_the_limit():
    # Refused requests are not stored: at most `limit` timestamps per keypair.
    lim = InProcessRateLimiter(window=900, clock=time.monotonic)

    async def many():
        for _ in range(50):
            await lim.hit("AK", 5)

    asyncio.run(many())
    assert len(lim._hits["AK"]) == 5


async def test_redis_outage_admits_rather_than_taking_the_api_down():
    from tests.services import free_port

    lim = RedisRateLimiter(f"redis://127.0.0.1:{free_port()}/0", window=60)
    try:
        r = await lim.hit("AK", 1)
        assert r.allowed and r.limit == 1
        assert (await lim.hit("AK", 1)).allowed  # nothing is counted without Redis
    finally:
        await lim.close()
    strict = RedisRateLimiter(f"redis://127.0.0.1:{free_port()}/0", window=60, fail_open=False)
    try:
        import redis.exceptions

        with pytest.raises(redis.exceptions.ConnectionError):
            await strict.hit("AK", 1)
    finally:
        await strict.close()


# -- replay protection: remembered signatures ---------------------------------------------


async def test_in_process_signature_memory_refuses_a_second_use_until_expiry():
    clock = Clock()
    mem = InProcessSignatureMemory(clock=clock)
    assert await mem.first_use("a" * 64, 10)
    assert not await mem.first_use("a" * 64, 10)
    assert await mem.first_use("b" * 64, 20)
    clock.now += 10  # a's date has left the window: it could not be accepted anyway
    assert len(mem) == 2
    assert await mem.first_use("c" * 64, 5)
    assert len(mem) == 2  # a was pruned
    assert not await mem.first_use("b" * 64, 20)
    clock.now += 100
    assert await mem.first_use("d" * 64, 5)
    assert len(mem) == 1  # memory holds only what could still be replayed


async def test_redis_signature_memory_is_shared_by_hubs(redis_server):
    assert isinstance(make_signature_memory(None), InProcessSignatureMemory)
    a = RedisSignatureMemory(redis_server.url)
    b = RedisSignatureMemory(redis_server.url)
    sig = uuid.uuid4().hex * 2
    try:
        assert await a.first_use(sig, 30)
        assert not await b.first_use(sig, 30)  # replayed to another hub of the cluster
        assert not await a.first_use(sig, 30)
        assert 0 < await a.redis.pttl(a.prefix + sig) <= 30000  # forgotten after the window
    finally:
        await a.close()
        await b.close()


async def test_redis_outage_still_refuses_replays_to_the_same_hub():
    from tests.services import free_port

    mem = RedisSignatureMemory(f"redis://127.0.0.1:{free_port()}/0")
    try:
        assert await mem.first_use("e" * 64, 30)
        assert not await mem.first_use("e" * 64, 30)
    finally:
        await mem.close()


def test_http_replay_refused_across_a_redis_cluster(redis_hub, redis_server):
    from jupyterhub_backendai.common import signing

    url = redis_hub.base + API + "/whoami"
    h = signing.sign_request("GET", url, *redis_hub.admin_keys)
    assert requests.get(url, headers=h, timeout=60).status_code == 200
    r = requests.get(url, headers=h, timeout=60)
    assert r.status_code == 401 and "a replay" in r.json()["detail"]
    import redis

    sig = h["Authorization"].rsplit(":", 1)[1]
    client = redis.Redis.from_url(redis_server.url)
    assert client.exists("backendai.signature:" + sig) == 1
    client.close()
