"""Issue 29 point 7: usage accounting counts what kernels *used*, sampled from their
agents' live statistics, beside what they were allocated.

A manager with its embedded agent on the Docker backend (heartbeats, and so live
statistics, every 0.5 s; a usage sample every 0.5 s) runs two batch sessions of 0.5
cores each for a few seconds: one burns its CPU, one sleeps. The usage report counts
the burner's core-hours used near its allocation and the sleeper's near nothing, both
from the database (``kernel_usage``); a sample read twice (two hubs reading the same
agent's statistics) is counted once.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.common.types import SessionStatus
from jupyterhub_backendai.manager.access import Principal
from jupyterhub_backendai.models import KernelUsage

from .inproc import make_user, running_manager, wait_status

ROOT = Principal(user_id="root", username="root", email="root@example.com", role="superadmin",
                 domain="default")
BURN = "python3 -c 'import time\nt = time.time() + 10\nwhile time.time() < t: pass'"
SLEEP = "sleep 10"


def _configure(c):
    c.Agent.heartbeat_interval = 0.5
    c.BackendAIManager.usage_sample_interval = 0.5


async def test_used_core_hours_are_sampled_and_counted_once(db_url, tmp_path, docker_image):
    async with running_manager(db_url, tmp_path, "docker", configure=_configure) as mgr:
        burner = await make_user(mgr, "burner@example.com")
        sleeper = await make_user(mgr, "sleeper@example.com")
        start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        sids = {}
        for user, cmd in ((burner, BURN), (sleeper, SLEEP)):
            sids[user] = await mgr.enqueue(
                username=user, name=f"use-{user}", image="backendai/python-kernel:latest",
                slots=ResourceSlot(cpu="0.5", mem=256 * 2**20), environ={},
                service_prefix="/", session_type="batch", startup_command=cmd)
        for sid in sids.values():
            sess = await wait_status(mgr, sid, {SessionStatus.TERMINATED, SessionStatus.ERROR})
            assert sess.status == SessionStatus.TERMINATED, sess.status_info
        end = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
        report = await mgr.ops.usage_report(ROOT, start, end, "user")
        rows = {r["name"]: r for r in report["items"]}
        burn, idle = rows[burner], rows[sleeper]
        for r in (burn, idle):
            # Several seconds of each were seen, never more than they ran.
            assert 1 / 3600 < r["sampled_hours"] <= r["hours"] + 1e-4, r
        # What was recorded per hour (unrounded): memory in use, its peak under the 256
        # MiB limit; the burner's CPU time up to its half core of the seconds sampled
        # (less on a busy machine), the sleeper's nearly none.
        used = {}
        with mgr.sm() as s:
            for user, sid in sids.items():
                rows_ = s.scalars(select(KernelUsage).where(KernelUsage.session_id == sid)).all()
                assert rows_ and all(0 < u.mem_peak_bytes <= 256 * 2**20 and
                                     u.mem_byte_seconds > 0 for u in rows_), rows_
                used[user] = (sum(u.cpu_seconds for u in rows_),
                              sum(u.sampled_seconds for u in rows_))
        cpu, seen = used[burner]
        assert 0 < cpu <= 0.6 * seen, used
        assert used[sleeper][0] < 0.02 * used[sleeper][1], used
        assert cpu > 5 * used[sleeper][0], used
        assert burn["used_cpu_hours"] == round(cpu / 3600, 4), (burn, used)
        assert burn["used_cpu_hours"] <= burn["cpu_hours"] * 1.2, burn
        total = report["total"]
        assert abs(total["used_cpu_hours"] - burn["used_cpu_hours"]
                   - idle["used_cpu_hours"]) < 1e-3

        # Two hubs reading the same statistics: a sample already counted counts nothing.
        agent = next(iter(mgr.local_agents.values()))
        kid = "k-" + "0" * 30
        samples = [(kid, agent.last_stats["ts"], {"cpu_pct": 50.0, "mem_bytes": 1})]
        assert await mgr.ops.record_samples(samples, 10.0) == 0  # no such running kernel
        again = await mgr.ops.usage_report(ROOT, start, end, "user")
        assert again["total"] == total
