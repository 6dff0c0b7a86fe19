"""App proxy throughput/latency: an app in a session through the hub's path, straight, and
behind stock JupyterHub + DockerSpawner.

    python benchmarks/proxy.py [--seconds 3] [--rounds 3] [--clients 1,20] [--cpu 0.5] [--mem 512m]

The same app (a small tornado app: ``/small`` 100 bytes, ``/big`` 10 MiB written in 1 MiB
pieces, ``/ws`` websocket echo) on the same image (``backendai/python-kernel``) with the
same limits (``--cpu``/``--mem``, default 0.5 CPU and 512 MiB as in benchmarks/spawn.py) is
measured

  (a) hub:    our hub (tests/hub.py: launcher, CHP, in-process agent, Docker backend,
              SQLite), a server of a fresh user, the app started in its kernel on port
              8070; ``<hub>/user/<name>/<server>/proxy/8070/...`` with the user's token
              (CHP -> jupyterhub-singleuser auth -> jupyter-server-proxy, streamed by the
              image's extension -> app);
  (b) direct: the app alone in a container of the same image on a network the benchmark
              creates, its port published on 127.0.0.1 (no auth, no proxy; the agent
              publishes only a session's Jupyter port);
  (c) stock:  stock JupyterHub + DockerSpawner (benchmarks/spawn.py's hub: DummyAuthenticator,
              its own CHP) with the same image, the image's own server config hidden (an
              empty file mounted over it), so jupyter-server-proxy 4.6.0 runs as shipped;
              the app started in the server's container, reached at
              ``<hub>/user/admin/<server>/proxy/8070/...`` with a token with access:servers;
  (e) front:  (a)'s setup with the app front (BACKENDAI_APP_FRONT=nginx,
              jupyterhub_backendai/appfront.py): a second hub, the same app in its
              session; nginx asks the session's server about each request (auth_request
              through CHP) and passes it straight to the container's address;
  (d) chp:    a CHP of its own (the hub's binary and version) whose default target is (b)'s
              published port: no auth, no Jupyter server. The ceiling any CHP-based fast
              path could reach (what CHP alone costs over (b)); not a route the hub makes.

For each of small and big responses and 1 and N concurrent clients (aiohttp, keep-alive,
one connection per client; failed requests counted, not timed): requests/s, MB/s, p50/p99
latency over ``--seconds`` of closed-loop load. Websocket: round-trip p50/p99 of 64-byte
messages (200 per client). ``--rounds`` rounds over all rows, the three variants one after
the other in each row, so that drift on a shared machine hits all three alike; the
medians over the rounds are reported (each round's rows go to stderr as they come).
Small and websocket rows first, 10 MiB rows last (stock jupyter-server-proxy buffers whole
responses: its session may be OOM-killed there). At the end each container's peak memory
(cgroup) is printed. The last line is machine-readable:

    small_rps_ratio_direct=<f> big_mbps_ratio_direct=<f> ratio_vs_stock=<f> ws_rtt_p50_ms=<f>
    small_rps_ratio_front=<f> big_mbps_ratio_front=<f>

small/big: a/b at the highest client count (a/d, d/b and e/b are printed too);
*_front: e/b likewise (behind the front; websockets take (a)'s path there); ratio_vs_stock: the smallest a/c over the
small and big rows (requests/s, MB/s) and the websocket rows (c's p50 over a's), rows where
(c) failed requests left out (they are printed); ws_rtt_p50_ms: through the hub, 1 client.
Everything started is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import requests

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import spawn as stock  # noqa: E402

from tests.conftest import shutdown_hub as close_hub  # noqa: E402
from tests.hub import CHP, KERNEL_IMAGE  # noqa: E402
from tests.services import foreign_subnets, free_port, wait_port  # noqa: E402
from tests.test_service_ports import World, start_hub  # noqa: E402

APP_PORT = 8070
APP = (
    "import asyncio, tornado.web, tornado.websocket\n"
    "PIECE = b'x' * 2**20\n"
    "class S(tornado.web.RequestHandler):\n"
    "    def get(self): self.write(b'y' * 100)\n"
    "class B(tornado.web.RequestHandler):\n"
    "    async def get(self):\n"
    "        self.set_header('Content-Length', str(10 * len(PIECE)))\n"
    "        for _ in range(10):\n"
    "            self.write(PIECE)\n"
    "            await self.flush()\n"
    "class W(tornado.websocket.WebSocketHandler):\n"
    "    def on_message(self, m): self.write_message(m)\n"
    "async def main():\n"
    "    tornado.web.Application([(r'.*/small', S), (r'.*/big', B), (r'.*/ws', W)])"
    f".listen({APP_PORT}, '0.0.0.0')\n"
    "    await asyncio.Event().wait()\n"
    "asyncio.run(main())\n"
)
WAIT_APP = (f"for i in $(seq 100); do python -c \"import socket; socket.create_connection("
            f"('127.0.0.1',{APP_PORT}))\" 2>/dev/null && exit 0; sleep 0.1; done; exit 1")
STOCK_SERVER = "proxybench"
LABEL = f"ai.backend.bench-proxy={os.getpid()}"


def docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True,
                          check=check).stdout.strip()


def peak_mib(cid: str) -> str:
    """The container's peak memory so far (cgroup v2 memory.peak, else v1's max usage)."""
    for path in ("/sys/fs/cgroup/memory.peak", "/sys/fs/cgroup/memory/memory.max_usage_in_bytes"):
        r = subprocess.run(["docker", "exec", cid, "cat", path], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip().isdigit():
            return f"{int(r.stdout) / 2**20:.0f} MiB"
    state = docker("inspect", "-f", "{{.State.Status}} oom={{.State.OOMKilled}}", cid, check=False)
    return f"n/a ({state or 'container gone'})"


class _Tmp:
    def mktemp(self, name):
        return Path(tempfile.mkdtemp(prefix=name))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def http_load(url, headers, clients, seconds):
    lat, nbytes, errors = [], 0, {}
    stop = time.monotonic() + seconds

    async def one():
        nonlocal nbytes
        async with aiohttp.ClientSession(headers=headers) as s:
            while time.monotonic() < stop:
                t = time.perf_counter()
                try:
                    async with s.get(url) as r:
                        body = await r.read()
                        status = r.status
                except aiohttp.ClientError as e:
                    status, body = type(e).__name__, b""
                if status != 200:
                    errors[status] = errors.get(status, 0) + 1
                    continue
                lat.append(time.perf_counter() - t)
                nbytes += len(body)

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(clients)))
    dt = time.monotonic() - t0
    return {"rps": len(lat) / dt, "mbps": nbytes / dt / 2**20, "errors": errors,
            "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3}


async def ws_rtt(url, headers, clients, n=200):
    lat, errors = [], {}

    async def one():
        try:
            async with aiohttp.ClientSession(headers=headers) as s, s.ws_connect(url) as ws:
                msg = "z" * 64
                for _ in range(n):
                    t = time.perf_counter()
                    await ws.send_str(msg)
                    if (await ws.receive_str()) != msg:
                        raise ValueError("echo differs")
                    lat.append(time.perf_counter() - t)
        except (aiohttp.ClientError, TimeoutError, ValueError, TypeError) as e:
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

    await asyncio.gather(*(one() for _ in range(clients)))
    return {"p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "errors": errors}


def start_direct() -> tuple[str, str, str]:
    """(b): the app alone in a container of the image, on the benchmark's own network,
    its port published on 127.0.0.1. Returns (container, network, base URL)."""
    net = f"bai-bench-proxy-{os.getpid()}"
    docker("network", "create", "--subnet", foreign_subnets()[0], "--label", LABEL, net)
    try:
        cid = docker("run", "-d", "--rm", "--label", LABEL, "--network", net, "--cpus",
                     stock.CPU, "-m", stock.MEM, "-p", f"127.0.0.1::{APP_PORT}",
                     "--entrypoint", "python", KERNEL_IMAGE, "-c", APP)
    except subprocess.CalledProcessError:
        docker("network", "rm", net, check=False)
        raise
    docker("exec", cid, "bash", "-c", WAIT_APP)
    port = docker("port", cid, f"{APP_PORT}/tcp").split()[0].rsplit(":", 1)[1]
    return cid, net, f"http://127.0.0.1:{port}"


def start_chp(target: str) -> tuple[subprocess.Popen, str]:
    """(d): a CHP of its own in front of ``target`` (its default target): no auth, no
    Jupyter server. Returns (process, base URL)."""
    port, api = free_port(), free_port()
    env = dict(os.environ, CONFIGPROXY_AUTH_TOKEN=os.urandom(16).hex())
    proc = subprocess.Popen([CHP, "--ip", "127.0.0.1", "--port", str(port), "--api-ip",
                             "127.0.0.1", "--api-port", str(api), "--default-target", target,
                             "--log-level", "warn"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    wait_port(port, timeout=30, proc=proc)
    return proc, f"http://127.0.0.1:{port}/user/bench/proxy/{APP_PORT}"


def start_stock(hub) -> tuple[str, str, dict]:
    """(c): a server of the stock hub's admin, with the app started in it.
    Returns (container, base URL, headers)."""
    r = hub.api("POST", f"/users/{stock.USER}/servers/{STOCK_SERVER}")
    if r.status_code not in (201, 202):
        raise RuntimeError(f"stock spawn answered {r.status_code}: {r.text}\n{hub.log()}")
    headers = {"Authorization": f"token {hub.token}"}
    stock.wait_status(requests.Session(),
                      f"{hub.base}/user/{stock.USER}/{STOCK_SERVER}/api/status",
                      headers, time.monotonic() + stock.READY_TIMEOUT)
    [cid] = hub.containers()
    docker("exec", "-d", cid, "python", "-c", APP)
    docker("exec", cid, "bash", "-c", WAIT_APP)
    return cid, f"{hub.base}/user/{stock.USER}/{STOCK_SERVER}/proxy/{APP_PORT}", headers


def hub_with_app(args, front: bool):
    """(a) or (e): our hub (with the app front or not), a server of a fresh user with the
    app started in its kernel. Returns (hub, world, the kernel's container)."""
    hub = start_hub(_Tmp(), subdomains=False, front=front)
    try:
        hub.spawn = functools.partial(type(hub).spawn, hub,
                                      options={"cpu": args.cpu, "mem": args.mem})
        world = World(hub, subdomains=False)
        out = world.server.run(f"(nohup python -c {shlex.quote(APP)} >/tmp/bench.log 2>&1 &)"
                               f" && ({WAIT_APP}) && echo BENCH-''UP", "BENCH-UP")
        assert "BENCH-UP" in out, out
        [cid] = docker("ps", "-q", "--filter",
                       f"label=ai.backend.agent-id={hub.agent_id}").split()
    except BaseException:
        close_hub(hub)
        raise
    return hub, world, cid


def stock_hub(tmpdir: str):
    """benchmarks/spawn.py's stock JupyterHub + DockerSpawner, the image's own Jupyter server
    config hidden (an empty file mounted over it): jupyter-server-proxy as shipped."""
    gateway = stock.ensure_network()
    empty = os.path.join(tmpdir, "empty_jupyter_server_config.py")
    Path(empty).write_text("# the image's own config hidden: stock jupyter-server-proxy\n")
    os.chmod(tmpdir, 0o755)
    os.chmod(empty, 0o644)
    hub = stock.DockerSpawnerHub(tmpdir, gateway)
    with open(hub.config, "a") as f:
        f.write(f"c.DockerSpawner.volumes = {{{empty!r}: {{'bind': "
                "'/opt/venv/etc/jupyter/jupyter_server_config.py', 'mode': 'ro'}}\n")
    return hub


def fmt_errors(e: dict) -> str:
    return json.dumps(e) if e else "0"


def row(kind: str, c: int, v: str, r: dict) -> str:
    if kind == "ws":
        return (f"ws    clients={c:2} {v:8} rtt p50={r['p50_ms']:7.2f}ms "
                f"p99={r['p99_ms']:7.2f}ms errors={fmt_errors(r['errors'])}")
    return (f"{kind:5} clients={c:2} {v:8} rps={r['rps']:8.1f} MB/s={r['mbps']:8.1f} "
            f"p50={r['p50_ms']:7.2f}ms p99={r['p99_ms']:7.2f}ms errors={fmt_errors(r['errors'])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="load per row and round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds over all rows, variants interleaved; medians reported")
    ap.add_argument("--clients", default="1,20")
    ap.add_argument("--cpu", default=stock.CPU,
                    help="CPU limit of every variant's container (default %(default)s)")
    ap.add_argument("--mem", default=stock.MEM,
                    help="memory limit of every variant's container (default %(default)s)")
    args = ap.parse_args()
    counts = [int(x) for x in args.clients.split(",")]
    stock.CPU, stock.MEM = args.cpu, args.mem

    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    stock.ensure_image()
    tmp = tempfile.mkdtemp(prefix="bai-bench-proxy-")
    hub = fhub = shub = direct_cid = net = chp = None
    res: dict = {}
    peaks: dict = {}
    try:
        hub, world, ours_cid = hub_with_app(args, front=False)
        fhub, fworld, front_cid = hub_with_app(args, front=True)
        front_base = f"http://127.0.0.1:{fhub.port}{fworld.server.prefix}proxy/{APP_PORT}"
        r = requests.get(front_base + "/small", timeout=30,
                         headers={"Authorization": f"token {fworld.alice_token}"})
        if r.headers.get("X-Backendai-App-Path") != "front":
            raise RuntimeError(f"the front did not take the fast path: {r.status_code} {r.headers}")
        direct_cid, net, direct_base = start_direct()
        chp, chp_base = start_chp(direct_base)
        os.makedirs(os.path.join(tmp, "stock"))
        shub = stock_hub(os.path.join(tmp, "stock"))
        shub.start()
        stock_cid, stock_base, stock_headers = start_stock(shub)
        variants = {
            "a-hub": (f"http://127.0.0.1:{hub.port}{world.server.prefix}proxy/{APP_PORT}",
                      {"Authorization": f"token {world.alice_token}"}, ours_cid),
            "b-direct": (direct_base, {}, direct_cid),
            "c-stock": (stock_base, stock_headers, stock_cid),
            "d-chp": (chp_base, {}, None),
            "e-front": (front_base, {"Authorization": f"token {fworld.alice_token}"}, front_cid),
        }
        runs: dict = {}
        for rnd in range(1, args.rounds + 1):
            for kind in ("small", "ws", "big"):
                for c in counts:
                    for v, (base, headers, _) in variants.items():
                        if kind == "ws":
                            r = asyncio.run(ws_rtt(base.replace("http", "ws", 1) + "/ws",
                                                   headers, c))
                        else:
                            r = asyncio.run(http_load(f"{base}/{kind}", headers, c,
                                                      args.seconds))
                        runs.setdefault((kind, c, v), []).append(r)
                        print(f"round {rnd}: {row(kind, c, v, r)}", file=sys.stderr, flush=True)
        for key, rs in runs.items():
            res[key] = {k: statistics.median(r[k] for r in rs)
                        for k in rs[0] if k != "errors"}
            res[key]["errors"] = {}
            for r in rs:
                for e, n in r["errors"].items():
                    res[key]["errors"][e] = res[key]["errors"].get(e, 0) + n
        for v, (_, _, cid) in variants.items():
            if cid:
                peaks[v] = peak_mib(cid)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if shub is not None:
            try:
                shub.close()
            except Exception as e:  # keep cleaning the others
                print(f"cleanup of the stock hub: {e}", file=sys.stderr)
        if chp is not None:
            chp.terminate()
            try:
                chp.wait(10)
            except subprocess.TimeoutExpired:
                chp.kill()
        if direct_cid:
            docker("rm", "-f", direct_cid, check=False)
        if net:
            docker("network", "rm", net, check=False)
        if hub is not None:
            close_hub(hub)
        if fhub is not None:
            close_hub(fhub)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"medians over {args.rounds} rounds of {args.seconds:g} s per row "
          "(errors: summed):")
    for key, r in res.items():
        print(row(*key, r))
    print("peak memory (cgroup): " + "  ".join(f"{v}={p}" for v, p in peaks.items()))
    top = max(counts)
    small = res[("small", top, "a-hub")]["rps"] / res[("small", top, "b-direct")]["rps"]
    big = res[("big", top, "a-hub")]["mbps"] / res[("big", top, "b-direct")]["mbps"]
    vs_stock = []
    for (kind, c, v), r in res.items():
        if v != "c-stock":
            continue
        a = res[(kind, c, "a-hub")]
        if r["errors"] or a["errors"]:
            print(f"a/c {kind} clients={c}: left out (failures: a {fmt_errors(a['errors'])}, "
                  f"c {fmt_errors(r['errors'])})")
            continue
        ratio = (r["p50_ms"] / a["p50_ms"] if kind == "ws" else
                 a["rps"] / r["rps"] if kind == "small" else a["mbps"] / r["mbps"])
        print(f"a/c {kind} clients={c}: {ratio:.3f}")
        vs_stock.append(ratio)
    for kind, unit in (("small", "rps"), ("big", "mbps")):
        for c in counts:
            a, b, d, e = (res[(kind, c, v)][unit]
                          for v in ("a-hub", "b-direct", "d-chp", "e-front"))
            print(f"{kind} clients={c}: a/b={a / b:.3f} d/b={d / b:.3f} a/d={a / d:.3f} "
                  f"e/b={e / b:.3f}")
    for c in counts:
        a, b, d, e = (res[("ws", c, v)]["p50_ms"]
                      for v in ("a-hub", "b-direct", "d-chp", "e-front"))
        print(f"ws clients={c}: rtt p50 b/a={b / a:.3f} b/d={b / d:.3f} d/a={d / a:.3f} "
              f"b/e={b / e:.3f}")
    small_front = res[("small", top, "e-front")]["rps"] / res[("small", top, "b-direct")]["rps"]
    big_front = res[("big", top, "e-front")]["mbps"] / res[("big", top, "b-direct")]["mbps"]
    ws = res[("ws", min(counts), "a-hub")]["p50_ms"]
    print(f"small_rps_ratio_direct={small:.3f} big_mbps_ratio_direct={big:.3f} "
          f"ratio_vs_stock={min(vs_stock) if vs_stock else float('nan'):.3f} "
          f"ws_rtt_p50_ms={ws:.3f} small_rps_ratio_front={small_front:.3f} "
          f"big_mbps_ratio_front={big_front:.3f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted; everything started was removed", file=sys.stderr)
