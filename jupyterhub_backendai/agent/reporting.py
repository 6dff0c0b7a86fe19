"""What an agent tells the managers (:class:`AgentReporting`): its description
(:meth:`~AgentReporting.info`), its heartbeats on the event bus with what it holds (the
images on its engine, its ready pooled kernels, its GPUs that another agent of the host
holds), the live statistics it writes to Redis with each periodic heartbeat
(:mod:`.stats`), and its kernel events, which wait in an outbox, in order, while the
bus is away.

A mixin of :class:`~.core.Agent`: the backend, the books (devices, slots of the kernels)
and the event bus it reports on are the agent's, made in its ``__init__`` and ``start``.
"""

from __future__ import annotations

import asyncio
import platform
import time

from .. import __version__
from ..common.slots import ResourceSlot
from ..common.tasks import wait_set
from .stats import cpu_percent, write_stats


class AgentReporting:
    def info(self) -> dict:
        return {
            "id": self.agent_id,
            "addr": self.addr,
            "resource_group": self.resource_group,
            "backend": self.impl.name if self.impl else "",
            "architecture": platform.machine(),
            "available_slots": self.capacity.to_json(),
            "version": __version__,
            "devices": [d.to_json() for d in self.devices],
        }

    async def publish(self, name: str, payload: dict) -> None:
        """Send an event; never fail what it reports. One that cannot be sent now (the
        event bus is away) waits in an outbox, with those after it, and goes out in
        order once the bus is back (a kernel started during an outage is not taken for
        a failed start and started twice; its end still reaches the managers)."""
        if not self._outbox:
            try:
                await self.event_bus.publish(name, payload)
                return
            except Exception as e:
                self.log.warning("event %s not sent (%s): kept until the bus is back", name, e)
        if len(self._outbox) == self._outbox.maxlen:
            self.log.error("event outbox full (%d): the oldest event is dropped",
                           self._outbox.maxlen)
        self._outbox.append((name, payload))
        if self._outbox_task is None or self._outbox_task.done():
            self._outbox_task = asyncio.create_task(self._flush_outbox())

    async def _flush_outbox(self) -> None:
        while self._outbox:
            name, payload = self._outbox[0]
            try:
                await self.event_bus.publish(name, payload)
            except Exception:
                await asyncio.sleep(1.0)
                continue
            self._outbox.popleft()
        self.log.info("event outbox sent: the bus is back")

    async def holdings(self, fresh_images: bool = True) -> dict:
        """What this agent holds, for the scheduler's preference (issues 25 and 30):
        ``images``, the labelled images on its engine, and ``pool``, its ready pooled
        kernels per warm pool key (unbound, running, not being started or bound); and
        what it cannot offer now: ``away``, its GPUs another agent of this host (another
        installation's) holds, by slot (the scheduler counts them as taken).

        ``fresh_images`` False: the images as last listed (a pooled kernel's change does
        not change them; listing them is the engine's dearest routine call, 4 ms of its
        CPU). The periodic heartbeat lists them again, which sees an image an operator
        pulled or removed by hand."""
        if fresh_images or self._images_said is None:
            self._images_said = sorted({i.name for i in await self.impl.list_images()})
        images = list(self._images_said)
        pool: dict[str, int] = {}
        if getattr(self.impl, "pools", False):
            for r in await self.impl.list_kernels():
                if r.pooled and r.alive and r.kernel_id not in self._pool_busy:
                    pool[r.pooled] = pool.get(r.pooled, 0) + 1
        away = {k: str(v) for k, v in self.gpus.away().items()}
        return {"images": images, "pool": pool, "away": away}

    async def _announce(self, fresh_images: bool = True) -> None:
        await self.event_bus.publish(
            "agent_heartbeat",
            dict(self.info(), ts=time.time(), **await self.holdings(fresh_images)))

    # Seconds a change waits for others before they go out in one heartbeat: the binds
    # of a rush come 10-60 ms apart, and each sent alone cost a listing of the agent's
    # containers on the engine and a write of its row in the record (five a rush).
    REPORT_SETTLE = 0.05

    def report_soon(self, images: bool = False, at_once: bool = False) -> None:
        """A heartbeat soon (without statistics): what the agent holds changed (a pooled
        kernel became ready or was taken; ``images``: an image arrived, the images are
        listed again). The changes of ``REPORT_SETTLE`` seconds go out in one; one that
        comes while that heartbeat is being made goes out in another after it.
        ``at_once``: without waiting for others (devices another agent of the host
        holds: the session the agent just refused for them is placed again as soon as
        it is back in the queue, and must meet them counted)."""
        self._report_images = self._report_images or images
        self._report_again = True
        if at_once:
            self._report_hurry.set()
        if self._report_task is not None and not self._report_task.done():
            return

        async def report():
            while self._report_again:
                await wait_set(self._report_hurry, self.REPORT_SETTLE)
                self._report_hurry.clear()
                self._report_again = False  # what changes from here goes in the next
                images, self._report_images = self._report_images, False
                try:
                    await self._announce(fresh_images=images)
                except Exception as e:  # the periodic heartbeat says it later
                    self.log.debug("heartbeat not sent: %s", e)

        self._report_task = asyncio.create_task(report())

    async def heartbeat(self) -> None:
        await self._announce()
        try:
            stats = await self.collect_stats()
            redis = getattr(self.event_bus, "redis", None)
            if redis is not None:
                await write_stats(redis, self.agent_id, stats, ttl=3 * self.heartbeat_interval)
        except Exception:
            self.log.exception("live statistics failed")

    def _gpu_use(self) -> list[dict]:
        """Each GPU's and MIG instance's live use (one NVML pass), with the kernel
        that holds it in this agent's books; [] without GPUs or NVML."""
        try:
            use = self.device_source.live_use() if self.devices else []
        except Exception:
            self.log.exception("GPU statistics failed")
            return []
        owners = self.gpus.owners()
        mine = {d.uuid for d in self.devices} | {m.uuid for d in self.devices
                                                  for m in d.mig_instances}
        return [dict(d, kernel_id=owners.get(d["uuid"])) for d in use if d["uuid"] in mine]

    async def collect_stats(self) -> dict:
        """Live statistics (:mod:`.stats`): free slots and per-kernel usage."""
        raw = await self.impl.kernel_stats()
        now = time.time()
        occupied = ResourceSlot()
        for slots in self._kernel_slots.values():
            occupied = occupied + slots
        gpus = self._gpu_use()
        # A MIG instance without a figure of its own counts as its GPU's.
        parent_pct = {d["index"]: d["util_pct"] for d in gpus if d["parent_index"] is None}
        gpu = {d["uuid"]: (d["util_pct"] if d["util_pct"] is not None
                           else parent_pct.get(d["parent_index"]))
               for d in gpus}
        gpu = {u: p for u, p in gpu.items() if p is not None}
        kernels = {}
        for kid in sorted(set(raw) | set(self._kernel_slots)):
            r = raw.get(kid)
            if r is None:
                continue
            sample = (now, r["cpu_ns"])
            uuids = self.gpus.owned(kid)
            utils = [gpu[u] for u in uuids if u in gpu]
            kernels[kid] = {
                "cpu_pct": cpu_percent(self._cpu_samples.get(kid), sample),
                "mem_bytes": r["mem_bytes"],
                "mem_limit_bytes": r["mem_limit_bytes"],
                "gpu_util_pct": round(sum(utils) / len(utils), 1) if utils else None,
            }
            self._cpu_samples[kid] = sample
        for kid in set(self._cpu_samples) - set(raw):
            del self._cpu_samples[kid]
        self.last_stats = {
            "ts": now,
            "available_slots": self.capacity.to_json(),
            "occupied_slots": occupied.nonzero().to_json(),
            "free_slots": (self.capacity - occupied).to_json(),
            "kernels": kernels,
            "gpus": gpus,
        }
        return self.last_stats

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self.heartbeat()
            except Exception:
                self.log.exception("heartbeat failed")
