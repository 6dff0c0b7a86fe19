"""Multi-kernel sessions: every kernel started or none, kernels that see each other,
bounded retries of a failed start with nothing leaked.

Driven through the manager in-process with real agents (Docker containers of the
kernel image, or local processes); a multi-node cluster is two in-process agents.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time

import requests
from sqlalchemy import select

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.manager.scheduler import check_consistency
from jupyterhub_backendai.models import Kernel, KeypairResourcePolicy, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .inproc import (
    DEAD,
    add_agent,
    assert_consistent,
    assert_nothing_left,
    image_for,
    leftovers,
    make_user,
    occupied,
    running_manager,
    wait_status,
)
from .services import agent_id as new_agent_id
from .services import port_block

# The main kernel resolves every host of its cluster and knocks on a closed port:
# "connection refused" proves the other kernel's host answered.
PROBE = r"""python3 -c '
import os, socket, time
for h in os.environ["BACKENDAI_CLUSTER_HOSTS"].split(","):
    for _ in range(200):
        try:
            addr = socket.gethostbyname(h)
            break
        except OSError:
            time.sleep(0.05)
    else:
        print("unresolved", h)
        raise SystemExit(1)
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((addr, 9))
        print("open", h)
    except ConnectionRefusedError:
        print("reached", h)
    except OSError as e:
        print("unreachable", h, e)
        raise SystemExit(2)
e = os.environ
print("cluster", e["BACKENDAI_CLUSTER_ROLE"], e["BACKENDAI_CLUSTER_SIZE"], e["BACKENDAI_CLUSTER_HOSTNAMES"])
'; sleep 300"""


def _env_of(backend: str, kernel) -> dict:
    """The environment a kernel really runs with (container config or /proc)."""
    if backend == "docker":
        out = subprocess.run(["docker", "inspect", "-f", "{{json .Config.Env}}", kernel.container_id],
                             capture_output=True, text=True, check=True).stdout
        items = json.loads(out)
    else:
        with open(f"/proc/{kernel.container_id}/environ", "rb") as f:
            items = [x.decode() for x in f.read().split(b"\0") if x]
    return dict(x.split("=", 1) for x in items)


async def _probe_output(mgr, sid) -> str:
    for _ in range(400):
        logs = await mgr.session_logs(sid)
        if "cluster main" in logs or "unresolved" in logs or "unreachable" in logs:
            return logs
        await asyncio.sleep(0.05)
    return await mgr.session_logs(sid)


async def _run_cluster(mgr, backend, user, mode, cpu):
    sid = await mgr.enqueue(
        username=user, name=f"c-{mode}", image=image_for(backend),
        slots=ResourceSlot(cpu=cpu, mem=512 * 2**20),
        environ={"JUPYTERHUB_API_TOKEN": "secret", "EXTRA": "kept"}, service_prefix="/",
        session_type="batch", startup_command=PROBE, cluster_size=2, cluster_mode=mode,
    )
    sess = await wait_status(mgr, sid, ("RUNNING", *DEAD))
    assert sess.status == "RUNNING", sess.status_info
    main, sub = sess.kernels
    assert (main.cluster_role, main.cluster_hostname, sub.cluster_role, sub.cluster_hostname) == (
        "main", "main1", "sub", "sub1")

    logs = await _probe_output(mgr, sid)
    assert "cluster main 2 main1,sub1" in logs, logs
    assert logs.count("reached") == 2, logs

    env = _env_of(backend, sub)
    assert (env["BACKENDAI_CLUSTER_ROLE"], env["BACKENDAI_CLUSTER_IDX"], env["BACKENDAI_CLUSTER_HOST"]) == (
        "sub", "1", "sub1")
    assert env["BACKENDAI_CLUSTER_SIZE"] == "2" and env["EXTRA"] == "kept"
    assert not any(k.startswith("JUPYTERHUB_") for k in env), "only the main kernel talks to the hub"
    return sid, sess


def test_single_node_cluster_kernels_see_each_other(db_url, backend, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, backend) as mgr:
            user = await make_user(mgr, max_containers=2)
            sid, sess = await _run_cluster(mgr, backend, user, "single-node", "0.5")
            assert {k.agent_id for k in sess.kernels} == {mgr.agent.agent_id}
            assert await occupied(mgr) == {mgr.agent.agent_id: {"cpu": 1, "mem": 2**30}}
            assert len(leftovers(mgr.agent)) == 2
            if backend == "docker":
                # The image's tini is the init; Docker adds no second one.
                init = subprocess.run(
                    ["docker", "inspect", "-f", "{{.HostConfig.Init}}", sess.kernels[0].container_id],
                    capture_output=True, text=True, check=True,
                ).stdout.strip()
                assert init in ("<nil>", "false"), init

            await mgr.destroy_session(sid)
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_multi_node_cluster_spreads_over_agents(db_url, backend, tmp_path):
    async def run():
        one_core = {"cpu": 1, "mem": "2g"}
        async with running_manager(db_url, tmp_path, backend, slots=one_core) as mgr:
            second = await add_agent(mgr, tmp_path, backend, slots=one_core, name="b")
            user = await make_user(mgr, max_containers=2)
            sid, sess = await _run_cluster(mgr, backend, user, "multi-node", "1")
            agents = [k.agent_id for k in sess.kernels]
            assert sorted(agents) == sorted([mgr.agent.agent_id, second.agent_id])
            assert len(leftovers(mgr.agent)) == len(leftovers(second)) == 1

            await mgr.destroy_session(sid)
            assert leftovers(mgr.agent) == leftovers(second) == []
            assert await occupied(mgr) == {mgr.agent.agent_id: {}, second.agent_id: {}}
            assert_consistent(mgr)

    asyncio.run(run())


def _hold_port():
    """A listening socket on a port the agent will consider taken."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def _docker_events(agent_id: str, since: float, event: str) -> int:
    out = subprocess.run(
        ["docker", "events", "--since", str(since), "--until", str(time.time()),
         "--filter", f"label=ai.backend.agent-id={agent_id}", "--filter", "type=container",
         "--filter", f"event={event}", "--format", '{{index .Actor.Attributes "ai.backend.kernel-id"}}'],
        capture_output=True, text=True, check=True,
    ).stdout
    return len(out.split())


def test_failed_start_is_all_or_nothing_retried_then_error(db_url, backend, tmp_path):
    """The main kernel cannot get a host port, the sub kernel could start: the sub kernel
    is removed, the slots go back, the session is retried twice, then ERROR with the reason."""
    held, port = _hold_port()

    def one_blocked_port(c):
        c.Agent.port_range = (port, port)

    async def run():
        since = time.time() - 1
        async with running_manager(db_url, tmp_path, backend, configure=one_blocked_port) as mgr:
            user = await make_user(mgr, max_containers=2)
            sid = await mgr.enqueue(
                username=user, name="doomed", image=image_for(backend),
                slots=ResourceSlot(cpu="0.5", mem=512 * 2**20), environ={}, service_prefix="/",
                cluster_size=2,
            )
            sess = await wait_status(mgr, sid, DEAD)
            assert (sess.status, sess.result, sess.retries) == ("ERROR", "FAILURE", 2)
            assert "no free host port" in sess.status_info, sess.status_info
            assert "after 3 attempts" in sess.status_info
            assert "RUNNING" not in sess.status_history
            assert leftovers(mgr.agent) == []
            assert await occupied(mgr) == {mgr.agent.agent_id: {}}
            assert all(k.status == "ERROR" and not any(k.occupied_slots.values()) for k in sess.kernels)
            assert_consistent(mgr)
            if backend == "docker":
                # Each attempt started the sub kernel's container and removed it again.
                assert _docker_events(mgr.agent.agent_id, since, "start") == 3
                assert _docker_events(mgr.agent.agent_id, since, "destroy") == 3
            status = await mgr.scheduler_status()
            assert status["default"]["start_failures"].get("agent_error", 0) >= 3

    try:
        asyncio.run(run())
    finally:
        held.close()


def test_retry_after_a_failed_start_can_succeed(db_url, tmp_path):
    """A start that fails once goes back to PENDING (reason kept) and starts on the next try."""
    held, port = _hold_port()

    def configure(c):
        c.Agent.port_range = (port, port)
        # A stand-in for the Jupyter server: it only has to keep running.
        c.Agent.local_cmd = ["/bin/sh", "-c", "sleep 300", "sh"]

    async def run():
        async with running_manager(db_url, tmp_path, "local", retries=5, configure=configure) as mgr:
            user = await make_user(mgr)
            sid = await mgr.enqueue(
                username=user, name="flaky", image="local/python",
                slots=ResourceSlot(cpu="0.5", mem=512 * 2**20), environ={}, service_prefix="/",
            )
            for _ in range(400):
                sess = await mgr.get_session(sid)
                if sess.retries >= 1:
                    break
                await asyncio.sleep(0.05)
            assert sess.retries >= 1 and "no free host port" in sess.status_info, sess.status_info
            held.close()  # the port is free again
            sess = await wait_status(mgr, sid, ("RUNNING", *DEAD))
            assert sess.status == "RUNNING", sess.status_info
            assert 1 <= sess.retries <= 5
            assert sess.kernels[0].service_ports[0]["host_port"] == port
            await mgr.destroy_session(sid)
            sess = await mgr.get_session(sid)
            assert (sess.status, sess.result) == ("TERMINATED", "SUCCESS")
            assert leftovers(mgr.agent) == []
            assert_consistent(mgr)

    try:
        asyncio.run(run())
    finally:
        held.close()


def test_multi_node_with_an_agent_daemon(redis_server, tmp_path):
    """One agent in the manager's process, one ``backendai-agent`` daemon reached over HTTP
    and the Redis event bus: a two-node session starts across them, its output is read
    from whichever agent runs its kernels, and nothing is left when it ends."""
    import os
    import sys

    import redis

    from .services import free_port, wait_port

    bus = redis_server.fresh_url()
    redis.Redis.from_url(bus).flushdb()
    token = "t-" + os.urandom(8).hex()
    port = free_port()
    lo = port_block(20)
    daemon_id = new_agent_id("daemon")
    cfg = tmp_path / "agent_config.py"
    cfg.write_text(
        f"c.Agent.slots = {{'cpu': 1, 'mem': '2g'}}\n"
        f"c.Agent.port_range = ({lo}, {lo + 20})\n"
        f"c.Agent.heartbeat_interval = 1.0\n"
        f"c.Agent.local_work_root = {str(tmp_path / 'daemon-home')!r}\n"
    )
    env = dict(os.environ, BACKENDAI_AGENT_TOKEN=token)
    log = open(tmp_path / "daemon.log", "wb")
    daemon = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "backendai-agent"), "--config", str(cfg),
         "--backend", "local", "--id", daemon_id, "--state-dir", str(tmp_path / "daemon"),
         "--redis", bus, "--port", str(port)],
        env=env, stdout=log, stderr=log, start_new_session=True,
    )

    def cluster_mode(c):
        c.BackendAIManager.redis_url = bus
        c.BackendAIManager.agent_token = token

    async def run():
        db_url = f"sqlite:///{tmp_path}/daemon.sqlite"
        async with running_manager(db_url, tmp_path, "local", slots={"cpu": 1, "mem": "2g"},
                                   configure=cluster_mode) as mgr:
            for _ in range(400):  # the daemon's heartbeat registers it
                if daemon_id in await occupied(mgr):
                    break
                await asyncio.sleep(0.05)
            user = await make_user(mgr, max_containers=2)
            sid, sess = await _run_cluster(mgr, "local", user, "multi-node", "1")
            by_agent = {k.agent_id: k for k in sess.kernels}
            assert set(by_agent) == {mgr.agent.agent_id, daemon_id}
            remote = by_agent[daemon_id]
            logs = await mgr.session_logs(sid, remote.cluster_idx)  # over the daemon's HTTP API
            assert isinstance(logs, str)
            if remote.cluster_role == "main":
                assert "cluster main 2" in logs

            await mgr.destroy_session(sid)
            sess = await mgr.get_session(sid)
            assert (sess.status, sess.result) == ("TERMINATED", "FAILURE")  # a batch stopped early
            assert leftovers(mgr.agent) == []
            assert os.listdir(tmp_path / "daemon" / "local-kernels") == []
            assert await occupied(mgr) == {mgr.agent.agent_id: {}, daemon_id: {}}
            assert_consistent(mgr)

    try:
        wait_port(port, timeout=60, proc=daemon)
        asyncio.run(run())
    finally:
        daemon.terminate()
        daemon.wait(30)
        log.close()


def test_interactive_cluster_through_the_hub(make_hub, tmp_path):
    """A two-kernel server from the hub: refused (4xx, nothing created) while the keypair
    policy allows one container per session; once allowed, the main kernel serves Jupyter
    through the proxy and the sub kernel idles beside it; stopping removes both."""
    hub = make_hub(db_url=f"sqlite:///{tmp_path}/cluster.sqlite", backend="local")
    engine = make_engine(hub.db_url)
    sm = make_sessionmaker(engine)
    try:
        r = hub.spawn("admin", "pair", {"cluster_size": 2})
        assert r.status_code == 412, r.text
        assert "quota exceeded: keypair max_containers_per_session (2 requested, limit 1)" in r.text
        assert hub.server_model("admin", "pair") is None
        with sm() as s:
            assert s.scalars(select(Session)).all() == []

        r = hub.spawn("admin", "pair", {"cluster_size": "two"})
        assert r.status_code == 400 and "cluster_size must be a whole number" in r.text

        with sm.begin() as s:
            s.get(KeypairResourcePolicy, "default").max_containers_per_session = 2
        assert hub.spawn("admin", "pair", {"cluster_size": 2}).status_code in (201, 202)
        model = hub.wait_ready("admin", "pair")
        st = requests.get(hub.base + model["url"] + "api/status",
                          headers={"Authorization": f"token {hub.admin_token}"}, timeout=30)
        assert st.status_code == 200, st.text
        with sm() as s:
            kernels = s.scalars(select(Kernel).order_by(Kernel.cluster_idx)).all()
            assert [(k.cluster_hostname, k.status) for k in kernels] == [("main1", "RUNNING"), ("sub1", "RUNNING")]
            assert kernels[0].service_ports and not kernels[1].service_ports
            pids = [int(k.container_id) for k in kernels]
        with open(f"/proc/{pids[1]}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[:2] == [b"sleep", b"infinity"]

        hub.stop_server("admin", "pair")
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    assert f.read().split(")")[-1].split()[0] == "Z"
            except FileNotFoundError:
                pass  # gone, as it should be
        assert check_consistency(sm) == []
    finally:
        engine.dispose()
