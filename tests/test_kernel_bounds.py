"""Bounded kernels and sessions apart without windows (issue 24, rows 4 and 5).

Real parts throughout: an in-process manager with a real Docker agent on SQLite,
sessions started through the manager, the kernels' own processes doing the damage.

- A kernel that fills /tmp stops at its tmpfs (memory, never the host's disk), one that
  starts threads stops at its pids limit, and numeric libraries are told its cores.
- While sessions start and stop (session networks made and removed), a kernel probing
  another session's server never connects: the agent's netfilter guard
  (agent/backends/netguard.py) holds while Docker re-arranges its own rules. Without
  it, the same churn let 9 of 167 probes through in 40 s here (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import subprocess

from jupyterhub_backendai.agent.backends import netguard
from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.models import KeypairResourcePolicy

from .inproc import DEAD, image_for, make_user, running_manager, wait_status

SLOTS = ResourceSlot(cpu="0.5", mem=512 * 2**20)


async def _batch(mgr, user, name, command, **kw):
    return await mgr.enqueue(
        username=user, name=name, image=image_for("docker"), slots=SLOTS, environ={},
        service_prefix="/", session_type="batch", startup_command=command, **kw)


THREADS = """
import threading, time
n = 0
try:
    while n < 2000:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        n += 1
    print("THREADS-UNBOUNDED", n)
except RuntimeError as e:
    print("THREADS-STOPPED", n, e)
"""


def test_a_kernel_stops_at_its_tmp_and_pids_bounds(tmp_path):
    """The bounds come from the keypair's resource policy (the agent's own defaults,
    1024 and 1 GiB, where it sets none)."""

    def configure(c):
        c.Agent.kernel_tmp_size = "2g"  # the policy's value wins

    command = (
        "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1; "
        "echo TMP-MB=$(( $(stat -c %s /tmp/fill) / 1048576 )); "
        "echo TMP-FS=$(stat -f -c %T /tmp) VARTMP-FS=$(stat -f -c %T /var/tmp); "
        f"python -c '{THREADS}'; "
        "echo OMP=$OMP_NUM_THREADS MKL=$MKL_NUM_THREADS OPENBLAS=$OPENBLAS_NUM_THREADS "
        "NPROC=$(nproc); "
        "cp /bin/true /var/tmp/run-me && /var/tmp/run-me && echo EXEC-OK"
    )

    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/b.sqlite", tmp_path, "docker",
                                   configure=configure) as mgr:
            user = await make_user(mgr)

            def bounds(s):
                policy = s.get(KeypairResourcePolicy, "default")
                policy.max_pids_per_kernel = 64
                policy.max_tmp_size = 16 * 2**20

            await mgr.db(bounds)
            sid = await _batch(mgr, user, "bounds", command)
            sess = await wait_status(mgr, sid, DEAD, timeout=180)
            return sess.kernels[0].logs or ""

    logs = asyncio.run(run())
    # /tmp is a 16 MiB tmpfs: dd stops there with ENOSPC, the file holds at most that.
    assert "No space left on device" in logs, logs
    assert "TMP-MB=15" in logs or "TMP-MB=16" in logs, logs
    assert "TMP-FS=tmpfs VARTMP-FS=tmpfs" in logs, logs
    # The pids limit (64, the jupyter-free batch kernel's shell and python included).
    line = next(ln for ln in logs.splitlines() if ln.startswith("THREADS-"))
    assert line.startswith("THREADS-STOPPED"), logs
    assert 30 < int(line.split()[1]) < 64, line
    # 0.5 CPU: one thread per library, and nproc says 1.
    assert "OMP=1 MKL=1 OPENBLAS=1 NPROC=1" in logs, logs
    # Scratch space still runs programs (compilers, JIT caches load from /tmp).
    assert "EXEC-OK" in logs, logs


PROBE = """
import socket, sys, time
targets = sys.argv[1].split(",")
ok = n = 0
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for t in targets:
        n += 1
        s = socket.socket()
        s.settimeout(0.2)
        try:
            s.connect((t, 8000))
            ok += 1
            print("CONNECTED", t, flush=True)
        except OSError:
            pass
        s.close()
    time.sleep(0.05)
print("PROBES", n, "CONNECTS", ok, flush=True)
"""


def _drops() -> int:
    out = subprocess.run(["iptables", "-w", "5", "-t", "mangle", "-nvxL", netguard.CHAIN],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(ln.split()[0]) for ln in out.splitlines()[2:] if ln.split())


def _address(session_id: str) -> str:
    ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label=ai.backend.session-id={session_id}"],
                         capture_output=True, text=True, check=True).stdout.split()
    info = json.loads(subprocess.run(["docker", "inspect", *ids], capture_output=True, text=True,
                                     check=True).stdout)
    return next(iter(info[0]["NetworkSettings"]["Networks"].values()))["IPAddress"]


def test_no_connect_between_sessions_while_networks_come_and_go(tmp_path):
    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/n.sqlite", tmp_path, "docker",
                                   slots={"cpu": 8, "mem": "16g"}) as mgr:
            pool = str(mgr.local_agents[next(iter(mgr.local_agents))].impl.session_subnets)
            assert await netguard.installed(pool)
            bob = await make_user(mgr, "bob@example.com")
            alice = await make_user(mgr, "alice@example.com")
            carol = await make_user(mgr, "carol@example.com")
            servers = [await _batch(mgr, bob, f"srv{i}", "python -m http.server 8000")
                       for i in range(3)]
            for sid in servers:
                await wait_status(mgr, sid, ("RUNNING",))
            targets = ",".join(_address(sid) for sid in servers)
            drops = _drops()
            probe = await _batch(mgr, alice, "probe", f"python -c '{PROBE}' {targets} 45")
            await wait_status(mgr, probe, ("RUNNING",))
            # The churn: carol's sessions start and end together, three times over
            # (each start makes a session network, each end removes one).
            for round_ in range(3):
                churn = [await _batch(mgr, carol, f"c{round_}-{i}", "sleep 2") for i in range(4)]
                for sid in churn:
                    await wait_status(mgr, sid, DEAD, timeout=120)
            sess = await wait_status(mgr, probe, DEAD, timeout=120)
            for sid in servers:
                await mgr.destroy_session(sid)
            return sess.kernels[0].logs or "", _drops() - drops

    logs, dropped = asyncio.run(run())
    summary = next(ln for ln in logs.splitlines() if ln.startswith("PROBES"))
    assert "CONNECTED" not in logs and summary.endswith("CONNECTS 0"), logs
    assert int(summary.split()[1]) > 100, summary
    # The probes met the guard (mangle runs before Docker's filter rules).
    assert dropped > 100, dropped
