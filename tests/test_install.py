"""What the README says, literally: build the package, install it (not editable) into a
fresh virtual environment, start ``backendai-hub`` with the state directory and port
from the documented knobs, log in, spawn, and reach the server's ``/api/status``
through the proxy. Once from the wheel and once from the sdist.

- wheel: the packaged default URL form, ``http://localhost:<port>/``: servers live on
  their own origin ``http://<user>.localhost:<port>/user/<user>/`` (subdomains), on the
  Docker backend.
- sdist: ``http://127.0.0.1:<port>/`` (an IP address: no subdomains, the hub warns at
  start), on the local backend from the ``[local]`` extra: JupyterLab loads.

Both check what the state directory looks like afterwards (0700, databases 0600) and that
the first superadmin's secret key never reached the hub's output.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest
import requests

from .chromium import chromium as launch_chromium
from .conftest import _kill_local_kernels, containers_of
from .hub import CHP, KERNEL_IMAGE, REPO, Hub
from .services import wait_port

UV = shutil.which("uv")
CONSTRAINTS = os.path.join(REPO, "requirements", "ci.txt")
ENV_PY = "jupyterhub_backendai/models/migrations/env.py"


def _uv(*args: str, cwd: str | None = None) -> None:
    r = subprocess.run([UV, *args], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, f"uv {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"


def _package_files() -> set[str]:
    """The package's files in the checkout: tracked and new (not ignored) ones."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "jupyterhub_backendai"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split("\n")
    return {p for p in out if p and os.path.isfile(os.path.join(REPO, p))}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, str]:
    """A wheel and an sdist built (``uv build``) from a clean copy of the checkout."""
    assert UV, "uv is missing (scripts/install-test-deps.sh installs it)"
    top = tmp_path_factory.mktemp("build")
    src = top / "src"
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split("\n")
    for rel in files:
        if rel and os.path.isfile(os.path.join(REPO, rel)):
            os.makedirs(src / os.path.dirname(rel), exist_ok=True)
            shutil.copy2(os.path.join(REPO, rel), src / rel)
    dist = top / "dist"
    # The sdist, and a wheel straight from the tree (the sdist's own wheel is built when
    # it is installed below).
    _uv("build", "-q", "--sdist", "--wheel", "--out-dir", str(dist),
        "--build-constraint", CONSTRAINTS, str(src))
    (wheel,) = [str(p) for p in dist.glob("*.whl")]
    (sdist,) = [str(p) for p in dist.glob("*.tar.gz")]
    return {"wheel": wheel, "sdist": sdist}


def test_wheel_and_sdist_carry_every_package_file(artifacts):
    expected = _package_files()
    assert ENV_PY in expected
    wheel = set(zipfile.ZipFile(artifacts["wheel"]).namelist())
    with tarfile.open(artifacts["sdist"]) as t:
        sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert sorted(expected - wheel) == []
    assert sorted(expected - sdist) == []
    # Nothing but the package (and its metadata) in the wheel; no compiled leftovers.
    assert {n.split("/")[0] for n in wheel} == {
        "jupyterhub_backendai", "jupyterhub_backendai-0.1.0.dist-info"}
    assert not [n for n in wheel | sdist if n.endswith(".pyc") or "__pycache__" in n]


class InstalledHub(Hub):
    """The README's start command, ``backendai-hub``, from a fresh virtual environment,
    run in an empty directory (so nothing is imported from the checkout)."""

    def __init__(self, venv: str, *, host: str, backend: str):
        super().__init__(db_url="sqlite://", backend=backend)
        self.venv = venv
        self.host = host
        self.base = f"http://{host}:{self.port}"
        for k in ("PYTHONPATH", "VIRTUAL_ENV", "BACKENDAI_DB_URL", "BACKENDAI_SUBDOMAIN_HOST"):
            self.env.pop(k, None)  # the database: the default one in the state directory
        self.env["BACKENDAI_HUB_URL"] = self.base + "/"
        self.env["PATH"] = os.path.join(venv, "bin") + os.pathsep + self.env.get("PATH", "")
        self.state = self.env["BACKENDAI_STATE_DIR"]

    def start(self) -> InstalledHub:
        log = open(os.path.join(self.dir, "hub.log"), "ab")
        self.proc = subprocess.Popen([os.path.join(self.venv, "bin", "backendai-hub")],
                                     env=self.env, cwd=self.dir, stdout=log, stderr=log,
                                     start_new_session=True)
        wait_port(self.port, timeout=60, proc=self.proc)
        # The proxy answers before the hub has added its route.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = requests.get(f"http://127.0.0.1:{self.port}/hub/api/", timeout=30)
            if r.status_code == 200:
                return self
            time.sleep(0.1)
        raise TimeoutError("hub did not answer\n" + self.log())

    def login(self, email=None, password=None) -> requests.Session:
        s = super().login(*(a for a in (email, password) if a))
        # JupyterHub sets its session-id cookie for the whole domain (Domain=localhost)
        # so that it reaches the users' subdomains; Python's cookie jar files a dotless
        # host as "localhost.local" and would not send it back. Browsers do.
        for ck in list(s.cookies):
            if ck.domain == "." + self.host:
                s.cookies.set(ck.name, ck.value, domain=self.host + ".local", path=ck.path)
        return s

    def close(self) -> None:
        super().close()
        if self.backend == "docker":
            left = containers_of(self.agent_id)
            if left:
                subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
        else:
            _kill_local_kernels(os.path.join(self.state, "agent", "local-kernels"))
        shutil.rmtree(self.dir, ignore_errors=True)


CASES = {
    # artifact: (hub host, backend, image)
    "wheel": ("localhost", "docker", KERNEL_IMAGE),
    "sdist": ("127.0.0.1", "local", "local/python"),
}


@pytest.fixture(params=list(CASES))
def case(request):
    if CASES[request.param][1] == "docker":
        request.getfixturevalue("docker_image")
    return request.param


def test_readme_install_and_start(case, artifacts, tmp_path):
    host, backend, image = CASES[case]
    venv = str(tmp_path / "venv")
    _uv("venv", "-q", "--python", sys.executable, venv)
    py = os.path.join(venv, "bin", "python")
    # `pip install '.[local]'`, from the artifact; the pinned versions as constraints.
    _uv("pip", "install", "-q", "--python", py, "-c", CONSTRAINTS,
        "--build-constraint", CONSTRAINTS, artifacts[case] + "[local]")
    where = subprocess.run(
        [py, "-c", "import jupyterhub_backendai, os; print(os.path.dirname(jupyterhub_backendai.__file__))"],
        cwd=str(tmp_path), capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(venv + "/lib/"), where  # the installed copy, not the checkout
    assert os.path.isfile(os.path.join(os.path.dirname(where), ENV_PY))
    assert os.path.isfile(os.path.join(venv, "bin", "jupyterhub-singleuser"))
    assert os.path.isfile(os.path.join(venv, "bin", "jupyter-lab"))

    assert os.path.exists(CHP), "configurable-http-proxy missing: run `npm ci`"
    hub = InstalledHub(venv, host=host, backend=backend)
    try:
        hub.start()
        out = hub.log()
        assert f"log in at http://{host}:{hub.port}/hub/login as admin@example.com" in out

        # The first superadmin's keys: in a 0600 file (the output is not a terminal), never
        # in the hub's output.
        with open(os.path.join(hub.state, "first-superadmin.json")) as f:
            first = json.load(f)
        assert first["email"] == "admin@example.com" and len(first["secret_key"]) == 40
        assert stat.S_IMODE(os.stat(os.path.join(hub.state, "first-superadmin.json")).st_mode) == 0o600

        s = hub.login()
        assert s.last_login.status_code == 200, s.last_login.text[-2000:]
        assert s.cookies.get("jupyterhub-hub-login", path="/hub/")
        token = hub.token_for(s, "admin")
        r = hub.api("POST", "/users/admin/server", token=token,
                    json={"image": image, "cpu": "0.5", "mem": "512m"})
        assert r.status_code in (201, 202), r.text
        model = hub.wait_ready("admin", "", token=token)
        auth = {"Authorization": f"token {token}"}
        raw = f"http://127.0.0.1:{hub.port}"
        if host == "localhost":
            # One origin per user: the server lives on admin.localhost (browsers resolve
            # *.localhost to loopback; here the Host header says it).
            assert model["url"] == f"http://admin.localhost:{hub.port}/user/admin/"
            user_host = {"Host": f"admin.localhost:{hub.port}"}
            r = requests.get(raw + "/user/admin/api/status", headers={**auth, **user_host},
                             timeout=30)
            assert r.status_code == 200, r.text
            assert "started" in r.json()
            # The hub's own host does not serve it: the proxy hands the path to the hub.
            r = requests.get(hub.base + "/user/admin/api/status", headers=auth,
                             allow_redirects=False, timeout=30)
            assert r.status_code == 302
            assert r.headers["Location"] == f"{hub.base}/hub/user/admin/api/status"
            assert "No subdomains" not in hub.log()
        else:
            assert model["url"] == "/user/admin/"
            r = requests.get(raw + "/user/admin/api/status", headers=auth, timeout=30)
            assert r.status_code == 200, r.text
            assert "started" in r.json()
            r = requests.get(raw + "/user/admin/lab", headers=auth, timeout=60)
            assert r.status_code == 200 and "JupyterLab" in r.text, r.text[:500]
            assert "No subdomains (JupyterHub.subdomain_host is empty" in hub.log()
            assert "docs/security.md" in hub.log()

        mode = lambda p: stat.S_IMODE(os.stat(os.path.join(hub.state, p)).st_mode)  # noqa: E731
        assert mode(".") == 0o700
        for name in ("backendai.sqlite", "jupyterhub.sqlite", "jupyterhub_cookie_secret",
                     "installation-id", "hub.lock"):
            assert mode(name) == 0o600, name
        # Both databases in WAL (docs/architecture.md "Seams"), their logs as private.
        for name in ("backendai.sqlite", "jupyterhub.sqlite"):
            db = sqlite3.connect(f"file:{os.path.join(hub.state, name)}?mode=ro", uri=True)
            try:
                assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal", name
            finally:
                db.close()
            assert mode(name + "-wal") == 0o600, name
        hub.stop_server("admin", "", token=token)
        assert first["secret_key"] not in hub.log()
    finally:
        hub.close()


def test_state_dir_private_for_plain_jupyterhub_f(tmp_path):
    """`jupyterhub -f` with the packaged config alone (no launcher) makes the state
    directory and its files private too, even under a permissive umask."""
    from jupyterhub_backendai import launcher

    state = tmp_path / "state"
    os.makedirs(state, mode=0o755)
    os.chmod(state, 0o755)
    db = f"sqlite:///{state}/backendai.sqlite"
    old = os.umask(0o022)
    try:
        launcher.secure_state_dir(str(state), (db, f"sqlite:///{state}/jupyterhub.sqlite"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    for name in ("backendai.sqlite", "jupyterhub.sqlite"):
        assert stat.S_IMODE(os.stat(state / name).st_mode) == 0o600
    # ... and SQLite keeps that mode for the database it makes in the empty file.
    import sqlalchemy

    eng = sqlalchemy.create_engine(db)
    with eng.begin() as c:
        c.execute(sqlalchemy.text("create table t (x int)"))
    eng.dispose()
    assert stat.S_IMODE(os.stat(state / "backendai.sqlite").st_mode) == 0o600


@pytest.mark.parametrize(("env", "bind", "sub", "login"), [
    ({}, "http://127.0.0.1:8000/", "http://localhost:8000", "http://localhost:8000/hub/login"),
    ({"BACKENDAI_HUB_URL": "http://127.0.0.1:9000/"}, "http://127.0.0.1:9000/", "",
     "http://127.0.0.1:9000/hub/login"),
    ({"BACKENDAI_HUB_URL": "http://hub.example.org:8000/x/"}, "http://hub.example.org:8000/x/",
     "http://hub.example.org:8000", "http://hub.example.org:8000/x/hub/login"),
    ({"BACKENDAI_SUBDOMAIN_HOST": ""}, "http://127.0.0.1:8000/", "",
     "http://localhost:8000/hub/login"),
    ({"BACKENDAI_HUB_URL": "http://0.0.0.0:8000/", "BACKENDAI_SUBDOMAIN_HOST": "https://hub.example.org"},
     "http://0.0.0.0:8000/", "https://hub.example.org", "https://hub.example.org/hub/login"),
])
def test_hub_url_knobs(monkeypatch, env, bind, sub, login):
    from jupyterhub_backendai import launcher

    for k in ("BACKENDAI_HUB_URL", "BACKENDAI_SUBDOMAIN_HOST"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert (launcher.bind_url(), launcher.subdomain_host(), launcher.login_url()) == (bind, sub, login)


def test_chp_runs_through_the_guard_when_it_can(monkeypatch, tmp_path):
    """The packaged config's proxy command: CHP through share/chp-guard.js when node is on
    PATH and CHP is an npm install (given as a path, a link to it, or a bare command
    name on PATH); otherwise CHP as given."""
    from jupyterhub_backendai import launcher

    assert os.path.exists(CHP), "configurable-http-proxy missing: run `npm ci`"
    real = os.path.realpath(CHP)
    guard = os.path.join(os.path.dirname(launcher.__file__), "share", "chp-guard.js")
    assert os.path.isfile(guard)
    monkeypatch.setenv("PATH", f"{os.path.dirname(CHP)}:{os.environ['PATH']}")
    node = shutil.which("node")
    assert launcher.chp_command(CHP) == [node, guard, real]
    assert launcher.chp_command("configurable-http-proxy") == [node, guard, real]
    plain = tmp_path / "chp"  # not an npm install: no lib/configproxy.js beside it
    plain.write_text("#!/bin/sh\n")
    assert launcher.chp_command(str(plain)) == [str(plain)]
    monkeypatch.setenv("PATH", str(tmp_path))  # no node
    assert launcher.chp_command(CHP) == [CHP]


def _share_domain_cookies(s: requests.Session, host: str) -> None:
    """See InstalledHub.login: Python's cookie jar and JupyterHub's Domain=<host> cookie."""
    for ck in list(s.cookies):
        if ck.domain == "." + host:
            s.cookies.set(ck.name, ck.value, domain=host + ".local", path=ck.path)


@pytest.fixture
def chromium():
    with launch_chromium() as b:
        yield b


@pytest.mark.browser
def test_subdomain_default_in_chromium(chromium, tmp_path):
    """The packaged default in a real browser: log in at http://localhost:<port>/hub/login,
    open the server: JupyterLab loads from http://admin.localhost:<port>/user/admin/lab
    (Chromium resolves *.localhost to loopback; OAuth and cookies cross the subdomain)."""
    hub = Hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="local")
    hub.base = f"http://localhost:{hub.port}"
    hub.env["BACKENDAI_HUB_URL"] = hub.base + "/"
    hub.env.pop("BACKENDAI_SUBDOMAIN_HOST", None)
    try:
        hub.start()
        s = hub.login()
        _share_domain_cookies(s, "localhost")
        token = hub.token_for(s, "admin")
        r = hub.spawn("admin", "", token=token)
        assert r.status_code in (201, 202), r.text
        model = hub.wait_ready("admin", "", token=token)
        assert model["url"] == f"http://admin.localhost:{hub.port}/user/admin/"
        assert requests.get(hub.base + "/hub/api/", timeout=10).status_code == 200

        page = chromium.new_page()
        page.goto(hub.base + "/hub/login")
        page.fill("input[name=username]", "admin@example.com")
        page.fill("input[name=password]", "admin-pass-123")
        page.click("#login_submit")
        # The server runs, so the hub sends the browser on to it: through OAuth, to
        # JupyterLab on the user's own origin.
        lab = f"http://admin.localhost:{hub.port}/user/admin/lab"
        try:
            page.wait_for_url(lab + "*", timeout=120_000, wait_until="commit")
        except Exception:
            raise AssertionError(f"at {page.url}: {page.content()[:2000]}\n{hub.log()[-4000:]}") from None
        page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
        assert page.evaluate("location.origin") == f"http://admin.localhost:{hub.port}"
        page.close()
        hub.stop_server("admin", "", token=token)
    finally:
        hub.close()
        _kill_local_kernels(os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels"))
        shutil.rmtree(hub.dir, ignore_errors=True)
