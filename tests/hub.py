"""A real JupyterHub (subprocess, real CHP) running the platform, and an HTTP client for it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import requests

from jupyterhub_backendai.common import installation

from . import clifork
from .services import INSTALLATION_PREFIX, free_port, port_block, wait_port
from .services import agent_id as new_agent_id

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHP = os.path.join(REPO, "node_modules", ".bin", "configurable-http-proxy")
KERNEL_IMAGE = os.environ.get("BACKENDAI_TEST_IMAGE", "backendai/python-kernel:latest")
ADMIN_EMAIL = "admin@example.com"
ADMIN_PASSWORD = "admin-pass-123"


# Hubs started in this process and not yet closed: a failed test's report carries their
# logs (tests/conftest.py, pytest_runtest_makereport).
LIVE: list[Hub] = []


class HubSession(requests.Session):
    """A ``requests`` session that opens a new connection after 4 s idle.
    configurable-http-proxy (Node's HTTP server) closes a keep-alive connection idle for
    5 s, and a request sent on it at that moment gets no answer ("Remote end closed
    connection without response": the isolation matrix's POST, after a slow snapshot of
    the record). Browsers send such a request again; ``requests`` does not."""

    IDLE_S = 4.0

    def __init__(self) -> None:
        super().__init__()
        self._idle_since = time.monotonic()

    def request(self, *args, **kw):
        if time.monotonic() - self._idle_since > self.IDLE_S:
            self.close()  # the pools go; the next request makes a new one
        try:
            return super().request(*args, **kw)
        finally:
            self._idle_since = time.monotonic()


class Hub:
    def __init__(self, *, db_url: str, backend: str, slots: dict | None = None, extra_env=None,
                 config: str | None = None, extra_args: list[str] | tuple = (),
                 ca: str | None = None, python: str | None = None,
                 default_agent_id: bool = False, state_dir: str | None = None):
        """``default_agent_id``: leave BACKENDAI_AGENT_ID unset, as the README's hub does
        (the agent's id is then its installation's, which carries this run's token);
        ``state_dir``: another hub's state directory instead of a new one."""
        self.dir = tempfile.mkdtemp(prefix="bai-hub-")
        self.port = free_port()
        self.api_port = free_port()
        # ca: the hub serves HTTPS (BACKENDAI_SSL_CERT/KEY in extra_env) with a
        # certificate for 127.0.0.1 signed by this CA, which the clients here trust.
        self.verify: str | bool = ca or True
        self.base = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}"
        lo = port_block(200)
        self.env = dict(
            os.environ,
            BACKENDAI_STATE_DIR=state_dir or os.path.join(self.dir, "state"),
            BACKENDAI_DB_URL=db_url,
            BACKENDAI_CHP=CHP,
            BACKENDAI_HUB_URL=self.base + "/",
            BACKENDAI_HUB_API_PORT=str(self.api_port),
            BACKENDAI_PROXY_API_URL=f"http://127.0.0.1:{free_port()}",
            BACKENDAI_AGENT_BACKEND=backend,
            BACKENDAI_AGENT_PORT_RANGE=f"{lo}-{lo + 200}",
            BACKENDAI_ADMIN_EMAIL=ADMIN_EMAIL,
            BACKENDAI_ADMIN_PASSWORD=ADMIN_PASSWORD,
            BACKENDAI_AGENT_ID=new_agent_id("hub"),
            BACKENDAI_INSTALLATION_PREFIX=INSTALLATION_PREFIX,
        )
        self.env.update(extra_env or {})  # (they win: a test may give another port range)
        if default_agent_id:
            del self.env["BACKENDAI_AGENT_ID"]
        if slots:
            self.env["BACKENDAI_AGENT_SLOTS"] = json.dumps(slots)
        if backend == "local":
            self.env["BACKENDAI_HUB_API_IP"] = "127.0.0.1"
        # The interpreter the hub runs on (its environment's packages, its kernels'
        # jupyterhub-singleuser beside it): this one's, unless a test installs another.
        self.python = python or sys.executable
        self.config = config
        # Command-line options for the hub (they win over the packaged config file).
        self.extra_args = list(extra_args)
        self.db_url = db_url
        self.backend = backend
        self.image = KERNEL_IMAGE if backend == "docker" else "local/python"
        self.proc: subprocess.Popen | clifork.ForkedProcess | None = None
        self._token: str | None = None

    def start(self) -> Hub:
        log = open(os.path.join(self.dir, "hub.log"), "ab")
        args = [*self.extra_args, *(["-f", self.config] if self.config else [])]
        if self.python == sys.executable and clifork.forking():  # imports done (clifork.py)
            self.proc = clifork.hub(args, os.path.join(self.dir, "hub.pid"), env=self.env,
                                    cwd=self.dir, stdout=log, stderr=log)
        else:
            self.proc = subprocess.Popen([self.python, "-m", clifork.HUB_MODULE, *args],
                                         env=self.env, cwd=self.dir, stdout=log, stderr=log,
                                         start_new_session=True)
        if self not in LIVE:
            LIVE.append(self)
        try:
            wait_port(self.port, timeout=60, proc=self.proc)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if requests.get(self.base + "/hub/api/", timeout=2,
                                    verify=self.verify).status_code == 200:
                        return self
                except requests.RequestException:
                    pass
                time.sleep(0.1)
            raise TimeoutError("hub did not answer\n" + self.log())
        except BaseException:
            # A hub that died starting may have started its proxy (which outlives it by
            # design): a fixture that raises here never reaches its own close.
            self.close()
            raise

    def stop_hub(self) -> None:
        """Stop the hub process (and its proxy), leaving sessions running."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "hub.log"), errors="replace") as f:
                return f.read()[-20000:]
        except OSError:
            return ""

    # -- HTTP ------------------------------------------------------------------

    def login(self, email: str = ADMIN_EMAIL, password: str = ADMIN_PASSWORD) -> requests.Session:
        s = HubSession()
        s.verify = self.verify
        s.get(self.base + "/hub/login")
        r = s.post(self.base + "/hub/login",
                   data={"username": email, "password": password, "_xsrf": s.cookies.get("_xsrf", path="/hub/")})
        s.last_login = r
        return s

    def token_for(self, session: requests.Session, user: str) -> str:
        r = session.post(self.base + f"/hub/api/users/{user}/tokens", json={"note": "test"},
                         headers={"X-XSRFToken": session.cookies.get("_xsrf", path="/hub/")})
        r.raise_for_status()
        return r.json()["token"]

    @property
    def admin_token(self) -> str:
        if self._token is None:
            self._token = self.token_for(self.login(), "admin")
        return self._token

    def api(self, method: str, path: str, token: str | None = None, **kw) -> requests.Response:
        headers = {"Authorization": f"token {token or self.admin_token}"}
        return requests.request(method, self.base + "/hub/api" + path, headers=headers,
                                timeout=60, verify=self.verify, **kw)

    def spawn(self, user: str, server: str, options: dict | None = None, token=None):
        body = {"image": self.image, "cpu": "0.5", "mem": "512m"}
        body.update(options or {})
        return self.api("POST", f"/users/{user}/servers/{server}", token=token, json=body)

    def server_model(self, user: str, server: str, token=None) -> dict | None:
        return self.api("GET", f"/users/{user}", token=token).json()["servers"].get(server)

    def failed_kernels_output(self, last: int = 3) -> str:
        """The output the record kept of the last sessions that ended in ERROR (why a
        kernel's server exited: the hub's log does not say), for a failure's message."""
        try:
            r = self.api("GET", "/backendai/sessions", params={"status": "ERROR"})
            items = r.json()
            items = items.get("items", items) if isinstance(items, dict) else items
            out = []
            for sess in list(items)[-last:]:
                logs = self.api("GET", f"/backendai/sessions/{sess['id']}/logs").json()
                out.append(f"--- session {sess.get('name')} ({sess.get('status_info')}):\n"
                           f"{str(logs.get('logs', logs) if isinstance(logs, dict) else logs)[-1500:]}")
            return "\n--- failed kernels' output ---\n" + "\n".join(out)
        except Exception as e:  # only a diagnosis: never the failure itself
            return f"\n(failed kernels' output not read: {e!r})"

    def wait_ready(self, user: str, server: str, timeout: float = 180, token=None) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.server_model(user, server, token=token)
            if m is None:
                raise AssertionError(f"server {user}/{server} went away\n" + self.log()[-5000:]
                                     + self.failed_kernels_output())
            if m.get("ready"):
                return m
            time.sleep(0.2)
        raise TimeoutError(f"server {user}/{server} not ready\n" + self.log()[-5000:])

    def stop_server(self, user: str, server: str, token=None, timeout: float = 60) -> None:
        r = self.api("DELETE", f"/users/{user}/servers/{server}", token=token)
        assert r.status_code in (202, 204), r.text
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server_model(user, server, token=token) is None:
                return
            time.sleep(0.2)
        raise TimeoutError(f"server {user}/{server} did not stop")

    @property
    def volume_path(self) -> str:
        """The in-hub storage proxy's volume "volume1" (the packaged config keeps it in
        the state directory)."""
        return os.path.join(self.env["BACKENDAI_STATE_DIR"], "vfroot", "volume1")

    @property
    def agent_id(self) -> str:
        if "BACKENDAI_AGENT_ID" in self.env:
            return self.env["BACKENDAI_AGENT_ID"]
        inst = installation.read(self.env["BACKENDAI_STATE_DIR"])
        if inst is None:
            raise RuntimeError("the hub has not made its installation yet")
        return inst.default_agent_id()

    @property
    def installation_id(self) -> str:
        inst = installation.read(self.env["BACKENDAI_STATE_DIR"])
        return inst.id if inst else ""

    def close(self) -> None:
        if self in LIVE:
            LIVE.remove(self)
        self.stop_hub()
        # The proxy survives the hub (by design); stop it by its pid file.
        # So may the app front's nginx (BACKENDAI_APP_FRONT).
        for pidfile in ("jupyterhub-proxy.pid", os.path.join("app-front", "nginx.pid")):
            try:
                with open(os.path.join(self.env["BACKENDAI_STATE_DIR"], pidfile)) as f:
                    os.kill(int(f.read().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
