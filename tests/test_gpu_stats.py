"""Per-GPU live use in the agent's statistics: each GPU and MIG instance with its
utilisation, memory in use of its total, and the kernel that holds it.

There is no GPU on CI: the agent's GPUs and their figures come from an NVML STAND-IN
(``nvml_standin.stand_in("a100-mig")``: two A100-80GB, GPU 0 in MIG mode with four
instances, GPU 1 whole). The figures are made up and set on the stand-in by the test;
the discovery and sampling code that reads them (``NVMLDeviceSource``), the agent, its
kernel processes (local backend) and Redis are real.
"""

from __future__ import annotations

import asyncio

import pytest
from traitlets.config import Config

from jupyterhub_backendai.agent.core import Agent
from jupyterhub_backendai.agent.resources.cuda import NO_MIG_UTIL, NVMLDeviceSource
from jupyterhub_backendai.agent.resources.nvml_standin import GiB, MiB, stand_in
from jupyterhub_backendai.common.ids import new_id
from jupyterhub_backendai.common.kernelspec import VERSION

from .services import agent_id as new_agent_id
from .services import port_range

MIG = "cuda.mig-1g.10gb"


def _spec(**slots) -> dict:
    return {
        "version": VERSION, "kernel_id": new_id(), "session_id": new_id(), "owner": "alice", "image": "local/python",
        "slots": {"cpu": "0.5", "mem": str(256 * MiB), **slots}, "environ": {},
        "service_prefix": "/user/alice/x/",
    }


def _agent(tmp_path, bus, agent_id: str) -> tuple[Agent, object]:
    c = Config()
    c.Agent.backend = "local"
    c.Agent.agent_id = agent_id
    c.Agent.state_dir = str(tmp_path / "agent")
    c.Agent.port_range = port_range(10)
    c.Agent.slots = {"cpu": 2, "mem": "4g"}
    c.Agent.heartbeat_interval = 3600.0  # samples by hand below
    c.Agent.local_cmd = ["/bin/sh", "-c", "sleep 60", "sh"]
    agent = Agent(bus, config=c)
    nvml = stand_in("a100-mig")  # the stand-in, not a GPU
    agent.device_source = NVMLDeviceSource(nvml)
    return agent, nvml


def test_stand_in_figures_come_out_in_the_sample_with_their_holders(tmp_path, redis_server):
    import redis.asyncio as aioredis

    from jupyterhub_backendai.agent.stats import read_stats, stats_key
    from jupyterhub_backendai.common.events import RedisEventBus

    agent_id = new_agent_id("gpustats")
    url = redis_server.fresh_url()

    async def run():
        bus = RedisEventBus(url)
        r = aioredis.from_url(url)
        agent, nvml = _agent(tmp_path, bus, agent_id)
        await agent.start()
        try:
            gpu0, gpu1 = agent.devices
            small = [m for m in gpu0.mig_instances if m.profile == "1g.10gb"]
            # Made-up figures, set on the stand-in.
            nvml.set_use(gpu1.uuid, util_pct=73, mem_used_bytes=12 * GiB)
            nvml.set_use(small[0].uuid, mem_used_bytes=3 * GiB)
            with pytest.raises(ValueError, match="no utilisation for MIG"):
                nvml.set_use(small[0].uuid, util_pct=5)

            whole = await agent.create_kernel(_spec(**{"cuda.device": "1"}))
            part = await agent.create_kernel(_spec(**{MIG: "1"}))
            assert whole["cuda_uuids"] == [gpu1.uuid]
            await agent.heartbeat()
            st = (await read_stats(r, [agent_id]))[agent_id]
            by_uuid = {g["uuid"]: g for g in st["gpus"]}
            # Every GPU and every MIG instance, GPU first then its instances.
            assert [g["uuid"] for g in st["gpus"]] == [
                gpu0.uuid, *(m.uuid for m in gpu0.mig_instances), gpu1.uuid]
            g1 = by_uuid[gpu1.uuid]
            assert (g1["index"], g1["name"], g1["parent_index"]) == (
                1, "NVIDIA A100-SXM4-80GB", None)
            assert (g1["util_pct"], g1["mem_used_bytes"], g1["mem_total_bytes"]) == (
                73.0, 12 * GiB, 80 * GiB)
            assert g1["kernel_id"] == whole["kernel_id"]
            held = [g for g in st["gpus"] if g["kernel_id"] == part["kernel_id"]]
            assert len(held) == 1 and held[0]["uuid"] in {m.uuid for m in small}
            m = by_uuid[small[0].uuid]
            # NVML gives no utilisation under MIG: None, and said so.
            assert m["util_pct"] is None and m["note"] == NO_MIG_UTIL
            assert m["parent_index"] == 0 and m["name"] == "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
            assert (m["mem_used_bytes"], m["mem_total_bytes"]) == (3 * GiB, 9728 * MiB)
            assert by_uuid[gpu0.uuid]["util_pct"] is None
            assert by_uuid[gpu0.uuid]["kernel_id"] is None  # only its instances are held

            # New figures at the next sample; a released GPU has no holder.
            nvml.set_use(gpu1.uuid, util_pct=4, mem_used_bytes=0)
            await agent.destroy_kernel(whole["kernel_id"])
            await agent.destroy_kernel(part["kernel_id"])
            await agent.heartbeat()
            st = (await read_stats(r, [agent_id]))[agent_id]
            g1 = {g["uuid"]: g for g in st["gpus"]}[gpu1.uuid]
            assert (g1["util_pct"], g1["mem_used_bytes"]) == (4.0, 0)
            assert [g["kernel_id"] for g in st["gpus"]] == [None] * 6
            assert agent.last_stats["gpus"] == st["gpus"]

            # An older agent's hash (no "gpus" key) still reads, as no GPU figures.
            await r.hdel(stats_key(agent_id), "gpus")
            old = (await read_stats(r, [agent_id]))[agent_id]
            assert old["gpus"] == [] and old["kernels"] == {}
        finally:
            await agent.stop()
            await bus.close()
            await r.aclose()

    asyncio.run(run())


def test_one_nvml_pass_per_sample_and_devices_without_figures():
    """The sample asks NVML once (one init/shutdown); a DGX-1 (no MIG) has a figure for
    every GPU; configured fake devices have none and say why."""
    from jupyterhub_backendai.agent.resources.cuda import StaticDeviceSource

    nvml = stand_in("dgx1-v100")  # the stand-in
    calls = []
    init = nvml.nvmlInit
    nvml.nvmlInit = lambda: (calls.append(1), init())[1]
    nvml.set_use(nvml.machine.gpus[5].uuid, util_pct=99, mem_util_pct=40)
    use = NVMLDeviceSource(nvml).live_use()
    assert len(calls) == 1 and nvml.initialized == 0
    assert [(d["index"], d["util_pct"]) for d in use] == [
        (i, 99.0 if i == 5 else 0.0) for i in range(8)]
    assert all(d["mem_total_bytes"] == 32 * GiB and d["note"] == "" for d in use)
    assert NVMLDeviceSource(nvml).utilization()[nvml.machine.gpus[5].uuid] == 99.0
    static = StaticDeviceSource([{"name": "Fake GPU"}]).live_use()
    assert static[0]["util_pct"] is None and "no figures" in static[0]["note"]
    with pytest.raises(ValueError, match="memory in use must be"):
        nvml.set_use(nvml.machine.gpus[0].uuid, mem_used_bytes=33 * GiB)
