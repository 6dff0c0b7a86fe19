"""The warm pool (issue 30): kernels started before anyone asks, bound to a user's start.

Through a real hub (subprocess, CHP, in-hub agent with the Docker backend, the kernel
image). What a user sees inside a pooled session is compared with a fresh session of the
same user; another user's token, files and environment are looked for and must not be
there; the pool refills, gives its room to a session that needs it, and says why it
cannot fill.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest

from jupyterhub_backendai.agent.warmpool import INBOX

from .api_world import new_user, superadmin
from .conftest import shutdown_hub
from .hub import KERNEL_IMAGE, Hub
from .kernel_client import execute

# What a user can observe of their server from inside (the same for a pooled and a
# fresh session of theirs): identity, environment, limits, home, working directory.
OBSERVE = r"""
import json, os, pwd, socket
env = dict(os.environ)
def read(p):
    try:
        return open(p).read().strip()
    except OSError as e:
        return f"error {e.errno}"
print(json.dumps({
    "env": env,
    "uid": os.getuid(), "user": pwd.getpwuid(os.getuid()).pw_name,
    "hostname": socket.gethostname(), "cwd": os.getcwd(),
    "home": sorted(os.listdir(os.path.expanduser("~"))),
    "cpu_max": read("/sys/fs/cgroup/cpu.max"), "mem_max": read("/sys/fs/cgroup/memory.max"),
    "pids_max": read("/sys/fs/cgroup/pids.max"),
    "pid1_env": read("/proc/1/environ").replace("\0", "\n"),
    "tmp": os.statvfs("/tmp").f_blocks * os.statvfs("/tmp").f_frsize,
}))
"""
CPU, MEM = "0.5", "512m"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, docker_image):
    hub = Hub(db_url=f"sqlite:///{tmp_path_factory.mktemp('warmpool')}/backendai.sqlite",
              backend="docker", slots={"cpu": 3, "mem": "6g"},
              extra_args=["--BackendAIManager.warm_pool_interval=0.5"]).start()
    yield hub
    shutdown_hub(hub)


@pytest.fixture(scope="module")
def preset(hub):
    sa = superadmin(hub)
    name = f"wp-{uuid.uuid4().hex[:8]}"
    sa.ok("POST", "/resource-presets", json={"name": name,
                                             "resource_slots": {"cpu": CPU, "mem": MEM}})
    return name


@pytest.fixture(autouse=True)
def _pool_emptied_after(hub, preset):
    """Each test leaves the module's hub without a pool, also when it failed half-way (a
    pool left full holds the cores the next test counts on)."""
    yield
    if pool(hub, preset)["size"]:
        set_pool(hub, preset, 0)
        wait_for("the pool emptied", lambda: not [
            c for c in pooled_containers(hub) if c["Names"].startswith("backendai--")])


def set_pool(hub, preset, size, group="default") -> dict:
    return superadmin(hub).ok("PUT", "/warm-pools", json={
        "resource_group": group, "image": KERNEL_IMAGE, "preset": preset, "size": size})


def pool(hub, preset, group="default") -> dict:
    items = superadmin(hub).ok("GET", "/warm-pools")["items"]
    found = [p for p in items if (p["resource_group"], p["preset"]) == (group, preset)]
    return found[0] if found else {"size": 0, "ready": 0, "hits": 0, "misses": 0}


def pooled_containers(hub) -> list[dict]:
    """The hub's agent's unbound-or-bound pooled containers: id, kernel id, name."""
    out = subprocess.run(
        ["docker", "ps", "--filter", f"label=ai.backend.agent-id={hub.agent_id}",
         "--filter", "label=ai.backend.pool", "--format", "{{json .}}"],
        capture_output=True, text=True, check=True).stdout.split("\n")
    return [json.loads(line) for line in out if line.strip()]


def wait_for(what, predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def wait_ready_pool(hub, preset, n):
    """Until ``n`` pooled kernels are ready: each is a container and a Jupyter server
    started, and a loaded machine took over 120 s for two (run B of 2026-11-29, the
    hub's event loop held for seconds), so the bound is 240 s; a timeout says what the
    pool showed last."""
    last: dict = {}

    def ready():
        last.update(pool(hub, preset))
        return last["ready"] >= n and dict(last)

    try:
        return wait_for(f"{n} pooled kernels ready", ready, timeout=240.0)
    except AssertionError as e:
        raise AssertionError(f"{e}; the pool showed {last}") from None


def observe(hub, user: dict, server: str) -> dict:
    model = hub.server_model(user["username"], server, token=user["token"])
    return json.loads(execute(hub.base, model["url"], user["token"], OBSERVE))


def start(hub, user: dict, server: str) -> float:
    t0 = time.monotonic()
    r = hub.spawn(user["username"], server, token=user["token"],
                  options={"cpu": CPU, "mem": MEM})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user["username"], server, token=user["token"])
    return time.monotonic() - t0


def session_container(hub, user: dict, server: str) -> dict:
    """The kernel container of a user's server, as docker inspect shows it."""
    sa = user["client"]
    sess = [s for s in sa.ok("GET", "/sessions", params={"limit": 100})["items"]
            if s.get("name") == server and s["status"] == "RUNNING"]
    assert len(sess) == 1, sess
    kid = sa.ok("GET", f"/sessions/{sess[0]['id']}")["kernels"][0]["id"]
    [cid] = subprocess.run(["docker", "ps", "-q", "--filter", f"label=ai.backend.kernel-id={kid}"],
                           capture_output=True, text=True, check=True).stdout.split()
    return json.loads(subprocess.run(["docker", "inspect", cid], capture_output=True,
                                     text=True, check=True).stdout)[0]


def test_a_pooled_session_is_its_users_own_and_like_a_fresh_one(hub, preset):
    sa = superadmin(hub)
    alice, bob = new_user(sa), new_user(sa)
    # A fresh session of alice's first (no pool yet): what a pooled one must equal.
    start(hub, alice, "fresh")
    fresh = observe(hub, alice, "fresh")
    fresh_box = session_container(hub, alice, "fresh")
    assert "ai.backend.pool" not in fresh_box["Config"]["Labels"]
    hub.stop_server(alice["username"], "fresh", token=alice["token"])

    set_pool(hub, preset, 2)
    wait_ready_pool(hub, preset, 2)
    before = pool(hub, preset)
    pooled_ids = {c["ID"] for c in pooled_containers(hub)}
    start(hub, alice, "warm")
    start(hub, bob, "warm")
    after = pool(hub, preset)
    assert after["hits"] - before["hits"] == 2, (before, after)
    a_box, b_box = session_container(hub, alice, "warm"), session_container(hub, bob, "warm")
    # Both took a pooled kernel (a container made before they asked).
    assert {a_box["Id"][:12], b_box["Id"][:12]} <= pooled_ids
    assert a_box["Name"].startswith(f"/backendai-{alice['username']}-")

    a, b = observe(hub, alice, "warm"), observe(hub, bob, "warm")
    # Identity and environment: the user's own, like the fresh session.
    assert a["env"]["JUPYTERHUB_USER"] == alice["username"]
    assert b["env"]["JUPYTERHUB_USER"] == bob["username"]
    volatile = {"JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "JUPYTERHUB_CLIENT_ID",
                "JUPYTERHUB_OAUTH_CALLBACK_URL", "JUPYTERHUB_SERVER_NAME",
                "JUPYTERHUB_SERVICE_PREFIX", "JUPYTERHUB_SERVICE_URL", "JUPYTERHUB_OAUTH_SCOPES",
                "JUPYTERHUB_OAUTH_ACCESS_SCOPES", "JUPYTERHUB_OAUTH_CLIENT_ALLOWED_SCOPES",
                "BACKENDAI_SESSION_ID", "BACKENDAI_SESSION_NAME", "BACKENDAI_KERNEL_ID", "BACKENDAI_CLUSTER_HOSTS",
                "BACKENDAI_CLUSTER_ADDR", "JUPYTERHUB_ACTIVITY_URL", "JPY_SESSION_NAME",
                "KERNEL_ID", "JPY_PARENT_PID"}

    def stable(env):
        return {k: v for k, v in env.items() if k not in volatile}

    assert stable(a["env"]) == stable(fresh["env"])
    for key in ("uid", "user", "hostname", "cwd", "cpu_max", "mem_max", "pids_max", "tmp"):
        assert a[key] == fresh[key], (key, a[key], fresh[key])
    # The home: the user's folder, seeded like a fresh one (the file of the fresh start
    # is there: it is the same home).
    assert set(fresh["home"]) <= set(a["home"])
    # Its limits: the session's, as the engine applies them (the startup burst is over),
    # and the CPU weight of a fresh kernel (a pooled one warms up at the least weight).
    for box in (a_box, b_box):
        assert (box["HostConfig"]["NanoCpus"], box["HostConfig"]["Memory"]) == (
            5 * 10**8, 512 * 2**20)
        assert box["HostConfig"]["CpuShares"] == fresh_box["HostConfig"]["CpuShares"] == 1024
        # The binding's environment (the user's token) was read and is gone from the
        # kernel's inbox on the host.
        [inbox] = [m["Source"] for m in box["Mounts"] if m["Destination"] == INBOX]
        assert os.listdir(inbox) == []
    # Nothing of the other user: token, name, files.
    assert alice["token"] not in json.dumps(b) and bob["token"] not in json.dumps(a)
    assert alice["username"] not in json.dumps(b) and bob["username"] not in json.dumps(a)
    marker = f"alice-secret-{uuid.uuid4().hex}"
    execute(hub.base, hub.server_model(alice["username"], "warm", token=alice["token"])["url"],
            alice["token"], f"open('/home/work/secret.txt', 'w').write({marker!r})")
    seen = execute(hub.base, hub.server_model(bob["username"], "warm", token=bob["token"])["url"],
                   bob["token"], "import subprocess; print(subprocess.run(['grep', '-r', "
                   f"{marker!r}, '/home', '/tmp'], capture_output=True, text=True).stdout)")
    assert marker not in seen
    # No user's token in the container's own environment, nor in its init's.
    for box in (a_box, b_box):
        assert not any("JUPYTERHUB_API_TOKEN" in e for e in box["Config"]["Env"])
    assert "JUPYTERHUB_API_TOKEN" not in a["pid1_env"]
    hub.stop_server(alice["username"], "warm", token=alice["token"])
    hub.stop_server(bob["username"], "warm", token=bob["token"])
    # Their containers went with their sessions; the pool is full again with new ones.
    left = {c["ID"] for c in pooled_containers(hub)}
    assert not {a_box["Id"][:12], b_box["Id"][:12]} & left
    wait_ready_pool(hub, preset, 2)
    set_pool(hub, preset, 0)
    wait_for("the pool emptied", lambda: not pooled_containers(hub))


def test_the_pool_refills_and_gives_its_room_to_a_session_that_needs_it(hub, preset):
    sa = superadmin(hub)
    carol = new_user(sa)
    set_pool(hub, preset, 2)
    wait_ready_pool(hub, preset, 2)
    first = {c["ID"] for c in pooled_containers(hub)}
    # A hit: refilled to 2 with a new kernel.
    start(hub, carol, "one")
    wait_for("the refill", lambda: len({c["ID"] for c in pooled_containers(hub)} - first) >= 1
             and pool(hub, preset)["ready"] == 2)
    # 3 cores: 0.5 (carol's) + 2 x 0.5 (the pool) held; a 2-core session needs the pool's
    # room: it starts, and a pooled kernel is evicted to make the room.
    r = hub.spawn(carol["username"], "big", token=carol["token"], options={"cpu": "2", "mem": "1g"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(carol["username"], "big", token=carol["token"])
    got = wait_for("an eviction", lambda: pool(hub, preset)["ready"] <= 1 and pool(hub, preset))
    assert got["ready"] == 1
    # The pool says why it cannot fill.
    got = wait_for("the reason", lambda: pool(hub, preset)["status_info"] and pool(hub, preset))
    assert got["status_info"].startswith("cannot fill: no agent of resource group 'default' "
                                         "has room for"), got
    hub.stop_server(carol["username"], "big", token=carol["token"])
    wait_ready_pool(hub, preset, 2)
    assert pool(hub, preset)["status_info"] == ""
    hub.stop_server(carol["username"], "one", token=carol["token"])
    set_pool(hub, preset, 0)
    wait_for("the pool emptied", lambda: not pooled_containers(hub))


def test_a_pool_of_an_image_that_cannot_start_says_why(hub, preset):
    sa = superadmin(hub)
    sa.ok("PUT", "/warm-pools", json={"resource_group": "default", "image": "no/such:image",
                                      "preset": preset, "size": 1})
    items = wait_for("the reason", lambda: [p for p in sa.ok("GET", "/warm-pools")["items"]
                                            if p["image"] == "no/such:image" and p["status_info"]])
    assert items[0]["status_info"].startswith("cannot fill: agent "), items
    assert "no/such:image" in items[0]["status_info"]
    sa.ok("PUT", "/warm-pools", json={"resource_group": "default", "image": "no/such:image",
                                      "preset": preset, "size": 0})


def test_bad_settings_are_refused_in_words(hub, preset):
    sa = superadmin(hub)
    user = new_user(sa)
    body = {"resource_group": "default", "image": KERNEL_IMAGE, "preset": preset, "size": 1}
    assert user["client"]("PUT", "/warm-pools", json=body).status_code == 403
    assert user["client"]("GET", "/warm-pools").status_code == 403
    r = sa("PUT", "/warm-pools", json=dict(body, preset="no-such-preset"))
    assert r.status_code == 404 and "no-such-preset" in r.json()["detail"]
    r = sa("PUT", "/warm-pools", json=dict(body, size=-1))
    assert r.status_code == 400
    assert [p for p in sa.ok("GET", "/warm-pools")["items"] if p["size"]] == []
