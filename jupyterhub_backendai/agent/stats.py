"""Live statistics of an agent and its kernels, kept in Redis for the hub.

Every heartbeat the agent writes one hash, ``backendai.agent-stats.<agent id>``,
with a TTL of a few heartbeats (a dead agent's statistics vanish with it):

- ``ts``: when they were taken (Unix seconds, the agent's clock);
- ``available_slots``, ``occupied_slots``, ``free_slots``: JSON slot maps (occupied:
  what the kernels this agent runs asked for);
- ``kernels``: JSON ``{kernel id: {"cpu_pct": percent of one core since the last
  sample (None on the first), "mem_bytes", "mem_limit_bytes", "gpu_util_pct":
  mean utilisation of its GPUs (None: no GPU or no NVML)}}``;
- ``gpus`` (added later; an older agent's hash has none and reads as ``[]``): JSON
  list, one entry per GPU and then its MIG instances, from one NVML pass per sample
  (:meth:`~.resources.cuda.NVMLDeviceSource.live_use`): ``{"index", "uuid", "name",
  "parent_index": the GPU's index for a MIG instance (None for a GPU), "util_pct"
  (None where NVML gives none, as under MIG), "mem_used_bytes", "mem_total_bytes",
  "note": why a figure is missing, "kernel_id": the kernel holding it in the
  agent's allocation books (None: free)}``.

The hub reads them with :func:`read_stats` (one pipelined ``HGETALL`` per agent);
in the embedded mode (no Redis) :attr:`Agent.last_stats` holds the same dict.
"""

from __future__ import annotations

import json
import time

KEY_PREFIX = "backendai.agent-stats."
FIELDS_JSON = ("available_slots", "occupied_slots", "free_slots", "kernels")
GPUS = "gpus"  # a list; its own key so that older readers and writers are unaffected


def stats_key(agent_id: str) -> str:
    return KEY_PREFIX + agent_id


def cpu_percent(prev: tuple[float, int] | None, now: tuple[float, int]) -> float | None:
    """Percent of one core used between two (wall seconds, CPU nanoseconds) samples."""
    if prev is None or now[0] <= prev[0] or now[1] < prev[1]:
        return None
    return round(100.0 * (now[1] - prev[1]) / 1e9 / (now[0] - prev[0]), 2)


async def write_stats(redis, agent_id: str, stats: dict, ttl: float) -> None:
    """One hash per agent, replaced whole, expiring after ``ttl`` seconds."""
    key = stats_key(agent_id)
    mapping = {"ts": str(stats.get("ts", time.time()))}
    for f in FIELDS_JSON:
        mapping[f] = json.dumps(stats.get(f, {}), separators=(",", ":"))
    mapping[GPUS] = json.dumps(stats.get(GPUS, []), separators=(",", ":"))
    async with redis.pipeline(transaction=True) as p:
        p.delete(key)
        p.hset(key, mapping=mapping)
        p.pexpire(key, max(1, int(ttl * 1000)))
        await p.execute()


def _decode(raw: dict) -> dict | None:
    if not raw:
        return None
    raw = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
           for k, v in raw.items()}
    out: dict = {"ts": float(raw.get("ts") or 0)}
    for f in FIELDS_JSON:
        try:
            out[f] = json.loads(raw.get(f) or "{}")
        except ValueError:
            out[f] = {}
    try:
        gpus = json.loads(raw.get(GPUS) or "[]")
    except ValueError:
        gpus = []
    out[GPUS] = gpus if isinstance(gpus, list) else []
    return out


async def read_stats(redis, agent_ids: list[str] | None = None) -> dict[str, dict]:
    """Statistics by agent id (agents without fresh statistics are left out).
    ``agent_ids`` None: every agent that has some (SCAN)."""
    if agent_ids is None:
        agent_ids = []
        async for k in redis.scan_iter(match=KEY_PREFIX + "*", count=1000):
            k = k.decode() if isinstance(k, bytes) else k
            agent_ids.append(k[len(KEY_PREFIX):])
    if not agent_ids:
        return {}
    async with redis.pipeline(transaction=False) as p:
        for aid in agent_ids:
            p.hgetall(stats_key(aid))
        rows = await p.execute()
    out = {}
    for aid, raw in zip(agent_ids, rows, strict=True):
        d = _decode(raw)
        if d is not None:
            out[aid] = d
    return out


async def live_stats(manager, agent_ids: list[str]) -> dict[str, dict]:
    """The agents' live statistics as a hub sees them: from Redis where it has one (every
    agent writes its hash there each heartbeat), else, and for agents running in the
    hub's process, their last sample. Agents without fresh ones are left out. Used by
    the console and the usage sampler (manager/usage.py)."""
    out: dict[str, dict] = {}
    redis = getattr(manager.bus, "redis", None)
    if redis is not None and agent_ids:
        try:
            out.update(await read_stats(redis, agent_ids))
        except Exception as e:  # Redis away: the page still shows the record
            manager.log.warning("live statistics unreadable: %s", e)
    for aid in agent_ids:
        agent = manager.local_agents.get(aid)
        if aid not in out and agent is not None and agent.last_stats:
            out[aid] = agent.last_stats
    return out

