"""The event bus between agents and managers.

Two implementations with one interface: :class:`InProcessEventBus` for the
embedded default (agent and manager in the hub process) and
:class:`RedisEventBus` for cluster mode, on a Redis Stream with a consumer group
so that each event is handled by exactly one manager instance.

Events are ``(name, payload)`` with a JSON-serialisable payload. Names used:
``agent_heartbeat``, ``kernel_started``, ``kernel_terminated``.

Besides that work queue (each event to one manager), :meth:`EventBus.broadcast`
sends an event to every subscribed manager process (fan-out): the managers tell
each other of session state changes this way, ``session_changed`` with payload
``{"id": <session id>, "status": <new status or null>, "origin": <manager owner id>}``
(``"ids": [...]`` instead of ``"id"`` for a scheduler pass's placements),
so that a spawner waiting on a session in one hub wakes when another hub changes it.
Broadcasts are notifications, at most once: a missed one costs a waiter its slow
safety poll, never a wrong state (the waiter re-reads the record).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Handler = Callable[[str, dict], Awaitable[None]]


class EventBus:
    async def publish(self, name: str, payload: dict) -> None:
        raise NotImplementedError

    async def start_consuming(self, handler: Handler) -> None:
        """Deliver every event to ``handler`` until :meth:`close`."""
        raise NotImplementedError

    async def broadcast(self, name: str, payload: dict) -> None:
        """Deliver to every subscriber (:meth:`subscribe`) of every process."""
        raise NotImplementedError

    async def subscribe(self, handler: Handler, on_gap: Callable[[], None] | None = None) -> None:
        """Call ``handler`` for every broadcast until :meth:`close`. ``on_gap`` is called
        when broadcasts may have been missed (the connection to Redis was lost)."""
        raise NotImplementedError

    async def close(self) -> None:
        pass


class InProcessEventBus(EventBus):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._subscribers: list[Handler] = []

    async def broadcast(self, name: str, payload: dict) -> None:
        for handler in list(self._subscribers):
            try:
                await handler(name, json.loads(json.dumps(payload)))
            except Exception:
                log.exception("broadcast handler failed for %s", name)

    async def subscribe(self, handler: Handler, on_gap: Callable[[], None] | None = None) -> None:
        self._subscribers.append(handler)

    async def publish(self, name: str, payload: dict) -> None:
        self._queue.put_nowait((name, json.loads(json.dumps(payload))))

    async def start_consuming(self, handler: Handler) -> None:
        async def loop():
            while True:
                name, payload = await self._queue.get()
                try:
                    await handler(name, payload)
                except Exception:
                    log.exception("event handler failed for %s", name)

        self._task = asyncio.create_task(loop())

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


class RedisEventBus(EventBus):
    """Redis Streams: ``XADD`` to publish, ``XREADGROUP``/``XACK`` to consume."""

    def __init__(
        self,
        url: str,
        stream: str = "backendai.events",
        group: str = "manager",
        maxlen: int = 100_000,
    ) -> None:
        import redis.asyncio as aioredis

        self.redis = aioredis.from_url(url, decode_responses=True)
        self.stream = stream
        self.group = group
        self.maxlen = maxlen
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        # Broadcasts: a second stream that every subscriber reads in full (XREAD, no group).
        self.fanout_stream = f"{stream}.broadcast"
        self.fanout_maxlen = 10_000
        self._task: asyncio.Task | None = None
        self._fanout_task: asyncio.Task | None = None
        self._stopping = False
        # Events a consumer read but never acknowledged (its manager was killed: a new
        # process is a new consumer) are taken over by a live one after this long.
        self.claim_idle = 60.0
        self.claim_interval = 10.0

    async def broadcast(self, name: str, payload: dict) -> None:
        import redis.exceptions

        fields = {"name": name, "payload": json.dumps(payload)}
        for attempt in (1, 2):
            try:
                await self.redis.xadd(self.fanout_stream, fields, maxlen=self.fanout_maxlen,
                                      approximate=True)
                return
            except redis.exceptions.ConnectionError:
                # A pooled connection of before a Redis restart: one more, on a new one.
                if attempt == 2:
                    raise

    async def subscribe(self, handler: Handler, on_gap: Callable[[], None] | None = None) -> None:
        # Read from the stream's newest entry on: what was broadcast before is history.
        newest = await self.redis.xrevrange(self.fanout_stream, count=1)
        last = newest[0][0] if newest else "0-0"
        self._fanout_task = asyncio.create_task(self._fanout(handler, on_gap, last))

    async def _fanout(self, handler: Handler, on_gap, last: str) -> None:
        failures = 0
        while not self._stopping:
            try:
                resp = await self.redis.xread({self.fanout_stream: last}, count=200, block=300)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Redis restarts: back off, then go on after the last entry read. Entry
                # ids are times, so a Redis that lost its data gives new entries later
                # ids and they are read too.
                failures += 1
                await _back_off(failures, "broadcasts")
                continue
            if failures:
                failures = 0
                if on_gap is not None:
                    on_gap()  # broadcasts may have been lost while Redis was away
            for _stream, entries in _streams(resp):
                for entry_id, fields in entries:
                    last = entry_id
                    await _deliver(handler, fields, "broadcast")

    async def publish(self, name: str, payload: dict) -> None:
        await self.redis.xadd(
            self.stream,
            {"name": name, "payload": json.dumps(payload)},
            maxlen=self.maxlen,
            approximate=True,
        )

    async def _ensure_group(self, start: str = "$") -> None:
        import redis.exceptions

        try:
            await self.redis.xgroup_create(self.stream, self.group, id=start, mkstream=True)
        except redis.exceptions.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def start_consuming(self, handler: Handler) -> None:
        await self._ensure_group()
        self._task = asyncio.create_task(self._consume(handler))

    async def _consume(self, handler: Handler) -> None:
        import redis.exceptions

        # First re-deliver what this consumer read but never acknowledged.
        last = "0"
        failures = 0
        # Handled, but the XACK did not reach Redis (it went away): acknowledged once it
        # is back, so an event handled before a Redis restart is not handled again.
        unacked: list = []
        loop = asyncio.get_running_loop()
        claimed = loop.time()
        while not self._stopping:
            if loop.time() - claimed >= self.claim_interval:
                claimed = loop.time()
                try:
                    await self._claim_stale(handler)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # Redis away or the group gone: the read below says
                    log.debug("claiming stale events failed: %s", e)
            if unacked:
                try:
                    await self.redis.xack(self.stream, self.group, *unacked)
                    unacked = []
                except asyncio.CancelledError:
                    raise
                except Exception:
                    pass  # still away: the read below backs off
            try:
                resp = await self.redis.xreadgroup(
                    self.group, self.consumer, {self.stream: last}, count=100, block=300
                )
                failures = 0
            except asyncio.CancelledError:
                raise
            except redis.exceptions.ResponseError as e:
                if "NOGROUP" not in str(e):
                    log.exception("reading events from redis failed; retrying")
                    await asyncio.sleep(1)
                    continue
                # Redis restarted without its data (or the stream was deleted): the
                # group is gone. Make it again from the stream's start, so that events
                # published since the restart, before this read, are delivered too.
                log.warning("event stream %s lost its consumer group; recreating it", self.stream)
                unacked = []  # their entries went with the group
                try:
                    await self._ensure_group(start="0")
                except Exception:
                    log.exception("recreating the consumer group failed; retrying")
                    await asyncio.sleep(1)
                last = "0"
                continue
            except Exception:
                failures += 1
                await _back_off(failures, "events")
                continue
            streams = _streams(resp)
            if last == "0" and not any(entries for _s, entries in streams):
                last = ">"
                continue
            for _stream, entries in streams:
                for _entry_id, fields in entries:
                    await _deliver(handler, fields)
                # One XACK for what this read delivered (was one round trip per event).
                # If Redis is away it is sent again once Redis is back (above); entries of
                # a killed process are delivered again: handlers are idempotent.
                if entries:
                    ids = [e for e, _f in entries]
                    try:
                        await self.redis.xack(self.stream, self.group, *ids)
                    except redis.exceptions.RedisError:
                        unacked = (unacked + ids)[-10000:]
            if last == "0":
                # Pending entries are read page by page: go on after the last one.
                ids = [eid for _s, entries in streams for eid, _f in entries]
                if ids:
                    last = ids[-1]

    async def _claim_stale(self, handler: Handler) -> None:
        """Handle the events other consumers (killed managers) read and never
        acknowledged, idle for ``claim_idle`` seconds (``XAUTOCLAIM``)."""
        start = "0-0"
        while not self._stopping:
            resp = await self.redis.xautoclaim(self.stream, self.group, self.consumer,
                                               int(self.claim_idle * 1000), start, count=100)
            start, entries = resp[0], resp[1]
            for entry_id, fields in entries:
                if fields:
                    log.info("handling event %s that a stopped consumer left", entry_id)
                    await _deliver(handler, fields)
                await self.redis.xack(self.stream, self.group, entry_id)
            if start in ("0-0", b"0-0") or not entries:
                return

    async def close(self) -> None:
        # redis-py does not give up a blocking XREADGROUP on cancellation: ask the loop to
        # stop after its current (short) block instead.
        self._stopping = True
        for task in (self._task, self._fanout_task):
            if task:
                try:
                    async with asyncio.timeout(5):
                        await task
                except (TimeoutError, asyncio.CancelledError):
                    pass
        await self.redis.aclose()


def _streams(resp) -> list:
    """[(stream, entries)] of an XREAD answer: RESP2 answers [[stream, entries]], RESP3
    {stream: entries}."""
    return list(resp.items()) if isinstance(resp, dict) else list(resp or ())


async def _deliver(handler: Handler, fields: dict, what: str = "event") -> None:
    """One entry to ``handler``; its failure is logged, never the reader's end."""
    try:
        await handler(fields["name"], json.loads(fields["payload"]))
    except Exception:
        log.exception("%s handler failed for %s", what, fields.get("name"))


async def _back_off(failures: int, what: str) -> None:
    """After the ``failures``-th failed read in a row (Redis restarts, the connection is
    refused): wait, doubling from 0.2 s to at most 2 s; warn once per outage. Call it
    from the ``except`` clause (the warning carries the exception)."""
    if failures == 1:
        log.warning("reading %s from redis failed; retrying", what, exc_info=True)
    await asyncio.sleep(min(0.1 * 2 ** failures, 2))


def make_event_bus(url: str | None) -> EventBus:
    if url:
        return RedisEventBus(url)
    return InProcessEventBus()
