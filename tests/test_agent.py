"""The agent on its own: capacity, host ports and GPU mapping, with the local backend.

There is no GPU on CI: CUDA devices come from ``StaticDeviceSource``, the configured
NVML stand-in. (The real ``NVMLDeviceSource`` was run on a lent H100 machine on
2026-11-22: one device found, UUID and name matching ``nvidia-smi -L``.)
"""

from __future__ import annotations

import asyncio
import os

from traitlets.config import Config

from jupyterhub_backendai.agent.core import Agent
from jupyterhub_backendai.common.events import InProcessEventBus
from jupyterhub_backendai.common.ids import new_id


def _agent(tmp_path) -> Agent:
    c = Config()
    c.Agent.backend = "local"
    c.Agent.state_dir = str(tmp_path / "agent")
    c.Agent.port_range = (41000, 41010)
    c.Agent.slots = {"cpu": 4, "mem": "8g"}
    c.Agent.fake_cuda_devices = [
        {"uuid": "GPU-a", "numa_node": 0}, {"uuid": "GPU-b", "numa_node": 1},
        {"uuid": "GPU-c", "numa_node": 1},
    ]
    # A stand-in kernel: writes its environment and waits (extra args land in "$@").
    c.Agent.local_cmd = ["/bin/sh", "-c", 'env > "$HOME/env-$BACKENDAI_SESSION_NAME"; sleep 60', "sh"]
    return Agent(InProcessEventBus(), config=c)


def _spec(name: str, gpus: int) -> dict:
    return {
        "kernel_id": new_id(), "session_id": new_id(), "owner": "alice", "image": "local/python",
        "slots": {"cpu": "1", "mem": str(2**30), "cuda.device": str(gpus)},
        "environ": {"BACKENDAI_SESSION_NAME": name}, "service_prefix": f"/user/alice/{name}/",
    }


async def _wait_file(path: str) -> str:
    for _ in range(100):
        if os.path.exists(path) and os.path.getsize(path):
            with open(path) as f:
                return f.read()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} not written")


def test_capacity_ports_and_gpu_mapping(tmp_path):
    async def run():
        agent = _agent(tmp_path)
        await agent.start()
        assert agent.capacity == {"cpu": 4, "mem": 8 * 2**30, "cuda.device": 3}
        a = await agent.create_kernel(_spec("a", 2))
        b = await agent.create_kernel(_spec("b", 1))
        # Two devices on one NUMA node for the 2-GPU kernel, the remaining one for the other.
        assert a["cuda_devices"] == [1, 2] and b["cuda_devices"] == [0]
        assert a["service_ports"][0]["host_port"] != b["service_ports"][0]["host_port"]
        home = os.path.join(agent.local_work_root, "alice")
        env_a = await _wait_file(os.path.join(home, "env-a"))
        assert "CUDA_VISIBLE_DEVICES=1,2" in env_a
        port = a["service_ports"][0]["host_port"]
        assert f"JUPYTERHUB_SERVICE_URL=http://127.0.0.1:{port}/user/alice/a/" in env_a
        try:
            await agent.create_kernel(_spec("c", 1))
            raise AssertionError("a fourth GPU was handed out")
        except Exception as e:
            assert "free CUDA devices" in str(e)
        assert {k["kernel_id"] for k in await agent.list_kernels()} == {a["kernel_id"], b["kernel_id"]}

        # A restarted agent adopts the running kernels with their ports and devices.
        await agent.stop()
        again = _agent(tmp_path)
        await again.start()
        assert sorted(again._device_owner) == [0, 1, 2]
        await again.destroy_kernel(a["kernel_id"])
        await again.destroy_kernel(b["kernel_id"])
        assert await again.list_kernels() == []
        assert again._device_owner == {} and again._used_ports == set()
        await again.stop()

    asyncio.run(run())
