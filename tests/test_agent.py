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


def test_mounts_are_checked_before_anything_starts(tmp_path):
    """A kernel's mounts must be one folder under /home/work each, from a directory that
    exists here; a bad one is refused with the reason, holding no port and no process."""
    from jupyterhub_backendai.common.errors import InvalidRequest

    src = tmp_path / "folder"
    src.mkdir()

    async def run():
        agent = _agent(tmp_path)
        await agent.start()
        bad = [
            ([{"source": str(src), "target": "/home/work"}], "mount target must be"),
            ([{"source": str(src), "target": "/tmp/x"}], "mount target must be /home/work/<name>"),
            ([{"source": str(src), "target": "/home/work/a/b"}], "one folder directly under"),
            ([{"source": str(src), "target": "/home/work/.."}], "one folder directly under"),
            ([{"source": str(src), "target": "/home/work/d"}, {"source": str(src), "target": "/home/work/d"}],
             "two mounts at /home/work/d"),
            ([{"source": "relative", "target": "/home/work/d"}], "absolute path"),
            ([{"source": str(tmp_path / "missing"), "target": "/home/work/d"}], "is not a directory"),
            ([{"source": str(src), "target": "/home/work/d", "mode": "wd"}], "mode must be ro or rw"),
            ([{"source": str(src), "target": "/home/work/d", "extra": 1}], "a mount is"),
            ({"source": str(src)}, "mounts must be a list"),
        ]
        for mounts, reason in bad:
            spec = dict(_spec("m", 0), mounts=mounts)
            try:
                await agent.create_kernel(spec)
                raise AssertionError(f"accepted {mounts!r}")
            except InvalidRequest as e:
                assert reason in e.detail, (reason, e.detail)
        assert await agent.list_kernels() == [] and agent._used_ports == set()
        await agent.stop()

    asyncio.run(run())


def test_local_backend_links_vfolders_while_a_kernel_uses_them(tmp_path):
    """Local backend: ``<workdir>/<name>`` links to the folder while a live kernel of
    that user mounts it; a name taken by the user's own file is refused."""
    from jupyterhub_backendai.common.errors import InvalidRequest

    data = tmp_path / "vol" / "data"
    data.mkdir(parents=True)
    other = tmp_path / "vol" / "other"
    other.mkdir()
    mount = [{"source": str(data), "target": "/home/work/data", "mode": "rw"}]

    async def run():
        agent = _agent(tmp_path)
        await agent.start()
        home = os.path.join(agent.local_work_root, "alice")
        link = os.path.join(home, "data")
        a = await agent.create_kernel(dict(_spec("a", 0), mounts=mount))
        b = await agent.create_kernel(dict(_spec("b", 0), mounts=mount))
        assert os.readlink(link) == str(data)
        # A kernel writes through the link into the folder.
        with open(os.path.join(link, "f.txt"), "w") as f:
            f.write("x")
        assert os.listdir(data) == ["f.txt"]
        # Another folder at the same name, while the link is in use: refused, nothing kept.
        try:
            await agent.create_kernel(dict(_spec("c", 0), mounts=[dict(mount[0], source=str(other))]))
            raise AssertionError("a second folder took the link of a live one")
        except InvalidRequest as e:
            assert "another session of alice has a different folder at /home/work/data" in e.detail
        assert len(await agent.list_kernels()) == 2
        await agent.destroy_kernel(a["kernel_id"])
        assert os.readlink(link) == str(data), "b still uses it"
        await agent.destroy_kernel(b["kernel_id"])
        assert not os.path.lexists(link)
        assert os.listdir(data) == ["f.txt"], "the folder itself stays"

        # The user's own file of that name is never replaced.
        os.makedirs(link)
        try:
            await agent.create_kernel(dict(_spec("d", 0), mounts=mount))
            raise AssertionError("a mount replaced the user's own folder")
        except InvalidRequest as e:
            assert "already has a file or folder of that name" in e.detail
        assert await agent.list_kernels() == [] and agent._used_ports == set()
        os.rmdir(link)

        # A kernel that exits by itself gives its link back too.
        c = await agent.create_kernel(dict(_spec("e", 0), mounts=mount))
        assert os.path.islink(link)
        os.killpg(int(c["container_id"]), 9)
        for _ in range(100):
            if not os.path.lexists(link):
                break
            await asyncio.sleep(0.05)
        assert not os.path.lexists(link)
        await agent.stop()

    asyncio.run(run())
