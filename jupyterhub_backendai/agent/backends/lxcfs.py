"""What a kernel's ``/proc`` says about its memory and CPUs: LXCFS (issue 29).

Docker holds a kernel to its memory and CPU limits through its cgroup, but
``/proc/meminfo``, ``/proc/cpuinfo``, ``/proc/stat`` and the rest are the host's: ``free``
in a 1 GiB session showed the host's 23 GiB, and ``/proc/cpuinfo`` (what
``os.cpu_count()``, ``psutil`` and the thread pools sized from them read) all of its
cores. LXCFS, a FUSE file system (Debian's ``lxcfs`` package, which runs it as a service
at ``/var/lib/lxcfs``), serves these files as the cgroup of the process reading them
sees them. Where it runs, the Docker backend bind-mounts them over the kernel's own,
read-only, as LXD and many Kubernetes clusters do (``Agent.lxcfs``). Run with
``--enable-cfs`` it also counts CPUs by the kernel's CPU limit.

What it cannot change: ``nproc`` and ``os.sched_getaffinity`` count the CPUs the kernel
may be scheduled on (all of them unless the kernel is pinned); ``df`` shows the file
system of the kernel's folders (their quota where the storage keeps one: docs/storage.md).
If LXCFS stops while kernels run, reading these files in them fails until it is back.
"""

from __future__ import annotations

import os

from ...common.errors import AgentError

DEFAULT_ROOT = "/var/lib/lxcfs"
# Paths below the LXCFS mount; each over the same path in the kernel.
FILES = (
    "proc/cpuinfo", "proc/diskstats", "proc/loadavg", "proc/meminfo", "proc/stat",
    "proc/swaps", "proc/uptime", "sys/devices/system/cpu/online",
)


def is_mounted(root: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether an LXCFS file system is mounted at ``root``."""
    root = os.path.realpath(root)
    try:
        with open(mountinfo) as f:
            for line in f:
                fields = line.split()
                # mount point is field 5; the file system type follows the "-" separator
                if len(fields) > 6 and fields[4] == root:
                    kind = fields[fields.index("-") + 1] if "-" in fields else ""
                    if kind == "fuse.lxcfs":
                        return True
    except OSError:
        return False
    return False


def resolve(setting: str) -> str | None:
    """The LXCFS mount to use for ``Agent.lxcfs``: ``"auto"`` is :data:`DEFAULT_ROOT`
    where LXCFS is mounted there (None otherwise), ``""`` is None, a path must be an
    LXCFS mount (an :class:`AgentError` saying so otherwise)."""
    if not setting:
        return None
    if setting == "auto":
        return DEFAULT_ROOT if is_mounted(DEFAULT_ROOT) else None
    if not is_mounted(setting):
        raise AgentError(
            f"Agent.lxcfs: no LXCFS file system is mounted at {setting} (start it with "
            f"`lxcfs --enable-cfs {setting}`, or set Agent.lxcfs to \"auto\" or \"\")")
    return os.path.realpath(setting)


def mounts(root: str | None) -> list[dict]:
    """Docker ``Mounts`` laying ``root``'s files over the kernel's, read-only; none
    without a root. Files this LXCFS does not serve are left out."""
    if not root:
        return []
    return [{"Type": "bind", "Source": os.path.join(root, path), "Target": "/" + path,
             "ReadOnly": True}
            for path in FILES if os.path.exists(os.path.join(root, path))]
