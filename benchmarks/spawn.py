"""Spawn latency: our BackendAISpawner vs. stock DockerSpawner vs. a bare `docker run`.

    python benchmarks/spawn.py [--runs N] [--keep-logs DIR]
    python benchmarks/spawn.py --concurrent N [--runs R]    # the morning rush
    python benchmarks/spawn.py --concurrent N --cpu        # ... and where its CPU goes
    python benchmarks/spawn.py --pool SIZE [--concurrent N]  # with a warm pool (issue 30)

Three variants, all on the same kernel image (backendai/python-kernel:latest), the same
Docker network ("backendai") and the same limits (0.5 CPU, 512 MiB):

  (a) ours:          a real hub (tests/hub.py: launcher, CHP, in-process agent, docker backend,
                     SQLite); POST /hub/api/users/admin/servers/<name> with the form's options.
  (b) dockerspawner: a second, plain JupyterHub (DummyAuthenticator, DockerSpawner, its own
                     CHP and SQLite), same request.
  (c) docker run:    `docker run -d --rm -p 127.0.0.1:<port>:8888 ... jupyter server`, the
                     floor: no hub, no jupyterhub-singleuser.

Measured for (a) and (b): from just before the POST until GET /user/admin/<name>/api/status
through the proxy (with the API token) answers 200, polled every 50 ms; for (c): from just
before `docker run` until GET /api/status on the published port answers 200. After each run
the server is stopped (DELETE, then wait until the hub has dropped it and its container is
gone; `docker rm -f` for (c)). Rounds interleave a, b, c so drift hits all alike; one
unmeasured warm-up round first. The last line printed is machine-readable:

    ours_p50_s=<f> dockerspawner_p50_s=<f> docker_run_p50_s=<f> ratio_vs_dockerspawner=<f> ratio_vs_docker_run=<f>

With ``--concurrent N`` (issue 30, the morning rush): N servers requested at once through
our hub (N threads, each its own server) against N bare ``docker run``s of the same image
and limits started at once, time until the last of the N answers; rounds alternate, one
unmeasured warm-up round first. Last line:

    concurrent=<N> ours_p50_s=<f> docker_run_p50_s=<f> ratio_vs_docker_run=<f>

With ``--pool SIZE`` (issue 30): our hub keeps a warm pool of SIZE kernels of the same
image and limits (a resource preset of 0.5 CPU, 512 MiB; ``PUT /warm-pools``); before each
round (untimed) it waits until the pool is full again, so every measured start can take a
pooled kernel. Compared with bare ``docker run`` only (no DockerSpawner). Last line:

    pool=<SIZE> concurrent=<N> ours_p50_s=<f> docker_run_p50_s=<f> hits=<n> misses=<n>

Everything it starts (hubs, proxies, containers, temp dirs) is removed at the end, also on
Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import requests

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.hub import CHP, KERNEL_IMAGE, Hub  # noqa: E402
from tests.services import foreign_subnets, free_port, wait_port  # noqa: E402

NETWORK = "backendai"
CPU = "0.5"
MEM = "512m"
POLL = 0.05
READY_TIMEOUT = 120.0
USER = "admin"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check).stdout


def ensure_image() -> None:
    r = subprocess.run(["bash", os.path.join(REPO, "images", "build.sh")], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("images/build.sh failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])


def ensure_network() -> str:
    """The agent's bridge network (created like the agent does if missing); its gateway IP."""
    if subprocess.run(["docker", "network", "inspect", NETWORK], capture_output=True).returncode != 0:
        subnet = foreign_subnets()[0]
        # The gateway said (its first address, as Docker picks): with --subnet alone the
        # engine records none in the network's IPAM config.
        gateway = str(next(ipaddress.ip_network(subnet).hosts()))
        docker("network", "create", "--driver", "bridge", "--subnet", subnet,
               "--gateway", gateway, "--label", "ai.backend.network=agent", NETWORK)
    gw = docker("network", "inspect", NETWORK, "-f", "{{range .IPAM.Config}}{{.Gateway}} {{end}}").split()
    if not gw:
        sys.exit(f"docker network {NETWORK} has no gateway")
    return gw[0]


def wait_status(session: requests.Session, url: str, headers: dict, deadline: float) -> None:
    """Poll url every POLL s until it answers 200 (redirects and hub pages don't count)."""
    while True:
        try:
            r = session.get(url, headers=headers, timeout=5, allow_redirects=False)
            if r.status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200 in {READY_TIMEOUT} s")
        time.sleep(POLL)


# -- where the CPU goes (--cpu) -------------------------------------------------------------

ENGINE = ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "docker-proxy",
          "runc")


def machine_cpu() -> float:
    """CPU-seconds the whole machine spent busy (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def container_cpu(cid: str) -> float:
    """CPU-seconds of a running container's cgroup (v1 or v2); 0 if it cannot be read."""
    full = docker("inspect", "-f", "{{.Id}}", cid, check=False).strip() or cid
    for path, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{full}/cpuacct.usage", 1e-9),
                        (f"/sys/fs/cgroup/system.slice/docker-{full}.scope/cpu.stat", 1e-6)):
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            continue
        if path.endswith("cpu.stat"):
            text = next(line.split()[1] for line in text.splitlines()
                        if line.startswith("usage_usec"))
        return int(text) * scale
    return 0.0


CPU_PARTS = ("wall", "all", "hub", "engine", "kernels", "rest")


class CpuMeter:
    """CPU-seconds spent during one round, by part: the hub's processes (the hub and its
    proxy), the engine (dockerd, containerd, shims, docker-proxy), the round's containers
    (their cgroups, read before they are removed), and the machine as a whole (the rest:
    the benchmark's own clients, the docker CLI, anything else running)."""

    def __init__(self, root_pid: int | None):
        import psutil

        self.psutil = psutil
        self.root_pid = root_pid
        self.rounds: list[dict[str, float]] = []

    def _procs(self) -> dict[int, tuple[float, float, bool]]:
        """pid -> (create time, CPU-seconds, of the engine); the hub's tree marked apart."""
        out = {}
        for p in self.psutil.process_iter(["name", "create_time", "cpu_times"]):
            t = p.info["cpu_times"]
            if t is not None:
                out[p.pid] = (p.info["create_time"], t.user + t.system,
                              (p.info["name"] or "").startswith(ENGINE))
        return out

    def _hub_pids(self) -> set[int]:
        if not self.root_pid:
            return set()
        try:
            root = self.psutil.Process(self.root_pid)
            return {root.pid, *(c.pid for c in root.children(recursive=True))}
        except self.psutil.Error:
            return set()

    def start(self, containers: list[str] = ()) -> None:
        """``containers``: those already running (a warm pool's), whose CPU so far is
        not the round's (read first, so that reading it is not counted either)."""
        self._k0 = {c: container_cpu(c) for c in containers}
        self._t0, self._p0, self._m0 = time.perf_counter(), self._procs(), machine_cpu()

    def stop(self, containers: list[str]) -> dict[str, float]:
        kernels = sum(container_cpu(c) - self._k0.get(c, 0.0) for c in containers)
        p1, m1, hub = self._procs(), machine_cpu(), self._hub_pids()
        parts = {"hub": 0.0, "engine": 0.0}
        for pid, (created, cpu, engine) in p1.items():
            before = self._p0.get(pid)
            spent = cpu - before[1] if before and before[0] == created else cpu
            if pid in hub:
                parts["hub"] += spent
            elif engine:
                parts["engine"] += spent
        parts["kernels"] = kernels
        parts["all"] = m1 - self._m0
        parts["rest"] = parts["all"] - parts["hub"] - parts["engine"] - kernels
        parts["wall"] = time.perf_counter() - self._t0
        self.rounds.append(parts)
        return parts


# -- (a) and (b): a hub ---------------------------------------------------------------------


class HubVariant:
    """What (a) and (b) share: spawn a named server through the REST API, time it, stop it."""

    name = ""
    base = ""
    token = ""
    body: dict | None = None

    meter: CpuMeter | None = None
    verbose = False

    def __init__(self):
        self.each_ready: list[float] = []  # each server's own POST-to-ready, --concurrent
        self.http = requests.Session()
        self.n = 0

    def containers(self) -> list[str]:
        raise NotImplementedError

    def running(self) -> list[str]:
        """Containers running before a round that its servers may become (none here)."""
        return []

    def root_pid(self) -> int | None:
        """The hub's process, whose tree the CPU meter counts as the hub's."""
        proc = getattr(self, "proc", None)
        return proc.pid if proc is not None else None

    def api(self, method: str, path: str, **kw) -> requests.Response:
        return self.http.request(method, self.base + "/hub/api" + path,
                                 headers={"Authorization": f"token {self.token}"}, timeout=60, **kw)

    def run_many(self, n: int) -> float:
        """n servers at once; seconds until the last answers (then all are stopped)."""
        from concurrent.futures import ThreadPoolExecutor

        servers = [f"rush{self.n + i}" for i in range(1, n + 1)]
        self.n += n
        headers = {"Authorization": f"token {self.token}"}

        def one(server: str) -> tuple[float, float]:
            http = requests.Session()
            r = http.post(f"{self.base}/hub/api/users/{USER}/servers/{server}", headers=headers,
                          json=self.body, timeout=READY_TIMEOUT)
            answered = time.perf_counter() - t0
            if r.status_code not in (201, 202):
                raise RuntimeError(f"{self.name}: spawn answered {r.status_code}: {r.text}")
            wait_status(http, f"{self.base}/user/{USER}/{server}/api/status", headers,
                        time.monotonic() + READY_TIMEOUT)
            return answered, time.perf_counter() - t0

        if self.meter:
            self.meter.start(self.running())
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            each = list(pool.map(one, servers))
        elapsed = time.perf_counter() - t0
        self.each_ready += [b for _, b in each]
        if self.verbose:
            log(f"  {self.name}: each (POST answered / ready, s): " + "  ".join(
                f"{a:.2f}/{b:.2f}" for a, b in sorted(each, key=lambda e: e[1])))
        if self.meter:
            self.meter.stop(self.containers())
        for server in servers:
            self.api("DELETE", f"/users/{USER}/servers/{server}", json={"remove": True})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            left = set(self.api("GET", f"/users/{USER}").json().get("servers", {}))
            if not left & set(servers) and not self.containers():
                break
            time.sleep(0.2)
        else:
            raise TimeoutError(f"{self.name}: the rush's servers did not go away")
        return elapsed

    def run_once(self) -> float:
        self.n += 1
        server = f"bench{self.n}"
        headers = {"Authorization": f"token {self.token}"}
        url = f"{self.base}/user/{USER}/{server}/api/status"
        t0 = time.perf_counter()
        r = self.http.post(f"{self.base}/hub/api/users/{USER}/servers/{server}", headers=headers,
                           json=self.body, timeout=READY_TIMEOUT)
        if r.status_code not in (201, 202):
            raise RuntimeError(f"{self.name}: spawn answered {r.status_code}: {r.text}")
        wait_status(self.http, url, headers, time.monotonic() + READY_TIMEOUT)
        elapsed = time.perf_counter() - t0
        self.stop(server)
        return elapsed

    def stop(self, server: str, timeout: float = 60) -> None:
        r = self.api("DELETE", f"/users/{USER}/servers/{server}", json={"remove": True})
        if r.status_code not in (202, 204):
            raise RuntimeError(f"{self.name}: stop answered {r.status_code}: {r.text}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            servers = self.api("GET", f"/users/{USER}").json().get("servers", {})
            if server not in servers and not self.containers():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: server {server} did not go away")

    def stop_all(self) -> None:
        try:
            servers = self.api("GET", f"/users/{USER}").json().get("servers", {})
            for s in servers:
                self.api("DELETE", f"/users/{USER}/servers/{s}", json={"remove": True})
        except Exception:
            pass


class Ours(HubVariant):
    name = "ours"

    def __init__(self, tmp: str, pool: int = 0):
        super().__init__()
        self.pool = pool
        # Room for the morning rush on a small machine: N x 0.5 CPU may exceed the cores
        # (the bare docker runs over-commit the same way).
        self.hub = Hub(db_url=f"sqlite:///{tmp}/backendai.sqlite", backend="docker",
                       slots={"cpu": 16, "mem": "32g"})
        self.dir = self.hub.dir

    def start(self) -> None:
        self.hub.start()
        self.base = self.hub.base
        self.token = self.hub.admin_token
        self.body = {"image": KERNEL_IMAGE, "cpu": CPU, "mem": MEM}
        if self.pool:
            r = self.api("POST", "/backendai/resource-presets", json={
                "name": "bench-pool", "resource_slots": {"cpu": CPU, "mem": MEM}})
            if r.status_code != 201:
                raise RuntimeError(f"preset: {r.status_code} {r.text}")
            self.pool_stats()  # the API answers
            r = self.api("PUT", "/backendai/warm-pools", json={
                "resource_group": "default", "image": KERNEL_IMAGE, "preset": "bench-pool",
                "size": self.pool})
            if r.status_code != 200:
                raise RuntimeError(f"warm pool: {r.status_code} {r.text}")

    def pool_stats(self) -> dict:
        items = self.api("GET", "/backendai/warm-pools").json()["items"]
        return items[0] if items else {"ready": 0, "hits": 0, "misses": 0}

    def before_round(self) -> None:
        """Untimed: until the warm pool is full again."""
        deadline = time.monotonic() + READY_TIMEOUT
        while self.pool and self.pool_stats()["ready"] < self.pool:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the warm pool did not fill: {self.pool_stats()}")
            time.sleep(0.2)

    def root_pid(self) -> int | None:
        return self.hub.proc.pid if self.hub.proc is not None else None

    def running(self) -> list[str]:
        """The warm pool's kernels, which a round binds to its sessions."""
        return docker("ps", "-q", "--filter", f"label=ai.backend.agent-id={self.hub.agent_id}",
                      "--filter", "label=ai.backend.pool").split()

    def containers(self) -> list[str]:
        """The kernels of sessions (a warm pool's own kernels are not counted)."""
        ids = docker("ps", "-aq", "--filter", f"label=ai.backend.agent-id={self.hub.agent_id}").split()
        pooled = docker("ps", "-aq", "--filter", f"label=ai.backend.agent-id={self.hub.agent_id}",
                        "--filter", "label=ai.backend.pool").split()
        if not self.pool:
            return ids
        # A pooled kernel bound to a session keeps its label; only the pool's unbound ones
        # (named backendai--<id>) are the pool's.
        names = dict(zip(pooled, docker("inspect", "-f", "{{.Name}}", *pooled).split(), strict=True)) \
            if pooled else {}
        return [c for c in ids if not names.get(c, "").startswith("/backendai--")]

    def close(self) -> None:
        if self.hub.proc and self.hub.proc.poll() is None:
            self.stop_all()
            deadline = time.monotonic() + 30
            while self.containers() and time.monotonic() < deadline:
                time.sleep(0.2)
        self.hub.close()
        # Everything of this hub's agent, the warm pool's kernels and their networks
        # included (they outlive a hub by design: a restarted one takes them back), and
        # the pool's mount under the hub's state directory.
        left = docker("ps", "-aq", "--filter", f"label=ai.backend.agent-id={self.hub.agent_id}",
                      check=False).split()
        if left:
            docker("rm", "-f", *left, check=False)
        nets = docker("network", "ls", "-q", "--filter",
                      f"label=ai.backend.agent-id={self.hub.agent_id}", check=False).split()
        if nets:
            docker("network", "rm", *nets, check=False)
        with open("/proc/mounts") as f:
            mounts = [line.split()[1] for line in f]
        for m in sorted((m for m in mounts if m.startswith(self.hub.dir + "/")), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(self.hub.dir, ignore_errors=True)


# What every stock JupyterHub of the benchmarks has (its spawner and addresses apart).
STOCK_HUB_CONFIG = """\
c.JupyterHub.db_url = "sqlite:///{dir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{dir}/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = "{dir}/jupyterhub.pid"
c.JupyterHub.allow_named_servers = True
c.JupyterHub.named_server_limit_per_user = 0
c.ConfigurableHTTPProxy.command = ["{chp}"]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = "{dir}/jupyterhub-proxy.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {{"{user}"}}
c.JupyterHub.services = [{{"name": "bench", "api_token": "{token}"}}]
c.JupyterHub.load_roles = [{{
    "name": "bench",
    "scopes": ["admin:users", "admin:servers", "servers", "access:servers", "read:users"],
    "services": ["bench"],
}}]
"""

DOCKERSPAWNER_CONFIG = """\
# Stock JupyterHub + DockerSpawner on the same image, network and limits as ours.
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = "http://127.0.0.1:{port}/"
c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_port = {hub_port}
c.JupyterHub.hub_connect_ip = "{gateway}"
c.JupyterHub.cleanup_servers = True
""" + STOCK_HUB_CONFIG + """\
c.JupyterHub.spawner_class = "docker"
c.DockerSpawner.image = "{image}"
c.DockerSpawner.network_name = "{network}"
c.DockerSpawner.use_internal_ip = False
c.DockerSpawner.host_ip = "127.0.0.1"
c.DockerSpawner.remove = True
c.DockerSpawner.prefix = "{prefix}"
c.DockerSpawner.cpu_limit = {cpu}
c.DockerSpawner.mem_limit = "{mem}"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
"""


class DockerSpawnerHub(HubVariant):
    name = "dockerspawner"

    def __init__(self, tmp: str, gateway: str):
        super().__init__()
        self.dir = tmp
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(16)
        self.prefix = f"bai-bench-{os.getpid()}"
        self.config = os.path.join(tmp, "jupyterhub_config.py")
        with open(self.config, "w") as f:
            f.write(self.config_text(
                port=self.port, hub_port=free_port(), gateway=gateway, dir=tmp, chp=CHP,
                proxy_api_port=free_port(), user=USER, token=self.token))
        self.proc: subprocess.Popen | None = None
        self.logfile = None
        self.body = None

    def config_text(self, **stock) -> str:
        """The hub's configuration file; ``stock``: what every stock hub here is given."""
        return DOCKERSPAWNER_CONFIG.format(
            **stock, image=KERNEL_IMAGE, network=NETWORK, prefix=self.prefix, cpu=float(CPU),
            mem=MEM.upper())

    def start(self) -> None:
        self.logfile = open(os.path.join(self.dir, "hub.log"), "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", self.config], cwd=self.dir,
            stdout=self.logfile, stderr=self.logfile, start_new_session=True,
        )
        wait_port(self.port, timeout=60, proc=self.proc)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.api("GET", f"/users/{USER}").status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("DockerSpawner hub did not come up:\n" + self.log())
            time.sleep(0.1)

    def log(self) -> str:
        with open(os.path.join(self.dir, "hub.log"), errors="replace") as f:
            return f.read()[-5000:]

    def containers(self) -> list[str]:
        return docker("ps", "-aq", "--filter", f"name=^/{self.prefix}-").split()

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.stop_all()
            self.proc.send_signal(signal.SIGTERM)  # cleanup_servers stops what is left
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        try:
            with open(os.path.join(self.dir, "jupyterhub-proxy.pid")) as f:
                os.kill(int(f.read().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        if self.logfile:
            self.logfile.close()
        left = self.containers()
        if left:
            docker("rm", "-f", *left, check=False)


# -- (c): docker run --------------------------------------------------------------------------


class DockerRun:
    name = "docker_run"

    meter: CpuMeter | None = None
    verbose = False

    def __init__(self):
        self.http = requests.Session()
        self.cid: str | None = None
        self.label = f"ai.backend.bench={os.getpid()}"

    def start(self) -> None:
        pass

    def root_pid(self) -> None:
        return None  # no hub: the engine and the containers are the meter's parts

    def run_once(self) -> float:
        port = free_port()
        t0 = time.perf_counter()
        self.cid = docker(
            "run", "-d", "--rm", "--label", self.label, "--network", NETWORK,
            "--cpus", CPU, "--memory", MEM, "-p", f"127.0.0.1:{port}:8888", KERNEL_IMAGE,
            "jupyter", "server", "--ip=0.0.0.0", "--port=8888", "--ServerApp.token=",
        ).strip()
        wait_status(self.http, f"http://127.0.0.1:{port}/api/status", {},
                    time.monotonic() + READY_TIMEOUT)
        elapsed = time.perf_counter() - t0
        docker("rm", "-f", self.cid)
        self.cid = None
        return elapsed

    def run_many(self, n: int) -> float:
        """n bare containers started at once; seconds until the last answers."""
        from concurrent.futures import ThreadPoolExecutor

        def one(_i: int) -> str:
            port = free_port()
            cid = docker(
                "run", "-d", "--rm", "--label", self.label, "--network", NETWORK,
                "--cpus", CPU, "--memory", MEM, "-p", f"127.0.0.1:{port}:8888", KERNEL_IMAGE,
                "jupyter", "server", "--ip=0.0.0.0", "--port=8888", "--ServerApp.token=",
            ).strip()
            wait_status(requests.Session(), f"http://127.0.0.1:{port}/api/status", {},
                        time.monotonic() + READY_TIMEOUT)
            return cid

        if self.meter:
            self.meter.start()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            cids = list(pool.map(one, range(n)))
        elapsed = time.perf_counter() - t0
        if self.meter:
            self.meter.stop(cids)
        docker("rm", "-f", *cids)
        return elapsed

    def close(self) -> None:
        left = docker("ps", "-aq", "--filter", f"label={self.label}", check=False).split()
        if left:
            docker("rm", "-f", *left, check=False)


# -- main ---------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """Percentile by linear interpolation between closest ranks (q in 0..100)."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def print_cpu(variants: list) -> None:
    print("CPU-seconds per round, p50 (the warm-up round left out):")
    print(f"{'':<15}" + "".join(f"{k:>9}" for k in CPU_PARTS))
    for v in variants:
        rounds = v.meter.rounds[1:] or v.meter.rounds
        if not rounds:  # single starts (--pool without --concurrent) are not metered
            print(f"{v.name:<15}  (not metered: use --concurrent)")
            continue
        print(f"{v.name:<15}" + "".join(
            f"{statistics.median(r_[k] for r_ in rounds):>9.2f}" for k in CPU_PARTS))


def prepare(no_build: bool) -> str:
    """What a benchmark run of hubs does first: SIGTERM and Ctrl-C take the caller's way
    out (its ``finally``, which cleans up), the kernel image is there (built unless
    ``no_build``), the agent network too; returns that network's gateway."""

    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with it ignored

    if no_build:
        if subprocess.run(["docker", "image", "inspect", KERNEL_IMAGE],
                          capture_output=True).returncode != 0:
            sys.exit(f"--no-build: the engine has no {KERNEL_IMAGE}")
    else:
        log("ensuring the kernel image (images/build.sh) ...")
        ensure_image()
    return ensure_network()


def start_variants(makers, variants: list, *, verbose: bool, cpu: bool) -> None:
    """Make and start each variant, added to ``variants`` before its start (a half-started
    one is cleaned up too); with ``cpu``, each gets a meter of its processes."""
    for make in makers:
        v = make()
        variants.append(v)
        v.verbose = verbose
        log(f"starting {v.name} ...")
        v.start()
        if cpu:
            v.meter = CpuMeter(v.root_pid())


def run_rounds(variants: list, runs: int, once) -> dict[str, list[float]]:
    """One unmeasured warm-up round, then ``runs`` measured ones, the variants in turn
    in each (so that drift hits all alike); ``once(v)`` times one variant's round."""
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    for rnd in range(runs + 1):
        warm = rnd == 0
        this = {}
        for v in variants:
            if hasattr(v, "before_round"):
                v.before_round()
            this[v.name] = once(v)
            if warm:
                v.each_ready = []
            else:
                times[v.name].append(this[v.name])
        label = "warm-up (not counted)" if warm else f"round {rnd}/{runs}"
        log(f"{label}: " + "  ".join(f"{k}={t:.3f}s" for k, t in this.items()))
    return times


def close_variants(variants: list, tmp: str, keep_logs: str | None = None) -> None:
    """Everything the variants started, removed (not interrupted by a second Ctrl-C);
    with ``keep_logs``, their hubs' logs copied there first."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log("cleaning up ...")
    if keep_logs:
        os.makedirs(keep_logs, exist_ok=True)
        for v in variants:
            src = os.path.join(getattr(v, "dir", ""), "hub.log")
            if os.path.exists(src):
                shutil.copy(src, os.path.join(keep_logs, f"{v.name}-hub.log"))
    for v in reversed(variants):
        try:
            v.close()
        except Exception as e:  # keep cleaning the others
            log(f"cleanup of {v.name}: {e}")
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="measured rounds (default 10)")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy both hubs' logs here at the end")
    ap.add_argument("--concurrent", type=int, default=0, metavar="N",
                    help="N servers at once (ours) against N bare docker runs at once")
    ap.add_argument("--pool", type=int, default=0, metavar="SIZE",
                    help="our hub keeps a warm pool of SIZE kernels of the same limits")
    ap.add_argument("--cpu", action="store_true",
                    help="with --concurrent: CPU-seconds per round by part (hub, engine, "
                         "kernels, the rest), p50s printed at the end")
    ap.add_argument("--no-build", action="store_true",
                    help="take the kernel image as the engine holds it (no images/build.sh: "
                         "images/ may hold someone's unfinished change)")
    ap.add_argument("--verbose", action="store_true",
                    help="with --concurrent: when each server's POST was answered and when it "
                         "was ready, per round")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    gateway = prepare(args.no_build)
    tmp = tempfile.mkdtemp(prefix="bai-bench-")
    variants: list = []
    try:
        os.makedirs(os.path.join(tmp, "a"))
        os.makedirs(os.path.join(tmp, "b"))
        makers = (lambda: Ours(os.path.join(tmp, "a"), args.pool),
                  lambda: DockerSpawnerHub(os.path.join(tmp, "b"), gateway),
                  DockerRun)
        if args.concurrent or args.pool:
            makers = (makers[0], makers[2])
        start_variants(makers, variants, verbose=args.verbose, cpu=args.cpu)
        times = run_rounds(variants, args.runs, lambda v: v.run_many(args.concurrent)
                           if args.concurrent else v.run_once())
        pool_stats = variants[0].pool_stats() if args.pool else {}
    finally:
        close_variants(variants, tmp, args.keep_logs)

    # Printed after the cleanup, so that the summary line is the very last line of output.
    if args.pool:
        n = args.concurrent or 1
        print(f"warm pool of {args.pool}, {n} at once, over {args.runs} rounds (s): p50 min max")
        p50 = {name: statistics.median(ts) for name, ts in times.items()}
        for name, ts in times.items():
            print(f"{name:<15}{p50[name]:>8.3f}{min(ts):>8.3f}{max(ts):>8.3f}")
        if args.cpu:
            print_cpu(variants)
        ok = p50["ours"] < 0.5
        print(f"ours p50 {p50['ours']:.3f} s (target < 0.5 s: {'met' if ok else 'MISSED'})")
        if n > 1:
            each = variants[0].each_ready
            print(f"each server's own spawn-to-ready over the {len(each)} starts: p50 "
                  f"{statistics.median(each):.3f} s, min {min(each):.3f}, max {max(each):.3f}")
        print(f"pool={args.pool} concurrent={n} ours_p50_s={p50['ours']:.3f} "
              f"docker_run_p50_s={p50['docker_run']:.3f} hits={pool_stats.get('hits')} "
              f"misses={pool_stats.get('misses')}", flush=True)
        return 0
    if args.concurrent:
        n = args.concurrent
        print(f"{n} at once, time until the last answers, over {args.runs} rounds (s):")
        p50 = {name: statistics.median(ts) for name, ts in times.items()}
        for name, ts in times.items():
            print(f"{name:<15}{p50[name]:>8.3f}{min(ts):>8.3f}{max(ts):>8.3f}")
        r = p50["ours"] / p50["docker_run"]
        if args.cpu:
            print_cpu(variants)
        print(f"ratio ours/docker_run (p50) = {r:.3f}  (target <= 1.1: {'met' if r <= 1.1 else 'MISSED'})")
        print(f"concurrent={n} ours_p50_s={p50['ours']:.3f} docker_run_p50_s={p50['docker_run']:.3f} "
              f"ratio_vs_docker_run={r:.3f}", flush=True)
        return 0
    print(f"spawn latency over {args.runs} runs (s):")
    print(f"{'variant':<15}{'p50':>8}{'p95':>8}{'min':>8}{'max':>8}")
    p50 = {}
    for name, ts in times.items():
        p50[name] = statistics.median(ts)
        print(f"{name:<15}{p50[name]:>8.3f}{pct(ts, 95):>8.3f}{min(ts):>8.3f}{max(ts):>8.3f}")
    r_b = p50["ours"] / p50["dockerspawner"]
    r_c = p50["ours"] / p50["docker_run"]
    print(f"ratio ours/dockerspawner (p50) = {r_b:.3f}  (target <= 1.0: {'met' if r_b <= 1.0 else 'MISSED'})")
    print(f"ratio ours/docker_run    (p50) = {r_c:.3f}  (target <= 1.2: {'met' if r_c <= 1.2 else 'MISSED'})")
    print(f"ours_p50_s={p50['ours']:.3f} dockerspawner_p50_s={p50['dockerspawner']:.3f} "
          f"docker_run_p50_s={p50['docker_run']:.3f} ratio_vs_dockerspawner={r_b:.3f} "
          f"ratio_vs_docker_run={r_c:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; everything started was removed")
        sys.exit(130)
