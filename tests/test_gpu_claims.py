"""GPUs claimed host-wide: two installations on one GPU host never hand one device to two
kernels, and an agent's ``device_mask`` splits a host's GPUs between them on purpose.

There is no GPU on CI: the devices come from the NVML STAND-IN
(``agent.resources.nvml_standin``: a DGX-1 with eight V100s, the two-A100 MIG machine),
read by the real discovery code. A stand-in's devices are described, not handed to
containers, so an agent does not claim them; the tests that need claims read the
stand-in *as if it were a driver* (``_AsIfReal``), which is what an agent on a real GPU
host does. The claims themselves are real: ``flock``s on files, taken across processes
(a second Python process is the other installation's agent) and given up when that
process is killed. Each test claims in a directory of its own (``tempfile.tempdir`` or
``HostClaims(directory=...)``), since the stand-in's UUIDs are the same in every test
worker and in a second suite running beside this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest
from traitlets.config import Config

from jupyterhub_backendai.agent.core import Agent as LocalAgent
from jupyterhub_backendai.agent.hostclaims import HostClaims
from jupyterhub_backendai.agent.resources.cuda import NVMLDeviceSource
from jupyterhub_backendai.agent.resources.gpu_alloc import GPUAllocator
from jupyterhub_backendai.agent.resources.nvml_standin import stand_in
from jupyterhub_backendai.common.errors import AgentError
from jupyterhub_backendai.manager import capacity
from jupyterhub_backendai.manager.access import Principal
from jupyterhub_backendai.models import Agent
from jupyterhub_backendai.pages.console import _agent_view, human_slots

from .inproc import agent_config, gpu_batch, make_user, running_manager, wait_status

# The other installation's agent: the same allocator on the same machine, in a process
# of its own, driven line by line ("take <kernel> <n> [mig-profile]", "release <kernel>").
OTHER_AGENT = textwrap.dedent("""
    import json, sys
    from jupyterhub_backendai.agent.hostclaims import HostClaims
    from jupyterhub_backendai.agent.resources.cuda import NVMLDeviceSource
    from jupyterhub_backendai.agent.resources.gpu_alloc import GPUAllocator
    from jupyterhub_backendai.agent.resources.nvml_standin import stand_in
    from jupyterhub_backendai.common.errors import AgentError

    machine, directory = sys.argv[1], sys.argv[2]
    alloc = GPUAllocator(NVMLDeviceSource(stand_in(machine)).topology(),
                         claims=HostClaims("gpu", directory))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd, kernel, *rest = line.split()
        try:
            if cmd == "take":
                mig = {rest[1]: 1} if len(rest) > 1 else None
                got = alloc.take(kernel, int(rest[0]), mig)
                print(json.dumps({"indices": got.indices, "uuids": got.uuids}), flush=True)
            else:
                alloc.release(kernel)
                print(json.dumps({"released": kernel}), flush=True)
        except AgentError as e:
            print(json.dumps({"error": str(e)}), flush=True)
""")


class OtherAgent:
    def __init__(self, machine: str, directory: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OTHER_AGENT, machine, directory],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.ask(None) == {"ready": True}

    def ask(self, line: str | None) -> dict:
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        assert out, f"the other agent ended (exit {self.proc.poll()})"
        return json.loads(out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def other_agents():
    made: list[OtherAgent] = []
    yield lambda machine, directory: made.append(OtherAgent(machine, directory)) or made[-1]
    for a in made:
        a.kill()


def test_two_agents_of_one_host_never_hand_out_one_gpu(tmp_path, other_agents):
    topo = NVMLDeviceSource(stand_in("dgx1-v100")).topology()
    other = other_agents("dgx1-v100", str(tmp_path))
    mine = GPUAllocator(topo, claims=HostClaims("gpu", str(tmp_path)))

    # The other installation's kernel takes the best quad: GPUs 0-3 (one socket, NVLink).
    theirs = other.ask("take k-theirs 4")
    assert theirs["indices"] == [0, 1, 2, 3]
    # This agent's books say all eight are free; the claims pass over the other's four
    # and the choice is made again among the rest: the other socket's quad.
    got = mine.take("k-mine", 4)
    assert got.indices == [4, 5, 6, 7]
    assert not set(got.uuids) & set(theirs["uuids"])
    assert all(os.path.exists(HostClaims("gpu", str(tmp_path)).path(u)) for u in got.uuids)

    # One more: nothing is free on either agent's side of the host, and the reason says
    # where the rest went. Nothing is taken by the refused request.
    with pytest.raises(AgentError, match=r"only 0 free CUDA devices, 1 requested; 4 more "
                                         r"held by another agent of this host"):
        mine.take("k-more", 1)
    assert mine.owners() == {u: "k-mine" for u in got.uuids}
    assert other.ask("take k-theirs-2 1")["error"].startswith("only 0 free CUDA devices")

    # The other kernel ends: its devices are free to this agent at once.
    assert other.ask("release k-theirs") == {"released": "k-theirs"}
    pair = mine.take("k-pair", 2)
    assert set(pair.indices) <= {0, 1, 2, 3}
    assert other.ask("take k-theirs-3 2")["indices"] == sorted(
        {0, 1, 2, 3} - set(pair.indices))

    # The other agent is killed with its kernel holding two GPUs: its locks end with its
    # process (its files stay, unlocked), and this agent takes those GPUs.
    other.kill()
    mine.release("k-mine")
    rest = mine.take("k-rest", 6)
    assert sorted(rest.indices) == sorted(set(range(8)) - set(pair.indices))
    # Given back, every claim file goes: a host keeps none per device it ever used.
    mine.release("k-pair")
    mine.release("k-rest")
    assert not [p for p in os.listdir(tmp_path) if p.startswith("backendai-gpu-")]


def test_mig_instances_are_claimed_host_wide(tmp_path, other_agents):
    topo = NVMLDeviceSource(stand_in("a100-mig")).topology()
    other = other_agents("a100-mig", str(tmp_path))
    mine = GPUAllocator(topo, claims=HostClaims("gpu", str(tmp_path)))
    big = other.ask("take k-theirs 0 3g.40gb")
    assert len(big["uuids"]) == 1 and big["uuids"][0].startswith("MIG-")
    with pytest.raises(AgentError, match=r"only 0 free MIG instances of profile 3g.40gb "
                                         r".*1 more held by another agent of this host"):
        mine.take("k-mine", 0, {"3g.40gb": 1})
    # An instance of another profile, and the whole GPU, are still this agent's to give;
    # a request for both is all or nothing when one part is held elsewhere.
    small = mine.take("k-small", 1, {"1g.10gb": 1})
    assert len(small.uuids) == 2
    with pytest.raises(AgentError, match="3g.40gb"):
        mine.take("k-both", 0, {"2g.20gb": 1, "3g.40gb": 1})
    assert set(mine.owners().values()) == {"k-small"}
    assert other.ask("take k-theirs-2 0 2g.20gb")["uuids"]  # the refused one took nothing


ROOT = Principal(user_id="root", username="root", email="root@example.com", role="superadmin",
                 domain="default")


class _AsIfReal(NVMLDeviceSource):
    """The stand-in read as an agent on a GPU host reads its driver: its devices are
    claimed host-wide. (The local backend hands devices to a kernel as environment
    variables only, so no driver is needed to run the kernel.)"""

    fake = False


async def _gpu_agent(mgr, tmp_path, name: str, mask=()) -> LocalAgent:
    c = Config()
    c.merge(mgr.test_config)
    agent_config(c, tmp_path, "local", slots={"cpu": 8, "mem": "8g"}, name=name)
    c.Agent.device_mask = list(mask)
    c.Agent.heartbeat_interval = 3600.0  # each heartbeat sent by the test
    agent = LocalAgent(mgr.bus, config=c)
    agent.device_source = _AsIfReal(stand_in("a100-mig"))
    await mgr.attach_agent(agent)
    return agent


async def _away(mgr, agent, send: bool = True) -> dict:
    """The slots the manager's record of ``agent`` counts as held by another agent of
    its host, once the agent's heartbeat (sent now; with ``send`` false, one the agent
    sent by itself) has reached it."""
    if send:
        await agent.heartbeat()
    want = {k: str(v) for k, v in agent.gpus.away().items()} or None
    for _ in range(400):
        row = await mgr.db_read(lambda s: s.get(Agent, agent.agent_id))
        if (row.away_slots or None) == want:
            return want or {}
        await asyncio.sleep(0.05)
    raise AssertionError(f"the manager's record says {row.away_slots}, the agent {want}")


@contextlib.asynccontextmanager
async def _two_installations(tmp_path):
    """Two managers (no tries to spare), each with its own database and a GPU agent on
    the same stand-in host: (manager one, manager two, agent one, agent two)."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    async with (running_manager(f"sqlite:///{tmp_path}/one/db.sqlite", tmp_path / "one",
                                "local", slots={"cpu": 2, "mem": "4g"}, retries=0) as one,
                running_manager(f"sqlite:///{tmp_path}/two/db.sqlite", tmp_path / "two",
                                "local", slots={"cpu": 2, "mem": "4g"}, retries=0) as two):
        yield (one, two, await _gpu_agent(one, tmp_path / "one", "gpu-one"),
               await _gpu_agent(two, tmp_path / "two", "gpu-two"))


def test_two_installations_on_one_gpu_host(tmp_path, monkeypatch, caplog):
    """Two managers, each with its own database and agent on the same (stand-in) GPU
    host. While the first installation's kernel holds the whole GPU, the second's agent
    says so in its heartbeat and its scheduler counts the GPU as taken: a session that
    asks for it waits. One placed there before the agent could say so is refused
    instead of sharing the device and goes back to the queue without using a try (here
    there are none: it used to end in ERROR), and the refusal makes the agent say it at
    once. Once the first kernel ends, the waiting ones get it in turn. With
    ``device_mask`` splitting the host, each agent offers only its own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's claims only

    async def run():
        async with _two_installations(tmp_path) as (one, two, a1, a2):
            gpu1 = a1.devices[1]
            assert not gpu1.mig_enabled and a2.devices[1].uuid == gpu1.uuid
            assert await _away(two, a2) == {}
            alice = await make_user(one)
            bob = await make_user(two, email="bob@example.com")

            first = await gpu_batch(one, alice, "first", {"cuda.device": 1})
            await wait_status(one, first, ("RUNNING",))
            assert gpu1.uuid in a1.gpus.owners()
            # Read from the host's lock table, without taking a lock: a2 sees it away,
            # a1 sees its own kernel's device (occupied in its books, not away).
            assert {k: int(v) for k, v in a2.gpus.away().items()} == {"cuda.device": 1}
            assert a1.gpus.away() == {}

            # Placed on what a2's last heartbeat offered: the claim refuses it, and the
            # session goes back to the queue without using a try (this manager has none
            # to give: before, it ended in ERROR), nothing half-taken.
            second = await gpu_batch(two, bob, "second", {"cuda.device": 1})
            for _ in range(200):
                sess = await two.get_session(second)
                if "CREATING" in (sess.status_history or {}) and sess.status == "PENDING":
                    break
                await asyncio.sleep(0.05)
            assert sess.status == "PENDING" and "CREATING" in sess.status_history, \
                (sess.status, sess.status_info)
            assert sess.retries == 0
            assert a2.gpus.owners() == {}

            # The refusal made a2 say so at once (its next heartbeat is an hour away): the
            # session now waits in the queue for the GPU, and so does a request made
            # after it; the admin API and the console say where the GPU is.
            assert await _away(two, a2, send=False) == {"cuda.device": "1"}
            shown = await two.db_read(capacity.get_agent, ROOT, a2.agent_id)
            assert shown["away_slots"] == {"cuda.device": "1"}
            row = next(r for r in _agent_view(shown)["use"] if r["slot"] == "cuda.device")
            assert row["away"] == human_slots({"cuda.device": 1})
            third = await gpu_batch(two, bob, "third", {"cuda.device": 1})
            for sid in (second, third):
                for _ in range(100):
                    waiting = await two.get_session(sid)
                    if "cuda.device" in (waiting.status_info or ""):
                        break
                    await asyncio.sleep(0.05)
                assert waiting.status == "PENDING", (waiting.status, waiting.status_info)
                assert "waiting for resources" in waiting.status_info, waiting.status_info
            assert (await two.get_session(second)).retries == 0

            await one.destroy_session(first)
            await wait_status(one, first, ("TERMINATED", "CANCELLED"))
            assert await _away(two, a2) == {}
            shown = await two.db_read(capacity.get_agent, ROOT, a2.agent_id)
            assert shown["away_slots"] == {}
            # The one that met the claim first gets the GPU, then the next.
            for sid in (second, third):
                await wait_status(two, sid, ("RUNNING",))
                kernel = (await two.get_session(sid)).kernels[0]
                assert a2.gpus.owners() == {gpu1.uuid: kernel.id}
                assert {k: int(v) for k, v in a1.gpus.away().items()} == {"cuda.device": 1}
                await two.destroy_session(sid)
                await wait_status(two, sid, ("TERMINATED", "CANCELLED"))

            # Split on purpose: each agent masks what the other's has.
            mig_uuids = [m.uuid for m in a1.devices[0].mig_instances]
            m1 = await _gpu_agent(one, tmp_path / "one", "mask-one", mask=["1"])
            m2 = await _gpu_agent(two, tmp_path / "two", "mask-two",
                                  mask=[a1.devices[0].uuid])
            assert [d.index for d in m1.devices] == [0]
            assert [d.index for d in m2.devices] == [1]
            assert "cuda.device" not in m1.capacity
            assert {k for k in m1.capacity if k.startswith("cuda.")} == {
                f"cuda.mig-{p}" for p in ("3g.40gb", "2g.20gb", "1g.10gb")}
            assert {k: int(v) for k, v in m2.capacity.items() if k.startswith("cuda.")} == {
                "cuda.device": 1}
            stats = await m2.collect_stats()
            assert [g["uuid"] for g in stats["gpus"]] == [gpu1.uuid]
            # One MIG instance masked by its UUID: that slot counts one fewer. A name that
            # is no device of the host (a typo) masks nothing, and the log says so.
            caplog.clear()
            m3 = await _gpu_agent(one, tmp_path / "one", "mask-mig",
                                  mask=[mig_uuids[-1], "GPU-typo"])
            assert sum(int(v) for k, v in m3.capacity.items()
                       if k.startswith("cuda.mig-")) == len(mig_uuids) - 1
            assert "Agent.device_mask names no GPU or MIG instance of this host: GPU-typo" \
                in caplog.text

    asyncio.run(run())


def test_refusals_for_devices_held_elsewhere_are_bounded_when_the_report_never_arrives(
        tmp_path, monkeypatch):
    """The fault: the agent's report of the other installation's claim never reaches
    its scheduler (the event bus away; here the agent's reports are dropped and its
    next heartbeat is an hour off). The scheduler places the session there again and
    again; each start is refused. Before, each refusal went back to the queue without
    using a try, for ever, a loop of starts as fast as the scheduler could place them.
    Now the third such refusal in a row is the last free one: the next uses a try, and
    with none left (retries 0) the session ends in ERROR, saying why, nothing held."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's claims only

    async def run():
        async with _two_installations(tmp_path) as (one, two, a1, a2):
            assert await _away(two, a2) == {}
            alice = await make_user(one)
            bob = await make_user(two, email="bob@example.com")
            first = await gpu_batch(one, alice, "first", {"cuda.device": 1})
            await wait_status(one, first, ("RUNNING",))

            monkeypatch.setattr(a2, "report_soon", lambda **_: None)  # the report is lost
            refusals = []
            create = a2.create_kernel

            async def counted(*args, **kw):
                try:
                    return await create(*args, **kw)
                except AgentError as e:
                    refusals.append(type(e).__name__)
                    raise

            monkeypatch.setattr(a2, "create_kernel", counted)
            second = await gpu_batch(two, bob, "second", {"cuda.device": 1})
            sess = await wait_status(two, second, ("ERROR",), timeout=60)
            assert refusals == ["DevicesHeldElsewhere"] * 4, refusals
            assert "refused 4 times in a row" in sess.status_info, sess.status_info
            assert sess.retries == 0
            assert a2.gpus.owners() == {}
            assert (await two.get_session(second)).status == "ERROR"  # and it stays there
            held = (await one.get_session(first)).kernels[0].id
            assert list(a1.gpus.owners().values()) == [held]  # the other's, untouched

    asyncio.run(run())


def test_a_mask_leaves_gaps_in_the_indices(tmp_path):
    """GPU 0 masked, GPU 1 in MIG mode: the agent's devices are [GPU 1], and a MIG
    instance of it is found by its GPU's index, not its place in the list (the CPUs
    next to it come from GPU 1)."""
    from dataclasses import replace

    from jupyterhub_backendai.agent.resources.cuda import GPUTopology

    mig_gpu, whole_gpu = NVMLDeviceSource(stand_in("a100-mig")).topology().devices
    # The same two GPUs the other way round: the whole one first, the MIG one second,
    # each next to CPUs of its own.
    swapped = GPUTopology(devices=[
        replace(whole_gpu, index=0, cpus=(0, 1)),
        replace(mig_gpu, index=1, cpus=(2, 3), mig_instances=tuple(
            replace(m, parent_index=1) for m in mig_gpu.mig_instances)),
    ])
    masked = swapped.without([whole_gpu.uuid])
    assert [d.index for d in masked.devices] == [1]
    alloc = GPUAllocator(masked, claims=HostClaims("gpu", str(tmp_path)))
    assert alloc.capacity().get("cuda.device") is None
    got = alloc.take("k", 0, {"1g.10gb": 1}, cpu=1)
    assert got.cpuset == "2-3" and got.uuids[0].startswith("MIG-")
    with pytest.raises(AgentError, match="only 0 free CUDA devices, 1 requested"):
        alloc.take("k2", 1)
