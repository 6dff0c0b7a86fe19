"""Attacks on the agent's choice of backend and on the local backend (issue 10, rows 3
and 13), performed against real hubs, agents and processes.

Row 3: with the packaged ``auto`` backend and a Docker engine that does not answer,
kernels used to run as the hub's OS user (root) beside its database. Now ``auto``
never picks local processes when an engine is configured or the agent is root, and
the local backend runs kernels as an unprivileged user when the agent is root.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from jupyterhub_backendai.agent import backendchoice
from jupyterhub_backendai.agent.core import Agent
from jupyterhub_backendai.common.errors import AgentError
from jupyterhub_backendai.common.events import make_event_bus

from .conftest import _kill_local_kernels
from .hub import Hub
from .services import agent_id as new_agent_id

PREFIX = "/hub/api/backendai"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the agent must run as root")


def _agent(tmp_path, **traits) -> Agent:
    return Agent(make_event_bus(""), agent_id=new_agent_id("attack"),
                 state_dir=str(tmp_path / "agent"), **traits)


def test_auto_refuses_a_configured_engine_that_does_not_answer(tmp_path, monkeypatch):
    dead = f"unix://{tmp_path}/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", dead)
    agent = _agent(tmp_path, backend="auto", docker_wait=0.5)
    with pytest.raises(AgentError) as e:
        asyncio.run(agent._make_backend())
    assert f"the Docker engine at {dead} does not answer (waited 0.5 s)" in e.value.detail
    assert "Refusing to fall back to local processes" in e.value.detail
    assert not os.path.exists(tmp_path / "agent" / "local-kernels")


@root_only
def test_auto_never_picks_local_processes_as_root(tmp_path, monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(backendchoice, "DOCKER_SOCKET", str(tmp_path / "no-docker.sock"))
    agent = _agent(tmp_path, backend="auto")
    with pytest.raises(AgentError) as e:
        asyncio.run(agent._make_backend())
    assert "no Docker engine is configured" in e.value.detail
    assert "the agent runs as root" in e.value.detail


def test_local_kernel_user_is_never_root(tmp_path):
    for spec in ("0:0", "root", "1000:0"):
        with pytest.raises(AgentError) as e:
            backendchoice._parse_user(spec)
        assert "never run as root" in e.value.detail, spec
    with pytest.raises(AgentError) as e:
        backendchoice._parse_user("no-such-user-xyz")
    assert "neither uid:gid nor a user" in e.value.detail
    assert backendchoice._parse_user("1000:1000") == (1000, 1000)
    assert backendchoice._parse_user("nobody")[0] > 0


def test_a_hub_whose_engine_does_not_answer_runs_no_kernel(tmp_path):
    """The issue's attack: the packaged `auto` backend, Docker configured but silent.
    The hub says why in its log and runs nothing: no user gets in, no kernel starts."""
    hub = Hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="auto",
              extra_env={"DOCKER_HOST": f"unix://{tmp_path}/docker.sock"},
              extra_args=["--Agent.docker_wait=0"])
    try:
        hub.start()
        r = hub.login()
        assert "/hub/spawn" not in r.last_login.url and not r.cookies.get("jupyterhub-session-id")
        assert "Refusing to fall back to local processes" in hub.log()
        assert f"the Docker engine at unix://{tmp_path}/docker.sock does not answer" in hub.log()
        kernels = os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels")
        assert not os.path.isdir(kernels) or os.listdir(kernels) == []
    finally:
        hub.close()
        shutil.rmtree(hub.dir, ignore_errors=True)


SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's (scripts/install-test-deps.sh installs it)


@pytest.fixture(scope="module")
def unprivileged_python(tmp_path_factory):
    """An environment of this checkout on Debian's Python, in a folder uid 1000 can
    enter: this suite's own interpreter lives under /root (0700), where a kernel run as
    uid 1000 could not start it. Installed as the README says (not editable), with
    requirements/ci.txt's pins, but for those that need a newer Python than Debian's."""
    import subprocess

    top = tmp_path_factory.mktemp("unprivileged-python")
    for d in (top, *top.parents):
        if str(d) == "/":
            break
        os.chmod(d, os.stat(d).st_mode | 0o011)  # enter, not list
    venv = top / "venv"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pins = [ln for ln in open(os.path.join(repo, "requirements", "ci.txt")).read().splitlines()
            if not ln.startswith("soupsieve==")]  # (4.x needs Python >= 3.11.5)
    (top / "constraints.txt").write_text("\n".join(pins) + "\n")
    for cmd in (["uv", "venv", "-q", "--python", SYSTEM_PYTHON, str(venv)],
                ["uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                 "-c", str(top / "constraints.txt"), f"{repo}[local]"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout}\n{r.stderr}"
    return str(venv / "bin" / "python")


@pytest.fixture(scope="module")
def safe_local_hub(tmp_path_factory, unprivileged_python):
    """A hub (root) with the local backend in its safe default: kernels as uid 1000.
    Its working folders are where that user can go; its state directory (0700) not."""
    hub = Hub(db_url="sqlite:///", backend="local", python=unprivileged_python,
              extra_env={"BACKENDAI_UNSAFE_LOCAL_KERNELS_AS_ROOT": "0"})
    state = hub.env["BACKENDAI_STATE_DIR"]
    hub.db_url = hub.env["BACKENDAI_DB_URL"] = f"sqlite:///{state}/backendai.sqlite"
    os.chmod(hub.dir, 0o711)
    hub.extra_args += [f"--Agent.local_work_root={hub.dir}/kernels",
                       "--BackendAISpawner.home_folder="]
    hub.start()
    yield hub
    hub.close()
    _kill_local_kernels(os.path.join(state, "agent", "local-kernels"))
    shutil.rmtree(hub.dir, ignore_errors=True)


def _batch(hub: Hub, command: str) -> dict:
    h = {"Authorization": f"token {hub.admin_token}"}
    import requests

    body = {"name": "b-" + uuid.uuid4().hex[:8], "image": "local/python",
            "startup_command": command, "resources": {"cpu": "0.5", "mem": "128m"}}
    r = requests.post(hub.base + PREFIX + "/sessions", json=body, headers=h, timeout=60)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        s = requests.get(hub.base + PREFIX + f"/sessions/{sid}", headers=h, timeout=60).json()
        if s["status"] in ("TERMINATED", "ERROR", "CANCELLED"):
            logs = requests.get(hub.base + PREFIX + f"/sessions/{sid}/logs", headers=h,
                                timeout=60).json()
            s["logs"] = logs["kernels"][0]["logs"] or ""
            return s
        time.sleep(0.2)
    raise TimeoutError(f"batch session {sid} did not end\n" + hub.log()[-3000:])


@root_only
def test_local_batch_kernel_is_unprivileged_and_cannot_read_the_database(safe_local_hub):
    hub = safe_local_hub
    db = hub.db_url[len("sqlite:///"):]
    assert os.path.getsize(db) > 0
    s = _batch(hub, f"id -u; id -G; cat {db} > /dev/null && echo READ-DB || echo NO-DB; "
                    f"ls {os.path.dirname(db)} > /dev/null && echo LIST-STATE || echo NO-STATE")
    assert s["status"] == "TERMINATED", (s["status_info"], s["logs"])
    lines = [ln.strip() for ln in s["logs"].splitlines()
             if ln.strip() and not ln.startswith(("cat:", "ls:"))]
    assert lines == ["1000", "1000", "NO-DB", "NO-STATE"], s["logs"]
    # The hub's log says what the kernels are.
    assert "local backend: kernels are NOT isolated" in hub.log()
    assert "UNSAFE" not in hub.log()


@root_only
def test_local_server_runs_unprivileged(safe_local_hub):
    from jupyterhub_backendai.agent.backends.local import unreachable

    hub = safe_local_hub
    assert unreachable(os.path.realpath(hub.python), 1000, 1000) is None
    assert unreachable(os.path.dirname(hub.python), 1000, 1000) is None
    r = hub.spawn("admin", "srv")
    # (Seen twice under heavy load: a 500. Say why next time.)
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{hub.log()[-4000:]}"
    try:
        hub.wait_ready("admin", "srv")
        states = os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels")
        (state,) = [f for f in os.listdir(states) if f.endswith(".json")]
        import json

        with open(os.path.join(states, state)) as f:
            pid = int(json.load(f)["container_id"])
        with open(f"/proc/{pid}/status") as f:
            ids = {ln.split(":")[0]: ln.split()[1:] for ln in f if ln.startswith(("Uid", "Gid", "Groups"))}
        assert ids["Uid"] == ["1000"] * 4 and ids["Gid"] == ["1000"] * 4 and ids["Groups"] == []
        workdir = os.path.join(hub.dir, "kernels", "admin")
        st = os.stat(workdir)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1000, 1000, 0o700)
    finally:
        hub.stop_server("admin", "srv")


@root_only
def test_local_kernel_refused_where_its_user_cannot_go(tmp_path):
    """The packaged layout keeps working folders in the 0700 state directory: a kernel
    is refused with the reason, never started as root."""
    hub = Hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="local",
              extra_env={"BACKENDAI_UNSAFE_LOCAL_KERNELS_AS_ROOT": "0"})
    try:
        hub.start()
        s = _batch(hub, "id -u")
        assert s["status"] == "ERROR", s
        assert "kernels run as uid 1000 (Agent.local_kernel_user), which cannot enter" in \
            str(s["status_info"]), s["status_info"]
    finally:
        hub.close()
        _kill_local_kernels(os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels"))
        shutil.rmtree(hub.dir, ignore_errors=True)


# -- secrets in --help-all (row 13) -------------------------------------------------


def test_agent_help_all_prints_no_secret():
    secret = "pw-" + uuid.uuid4().hex
    env = dict(os.environ, BACKENDAI_REDIS_URL=f"redis://:{secret}@127.0.0.1:6379/0",
               BACKENDAI_AGENT_TOKEN="tok-" + secret)
    exe = os.path.join(os.path.dirname(sys.executable), "backendai-agent")
    r = subprocess.run([exe, "--help-all"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "AgentApp.redis_url" in r.stdout and "AgentApp.token" in r.stdout
    assert secret not in r.stdout + r.stderr
