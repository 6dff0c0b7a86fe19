"""Storage throughput: transfers straight to the storage proxy (tus + token) vs. a local copy.

    python benchmarks/storage.py [--size-mb 1024] [--rounds 3] [--small 10000]
                                 [--concurrency 16] [--client raw|aiohttp]
                                 [--official-cli] [--node-api]
                                 [--backendai-proxy [VENV]]

It starts a real ``backendai-storage-proxy`` (tests/services.py's StorageDaemon: a
subprocess on free loopback ports, a volume in a temp dir) with its client-facing
transfer API (``client_port``, storageproxy/transfer.py) and plays the manager's
part by signing the tokens itself (TransferTokens, the secret shared with the
daemon), so only the proxy's data path is measured. On one file of random bytes
written once:

  upload:   a tus upload: POST (creation), then PATCHes of 16 MiB, each on its own
            connection (the proxy ends the connection after a large PATCH), the
            body sent from the file with ``sendfile``; written to ``.tus/<id>`` and
            renamed into the folder after the last byte (a new name each round)
  download: GET /download with the token, the body spliced into a local file
  copy:     shutil.copyfile of the same file on the same file system (the baseline,
            measured in the same run: ``copy_file_range``, in the kernel)
  small:    ``--small`` files of 4 KiB, each one tus PATCH with its own token (signed
            beforehand), then each downloaded, ``--concurrency`` at a time over
            keep-alive connections (aiohttp); files per second over the up-and-down
            round trip of all of them (2 * n transfers / time)

``--client aiohttp`` moves the big file with aiohttp instead (16 MiB PATCH bodies
from memory, downloads in 4 MiB chunks written in a thread). ``--official-cli`` also
moves it with Backend.AI's own CLI (``.venv-bai23``: ``vfolder upload`` / ``vfolder
download``) through a hub (tests/hub.py, local backend, SQLite) whose folder lives on
the same daemon (cluster mode: the hub grants, the daemon moves the bytes), timed
around the whole command. ``--node-api`` also measures the manager's own node API
(HTTPStorageClient upload/download, what the hub's admin API uses).

``--backendai-proxy [VENV]`` also runs Backend.AI's own storage proxy (23.09, from
``VENV``, default ``.venv-bai-storage``: scripts/install-backendai-storage-proxy.sh)
side by side (BackendAIProxy: its own etcd and Redis, one worker, a vfs volume in the
same temp dir, loopback ports): the same file, the same client, the same ``settle``,
each operation on both proxies back to back (theirs first in every other round); its
tokens come from its manager API (``POST /folder/file/upload`` / ``download``) before
the timing, as ours are signed beforehand. It prints ours / theirs and appends
``backendai_upload_mb_s= backendai_download_mb_s= backendai_small_files_per_s=
vs_backendai_upload= vs_backendai_download= vs_backendai_small=`` to the last line.

Every timed phase starts alike (``settle``: ``sync``, and a file the size of the
source written and removed, so every phase writes into recycled page-cache pages).
Each round prints the CPU seconds the proxy and this client spent beside the wall
time. Median MB/s (10^6 bytes) over the rounds. Everything lives under one temp dir
on one file system, in the page cache (the proxy's overhead, not the disk).
Downloads are checked byte for byte once. The last line is machine-readable:

    upload_mb_s=<f> download_mb_s=<f> copy_mb_s=<f> upload_ratio=<f> download_ratio=<f> small_files_per_s=<f>

Everything it starts is removed at the end.

btrfs volumes (issue 26; as root, needs btrfs-progs):

``--volume-backend btrfs`` runs all of the above with the daemon's volumes on a btrfs
file system made for the run (a loop-mounted image under the temp dir, quotas on:
tests/btrfs_fs.py), the volumes' backend ``btrfs``; compare its ratios with a run
without it (the baseline, ``copy``, is measured on the same file system each time).

``--btrfs-ops`` measures, instead of the transfers, what the btrfs backend does
without touching the data, each against the baseline in the same run on the same
loop-mounted btrfs: ``clone`` of a folder holding ``--size-mb`` of random bytes (a
snapshot) against ``cp -r --reflink=never`` (a full copy, what a clone costs where the
file system cannot share blocks: vfs on ext4) and against plain ``cp -r``; ``usage``
of a folder of ``--files`` (default 100,000) small files from the qgroups against
the walk vfs does (``VFSVolume.folder_usage``, page cache warm); and the usage of a
folder listing's ``--listing`` (default 500, the API's largest page) folders in one read
(``folders_usage``, what a listing asks now) against one ``folder_usage`` each, eight at
a time (what a listing asked before: each a ``btrfs qgroup show --sync``). Medians of
``--rounds``. The last line:

    clone_s=<f> cp_s=<f> cp_reflink_s=<f> clone_ratio=<f> usage_s=<f> walk_s=<f> usage_ratio=<f>
    listing_s=<f> listing_each_s=<f> listing_ratio=<f>
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import filecmp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from urllib.parse import urlsplit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import aiohttp  # noqa: E402

from jupyterhub_backendai.storageproxy.client import HTTPStorageClient  # noqa: E402
from jupyterhub_backendai.storageproxy.transfer import (  # noqa: E402
    TransferTokens,
    download_claims,
    upload_claims,
)
from tests.btrfs_fs import btrfs_fs  # noqa: E402
from tests.services import StorageDaemon, free_port  # noqa: E402

CHUNK = 1 << 20
TUS_CHUNK = 16 << 20
TUS = {"Tus-Resumable": "1.0.0"}


async def file_chunks(path: str):
    with open(path, "rb", buffering=0) as f:
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            yield chunk


async def bench_node_api(src: str, size: int, rounds: int, work: str) -> dict:
    daemon = StorageDaemon(os.path.join(work, "proxy-node"))
    os.makedirs(daemon.root)
    daemon.start()
    client = HTTPStorageClient(daemon.url, daemon.token)
    scope, folder = f"user:{uuid.uuid4().hex}", uuid.uuid4().hex
    results: dict[str, list[float]] = {"upload": [], "download": [], "copy": []}
    try:
        await client.create_folder("volume1", scope, folder)
        for r in range(rounds):
            t = time.perf_counter()
            name = f"big-{r}.bin"  # a new file each round: the same work as the first
            out = await client.upload("volume1", scope, folder, name, file_chunks(src))
            results["upload"].append(size / 1e6 / (time.perf_counter() - t))
            assert out["size"] == size, out

            dst = os.path.join(work, "downloaded.bin")
            t = time.perf_counter()
            got, chunks = await client.download("volume1", scope, folder, name)
            with open(dst, "wb", buffering=0) as f:
                async for chunk in chunks:
                    await asyncio.to_thread(f.write, chunk)
            results["download"].append(size / 1e6 / (time.perf_counter() - t))
            assert got == size
            if r == 0:
                assert filecmp.cmp(src, dst, shallow=False), "download differs from the upload"
            os.unlink(dst)
            await client.delete("volume1", scope, folder, name)

            cp = os.path.join(work, "copy.bin")
            t = time.perf_counter()
            shutil.copyfile(src, cp)
            results["copy"].append(size / 1e6 / (time.perf_counter() - t))
            os.unlink(cp)
            print(
                f"round {r + 1}: upload {results['upload'][-1]:.0f} MB/s, "
                f"download {results['download'][-1]:.0f} MB/s, copy {results['copy'][-1]:.0f} MB/s",
                flush=True,
            )
    finally:
        await client.close()
        daemon.stop()
    return {k: statistics.median(v) for k, v in results.items()}


async def tus_upload(http: aiohttp.ClientSession, url: str, src: str, size: int,
                     create: bool = True) -> None:
    if create:
        async with http.post(url, headers={**TUS, "Upload-Length": str(size)}) as r:
            assert r.status == 201, (r.status, await r.text())
            url = r.headers["Location"]
    offset = 0
    with open(src, "rb", buffering=0) as f:
        while offset < size:
            chunk = await asyncio.to_thread(f.read, TUS_CHUNK)
            async with http.patch(url, data=chunk, headers={
                    **TUS, "Upload-Offset": str(offset),
                    "Content-Type": "application/offset+octet-stream"}) as r:
                assert r.status == 204, (r.status, await r.text())
                offset = int(r.headers["Upload-Offset"])


async def get_to_file(http: aiohttp.ClientSession, url: str, dst: str) -> int:
    n = 0
    async with http.get(url) as r:
        assert r.status == 200, (r.status, await r.text())
        with open(dst, "wb", buffering=0) as f:
            async for chunk in r.content.iter_chunked(4 << 20):
                await asyncio.to_thread(f.write, chunk)
                n += len(chunk)
    return n


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of this process (all threads) or of ``pid``."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CPU:
    """CPU seconds the proxy and this client spent over a phase, beside its wall time."""

    def __init__(self, pid: int | list[int]):
        self.pids = pid if isinstance(pid, list) else [pid]

    def _proxy(self) -> float:
        return sum(cpu_seconds(p) for p in self.pids)

    def __enter__(self):
        self.t, self.d, self.c = time.perf_counter(), self._proxy(), cpu_seconds()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t
        self.proxy = self._proxy() - self.d
        self.client = cpu_seconds() - self.c

    def __str__(self):
        return f"[cpu s: proxy {self.proxy:.1f}, client {self.client:.1f}, wall {self.wall:.1f}]"


def settle(src: str, work: str) -> None:
    """The same start for every timed phase: no dirty pages waiting (sync), and as
    many page-cache pages just freed as the phase will fill (a copy of the source
    written and removed). Without it a phase that follows a removal (the copy, after
    the round's upload is deleted) writes into recycled pages and one that follows
    none (the download) into fresh ones, which on this VM costs the writer about
    three times the CPU."""
    ballast = os.path.join(work, "ballast.bin")
    shutil.copyfile(src, ballast)
    os.sync()
    os.unlink(ballast)


def _raw_request(base: str, method: str, target: str, headers: dict) -> socket.socket:
    u = urlsplit(base)
    sock = socket.create_connection((u.hostname, u.port))
    head = [f"{method} {target} HTTP/1.1", f"Host: {u.netloc}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
    return sock


def _raw_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    """(status, headers, the bytes read past the head)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the connection ended before the response head"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, rest


def raw_tus_upload(base: str, target: str, src: str, size: int, create: bool = True) -> None:
    """Our client: tus creation (not with ``create=False``: Backend.AI's proxy has no
    creation, its manager API made the upload), then PATCHes of TUS_CHUNK sent from
    the file with ``sendfile`` (no copy through Python), one connection each (the
    proxy closes after a large PATCH)."""
    if create:
        sock = _raw_request(base, "POST", target,
                            {**TUS, "Upload-Length": size, "Content-Length": 0})
        status, _, _ = _raw_response(sock)
        sock.close()
        assert status == 201, status
    offset = 0
    with open(src, "rb", buffering=0) as f:
        while offset < size:
            n = min(TUS_CHUNK, size - offset)
            sock = _raw_request(base, "PATCH", target, {
                **TUS, "Upload-Offset": offset, "Content-Length": n,
                "Content-Type": "application/offset+octet-stream"})
            sock.sendfile(f, offset, n)
            status, headers, _ = _raw_response(sock)
            sock.close()
            assert status == 204, status
            offset = int(headers["upload-offset"])


def raw_download(base: str, target: str, dst: str) -> int:
    """Our client: GET, the body spliced from the socket through a pipe into ``dst``
    (no copy through Python)."""
    import fcntl

    sock = _raw_request(base, "GET", target, {"Connection": "close"})
    status, headers, first = _raw_response(sock)
    assert status == 200, status
    size = int(headers["content-length"])
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        os.write(fd, first)
        got = len(first)
        while got < size:
            n = os.splice(sock.fileno(), w, min(1 << 20, size - got))
            assert n, "short body"
            done = 0
            while done < n:
                done += os.splice(r, fd, n - done)
            got += n
    finally:
        os.close(r)
        os.close(w)
        os.close(fd)
        sock.close()
    return got


class BackendAIProxy:
    """Backend.AI's own storage proxy (``backend.ai-storage-proxy`` 23.09, from
    ``scripts/install-backendai-storage-proxy.sh``) with its own etcd and Redis (it reads
    ``config/redis`` from etcd and starts its event bus), one worker (``num-proc = 1``,
    like our single daemon process), the stock asyncio loop, a ``vfs`` volume under
    ``root`` on the same file system, both APIs on loopback. The benchmark plays the
    manager: ``POST /folder/file/upload`` / ``download`` on the manager-facing port (the
    secret in ``X-BackendAI-Storage-Auth-Token``) answer a JWT for the client-facing
    ``/upload?token=`` (tus PATCH, no creation) and ``/download?token=``."""

    def __init__(self, venv: str, root: str):
        self.python = os.path.join(REPO, venv, "bin", "python")
        if not os.access(self.python, os.X_OK):
            raise SystemExit(f"{self.python} is missing: run scripts/install-backendai-storage-proxy.sh")
        self.root = root
        self.secret, self.manager_secret = uuid.uuid4().hex, uuid.uuid4().hex
        self.client_port, self.manager_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.client_port}"
        self.manager = f"http://127.0.0.1:{self.manager_port}"
        self.log = os.path.join(root, "storage-proxy.log")
        self.proc = self.etcd = self.redis = None

    def start(self, timeout: float = 60) -> None:
        import subprocess
        import urllib.request

        from tests.services import Etcd, Redis

        vol = os.path.join(self.root, "vol")
        os.makedirs(vol)
        with open(os.path.join(vol, "version.txt"), "w") as f:
            f.write("3\n")  # the current vfolder layout (else it warns of a migration)
        self.etcd, self.redis = Etcd(), Redis()
        subprocess.run(["etcdctl", "--endpoints", f"127.0.0.1:{self.etcd.port}", "put",
                        "/sorna/local/config/redis/addr", f"127.0.0.1:{self.redis.port}"],
                       check=True, capture_output=True, env=dict(os.environ, ETCDCTL_API="3"))
        config = os.path.join(self.root, "storage-proxy.toml")
        with open(config, "w") as f:
            f.write(f"""\
[etcd]
namespace = "local"
addr = {{ host = "127.0.0.1", port = {self.etcd.port} }}

[storage-proxy]
node-id = "bench-storage"
num-proc = 1
event-loop = "asyncio"
ipc-base-path = "{os.path.join(self.root, 'ipc')}"
secret = "{self.secret}"
session-expire = "1d"
aiomonitor-termui-port = {free_port()}
aiomonitor-webui-port = {free_port()}

[api.client]
service-addr = {{ host = "127.0.0.1", port = {self.client_port} }}
ssl-enabled = false

[api.manager]
service-addr = {{ host = "127.0.0.1", port = {self.manager_port} }}
ssl-enabled = false
secret = "{self.manager_secret}"

[volume.volume1]
backend = "vfs"
path = "{vol}"

[logging]
level = "WARNING"
drivers = ["console"]

[debug]
enabled = false
""")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.python, "-m", "ai.backend.storage.server", "-f", config],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.base + "/", timeout=2) as r:
                    if r.status == 200 and self.pids()[1:]:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("Backend.AI's storage proxy did not start:\n" + self.tail())
            time.sleep(0.2)

    def tail(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def pids(self) -> list[int]:
        """The main process and its descendants (the worker that serves)."""
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
        return out

    def stop(self) -> None:
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: it and its worker
            try:
                self.proc.wait(20)
            except Exception:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for svc in (self.redis, self.etcd):
            if svc is not None:
                svc.stop()

    async def call(self, http: aiohttp.ClientSession, path: str, body: dict) -> dict | None:
        async with http.post(self.manager + path, json=body, headers={
                "X-BackendAI-Storage-Auth-Token": self.manager_secret}) as r:
            assert r.status in (200, 204), (path, r.status, await r.text())
            return await r.json() if r.status == 200 else None


def bench_official_cli(daemon: StorageDaemon, base: str, secret: str, src: str, size: int,
                       rounds: int, work: str) -> dict:
    """The official ``backend.ai`` CLI (23.09, .venv-bai23) against a running hub whose
    folder lives on ``daemon`` (cluster mode: request-upload/-download answer the
    daemon's client URL): ``vfolder upload`` / ``vfolder download`` of the file, timed
    around the whole command (its start-up and the manager's grant included)."""
    import json
    import subprocess

    from jupyterhub_backendai.common.types import HOST_PERMISSIONS
    from tests.api_world import PREFIX, new_user, superadmin
    from tests.hub import Hub

    cli = os.path.join(REPO, os.environ.get("BAI23_VENV", ".venv-bai23"), "bin", "backend.ai")
    if not os.access(cli, os.X_OK):
        raise SystemExit(f"{cli} is missing: run scripts/install-backendai-clients.sh")
    proxies = {"remote": {"url": daemon.url, "token": daemon.token, "client_url": base}}
    hub = Hub(db_url=f"sqlite:///{work}/backendai.sqlite", backend="local",
              extra_env={"BACKENDAI_TRANSFER_SECRET": secret},
              extra_args=[f"--BackendAIManager.storage_proxies={json.dumps(proxies)}"])
    results: dict[str, list[float]] = {"upload": [], "download": []}
    try:
        hub.start()
        sa = superadmin(hub)
        dom = f"bench-{uuid.uuid4().hex[:6]}"
        sa.ok("POST", "/domains", json={"name": dom, "allowed_vfolder_hosts": {
            "remote:volume1": list(HOST_PERMISSIONS)}})
        user = new_user(sa, domain=dom)
        home = os.path.join(work, "cli-home")
        os.makedirs(home)
        env = {"PATH": os.environ["PATH"], "HOME": home, "LANG": "C.UTF-8",
               "BACKEND_ENDPOINT": hub.base + PREFIX, "BACKEND_ENDPOINT_TYPE": "api",
               "BACKEND_ACCESS_KEY": user["keypair"]["access_key"],
               "BACKEND_SECRET_KEY": user["keypair"]["secret_key"]}

        def bai(*args):
            p = subprocess.run([cli, *args], env=env, capture_output=True, text=True, timeout=600)
            assert p.returncode == 0, (args, p.stdout + p.stderr, hub.log()[-4000:])
            return p.stdout + p.stderr

        name = f"bench-{uuid.uuid4().hex[:6]}"
        bai("vfolder", "create", name, "remote:volume1")
        os.link(src, os.path.join(home, "big.bin"))  # the same bytes, no copy
        dl = os.path.join(work, "cli-dl")
        for r in range(rounds):
            settle(src, work)
            t = time.perf_counter()
            out = bai("vfolder", "upload", "-b", home, name, "big.bin")
            results["upload"].append(size / 1e6 / (time.perf_counter() - t))
            assert base in out, out  # straight to the daemon, not through the hub
            os.makedirs(dl)
            settle(src, work)
            t = time.perf_counter()
            bai("vfolder", "download", "-b", dl, name, "big.bin")
            results["download"].append(size / 1e6 / (time.perf_counter() - t))
            if r == 0:
                assert filecmp.cmp(src, os.path.join(dl, "big.bin"), shallow=False)
            shutil.rmtree(dl)
            print(f"official CLI round {r + 1}: upload {results['upload'][-1]:.0f} MB/s, "
                  f"download {results['download'][-1]:.0f} MB/s", flush=True)
    finally:
        hub.close()
        shutil.rmtree(hub.dir, ignore_errors=True)
    return {k: statistics.median(v) for k, v in results.items()}


async def small_files(http: aiohttp.ClientSession, up_urls: list[str], down_urls: list[str],
                      body: bytes, concurrency: int, pids) -> tuple[CPU, CPU]:
    """Each file one tus PATCH (no creation: Backend.AI's client skips it), then each
    GET, ``concurrency`` at a time."""
    sem = asyncio.Semaphore(concurrency)

    async def put(url):
        async with sem, http.patch(url, data=body, headers={
                **TUS, "Upload-Offset": "0",
                "Content-Type": "application/offset+octet-stream"}) as r:
            assert r.status == 204, (r.status, await r.text())

    async def get(url):
        async with sem, http.get(url) as r:
            assert r.status == 200 and await r.read() == body

    with CPU(pids) as cpu_up:
        await asyncio.gather(*(put(u) for u in up_urls))
    with CPU(pids) as cpu_down:
        await asyncio.gather(*(get(u) for u in down_urls))
    return cpu_up, cpu_down


async def bai_upload(bai: BackendAIProxy, http: aiohttp.ClientSession, vfid: str, name: str,
                     src: str, size: int, work: str, client_kind: str) -> CPU:
    """The big file up through Backend.AI's proxy, as ours: the same client, the same
    ``settle``; the token comes from its manager API before the timing."""
    up = "/upload?token=" + (await bai.call(http, "/folder/file/upload", {
        "volume": "volume1", "vfid": vfid, "relpath": name, "size": size}))["token"]
    settle(src, work)
    with CPU(bai.pids()) as cpu_up:
        if client_kind == "raw":
            await asyncio.to_thread(raw_tus_upload, bai.base, up, src, size, False)
        else:
            await tus_upload(http, bai.base + up, src, size, create=False)
    return cpu_up


async def bai_download(bai: BackendAIProxy, http: aiohttp.ClientSession, vfid: str, name: str,
                       src: str, size: int, work: str, client_kind: str, check: bool) -> CPU:
    """...and down again (then removed through its manager API)."""
    where = {"volume": "volume1", "vfid": vfid, "relpath": name}
    down = "/download?token=" + (await bai.call(http, "/folder/file/download", where))["token"]
    dst = os.path.join(work, "downloaded.bin")
    settle(src, work)
    with CPU(bai.pids()) as cpu_down:
        if client_kind == "raw":
            got = await asyncio.to_thread(raw_download, bai.base, down, dst)
        else:
            got = await get_to_file(http, bai.base + down, dst)
    assert got == size
    if check:
        assert filecmp.cmp(src, dst, shallow=False), "Backend.AI's download differs"
    os.unlink(dst)
    await bai.call(http, "/folder/file/delete", {"volume": "volume1", "vfid": vfid,
                                                 "relpaths": [name]})
    return cpu_down


async def bench(size_mb: int, rounds: int, small: int, concurrency: int, work: str,
                node_api: bool, client_kind: str = "raw", official_cli: bool = False,
                bai_venv: str | None = None, backend: str = "vfs") -> dict:
    src = os.path.join(work, "source.bin")
    with open(src, "wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(CHUNK))
    size = size_mb * CHUNK
    secret = uuid.uuid4().hex
    cport = free_port()
    daemon = StorageDaemon(os.path.join(work, "proxy"), extra_config=(
        f"c.StorageProxyApp.client_port = {cport}\n"
        "c.StorageProxyApp.client_host = '127.0.0.1'\n"
        f"c.TransferTokens.secret = {secret!r}\n"))
    for v in daemon.volumes.values():
        v["backend"] = backend
    os.makedirs(daemon.root)
    daemon.start()
    base = f"http://127.0.0.1:{cport}"
    tokens = TransferTokens(secret=secret)
    client = HTTPStorageClient(daemon.url, daemon.token)
    scope, folder = f"user:{uuid.uuid4().hex}", uuid.uuid4().hex
    results: dict[str, list[float]] = {"upload": [], "download": [], "copy": [],
                                       "bai_upload": [], "bai_download": []}
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                 timeout=aiohttp.ClientTimeout(total=None))
    bai = None
    try:
        await client.create_folder("volume1", scope, folder)
        if bai_venv:
            bai = BackendAIProxy(bai_venv, os.path.join(work, "bai-proxy"))
            os.makedirs(bai.root)
            await asyncio.to_thread(bai.start)
            bai_vfid = f"user:{uuid.uuid4()}/{uuid.uuid4().hex}"
            await bai.call(http, "/folder/create", {"volume": "volume1", "vfid": bai_vfid})
        for r in range(rounds):
            name = f"big-{r}.bin"  # a new file each round: the same work as the first
            # With --backendai-proxy each operation runs on both proxies back to back,
            # theirs first in every other round (the VM's page allocation has moods that
            # last a few seconds: they should hit both alike).
            theirs_first = bai is not None and r % 2 == 1
            if theirs_first:
                b_up = await bai_upload(bai, http, bai_vfid, name, src, size, work, client_kind)
            up = f"{base}/upload?token=" + tokens.sign(
                upload_claims("volume1", scope, folder, name, size))
            settle(src, work)
            with CPU(daemon.proc.pid) as cpu_up:
                if client_kind == "raw":
                    await asyncio.to_thread(raw_tus_upload, base, up[len(base):], src, size)
                else:
                    await tus_upload(http, up, src, size)
            results["upload"].append(size / 1e6 / cpu_up.wall)
            if bai is not None and not theirs_first:
                b_up = await bai_upload(bai, http, bai_vfid, name, src, size, work, client_kind)
            if theirs_first:
                b_down = await bai_download(bai, http, bai_vfid, name, src, size, work,
                                            client_kind, r == 0)

            dst = os.path.join(work, "downloaded.bin")
            down = f"{base}/download?token=" + tokens.sign(
                download_claims("volume1", scope, folder, name))
            settle(src, work)
            with CPU(daemon.proc.pid) as cpu_down:
                if client_kind == "raw":
                    got = await asyncio.to_thread(raw_download, base, down[len(base):], dst)
                else:
                    got = await get_to_file(http, down, dst)
            results["download"].append(size / 1e6 / cpu_down.wall)
            assert got == size
            if r == 0:
                assert filecmp.cmp(src, dst, shallow=False), "download differs from the upload"
            os.unlink(dst)
            await client.delete("volume1", scope, folder, name)
            if bai is not None and not theirs_first:
                b_down = await bai_download(bai, http, bai_vfid, name, src, size, work,
                                            client_kind, r == 0)

            cp = os.path.join(work, "copy.bin")
            settle(src, work)
            with CPU(daemon.proc.pid) as cpu_copy:
                shutil.copyfile(src, cp)
            results["copy"].append(size / 1e6 / cpu_copy.wall)
            os.unlink(cp)
            print(
                f"round {r + 1}: tus upload {results['upload'][-1]:.0f} MB/s {cpu_up}, "
                f"download {results['download'][-1]:.0f} MB/s {cpu_down}, "
                f"copy {results['copy'][-1]:.0f} MB/s {cpu_copy}",
                flush=True,
            )
            if bai is not None:
                results["bai_upload"].append(size / 1e6 / b_up.wall)
                results["bai_download"].append(size / 1e6 / b_down.wall)
                print(f"round {r + 1}: Backend.AI's proxy: tus upload "
                      f"{results['bai_upload'][-1]:.0f} MB/s {b_up}, download "
                      f"{results['bai_download'][-1]:.0f} MB/s {b_down}", flush=True)
        out = {k: statistics.median(v) for k, v in results.items() if v}

        # Small files: one PATCH each (Backend.AI's client skips creation), then GET.
        await client.mkdir("volume1", scope, folder, "small")
        body = os.urandom(4096)

        # The tokens are signed beforehand: the manager's part, not the proxy's.
        up_urls = [f"{base}/upload?token=" + tokens.sign(
            upload_claims("volume1", scope, folder, f"small/f{i}", len(body)))
            for i in range(small)]
        down_urls = [f"{base}/download?token=" + tokens.sign(
            download_claims("volume1", scope, folder, f"small/f{i}")) for i in range(small)]

        cpu_sup, cpu_sdown = await small_files(http, up_urls, down_urls, body, concurrency,
                                               daemon.proc.pid)
        out["small"] = 2 * small / (cpu_sup.wall + cpu_sdown.wall)
        print(f"small files: {small} x 4 KiB up {small / cpu_sup.wall:.0f}/s {cpu_sup}, "
              f"down {small / cpu_sdown.wall:.0f}/s {cpu_sdown}", flush=True)
        if bai is not None:
            # Its tokens from its manager API, beforehand (an upload's also makes the
            # session file its PATCH needs), concurrency at a time.
            sem = asyncio.Semaphore(concurrency)

            async def token(path, relpath, **extra):
                async with sem:
                    return (await bai.call(http, path, {
                        "volume": "volume1", "vfid": bai_vfid, "relpath": relpath,
                        **extra}))["token"]

            t = time.perf_counter()
            b_up_urls = [f"{bai.base}/upload?token={tok}" for tok in await asyncio.gather(*(
                token("/folder/file/upload", f"small/f{i}", size=len(body))
                for i in range(small)))]
            b_down_urls = [f"{bai.base}/download?token={tok}" for tok in await asyncio.gather(*(
                token("/folder/file/download", f"small/f{i}") for i in range(small)))]
            print(f"(Backend.AI's proxy: {2 * small} tokens from its manager API in "
                  f"{time.perf_counter() - t:.1f} s, not timed)", flush=True)
            b_sup, b_sdown = await small_files(http, b_up_urls, b_down_urls, body, concurrency,
                                               bai.pids())
            out["bai_small"] = 2 * small / (b_sup.wall + b_sdown.wall)
            print(f"small files, Backend.AI's proxy: {small} x 4 KiB up "
                  f"{small / b_sup.wall:.0f}/s {b_sup}, down {small / b_sdown.wall:.0f}/s "
                  f"{b_sdown}", flush=True)
        if official_cli:
            c = await asyncio.to_thread(bench_official_cli, daemon, base, secret, src, size,
                                        rounds, work)
            print(f"official CLI (backend.ai 23.09 vfolder upload/download, median): upload "
                  f"{c['upload']:.1f} MB/s ({c['upload'] / out['copy']:.3f} of the copy), "
                  f"download {c['download']:.1f} MB/s ({c['download'] / out['copy']:.3f})",
                  flush=True)
    finally:
        await http.close()
        await client.close()
        daemon.stop()
        if bai is not None:
            await asyncio.to_thread(bai.stop)
    if node_api:
        n = await bench_node_api(src, size, rounds, work)
        print(f"node API (manager -> proxy): upload {n['upload']:.1f} MB/s, "
              f"download {n['download']:.1f} MB/s, copy {n['copy']:.1f} MB/s", flush=True)
    return out


def bench_btrfs_ops(size_mb: int, files: int, rounds: int, work: str, listing: int = 500) -> dict:
    """Clone and usage on a btrfs volume against their baselines (see the docstring)."""
    from jupyterhub_backendai.storageproxy.btrfs import BtrfsVolume
    from jupyterhub_backendai.storageproxy.volumes import VFSVolume

    out: dict[str, list[float]] = {"clone": [], "cp": [], "cp_reflink": [], "usage": [],
                                   "walk": [], "listing": [], "listing_each": []}
    size = max(4 << 30, 3 * size_mb * CHUNK + (1 << 30))
    with btrfs_fs(work, size) as mnt:
        vol = BtrfsVolume("bench", os.path.join(mnt, "vol"))
        walker = VFSVolume("bench", os.path.join(mnt, "vol"))
        scope = f"user:{uuid.uuid4().hex}"
        big, many = uuid.uuid4().hex, uuid.uuid4().hex
        vol.create_folder(scope, big)
        with open(os.path.join(vol.folder_path(scope, big), "data"), "wb") as f:
            for _ in range(size_mb):
                f.write(os.urandom(CHUNK))
        vol.create_folder(scope, many)
        top = vol.folder_path(scope, many)
        for d in range(files // 1000 + 1):
            os.mkdir(os.path.join(top, str(d)))
            for i in range(min(1000, files - d * 1000)):
                with open(os.path.join(top, str(d), str(i)), "wb") as f:
                    f.write(b"x" * 100)
        listed = [(scope, uuid.uuid4().hex) for _ in range(listing)]
        for sc, fid in listed:
            vol.create_folder(sc, fid)
        os.sync()
        src = vol.folder_path(scope, big)
        for r in range(rounds):
            os.sync()
            dst = uuid.uuid4().hex
            t = time.perf_counter()
            vol.clone_folder(scope, big, scope, dst)
            out["clone"].append(time.perf_counter() - t)
            vol.delete_folder(scope, dst)
            for key, flags in (("cp", ["--reflink=never"]), ("cp_reflink", [])):
                os.sync()
                target = os.path.join(mnt, f"copy-{r}-{key}")
                t = time.perf_counter()
                subprocess.run(["cp", "-r", *flags, src, target], check=True)
                os.sync()  # the copy's bytes written, as the snapshot's are (none)
                out[key].append(time.perf_counter() - t)
                shutil.rmtree(target)
            walker.folder_usage(scope, many)  # warm the page cache for the walk
            t = time.perf_counter()
            used = walker.folder_usage(scope, many)
            out["walk"].append(time.perf_counter() - t)
            t = time.perf_counter()
            q = vol.folder_usage(scope, many)
            out["usage"].append(time.perf_counter() - t)
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                t = time.perf_counter()
                each = list(pool.map(lambda f: vol.folder_usage(*f), listed))
                out["listing_each"].append(time.perf_counter() - t)
            t = time.perf_counter()
            batch = vol.folders_usage(listed)
            out["listing"].append(time.perf_counter() - t)
            assert batch == each, "one read and one read each disagree"
            print(f"round {r + 1}: usage of {listing} folders in one read "
                  f"{out['listing'][-1]:.3f} s, one each (8 at a time) "
                  f"{out['listing_each'][-1]:.3f} s", flush=True)
            print(f"round {r + 1}: clone {out['clone'][-1]:.4f} s, cp -r (no reflink) "
                  f"{out['cp'][-1]:.2f} s, cp -r {out['cp_reflink'][-1]:.3f} s; usage "
                  f"{out['usage'][-1]:.4f} s ({q['used_bytes']} bytes on disk), walk "
                  f"{out['walk'][-1]:.3f} s ({used['file_count']} files, "
                  f"{used['used_bytes']} bytes)", flush=True)
        vol.delete_folder(scope, big)
        vol.delete_folder(scope, many)
        for sc, fid in listed:
            vol.delete_folder(sc, fid)
    return {k: statistics.median(v) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024, help="file size in MiB (default 1024)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", type=int, default=10000, help="number of 4 KiB files")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--client", choices=("raw", "aiohttp"), default="raw",
                    help="the big file's client: raw sockets with sendfile (default) or aiohttp")
    ap.add_argument("--official-cli", action="store_true",
                    help="also move the big file with Backend.AI's own CLI (23.09) through a hub")
    ap.add_argument("--node-api", action="store_true",
                    help="also measure the manager's node API (HTTPStorageClient)")
    ap.add_argument("--backendai-proxy", metavar="VENV", nargs="?", const=".venv-bai-storage",
                    help="also measure Backend.AI's own storage proxy (23.09) from this venv "
                    "(default .venv-bai-storage: scripts/install-backendai-storage-proxy.sh) "
                    "side by side: the same file, client and page-cache preparation")
    ap.add_argument("--volume-backend", choices=("vfs", "btrfs"), default="vfs",
                    help="the daemon's volumes on a loop-mounted btrfs with backend btrfs")
    ap.add_argument("--btrfs-ops", action="store_true",
                    help="measure clone and usage on btrfs against cp -r and a walk instead")
    ap.add_argument("--files", type=int, default=100_000,
                    help="files of the folder whose usage --btrfs-ops measures")
    ap.add_argument("--listing", type=int, default=500,
                    help="folders of the listing whose usage --btrfs-ops measures")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bai-storage-bench-")
    try:
        if args.btrfs_ops:
            m = bench_btrfs_ops(args.size_mb, args.files, args.rounds, work, args.listing)
            print(f"clone_s={m['clone']:.4f} cp_s={m['cp']:.2f} cp_reflink_s={m['cp_reflink']:.3f} "
                  f"clone_ratio={m['cp'] / m['clone']:.0f} usage_s={m['usage']:.4f} "
                  f"walk_s={m['walk']:.3f} usage_ratio={m['walk'] / m['usage']:.0f} "
                  f"listing_s={m['listing']:.3f} listing_each_s={m['listing_each']:.3f} "
                  f"listing_ratio={m['listing_each'] / m['listing']:.0f}")
            return
        with contextlib.ExitStack() as stack:
            where = work
            if args.volume_backend == "btrfs":
                where = os.path.join(stack.enter_context(
                    btrfs_fs(work, 4 * args.size_mb * CHUNK + (2 << 30))), "work")
                os.makedirs(where)
            m = asyncio.run(bench(args.size_mb, args.rounds, args.small, args.concurrency,
                                  where, args.node_api, args.client, args.official_cli,
                                  args.backendai_proxy, args.volume_backend))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    extra = ""
    if "bai_upload" in m:
        print(f"Backend.AI's proxy (median): upload {m['bai_upload']:.1f} MB/s, download "
              f"{m['bai_download']:.1f} MB/s, small files {m['bai_small']:.0f}/s; ours / "
              f"theirs: upload {m['upload'] / m['bai_upload']:.2f}, download "
              f"{m['download'] / m['bai_download']:.2f}, small files "
              f"{m['small'] / m['bai_small']:.2f}", flush=True)
        extra = (f" backendai_upload_mb_s={m['bai_upload']:.1f}"
                 f" backendai_download_mb_s={m['bai_download']:.1f}"
                 f" backendai_small_files_per_s={m['bai_small']:.0f}"
                 f" vs_backendai_upload={m['upload'] / m['bai_upload']:.2f}"
                 f" vs_backendai_download={m['download'] / m['bai_download']:.2f}"
                 f" vs_backendai_small={m['small'] / m['bai_small']:.2f}")
    print(
        f"upload_mb_s={m['upload']:.1f} download_mb_s={m['download']:.1f} "
        f"copy_mb_s={m['copy']:.1f} upload_ratio={m['upload'] / m['copy']:.3f} "
        f"download_ratio={m['download'] / m['copy']:.3f} small_files_per_s={m['small']:.0f}"
        + extra
    )


if __name__ == "__main__":
    main()
