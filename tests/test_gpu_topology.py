"""GPUs through NVML, topology-aware: discovery, best-linked allocation, MIG slots,
no device given twice (also across agent restarts).

THERE IS NO GPU HERE. Every test runs the real discovery code
(``NVMLDeviceSource``) against an NVML STAND-IN (``nvml_standin.StandInNVML``):
pynvml's functions answered from described machines that copy real topologies
(a DGX-1V with its NVLink hybrid cube-mesh on two sockets, a one-socket 4-GPU
PCIe server with two PCIe switches, two A100s on an NVSwitch, one in MIG mode).
What the real driver answers on a real machine is still to be captured with
``scripts/gpu-topology`` (docs/gpus.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from traitlets.config import Config

from jupyterhub_backendai.agent.core import Agent
from jupyterhub_backendai.agent.resources.cuda import NVMLDeviceSource, format_cpuset, host_cpus
from jupyterhub_backendai.agent.resources.gpu_alloc import GPUAllocator
from jupyterhub_backendai.agent.resources.nvml_standin import stand_in
from jupyterhub_backendai.common.errors import AgentError
from jupyterhub_backendai.common.events import InProcessEventBus
from jupyterhub_backendai.common.ids import new_id
from jupyterhub_backendai.common.kernelspec import VERSION

from .services import agent_id as new_agent_id
from .services import port_range

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMA0 = "0-19,40-59"  # the DGX-1 stand-in's socket 0
NUMA1 = "20-39,60-79"


def topology(machine: str):
    return NVMLDeviceSource(stand_in(machine)).topology()


def allocator(machine: str) -> GPUAllocator:
    return GPUAllocator(topology(machine))


def uuid(alloc: GPUAllocator, i: int) -> str:
    return alloc.whole[i].uuid


# -- discovery (the real NVMLDeviceSource against the stand-in) -------------------


def test_discovery_reads_the_dgx1_topology_like_nvidia_smi_topo():
    t = topology("dgx1-v100")
    assert [d.index for d in t.devices] == list(range(8))
    d0 = t.devices[0]
    assert (d0.name, d0.uuid, d0.memory_bytes, d0.pci_bus_id, d0.numa_node) == (
        "Tesla V100-SXM2-32GB", "GPU-5ba1d000-0001-4000-8000-000000000000", 32 * 2**30,
        "00000000:06:00.0", 0)
    assert format_cpuset(d0.cpus) == NUMA0 and format_cpuset(t.devices[7].cpus) == NUMA1
    assert not any(d.mig_enabled for d in t.devices)
    matrix = [" ".join("X" if i == j else t.link(i, j).label for j in range(8)) for i in range(8)]
    # `nvidia-smi topo -m` of a DGX-1V (GPU part).
    assert matrix == [
        "X NV1 NV1 NV2 NV2 SYS SYS SYS",
        "NV1 X NV2 NV1 SYS NV2 SYS SYS",
        "NV1 NV2 X NV2 SYS SYS NV1 SYS",
        "NV2 NV1 NV2 X SYS SYS SYS NV1",
        "NV2 SYS SYS SYS X NV1 NV1 NV2",
        "SYS NV2 SYS SYS NV1 X NV2 NV1",
        "SYS SYS NV1 SYS NV1 NV2 X NV2",
        "SYS SYS SYS NV1 NV2 NV1 NV2 X",
    ]
    # Under the NVLinks, the PCIe tree: a switch per pair, a host bridge per socket.
    assert t.link(0, 1).pcie_level == 10 and t.link(0, 2).pcie_level == 30
    assert t.link(0, 4).pcie_level == 50


def test_discovery_of_a_pcie_box_and_of_mig_instances():
    t = topology("pcie-4gpu")
    assert [[t.link(i, j).label for j in range(4) if j != i] for i in range(4)] == [
        ["PIX", "PHB", "PHB"], ["PIX", "PHB", "PHB"], ["PHB", "PHB", "PIX"], ["PHB", "PHB", "PIX"]]
    assert all(t.link(i, j).nvlinks == 0 for i in range(4) for j in range(4))

    t = topology("a100-mig")
    gpu0, gpu1 = t.devices
    assert (gpu0.mig_enabled, gpu1.mig_enabled) == (True, False)
    assert [(m.profile, m.parent_index, m.gpu_instance) for m in gpu0.mig_instances] == [
        ("3g.40gb", 0, 2), ("2g.20gb", 0, 3), ("1g.10gb", 0, 9), ("1g.10gb", 0, 10)]
    assert all(m.uuid.startswith("MIG-") and m.parent_uuid == gpu0.uuid
               for m in gpu0.mig_instances)
    link = t.link(0, 1)
    assert (link.label, link.via_nvswitch) == ("NV12", True)


def test_no_nvml_is_no_devices_with_the_reason():
    class Missing:
        NVMLError = __import__("pynvml").NVMLError

        def nvmlInit(self):
            raise self.NVMLError(12)  # NVML_ERROR_LIBRARY_NOT_FOUND

    t = NVMLDeviceSource(Missing()).topology()
    assert t.devices == [] and t.problem.startswith("NVML is not available: ")


# -- allocation ---------------------------------------------------------------------


def test_dgx1_multi_gpu_requests_get_the_best_linked_devices():
    a = allocator("dgx1-v100")
    # Two GPUs: a double NVLink (NV2) pair on one socket, with that socket's CPUs.
    pair = a.take("k2", 2, cpu=4)
    assert pair.indices == [0, 3] and pair.cpuset == NUMA0
    assert pair.uuids == [uuid(a, 0), uuid(a, 3)]
    a.release("k2")
    # Four: a whole socket's quad, every pair NVLinked (not 0,3 + the cross-socket 0-4).
    quad = a.take("k4", 4, cpu=8)
    assert quad.indices == [0, 1, 2, 3] and quad.cpuset == NUMA0
    other = a.take("k4b", 4, cpu=8)
    assert other.indices == [4, 5, 6, 7] and other.cpuset == NUMA1
    with pytest.raises(AgentError, match=r"^only 0 free CUDA devices, 1 requested$"):
        a.take("k1", 1)


def test_dgx1_a_busy_gpu_moves_a_quad_to_the_other_socket():
    a = allocator("dgx1-v100")
    assert a.take("one", 1).indices == [0]
    assert a.take("quad", 4).indices == [4, 5, 6, 7]
    a.release("quad")
    # Three GPUs on socket 0 are all NVLinked to each other (1-2 NV2, 2-3 NV2, 1-3 NV1).
    assert a.take("three", 3).indices == [1, 2, 3]
    with pytest.raises(AgentError, match=r"^only 4 free CUDA devices, 5 requested$"):
        a.take("five", 5)
    assert a.busy_indices() == [0, 1, 2, 3], "a refused request takes nothing"


def test_dgx1_single_gpus_pack_next_to_busy_ones_so_groups_stay_whole():
    a = allocator("dgx1-v100")
    assert a.take("s1", 1).indices == [0]
    # The second single GPU is 0's NV2 partner on its socket (3), not 1: that keeps
    # the 1-2 NV2 pair and the other socket's quad free.
    assert a.take("s2", 1).indices == [3]
    assert a.take("pair", 2).indices == [1, 2]
    assert a.take("quad", 4).indices == [4, 5, 6, 7]


def test_pcie_box_fragmentation_and_release():
    a = allocator("pcie-4gpu")
    # One PCIe switch for a pair; the whole box's CPUs (one socket).
    p = a.take("p", 2, cpu=2)
    assert p.indices == [0, 1] and p.cpuset == "0-31"
    assert a.take("s", 1).indices == [2]
    a.release("p")
    assert a.free_indices() == [0, 1, 3]
    # A single GPU goes beside the busy one (3 shares 2's switch), not to 0: the
    # 0-1 switch pair stays whole for a two-GPU kernel.
    assert a.take("s2", 1).indices == [3]
    assert a.take("p2", 2).indices == [0, 1]
    a.release("s")
    a.release("s2")
    a.release("p2")
    assert a.owners() == {} and a.take("all", 4).indices == [0, 1, 2, 3]


def test_cpuset_only_from_cpus_the_agent_has_and_never_fewer_than_asked():
    a = GPUAllocator(topology("dgx1-v100"), host_cpus=[0, 1, 2, 3, 20, 21])
    assert a.take("k", 2, cpu=2).cpuset == "0-3"
    quad = a.take("quad", 4, cpu=2)
    assert quad.indices == [4, 5, 6, 7] and quad.cpuset == "20-21"
    a.release("quad")
    # Four cores asked, NUMA node 1 offers this agent two: not pinned at all.
    quad = a.take("quad", 4, cpu=4)
    assert quad.indices == [4, 5, 6, 7] and quad.cpuset is None


def test_mig_instances_are_slots_of_their_own():
    a = allocator("a100-mig")
    assert {k: int(v) for k, v in a.capacity().items()} == {
        "cuda.device": 1, "cuda.mig-3g.40gb": 1, "cuda.mig-2g.20gb": 1, "cuda.mig-1g.10gb": 2}
    mig0 = {m.profile + "/" + str(m.gpu_instance): m.uuid for m in a.topology.devices[0].mig_instances}
    small = a.take("m1", 0, {"1g.10gb": 2})
    assert small.indices == [] and small.uuids == [mig0["1g.10gb/9"], mig0["1g.10gb/10"]]
    with pytest.raises(AgentError, match=r"^only 0 free MIG instances of profile 1g\.10gb "
                                         r"\(cuda\.mig-1g\.10gb\), 1 requested$"):
        a.take("m2", 0, {"1g.10gb": 1})
    # The partitioned GPU is never a whole device: one whole device on this box.
    with pytest.raises(AgentError, match=r"^only 1 free CUDA devices, 2 requested$"):
        a.take("w2", 2)
    both = a.take("w1", 1, {"3g.40gb": 1})
    assert both.indices == [1] and both.uuids == [uuid(a, 1), mig0["3g.40gb/2"]]
    a.release("m1")
    assert a.take("m3", 0, {"1g.10gb": 1}).uuids == [mig0["1g.10gb/9"]]
    assert sorted(a.owners().values()) == ["m3", "w1", "w1"]


# -- the agent: devices by UUID, no double allocation across a restart ----------------


def _agent(tmp_path, machine: str) -> Agent:
    c = Config()
    c.Agent.backend = "local"
    c.Agent.state_dir = str(tmp_path / "agent")
    c.Agent.port_range = port_range(10)
    c.Agent.slots = {"cpu": 2, "mem": "8g"}
    c.Agent.local_cmd = ["/bin/sh", "-c", 'env > "$HOME/env-$BACKENDAI_SESSION_NAME"; sleep 60', "sh"]
    agent = Agent(InProcessEventBus(), config=c)
    agent.device_source = NVMLDeviceSource(stand_in(machine))  # the stand-in, not a GPU
    return agent


def _spec(name: str, **slots) -> dict:
    return {
        "version": VERSION, "kernel_id": new_id(), "session_id": new_id(), "owner": "alice", "image": "local/python",
        "slots": {"cpu": "1", "mem": str(2**30), **{k.replace("_", "."): str(v) for k, v in slots.items()}},
        "environ": {"BACKENDAI_SESSION_NAME": name}, "service_prefix": f"/user/alice/{name}/",
    }


async def _env(path: str) -> dict:
    for _ in range(100):
        if os.path.exists(path) and os.path.getsize(path):
            with open(path) as f:
                return dict(line.split("=", 1) for line in f.read().splitlines() if "=" in line)
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} not written")


def test_agent_hands_devices_by_uuid_and_a_restart_gives_none_twice(tmp_path):
    async def run():
        agent = _agent(tmp_path, "dgx1-v100")
        await agent.start()
        assert agent.capacity["cuda.device"] == 8
        quad = await agent.create_kernel(_spec("quad", cuda_device=4))
        pair = await agent.create_kernel(_spec("pair", cuda_device=2))
        assert (quad["cuda_devices"], pair["cuda_devices"]) == ([0, 1, 2, 3], [4, 7])
        uuids = {i: d.uuid for i, d in enumerate(agent.devices)}
        assert quad["cuda_uuids"] == [uuids[i] for i in (0, 1, 2, 3)]
        env = await _env(os.path.join(agent.local_work_root, "alice", "env-pair"))
        assert env["CUDA_VISIBLE_DEVICES"] == f"{uuids[4]},{uuids[7]}"
        assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"]
        assert env["BACKENDAI_CUDA_DEVICES"] == "4,7"
        await agent.stop()

        # A new agent process: ownership comes back from the kernels' records.
        again = _agent(tmp_path, "dgx1-v100")
        await again.start()
        assert again.gpus.busy_indices() == [0, 1, 2, 3, 4, 7]
        try:
            await again.create_kernel(_spec("big", cuda_device=3))
            raise AssertionError("a device held by a running kernel was handed out again")
        except AgentError as e:
            assert str(e) == "only 2 free CUDA devices, 3 requested"
        last = await again.create_kernel(_spec("last", cuda_device=2))
        assert last["cuda_devices"] == [5, 6]  # NV2, the last free pair
        for k in (quad, pair, last):
            await again.destroy_kernel(k["kernel_id"])
        assert again.gpus.owners() == {} and await again.list_kernels() == []
        await again.stop()

    asyncio.run(run())


def test_agent_mig_slots_survive_a_restart(tmp_path):
    async def run():
        agent = _agent(tmp_path, "a100-mig")
        await agent.start()
        assert {k: int(v) for k, v in agent.capacity.items() if k.startswith("cuda.")} == {
            "cuda.device": 1, "cuda.mig-3g.40gb": 1, "cuda.mig-2g.20gb": 1, "cuda.mig-1g.10gb": 2}
        k = await agent.create_kernel(_spec("mig", **{"cuda_mig-1g_10gb": 1}))
        mig = agent.devices[0].mig_instances[2]
        assert (k["cuda_devices"], k["cuda_uuids"]) == ([], [mig.uuid])
        env = await _env(os.path.join(agent.local_work_root, "alice", "env-mig"))
        assert env["CUDA_VISIBLE_DEVICES"] == mig.uuid
        await agent.stop()
        again = _agent(tmp_path, "a100-mig")
        await again.start()
        assert again.gpus.owners() == {mig.uuid: k["kernel_id"]}
        k2 = await again.create_kernel(_spec("mig2", **{"cuda_mig-1g_10gb": 1}))
        assert k2["cuda_uuids"] == [agent.devices[0].mig_instances[3].uuid]
        for x in (k, k2):
            await again.destroy_kernel(x["kernel_id"])
        await again.stop()

    asyncio.run(run())


# -- scripts/gpu-topology -------------------------------------------------------------


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu-topology"), *args],
                          capture_output=True, text=True, timeout=60)


def test_gpu_topology_script_on_the_stand_in_and_without_a_gpu():
    out = _script("--stand-in", "dgx1-v100")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == (
        "NVML STAND-IN 'dgx1-v100' (a described machine, not a GPU): driver 550.54.15 (stand-in)")
    assert "GPU7  SYS   SYS   SYS   NV1   NV2   NV1   NV2   X\n" in out.stdout
    js = json.loads(_script("--stand-in", "a100-mig", "--json").stdout)
    assert js["stand_in"] is True and js["capacity"] == {
        "cuda.device": "1", "cuda.mig-3g.40gb": "1", "cuda.mig-2g.20gb": "1", "cuda.mig-1g.10gb": "2"}
    assert [m["profile"] for m in js["devices"][0]["mig_instances"]] == [
        "3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    bad = _script("--stand-in", "nope")
    assert bad.returncode == 2 and "no NVML stand-in machine 'nope'" in bad.stderr


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this machine has a GPU driver")
def test_gpu_topology_script_says_when_there_is_no_gpu():
    out = _script()
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("gpu-topology: no GPU found: NVML is not available: ")


def test_host_cpus_is_what_this_process_may_use():
    assert host_cpus() == frozenset(os.sched_getaffinity(0))


# -- the Docker backend: UUID label, the cpuset in HostConfig, rebuilt after a restart --


def _docker_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _docker_up(), reason="needs a Docker engine")
def test_docker_kernel_gets_the_cpus_next_to_its_gpus_and_keeps_its_devices(tmp_path):
    """With the stand-in the devices are fake (no DeviceRequests: there is no GPU);
    the UUIDs go into the container's label and CUDA_VISIBLE_DEVICES, the NUMA
    node's CPUs (those this machine has) into HostConfig.CpusetCpus."""
    import aiodocker

    def docker_agent() -> Agent:
        c = Config()
        c.Agent.backend = "docker"
        c.Agent.agent_id = agent_id
        c.Agent.state_dir = str(tmp_path / "agent")
        c.Agent.port_range = port_range(10)
        c.Agent.slots = {"cpu": 2, "mem": "8g"}
        a = Agent(InProcessEventBus(), config=c)
        a.device_source = NVMLDeviceSource(stand_in("dgx1-v100"))  # the stand-in
        return a

    agent_id = new_agent_id("gputopo")

    async def run():
        agent = docker_agent()
        await agent.start()
        spec = dict(_spec("d", cuda_device=2), image="backendai/python-kernel:latest",
                    kernel_type="idle")
        k = await agent.create_kernel(spec)
        try:
            assert k["cuda_devices"] == [0, 3]
            async with aiodocker.Docker() as docker:
                info = await docker.containers.container(k["container_id"]).show()
            want = format_cpuset(set(agent.devices[0].cpus) & host_cpus()) or ""
            assert info["HostConfig"]["CpusetCpus"] == want
            assert "DeviceRequests" not in info["HostConfig"] or not info["HostConfig"]["DeviceRequests"]
            assert info["Config"]["Labels"]["ai.backend.cuda-uuids"] == ",".join(k["cuda_uuids"])
            assert f"CUDA_VISIBLE_DEVICES={','.join(k['cuda_uuids'])}" in info["Config"]["Env"]
            await agent.stop()
            again = docker_agent()
            await again.start()
            assert again.gpus.busy_indices() == [0, 3]
            try:
                await again.create_kernel(dict(spec, kernel_id=new_id(), session_id=new_id(),
                                               slots={"cpu": "1", "mem": str(2**30),
                                                      "cuda.device": "7"}))
                raise AssertionError("a device of a running container was handed out again")
            except AgentError as e:
                assert str(e) == "only 6 free CUDA devices, 7 requested"
            await again.destroy_kernel(k["kernel_id"])
            assert again.gpus.owners() == {}
            await again.stop()
        finally:
            async with aiodocker.Docker() as docker:
                for c in await docker.containers.list(
                        all=True, filters={"label": [f"ai.backend.agent-id={agent_id}"]}):
                    await c.delete(force=True)

    asyncio.run(run())
