"""Issue 12, non-HTTP ports: SSH/SFTP into a session with a key derived from the user's
keypair, opt-in per resource group (``BackendAIManager.ssh_resource_groups``).

A real hub with the Docker backend whose "default" group offers SSH: the owner logs in
with real ``ssh``/``sftp`` on the port the agent published (127.0.0.1) and the API
reported; another user's derived key is refused; after a stop the port is closed and
the agent hands it out again (nothing leaked). In-process managers on the same Docker
engine: a group that does not offer SSH publishes nothing and runs no sshd; a start
that fails gives its ports back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import os
import socket
import subprocess
import time

import pytest
import requests

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.manager import sshkeys

from .conftest import containers_of, shutdown_hub
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub
from .inproc import make_user, running_manager, wait_status
from .test_attacks_api import API, new_user
from .test_signing import signed

SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
            "-o", "LogLevel=ERROR"]


@pytest.fixture(scope="module")
def ssh_hub(docker_image, tmp_path_factory):
    from jupyterhub_backendai.cli import create_superadmin

    for tool in ("ssh", "sftp"):
        if not subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).stdout:
            pytest.fail(f"{tool} missing: scripts/install-test-deps.sh installs openssh-client")
    d = tmp_path_factory.mktemp("ssh")
    db_url = f"sqlite:///{d}/backendai.sqlite"
    admin = create_superadmin(db_url, ADMIN_EMAIL, ADMIN_PASSWORD)
    hub = Hub(db_url=db_url, backend="docker",
              extra_args=["--BackendAIManager.ssh_resource_groups=default"])
    hub.admin_keys = (admin["access_key"], admin["secret_key"])
    try:
        hub.start()
    except Exception as e:
        hub.close()
        raise RuntimeError(f"hub did not start: {e}\n{hub.log()}") from e
    try:
        yield hub
    finally:
        shutdown_hub(hub)


def _start(hub, user: dict, name: str) -> str:
    r = signed(hub, "POST", "/sessions", user["access_key"], user["secret_key"], json={
        "name": name, "image": hub.image, "startup_command": "sleep 600",
        "resources": {"cpu": "0.25", "mem": "256m"}})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    deadline = time.monotonic() + 120  # a bound for hangs, not a speed check
    while time.monotonic() < deadline:
        s = signed(hub, "GET", f"/sessions/{sid}", user["access_key"], user["secret_key"]).json()
        if s["status"] in ("RUNNING", "TERMINATED", "ERROR", "CANCELLED"):
            break
        time.sleep(0.2)
    assert s["status"] == "RUNNING", s
    return sid


def _stop(hub, user: dict, sid: str) -> None:
    r = signed(hub, "DELETE", f"/sessions/{sid}", user["access_key"], user["secret_key"])
    assert r.status_code == 204, r.text
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = signed(hub, "GET", f"/sessions/{sid}", user["access_key"], user["secret_key"]).json()
        if s["status"] in ("TERMINATED", "ERROR", "CANCELLED"):
            return
        time.sleep(0.2)
    raise AssertionError(f"session {sid} did not stop: {s}")


def _ssh_ports(hub, user: dict, sid: str) -> dict:
    r = signed(hub, "GET", f"/sessions/{sid}/service-ports", user["access_key"],
               user["secret_key"])
    assert r.status_code == 200, r.text
    return {p["name"]: p for p in r.json()["service_ports"] if p["protocol"] == "tcp"}


def _key_file(tmp_path, name: str, private_key: str) -> str:
    path = str(tmp_path / name)
    with open(path, "w") as f:
        f.write(private_key)
    os.chmod(path, 0o600)
    return path


def _ssh(key: str, port: int, *cmd: str, user: str = "work") -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", *SSH_OPTS, "-i", key, "-p", str(port), f"{user}@127.0.0.1",
                           *cmd], capture_output=True, text=True, timeout=60)


def _raw(private_key: str) -> bytes:
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    return load_ssh_private_key(private_key.encode(), None).private_bytes_raw()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def test_owner_logs_in_with_ssh_and_sftp_and_nobody_else(ssh_hub, tmp_path):
    hub = ssh_hub
    alice, bob = new_user(hub), new_user(hub)
    sid = _start(hub, alice, "ssh1")
    lo, hi = (int(x) for x in hub.env["BACKENDAI_AGENT_PORT_RANGE"].split("-"))

    # The API reports the published sshd (shell and files on one port) on 127.0.0.1.
    tcp = _ssh_ports(hub, alice, sid)
    assert set(tcp) == {"sshd", "sftp"}, tcp
    port = tcp["sshd"]["port"]
    assert tcp["sftp"]["port"] == port and lo <= port <= hi
    assert tcp["sshd"]["host"] == "127.0.0.1" and tcp["sshd"]["container_port"] == 2200
    assert tcp["sshd"]["url"] is None
    [cid] = containers_of(hub.agent_id)
    bindings = subprocess.run(
        ["docker", "inspect", "-f", "{{json .HostConfig.PortBindings}}", cid],
        capture_output=True, text=True, check=True).stdout
    assert f'"2200/tcp":[{{"HostIp":"127.0.0.1","HostPort":"{port}"}}]' in bindings, bindings

    # The key: the owner's only (others who may see the session get 403, the rest 404),
    # and the owner can recompute it from the keypair's secret key.
    r = signed(hub, "GET", f"/sessions/{sid}/ssh-key", bob["access_key"], bob["secret_key"])
    assert r.status_code == 404, r.text
    r = signed(hub, "GET", f"/sessions/{sid}/ssh-key", *hub.admin_keys)
    assert r.status_code == 403 and "owner" in r.text, r.text
    # A shell is more than reading: the owner's JupyterHub token with only the read
    # scope is refused (the same token reads the session itself).
    login = hub.login(alice["email"], "victim-pass-1")
    r = login.post(f"{hub.base}/hub/api/users/{alice['username']}/tokens",
                   json={"scopes": ["custom:backendai:read"], "note": "read only"},
                   headers={"X-XSRFToken": login.cookies.get("_xsrf", path="/hub/")})
    assert r.status_code == 201, r.text
    ro = {"Authorization": f"token {r.json()['token']}"}
    r = requests.get(f"{hub.base}{API}/sessions/{sid}", headers=ro, timeout=30)
    assert r.status_code == 200, r.text
    r = requests.get(f"{hub.base}{API}/sessions/{sid}/ssh-key", headers=ro, timeout=30)
    assert r.status_code == 403 and "custom:backendai:write" in r.text, r.text
    r = signed(hub, "GET", f"/sessions/{sid}/ssh-key", alice["access_key"], alice["secret_key"])
    assert r.status_code == 200, r.text
    got = r.json()
    assert r.headers.get("Cache-Control") == "no-store"
    assert (got["user"], got["host"], got["port"]) == ("work", "127.0.0.1", port)
    assert got["access_key"] == alice["access_key"]
    # (OpenSSH's format has a random check number: the same key, not the same text)
    assert _raw(got["private_key"]) == _raw(sshkeys.private_key(alice["secret_key"]))
    assert _raw(got["private_key"]) != _raw(sshkeys.private_key(bob["secret_key"]))
    assert got["public_key"] == sshkeys.public_key(alice["secret_key"], alice["access_key"])
    key = _key_file(tmp_path, "alice", got["private_key"])

    out = _ssh(key, port, "hostname; id -un")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["main1", "work"], out.stdout

    # sftp: a file put from here is in the session, and comes back the same.
    payload = os.urandom(64 * 1024)
    (tmp_path / "up.bin").write_bytes(payload)
    batch = tmp_path / "batch"
    batch.write_text(f"put {tmp_path}/up.bin /home/work/up.bin\n"
                     f"get /home/work/up.bin {tmp_path}/down.bin\n")
    out = subprocess.run(["sftp", *SSH_OPTS, "-i", key, "-P", str(port), "-b", str(batch),
                          "work@127.0.0.1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "down.bin").read_bytes() == payload
    inside = subprocess.run(["docker", "exec", cid, "sha256sum", "/home/work/up.bin"],
                            capture_output=True, text=True, check=True).stdout
    assert inside.split()[0] == hashlib.sha256(payload).hexdigest()

    # Another user's derived key, and root, are refused.
    bob_key = _key_file(tmp_path, "bob", sshkeys.private_key(bob["secret_key"]))
    out = _ssh(bob_key, port, "hostname")
    assert out.returncode == 255 and "Permission denied" in out.stderr, (out.stdout, out.stderr)
    out = _ssh(key, port, "hostname", user="root")
    assert out.returncode == 255 and "Permission denied" in out.stderr, (out.stdout, out.stderr)

    # After the stop the port is closed, and the agent hands it out again (not leaked).
    _stop(hub, alice, sid)
    assert not _listening(port)
    assert containers_of(hub.agent_id) == []
    sid2 = _start(hub, alice, "ssh2")
    assert _ssh_ports(hub, alice, sid2)["sshd"]["port"] == port
    out = _ssh(key, port, "hostname")
    assert out.returncode == 0 and out.stdout.strip() == "main1", out.stderr
    _stop(hub, alice, sid2)
    assert not _listening(port)


def test_jupyter_server_gets_ssh_beside_its_own_port(ssh_hub, tmp_path):
    """An interactive session (a JupyterHub server): two host ports, Jupyter's and sshd's;
    both answer, and both go with the server."""
    hub = ssh_hub
    carol = new_user(hub)
    name = carol["username"]
    login = hub.login(carol["email"], "victim-pass-1")
    token = hub.token_for(login, name)
    r = hub.spawn(name, "term", token=token)
    assert r.status_code in (201, 202), r.text
    model = hub.wait_ready(name, "term", token=token)
    r = signed(hub, "GET", "/sessions", carol["access_key"], carol["secret_key"],
               query={"type": "interactive", "status": "RUNNING"})
    assert r.status_code == 200, r.text
    body = r.json()
    [sess] = body["items"] if isinstance(body, dict) else body
    tcp = _ssh_ports(hub, carol, sess["id"])
    port = tcp["sshd"]["port"]
    [cid] = containers_of(hub.agent_id)
    bindings = subprocess.run(
        ["docker", "inspect", "-f", "{{json .HostConfig.PortBindings}}", cid],
        capture_output=True, text=True, check=True).stdout
    assert sorted(json.loads(bindings)) == ["2200/tcp", "8888/tcp"], bindings
    assert json.loads(bindings)["8888/tcp"][0]["HostPort"] != str(port)
    r = signed(hub, "GET", f"/sessions/{sess['id']}/ssh-key", carol["access_key"],
               carol["secret_key"])
    assert r.status_code == 200, r.text
    key = _key_file(tmp_path, "carol", r.json()["private_key"])
    out = _ssh(key, port, "hostname")
    assert out.returncode == 0 and out.stdout.strip() == "main1", out.stderr
    # The Jupyter server still answers through the hub.
    r = requests.get(hub.base + model["url"] + "api/status",
                     headers={"Authorization": f"token {token}"}, timeout=60)
    assert r.status_code == 200, r.text

    # SSH counts as activity of the server (what jupyterhub-singleuser reports to the hub
    # for the idle timeout): with no connection open, a look of the image's check
    # (every SSH_ACTIVITY_INTERVAL = 10 s) leaves last_activity where it was; while an
    # ssh connection is open, it moves forward.
    def last_activity() -> dt.datetime:
        r = requests.get(hub.base + model["url"] + "api/status?no_track_activity=1",
                         headers={"Authorization": f"token {token}"}, timeout=60)
        assert r.status_code == 200, r.text
        return dt.datetime.fromisoformat(r.json()["last_activity"].replace("Z", "+00:00"))

    time.sleep(1)  # the hostname connection above is closed on both ends
    idle = last_activity()
    time.sleep(12)  # more than one check
    assert last_activity() == idle
    held = subprocess.Popen(["ssh", *SSH_OPTS, "-i", key, "-p", str(port), "work@127.0.0.1",
                             "sleep 40"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        moved = idle
        deadline = time.monotonic() + 30  # bounds a hang: 10 s checks
        while time.monotonic() < deadline and moved == idle:
            time.sleep(1)
            moved = last_activity()
        assert held.poll() is None, held.stderr.read()  # still connected throughout
        assert moved > idle, (idle, moved)
    finally:
        held.kill()
        held.wait()
    hub.stop_server(name, "term", token=token)
    assert not _listening(port)
    assert containers_of(hub.agent_id) == []


def _listens_in(cid: str, port: int) -> bool:
    """Whether anything in the container listens on ``port`` (its /proc/net/tcp*)."""
    out = subprocess.run(["docker", "exec", cid, "cat", "/proc/net/tcp", "/proc/net/tcp6"],
                         capture_output=True, text=True, check=True).stdout
    hexport = f":{port:04X}"
    return any(f.split()[1].endswith(hexport) and f.split()[3] == "0A"
               for f in out.splitlines()[1:] if len(f.split()) > 3 and ":" in f.split()[1])


def test_group_without_ssh_publishes_nothing_and_failed_starts_give_ports_back(
        docker_image, tmp_path):
    db_url = f"sqlite:///{tmp_path}/nossh.sqlite"

    async def run():
        async with running_manager(db_url, tmp_path, "docker", retries=1) as mgr:
            user = await make_user(mgr)
            agent = mgr.agent
            assert mgr.ssh_resource_groups == []  # off unless the operator opts in

            def batch(name):
                return mgr.enqueue(username=user, name=name, image=docker_image,
                                   slots=ResourceSlot(cpu=0.25, mem=256 * 2**20), environ={},
                                   service_prefix="/", session_type="batch",
                                   startup_command="sleep 600")

            sid = await batch("plain")
            sess = await wait_status(mgr, sid, ("RUNNING", "ERROR", "TERMINATED"))
            assert sess.status == "RUNNING", sess.status_info
            [k] = sess.kernels
            assert k.service_ports == []
            assert agent.ports.of[k.id] == []
            [cid] = containers_of(agent.agent_id)
            bindings = subprocess.run(
                ["docker", "inspect", "-f", "{{json .HostConfig.PortBindings}}", cid],
                capture_output=True, text=True, check=True).stdout.strip()
            assert bindings in ("{}", "null"), bindings
            assert not _listens_in(cid, 2200)
            await mgr.destroy_session(sid)

            # Opted in, but the container cannot start: the ports taken go back.
            mgr.ssh_resource_groups = ["default"]
            agent.impl.extra_host_config = {"CpusetCpus": "200-201"}
            sid = await batch("broken")
            sess = await wait_status(mgr, sid, ("ERROR", "RUNNING", "TERMINATED"))
            assert sess.status == "ERROR", sess.status_info
            assert "docker" in (sess.status_info or ""), sess.status_info
            assert agent.ports.used == set() and agent.ports.of == {}
            assert containers_of(agent.agent_id) == []

            # And with a container that starts, the same agent publishes the sshd.
            agent.impl.extra_host_config = {}
            sid = await batch("works")
            sess = await wait_status(mgr, sid, ("RUNNING", "ERROR", "TERMINATED"))
            assert sess.status == "RUNNING", sess.status_info
            [k] = sess.kernels
            assert [p["name"] for p in k.service_ports] == ["sshd", "sftp"]
            port = k.service_ports[0]["host_port"]
            assert agent.ports.used == {port}
            await mgr.destroy_session(sid)
            assert agent.ports.used == set()

    asyncio.run(run())
