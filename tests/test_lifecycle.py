"""Sessions outlive hub restarts; requests beyond capacity wait PENDING and start later."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit

import requests
from sqlalchemy import select

from jupyterhub_backendai.manager.scheduler import check_consistency
from jupyterhub_backendai.models import Agent, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .conftest import containers_of


def _db(hub):
    return make_sessionmaker(make_engine(hub.db_url))


def _status(sm, name):
    with sm() as s:
        row = s.scalar(select(Session).where(Session.name == name).order_by(Session.created_at.desc()))
        return (row.status, row.status_info) if row else (None, None)


def test_hub_restart_keeps_running_session(make_hub, db_url, docker_image):
    hub = make_hub(db_url=db_url, backend="docker")
    assert hub.spawn("admin", "keep").status_code in (201, 202)
    hub.wait_ready("admin", "keep")
    before = containers_of(hub.agent_id)
    assert len(before) == 1

    hub.stop_hub()
    assert containers_of(hub.agent_id) == before  # the session outlives the hub
    # While the hub starts again, its running kernel may call the hub's API at the agent
    # network's gateway (a user's request to their server checks its token there). The
    # gateway must take connections no later than loopback does: CI once saw the hub
    # answer on loopback while the gateway still refused ("Failed to connect to Hub API").
    env = json.loads(subprocess.run(["docker", "inspect", before[0]], capture_output=True,
                                    text=True, check=True).stdout)[0]["Config"]["Env"]
    api = urlsplit(dict(e.split("=", 1) for e in env)["JUPYTERHUB_API_URL"])
    first = _first_connect(("127.0.0.1", api.port), (api.hostname, api.port), hub.start)
    assert first[1] is not None and first[1] <= first[0], first

    model = hub.server_model("admin", "keep")
    assert model is not None and model["ready"], model
    r = requests.get(hub.base + "/user/admin/keep/api/status",
                     headers={"Authorization": f"token {hub.admin_token}"}, timeout=30)
    assert r.status_code == 200, r.text
    assert containers_of(hub.agent_id) == before
    hub.stop_server("admin", "keep")
    assert containers_of(hub.agent_id) == []


def _first_connect(loopback, gateway, during):
    """Run ``during()`` while probing two addresses every few milliseconds; the
    monotonic times each first took a connection (None: never)."""
    first = [None, None]
    stop = threading.Event()

    def probe():
        while not stop.is_set() and None in first:
            for i, addr in enumerate((loopback, gateway)):
                if first[i] is None:
                    try:
                        socket.create_connection(addr, timeout=0.5).close()
                        first[i] = time.monotonic()
                    except OSError:
                        pass
            time.sleep(0.003)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    try:
        during()
    finally:
        stop.set()
        t.join()
    return first


def _first_progress_messages(hub, server, n=3, timeout=20):
    url = hub.base + f"/hub/api/users/admin/servers/{server}/progress"
    msgs = []
    with requests.get(url, headers={"Authorization": f"token {hub.admin_token}"},
                      stream=True, timeout=timeout) as r:
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                msgs.append(json.loads(line[5:])["message"])
                if len(msgs) >= n or "pending" in msgs[-1]:
                    break
    return msgs


def test_over_capacity_waits_pending_then_starts(make_hub, db_url, docker_image):
    hub = make_hub(db_url=db_url, backend="docker", slots={"cpu": 1, "mem": "8g"})
    sm = _db(hub)
    for name in ("one", "two"):
        assert hub.spawn("admin", name).status_code in (201, 202)
    hub.wait_ready("admin", "one")
    hub.wait_ready("admin", "two")

    r = hub.spawn("admin", "three")
    assert r.status_code == 202, r.text  # accepted, not failed
    msgs = _first_progress_messages(hub, "three")
    assert any("pending" in m and "waiting for resources" in m for m in msgs), msgs
    time.sleep(3)  # several scheduler passes
    status, info = _status(sm, "three")
    assert status == "PENDING" and "cpu=0.5" in info, (status, info)
    model = hub.server_model("admin", "three")
    assert model["pending"] == "spawn" and not model["ready"]
    assert len(containers_of(hub.agent_id)) == 2

    hub.stop_server("admin", "one")
    hub.wait_ready("admin", "three", timeout=60)
    assert _status(sm, "three")[0] == "RUNNING"
    with sm() as s:
        agent = s.get(Agent, hub.agent_id)
        assert agent.occupied_slots.nonzero() == {"cpu": 1, "mem": 2**30}
    assert check_consistency(sm) == []
    for name in ("two", "three"):
        hub.stop_server("admin", name)
    assert containers_of(hub.agent_id) == []
    with sm() as s:
        assert s.get(Agent, hub.agent_id).occupied_slots.nonzero() == {}


def test_pending_spawn_times_out_and_leaves_nothing(make_hub, db_url, docker_image):
    hub = make_hub(db_url=db_url, backend="docker", slots={"cpu": 0.5, "mem": "8g"},
                   extra_env={"BACKENDAI_START_TIMEOUT": "12"})
    sm = _db(hub)
    # The agent's capacity is taken by a batch session (not a server of JupyterHub's,
    # whose own start would have to beat the 12 s start timeout on a loaded machine).
    r = hub.api("POST", "/backendai/sessions", json={
        "name": "first", "image": hub.image, "startup_command": "sleep 600",
        "resources": {"cpu": "0.5", "mem": "256m"}})
    assert r.status_code == 201, r.text
    first = r.json()["id"]
    deadline = time.monotonic() + 180
    while _status(sm, "first")[0] != "RUNNING":
        assert time.monotonic() < deadline, _status(sm, "first")
        time.sleep(0.3)
    assert hub.spawn("admin", "late").status_code == 202
    deadline = time.monotonic() + 45
    while hub.server_model("admin", "late") is not None and time.monotonic() < deadline:
        time.sleep(0.3)
    assert hub.server_model("admin", "late") is None
    assert _status(sm, "late")[0] == "CANCELLED"
    assert len(containers_of(hub.agent_id)) == 1
    assert check_consistency(sm) == []
    assert hub.api("DELETE", f"/backendai/sessions/{first}").status_code in (200, 202, 204)
