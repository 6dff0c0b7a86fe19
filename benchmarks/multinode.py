"""Multi-node sessions across two Docker engines joined as a Swarm (issue 15).

    python benchmarks/multinode.py [--rounds 5] [--mbytes 512] [--tput-rounds 5]

Starts two "machines" on this host (tests/swarm_nodes.py: two network namespaces
joined by a veth pair, a dockerd in each with the kernel image loaded, a Swarm), a
manager on SQLite with one in-process agent per engine (4 CPUs, 8 GiB each), then:

- ``two_node_start_s``: from ``enqueue`` of a two-kernel multi-node batch session
  (1 CPU each) to RUNNING (both containers started, one per engine, on the
  session's overlay network, made for it on the way), median over ``--rounds``;
- ``ratio_vs_two_singles``: that, over the same for two single-kernel sessions
  (1 CPU each, per-session bridges) enqueued at once, until both are RUNNING, one on
  each engine (the resource group's agent selector is ``dispersed``; median, rounds
  interleaved with the two-node ones);
- ``overlay_gbps``: TCP throughput main1 -> sub1 of a two-node session (over the
  Swarm overlay: VXLAN across the veth pair), ``--mbytes`` MiB sent by a Python
  socket loop in main1 to one in sub1 (each kernel limited to 1 CPU);
- ``bridge_gbps``: the same pair on one engine (a single-node session of two kernels
  on one per-session bridge), measured the same way, both sessions running at once,
  the two measured in turn ``--tput-rounds`` times (medians).

Last line: ``two_node_start_s=<f> ratio_vs_two_singles=<f> overlay_gbps=<f> bridge_gbps=<f>``.
Everything started is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from traitlets.config import Config  # noqa: E402

from jupyterhub_backendai.agent.core import Agent as LocalAgent  # noqa: E402
from jupyterhub_backendai.common.slots import ResourceSlot  # noqa: E402
from jupyterhub_backendai.models import ResourceGroup  # noqa: E402
from tests.hub import KERNEL_IMAGE  # noqa: E402
from tests.inproc import DEAD, agent_config, make_user, running_manager, wait_status  # noqa: E402
from tests.swarm_nodes import SwarmNodes  # noqa: E402

RECEIVER = r"""
import socket
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 5001))
srv.listen(1)
while True:
    c, _ = srv.accept()
    n = 0
    buf = bytearray(1 << 20)
    while True:
        got = c.recv_into(buf)
        if not got:
            break
        n += got
    c.sendall(str(n).encode())
    c.close()
"""

SENDER = r"""
import socket, sys, time
host, total = sys.argv[1], int(sys.argv[2])
chunk = b"\0" * (1 << 20)
for _ in range(100):
    try:
        s = socket.create_connection((host, 5001), timeout=2)
        break
    except OSError:
        time.sleep(0.1)
s.settimeout(120)
t0 = time.perf_counter()
sent = 0
while sent < total:
    s.sendall(chunk)
    sent += len(chunk)
s.shutdown(socket.SHUT_WR)
got = int(s.recv(64))
dt = time.perf_counter() - t0
assert got == sent, (got, sent)
print(sent * 8 / dt / 1e9)
"""


def _node_of(nodes, container_id: str):
    for n in nodes.nodes:
        if n.docker("inspect", container_id, check=False).returncode == 0:
            return n
    raise RuntimeError(f"container {container_id} on no node")


class Pair:
    """main1 -> sub1 of one session: a receiver started in sub1, one send per call."""

    def __init__(self, nodes, main, sub):
        self.main, self.main_node = main, _node_of(nodes, main.container_id)
        sub_node = _node_of(nodes, sub.container_id)
        sub_node.docker("exec", "-d", sub.container_id, "python3", "-c", RECEIVER)

    def gbps(self, mbytes: int) -> float:
        out = self.main_node.docker("exec", self.main.container_id, "python3", "-c", SENDER,
                                    "sub1", str(mbytes << 20), timeout=300).stdout
        return float(out.strip())


async def started(mgr, sids) -> float:
    t0 = time.perf_counter()
    for sid in sids:
        sess = await wait_status(mgr, sid, ("RUNNING", *DEAD), timeout=120)
        if sess.status != "RUNNING":
            raise RuntimeError(f"session {sid}: {sess.status} {sess.status_info}")
    return time.perf_counter() - t0


async def run(args) -> None:
    nodes = SwarmNodes(KERNEL_IMAGE)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bai-bench-multinode-"))
    try:
        nodes.start()
        print(f"nodes up: {nodes.timings}", flush=True)
        a, b = nodes.nodes

        def cfg(c):
            c.Agent.docker_url = a.url
            c.Agent.slots = {"cpu": 4, "mem": "8g"}

        async with running_manager(f"sqlite:///{tmp}/bench.sqlite", tmp, "docker", configure=cfg) as mgr:
            c = Config()
            c.merge(mgr.test_config)
            agent_config(c, tmp, "docker", slots={"cpu": 4, "mem": "8g"}, name="b")
            c.Agent.docker_url = b.url
            await mgr.attach_agent(LocalAgent(mgr.bus, config=c))
            user = await make_user(mgr, max_containers=2)

            def dispersed(s):  # single-kernel sessions one per engine (the default packs)
                s.get(ResourceGroup, "default").scheduler_opts = {"agent_selector": "dispersed"}

            await mgr.db(dispersed)

            def enqueue(name, size, mode, cpu=1):
                return mgr.enqueue(
                    username=user, name=name, image=KERNEL_IMAGE,
                    slots=ResourceSlot(cpu=cpu, mem=512 * 2**20), service_prefix="/", environ={},
                    session_type="batch", startup_command="sleep 600", cluster_size=size,
                    cluster_mode=mode)

            async def end(sids):
                for sid in sids:
                    await mgr.destroy_session(sid)
                for sid in sids:
                    await wait_status(mgr, sid, DEAD)

            two_node, singles = [], []
            for r in range(args.rounds + 1):  # round 0 warms up (page cache, first network)
                t0 = time.perf_counter()
                sid = await enqueue(f"mn{r}", 2, "multi-node")
                await started(mgr, [sid])
                dt_mn = time.perf_counter() - t0
                sess = await mgr.get_session(sid)
                agents_mn = {k.agent_id for k in sess.kernels}
                await end([sid])
                t0 = time.perf_counter()
                sids = [await enqueue(f"s{r}a", 1, "single-node"), await enqueue(f"s{r}b", 1, "single-node")]
                await started(mgr, sids)
                dt_s = time.perf_counter() - t0
                agents_s = {(await mgr.get_session(s)).kernels[0].agent_id for s in sids}
                await end(sids)
                print(f"round {r}: two-node {dt_mn:.3f} s ({len(agents_mn)} engines), "
                      f"two singles {dt_s:.3f} s ({len(agents_s)} engines)", flush=True)
                if r:
                    two_node.append(dt_mn)
                    singles.append(dt_s)

            # Both pairs at once, measured in turn (the machine's load changes: medians of
            # interleaved runs).
            sid_mn = await enqueue("tput-mn", 2, "multi-node")
            sid_sn = await enqueue("tput-sn", 2, "single-node")
            await started(mgr, [sid_mn, sid_sn])
            pairs = {}
            for key, sid in (("overlay", sid_mn), ("bridge", sid_sn)):
                pairs[key] = Pair(nodes, *(await mgr.get_session(sid)).kernels)
            rates = {"overlay": [], "bridge": []}
            for _ in range(args.tput_rounds):
                for key, pair in pairs.items():
                    rates[key].append(pair.gbps(args.mbytes))
            print("Gbit/s: " + "; ".join(f"{k} {[round(x, 2) for x in v]}" for k, v in rates.items()))
            overlay, bridge = statistics.median(rates["overlay"]), statistics.median(rates["bridge"])
            await end([sid_mn, sid_sn])
    finally:
        nodes.stop()
        subprocess.run(["rm", "-rf", str(tmp)])
    mn, s = statistics.median(two_node), statistics.median(singles)
    print(f"two-node starts: {[round(x, 3) for x in two_node]}; two singles: {[round(x, 3) for x in singles]}")
    print(f"two_node_start_s={mn:.3f} ratio_vs_two_singles={mn / s:.3f} "
          f"overlay_gbps={overlay:.3f} bridge_gbps={bridge:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mbytes", type=int, default=512)
    p.add_argument("--tput-rounds", type=int, default=5)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
