"""Storage proxy throughput: upload and download through the HTTP daemon vs. a local copy.

    python benchmarks/storage.py [--size-mb 256] [--rounds 5]

It starts a real ``backendai-storage-proxy`` (tests/test_storage_proxy.py's
StorageDaemon: a subprocess on a free loopback port, random token, a volume in a
temp dir) and, on one file of random bytes written once:

  upload:   HTTPStorageClient.upload of the file, read in 1 MiB chunks, streamed
            over HTTP (chunked) into the daemon, which writes a temp file and
            renames it into the folder (a new name each round, deleted after)
  download: HTTPStorageClient.download of it, each chunk written to a local file
  copy:     shutil.copyfile of the same file to another path of the same file
            system (what ``cp`` does; the baseline, measured in the same run)

Each round runs the three in turn; the figures are the median MB/s (10^6 bytes)
over the rounds. Source, volume and copies live under one temp dir on the same file
system, all in the page cache (this measures the proxy's overhead, not the disk).
Downloads are checked byte for byte against the source once. The last line is
machine-readable:

    upload_mb_s=<f> download_mb_s=<f> copy_mb_s=<f> ratio_upload=<f>

(ratio_upload = upload / copy). Everything it starts is removed at the end.
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

from jupyterhub_backendai.storageproxy.client import HTTPStorageClient  # noqa: E402
from tests.test_storage_proxy import StorageDaemon  # noqa: E402

CHUNK = 1 << 20


async def file_chunks(path: str):
    with open(path, "rb", buffering=0) as f:
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            yield chunk


async def bench(size_mb: int, rounds: int, work: str) -> dict:
    src = os.path.join(work, "source.bin")
    with open(src, "wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(CHUNK))
    size = size_mb * CHUNK
    daemon = StorageDaemon(os.path.join(work, "proxy"))
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=256, help="file size in MiB (default 256)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bai-storage-bench-")
    try:
        m = asyncio.run(bench(args.size_mb, args.rounds, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"upload_mb_s={m['upload']:.1f} download_mb_s={m['download']:.1f} "
        f"copy_mb_s={m['copy']:.1f} ratio_upload={m['upload'] / m['copy']:.3f}"
    )


if __name__ == "__main__":
    main()
