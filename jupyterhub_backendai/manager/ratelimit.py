"""Per-keypair request rate limits: a sliding window of 900 s, as in Backend.AI.

A keypair may make ``rate_limit`` requests in any window of ``window`` seconds.
The window slides with each request (it is not reset on the quarter hour), so a
burst at the end of one quarter cannot be followed by a full burst at the start
of the next. Only admitted requests are counted: a client that keeps knocking
while refused gets its slots back as its old requests age out (Backend.AI counts
refused requests too, which can lock out a client in a retry loop).

Two implementations with one interface, like the event bus:

- :class:`InProcessRateLimiter`: the embedded default; timestamps in memory,
  one deque per keypair (at most ``limit`` entries each).
- :class:`RedisRateLimiter`: cluster mode; one sorted set per keypair, updated
  by a Lua script so that prune, count and add are one atomic step, with
  Redis's own clock, so several hubs share one window and cannot together
  exceed the limit.

``get_rate_limiter(manager)`` builds the manager's limiter once, from
``manager.redis_url``, and keeps it on the manager object.

The same module remembers accepted request signatures (replay protection,
:class:`SignatureMemory`): a signature may be used once while its date is inside
the clock-skew window; in memory in one process, in Redis (``SET NX PX``) in
cluster mode so that a request replayed to another hub is refused as well.
"""

from __future__ import annotations

import collections
import heapq
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

WINDOW = 900.0
REDIS_PREFIX = "backendai.ratelimit:"
SIGNATURE_PREFIX = "backendai.signature:"


@dataclass(frozen=True)
class RateLimitResult:
    """The verdict for one request and what the ``X-RateLimit-*`` headers report."""

    allowed: bool
    limit: int
    remaining: int
    window: int
    # Seconds until the oldest counted request leaves the window (a slot frees).
    reset: float

    def headers(self) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Window": str(self.window),
            "X-RateLimit-Reset": str(math.ceil(self.reset)),
        }


class RateLimiter:
    """Count a request against ``key``'s window and say whether it may proceed."""

    def __init__(self, window: float = WINDOW) -> None:
        if window <= 0:
            raise ValueError("the rate-limit window must be positive")
        self.window = window

    async def hit(self, key: str, limit: int) -> RateLimitResult:
        raise NotImplementedError

    async def close(self) -> None:
        pass

    def _result(self, allowed: bool, limit: int, count: int, reset: float) -> RateLimitResult:
        return RateLimitResult(
            allowed=allowed, limit=limit, remaining=max(0, limit - count),
            window=int(self.window), reset=max(0.0, reset),
        )


class InProcessRateLimiter(RateLimiter):
    """Exact sliding window in one process (the hub's event loop makes each hit atomic)."""

    def __init__(self, window: float = WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(window)
        self._clock = clock
        self._hits: dict[str, collections.deque[float]] = {}

    async def hit(self, key: str, limit: int) -> RateLimitResult:
        now = self._clock()
        q = self._hits.get(key)
        if q is None:
            q = self._hits[key] = collections.deque()
        horizon = now - self.window
        while q and q[0] <= horizon:
            q.popleft()
        allowed = len(q) < limit
        if allowed:
            q.append(now)
        reset = (q[0] + self.window - now) if q else 0.0
        result = self._result(allowed, limit, len(q), reset)
        if not q:
            del self._hits[key]
        return result


# KEYS[1]: the keypair's sorted set. ARGV: window (µs), limit, a unique member.
# Scores are Redis TIME in microseconds (below 2**53, exact as doubles).
_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
local allowed = 0
if count < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  count = count + 1
  allowed = 1
end
local reset = 0
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if oldest[2] then
  reset = tonumber(oldest[2]) + window - now
end
if count > 0 then
  redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
end
return {allowed, count, reset}
"""


class RedisRateLimiter(RateLimiter):
    """Sliding window in Redis, shared by every hub that uses the same Redis."""

    def __init__(self, url: str, window: float = WINDOW, prefix: str = REDIS_PREFIX,
                 fail_open: bool = True) -> None:
        super().__init__(window)
        import redis.asyncio as aioredis

        self.redis = aioredis.from_url(url, decode_responses=True)
        self.prefix = prefix
        self.fail_open = fail_open
        self._script: Any = self.redis.register_script(_LUA)
        self._last_warning = 0.0

    async def hit(self, key: str, limit: int) -> RateLimitResult:
        import redis.exceptions

        try:
            allowed, count, reset_us = await self._script(
                keys=[self.prefix + key],
                args=[int(self.window * 1_000_000), int(limit), uuid.uuid4().hex],
            )
        except (redis.exceptions.RedisError, OSError):
            if not self.fail_open:
                raise
            # A Redis outage must not take the whole API down: admit, and say so in the log.
            if time.monotonic() - self._last_warning > 60:
                self._last_warning = time.monotonic()
                log.warning("rate limiter: Redis unavailable; admitting requests unlimited",
                            exc_info=True)
            return self._result(True, limit, 0, 0.0)
        return self._result(bool(int(allowed)), limit, int(count), int(reset_us) / 1_000_000)

    async def close(self) -> None:
        await self.redis.aclose()


def make_rate_limiter(redis_url: str | None, window: float = WINDOW,
                      fail_open: bool = True) -> RateLimiter:
    """Redis when a URL is given (cluster mode), in-process otherwise (embedded default).

    ``fail_open``: whether a Redis outage admits requests (logged) or fails them.
    """
    if redis_url:
        return RedisRateLimiter(redis_url, window, fail_open=fail_open)
    return InProcessRateLimiter(window)


def get_rate_limiter(manager: Any, window: float = WINDOW, fail_open: bool = True) -> RateLimiter:
    """The manager's limiter, made on first use from ``manager.redis_url`` and kept on it."""
    limiter = getattr(manager, "_backendai_rate_limiter", None)
    if limiter is None or limiter.window != window:
        limiter = make_rate_limiter(getattr(manager, "redis_url", "") or None, window, fail_open)
        manager._backendai_rate_limiter = limiter
    return limiter


# -- replay protection ---------------------------------------------------------------


class SignatureMemory:
    """Remembers accepted request signatures for as long as they could be replayed."""

    async def first_use(self, signature: str, ttl: float) -> bool:
        """Record ``signature`` for ``ttl`` seconds; False when it was already recorded."""
        raise NotImplementedError

    async def close(self) -> None:
        pass


class InProcessSignatureMemory(SignatureMemory):
    """A dict of signature -> expiry, pruned in expiry order (a heap) on every use.

    Memory grows with the signed requests of the last ``2 * max_clock_skew``
    seconds (about 150 bytes each), which the keypairs' rate limits bound.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, float] = {}
        self._expiry: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._seen)

    async def first_use(self, signature: str, ttl: float) -> bool:
        now = self._clock()
        while self._expiry and self._expiry[0][0] <= now:
            when, sig = heapq.heappop(self._expiry)
            if self._seen.get(sig) == when:
                del self._seen[sig]
        if signature in self._seen:
            return False
        when = now + max(ttl, 0.0)
        self._seen[signature] = when
        heapq.heappush(self._expiry, (when, signature))
        return True


class RedisSignatureMemory(SignatureMemory):
    """``SET <prefix><signature> 1 NX PX <ttl>`` in the cluster's Redis: every hub sees
    every accepted signature. While Redis cannot be reached, signatures are remembered
    in this process (replays to this hub are still refused) and the outage is logged."""

    def __init__(self, url: str, prefix: str = SIGNATURE_PREFIX) -> None:
        import redis.asyncio as aioredis

        self.redis = aioredis.from_url(url, decode_responses=True)
        self.prefix = prefix
        self.local = InProcessSignatureMemory()
        self._last_warning = 0.0

    async def first_use(self, signature: str, ttl: float) -> bool:
        import redis.exceptions

        if not await self.local.first_use(signature, ttl):
            return False
        try:
            ok = await self.redis.set(self.prefix + signature, "1", nx=True,
                                      px=max(1, int(ttl * 1000)))
        except (redis.exceptions.RedisError, OSError):
            if time.monotonic() - self._last_warning > 60:
                self._last_warning = time.monotonic()
                log.warning("replay protection: Redis unavailable; remembering signatures in "
                            "this process only (a replay to another hub is not detected)",
                            exc_info=True)
            return True
        return bool(ok)

    async def close(self) -> None:
        await self.redis.aclose()


def make_signature_memory(redis_url: str | None) -> SignatureMemory:
    if redis_url:
        return RedisSignatureMemory(redis_url)
    return InProcessSignatureMemory()


def get_signature_memory(manager: Any) -> SignatureMemory:
    """The manager's signature memory, made on first use from ``manager.redis_url``."""
    memory = getattr(manager, "_backendai_signature_memory", None)
    if memory is None:
        memory = make_signature_memory(getattr(manager, "redis_url", "") or None)
        manager._backendai_signature_memory = memory
    return memory
