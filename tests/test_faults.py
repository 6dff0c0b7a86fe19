"""Sessions that survive faults: the hub killed (SIGKILL) in each state of a start or a
stop, and an agent daemon lost and back. Real hubs, real containers, real databases.

After each fault the hub converges: every session runs and JupyterHub knows it, or
it ended with a reason; JupyterHub and the record agree; ``check_consistency()``
holds; no container is left that nothing owns.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import select

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.manager.scheduler import check_consistency
from jupyterhub_backendai.models import Session
from jupyterhub_backendai.models.base import utcnow
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .conftest import containers_of
from .inproc import make_user, occupied, running_manager, wait_status
from .services import agent_id as new_agent_id
from .services import port_block

# Short leases so that a test waits seconds, not the production minutes.
FAST = ["--BackendAIManager.spawner_wait_lease=4", "--BackendAIManager.claim_lease=6"]


def _sm(hub):
    return make_sessionmaker(make_engine(hub.db_url))


def _sessions(sm, name):
    with sm() as s:
        return [(r.status, r.status_info) for r in s.scalars(
            select(Session).where(Session.name == name).order_by(Session.created_at))]


def _lapsed(sm, name) -> bool:
    """The newest session ``name`` is no longer awaited by a spawner: its wait lapsed,
    or it ended."""
    with sm() as s:
        row = s.scalars(select(Session).where(Session.name == name)
                        .order_by(Session.created_at.desc())).first()
        return row.alive_marker is None or (
            row.awaited_until is not None and row.awaited_until < utcnow())


def _wait_until(fn, timeout=90, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _kill_hub(hub):
    """SIGKILL the hub process only (the proxy and the kernels survive, as on a crash)."""
    hub.proc.send_signal(signal.SIGKILL)
    hub.proc.wait(30)


def _agree(hub, sm, running: set[str]):
    """JupyterHub's servers of admin are exactly ``running``, each a RUNNING session with
    one container; the record is consistent."""
    servers = hub.api("GET", "/users/admin").json()["servers"]
    assert {n for n, m in servers.items() if m.get("ready")} == running, servers
    with sm() as s:
        alive = {r.name for r in s.scalars(select(Session).where(Session.alive_marker.is_not(None)))}
    assert alive == running
    assert len(containers_of(hub.agent_id)) == len(running)
    assert check_consistency(sm) == []


def test_hub_killed_while_a_server_waits_on_quota(make_hub, db_url, docker_image):
    """The known bug: a server PENDING on capacity when the hub is killed used to become
    RUNNING where JupyterHub did not know it, and starting it again gave 409."""
    hub = make_hub(db_url=db_url, backend="docker", slots={"cpu": 0.5, "mem": "8g"},
                   extra_args=FAST)
    sm = _sm(hub)
    assert hub.spawn("admin", "first").status_code in (201, 202)
    hub.wait_ready("admin", "first")
    assert hub.spawn("admin", "late").status_code == 202
    _wait_until(lambda: _sessions(sm, "late") and _sessions(sm, "late")[-1][0] == "PENDING",
                what="late PENDING")

    _kill_hub(hub)
    hub.start()
    # JupyterHub forgot the pending start. Once the spawner's wait lapsed (4 s after
    # its last renewal: no hub renews it now), the session ends with the reason, even
    # though capacity frees up now: no pass places it in between.
    _wait_until(lambda: _lapsed(sm, "late"), what="late's wait lapsed")
    hub.stop_server("admin", "first")
    status, info = _wait_until(
        lambda: _sessions(sm, "late")[-1][0] in ("CANCELLED", "TERMINATED") and _sessions(sm, "late")[-1],
        what="late ended")
    assert status == "CANCELLED"
    assert info == ("JupyterHub no longer waits for this server (the hub stopped while it was "
                    "starting); start it again")
    assert hub.server_model("admin", "late") is None
    _agree(hub, sm, set())

    assert hub.spawn("admin", "late").status_code in (201, 202)  # not 409
    hub.wait_ready("admin", "late")
    _agree(hub, sm, {"late"})
    hub.stop_server("admin", "late")
    _agree(hub, sm, set())


@pytest.mark.parametrize("state", ["SCHEDULED", "PREPARING", "CREATING"])
def test_hub_killed_while_a_server_starts(make_hub, db_url, docker_image, state):
    """Killed with a start in flight: the restarted hub takes the start over from the
    record (what was created is removed), and since JupyterHub no longer waits for the
    server the session ends with the reason; starting it again works."""
    hub = make_hub(db_url=db_url, backend="docker", extra_args=FAST,
                   extra_env={"BACKENDAI_FAULT_HOLD": f"{state}=600"})
    sm = _sm(hub)
    r = hub.spawn("admin", "s")
    assert r.status_code == 202, r.text
    _wait_until(lambda: _sessions(sm, "s") and _sessions(sm, "s")[-1][0] == state, what=state)
    if state == "CREATING":
        time.sleep(0.5)  # into the hold; nothing is created before it ends
    _kill_hub(hub)
    del hub.env["BACKENDAI_FAULT_HOLD"]
    hub.start()
    status, info = _wait_until(
        lambda: _sessions(sm, "s")[-1][0] in ("CANCELLED", "TERMINATED", "ERROR") and _sessions(sm, "s")[-1],
        what="s ended")
    assert (status, info) in {
        ("CANCELLED", "JupyterHub no longer waits for this server (the hub stopped while it was "
                      "starting); start it again"),
        ("TERMINATED", "JupyterHub no longer waits for this server (the hub stopped while it was "
                       "starting); start it again"),
    }, (status, info)
    with sm() as s:
        row = s.scalar(select(Session).where(Session.name == "s"))
        assert "start interrupted: the manager starting it stopped" in str(row.status_history) or \
            row.retries >= 1 or state == "SCHEDULED", row.status_history
    assert hub.server_model("admin", "s") is None
    _agree(hub, sm, set())
    r = hub.spawn("admin", "s")
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("admin", "s")
    _agree(hub, sm, {"s"})
    hub.stop_server("admin", "s")


def test_hub_killed_while_running_and_while_terminating(make_hub, db_url, docker_image):
    """A RUNNING server survives the kill (JupyterHub knows it again); one killed
    mid-stop is finished by the restarted hub at once (its owner is dead)."""
    hub = make_hub(db_url=db_url, backend="docker", extra_args=FAST,
                   extra_env={"BACKENDAI_FAULT_HOLD": "TERMINATING=600"})
    sm = _sm(hub)
    for name in ("keep", "gone"):
        assert hub.spawn("admin", name).status_code in (201, 202)
    for name in ("keep", "gone"):
        hub.wait_ready("admin", name)
    r = hub.api("DELETE", "/users/admin/servers/gone")
    assert r.status_code == 202, r.text
    _wait_until(lambda: _sessions(sm, "gone")[-1][0] == "TERMINATING", what="TERMINATING")
    _kill_hub(hub)
    del hub.env["BACKENDAI_FAULT_HOLD"]
    hub.start()
    _wait_until(lambda: _sessions(sm, "gone")[-1][0] == "TERMINATED", what="gone TERMINATED")
    _wait_until(lambda: hub.server_model("admin", "gone") is None, what="JupyterHub drops gone")
    # Past spawner_wait_lease: the running server is JupyterHub's, not abandoned.
    time.sleep(5)
    assert _sessions(sm, "keep")[-1] == ("RUNNING", "running")
    _agree(hub, sm, {"keep"})
    hub.stop_server("admin", "keep")
    _agree(hub, sm, set())


# -- a lost agent daemon -----------------------------------------------------------------


def _start_daemon(tmp_path, bus, token, daemon_id, port):
    cfg = tmp_path / "agent_config.py"
    if not cfg.exists():
        lo = port_block(20)
        cfg.write_text(
            "c.Agent.slots = {'cpu': 1, 'mem': '2g'}\n"
            f"c.Agent.port_range = ({lo}, {lo + 20})\n"
            "c.Agent.heartbeat_interval = 0.5\n"
            f"c.Agent.local_work_root = {str(tmp_path / 'daemon-home')!r}\n"
        )
    log = open(tmp_path / "daemon.log", "ab")
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "backendai-agent"), "--config", str(cfg),
         "--backend", "local", "--id", daemon_id, "--state-dir", str(tmp_path / "daemon"),
         "--redis", bus, "--port", str(port)],
        env=dict(os.environ, BACKENDAI_AGENT_TOKEN=token), stdout=log, stderr=log,
        start_new_session=True,
    )
    log.close()
    from .services import wait_port

    wait_port(port, timeout=60, proc=proc)
    return proc


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


@pytest.mark.parametrize("returns", [False, True], ids=["stays-away", "returns-in-grace"])
def test_lost_agent_daemon(redis_server, tmp_path, returns):
    """A ``backendai-agent`` daemon killed with a session on it: LOST past
    agent_lost_timeout, the session marked with the reason; past agent_lost_grace it
    ends (ERROR) and its slots are freed. Back within the grace, the session lives on."""
    from .services import free_port

    bus = redis_server.fresh_url()
    token = "t-" + os.urandom(8).hex()
    port = free_port()
    daemon_id = new_agent_id("lost")
    grace = 20.0 if returns else 3.0

    def cluster(c):
        c.BackendAIManager.redis_url = bus
        c.BackendAIManager.agent_token = token
        c.BackendAIManager.agent_lost_timeout = 2.0
        c.BackendAIManager.agent_lost_grace = grace
        c.BackendAIManager.reconcile_interval = 1.0

    daemon = _start_daemon(tmp_path, bus, token, daemon_id, port)
    # The kernel runs in a process group of its own: SIGKILL of the daemon's group
    # leaves it, as a crashed agent leaves its containers.

    async def run():
        db_url = f"sqlite:///{tmp_path}/lost.sqlite"
        async with running_manager(db_url, tmp_path, "local", slots={"cpu": 1, "mem": "2g"},
                                   configure=cluster) as mgr:
            nonlocal daemon
            for _ in range(400):
                if daemon_id in await occupied(mgr):
                    break
                await asyncio.sleep(0.05)
            user = await make_user(mgr)
            sid = await mgr.enqueue(
                username=user, name="on-daemon", image="local/python",
                slots=ResourceSlot(cpu=1, mem=512 * 2**20), environ={}, service_prefix="/",
                session_type="batch", startup_command="sleep 300", designated_agents=[daemon_id])
            sess = await wait_status(mgr, sid, ("RUNNING", "ERROR", "TERMINATED", "CANCELLED"))
            assert sess.status == "RUNNING", sess.status_info
            assert (await occupied(mgr))[daemon_id] == {"cpu": 1, "mem": 512 * 2**20}

            _kill_group(daemon)
            for _ in range(400):
                sess = await mgr.get_session(sid)
                if sess.status_info.startswith("agent lost: "):
                    break
                await asyncio.sleep(0.05)
            assert sess.status == "RUNNING"
            assert sess.status_info.startswith(f"agent lost: {daemon_id} is silent since "), sess.status_info
            assert "unless it returns" in sess.status_info

            if returns:
                daemon = _start_daemon(tmp_path, bus, token, daemon_id, port)
                for _ in range(400):
                    sess = await mgr.get_session(sid)
                    if sess.status_info == "running":
                        break
                    await asyncio.sleep(0.05)
                assert (sess.status, sess.status_info) == ("RUNNING", "running")
                assert (await occupied(mgr))[daemon_id] == {"cpu": 1, "mem": 512 * 2**20}
                await mgr.destroy_session(sid)
                assert (await mgr.get_session(sid)).status == "TERMINATED"
            else:
                sess = await wait_status(mgr, sid, ("ERROR", "TERMINATED"), timeout=60)
                assert sess.status == "ERROR"
                assert sess.status_info.startswith(f"agent {daemon_id} was lost: no heartbeat for ")
                assert sess.status_info.endswith("(agent_lost_timeout 2 s + agent_lost_grace 3 s)")
                assert (await occupied(mgr))[daemon_id] == {}
                # It comes back: the kernel the record no longer wants is removed.
                daemon = _start_daemon(tmp_path, bus, token, daemon_id, port)
                for _ in range(600):
                    if not os.listdir(tmp_path / "daemon" / "local-kernels"):
                        break
                    await asyncio.sleep(0.05)
                assert os.listdir(tmp_path / "daemon" / "local-kernels") == []
            assert check_consistency(mgr.sm) == []

    try:
        asyncio.run(run())
    finally:
        _kill_group(daemon)


@pytest.mark.parametrize("hub", ["restarts", "joins"])
def test_heartbeats_a_dead_agent_left_in_the_stream_do_not_revive_it(redis_server, tmp_path, hub, caplog):
    """No hub reads the event stream for a while (the only one stopped); an agent daemon
    keeps sending heartbeats into it, then dies. A hub that starts afterwards (the same
    one again, or a new hub of the cluster with a database of its own) is handed those
    heartbeats by the stream's consumer group. They are seconds old, past
    agent_lost_timeout: the dead agent must not become ALIVE, and a session meant for it
    is refused with the reason instead of failing on an unreachable node. (Before: the
    agent came back ALIVE and such a session ended in ERROR, "agent ... unreachable".)"""
    import redis

    from jupyterhub_backendai.common.errors import InvalidRequest
    from jupyterhub_backendai.models import Agent

    from .services import free_port

    bus = redis_server.fresh_url()
    token = "t-" + os.urandom(8).hex()
    daemon_id = new_agent_id("stale")

    def cluster(c):
        c.BackendAIManager.redis_url = bus
        c.BackendAIManager.agent_token = token
        c.BackendAIManager.agent_lost_timeout = 2.0

    daemon = _start_daemon(tmp_path, bus, token, daemon_id, free_port())
    r = redis.Redis.from_url(bus, decode_responses=True)

    def backlog() -> int:
        (group,) = [g for g in r.xinfo_groups("backendai.events") if g["name"] == "manager"]
        return (group["lag"] or 0) + group["pending"]

    async def record_of(mgr):
        """The daemon's agent row: (status, last heartbeat), or None."""
        row = await mgr.db_read(lambda s: s.execute(
            select(Agent.status, Agent.last_heartbeat).where(Agent.id == daemon_id)).first())
        return tuple(row) if row else None

    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/a.sqlite", tmp_path, "local",
                                   slots={"cpu": 1, "mem": "2g"}, configure=cluster) as mgr:
            for _ in range(400):
                if daemon_id in await occupied(mgr):
                    break
                await asyncio.sleep(0.05)
            assert (await record_of(mgr))[0] == "ALIVE"
            config = mgr.test_config
        # No hub reads: the daemon's heartbeats (every 0.5 s) wait in the stream.
        time.sleep(1.5)
        _kill_group(daemon)
        killed = utcnow()
        assert backlog() >= 2
        time.sleep(2.5)  # the newest of them is now past agent_lost_timeout
        # The same hub again (its database says the agent was ALIVE), or a new one.
        if hub == "restarts":  # a.sqlite, the same agent: the same configuration
            db, again = f"sqlite:///{tmp_path}/a.sqlite", dict(config=config)
        else:
            db, again = f"sqlite:///{tmp_path}/b.sqlite", dict(configure=cluster)
        async with running_manager(db, tmp_path, "local", slots={"cpu": 1, "mem": "2g"},
                                   **again) as mgr:
            for _ in range(400):
                if backlog() == 0:
                    break
                await asyncio.sleep(0.05)
            assert backlog() == 0  # this hub has read and handled every one of them
            said = [m for m in caplog.messages if m.startswith(f"heartbeat of agent {daemon_id} is ")]
            assert len(said) == 1 and "past agent_lost_timeout (2 s): ignored" in said[0], said
            record = await record_of(mgr)
            if hub == "restarts":  # no heartbeat counted since the kill
                assert record[1] < killed, (record, killed)
            else:  # never heard of
                assert record is None
            await mgr.schedule_once()  # a pass first marks agents silent too long
            assert (await record_of(mgr) or ("none",))[0] == ("LOST" if hub == "restarts" else "none")
            user = await make_user(mgr)
            with pytest.raises(InvalidRequest, match=f"designated agent.*{daemon_id} not alive"):
                await mgr.enqueue(
                    username=user, name="for-the-dead", image="local/python",
                    slots=ResourceSlot(cpu=1, mem=512 * 2**20), environ={}, service_prefix="/",
                    session_type="batch", startup_command="sleep 300",
                    designated_agents=[daemon_id])
            assert check_consistency(mgr.sm) == []

    try:
        asyncio.run(run())
    finally:
        _kill_group(daemon)


# -- two agent daemons as cluster nodes (etcd, Redis, PostgreSQL) --------------------------

from .cluster_nodes import Cluster as _Cluster  # noqa: E402


async def _until(cond, timeout: float = 60, what: str = "condition"):
    """Poll ``cond`` (a bound for hangs, not a speed check)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _agent_status(mgr) -> dict[str, str]:
    from jupyterhub_backendai.models import Agent

    return await mgr.db_read(lambda s: {a.id: a.status for a in s.scalars(select(Agent))})


async def _batch(mgr, user, name, agent_id):
    return await mgr.enqueue(
        username=user, name=name, image="local/python",
        slots=ResourceSlot(cpu=0.5, mem=256 * 2**20), environ={}, service_prefix="/",
        session_type="batch", startup_command="sleep 600", designated_agents=[agent_id])


def _port_ranges(daemons) -> list[tuple[int, int]]:
    out = []
    for d in daemons:
        with open(d.config) as f:
            line = next(x for x in f if x.startswith("c.Agent.port_range"))
        out.append(tuple(int(v) for v in line.split("(")[1].rstrip(")\n").split(",")))
    return out


def test_two_agent_daemons_lost_and_back(postgres, tmp_path):
    """Sessions land on both daemons; ``kill -9`` of one: LOST within the timeout, its
    sessions end with the reason, its slots are freed, the other's sessions run on;
    started again it rejoins and its leftover kernels are removed. The other daemon
    restarted while its kernels run: its sessions stay RUNNING and reachable."""
    cl = _Cluster(tmp_path)
    a, b = cl.daemons
    (alo, ahi), (blo, bhi) = _port_ranges(cl.daemons)
    assert ahi < blo or bhi < alo, "separate port ranges"
    cl.start()

    async def run():
        async with running_manager(postgres.new_database("t_nodes"), tmp_path, "local",
                                   slots={"cpu": 1, "mem": "1g"},
                                   configure=cl.configure(3.0, 3.0)) as mgr:
            async def both_alive():
                st = await _agent_status(mgr)
                return st.get(a.agent_id) == st.get(b.agent_id) == "ALIVE"

            await _until(both_alive, what="both daemons ALIVE")
            user = await make_user(mgr)
            sids = {d.agent_id: [await _batch(mgr, user, f"{d.agent_id[-6:]}-{i}", d.agent_id)
                                 for i in range(2)] for d in cl.daemons}
            for ids in sids.values():
                for sid in ids:
                    sess = await wait_status(mgr, sid, ("RUNNING", "ERROR", "TERMINATED", "CANCELLED"))
                    assert sess.status == "RUNNING", sess.status_info
            occ = await occupied(mgr)
            assert occ[a.agent_id] == occ[b.agent_id] == {"cpu": 1, "mem": 512 * 2**20}
            assert len(a.kernels()) == len(b.kernels()) == 2

            # kill -9 of agent1
            a.kill()
            loop = asyncio.get_running_loop()
            t0 = loop.time()

            async def a_lost():
                return (await _agent_status(mgr))[a.agent_id] == "LOST"

            await _until(a_lost, what="agent1 LOST")
            assert loop.time() - t0 <= 3.0 + 5, "LOST within agent_lost_timeout (3 s) + 5 s"
            for sid in sids[a.agent_id]:
                sess = await wait_status(mgr, sid, ("ERROR", "TERMINATED"), timeout=60)
                assert sess.status == "ERROR"
                assert sess.status_info.startswith(f"agent {a.agent_id} was lost: no heartbeat for ")
            occ = await occupied(mgr)
            assert occ[a.agent_id] == {}
            assert occ[b.agent_id] == {"cpu": 1, "mem": 512 * 2**20}
            for sid in sids[b.agent_id]:
                assert (await mgr.get_session(sid)).status == "RUNNING"
            assert check_consistency(mgr.sm) == []

            # agent1 back: it rejoins, the kernels nothing wants are removed
            a.start()
            await _until(lambda: _coro(not a.kernels()), what="agent1's leftover kernels removed")
            assert (await _agent_status(mgr))[a.agent_id] == "ALIVE"
            assert a.kernels() == []

            # agent2 restarted while its kernels run: its sessions stay, reachable
            b.kill()
            b.start()
            for sid in sids[b.agent_id]:
                sess = await mgr.get_session(sid)
                assert sess.status == "RUNNING", sess.status_info
                kid = sess.kernels[0].id
                client = await mgr.agents.client_for(b.agent_id)
                assert kid in {r["kernel_id"] for r in await client.list_kernels() if r.get("alive")}
                assert await mgr.session_logs(sid) == ""  # the agent answers for its kernel
            want = [(await mgr.get_session(sid)).kernels[0].id for sid in sids[b.agent_id]]
            assert b.kernels() == sorted(want)
            # a new session lands on the returned agent1
            new = await _batch(mgr, user, "after-return", a.agent_id)
            assert (await wait_status(mgr, new, ("RUNNING", "ERROR", "TERMINATED"))).status == "RUNNING"
            for sid in [*sids[b.agent_id], new]:
                await mgr.destroy_session(sid)
            occ = await occupied(mgr)
            assert occ[a.agent_id] == occ[b.agent_id] == {}
            assert a.kernels() == b.kernels() == []
            assert check_consistency(mgr.sm) == []

    try:
        asyncio.run(run())
    finally:
        cl.stop()


async def _coro(value):
    return value


def test_redis_and_etcd_restarted_under_a_cluster(postgres, tmp_path):
    """Redis killed and started again with its data, then without; etcd the same: the
    cluster recovers each time (the daemons are ALIVE again, running sessions stay
    RUNNING and 'running', a new session starts on each daemon), no session is left
    in a transient state, and the record holds."""
    cl = _Cluster(tmp_path)
    cl.start()

    async def run():
        async with running_manager(postgres.new_database("t_restarts"), tmp_path, "local",
                                   slots={"cpu": 1, "mem": "1g"},
                                   configure=cl.configure(5.0, 60.0)) as mgr:
            async def all_alive():
                st = await _agent_status(mgr)
                return all(st.get(d.agent_id) == "ALIVE" for d in cl.daemons)

            await _until(all_alive, what="daemons ALIVE")
            user = await make_user(mgr)
            keep = {d.agent_id: await _batch(mgr, user, f"keep-{d.agent_id[-6:]}", d.agent_id)
                    for d in cl.daemons}
            for sid in keep.values():
                assert (await wait_status(mgr, sid, ("RUNNING", "ERROR", "TERMINATED"))).status == "RUNNING"
            n = 0
            for what, restart in (
                ("redis with its data", lambda: (cl.redis.kill(), cl.redis.start())),
                ("redis without its data", lambda: (cl.redis.kill(), cl.redis.start(wipe=True))),
                ("etcd with its data", lambda: (cl.etcd.kill(), cl.etcd.start())),
                ("etcd without its data", lambda: (cl.etcd.kill(), cl.etcd.start(wipe=True))),
            ):
                restart()
                since = utcnow()

                async def heartbeats_after(since=since):
                    # Heartbeats travel over Redis: the hub's consumer reads again.
                    from jupyterhub_backendai.models import Agent

                    hb = await mgr.db_read(lambda s: {a.id: a.last_heartbeat for a in s.scalars(
                        select(Agent))})
                    return all(hb[d.agent_id] > since for d in cl.daemons)

                await _until(heartbeats_after, what=f"heartbeats after {what}")
                await _until(all_alive, what=f"daemons ALIVE after {what}")
                for d in cl.daemons:
                    n += 1
                    sid = await _batch(mgr, user, f"after-{n}", d.agent_id)
                    sess = await wait_status(mgr, sid, ("RUNNING", "ERROR", "TERMINATED", "CANCELLED"))
                    assert sess.status == "RUNNING", (what, sess.status_info)
                    await mgr.destroy_session(sid)
                    assert (await mgr.get_session(sid)).status == "TERMINATED"

                async def settled(keep=keep):
                    return all((s.status, s.status_info) == ("RUNNING", "running")
                               for s in [await mgr.get_session(x) for x in keep.values()])

                await _until(settled, what=f"kept sessions running after {what}")
                assert await _transient(mgr) == [], what
                assert check_consistency(mgr.sm) == []
            for sid in keep.values():
                await mgr.destroy_session(sid)
            assert all(not d.kernels() for d in cl.daemons)
            assert all(v == {} for v in (await occupied(mgr)).values())

    try:
        asyncio.run(run())
    finally:
        cl.stop()


async def _transient(mgr) -> list[tuple[str, str]]:
    return await mgr.db_read(lambda s: [(r.id, r.status) for r in s.scalars(
        select(Session).where(Session.status.in_(
            ["SCHEDULED", "PREPARING", "CREATING", "TERMINATING"])))])
