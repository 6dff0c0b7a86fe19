"""The whole path: login -> spawn -> the server in a kernel container -> code runs -> stop.

Runs with the Docker backend (real engine, real kernel image) and the local-process
backend, each on SQLite and PostgreSQL, through a real hub and configurable-http-proxy.
"""

from __future__ import annotations

import subprocess

from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .conftest import containers_of
from .kernel_client import execute, lab_page_config


def _agent_row(hub):
    from jupyterhub_backendai.models import Agent

    engine = make_engine(hub.db_url)
    try:
        with make_sessionmaker(engine)() as s:
            a = s.get(Agent, hub.agent_id)
            return a.occupied_slots.nonzero(), a.available_slots
    finally:
        engine.dispose()


def test_login_spawn_execute_stop(make_hub, db_url, backend):
    hub = make_hub(db_url=db_url, backend=backend)
    s = hub.login()
    assert s.last_login.url.endswith("/hub/spawn"), s.last_login.url
    token = hub.admin_token

    r = hub.spawn("admin", "e2e")
    assert r.status_code in (201, 202), r.text
    model = hub.wait_ready("admin", "e2e")
    prefix = model["url"]
    assert prefix == "/user/admin/e2e/"

    status = hub_get(hub, prefix + "api/status", token)
    assert status.status_code == 200, status.text
    assert "started" in status.json()

    assert execute(hub.base, prefix, token, "1+1") == "2"
    # JupyterLab's news plugin is off (c.BackendAISpawner.jupyterlab_news, default): no
    # "Would you like to get notified about official Jupyter news?" popup. In Docker
    # sessions it used to be on: jupyterhub-singleuser replaced the image's page hook.
    config = lab_page_config(hub_get(hub, prefix + "lab", token))
    disabled = config["disabledExtensions"]
    assert "@jupyterlab/apputils-extension:announcements" in disabled, disabled
    if backend == "docker":
        # The image's extension manager lists and installs nothing from PyPI: its
        # environment is read-only to the user, and the server runs without the user's
        # site, so an extension pip put in ~/.local would never load.
        manager = config["extensionManager"]
        assert (manager["name"], manager["can_install"]) == ("read-only", False), manager
    who = execute(hub.base, prefix, token, "import getpass, os; print(getpass.getuser(), os.getcwd())")
    user, cwd = who.split()
    if backend == "docker":
        assert (user, cwd) == ("work", "/home/work")
        cids = containers_of(hub.agent_id)
        assert len(cids) == 1
        labels = subprocess.run(
            ["docker", "inspect", "-f", "{{json .Config.Labels}}", cids[0]],
            capture_output=True, text=True, check=True,
        ).stdout
        assert "ai.backend.session-id" in labels and '"ai.backend.owner":"admin"' in labels
        limits = subprocess.run(
            ["docker", "inspect", "-f", "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}", cids[0]],
            capture_output=True, text=True, check=True,
        ).stdout.split()
        assert limits == [str(500_000_000), str(512 * 2**20)]
    occupied, _ = _agent_row(hub)
    assert occupied == {"cpu": 0.5, "mem": 512 * 2**20}

    hub.stop_server("admin", "e2e")
    if backend == "docker":
        assert containers_of(hub.agent_id) == []
    occupied, _ = _agent_row(hub)
    assert occupied == {}


def hub_get(hub, path, token):
    import requests

    return requests.get(hub.base + path, headers={"Authorization": f"token {token}"}, timeout=30)
