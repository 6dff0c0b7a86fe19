"""The README's path without Docker, as root (issue 29 point 8): the local backend runs
kernels as uid 1000, and the hub's Python environment lies where that user cannot go.

A Jupyter server's start then fails the same way however often it is tried. The
refusal says which file is out of reach and what to do, comes before any process is
started, and the session ends at once in ERROR instead of being retried.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
import time

import pytest
import requests

from jupyterhub_backendai.agent.backends.local import cannot_run

from .conftest import _kill_local_kernels
from .hub import Hub

PREFIX = "/hub/api/backendai"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the agent must run as root")


def _hidden_interpreter_env(top: str) -> str:
    """A virtual environment at ``top/venv`` that uid 1000 may enter, whose ``python``
    is a link through ``top/private`` (0700, root's) to this suite's interpreter: as a
    Python installed under /root looks to that user. Its packages are this suite's
    (a ``.pth`` adds them). Returns its ``python``."""
    os.makedirs(top)
    for d in (top, *_parents(top)):
        os.chmod(d, os.stat(d).st_mode | 0o011)  # enter, not list
    real = os.path.realpath(sys.executable)
    private = os.path.join(top, "private")
    os.makedirs(private, mode=0o700)
    os.symlink(real, os.path.join(private, "python"))
    venv = os.path.join(top, "venv")
    bin_ = os.path.join(venv, "bin")
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = os.path.join(venv, "lib", ver, "site-packages")
    os.makedirs(bin_)
    os.makedirs(site)
    for d in (venv, bin_, os.path.dirname(site), site):
        os.chmod(d, 0o755)
    with open(os.path.join(venv, "pyvenv.cfg"), "w") as f:
        f.write(f"home = {os.path.dirname(real)}\ninclude-system-site-packages = false\n"
                f"version = {sys.version.split()[0]}\n")
    with open(os.path.join(site, "suite.pth"), "w") as f:
        f.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    python = os.path.join(bin_, "python")
    os.symlink(os.path.join(private, "python"), python)
    with open(shutil.which("jupyterhub-singleuser", path=os.path.dirname(sys.executable))) as f:
        body = f.read().split("\n", 1)[1]
    script = os.path.join(bin_, "jupyterhub-singleuser")
    with open(script, "w") as f:
        f.write(f"#!{python}\n{body}")
    os.chmod(script, 0o755)
    return python


def _parents(path: str):
    d = os.path.dirname(path)
    while d and d != "/":
        yield d
        d = os.path.dirname(d)


def _session_of(hub: Hub, name: str) -> dict | None:
    r = requests.get(hub.base + PREFIX + "/sessions", headers={
        "Authorization": f"token {hub.admin_token}"}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    items = body["items"] if isinstance(body, dict) else body
    return next((s for s in items if s["name"] == name), None)


@root_only
def test_a_server_whose_interpreter_uid_1000_cannot_reach_fails_once_saying_why():
    # Not under pytest's base directory, which another pytest run starting on this
    # machine makes 0700 again.
    top = tempfile.mkdtemp(prefix="bai-interp-")
    python = _hidden_interpreter_env(os.path.join(top, "env"))
    script = os.path.join(os.path.dirname(python), "jupyterhub-singleuser")
    private = os.path.join(top, "env", "private")
    # The set-up is what the issue describes: the script is in reach, its interpreter not.
    assert cannot_run(script, 1000, 1000) == (
        f"its interpreter {python} lies under {private}, which that user cannot enter "
        f"({private}/python)")
    hub = Hub(db_url="sqlite:///", backend="local", python=python,
              extra_env={"BACKENDAI_UNSAFE_LOCAL_KERNELS_AS_ROOT": "0"})
    state = hub.env["BACKENDAI_STATE_DIR"]
    hub.db_url = hub.env["BACKENDAI_DB_URL"] = f"sqlite:///{state}/backendai.sqlite"
    os.chmod(hub.dir, 0o711)
    hub.extra_args += [f"--Agent.local_work_root={hub.dir}/kernels",
                       "--BackendAISpawner.home_folder="]
    try:
        hub.start()
        advice = ("local backend: kernels run as uid 1000 (Agent.local_kernel_user), which "
                  f"cannot start {script}: its interpreter {python} lies under {private}")
        # Said when the agent starts, before anyone asks for a server.
        deadline = time.monotonic() + 60
        while advice not in hub.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert advice in hub.log(), hub.log()[-4000:]
        r = hub.spawn("admin", "srv")
        assert r.status_code in (201, 202, 500), r.text
        deadline = time.monotonic() + 120
        s = None
        while time.monotonic() < deadline:
            s = _session_of(hub, "srv")
            if s and s["status"] in ("ERROR", "TERMINATED", "CANCELLED"):
                break
            time.sleep(0.2)
        assert s and s["status"] == "ERROR", (s, hub.log()[-4000:])
        info = s["status_info"]
        assert info.startswith("failed to start: " + advice), info
        assert "/opt/backendai/bin/pip install '.[local]'" in info
        assert "attempts" not in info  # ended at its first try
        log = hub.log()
        assert log.count(f"session {s['id']} failed to start") == 1, log[-4000:]
        assert "retry 1 of" not in log
        # Refused before a process was started: no kernel state, no kernel log.
        kernels = os.path.join(state, "agent", "local-kernels")
        assert not os.path.isdir(kernels) or os.listdir(kernels) == []
        # JupyterHub's view: the server did not start, and its error is the advice.
        assert hub.server_model("admin", "srv") is None
    finally:
        hub.close()
        _kill_local_kernels(os.path.join(state, "agent", "local-kernels"))
        shutil.rmtree(hub.dir, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)
