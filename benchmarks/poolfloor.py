"""The floor of a pooled morning rush (issue 30): how much of N pooled starts at once is
the platform's own, and how much is JupyterHub's and the servers' that nothing of ours
can remove.

    python benchmarks/poolfloor.py [--concurrent N] [--runs R] [--cpu] [--no-build]

Three measurements in one run, rounds interleaved, one unmeasured warm-up round first,
all on the same kernel image (backendai/python-kernel:latest):

  (a) ours:        ``spawn.py --pool N --concurrent N``: a warm pool of N (0.5 CPU,
                   512 MiB), N sessions requested at once through our hub (README install,
                   Docker backend), each taking a pooled kernel; seconds from the POSTs
                   until the last server answers through the proxy.
  (b) servers:     N containers of the image with the same limits, each running the
                   product's pool waiter (agent/warmpool.py: its imports done, waiting for
                   its binding file), bound at once by writing their binding files
                   straight into their inboxes: no hub, no scheduler, no agent, no engine
                   call. Seconds until the last server answers on its own port. Their hub
                   is a stand-in in this process that answers the servers' calls at once.
                   The containers run on the host network (no published-port hop).
  (c) jupyterhub:  stock JupyterHub and its proxy (CHP), its database in WAL as ours, with
                   a spawner whose start returns an already-running stand-in server at
                   once: N spawns at once through the REST API, seconds until the last
                   answers through the proxy. JupyterHub's own part of a start.

(b) + (c) is the floor: what N pooled starts at once would take if the platform's own
part (the spawner's checks, the record, scheduling, binding, the engine's calls) cost
nothing. It is a model: in a real start JupyterHub's part comes before the server's, as
here, but the two also overlap a little (JupyterHub answers the servers' first calls).

With ``--cpu``, also the CPU-seconds each spent per round, by part (spawn.py's meter:
the hub's processes, the engine, the round's containers, the machine): on a machine whose
cores the rush fills, the wall time follows the CPU.

Last line:

    concurrent=<N> ours_p50_s=<f> servers_p50_s=<f> jupyterhub_p50_s=<f> floor_s=<f> ours_over_floor_s=<f> ratio_vs_floor=<f>

Everything it starts (hubs, proxies, containers, temp dirs) is removed at the end, also on
Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from spawn import (  # noqa: E402
    CPU,
    MEM,
    READY_TIMEOUT,
    STOCK_HUB_CONFIG,
    USER,
    CpuMeter,
    DockerSpawnerHub,
    Ours,
    close_variants,
    docker,
    log,
    prepare,
    print_cpu,
    run_rounds,
    start_variants,
    wait_status,
)

from jupyterhub_backendai.agent import warmpool as pool  # noqa: E402
from tests.hub import KERNEL_IMAGE  # noqa: E402
from tests.services import free_port  # noqa: E402

# -- (b): the servers alone ---------------------------------------------------------------


class StandInHub(http.server.BaseHTTPRequestHandler):
    """What a bound server asks of its hub at start (its version, its first activity),
    answered at once."""

    version = "0"

    def _ok(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's name)
        self._ok({"version": self.version})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._ok({})

    def log_message(self, *args):
        pass


class PooledServers:
    """(b): N pooled waiters bound by their binding files alone."""

    name = "servers"
    verbose = False
    meter: CpuMeter | None = None

    def __init__(self, tmp: str, n: int):
        import jupyterhub

        self.dir, self.n = tmp, n
        self.label = f"ai.backend.bench={os.getpid()}"
        StandInHub.version = jupyterhub.__version__
        self.hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInHub)
        self.hub_port = self.hub.server_address[1]
        threading.Thread(target=self.hub.serve_forever, daemon=True).start()
        self.waiter = os.path.join(tmp, "waiter")
        self.rounds = 0
        self.ready: list[tuple[str, int]] = []  # (kernel dir, port) of this round's waiters

    def root_pid(self) -> None:
        return None  # no hub: the stand-in answers in this process

    def start(self) -> None:
        with open(self.waiter, "w") as f:
            f.write(pool.WAITER)
        os.chmod(self.waiter, 0o755)

    def before_round(self) -> None:
        """Untimed: N waiters started, until each says it is ready."""
        self.rounds += 1
        self.ready = []
        for i in range(self.n):
            kdir = os.path.join(self.dir, f"r{self.rounds}k{i}")
            for sub in ("inbox", "work"):
                os.makedirs(os.path.join(kdir, sub))
                os.chown(os.path.join(kdir, sub), pool.KERNEL_UID, pool.KERNEL_UID)
            docker("run", "-d", "--label", self.label, "--network", "host", "--cpus", CPU,
                   "--memory", MEM, "-v", f"{kdir}/inbox:{pool.INBOX}",
                   "-v", f"{kdir}/work:/home/work", "-v", f"{self.waiter}:{pool.WAITER_PATH}:ro",
                   KERNEL_IMAGE, pool.WAITER_PATH)
            self.ready.append((kdir, free_port()))
        deadline = time.monotonic() + READY_TIMEOUT
        for cid in self.containers():
            while pool.READY_LINE not in docker("logs", cid, check=False):
                if time.monotonic() > deadline:
                    raise TimeoutError("a pooled waiter was not ready")
                time.sleep(0.2)
        time.sleep(2)  # their imports' tail settled, as a full pool's would be

    def environ(self, i: int, port: int) -> dict:
        prefix = f"/user/{USER}/floor{i}/"
        return {
            "JUPYTERHUB_API_TOKEN": "f" * 32,
            "JUPYTERHUB_API_URL": f"http://127.0.0.1:{self.hub_port}/hub/api",
            "JUPYTERHUB_CLIENT_ID": f"jupyterhub-user-{USER}-floor{i}",
            "JUPYTERHUB_SERVICE_PREFIX": prefix, "JUPYTERHUB_BASE_URL": "/",
            "JUPYTERHUB_USER": USER, "JUPYTERHUB_SERVER_NAME": f"floor{i}",
            "JUPYTERHUB_OAUTH_CALLBACK_URL": prefix + "oauth_callback", "JUPYTERHUB_HOST": "",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}{prefix}",
            "JUPYTERHUB_OAUTH_SCOPES": "[]", "JUPYTERHUB_OAUTH_ACCESS_SCOPES": "[]",
            "JUPYTERHUB_ACTIVITY_URL": f"http://127.0.0.1:{self.hub_port}/hub/api/users/{USER}/activity",
            "HOME": "/home/work",
        }

    def run_many(self, n: int) -> float:
        # The binding files made first (untimed), then put in place at once: the timed
        # part is the servers' own start.
        staged = []
        for i, (kdir, port) in enumerate(self.ready):
            tmp = os.path.join(kdir, "inbox", ".bind")
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                json.dump({"environ": self.environ(i, port)}, f)
            os.chown(tmp, pool.KERNEL_UID, pool.KERNEL_UID)
            staged.append((tmp, os.path.join(kdir, "inbox", pool.BIND_NAME), i, port))
        done: list[float] = []

        def answered(i: int, port: int) -> None:
            wait_status(requests.Session(), f"http://127.0.0.1:{port}/user/{USER}/floor{i}/api",
                        {}, time.monotonic() + READY_TIMEOUT)
            done.append(time.perf_counter() - t0)

        if self.meter:
            self.meter.start(self.containers())
        t0 = time.perf_counter()
        for tmp, final, _, _ in staged:
            os.rename(tmp, final)
        threads = [threading.Thread(target=answered, args=(i, port)) for _, _, i, port in staged]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(done) != len(staged):
            raise RuntimeError("a bound server did not answer")
        if self.meter:
            self.meter.stop(self.containers())
        if self.verbose:
            log("  servers: each ready (s): " + "  ".join(f"{d:.2f}" for d in sorted(done)))
        self.remove()
        return max(done)

    def containers(self) -> list[str]:
        return docker("ps", "-aq", "--filter", f"label={self.label}", check=False).split()

    def remove(self) -> None:
        left = self.containers()
        if left:
            docker("rm", "-f", *left, check=False)

    def close(self) -> None:
        self.remove()
        self.hub.shutdown()
        self.hub.server_close()


# -- (c): JupyterHub's own part -----------------------------------------------------------

INSTANT_CONFIG = """\
# Stock JupyterHub whose spawner returns an already-running stand-in server at once.
import http.server, socket, threading
from jupyterhub.spawner import Spawner
from sqlalchemy import event
from sqlalchemy.engine import Engine

@event.listens_for(Engine, "connect")
def _wal(conn, _record):  # as our hub runs JupyterHub's database (WAL, synchronous=NORMAL)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")

class _Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{{}}")
    def log_message(self, *args):
        pass

class InstantSpawner(Spawner):
    _answering = None
    async def start(self):
        self._answering = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
        threading.Thread(target=self._answering.serve_forever, daemon=True).start()
        return ("127.0.0.1", self._answering.server_address[1])
    async def poll(self):
        return None if self._answering else 0
    async def stop(self, now=False):
        if self._answering:
            self._answering.shutdown()
            self._answering.server_close()
            self._answering = None

c = get_config()  # noqa: F821
c.JupyterHub.spawner_class = InstantSpawner
c.JupyterHub.bind_url = "http://127.0.0.1:{port}/"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
""" + STOCK_HUB_CONFIG


class InstantHub(DockerSpawnerHub):
    """(c): DockerSpawnerHub's process handling with the instant spawner's config."""

    name = "jupyterhub"

    def config_text(self, **stock) -> str:
        return INSTANT_CONFIG.format(**stock)

    def containers(self) -> list[str]:
        return []


# -- main ---------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrent", type=int, default=5, metavar="N",
                    help="N starts at once, and a warm pool of N for ours (default 5)")
    ap.add_argument("--runs", type=int, default=5, help="measured rounds (default 5)")
    ap.add_argument("--no-build", action="store_true",
                    help="take the kernel image as the engine holds it (no images/build.sh)")
    ap.add_argument("--verbose", action="store_true", help="each start's time, per round")
    ap.add_argument("--cpu", action="store_true",
                    help="CPU-seconds per round by part (hub, engine, kernels, the rest)")
    args = ap.parse_args()
    if args.runs < 1 or args.concurrent < 1:
        ap.error("--runs and --concurrent must be at least 1")

    gateway = prepare(args.no_build)
    n = args.concurrent
    tmp = tempfile.mkdtemp(prefix="bai-floor-")
    variants: list = []
    try:
        for sub in ("a", "b", "c"):
            os.makedirs(os.path.join(tmp, sub))
        start_variants((lambda: Ours(os.path.join(tmp, "a"), n),
                        lambda: PooledServers(os.path.join(tmp, "b"), n),
                        lambda: InstantHub(os.path.join(tmp, "c"), gateway)),
                       variants, verbose=args.verbose, cpu=args.cpu)
        times = run_rounds(variants, args.runs, lambda v: v.run_many(n))
    finally:
        close_variants(variants, tmp)

    p50 = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"{n} pooled starts at once, until the last answers, over {args.runs} rounds (s): "
          "p50 min max")
    for name, ts in times.items():
        print(f"{name:<15}{p50[name]:>8.3f}{min(ts):>8.3f}{max(ts):>8.3f}")
    if args.cpu:
        print_cpu(variants)
    floor = p50["servers"] + p50["jupyterhub"]
    over = p50["ours"] - floor
    print(f"floor (servers + jupyterhub) {floor:.3f} s; ours {p50['ours']:.3f} s, "
          f"{over:.3f} s over it (ratio {p50['ours'] / floor:.2f}); "
          f"issue 30's target: under 0.5 s ({'reachable' if floor < 0.5 else 'out of reach'} "
          "by this floor)")
    print(f"concurrent={n} ours_p50_s={p50['ours']:.3f} servers_p50_s={p50['servers']:.3f} "
          f"jupyterhub_p50_s={p50['jupyterhub']:.3f} floor_s={floor:.3f} "
          f"ours_over_floor_s={over:.3f} ratio_vs_floor={p50['ours'] / floor:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; everything started was removed")
        sys.exit(130)
