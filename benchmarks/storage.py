"""Storage throughput: transfers straight to the storage proxy (tus + token) vs. a local copy.

    python benchmarks/storage.py [--size-mb 1024] [--rounds 3] [--small 10000]
                                 [--concurrency 16] [--node-api]

It starts a real ``backendai-storage-proxy`` (tests/services.py's StorageDaemon: a
subprocess on free loopback ports, a volume in a temp dir) with its client-facing
transfer API (``client_port``, storageproxy/transfer.py) and plays the manager's
part by signing the tokens itself (TransferTokens, the secret shared with the
daemon), so only the proxy's data path is measured. On one file of random bytes
written once:

  upload:   a tus upload (POST creation, then PATCHes of 16 MiB read from the file,
            as Backend.AI's client does), written to ``.tus/<id>`` and renamed into
            the folder after the last byte (a new name each round)
  download: GET /download with the token, each chunk written to a local file
  copy:     shutil.copyfile of the same file on the same file system (the baseline,
            measured in the same run)
  small:    ``--small`` files of 4 KiB, each one tus PATCH with its own token, then
            each downloaded, ``--concurrency`` at a time; files per second over the
            up-and-down round trip of all of them (2 * n transfers / time)

Median MB/s (10^6 bytes) over the rounds. Everything lives under one temp dir on
one file system, in the page cache (the proxy's overhead, not the disk). Downloads
are checked byte for byte once. ``--node-api`` also measures the manager's own
node API (HTTPStorageClient upload/download, what the hub's admin API uses). The
last line is machine-readable:

    upload_mb_s=<f> download_mb_s=<f> copy_mb_s=<f> upload_ratio=<f> download_ratio=<f> small_files_per_s=<f>

Everything it starts is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import filecmp
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import aiohttp  # noqa: E402

from jupyterhub_backendai.storageproxy.client import HTTPStorageClient  # noqa: E402
from jupyterhub_backendai.storageproxy.transfer import (  # noqa: E402
    TransferTokens,
    download_claims,
    upload_claims,
)
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


async def tus_upload(http: aiohttp.ClientSession, url: str, src: str, size: int) -> None:
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


async def bench(size_mb: int, rounds: int, small: int, concurrency: int, work: str,
                node_api: bool) -> dict:
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
    os.makedirs(daemon.root)
    daemon.start()
    base = f"http://127.0.0.1:{cport}"
    tokens = TransferTokens(secret=secret)
    client = HTTPStorageClient(daemon.url, daemon.token)
    scope, folder = f"user:{uuid.uuid4().hex}", uuid.uuid4().hex
    results: dict[str, list[float]] = {"upload": [], "download": [], "copy": []}
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                 timeout=aiohttp.ClientTimeout(total=None))
    try:
        await client.create_folder("volume1", scope, folder)
        for r in range(rounds):
            name = f"big-{r}.bin"  # a new file each round: the same work as the first
            up = f"{base}/upload?token=" + tokens.sign(
                upload_claims("volume1", scope, folder, name, size))
            t = time.perf_counter()
            await tus_upload(http, up, src, size)
            results["upload"].append(size / 1e6 / (time.perf_counter() - t))

            dst = os.path.join(work, "downloaded.bin")
            down = f"{base}/download?token=" + tokens.sign(
                download_claims("volume1", scope, folder, name))
            t = time.perf_counter()
            got = await get_to_file(http, down, dst)
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
                f"round {r + 1}: tus upload {results['upload'][-1]:.0f} MB/s, "
                f"download {results['download'][-1]:.0f} MB/s, copy {results['copy'][-1]:.0f} MB/s",
                flush=True,
            )
        out = {k: statistics.median(v) for k, v in results.items()}

        # Small files: one PATCH each (Backend.AI's client skips creation), then GET.
        await client.mkdir("volume1", scope, folder, "small")
        body = os.urandom(4096)
        sem = asyncio.Semaphore(concurrency)

        async def put(i):
            url = f"{base}/upload?token=" + tokens.sign(
                upload_claims("volume1", scope, folder, f"small/f{i}", len(body)))
            async with sem, http.patch(url, data=body, headers={
                    **TUS, "Upload-Offset": "0",
                    "Content-Type": "application/offset+octet-stream"}) as r:
                assert r.status == 204, (r.status, await r.text())

        async def get(i):
            url = f"{base}/download?token=" + tokens.sign(
                download_claims("volume1", scope, folder, f"small/f{i}"))
            async with sem, http.get(url) as r:
                assert r.status == 200 and await r.read() == body

        t = time.perf_counter()
        await asyncio.gather(*(put(i) for i in range(small)))
        t_up = time.perf_counter() - t
        await asyncio.gather(*(get(i) for i in range(small)))
        t_all = time.perf_counter() - t
        out["small"] = 2 * small / t_all
        print(f"small files: {small} x 4 KiB up in {t_up:.1f} s ({small / t_up:.0f}/s), "
              f"down in {t_all - t_up:.1f} s ({small / (t_all - t_up):.0f}/s)", flush=True)
    finally:
        await http.close()
        await client.close()
        daemon.stop()
    if node_api:
        n = await bench_node_api(src, size, rounds, work)
        print(f"node API (manager -> proxy): upload {n['upload']:.1f} MB/s, "
              f"download {n['download']:.1f} MB/s, copy {n['copy']:.1f} MB/s", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024, help="file size in MiB (default 1024)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", type=int, default=10000, help="number of 4 KiB files")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--node-api", action="store_true",
                    help="also measure the manager's node API (HTTPStorageClient)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bai-storage-bench-")
    try:
        m = asyncio.run(bench(args.size_mb, args.rounds, args.small, args.concurrency, work,
                              args.node_api))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"upload_mb_s={m['upload']:.1f} download_mb_s={m['download']:.1f} "
        f"copy_mb_s={m['copy']:.1f} upload_ratio={m['upload'] / m['copy']:.3f} "
        f"download_ratio={m['download'] / m['copy']:.3f} small_files_per_s={m['small']:.0f}"
    )


if __name__ == "__main__":
    main()
