"""Issue 22: an SSH key derived from a keypair dies with that keypair's access.

A real hub (Docker backend, its "default" group offers SSH) runs a user's JupyterHub
server; the owner is logged in with real ``ssh``. An admin then deactivates the keypair
(first case, through the admin API) or the user (second case, straight in the
database: the API's deactivation of a user ends its sessions altogether). Within seconds a new
login is refused ("Permission denied"), the open connection is closed, and the session
keeps running: its Jupyter server still answers. A reactivated keypair does not give
the running session its key back; a new session of the active keypair gets SSH again.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time

import requests

from .conftest import containers_of
from .test_attacks_api import new_user
from .test_signing import signed
from .test_ssh_port import SSH_OPTS, _key_file, _ssh, _ssh_ports, _start, _stop
from .test_ssh_port import ssh_hub as ssh_hub  # noqa: F401 (the module's hub)

BOUND = 20  # seconds: a bound for hangs; the handler looks every 2 s


def _serve(hub, user: dict, tmp_path):
    """The user's JupyterHub server with SSH: (token, model, session, key file, port)."""
    name = user["username"]
    login = hub.login(user["email"], "victim-pass-1")
    token = hub.token_for(login, name)
    r = hub.spawn(name, "term", token=token)
    assert r.status_code in (201, 202), r.text
    model = hub.wait_ready(name, "term", token=token)
    r = signed(hub, "GET", "/sessions", user["access_key"], user["secret_key"],
               query={"type": "interactive", "status": "RUNNING"})
    assert r.status_code == 200, r.text
    body = r.json()
    [sess] = body["items"] if isinstance(body, dict) else body
    port = _ssh_ports(hub, user, sess["id"])["sshd"]["port"]
    r = signed(hub, "GET", f"/sessions/{sess['id']}/ssh-key", user["access_key"],
               user["secret_key"])
    assert r.status_code == 200, r.text
    key = _key_file(tmp_path, name, r.json()["private_key"])
    out = _ssh(key, port, "hostname")
    assert out.returncode == 0 and out.stdout.strip() == "main1", out.stderr
    return token, model, sess["id"], key, port


def _hold(key: str, port: int) -> subprocess.Popen:
    """An open ssh connection running a command (what a logged-in user has)."""
    held = subprocess.Popen(["ssh", *SSH_OPTS, "-i", key, "-p", str(port), "work@127.0.0.1",
                             "echo in; sleep 300"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert held.stdout.readline().strip() == "in", held.stderr.read()
    return held


def _cut_off(hub, key: str, port: int, held: subprocess.Popen, since: float) -> float:
    """Wait until a new login is refused and the held connection is closed; the seconds
    from ``since`` until both were so."""
    deadline = since + BOUND
    refused = False
    while time.monotonic() < deadline:
        out = _ssh(key, port, "hostname")
        if out.returncode == 255 and "Permission denied" in out.stderr:
            refused = True
            break
        # Still let in (not withdrawn yet), or cut off while logging in (the withdrawal
        # ends every connection it cannot tell apart): try again.
        assert out.returncode in (0, 255), (out.returncode, out.stderr)
        time.sleep(0.5)
    assert refused, f"ssh still let in {BOUND} s after the change\n{hub.log()[-3000:]}"
    try:
        held.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        held.kill()
        raise AssertionError("the open ssh connection was not closed") from None
    took = time.monotonic() - since
    # and it stays so
    out = _ssh(key, port, "hostname")
    assert out.returncode == 255 and "Permission denied" in out.stderr, (out.stdout, out.stderr)
    return took


def _still_runs(hub, sid: str) -> None:
    s = signed(hub, "GET", f"/sessions/{sid}", *hub.admin_keys).json()
    assert s["status"] == "RUNNING", s
    [cid] = containers_of(hub.agent_id)
    state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", cid],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert state == "true"
    # The sshd no longer appears among the session's ports (the record's mark).
    r = signed(hub, "GET", f"/sessions/{sid}/service-ports", *hub.admin_keys)
    assert r.status_code == 200, r.text
    assert not [p for p in r.json()["service_ports"] if p["protocol"] == "tcp"], r.text


def _jupyter_port(cid: str) -> int:
    bindings = json.loads(subprocess.run(
        ["docker", "inspect", "-f", "{{json .HostConfig.PortBindings}}", cid],
        capture_output=True, text=True, check=True).stdout)
    return int(bindings["8888/tcp"][0]["HostPort"])


def test_deactivated_keypair_loses_ssh_but_keeps_its_session(ssh_hub, tmp_path):
    hub = ssh_hub
    alice = new_user(hub)
    token, model, sid, key, port = _serve(hub, alice, tmp_path)
    held = _hold(key, port)

    since = time.monotonic()
    r = signed(hub, "PATCH", f"/keypairs/{alice['access_key']}", *hub.admin_keys,
               json={"is_active": False})
    assert r.status_code == 200, r.text
    took = _cut_off(hub, key, port, held, since)
    print(f"keypair deactivated: ssh refused and the connection closed after {took:.1f} s")

    # The session runs on, and its Jupyter server answers through the hub (the user's
    # JupyterHub token is the user's, not the keypair's).
    _still_runs(hub, sid)
    r = requests.get(hub.base + model["url"] + "api/status",
                     headers={"Authorization": f"token {token}"}, timeout=60)
    assert r.status_code == 200, r.text

    # Reactivated: the running session does not get the key back.
    r = signed(hub, "PATCH", f"/keypairs/{alice['access_key']}", *hub.admin_keys,
               json={"is_active": True})
    assert r.status_code == 200, r.text
    time.sleep(5)  # more than two looks of the handler
    out = _ssh(key, port, "hostname")
    assert out.returncode == 255 and "Permission denied" in out.stderr, (out.stdout, out.stderr)
    r = signed(hub, "GET", f"/sessions/{sid}/ssh-key", alice["access_key"], alice["secret_key"])
    assert r.status_code == 404, r.text
    hub.stop_server(alice["username"], "term", token=token)
    assert containers_of(hub.agent_id) == []

    # A new session of the active keypair gets SSH with the same key, as before.
    sid2 = _start(hub, alice, "again")
    port2 = _ssh_ports(hub, alice, sid2)["sshd"]["port"]
    out = _ssh(key, port2, "hostname")
    assert out.returncode == 0 and out.stdout.strip() == "main1", out.stderr
    _stop(hub, alice, sid2)


def test_user_deactivated_outside_the_api_loses_ssh_but_keeps_its_session(ssh_hub, tmp_path):
    """The user's status changed straight in the database (SQL, as a script or another
    tool would; the admin API's deactivation ends the user's sessions altogether): the
    handler reads the record, so the key goes all the same."""
    hub = ssh_hub
    bob = new_user(hub)
    _token, model, sid, key, port = _serve(hub, bob, tmp_path)
    held = _hold(key, port)

    since = time.monotonic()
    db = sqlite3.connect(hub.db_url.removeprefix("sqlite:///"), timeout=30)
    with db:
        assert db.execute("UPDATE users SET status = 'inactive' WHERE id = ?",
                          (bob["id"],)).rowcount == 1
    db.close()
    took = _cut_off(hub, key, port, held, since)
    print(f"user deactivated (SQL): ssh refused and the connection closed after {took:.1f} s")

    # The session runs on; its Jupyter server answers on its port (straight: the hub
    # no longer lets an inactive user through).
    _still_runs(hub, sid)
    [cid] = containers_of(hub.agent_id)
    r = requests.get(f"http://127.0.0.1:{_jupyter_port(cid)}{model['url']}api", timeout=30)
    assert r.status_code == 200 and "version" in r.json(), r.text
    _stop(hub, {"access_key": hub.admin_keys[0], "secret_key": hub.admin_keys[1]}, sid)
    assert containers_of(hub.agent_id) == []
