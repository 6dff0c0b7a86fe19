"""A local stand-in for what Binder (repo2docker + a Jupyter server) does with ``binder/``.

See ``tests/test_binder.py`` for the steps and where they differ from repo2docker.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import requests

from .services import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINDER_USER = "binderuser"

# Variables of this machine that Binder's container would not have, or that
# would point the demo at this checkout instead of the copy.
_DROP_PREFIXES = ("JUPYTER", "JPY_", "BACKENDAI_", "CONDA", "PYTHON", "UV_", "npm_")
_DROP = {"VIRTUAL_ENV", "PYENV_VERSION", "PYENV_ROOT", "MAIL", "OLDPWD", "PWD"}


def _log(msg: str) -> None:
    print(f"[binder {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def runtime_python(repo: str) -> str:
    """The Python that ``binder/runtime.txt`` asks for (``python-3.11``), as a version."""
    with open(os.path.join(repo, "binder", "runtime.txt")) as f:
        spec = f.read().strip()
    if not spec.startswith("python-"):
        raise AssertionError(f"binder/runtime.txt: expected python-X.Y, not {spec!r}")
    return spec[len("python-"):]


def _python_for_venv(version: str) -> str:
    """That Python, from the system where it is (the unprivileged user can run it)."""
    found = shutil.which(f"python{version}", path="/usr/local/bin:/usr/bin")
    # else: uv finds or fetches a managed build of that version
    return found or version


class BinderSim:
    """Build (venv + requirements + postBuild) and run (Jupyter server) like Binder."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="bai-binder-")
        os.chmod(self.dir, 0o755)
        self.repo = os.path.join(self.dir, "repo")
        self.home = os.path.join(self.dir, "home")
        self.venv = os.path.join(self.dir, "venv")
        self.log_path = os.path.join(self.dir, "server.log")
        self.token = "binder-" + os.urandom(8).hex()
        self.port = free_port()
        # Binder's JupyterHub serves each visitor's server under /user/<name>/;
        # the name looks like mybinder.org's (<repo owner>-<repo>-<random>).
        self.prefix = f"/user/demo-jupyterhub-backendai-{os.urandom(4).hex()}/"
        self.url = f"http://127.0.0.1:{self.port}{self.prefix}"
        self.server: subprocess.Popen | None = None
        self.as_root = os.geteuid() == 0
        if self.as_root:
            self.user = _ensure_user(BINDER_USER)
        else:
            self.user = pwd.getpwuid(os.getuid())
        os.makedirs(self.home)

    # -- environment ----------------------------------------------------------------

    def env(self) -> dict:
        env = {
            k: v for k, v in os.environ.items()
            if k not in _DROP and not k.startswith(_DROP_PREFIXES)
        }
        env.update(
            HOME=self.home,
            USER=self.user.pw_name,
            LOGNAME=self.user.pw_name,
            SHELL="/bin/bash",
            LANG=env.get("LANG", "C.UTF-8"),
            # What repo2docker's Dockerfile sets besides.
            NB_USER=self.user.pw_name,
            NB_UID=str(self.user.pw_uid),
            REPO_DIR=self.repo,
            PYTHONUNBUFFERED="1",
            # repo2docker: ~/.local/bin, $REPO_DIR/.local/bin, the env's bin, the system.
            PATH=os.pathsep.join([
                os.path.join(self.home, ".local", "bin"),
                os.path.join(self.repo, ".local", "bin"),
                os.path.join(self.venv, "bin"),
                "/usr/local/bin", "/usr/bin", "/bin",
            ]),
        )
        return env

    def _user_kw(self) -> dict:
        if not self.as_root:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def _run(self, cmd, *, as_user: bool, timeout: float, cwd=None, env=None) -> str:
        t0 = time.monotonic()
        r = subprocess.run(
            cmd, cwd=cwd or self.repo, env=env or self.env(), capture_output=True, text=True,
            timeout=timeout, **(self._user_kw() if as_user else {}),
        )
        _log(f"{' '.join(cmd)[:100]} -> {r.returncode} in {time.monotonic() - t0:.1f} s")
        if r.returncode != 0:
            raise AssertionError(f"{cmd} failed ({r.returncode})\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
        return r.stdout + r.stderr

    # -- build ------------------------------------------------------------------------

    def copy_repo(self) -> None:
        """The working tree as Git would clone it: tracked and untracked, not ignored, files."""
        files = subprocess.run(
            ["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, check=True,
        ).stdout.decode().split("\0")
        for rel in filter(None, files):
            src = os.path.join(REPO, rel)
            if not os.path.isfile(src):  # deleted but still in the index
                continue
            dst = os.path.join(self.repo, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)

    def install_requirements(self) -> None:
        """``pip install -r binder/requirements.txt`` from the repo root, into a fresh env
        of the Python that ``binder/runtime.txt`` names."""
        py = _python_for_venv(runtime_python(self.repo))
        uv = shutil.which("uv")
        # The installer runs as us, with our caches (see the test's docstring); copies,
        # not hard links into our cache, since the env is then given to the user.
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env["UV_LINK_MODE"] = "copy"
        if uv:
            self._run([uv, "venv", "-q", "--python", py, self.venv], as_user=False,
                      timeout=120, env=env)
            self._run([uv, "pip", "install", "-q", "--python", os.path.join(self.venv, "bin", "python"),
                       "-r", "binder/requirements.txt"], as_user=False, timeout=600, env=env)
        else:
            self._run([py, "-m", "venv", self.venv], as_user=False, timeout=120, env=env)
            self._run([os.path.join(self.venv, "bin", "pip"), "install", "-q", "-r",
                       "binder/requirements.txt"], as_user=False, timeout=900, env=env)

    def chown(self) -> None:
        if not self.as_root:
            return
        uid, gid = self.user.pw_uid, self.user.pw_gid
        for root, dirs, files in os.walk(self.dir):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(root, name), uid, gid)
        os.lchown(self.dir, uid, gid)

    def post_build(self) -> str:
        os.chmod(os.path.join(self.repo, "binder", "postBuild"), 0o755)
        return self._run(["./binder/postBuild"], as_user=True, timeout=300)

    # -- run --------------------------------------------------------------------------

    def start_server(self) -> None:
        """repo2docker's default command, ``jupyter notebook --ip 0.0.0.0``, as Binder runs
        it: under the visitor's prefix, with a token (see the test's docstring)."""
        log = open(self.log_path, "ab")
        self.server = subprocess.Popen(
            [os.path.join(self.venv, "bin", "jupyter"), "notebook", "--ip", "127.0.0.1",
             f"--port={self.port}", "--no-browser", f"--ServerApp.base_url={self.prefix}",
             f"--IdentityProvider.token={self.token}"],
            cwd=self.repo, env=self.env(), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            start_new_session=True, **self._user_kw(),
        )
        log.close()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise AssertionError("jupyter notebook exited\n" + self.log())
            try:
                r = requests.get(f"{self.url}api/status", params={"token": self.token}, timeout=2)
                if r.status_code == 200:
                    _log("jupyter notebook up")
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise TimeoutError("jupyter notebook did not answer\n" + self.log())

    def log(self) -> str:
        out = []
        paths = [self.log_path]
        kernels = os.path.join(self.state_dir, "agent", "local-kernels")
        if os.path.isdir(kernels):
            paths += [os.path.join(kernels, f) for f in sorted(os.listdir(kernels)) if f.endswith(".log")]
        for p in paths:
            try:
                with open(p, errors="replace") as f:
                    out.append(f"==> {p}\n{f.read()[-6000:]}")
            except OSError:
                pass
        return "\n".join(out)

    def memory(self) -> int:
        """Bytes of memory the demo's processes use (proportional set size, so shared
        pages count once): the Jupyter server, the hub, its proxy, the sessions and
        their kernels, which all run from this build's folder."""
        total = 0
        for pid in _pids_using(self.dir):
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Pss:"):
                            total += int(line.split()[1]) * 1024
                            break
            except OSError:
                pass
        return total

    @property
    def state_dir(self) -> str:
        return os.path.join(self.home, ".backendai-demo", "state")

    # -- clean up -----------------------------------------------------------------------

    def close(self) -> None:
        t0 = time.monotonic()
        if self.server is not None and self.server.poll() is None:
            _signal_group(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(20)
            except subprocess.TimeoutExpired:
                _signal_group(self.server.pid, signal.SIGKILL)
                self.server.wait(10)
            _log(f"jupyter notebook stopped in {time.monotonic() - t0:.1f} s")
        # Sessions outlive the hub by design, and the hub's proxy runs in its own
        # session: stop them by the pids that the platform wrote down.
        kernels = os.path.join(self.state_dir, "agent", "local-kernels")
        if os.path.isdir(kernels):
            for fn in os.listdir(kernels):
                if fn.endswith(".json"):
                    try:
                        with open(os.path.join(kernels, fn)) as f:
                            _signal_group(int(json.load(f)["container_id"]), signal.SIGKILL)
                    except (OSError, ValueError, KeyError):
                        pass
        try:
            with open(os.path.join(self.state_dir, "jupyterhub-proxy.pid")) as f:
                os.kill(int(f.read().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        # Anything else still running from this build's files (ours by construction).
        for pid in _pids_using(self.dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
        _log(f"cleaned up in {time.monotonic() - t0:.1f} s")


def _ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
        return pwd.getpwnam(name)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def _pids_using(path: str) -> list[int]:
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if path in cmd:
            found.append(int(entry))
    return found
