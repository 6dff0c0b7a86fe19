"""The agent on its own: capacity, host ports and GPU mapping, with the local backend.

There is no GPU on CI: CUDA devices come from ``StaticDeviceSource``, the configured
NVML stand-in. (The real ``NVMLDeviceSource`` was run on a lent H100 machine on
2026-11-22: one device found, UUID and name matching ``nvidia-smi -L``.)
"""

from __future__ import annotations

import asyncio
import os
import zlib

import pytest
from traitlets.config import Config

from jupyterhub_backendai.agent.core import Agent
from jupyterhub_backendai.common.events import InProcessEventBus
from jupyterhub_backendai.common.ids import new_id
from jupyterhub_backendai.common.kernelspec import VERSION

from .inproc import until
from .services import agent_id as new_agent_id
from .services import image_tag, port_range


def _agent(tmp_path) -> Agent:
    c = Config()
    c.Agent.backend = "local"
    c.Agent.state_dir = str(tmp_path / "agent")
    c.Agent.port_range = port_range(10)
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
        "version": VERSION, "kernel_id": new_id(), "session_id": new_id(), "owner": "alice", "image": "local/python",
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
        # Devices reach the kernel by UUID (CUDA accepts UUIDs); the indices are for people.
        assert "CUDA_VISIBLE_DEVICES=GPU-b,GPU-c\n" in env_a
        assert "BACKENDAI_CUDA_DEVICES=1,2\n" in env_a
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
        assert again.gpus.busy_indices() == [0, 1, 2]
        assert again.gpus.owners() == {"GPU-a": b["kernel_id"], "GPU-b": a["kernel_id"],
                                       "GPU-c": a["kernel_id"]}
        await again.destroy_kernel(a["kernel_id"])
        await again.destroy_kernel(b["kernel_id"])
        assert await again.list_kernels() == []
        assert again.gpus.owners() == {} and again.ports.used == set()
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
            ([{"source": str(src), "target": "/home"}], "mount target must be"),
            ([{"source": str(src), "target": "/home/work/"}], "one folder directly under"),
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
        assert await agent.list_kernels() == [] and agent.ports.used == set()
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
        assert await agent.list_kernels() == [] and agent.ports.used == set()
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


def test_local_backend_home_folder_is_the_working_directory(tmp_path):
    """Local backend: a folder mounted at /home/work itself (the user's home folder) is
    the kernel's working directory and HOME; the other folders are linked into it, and
    the links go when the kernel ends (the home's files stay)."""
    home = tmp_path / "vol" / "home"
    home.mkdir(parents=True)
    data = tmp_path / "vol" / "data"
    data.mkdir()
    mounts = [{"source": str(home), "target": "/home/work", "mode": "rw"},
              {"source": str(data), "target": "/home/work/.data", "mode": "rw"}]

    async def run():
        agent = _agent(tmp_path)
        await agent.start()
        k = await agent.create_kernel(dict(_spec("h", 0), mounts=mounts))
        env = await _wait_file(str(home / "env-h"))
        assert f"HOME={home}\n" in env
        assert os.readlink(home / ".data") == str(data)
        assert not os.path.exists(os.path.join(agent.local_work_root, "alice", "env-h"))
        await agent.destroy_kernel(k["kernel_id"])
        assert not os.path.lexists(home / ".data")
        assert sorted(os.listdir(home)) == ["env-h"]
        await agent.stop()

    asyncio.run(run())


# -- CPU burst while an interactive kernel's server starts (Docker) -----------------------


CPU_MAX = """#!/bin/sh
# The container's CPU limit as "<quota> <period>" (cgroup v2, or v1's two files).
if [ -f /sys/fs/cgroup/cpu.max ]; then cat /sys/fs/cgroup/cpu.max
else echo "$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
fi
"""


@pytest.fixture
def burst_image(tmp_path):
    """Builds the kernel image with another command: it records the CPU limit it started
    under, then (in ``cmd``) serves HTTP on the Jupyter port after a second, or never.
    The image (tagged for this run) is removed after the test."""
    import subprocess

    tags = []

    def build(cmd: str) -> str:
        tag = image_tag("cpu-burst", str(zlib.crc32(cmd.encode())))
        d = tmp_path / "img"
        d.mkdir(exist_ok=True)
        (d / "cpu-max").write_text(CPU_MAX)
        (d / "start").write_text(f"#!/bin/sh\ncpu-max > /tmp/startup-cpu.max\n{cmd}\n")
        for f in ("cpu-max", "start"):
            (d / f).chmod(0o755)
        (d / "Dockerfile").write_text(
            "FROM backendai/python-kernel:latest\n"
            "COPY cpu-max start /usr/local/bin/\n"
            'CMD ["start"]\n'
        )
        tags.append(tag)
        subprocess.run(["docker", "build", "-q", "-t", tag, str(d)], check=True,
                       capture_output=True)
        return tag

    yield build
    if tags:
        subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True)


def _docker_agent(tmp_path, agent_id: str, **cfg) -> Agent:
    c = Config()
    c.Agent.backend = "docker"
    c.Agent.agent_id = agent_id
    c.Agent.state_dir = str(tmp_path / "agent")
    c.Agent.port_range = port_range(10)
    c.Agent.slots = {"cpu": 2, "mem": "8g"}
    for k, v in cfg.items():
        setattr(c.Agent, k, v)
    return Agent(InProcessEventBus(), config=c)


async def _cpu(container_id: str) -> tuple[int, str, str]:
    """(NanoCpus from docker inspect, cpu.max now, cpu.max at the server's start)."""
    import json
    import subprocess

    def sh(*args: str) -> str:
        return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()

    info = json.loads(sh("docker", "inspect", container_id))[0]
    now = sh("docker", "exec", container_id, "cpu-max")
    at_start = sh("docker", "exec", container_id, "cat", "/tmp/startup-cpu.max")
    return info["HostConfig"]["NanoCpus"], now, at_start


def _interactive(name: str, image: str, cpu: str = "0.5") -> dict:
    return {
        "version": VERSION, "kernel_id": new_id(), "session_id": new_id(), "owner": "alice", "image": image,
        "slots": {"cpu": cpu, "mem": str(2**30)}, "kernel_type": "interactive",
        "environ": {"BACKENDAI_SESSION_NAME": name}, "service_prefix": f"/user/alice/{name}/",
    }


def test_a_kernel_starts_with_a_cpu_burst_and_is_handed_over_at_its_limit(tmp_path, burst_image):
    image = burst_image("sleep 1; exec python3 -m http.server 8888")
    agent_id = new_agent_id("burst")

    async def run():
        agent = _docker_agent(tmp_path, agent_id, startup_cpus=2.0, startup_cpu_timeout=60.0)
        await agent.start()
        k = await agent.create_kernel(_interactive("b", image))
        try:
            nano, now, at_start = await _cpu(k["container_id"])
            assert at_start == "200000 100000"  # 2 cores while the server started
            assert nano == 500_000_000  # exactly the requested 0.5 CPU once it answered
            assert now == "50000 100000"
            # An agent that died mid-start left a burst: its successor ends it.
            async with __import__("aiodocker").Docker() as docker:
                await docker._query_json(
                    f"containers/{k['container_id']}/update", method="POST",
                    data='{"NanoCpus": 2000000000}', headers={"Content-Type": "application/json"})
            await agent.stop()
            again = _docker_agent(tmp_path, agent_id, startup_cpus=2.0)
            await again.start()
            assert (await _cpu(k["container_id"]))[0] == 500_000_000
            await again.destroy_kernel(k["kernel_id"])
            await again.stop()
        finally:
            import subprocess

            subprocess.run(["docker", "rm", "-f", k["container_id"]], capture_output=True)

    asyncio.run(run())


def test_a_kernel_whose_server_never_answers_gets_its_limit_after_the_bound(tmp_path, burst_image):
    image = burst_image("exec sleep infinity")

    async def run():
        agent = _docker_agent(tmp_path, new_agent_id("burst"), startup_cpus=2.0,
                              startup_cpu_timeout=1.5)
        await agent.start()
        k = await agent.create_kernel(_interactive("n", image, cpu="0.25"))
        try:
            nano, now, at_start = await _cpu(k["container_id"])
            assert at_start == "200000 100000"
            assert nano == 250_000_000
            assert now == "25000 100000"
        finally:
            await agent.destroy_kernel(k["kernel_id"])
            await agent.stop()

    asyncio.run(run())


def test_a_start_abandoned_before_its_server_answers_leaves_nothing(tmp_path, burst_image):
    """Issue 28 (session networks left by starts that failed under load): a start the
    caller gives up on while the kernel's server is not answering yet (a cancellation,
    as when the hub's start times out or the agent's client goes away) takes back its
    container, its session network and its CPU burst. Before: the burst's wait deleted
    the container and left the network."""
    import aiodocker

    image = burst_image("exec sleep infinity")
    agent_id = new_agent_id("burst")

    async def run():
        agent = _docker_agent(tmp_path, agent_id, startup_cpus=2.0, startup_cpu_timeout=60.0)
        await agent.start()
        spec = _interactive("gone", image)
        label = f"ai.backend.session-id={spec['session_id']}"
        async with aiodocker.Docker() as docker:

            async def made() -> tuple[list, list]:
                return (await docker.containers.list(all=True, filters={"label": [label]}),
                        await docker.networks.list(filters={"label": [label]}))

            try:
                task = asyncio.ensure_future(agent.create_kernel(spec))
                # The container runs and the agent waits for its server (the burst).
                assert await until(lambda: _running(docker, label), timeout=60)
                assert [n["Name"] for n in (await made())[1]], "no session network made"
                assert agent.impl._bursting
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

                async def nothing_left() -> bool:
                    return await made() == ([], [])

                assert await until(nothing_left, timeout=30), await made()
                assert agent.impl._bursting == {}
            finally:
                await agent.stop()
                containers, networks = await made()
                for c in containers:
                    await c.delete(force=True)
                for n in networks:
                    await (await docker.networks.get(n["Id"])).delete()

    asyncio.run(run())


async def _running(docker, label: str) -> bool:
    return any(c._container.get("State") == "running" for c in
               await docker.containers.list(filters={"label": [label]}))


async def _host_sized_burst_agent(tmp_path):
    """A started Docker agent whose burst is as large as the host, with room for a few."""
    agent = _docker_agent(tmp_path, new_agent_id("burst"),
                          startup_cpus=float(os.cpu_count() or 1), startup_cpu_timeout=60.0)
    agent.slots = {"cpu": 8, "mem": "8g"}
    await agent.start()
    return agent


async def _remove_and_stop(agent, kernels) -> None:
    for k in kernels:
        await agent.destroy_kernel(k["kernel_id"])
    await agent.stop()


def test_kernels_starting_together_share_the_cores_for_their_burst(tmp_path, burst_image):
    """Issue 30: a burst takes only the cores no other start is bursting into. With the
    burst as large as the host, of three kernels started at once one bursts and the
    others start at their own limit (before: each got the whole host, and they fought);
    all are handed over at their own 0.5 CPU."""
    image = burst_image("sleep 1; exec python3 -m http.server 8888")
    cores = os.cpu_count() or 1

    async def run():
        agent = await _host_sized_burst_agent(tmp_path)
        ks = await asyncio.gather(*(agent.create_kernel(_interactive(f"t{i}", image))
                                    for i in range(3)))
        try:
            cpus = [await _cpu(k["container_id"]) for k in ks]
            assert [nano for nano, _, _ in cpus] == [500_000_000] * 3
            assert [now for _, now, _ in cpus] == ["50000 100000"] * 3
            at_start = sorted(at for _, _, at in cpus)
            assert at_start == sorted([f"{cores * 100000} 100000", "50000 100000",
                                       "50000 100000"]), at_start
            assert agent.impl._bursting == {}
        finally:
            await _remove_and_stop(agent, ks)

    asyncio.run(run())


def test_a_burst_is_shared_with_the_starts_its_manager_says_are_beside_it(tmp_path, burst_image):
    """Issue 30: the manager tells the agent how many other starts it drives there now
    (``starts_beside``): a kernel's burst is at most its share of the cores among them,
    none where that share is not above its own limit (in a rush of five on two cores
    the first kernel bursting alone was the last session to run)."""
    image = burst_image("sleep 1; exec python3 -m http.server 8888")
    cores = os.cpu_count() or 1

    async def run():
        agent = await _host_sized_burst_agent(tmp_path)
        shared = dict(_interactive("s", image, cpu="0.25"), starts_beside=1)
        crowded = dict(_interactive("c", image), starts_beside=2 * cores)
        ks = []
        try:
            for spec in (shared, crowded):  # one after the other: no burst beside
                ks.append(await agent.create_kernel(spec))
            (s_nano, s_now, s_start), (c_nano, c_now, c_start) = \
                [await _cpu(k["container_id"]) for k in ks]
            assert (s_nano, s_now) == (250_000_000, "25000 100000")
            half = cores * 100000 // 2
            assert s_start == (f"{half} 100000" if half > 25000 else "25000 100000"), s_start
            assert (c_nano, c_now, c_start) == (500_000_000, "50000 100000", "50000 100000")
            assert agent.impl._bursting == {}
        finally:
            await _remove_and_stop(agent, ks)

    asyncio.run(run())


def test_the_starts_beside_a_kernel_are_the_others_that_may_run_on_its_agent():
    """What the manager says in ``starts_beside`` (and what the spawner's first look
    waits for): the other starts in flight in the process, from placement until their
    servers answer, whose kernels are on the same agent, and those not read yet (they
    may be)."""
    from types import SimpleNamespace

    from jupyterhub_backendai.manager.core import BackendAIManager

    starting = {"a", "b", "c", "d"}
    answering = {"e": "n1", "f": "n2", "g": None}  # servers still starting; g's agent unknown
    mgr = SimpleNamespace(
        lifecycle=SimpleNamespace(starting=lambda: set(starting),
                                  starter=SimpleNamespace(agents_of={})),
        sessions=SimpleNamespace(answering_here=answering))
    mgr.lifecycle.starter.agents_of.update(a={"n1"}, b={"n1", "n2"}, c={"n2"})  # d: not read
    beside = BackendAIManager.starts_beside
    assert beside(mgr, "a", "n1") == 4  # b, d, e, g
    assert beside(mgr, "c", "n2") == 4  # b, d, f, g
    assert beside(mgr, "a", "n3") == 2  # d, g
    starting -= {"b", "d"}
    answering.pop("g")
    assert beside(mgr, "a", "n1") == 1  # e
    assert beside(mgr, "e", "n1") == 1  # a


def test_no_burst_when_disabled_or_not_interactive(tmp_path, burst_image):
    image = burst_image("exec python3 -m http.server 8888")

    async def run():
        agent = _docker_agent(tmp_path, new_agent_id("burst"), startup_cpus=0.0)
        await agent.start()
        k = await agent.create_kernel(_interactive("z", image))
        idle = await agent.create_kernel(dict(_interactive("i", image), kernel_type="idle"))
        try:
            assert (await _cpu(k["container_id"]))[0] == 500_000_000
            assert (await _cpu(k["container_id"]))[2] == "50000 100000"
            import aiodocker

            async with aiodocker.Docker() as docker:
                info = await docker.containers.container(idle["container_id"]).show()
            assert info["HostConfig"]["NanoCpus"] == 500_000_000
        finally:
            await agent.destroy_kernel(k["kernel_id"])
            await agent.destroy_kernel(idle["kernel_id"])
            await agent.stop()

    asyncio.run(run())


# -- live statistics in Redis ----------------------------------------------------------------


def test_heartbeats_write_live_statistics_to_redis(tmp_path, redis_server):
    import json

    import redis.asyncio as aioredis

    from jupyterhub_backendai.agent.stats import read_stats, stats_key
    from jupyterhub_backendai.common.events import RedisEventBus

    agent_id = new_agent_id("stats")
    url = redis_server.fresh_url()

    async def run():
        bus = RedisEventBus(url)
        c = Config()
        c.Agent.backend = "docker"
        c.Agent.agent_id = agent_id
        c.Agent.state_dir = str(tmp_path / "agent")
        c.Agent.port_range = port_range(10)
        c.Agent.slots = {"cpu": 4, "mem": "8g"}
        c.Agent.heartbeat_interval = 3600.0  # heartbeats by hand below
        agent = Agent(bus, config=c)
        r = aioredis.from_url(url)
        await agent.start()
        try:
            spec = {
                "version": VERSION, "kernel_id": new_id(), "session_id": new_id(), "owner": "alice",
                "image": "backendai/python-kernel:latest", "kernel_type": "batch",
                # Busy for a while: a CPU figure above zero, some memory.
                "command": "python3 -c 'import time; x = bytearray(64 << 20); t = time.time()\n"
                           "while time.time() - t < 60: pass'",
                "slots": {"cpu": "1", "mem": str(2**30)}, "environ": {},
                "service_prefix": "/x/",
            }
            k = await agent.create_kernel(spec)
            kid = k["kernel_id"]
            await agent.heartbeat()
            first = (await read_stats(r, [agent_id]))[agent_id]
            assert first["kernels"][kid]["cpu_pct"] is None  # one sample: no rate yet
            await agent.heartbeat()
            got = await read_stats(r)  # by SCAN: every agent with statistics
            st = got[agent_id]
            ks = st["kernels"][kid]
            assert ks["cpu_pct"] is not None and ks["cpu_pct"] > 0
            assert ks["mem_bytes"] > 0
            assert ks["mem_limit_bytes"] == 2**30
            assert ks["gpu_util_pct"] is None  # no GPU here
            assert st["available_slots"] == {"cpu": "4", "mem": str(8 * 2**30)}
            assert st["occupied_slots"] == {"cpu": "1", "mem": str(2**30)}
            assert st["free_slots"] == {"cpu": "3", "mem": str(7 * 2**30)}
            ttl = await r.pttl(stats_key(agent_id))
            assert 0 < ttl <= 3 * 3600 * 1000
            raw = await r.hgetall(stats_key(agent_id))
            assert json.loads(raw[b"kernels"])[kid]["mem_bytes"] == ks["mem_bytes"]
            # A restarted agent knows its kernels' slots again (from the container).
            await agent.stop()
            assert await r.exists(stats_key(agent_id)) == 0  # a stopped agent has none
            agent = Agent(bus, config=c)
            await agent.start()
            await agent.heartbeat()
            st = (await read_stats(r, [agent_id]))[agent_id]
            assert st["occupied_slots"] == {"cpu": "1", "mem": str(2**30)}
            await agent.destroy_kernel(kid)
            await agent.heartbeat()
            st = (await read_stats(r, [agent_id]))[agent_id]
            assert st["kernels"] == {} and st["free_slots"] == st["available_slots"]
        finally:
            await agent.stop()
            await bus.close()
            await r.aclose()

    asyncio.run(run())


# -- the kernel's own /proc through LXCFS (issue 29) ---------------------------------------


@pytest.fixture
def lxcfs_root(tmp_path):
    """An LXCFS of this test's own (Debian's ``lxcfs``, as root, in the foreground), at a
    directory of the test's; stopped (which unmounts it) after."""
    import subprocess
    import time

    from jupyterhub_backendai.agent.backends import lxcfs

    root = tmp_path / "lxcfs"
    root.mkdir()
    log = open(tmp_path / "lxcfs.log", "wb")
    proc = subprocess.Popen(["lxcfs", "--enable-cfs", "-f", "-p", str(tmp_path / "lxcfs.pid"),
                             str(root)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while not lxcfs.is_mounted(str(root)):
            assert proc.poll() is None and time.monotonic() < deadline, (
                (tmp_path / "lxcfs.log").read_text())
            time.sleep(0.05)
        yield str(root)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _proc_view(container_id: str) -> tuple[int, int, int]:
    """(MemTotal in bytes, processors in /proc/cpuinfo, os.cpu_count()) in a container."""
    import subprocess

    out = subprocess.run(
        ["docker", "exec", container_id, "sh", "-c",
         "free -b | awk '/^Mem:/{print $2}'; grep -c ^processor /proc/cpuinfo;"
         " python3 -c 'import os; print(os.cpu_count())'"],
        check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


def test_a_kernel_sees_its_own_memory_and_cpus_through_lxcfs(tmp_path, lxcfs_root):
    """``free`` and ``/proc/cpuinfo`` in a 1-CPU, 768 MiB kernel: its own limits where the
    agent lays LXCFS over its /proc; the host's without (``Agent.lxcfs = ""``)."""
    import subprocess

    mem = 768 << 20

    def spec():
        return {"version": VERSION, "kernel_id": new_id(), "session_id": new_id(),
                "owner": "alice", "image": "backendai/python-kernel:latest",
                "kernel_type": "batch", "command": "sleep 300",
                "slots": {"cpu": "1", "mem": str(mem)}, "environ": {}, "service_prefix": "/x/"}

    async def run():
        made = []
        try:
            for setting in (lxcfs_root, ""):
                agent = _docker_agent(tmp_path / (setting and "with" or "without"),
                                      new_agent_id("lxcfs"), lxcfs=setting)
                await agent.start()
                k = await agent.create_kernel(spec())
                made.append(k["container_id"])
                view = _proc_view(k["container_id"])
                await agent.destroy_kernel(k["kernel_id"])
                await agent.stop()
                yield view
        finally:
            for cid in made:
                subprocess.run(["docker", "rm", "-f", cid], capture_output=True)

    async def collect():
        return [v async for v in run()]

    with_lxcfs, without = asyncio.run(collect())
    assert with_lxcfs == (mem, 1, 1)
    host_mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert without[0] > mem and abs(without[0] - host_mem) < 64 << 20, (without, host_mem)
    assert without[1] == os.cpu_count() == without[2]


def test_an_lxcfs_setting_that_is_not_lxcfs_stops_the_agent(tmp_path):
    """A path that is not an LXCFS mount: the agent says what to do and does not start
    (it would give kernels the host's figures while the operator believes otherwise);
    ``auto`` uses LXCFS only where it is mounted."""
    from jupyterhub_backendai.agent.backends import lxcfs
    from jupyterhub_backendai.common.errors import AgentError

    (tmp_path / "empty").mkdir()
    with pytest.raises(AgentError, match="no LXCFS file system is mounted at .*lxcfs --enable-cfs"):
        lxcfs.resolve(str(tmp_path / "empty"))
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "355 27 0:117 / /var/lib/lxcfs rw,nosuid,nodev,relatime - fuse.lxcfs lxcfs rw,allow_other\n"
        "136 27 0:93 / /srv/other rw,relatime shared:5 - fuse.sshfs host:/ rw\n")
    assert lxcfs.is_mounted("/var/lib/lxcfs", str(mountinfo))
    assert not lxcfs.is_mounted("/srv/other", str(mountinfo))
    assert not lxcfs.is_mounted("/var/lib", str(mountinfo))
    assert lxcfs.resolve("") is None
    assert lxcfs.mounts(None) == []


def test_the_pool_waiter_waits_out_the_binding_file_being_given_to_it(tmp_path):
    """Issue 30 (a pooled kernel bound under load exited with code 1): Docker's archive
    makes the binding file as root, mode 0600, and hands it to the kernel's user only
    after; the waiter, polling, saw it exist and could not open it (PermissionError).
    Here the window is held open for a second: the waiter (as the kernel user, in the
    kernel image) must wait it out and go on to the server's start (which, without a
    hub's environment given, ends in JupyterHub's own words)."""
    import json
    import subprocess
    import time

    from jupyterhub_backendai.agent import warmpool

    conf = tmp_path / "config"
    conf.mkdir()
    os.chown(conf, 1000, 1000)
    waiter = tmp_path / "waiter"
    waiter.write_text(warmpool.WAITER)
    waiter.chmod(0o755)
    name = f"bai-test-waiter-{new_id()[:8]}"
    subprocess.run(["docker", "run", "-d", "--name", name, "--user", "1000:1000",
                    "--network", "none", "-v", f"{conf}:{warmpool.INBOX}",
                    "-v", f"{waiter}:/waiter:ro", "--entrypoint", "python3",
                    "backendai/python-kernel:latest", "/waiter"],
                   check=True, capture_output=True)

    def logs() -> str:
        r = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
        return r.stdout + r.stderr

    def running() -> bool:
        return subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name],
                              capture_output=True, text=True).stdout.strip() == "true"

    try:
        deadline = time.monotonic() + 60
        while warmpool.READY_LINE not in logs():
            assert time.monotonic() < deadline and running(), logs()
            time.sleep(0.1)
        bind = conf / warmpool.BIND_NAME
        # Root's and 0600 from its first instant, as Docker's archive makes it (written
        # and then chmodded, it was readable in between and the waiter took it).
        fd = os.open(bind, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"environ": {"HOME": "/home/work"}}))
        time.sleep(1.0)
        assert running(), logs()  # before: PermissionError, exit 1
        os.chown(bind, 1000, 1000)
        deadline = time.monotonic() + 60
        while running():
            assert time.monotonic() < deadline, logs()
            time.sleep(0.1)
        out = logs()
        assert "PermissionError" not in out, out
        assert "Missing required environment $JUPYTERHUB_SERVICE_URL" in out, out  # its start
        assert not bind.exists()  # read, then removed (it carries a session's token)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def test_the_pool_waiter_reads_entry_points_once_until_a_distribution_comes_or_goes(tmp_path):
    """Issue 30: a bound server's start asked importlib.metadata for entry points a dozen
    times, each ask reading every distribution's entry_points.txt (the most of its CPU
    after the binding, profiled). The waiter's memo answers from one reading, as the
    stdlib would, and reads again as soon as a distribution is installed or removed on
    sys.path; a directory without distributions put on the path (the image's server
    config adds one once bound) reads nothing again. Run as the waiter runs it, in a Python of its own, with the stdlib's
    function counted."""
    import json
    import subprocess
    import sys
    import textwrap

    from jupyterhub_backendai.agent import warmpool

    site = tmp_path / "site"
    site.mkdir()

    def dist(name: str, group: str, entry: str) -> None:
        info = site / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[{group}]\n{entry} = {name}.mod:thing\n")

    dist("baitesta", "bai.test", "first")
    script = textwrap.dedent("""
        import importlib, importlib.metadata as md, json, os, shutil, sys
        sys.path.insert(0, SITE)
        reads = [0]
        stdlib = md.entry_points
        def counted(**params):
            reads[0] += 1
            return stdlib(**params)
        md.entry_points = counted
        MEMO
        def names(group):
            return sorted(ep.name for ep in md.entry_points(group=group))
        out = {"installed": md.entry_points is not counted, "after_start": reads[0]}
        out["first"] = [names("bai.test"), names("bai.test"), names("console_scripts") ==
                        sorted(ep.name for ep in stdlib(group="console_scripts")),
                        len(md.entry_points()) == len(stdlib()), reads[0]]
        # A directory of modules put on the path changes no answer: no reading.
        os.mkdir(MODULES)
        sys.path.insert(0, MODULES)
        sys.path.insert(0, MODULES + "-missing")
        out["modules_on_path"] = [names("bai.test"), reads[0]]
        # An egg put on the path holds a distribution (in its EGG-INFO): read again.
        egg = os.path.join(MODULES, "baitestc-1.0.egg")
        os.makedirs(os.path.join(egg, "EGG-INFO"))
        with open(os.path.join(egg, "EGG-INFO", "PKG-INFO"), "w") as f:
            f.write("Metadata-Version: 2.1\\nName: baitestc\\nVersion: 1.0\\n")
        with open(os.path.join(egg, "EGG-INFO", "entry_points.txt"), "w") as f:
            f.write("[bai.test]\\negg = baitestc.mod:thing\\n")
        sys.path.insert(0, egg)
        out["egg_on_path"] = [names("bai.test"), reads[0]]
        sys.path.remove(egg)
        out["egg_gone"] = [names("bai.test"), reads[0]]
        info = os.path.join(SITE, "baitestb-1.0.dist-info")
        os.mkdir(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\\nName: baitestb\\nVersion: 1.0\\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write("[bai.test]\\nsecond = baitestb.mod:thing\\n")
        os.utime(SITE, ns=(1, os.stat(SITE).st_mtime_ns + 1))  # (a coarse clock's same tick)
        out["installed_one"] = [names("bai.test"), names("bai.test"), reads[0]]
        shutil.rmtree(info)
        os.utime(SITE, ns=(1, os.stat(SITE).st_mtime_ns + 2))
        out["removed_it"] = [names("bai.test"), reads[0]]
        print(json.dumps(out))
    """).replace("SITE", repr(str(site))).replace("MODULES", repr(str(tmp_path / "modules")))
    script = script.replace("MEMO", warmpool.ENTRY_POINTS_MEMO)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["installed"]
    read = out["after_start"]
    assert read >= 1  # the waiter reads them all before it is bound
    # asked four times, in groups and whole, answered as the stdlib answers, no reading
    assert out["first"] == [["first"], ["first"], True, True, read]
    assert out["modules_on_path"] == [["first"], read]
    assert out["egg_on_path"] == [["egg", "first"], read + 1]
    assert out["egg_gone"] == [["first"], read + 2]
    assert out["installed_one"] == [["first", "second"], ["first", "second"], read + 3]
    assert out["removed_it"] == [["first"], read + 4]


def test_changes_of_what_an_agent_holds_go_out_together_and_images_are_listed_when_they_change(tmp_path):
    """Issue 30: every bind of a rush sent a heartbeat of its own, each listing the
    engine's images (its dearest routine call) and the agent's containers, and each
    written to the agent's row. Changes within ``REPORT_SETTLE`` now go out as one, with
    the images as last listed; an image's arrival lists them again; a change while a
    heartbeat is being made is not lost (one more follows)."""
    import asyncio

    async def run():
        agent = _agent(tmp_path)
        await agent.start()
        try:
            sent: list[dict] = []
            await agent.event_bus.start_consuming(
                lambda name, p: asyncio.sleep(0, sent.append(p)) if name == "agent_heartbeat"
                else asyncio.sleep(0))
            listings = [0]
            own = agent.impl.list_images

            async def counted():
                listings[0] += 1
                return await own()

            agent.impl.list_images = counted
            async def first():
                return bool(sent)

            assert await until(first)  # the first heartbeat
            sent.clear()
            # A settle with room for five calls 10 ms apart on a loaded machine (with the
            # agent's 50 ms, a suite on two cores once took longer between them).
            agent.REPORT_SETTLE = 0.5
            for _ in range(5):  # a rush's binds, 10 ms apart
                agent.report_soon()
                await asyncio.sleep(0.01)
            await asyncio.sleep(agent.REPORT_SETTLE + 0.2)
            assert len(sent) == 1, sent
            assert listings[0] == 0  # the images as the first heartbeat listed them
            assert sent[0]["images"] == sorted({i.name for i in await own()})

            agent.report_soon(images=True)  # an image arrived
            agent.report_soon()
            await asyncio.sleep(agent.REPORT_SETTLE + 0.2)
            assert len(sent) == 2 and listings[0] == 1

            # A change while the heartbeat is being made: in the next one.
            gate = asyncio.Event()

            async def slow():
                await gate.wait()
                return await counted()

            agent.impl.list_images = slow
            agent.report_soon(images=True)
            await asyncio.sleep(agent.REPORT_SETTLE + 0.05)  # the heartbeat is being made
            assert len(sent) == 2
            agent.report_soon()
            gate.set()
            await asyncio.sleep(2 * agent.REPORT_SETTLE + 0.2)
            assert len(sent) == 4 and listings[0] == 2

            # At once (devices another agent holds: the refused session is placed again
            # as soon as it is back in the queue), also cutting a settle short.
            agent.impl.list_images = counted
            agent.REPORT_SETTLE = 30.0
            agent.report_soon()
            await asyncio.sleep(0.2)
            assert len(sent) == 4  # settling
            agent.report_soon(at_once=True)
            assert await until(lambda: asyncio.sleep(0, len(sent) == 5), timeout=5)
        finally:
            await agent.stop()

    asyncio.run(run())
