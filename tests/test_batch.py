"""Batch sessions: a startup command run to completion, its exit code and output kept.

Driven through the manager in-process with a real agent (Docker containers of the
kernel image, or local processes) on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from sqlalchemy import func, select

from jupyterhub_backendai.common.errors import InvalidRequest
from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.manager.core import BackendAIManager
from jupyterhub_backendai.models import Session

from .inproc import (
    DEAD,
    assert_consistent,
    assert_nothing_left,
    image_for,
    leftovers,
    make_user,
    running_manager,
    wait_status,
)

SLOTS = ResourceSlot(cpu="0.5", mem=512 * 2**20)


async def _batch(mgr, user, name, command, backend, **kw):
    return await mgr.enqueue(
        username=user, name=name, image=image_for(backend), slots=SLOTS, environ={},
        service_prefix="/", session_type="batch", startup_command=command, **kw,
    )


def test_batch_exit_codes_and_logs(db_url, backend, tmp_path):
    """exit 0 -> TERMINATED / SUCCESS with the output kept; exit 3 -> ERROR / FAILURE, code 3."""

    async def run():
        async with running_manager(db_url, tmp_path, backend) as mgr:
            user = await make_user(mgr)
            ok = await _batch(mgr, user, "ok", "echo hello from batch; pwd; id -un", backend)
            bad = await _batch(mgr, user, "bad", "echo going wrong >&2; exit 3", backend)
            a = await wait_status(mgr, ok, DEAD)
            b = await wait_status(mgr, bad, DEAD)

            assert (a.status, a.result, a.kernels[0].exit_code) == ("TERMINATED", "SUCCESS", 0), a.status_info
            logs = a.kernels[0].logs
            assert "hello from batch" in logs
            if backend == "docker":  # the image's unprivileged user, in its home
                assert "/home/work\nwork\n" in logs
            assert await mgr.session_logs(ok) == logs

            assert (b.status, b.result, b.kernels[0].exit_code) == ("ERROR", "FAILURE", 3)
            assert "exit code 3" in b.status_info
            assert "going wrong" in b.kernels[0].logs

            # Nothing left behind: no container or process, no slots.
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_batch_timeout_kills_and_fails(db_url, backend, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, backend) as mgr:
            user = await make_user(mgr)
            sid = await _batch(mgr, user, "slow", "echo started; sleep 300", backend, batch_timeout=3)
            await wait_status(mgr, sid, ("RUNNING",))
            # While it runs, its output comes live from the agent.
            for _ in range(200):
                if "started" in await mgr.session_logs(sid):
                    break
                await asyncio.sleep(0.05)
            assert "started" in await mgr.session_logs(sid)

            sess = await wait_status(mgr, sid, DEAD)
            assert (sess.status, sess.result, sess.status_info) == ("ERROR", "FAILURE", "batch timeout")
            assert "started" in sess.kernels[0].logs
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_concurrent_stops_end_the_session_once_with_its_logs(db_url, backend, tmp_path):
    """A user's stop and a batch timeout at the same moment: the second waits for the first,
    so the session ends once, as the first asked, with its output kept."""

    async def run():
        async with running_manager(db_url, tmp_path, backend) as mgr:
            user = await make_user(mgr)
            sid = await _batch(mgr, user, "twice", "echo started; sleep 300", backend)
            await wait_status(mgr, sid, ("RUNNING",))
            for _ in range(200):
                if "started" in await mgr.session_logs(sid):
                    break
                await asyncio.sleep(0.05)
            await asyncio.gather(
                mgr.destroy_session(sid, "ERROR", "batch timeout", result="FAILURE"),
                mgr.destroy_session(sid),
            )
            sess = await mgr.get_session(sid)
            assert (sess.status, sess.status_info) == ("ERROR", "batch timeout")
            assert "started" in sess.kernels[0].logs
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_a_reconciliation_before_the_exit_event_does_not_lose_the_kernel(
        db_url, backend, tmp_path, monkeypatch):
    """The fault: a batch command ends, and the agent's list is read (a periodic
    reconciliation) before its exit event is handled. The local backend dropped an ended
    kernel from its list at once, so the manager took it for lost and ended a successful
    session as ERROR "kernel lost" (seen in CI). The list must say how it ended."""
    gate: dict[str, asyncio.Event] = {}
    handle = BackendAIManager.handle_event

    async def late(self, name, payload):  # exit events wait until the test lets them go
        if name == "kernel_terminated":
            await gate["open"].wait()
        await handle(self, name, payload)

    monkeypatch.setattr(BackendAIManager, "handle_event", late)

    async def run():
        gate["open"] = asyncio.Event()
        async with running_manager(db_url, tmp_path, backend) as mgr:
            user = await make_user(mgr)
            sid = await _batch(mgr, user, "quick", "sleep 1; echo done in time", backend)
            await wait_status(mgr, sid, ("RUNNING",))
            (agent_id, agent), = mgr.local_agents.items()
            for _ in range(200):  # the command ends; its exit event is held back
                if not any(r["alive"] for r in await agent.list_kernels()):
                    break
                await asyncio.sleep(0.05)
            records = await agent.list_kernels()
            assert [(r["alive"], r["exit_code"]) for r in records] == [(False, 0)], records

            await mgr.reconcile_agent(agent_id)
            gate["open"].set()
            sess = await wait_status(mgr, sid, DEAD)
            assert (sess.status, sess.result, sess.kernels[0].exit_code) == ("TERMINATED", "SUCCESS", 0), \
                sess.status_info
            assert "done in time" in sess.kernels[0].logs
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_batch_that_finished_while_the_manager_was_away(docker_image, tmp_path):
    """The command ends while no manager runs: the restarted manager keeps its exit code and
    output, ends the session accordingly and removes the container."""
    db_url = f"sqlite:///{tmp_path}/away.sqlite"

    async def run():
        async with running_manager(db_url, tmp_path, "docker", keep_kernels=True) as mgr:
            user = await make_user(mgr)
            ok = await _batch(mgr, user, "ok", "sleep 2; echo finished alone", "docker")
            bad = await _batch(mgr, user, "bad", "sleep 2; exit 4", "docker")
            await wait_status(mgr, ok, ("RUNNING",))
            await wait_status(mgr, bad, ("RUNNING",))
            config = mgr.test_config
        agent_id = config.Agent.agent_id
        for _ in range(200):  # both commands end while nobody watches
            out = subprocess.run(["docker", "ps", "-q", "--filter", f"label=ai.backend.agent-id={agent_id}"],
                                 capture_output=True, text=True, check=True).stdout
            if not out.strip():
                break
            await asyncio.sleep(0.1)
        async with running_manager(db_url, tmp_path, "docker", config=config) as mgr:
            a = await wait_status(mgr, ok, DEAD)
            b = await wait_status(mgr, bad, DEAD)
            assert (a.status, a.result, a.kernels[0].exit_code) == ("TERMINATED", "SUCCESS", 0), a.status_info
            assert "finished alone" in a.kernels[0].logs
            assert (b.status, b.result, b.kernels[0].exit_code) == ("ERROR", "FAILURE", 4)
            for _ in range(100):
                if not leftovers(mgr.agent):
                    break
                await asyncio.sleep(0.05)
            assert leftovers(mgr.agent) == []
            assert_consistent(mgr)

    asyncio.run(run())


def test_dependencies_wait_for_success(db_url, tmp_path):
    """B waits PENDING while A runs and starts after A succeeded; C, behind a failed D, never runs."""

    async def run():
        async with running_manager(db_url, tmp_path, "local") as mgr:
            user = await make_user(mgr)
            a = await _batch(mgr, user, "a", "sleep 2; echo a done", "local")
            b = await _batch(mgr, user, "b", "echo b ran", "local", dependencies=[a])
            d = await _batch(mgr, user, "d", "exit 1", "local")
            c = await _batch(mgr, user, "c", "echo c ran", "local", dependencies=[d])

            await wait_status(mgr, a, ("RUNNING",))
            sb = await mgr.get_session(b)
            assert sb.status == "PENDING", sb.status_info

            sa = await wait_status(mgr, a, DEAD)
            assert sa.result == "SUCCESS"
            sb = await wait_status(mgr, b, DEAD)
            assert (sb.status, sb.result) == ("TERMINATED", "SUCCESS")
            # B started only once A had finished.
            assert sb.status_history["RUNNING"] > sa.status_history["TERMINATED"]

            sc = await wait_status(mgr, c, DEAD)
            assert sc.status == "CANCELLED" and sc.result == "FAILURE", sc.status_info
            assert d in sc.status_info or "dependency" in sc.status_info
            assert sc.kernels[0].exit_code is None and not sc.kernels[0].logs
            assert_consistent(mgr)

    asyncio.run(run())


def test_stopping_a_running_batch_session_is_not_a_success(db_url, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, "local") as mgr:
            user = await make_user(mgr)
            sid = await _batch(mgr, user, "long", "sleep 300", "local")
            await wait_status(mgr, sid, ("RUNNING",))
            await mgr.destroy_session(sid)
            sess = await mgr.get_session(sid)
            assert (sess.status, sess.result) == ("TERMINATED", "FAILURE")
            assert leftovers(mgr.agent) == []
            assert_consistent(mgr)

    asyncio.run(run())


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"session_type": "batch"}, "needs a startup_command"),
        ({"session_type": "batch", "startup_command": "  "}, "needs a startup_command"),
        ({"session_type": "cron", "startup_command": "true"}, "session_type must be one of"),
        ({"startup_command": "true"}, "for batch sessions"),
        ({"session_type": "batch", "startup_command": "true", "batch_timeout": 0}, "batch_timeout must be"),
        ({"session_type": "batch", "startup_command": "true", "batch_timeout": "10"}, "batch_timeout must be"),
        ({"priority": 101}, "priority must be a whole number from 0 to 100"),
        ({"priority": -1}, "priority must be"),
        ({"cluster_size": 0}, "cluster_size must be a whole number >= 1"),
        ({"cluster_size": True}, "cluster_size must be"),
        ({"cluster_mode": "ring"}, "cluster_mode must be one of"),
        ({"starts_at": "2030-01-01T00:00:00"}, "starts_at needs a time zone"),
        ({"starts_at": "tomorrow"}, "starts_at must be an ISO 8601 time"),
        ({"dependencies": "abc"}, "dependencies must be a list"),
        ({"dependencies": ["0" * 32]}, "unknown dependency session"),
        ({"cluster_size": 3, "cluster_mode": "multi-node"}, "needs 3 agents"),
        ({"designated_agents": ["i-nowhere"]}, "designated agent(s) i-nowhere not alive"),
        ({"architecture": "sparc64"}, "no agent with architecture 'sparc64'"),
    ],
)
def test_bad_session_arguments_are_refused_and_leave_nothing(kw, message, tmp_path):
    db_url = f"sqlite:///{tmp_path}/bad.sqlite"

    async def run():
        async with running_manager(db_url, tmp_path, "local") as mgr:
            user = await make_user(mgr)
            with pytest.raises(InvalidRequest) as e:
                await mgr.enqueue(username=user, name="x", image="local/python", slots=SLOTS,
                                  environ={}, service_prefix="/", **kw)
            assert e.value.status_code == 400
            assert message in e.value.detail, e.value.detail
            assert await mgr.db(lambda s: s.scalar(select(func.count()).select_from(Session))) == 0

    asyncio.run(run())
