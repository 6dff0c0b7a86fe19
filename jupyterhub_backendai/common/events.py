"""The event bus between agents and managers.

Two implementations with one interface: :class:`InProcessEventBus` for the
embedded default (agent and manager in the hub process) and
:class:`RedisEventBus` for cluster mode, on a Redis Stream with a consumer group
so that each event is handled by exactly one manager instance.

Events are ``(name, payload)`` with a JSON-serialisable payload. Names used:
``agent_heartbeat``, ``kernel_started``, ``kernel_terminated``.
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

    async def close(self) -> None:
        pass


class InProcessEventBus(EventBus):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()
        self._task: asyncio.Task | None = None

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
        self._task: asyncio.Task | None = None
        self._stopping = False

    async def publish(self, name: str, payload: dict) -> None:
        await self.redis.xadd(
            self.stream,
            {"name": name, "payload": json.dumps(payload)},
            maxlen=self.maxlen,
            approximate=True,
        )

    async def _ensure_group(self) -> None:
        import redis.exceptions

        try:
            await self.redis.xgroup_create(self.stream, self.group, id="$", mkstream=True)
        except redis.exceptions.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def start_consuming(self, handler: Handler) -> None:
        await self._ensure_group()

        async def loop():
            # First re-deliver what this consumer read but never acknowledged.
            last = "0"
            while not self._stopping:
                try:
                    resp = await self.redis.xreadgroup(
                        self.group, self.consumer, {self.stream: last}, count=100, block=300
                    )
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("reading events from redis failed; retrying")
                    await asyncio.sleep(1)
                    continue
                # RESP2 answers [[stream, entries]], RESP3 {stream: entries}.
                streams = list(resp.items()) if isinstance(resp, dict) else list(resp or ())
                if last == "0" and not any(entries for _s, entries in streams):
                    last = ">"
                    continue
                for _stream, entries in streams:
                    for entry_id, fields in entries:
                        try:
                            await handler(fields["name"], json.loads(fields["payload"]))
                        except Exception:
                            log.exception("event handler failed for %s", fields.get("name"))
                        await self.redis.xack(self.stream, self.group, entry_id)

        self._task = asyncio.create_task(loop())

    async def close(self) -> None:
        # redis-py does not give up a blocking XREADGROUP on cancellation: ask the loop to
        # stop after its current (short) block instead.
        self._stopping = True
        if self._task:
            try:
                await asyncio.wait_for(self._task, 5)
            except (TimeoutError, asyncio.CancelledError):
                pass
        await self.redis.aclose()


def make_event_bus(url: str | None) -> EventBus:
    if url:
        return RedisEventBus(url)
    return InProcessEventBus()
