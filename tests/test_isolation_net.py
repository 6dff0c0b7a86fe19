"""Network isolation between sessions on the Docker backend (issue 10, row 4).

A real hub (Docker backend, packaged config), two users in two domains, each with a
server. From inside the real containers: alice's kernel cannot open a TCP connection
to bob's kernel (serving ``python -m http.server``) nor resolve any of its names; the
kernels of one multi-kernel session reach each other by name; the hub's API is
reachable from a kernel (and listens on loopback and the agent network's gateway
only); no session network is left after the sessions end.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import psutil
import pytest

from jupyterhub_backendai.common.types import HOST_PERMISSIONS

from .api_world import new_user, superadmin
from .conftest import containers_of
from .hub import Hub
from .inproc import remove_session_networks
from .services import AGENT_NETWORK

NET = AGENT_NETWORK


def docker(*args: str, check: bool = True) -> str:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {r.stderr}")
    return r.stdout.strip()


def in_kernel(container: str, code: str) -> subprocess.CompletedProcess:
    """Run Python in a kernel container, as its (unprivileged) user."""
    return subprocess.run(["docker", "exec", container, "python", "-c", code],
                          capture_output=True, text=True, timeout=120)


def container_of(hub: Hub, owner: str, hostname: str = "main1") -> dict:
    ids = docker("ps", "-q", "--filter", f"label=ai.backend.agent-id={hub.agent_id}",
                 "--filter", f"label=ai.backend.owner={owner}").split()
    for info in json.loads(docker("inspect", *ids)) if ids else []:
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])
        if info["Config"]["Hostname"] == hostname and env.get("BACKENDAI_CLUSTER_SIZE") == "1":
            return info
    raise AssertionError(f"no {hostname} container of {owner}")


def session_networks(hub: Hub) -> list[str]:
    return docker("network", "ls", "-q", "--filter", "label=ai.backend.network=session",
                  "--filter", f"label=ai.backend.agent-id={hub.agent_id}").split()


CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1] if len(sys.argv) > 1 else {host!r}, {port}), timeout=3).close()
    print("connected")
except OSError as e:
    print("refused", type(e).__name__)
"""

RESOLVE = """
import socket
for name in {names!r}:
    try:
        print(name, socket.gethostbyname(name))
    except socket.gaierror:
        print(name, "unresolved")
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory, docker_image):
    hub = Hub(db_url=f"sqlite:///{tmp_path_factory.mktemp('isonet')}/backendai.sqlite",
              backend="docker").start()
    try:
        sa = superadmin(hub)
        hosts = {"local:volume1": list(HOST_PERMISSIONS)}  # servers get a home folder
        for d in ("d1", "d2"):
            sa.ok("POST", "/domains", json={"name": d, "allowed_vfolder_hosts": hosts})
        p1 = sa.ok("POST", "/projects", json={"name": "p1", "domain_name": "d1"})["id"]
        p2 = sa.ok("POST", "/projects", json={"name": "p2", "domain_name": "d2"})["id"]
        alice = new_user(sa, domain="d1", projects=[p1], name="alice")
        bob = new_user(sa, domain="d2", projects=[p2], name="bob")
        for u in (alice, bob):
            r = hub.spawn(u["username"], "s", token=u["token"])
            assert r.status_code in (201, 202), r.text
        for u in (alice, bob):
            hub.wait_ready(u["username"], "s", token=u["token"])
        yield hub, alice, bob
    finally:
        hub.close()
        left = containers_of(hub.agent_id)
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
        remove_session_networks(hub.agent_id)
        shutil.rmtree(hub.dir, ignore_errors=True)


def test_a_kernel_cannot_reach_another_sessions_kernel(world):
    hub, alice, bob = world
    a = container_of(hub, "alice")
    b = container_of(hub, "bob")
    # Bob serves a file from his kernel, as any user can.
    docker("exec", "-d", b["Id"], "python", "-m", "http.server", "9000", "--bind", "0.0.0.0")
    (bob_net, bob_ep), = b["NetworkSettings"]["Networks"].items()
    (alice_net, _), = a["NetworkSettings"]["Networks"].items()
    assert bob_net != alice_net and NET not in (alice_net, bob_net)
    bob_ip = bob_ep["IPAddress"]
    # Bob reaches his own server (the server is up; the check below can fail).
    probe = CONNECT.format(host="127.0.0.1", port=9000)
    for _ in range(100):
        if in_kernel(b["Id"], probe).stdout.strip() == "connected":
            break
    else:
        raise AssertionError("bob's http.server did not come up")
    assert in_kernel(b["Id"], CONNECT.format(host=bob_ip, port=9000)).stdout.strip() == "connected"
    # Alice cannot open a connection to it, by address ...
    out = in_kernel(a["Id"], CONNECT.format(host=bob_ip, port=9000)).stdout.strip()
    assert out.startswith("refused"), out
    # ... nor resolve any name of bob's kernel.
    # (``main1`` is every session's main kernel: in alice's, her own.)
    names = sorted({b["Name"].lstrip("/"), *(bob_ep.get("Aliases") or []), b["Id"][:12]} - {"main1"})
    assert any(n.startswith("main1-") for n in names) and len(names) >= 3
    out = in_kernel(a["Id"], RESOLVE.format(names=[*names, "main1"])).stdout.split()
    alice_ip = next(iter(a["NetworkSettings"]["Networks"].values()))["IPAddress"]
    assert out == [w for n in names for w in (n, "unresolved")] + ["main1", alice_ip], out


def test_the_hub_api_is_reached_from_kernels_and_listens_nowhere_else(world):
    hub, alice, _ = world
    a = container_of(hub, "alice")
    env = dict(e.split("=", 1) for e in a["Config"]["Env"])
    api = env["JUPYTERHUB_API_URL"]
    gateway = json.loads(docker("network", "inspect", NET))[0]["IPAM"]["Config"][0]["Gateway"]
    assert api == f"http://{gateway}:{hub.api_port}/hub/api"
    out = in_kernel(a["Id"], (
        "import json, os, urllib.request\n"
        "r = urllib.request.urlopen(os.environ['JUPYTERHUB_API_URL'] + '/', timeout=10)\n"
        "print(r.status, json.load(r)['version'])"
    ))
    assert out.returncode == 0 and out.stdout.split()[0] == "200", out.stderr
    # The hub process listens on the API port on loopback and the gateway, not 0.0.0.0.
    addrs = sorted(
        c.laddr.ip for c in psutil.Process(hub.proc.pid).net_connections("inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == hub.api_port
    )
    assert addrs == sorted(["127.0.0.1", gateway]), addrs


def test_kernels_of_one_session_reach_each_other_and_no_network_is_left(world):
    hub, alice, _ = world
    from sqlalchemy import select

    from jupyterhub_backendai.models import KeypairResourcePolicy
    from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

    engine = make_engine(hub.db_url)
    try:
        with make_sessionmaker(engine).begin() as s:
            for pol in s.scalars(select(KeypairResourcePolicy)):
                pol.max_containers_per_session = 2
    finally:
        engine.dispose()
    before = set(session_networks(hub))
    r = hub.spawn("alice", "pair", {"cluster_size": 2}, token=alice["token"])
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice", "pair", token=alice["token"])
    main = sub = None
    for cid in docker("ps", "-q", "--filter", f"label=ai.backend.agent-id={hub.agent_id}",
                      "--filter", "label=ai.backend.owner=alice").split():
        info = json.loads(docker("inspect", cid))[0]
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])
        if env.get("BACKENDAI_CLUSTER_SIZE") == "2":
            if info["Config"]["Hostname"] == "main1":
                main = info
            else:
                sub = info
    assert main and sub
    (net,) = main["NetworkSettings"]["Networks"]
    assert list(sub["NetworkSettings"]["Networks"]) == [net] and net not in before
    docker("exec", "-d", sub["Id"], "python", "-m", "http.server", "9001", "--bind", "0.0.0.0")
    probe = CONNECT.format(host="sub1", port=9001)
    for _ in range(100):
        out = in_kernel(main["Id"], probe).stdout.strip()
        if out == "connected":
            break
    assert out == "connected", out
    # The names in BACKENDAI_CLUSTER_HOSTS resolve too.
    env = dict(e.split("=", 1) for e in main["Config"]["Env"])
    hosts = env["BACKENDAI_CLUSTER_HOSTS"].split(",")
    out = in_kernel(main["Id"], RESOLVE.format(names=hosts)).stdout.split("\n")
    assert all(line.split()[1] != "unresolved" for line in out if line), out
    # The other session's kernel (alice's own first server) is not reachable from it.
    first = container_of(hub, "alice")
    (first_ep,) = first["NetworkSettings"]["Networks"].values()
    out = in_kernel(main["Id"], CONNECT.format(host=first_ep["IPAddress"], port=8888)).stdout
    assert out.startswith("refused"), out
    hub.stop_server("alice", "pair", token=alice["token"])
    assert net not in session_networks(hub)
    hub.stop_server("alice", "s", token=alice["token"])
    hub.stop_server("bob", "s", token=world[2]["token"])
    assert session_networks(hub) == []
    assert docker("network", "ls", "-q", "--filter", f"name={net}") == ""

