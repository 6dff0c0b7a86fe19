"""Images from a registry (issue 25): a session whose image must be pulled, and a rescan.

    python benchmarks/images.py [--runs N] [--tags 200]

A real ``docker-registry`` (tests/registry.py: loopback, htpasswd auth, TLS) holds an
image built ``FROM`` the kernel image with a 64 MiB layer of its own. Each round removes
the image from the engine, then measures, in an order that turns each round:

  (a) ours:      an in-process manager (tests/inproc.py, SQLite, an embedded Docker agent)
                 with the registry configured and rescanned; a batch session of the image
                 running ``true`` (0.5 CPU, 512 MiB): from just before enqueue until the
                 record says RUNNING (the scheduling, the pull, shown as the session's
                 progress, the session's own network, the container's create and start).
  (b) bare:      ``docker pull`` of the same reference (the registry's credentials in a
                 docker config of its own), then ``docker run -d`` of it as the issue names
                 it (Docker's default bridge, no limits), until ``docker run`` returns (the
                 container started).
  (d) no net:    the same as (b) with ``--network none`` (no network at all: the floor).
  (c) like ours: the same pull, then ``docker run -d`` on a user-defined bridge network
                 with a session's limits (0.5 CPU, 512 MiB, its pids limit, tmpfs /tmp and
                 /var/tmp, no-new-privileges): the container a session's kernel is (on a
                 network of its own, where the session's other kernels reach it by name:
                 Docker's embedded DNS makes such a start about 70 ms slower than one on
                 the default bridge). The network is made before the clock starts; (a)
                 makes its session's network while it pulls.

Then the rescan: the registry's repository gets ``--tags`` more tags (manifests put
through the registry API, so each tag is a manifest and a config the rescan reads), and
the manager's rescan (registry API v2 catalogue, tags, manifests, config blobs; the
catalogue written) is timed. Targets: ratio at most 1.1, rescan under 10 s. Last line
(``ratio``: against (c); ``ratio_bare``: against (b); ``ratio_nonet``: against (d)):

    pull_start_ours_p50_s=<f> pull_run_docker_p50_s=<f> pull_run_bare_p50_s=<f>
    pull_run_nonet_p50_s=<f> ratio=<f> ratio_bare=<f> ratio_nonet=<f> rescan_tags=<n>
    rescan_s=<f>

Everything it makes (registry, images, containers, temp dirs) is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from jupyterhub_backendai.common.slots import ResourceSlot  # noqa: E402
from jupyterhub_backendai.manager import registries  # noqa: E402
from jupyterhub_backendai.manager.access import Principal  # noqa: E402
from tests.inproc import DEAD, make_user, running_manager, wait_status  # noqa: E402
from tests.registry import Registry, build_labelled, remove_images  # noqa: E402
from tests.services import foreign_subnets, image_tag  # noqa: E402

ROOT = Principal(user_id="root", username="root", email="root@example.com", role="superadmin",
                 domain="default")
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def build_and_push(reg: Registry, tmp: Path) -> str:
    d = tmp / "fat"
    d.mkdir()
    (d / "data").write_bytes(os.urandom(64 * 2**20))
    fat = image_tag("bench-fat")
    (d / "Dockerfile").write_text("FROM backendai/python-kernel:latest\nCOPY data /opt/payload\n")
    subprocess.run(["docker", "build", "-q", "-t", fat, str(d)], check=True, capture_output=True)
    tag = build_labelled(tmp, "bench-kernel", {"ai.backend.test.bench": "1"}, base=fat)
    ref = reg.push(tag, "bench/python", "v1")
    remove_images(tag, fat)
    return ref


async def add_tags(reg: Registry, n: int) -> None:
    """``n`` more tags of bench/python:v1, put through the registry API."""
    auth = registries.basic_auth({"username": reg.username, "password": reg.password})
    ctx = ssl.create_default_context(cadata=reg.ca_pem.decode())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
        async with http.get(f"{reg.url}/v2/bench/python/manifests/v1",
                            headers={**auth, "Accept": MANIFEST_V2}) as r:
            body = await r.read()
            ctype = r.headers["Content-Type"]
        sem = asyncio.Semaphore(16)

        async def put(i: int) -> None:
            async with sem, http.put(f"{reg.url}/v2/bench/python/manifests/t{i:04d}", data=body,
                                     headers={**auth, "Content-Type": ctype}) as r:
                assert r.status == 201, await r.text()

        await asyncio.gather(*(put(i) for i in range(n)))


NETWORK = "bai-bench-images"
LIKE_A_SESSION = ["--network", NETWORK, "--cpus", "0.5", "--memory", "512m",
                  "--memory-swap", "512m", "--pids-limit", "1024",
                  "--tmpfs", "/tmp:rw,exec,nosuid,nodev,mode=1777,size=1g",
                  "--tmpfs", "/var/tmp:rw,exec,nosuid,nodev,mode=1777,size=1g",
                  "--security-opt", "no-new-privileges"]


def docker_pull_run(reg: Registry, ref: str, like_a_session: str) -> float:
    """``docker pull`` then ``docker run -d`` (returns once the container started); the
    container is removed after the clock stopped."""
    opts = {"session": LIKE_A_SESSION, "bare": [], "none": ["--network", "none"]}[like_a_session]
    t0 = time.perf_counter()
    reg.docker("pull", "-q", ref)
    cid = subprocess.run(["docker", "run", "-d", *opts, ref, "true"],
                         check=True, capture_output=True, text=True).stdout.strip()
    took = time.perf_counter() - t0
    subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    return took


async def main(args) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-images-"))
    reg = Registry().start()
    ref = None
    try:
        subprocess.run(["docker", "network", "create", "--subnet", foreign_subnets()[0], NETWORK],
                       check=True,
                       capture_output=True)
        print("building and pushing the image (once) ...", flush=True)
        ref = build_and_push(reg, tmp)
        ours, ended = [], []
        docker_runs: dict[str, list[float]] = {"session": [], "bare": [], "none": []}

        def configure(c):
            c.BackendAIManager.image_catalogue = True  # (the default; said for the reader)

        async with running_manager(f"sqlite:///{tmp}/db.sqlite", tmp, "docker",
                                   configure=configure, retries=0) as mgr:
            user = await make_user(mgr)
            await mgr.registries.create(ROOT, {
                "name": "bench", "url": reg.url, "username": reg.username,
                "password": reg.password, "ca_cert": reg.ca_pem.decode()})
            await mgr.registries.rescan(ROOT, "bench")
            for i in range(args.runs + 1):  # round 0: warm-up, not counted
                kinds = ("ours", "session", "bare", "none")
                order = kinds[i % 4:] + kinds[:i % 4]
                for which in order:
                    remove_images(ref)
                    if which in docker_runs:
                        took = docker_pull_run(reg, ref, like_a_session=which)
                        (docker_runs[which] if i else []).append(took)
                    else:
                        t0, wall0 = time.perf_counter(), dt.datetime.now(dt.UTC)
                        sid = await mgr.enqueue(
                            username=user, name=f"b{i}", image=ref,
                            slots=ResourceSlot(cpu="0.5", mem=512 * 2**20), environ={},
                            service_prefix="/", session_type="batch", startup_command="true")
                        s = await wait_status(mgr, sid, DEAD, timeout=600)
                        whole = time.perf_counter() - t0
                        assert s.status == "TERMINATED", s.status_info
                        # The start: until the record says RUNNING (the container started).
                        running = dt.datetime.fromisoformat(s.status_history["RUNNING"])
                        took = (running - wall0).total_seconds()
                        (ended if i else []).append(whole)
                        if args.verbose:
                            print("  ", {k: v for k, v in sorted(
                                (s.status_history or {}).items(), key=lambda kv: kv[1])})
                        (ours if i else []).append(took)
                    print(f"round {i} {which}: {took:.2f} s", flush=True)

            await add_tags(reg, args.tags)
            t0 = time.perf_counter()
            out = await mgr.registries.rescan(ROOT, "bench")
            rescan_s = time.perf_counter() - t0
            print(f"rescan: {json.dumps(out)} in {rescan_s:.2f} s", flush=True)
        o = statistics.median(ours)
        b, n, z = (statistics.median(docker_runs[k]) for k in ("session", "bare", "none"))
        print(f"(ours until the batch session had ended and its container was removed: "
              f"p50 {statistics.median(ended):.3f} s)")
        print(f"pull_start_ours_p50_s={o:.3f} pull_run_docker_p50_s={b:.3f} "
              f"pull_run_bare_p50_s={n:.3f} pull_run_nonet_p50_s={z:.3f} ratio={o / b:.2f} "
              f"ratio_bare={o / n:.2f} ratio_nonet={o / z:.2f} "
              f"rescan_tags={out['found']} rescan_s={rescan_s:.3f}")
    finally:
        if ref:
            remove_images(ref)
        subprocess.run(["docker", "network", "rm", NETWORK], capture_output=True)
        reg.stop()
        subprocess.run(["rm", "-rf", str(tmp)])


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tags", type=int, default=200)
    p.add_argument("--verbose", action="store_true", help="each session's status history")
    asyncio.run(main(p.parse_args()))
