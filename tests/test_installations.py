"""Installations apart on one Docker engine (issue 24, row 1).

Two hubs started the README's way (``backendai-hub``, each with its own state
directory and ports, both on the DEFAULT agent id) with a running session each on one
engine: starting the second and restarting the first removes none of the other's
containers. A second hub on the first's state directory refuses to start, naming the
first's pid. A state directory a hub used before installations had identities keeps
its old default agent id ``i-<hostname>``.

The hubs' installation ids start with this run's token (``BACKENDAI_INSTALLATION_PREFIX``,
tests/hub.py), so their agent ids and labels carry it (tests/engine_check.py).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest
import requests
from sqlalchemy import select

from jupyterhub_backendai.common import installation
from jupyterhub_backendai.models import Agent, Kernel, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .hub import REPO, Hub
from .services import RUN, foreign_subnets

FAST = ["--BackendAIManager.reconcile_interval=1"]
CONFIG = os.path.join(REPO, "jupyterhub_backendai", "share", "jupyterhub_config.py")


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _session(hub: Hub, name: str) -> tuple[str, str]:
    """(status, main kernel's container id) of the admin's server ``name`` in the record."""
    engine = make_engine(hub.db_url)
    try:
        with make_sessionmaker(engine)() as s:
            sess = s.scalars(select(Session).where(Session.name == name)
                             .order_by(Session.created_at.desc())).first()
            kernel = s.scalars(select(Kernel).where(Kernel.session_id == sess.id)).first()
            return sess.status, kernel.container_id
    finally:
        engine.dispose()


def _running(container_id: str) -> bool:
    r = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", container_id],
                       capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == "true"


def _labels(container_id: str) -> dict:
    return json.loads(_docker("inspect", "-f", "{{json .Config.Labels}}", container_id))


def test_two_installations_on_one_engine_keep_their_sessions(make_hub, tmp_path, docker_image):
    """The attack of issue 24 row 1, with the defaults: the second hub's start and
    reconciliations, and the first's restart, leave the other's session RUNNING in the
    same container; a third hub on the first's state directory refuses to start."""
    a = make_hub(db_url=f"sqlite:///{tmp_path}/a.sqlite", backend="docker",
                 default_agent_id=True, extra_args=FAST)
    assert "BACKENDAI_AGENT_ID" not in a.env
    assert a.spawn("admin", "one").status_code in (201, 202)
    a.wait_ready("admin", "one")
    status_a, cid_a = _session(a, "one")
    assert status_a == "RUNNING"
    labels = _labels(cid_a)
    inst_a = installation.read(a.env["BACKENDAI_STATE_DIR"])
    assert inst_a.agent_id is None  # a new installation: its own default agent id
    assert labels["ai.backend.installation"] == inst_a.id
    assert labels["ai.backend.agent-id"] == a.agent_id == installation.derived_agent_id(inst_a.id)
    assert a.agent_id.startswith(f"i-{socket.gethostname()}-") and RUN in a.agent_id

    b = make_hub(db_url=f"sqlite:///{tmp_path}/b.sqlite", backend="docker",
                 default_agent_id=True, extra_args=FAST)
    assert b.agent_id != a.agent_id and b.installation_id != a.installation_id
    assert b.spawn("admin", "two").status_code in (201, 202)
    b.wait_ready("admin", "two")
    status_b, cid_b = _session(b, "two")
    assert status_b == "RUNNING" and _labels(cid_b)["ai.backend.installation"] == b.installation_id
    # B reconciled at its start and reconciles every second since: A's kernel is not its own.
    time.sleep(4)
    assert "removing orphan kernel" not in b.log(), b.log()[-3000:]
    assert _session(a, "one") == ("RUNNING", cid_a) and _running(cid_a)
    assert a.server_model("admin", "one")["ready"]

    # A restarted: it adopts its own kernel and leaves B's alone.
    a.stop_hub()
    a.start()
    time.sleep(4)
    assert "removing orphan kernel" not in a.log(), a.log()[-3000:]
    assert _session(a, "one") == ("RUNNING", cid_a) and _running(cid_a)
    assert _session(b, "two") == ("RUNNING", cid_b) and _running(cid_b)
    assert a.server_model("admin", "one")["ready"] and b.server_model("admin", "two")["ready"]

    # A third hub on A's state directory (other ports), both ways of starting: refused.
    c = Hub(db_url=a.db_url, backend="docker", default_agent_id=True,
            state_dir=a.env["BACKENDAI_STATE_DIR"])
    try:
        for args in ([sys.executable, "-m", "jupyterhub_backendai.launcher"],
                     [sys.executable, "-m", "jupyterhub_backendai.hubmain", "-f", CONFIG]):
            r = subprocess.run(args, env=c.env, cwd=c.dir, capture_output=True, text=True,
                               timeout=120)
            out = r.stdout + r.stderr
            assert r.returncode != 0, out[-3000:]
            assert f"another hub (pid {a.proc.pid}) runs on the state directory " \
                   f"{a.env['BACKENDAI_STATE_DIR']}" in out, out[-3000:]
    finally:
        shutil.rmtree(c.dir, ignore_errors=True)
    # ...and A was not disturbed by it.
    assert _session(a, "one") == ("RUNNING", cid_a) and _running(cid_a)
    assert a.api("GET", "/users/admin").status_code == 200

    a.stop_server("admin", "one")
    b.stop_server("admin", "two")
    assert not _running(cid_a) and not _running(cid_b)


def test_an_upgraded_installation_keeps_its_agent_id(make_hub, tmp_path):
    """A state directory a hub used before installations had identities (its JupyterHub
    files there, no installation-id): the hub keeps the agent id ``i-<hostname>`` that
    the record's agent row and its running kernels carry, and writes it down."""
    hub = make_hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="local",
                   default_agent_id=True)
    state = hub.env["BACKENDAI_STATE_DIR"]
    hub.stop_hub()
    # What an older version leaves: everything but the identity file.
    os.unlink(os.path.join(state, installation.IDENTITY_FILE))
    engine = make_engine(hub.db_url)
    try:
        with make_sessionmaker(engine).begin() as s:  # the old version's agent row
            s.add(Agent(id=installation.legacy_agent_id(), resource_group="default",
                        status="LOST"))
        hub.start()
        inst = installation.read(state)
        assert inst.agent_id == f"i-{socket.gethostname()}" == hub.agent_id
        path = os.path.join(state, installation.IDENTITY_FILE)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert open(path).read().splitlines()[1] == f"agent-id i-{socket.gethostname()}"
        deadline = time.monotonic() + 30
        while True:
            with make_sessionmaker(engine)() as s:
                status = s.scalar(select(Agent.status).where(Agent.id == hub.agent_id))
            if status == "ALIVE" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == "ALIVE"  # the old row is this agent's again
        # Restarted, it keeps that id (the identity file now says so).
        hub.stop_hub()
        hub.start()
        assert installation.read(state) == inst
    finally:
        engine.dispose()


def test_identity_and_lock(tmp_path):
    """A new state directory gets a random identity once (0600); one with a hub's
    files keeps the old default id; a held state directory is refused with the
    holder's pid, and free again once the holder is gone."""
    new = tmp_path / "new"
    first = installation.ensure(str(new))
    assert first.agent_id is None and installation.ensure(str(new)) == first
    assert stat.S_IMODE(os.stat(new / installation.IDENTITY_FILE).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(new).st_mode) == 0o700
    assert first.default_agent_id("h") == f"i-h-{first.short}"
    other = installation.ensure(str(tmp_path / "other"))
    assert other.id != first.id and other.default_agent_id("h") != first.default_agent_id("h")

    used = tmp_path / "used"
    used.mkdir()
    (used / "jupyterhub_cookie_secret").write_text("00" * 32)
    assert installation.ensure(str(used)).default_agent_id() == f"i-{socket.gethostname()}"

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from jupyterhub_backendai.common import installation\n"
         f"installation.hold_state({str(new)!r}); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(installation.StateLocked) as e:
            installation.hold_state(str(new))
        assert f"another hub (pid {holder.pid})" in str(e.value)
    finally:
        holder.kill()
        holder.wait()
    installation.hold_state(str(new))  # the holder is gone: free
    installation.release_state(str(new))


def test_the_agent_reaps_only_its_own_installations_containers(tmp_path, docker_image):
    """One agent id, three containers the record does not know: one labelled with the
    agent's installation (reaped at its start), one with another installation's label
    (never listed, never touched, not even asked by kernel id), one without any (made
    before identities: listed, kept, never reaped)."""
    import asyncio

    from jupyterhub_backendai.agent.backends.docker import L_INSTALLATION

    from .inproc import running_manager
    from .services import INSTALLATION_PREFIX
    from .services import agent_id as new_agent_id

    aid = new_agent_id("inst")
    mine = installation.new_id(INSTALLATION_PREFIX)
    theirs = installation.new_id(INSTALLATION_PREFIX)
    made = {}
    for kid, inst in (("k-mine", mine), ("k-theirs", theirs), ("k-old", None)):
        args = ["create", "--label", f"ai.backend.agent-id={aid}",
                "--label", f"ai.backend.kernel-id={kid}", "--label", "ai.backend.session-id=s0"]
        if inst:
            args += ["--label", f"{L_INSTALLATION}={inst}"]
        made[kid] = _docker(*args, docker_image, "true")

    def configure(c):
        c.Agent.agent_id = aid
        c.Agent.installation_id = mine

    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/r.sqlite", tmp_path, "docker",
                                   configure=configure) as mgr:
            listed = {k["kernel_id"]: k["own"] for k in await mgr.agent.list_kernels()}
            assert listed == {"k-old": False}, listed  # k-mine reaped at the start
            await mgr.agent.destroy_kernel("k-theirs")  # not this installation's: a no-op
            assert _exists(made["k-theirs"]) and _exists(made["k-old"])
            assert not _exists(made["k-mine"])
            await mgr.agents.reconcile_agent(aid)  # and again: the old one stays
            assert _exists(made["k-old"])

    try:
        asyncio.run(run())
    finally:
        for cid in made.values():
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


def _exists(container_id: str) -> bool:
    return subprocess.run(["docker", "inspect", container_id], capture_output=True).returncode == 0


def test_agents_starting_at_once_share_one_agent_network(tmp_path):
    """The agent network is made by whichever agent on an engine starts first, and the
    engine's duplicate-name check is not atomic: agents starting at the same moment (the
    CI run whose workers each started one) made two networks of one name, and every
    agent's start after that failed ("2 matches found based on name ... is ambiguous").

    Here twins of one name are first made on purpose by racing creates at the engine's
    API (as agents of two hosts on one remote engine, or before the lock, could), then
    six agents start at once: each settles on the oldest and the twins go. Then, from
    nothing, six agents at once make exactly one (they take the host's lock around
    "look it up, else make it"; without it, one in a few runs made twins and some agent
    was left with the gateway of a twin another had removed)."""
    import asyncio
    import contextlib
    import uuid

    import aiodocker
    from aiodocker.exceptions import DockerError

    from jupyterhub_backendai.agent.backends.docker import DockerBackend

    def named(name: str) -> list[str]:
        out = _docker("network", "ls", "-q", "--no-trunc", "--filter", f"name=^{name}$")
        return out.split()

    async def twins(docker: aiodocker.Docker, name: str) -> None:
        for _ in range(20):  # racing creates until the engine makes two of one name
            async def create(subnet: str):
                # A subnet of its own each (as the agent chooses one; left to Docker,
                # a network takes a whole /16, perhaps the run's session pool).
                with contextlib.suppress(DockerError):
                    await docker.networks.create({"Name": name, "Driver": "bridge",
                                                  "Labels": {"ai.backend.network": "agent"},
                                                  "IPAM": {"Config": [{"Subnet": subnet}]}})
            await asyncio.gather(*(create(subnet) for subnet in foreign_subnets(8)))
            if len(named(name)) > 1:
                return
            for nid in named(name):
                _docker("network", "rm", nid)
        pytest.fail("the engine never made two networks of one name: this test cannot show the race")

    async def start_at_once(name: str) -> set[str]:
        backends = [DockerBackend(f"t{RUN}-net{i}", network=name) for i in range(6)]
        for b in backends:
            b.docker = aiodocker.Docker()
        try:
            infos = await asyncio.gather(*(b._agent_network() for b in backends))
            return {info["Id"] for info in infos}
        finally:
            for b in backends:
                await b.docker.close()

    async def run() -> None:
        name = f"t{RUN}-twin-{uuid.uuid4().hex[:8]}"
        async with aiodocker.Docker() as docker:
            await twins(docker, name)
        made = named(name)
        oldest = min(made, key=lambda nid: int(_docker(
            "network", "inspect", "-f", "{{.Created.UnixNano}}", nid)))
        chosen = await start_at_once(name)
        assert chosen == {oldest}, (chosen, made)
        assert named(name) == [oldest]  # its twins removed
        _docker("network", "rm", oldest)

        name = f"t{RUN}-fresh-{uuid.uuid4().hex[:8]}"
        chosen = await start_at_once(name)
        assert len(chosen) == 1 and named(name) == list(chosen), (chosen, named(name))
        _docker("network", "rm", *chosen)

        # A session's network has the same race (agents of one engine starting kernels
        # of one session): every kernel joins the oldest twin, whatever the ids' order.
        session = f"t{RUN}-twin-{uuid.uuid4().hex[:8]}"
        name = DockerBackend.session_network_name(session)
        async with aiodocker.Docker() as docker:
            await twins(docker, name)
        made = named(name)
        oldest = min(made, key=lambda nid: int(_docker(
            "network", "inspect", "-f", "{{.Created.UnixNano}}", nid)))
        backend = DockerBackend(f"t{RUN}-net0")
        backend.docker = aiodocker.Docker()
        try:
            assert await backend._session_network(session) == oldest, made
        finally:
            await backend.docker.close()
        _docker("network", "rm", *made)

    try:
        asyncio.run(run())
    finally:
        for leftover in (named(f"t{RUN}-twin-.*") + named(f"t{RUN}-fresh-.*")
                         + named(f"backendai-session-t{RUN}-twin-.*")):
            subprocess.run(["docker", "network", "rm", leftover], capture_output=True)


def test_the_agent_network_never_takes_the_session_pool(tmp_path):
    """Left to Docker, the agent network took the next of Docker's default pools in
    turn, and once that was 172.30.0.0/16 (the whole default ``session_subnets``) no
    session got a network: "no free subnet", in every hub of the run (a fresh-clone run,
    stop 33). Here the session pool is 172.16.0.0/12, which holds every 172.x pool Docker
    would give: the agent network is made outside it, and a session network is then made
    in it."""
    import asyncio
    import ipaddress
    import uuid

    import aiodocker

    from jupyterhub_backendai.agent.backends.docker import DockerBackend

    pool = ipaddress.ip_network("172.16.0.0/12")

    async def run() -> None:
        name = f"t{RUN}-pool-{uuid.uuid4().hex[:8]}"
        b = DockerBackend(f"t{RUN}-pool", network=name, session_subnets=str(pool),
                          session_prefix=28)
        b.docker = aiodocker.Docker()
        try:
            info = await b._agent_network()
            subnets = [ipaddress.ip_network(c["Subnet"]) for c in info["IPAM"]["Config"]]
            assert subnets and not any(s.overlaps(pool) for s in subnets), subnets
            sid = uuid.uuid4().hex
            net = await (await b.docker.networks.get(await b._session_network(sid))).show()
            got = ipaddress.ip_network(net["IPAM"]["Config"][0]["Subnet"])
            assert got.subnet_of(pool), got
            await (await b.docker.networks.get(net["Id"])).delete()
        finally:
            await b.docker.close()
            for nid in _docker("network", "ls", "-q", "--filter", f"name=^{name}$").split():
                _docker("network", "rm", nid)

    asyncio.run(run())


def test_a_network_that_holds_the_session_pool_is_named(tmp_path):
    """Another tool's network made without a subnet gets a whole default pool of
    Docker's, and once that is the session pool no session can have a network (a
    suite's own test did that to the others, stop 34). The session's start fails, and
    says which network holds the pool and what to do."""
    import asyncio
    import uuid

    import aiodocker

    from jupyterhub_backendai.agent.backends.docker import DockerBackend
    from jupyterhub_backendai.common.errors import AgentError

    (pool,) = foreign_subnets()
    foreign = f"t{RUN}-foreign-{uuid.uuid4().hex[:8]}"

    async def run() -> str:
        b = DockerBackend(f"t{RUN}-taken", network=f"t{RUN}-unused", session_subnets=pool,
                          session_prefix=26)
        b.docker = aiodocker.Docker()
        try:
            with pytest.raises(AgentError) as got:
                await b._session_network(uuid.uuid4().hex)
            return str(got.value)
        finally:
            await b.docker.close()

    _docker("network", "create", "--driver", "bridge", "--subnet", pool, foreign)
    try:
        said = asyncio.run(run())
    finally:
        _docker("network", "rm", foreign)
    assert f"in {pool} (Agent.session_subnets)" in said, said
    assert f"the pool's addresses are held by {foreign} ({pool}): remove it or choose " \
           "another Agent.session_subnets" in said, said


# Another Jupyter server (a real one, under its own prefix) on the port this hub's agent
# gave its kernel: one that no agent's claim keeps off it (agent/portclaims.py keeps
# other installations' agents off; two binder demos at once once met there).
FOREIGN_SERVER = '''#!{python}
import os, sys, urllib.parse
url = urllib.parse.urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
os.execv(sys.executable, [sys.executable, "-m", "jupyter_server", "--ServerApp.ip=" + url.hostname,
         "--ServerApp.port=%d" % url.port, "--ServerApp.port_retries=0",
         "--ServerApp.base_url=/user/someone-else/", "--IdentityProvider.token=",
         "--ServerApp.allow_root=True", "--ServerApp.open_browser=False",
         "--ServerApp.root_dir=/tmp"])
'''


def test_another_installations_server_on_the_kernels_port_is_never_taken_for_it(make_hub, tmp_path):
    """The spawner takes only its own server's answer (200 from its prefix's ``api``) as
    ready: before, any HTTP answer was, and JupyterHub sent the user on to the other
    installation's server. The start fails with the port and what answered; nothing of
    the session is left."""
    from .test_spawn_ux import _events

    bindir = tempfile.mkdtemp(prefix="bai-foreign-")  # the kernel's user reads it
    try:
        os.chmod(bindir, 0o755)
        script = os.path.join(bindir, "foreign-server")
        with open(script, "w") as f:
            f.write(FOREIGN_SERVER.format(python=sys.executable))
        os.chmod(script, 0o755)
        hub = make_hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="local",
                       extra_env={"BACKENDAI_START_TIMEOUT": "25"},
                       extra_args=[f"--Agent.local_cmd={script}"])
        r = hub.spawn("admin", "x")
        assert r.status_code == 202, r.text  # not ready (201): it is not the session's server
        events = _events(hub, "admin", "x")
        final = events[-1]
        assert final.get("failed"), events
        assert "answers as another server (HTTP 404 at /user/admin/x/api), not its Jupyter " \
               "server" in final["message"], final
        assert hub.server_model("admin", "x") is None
        engine = make_engine(hub.db_url)
        try:
            deadline = time.monotonic() + 30
            while True:
                with make_sessionmaker(engine)() as s:
                    status = s.scalar(select(Session.status).where(Session.name == "x"))
                    port = s.scalar(select(Kernel.service_ports).join(
                        Session, Session.id == Kernel.session_id).where(Session.name == "x"))
                if status in ("TERMINATED", "ERROR", "CANCELLED") or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert status in ("TERMINATED", "ERROR"), status
        finally:
            engine.dispose()
        host_port = port[0]["host_port"]
        deadline = time.monotonic() + 15
        while True:  # the foreign server, the session's process, went with it
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", host_port)) != 0:
                    break
            assert time.monotonic() < deadline, f"port {host_port} still answers"
            time.sleep(0.2)
    finally:
        shutil.rmtree(bindir, ignore_errors=True)


def test_two_installations_starting_servers_at_once_on_one_port_range(make_hub, tmp_path):
    """Two installations on one host, their agents on the same port range (as two
    Binder demos on the default range are), each starts a server at the same moment.
    Both agents found the range's first port free, since neither server had bound it
    yet, and one of the servers then failed to bind it ("kernel exited with code 1":
    the second suite of a pair, 2026-11-30). Now an agent claims a port host-wide when
    it hands it out (agent/portclaims.py): both servers start, on two ports, and each
    answers through its own hub; stopped, the claims go with the kernels."""
    from jupyterhub_backendai.agent.portclaims import claim_path

    first = make_hub(db_url=f"sqlite:///{tmp_path}/one.sqlite", backend="local")
    span = first.env["BACKENDAI_AGENT_PORT_RANGE"]
    second = make_hub(db_url=f"sqlite:///{tmp_path}/two.sqlite", backend="local",
                      extra_env={"BACKENDAI_AGENT_PORT_RANGE": span})
    hubs = (first, second)
    tokens = [h.admin_token for h in hubs]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda h: h.spawn("admin", "x"), hubs))
    for r in answers:
        assert r.status_code in (201, 202), r.text
    for h in hubs:
        h.wait_ready("admin", "x", timeout=120)
    ports = []
    for h in hubs:
        engine = make_engine(h.db_url)
        try:
            with make_sessionmaker(engine)() as s:
                sp = s.scalar(select(Kernel.service_ports).join(
                    Session, Session.id == Kernel.session_id).where(Session.name == "x"))
        finally:
            engine.dispose()
        ports.append(sp[0]["host_port"])
    lo = int(span.split("-")[0])
    assert sorted(ports) == [lo, lo + 1], ports  # the range's first two: one each
    for h, token in zip(hubs, tokens, strict=True):
        r = requests.get(f"{h.base}/user/admin/x/api/status",
                         headers={"Authorization": f"token {token}"}, timeout=30)
        assert r.status_code == 200, r.text
    assert all(os.path.exists(claim_path(p)) for p in ports)
    for h in hubs:
        h.stop_server("admin", "x")
    deadline = time.monotonic() + 30
    while any(os.path.exists(claim_path(p)) for p in ports):
        assert time.monotonic() < deadline, f"claims of {ports} still there"
        time.sleep(0.2)
