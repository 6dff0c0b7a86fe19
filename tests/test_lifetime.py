"""The keypair policy's max_session_lifetime and idle_timeout end sessions.

Driven through the manager in-process with a real agent (local processes, and
Docker containers for one case) on SQLite and PostgreSQL; one check through a
real hub that the spawner's poll reports the server's activity.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import sys
import time

import pytest
import requests
from sqlalchemy import select

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.models import KeypairResourcePolicy, Session
from jupyterhub_backendai.models.base import utcnow
from jupyterhub_backendai.models.db import make_engine

from .conftest import _kill_local_kernels
from .hub import Hub
from .inproc import DEAD, assert_nothing_left, image_for, make_user, running_manager, wait_status

SLOTS = ResourceSlot(cpu="0.5", mem=512 * 2**20)


def _configure(c):
    c.BackendAIManager.lifetime_check_interval = 0.2
    c.BackendAIManager.schedule_interval = 0.1
    # An interactive main kernel that just stays up (no hub to register with here).
    c.Agent.local_cmd = [sys.executable, "-c", "import time; time.sleep(3600)"]


async def _set_policy(mgr, **fields) -> None:
    def work(s):
        policy = s.get(KeypairResourcePolicy, "default")
        for k, v in fields.items():
            setattr(policy, k, v)

    await mgr.db(work)


async def _interactive(mgr, user, name, backend="local"):
    return await mgr.enqueue(username=user, name=name, image=image_for(backend), slots=SLOTS,
                             environ={}, service_prefix="/")


async def _batch(mgr, user, name, backend="local"):
    return await mgr.enqueue(username=user, name=name, image=image_for(backend), slots=SLOTS,
                             environ={}, service_prefix="/", session_type="batch",
                             startup_command="sleep 300")


def _running_since(sess: Session) -> dt.datetime:
    return dt.datetime.fromisoformat(sess.status_history["RUNNING"])


def _ran_for(sess: Session) -> float:
    return (sess.terminated_at - _running_since(sess)).total_seconds()


def test_max_session_lifetime_ends_batch_session(db_url, backend, tmp_path):
    """A batch session past max_session_lifetime fails like a batch timeout, slots freed."""

    async def run():
        async with running_manager(db_url, tmp_path, backend, configure=_configure) as mgr:
            user = await make_user(mgr)
            await _set_policy(mgr, max_session_lifetime=2)
            sid = await _batch(mgr, user, "long", backend)
            await wait_status(mgr, sid, ("RUNNING",))
            sess = await wait_status(mgr, sid, DEAD)
            assert (sess.status, sess.result) == ("ERROR", "FAILURE")
            assert sess.status_info == "reached max_session_lifetime (2 s, keypair policy)"
            assert _ran_for(sess) >= 2
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_max_session_lifetime_ends_interactive_session(db_url, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, "local", configure=_configure) as mgr:
            user = await make_user(mgr)
            await _set_policy(mgr, max_session_lifetime=2)
            sid = await _interactive(mgr, user, "nb")
            await wait_status(mgr, sid, ("RUNNING",))
            # Activity does not extend a lifetime.
            await mgr.record_activity(sid, utcnow())
            sess = await wait_status(mgr, sid, DEAD)
            assert (sess.status, sess.result) == ("TERMINATED", "SUCCESS")
            assert sess.status_info == "reached max_session_lifetime (2 s, keypair policy)"
            assert _ran_for(sess) >= 2
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_idle_timeout(db_url, tmp_path):
    """idle_timeout=2: an idle interactive session ends; one whose activity keeps being
    recorded stays past the timeout and ends once it stops; a batch session never idles."""

    async def run():
        async with running_manager(db_url, tmp_path, "local", configure=_configure) as mgr:
            user = await make_user(mgr)
            await _set_policy(mgr, idle_timeout=2)
            idle = await _interactive(mgr, user, "idle")
            busy = await _interactive(mgr, user, "busy")
            batch = await _batch(mgr, user, "batch")
            for sid in (idle, busy, batch):
                await wait_status(mgr, sid, ("RUNNING",))

            # Keep "busy" active until "idle" has ended and "busy" has run well past
            # the timeout itself.
            busy_since = _running_since(await mgr.get_session(busy))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while True:
                await mgr.record_activity(busy, utcnow())
                idle_sess = await mgr.get_session(idle)
                if idle_sess.status in DEAD and utcnow() - busy_since > dt.timedelta(seconds=3):
                    break
                assert loop.time() < deadline, idle_sess.status_info
                await asyncio.sleep(0.1)

            assert (idle_sess.status, idle_sess.result) == ("TERMINATED", "SUCCESS")
            assert idle_sess.status_info == "idle for more than 2 s (keypair policy idle_timeout)"
            assert idle_sess.last_activity is None
            assert _ran_for(idle_sess) >= 2

            busy_sess = await mgr.get_session(busy)
            assert busy_sess.status == "RUNNING", busy_sess.status_info
            last = busy_sess.last_activity
            assert last is not None

            # Activity stops: it ends, no sooner than idle_timeout after the last.
            busy_sess = await wait_status(mgr, busy, DEAD)
            assert busy_sess.status_info == "idle for more than 2 s (keypair policy idle_timeout)"
            assert busy_sess.last_activity == last
            assert (busy_sess.terminated_at - last).total_seconds() >= 2

            # The batch session, RUNNING with no activity, is never idle: watched until it
            # has run twice the timeout (it may have started seconds after the others on
            # a loaded machine: 3.8 s by this point in pair S of 2026-11-30).
            while True:
                batch_sess = await mgr.get_session(batch)
                assert batch_sess.status == "RUNNING", batch_sess.status_info
                if (utcnow() - _running_since(batch_sess)).total_seconds() > 4:
                    break
                assert loop.time() < deadline + 30, "the batch session's clock stands still"
                await asyncio.sleep(0.2)
            await mgr.destroy_session(batch)
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_zero_limits_end_nothing(db_url, tmp_path):
    """With 0 (unlimited) nothing is ended however old or idle; the same sessions are
    found at once when the policy sets limits."""

    async def run():
        async with running_manager(db_url, tmp_path, "local", configure=_configure) as mgr:
            mgr.lifetime_check_interval = 3600  # only the forced sweeps below
            user = await make_user(mgr)
            nb = await _interactive(mgr, user, "nb")
            batch = await _batch(mgr, user, "batch")
            for sid in (nb, batch):
                await wait_status(mgr, sid, ("RUNNING",))

            # Both became RUNNING a day ago, no activity since.
            def backdate(s):
                for sess in s.scalars(select(Session)):
                    hist = dict(sess.status_history)
                    hist["RUNNING"] = (utcnow() - dt.timedelta(days=1)).isoformat()
                    sess.status_history = hist

            await mgr.db(backdate)
            await _set_policy(mgr, max_session_lifetime=0, idle_timeout=0)
            assert await mgr.lifecycle.policy_limits.sweep(force=True) == []
            for sid in (nb, batch):
                assert (await mgr.get_session(sid)).status == "RUNNING"

            # Activity a minute ago: idle for 1 hour is not reached, for 30 s it is.
            await mgr.record_activity(nb, utcnow() - dt.timedelta(minutes=1))
            await _set_policy(mgr, idle_timeout=3600)
            assert await mgr.lifecycle.policy_limits.sweep(force=True) == []
            await _set_policy(mgr, idle_timeout=30)
            assert await mgr.lifecycle.policy_limits.sweep(force=True) == [nb]
            sess = await wait_status(mgr, nb, DEAD)
            assert sess.status_info == "idle for more than 30 s (keypair policy idle_timeout)"
            assert (await mgr.get_session(batch)).status == "RUNNING"

            await _set_policy(mgr, max_session_lifetime=7200)
            assert await mgr.lifecycle.policy_limits.sweep(force=True) == [batch]
            sess = await wait_status(mgr, batch, DEAD)
            assert (sess.status, sess.result) == ("ERROR", "FAILURE")
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_a_late_renewal_here_is_not_abandonment(db_url, tmp_path):
    """A spawner of this process waits on its session, and its renewal of the wait comes
    late (a starved hub: CI saw its own pass end the server it was starting, and the
    spawn answered 500): the session is not ended as abandoned. Once nobody here waits,
    the lapsed wait ends it, with the reason (the hub that asked is gone)."""

    async def run():
        async with running_manager(db_url, tmp_path, "local", configure=_configure) as mgr:
            user = await make_user(mgr)
            sid = await mgr.enqueue(username=user, name="s", image=image_for("local"), slots=SLOTS,
                                    environ={}, service_prefix="/", awaited_for=60)
            with mgr.waiting_here(sid):
                await wait_status(mgr, sid, ("RUNNING",))
                await mgr.await_session(sid, -5)  # the last renewal ran out 5 s ago
                await asyncio.sleep(1.5)  # the driver's rounds (every 0.1 s here)
                sess = await mgr.get_session(sid)
                assert (sess.status, sess.status_info) == ("RUNNING", "running")
            sess = await wait_status(mgr, sid, DEAD)
            assert sess.status_info == ("JupyterHub no longer waits for this server (the hub "
                                        "stopped while it was starting); start it again")
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_record_activity_only_moves_forward(db_url, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, "local", configure=_configure) as mgr:
            user = await make_user(mgr)
            sid = await _interactive(mgr, user, "nb")
            await wait_status(mgr, sid, ("RUNNING",))
            t1 = utcnow().replace(microsecond=0)
            t0, t2 = t1 - dt.timedelta(seconds=30), t1 + dt.timedelta(seconds=30)
            assert await mgr.record_activity(sid, t1)
            assert await mgr.record_activity(sid, t0) is False
            assert await mgr.record_activity(sid, t1) is False
            assert (await mgr.get_session(sid)).last_activity == t1
            # JupyterHub's naive UTC datetimes are UTC.
            assert await mgr.record_activity(sid, t2.replace(tzinfo=None))
            assert (await mgr.get_session(sid)).last_activity == t2
            assert await mgr.record_activity("0" * 32, t2) is False  # no such session
            await mgr.destroy_session(sid)
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_two_managers_end_a_session_once(db_url, tmp_path, caplog):
    """Two managers sweeping the same record: the session ends once, with the reason."""
    import logging

    caplog.set_level(logging.INFO)

    async def run():
        async with running_manager(db_url, tmp_path, "local", configure=_configure) as mgr:
            mgr.lifetime_check_interval = 3600
            user = await make_user(mgr)
            sid = await _interactive(mgr, user, "nb")
            await wait_status(mgr, sid, ("RUNNING",))
            await _set_policy(mgr, idle_timeout=1)

            def other_config(c):
                _configure(c)
                c.BackendAIManager.embedded_agent = False
                c.BackendAIManager.lifetime_check_interval = 3600

            async with running_manager(db_url, tmp_path / "second", "local",
                                       configure=other_config) as other:
                # Both reach the agent (the in-process client stands in for its HTTP API).
                other.local_agents[mgr.agent.agent_id] = mgr.agent
                await asyncio.sleep(1.2)  # let the idle timeout pass (not a timing assertion)
                a, b = await asyncio.gather(
                    mgr.lifecycle.policy_limits.sweep(force=True), other.lifecycle.policy_limits.sweep(force=True))
                # The forced sweeps found it, or the second manager's own first sweep did:
                # a manager checks once when it starts, and under load that may already
                # be past the idle timeout. Either way one of them is ending it.
                assert sid in a + b or any(m.startswith(f"ending session {sid}: idle for more")
                                           for m in caplog.messages), (a, b)
                sess = await wait_status(mgr, sid, DEAD)
                # Let both destroys finish.
                for m in (mgr, other):
                    while m.lifecycle.steps.sessions("ending"):
                        await asyncio.sleep(0.05)
                sess = await mgr.get_session(sid)
                assert (sess.status, sess.result) == ("TERMINATED", "SUCCESS")
                assert sess.status_info == "idle for more than 1 s (keypair policy idle_timeout)"
                assert await other.lifecycle.policy_limits.sweep(force=True) == []
                other.local_agents.clear()  # not its to stop
            await assert_nothing_left(mgr)

    asyncio.run(run())


@pytest.fixture
def activity_hub(db_url):
    # Activity noticed within a second and polls every second (command-line options,
    # which the packaged config file leaves in force).
    hub = Hub(db_url=db_url, backend="local",
              extra_args=["--JupyterHub.last_activity_interval=1", "--Spawner.poll_interval=1"])
    try:
        yield hub.start()
    finally:
        if hub.proc and hub.proc.poll() is None:
            for u in hub.api("GET", "/users").json():
                for name in list(u.get("servers", {})):
                    hub.stop_server(u["name"], name)
        hub.close()
        _kill_local_kernels(os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels"))
        shutil.rmtree(hub.dir, ignore_errors=True)


def test_hub_poll_reports_activity(activity_hub, db_url):
    """Through a real hub: a request through the proxy to the server becomes the hub's
    last_activity, and the spawner's poll writes it to Session.last_activity."""
    hub = activity_hub
    r = hub.spawn("admin", "act")
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("admin", "act")

    engine = make_engine(db_url)

    def last_activity():
        with engine.connect() as conn:
            return conn.execute(
                select(Session.last_activity).where(Session.status == "RUNNING")
            ).scalar_one()

    before = utcnow()
    token = hub.admin_token
    r = requests.get(f"{hub.base}/user/admin/act/api/status",
                     headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    seen = None
    while time.monotonic() < deadline:
        seen = last_activity()
        if seen is not None and seen >= before:
            break
        time.sleep(0.2)
    engine.dispose()
    # The request came after ``before``: the hub saw it on the proxy, the poll passed it on.
    assert seen is not None and seen >= before, (seen, before, hub.log()[-3000:])
    hub.stop_server("admin", "act")
