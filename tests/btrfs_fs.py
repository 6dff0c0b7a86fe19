"""A btrfs file system made for a test or a benchmark (issue 26): an image file,
``mkfs.btrfs``, a loop device, quotas (simple ones by default, as the btrfs volume
backend wants them; ``quota="full"`` for full accounting, ``None`` for none); as root. Removed
(unmounted, detached, deleted) on the way out, failure or not."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

from jupyterhub_backendai.storageproxy.btrfs import enable_simple_quotas


def run(*args: str) -> str:
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


@contextlib.contextmanager
def btrfs_fs(where: str, size: int, quota: str | None = "simple"):
    """Mounted at ``where/mnt`` (yielded), over ``where/btrfs.img`` of ``size`` bytes."""
    img, mnt = os.path.join(where, "btrfs.img"), os.path.join(where, "mnt")
    os.makedirs(mnt, exist_ok=True)
    with open(img, "wb") as f:
        f.truncate(size)
    try:
        run("mkfs.btrfs", "-q", img)
        loop = run("losetup", "--find", "--show", img).strip()
        try:
            run("mount", loop, mnt)
            try:
                if quota == "simple":
                    enable_simple_quotas(mnt)
                elif quota == "full":
                    run("btrfs", "quota", "enable", mnt)
                else:
                    assert quota is None, quota
                yield mnt
            finally:
                for _ in range(20):
                    if subprocess.run(["umount", mnt], capture_output=True).returncode == 0:
                        break
                    time.sleep(0.5)
                else:
                    subprocess.run(["umount", "-l", mnt], capture_output=True)
        finally:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
    finally:
        os.unlink(img)
