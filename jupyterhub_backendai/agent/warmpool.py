"""The agent's half of the warm pool (issue 30): kernels started before anyone asks,
bound to a user when a matching session starts (docs/architecture.md "Warm pool").

A pooled kernel is a container of the image with the preset's limits, its own session
network and one published host port, whose command is a *waiter*: Python that imports
what ``jupyterhub-singleuser`` imports (the 2-3 s of a start) and then waits. Nothing of
a user is in it: no folder, no token, no environment of theirs.

Binding, done once (a pooled kernel serves one session, then goes with it):

- **Folders.** A container's mounts are fixed at its creation, so the pooled container
  gets one bind mount of an empty host directory of its own, ``<pool root>/<kernel
  id>/work``, at ``/home/work``, with propagation ``rslave``; the pool root is a shared
  mount of the host. Binding bind-mounts the user's home folder on that directory on
  the host, then each other folder at ``work/<name>`` (read-only ones remounted
  read-only); the mounts propagate into the running container. The agent must be able
  to mount (root, in the engine's mount namespace): where it cannot, no pool fills, and
  the console says why.
- **Environment and token.** The waiter gets the session's environment (the token,
  ``JUPYTERHUB_*``, the user's variables, ``BACKENDAI_*``) as a file the agent writes
  into the kernel's *inbox*: a second directory of its own on the host,
  ``<pool root>/<kernel id>/inbox`` (the kernel user's, 0700, under a directory only
  root may enter), mounted at ``/home/config/pool``. The file is written under another
  name, mode 0600 and the kernel user's from its first byte, and renamed into place,
  so the waiter never sees it partial or unreadable. (Docker's archive API did this
  before: an untar by a process of the engine's for each binding, 0.2-0.3 s of five
  bindings at once.) The waiter reads and deletes it, sets its environment, seeds a
  fresh home from ``/etc/skel`` as the image's init does, changes into ``/home/work``
  and runs ``jupyterhub-singleuser`` in the same process. The container's own environment (what ``docker exec`` gets) stays
  the pool's, with no user's token in it.
- **Identity.** The pooled kernel's id becomes the session's kernel's id in the record
  (manager/warmpool.py); the container is renamed after its owner. Its labels keep the
  pool's session id (a container's labels cannot change): the agent finds it by kernel
  id, as any other.

What it cannot bind (the manager does not offer those to the pool): several kernels,
GPUs, SSH from outside, batch sessions, a session without a home folder (the image's
``/home/work`` cannot be shown under the pool's empty directory), kernel bounds other
than the agent's defaults (a tmpfs size cannot change).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import io
import json
import os
import shutil
import tarfile
import time

POOL_LABEL = "ai.backend.pool"
POOL_SESSION_PREFIX = "pool-"
INBOX = "/home/config/pool"  # in the container; the binding file is INBOX/BIND_NAME
BIND_NAME = "pool-bind.json"
WAITER_PATH = "/opt/backendai-pool/jupyterhub-singleuser"
READY_LINE = "backendai-pool: ready"
KERNEL_UID = 1000

# The entry points of the distributions on sys.path, read once for as long as none is
# installed or removed. A server's start asks importlib.metadata for entry points a dozen
# times (jupyter_lsp alone five: its listeners and language server specs), and each ask
# reads every distribution's entry_points.txt again: 45-50 ms of CPU of each bound start,
# profiled in the image (of about 100), the most of a rush of pooled starts after the
# binding. The waiter has read them all before it is bound; the memo is as fresh as the
# import system's own listing of a directory (importlib.metadata's FastPath caches that
# by the directory's mtime, as this does): installing or removing a distribution changes
# its directory, and the next ask reads them all again. Only the entries of sys.path that
# hold distributions (or are archives) are its key: a directory of modules put on the
# path (the image's server config adds /opt/backendai once bound) changes no answer, and
# it made every bound start read them all again (22 ms on a slow machine, profiled).
# Python without ``EntryPoints.select`` (< 3.10) keeps its own function.
ENTRY_POINTS_MEMO = r"""
def _memo_entry_points(module):
    original = module.entry_points
    memo = {}
    holds = {}  # (path entry, its mtime) -> whether distributions are in it

    def with_distributions(p, mtime):
        found = holds.get((p, mtime))
        if found is None:
            try:
                egg = str(p).lower().endswith(".egg")  # its metadata is in EGG-INFO
                found = any(n.lower().endswith((".dist-info", ".egg-info"))
                            or (egg and n.lower() == "egg-info") for n in os.listdir(p or "."))
            except NotADirectoryError:
                found = True  # an archive: always part of the key
            except OSError:
                found = False
            if len(holds) > 256:
                holds.clear()
            holds[(p, mtime)] = found
        return found

    def fresh():
        key = []
        for p in sys.path:
            try:
                mtime = os.stat(p or ".").st_mtime_ns
            except (OSError, TypeError, ValueError):
                continue  # nothing there, nothing found there
            if with_distributions(p, mtime):
                key.append((p, mtime))
        return tuple(key)

    def entry_points(**params):
        key = fresh()
        every = memo.get(key)
        if every is None:
            every = original()
            memo.clear()
            memo[key] = every
        return every.select(**params)

    every = original()
    if hasattr(every, "select"):
        memo[fresh()] = every
        module.entry_points = entry_points


for _name in ("importlib.metadata", "importlib_metadata"):
    try:
        _memo_entry_points(importlib.import_module(_name))
    except Exception:
        pass
"""

# The waiter's name ends in jupyterhub-singleuser, so that the image's init prepares its
# environment as for the server itself (backendai-kernel-init: JUPYTER_CONFIG_DIR,
# PYTHONNOUSERSITE, the lab's settings in the home), before Python starts.
WAITER = r'''#!/usr/bin/env python3
"""jupyterhub-backendai warm pool waiter (agent/warmpool.py): imports the server's
modules, waits to be bound to a session, then runs jupyterhub-singleuser in this process."""
import importlib, json, os, shutil, sys, time
# (ENTRY_POINTS_MEMO)
# Also what the server's initialisation imports itself (IPython through notebook_shim,
# jupyter_lsp, httpx's transport, handler modules): measured in the image, a bound
# server's initialize() took 0.32-0.45 s with the first list alone, 0.13-0.24 s with
# all. No module of the image's own (backendai_*, loaded by its server config): they
# may read the environment, which is the session's only after binding.
for mod in ("jupyter_server.serverapp", "jupyterhub.singleuser.mixins",
            "jupyterhub.singleuser.extension", "jupyterlab", "jupyterlab.labapp",
            "jupyter_server_proxy", "notebook_shim", "jupyter_server_terminals",
            "ipykernel", "jupyter_client.manager", "IPython", "jupyter_lsp",
            "jupyter_lsp.handlers", "jupyter_lsp.serverextension", "httpx", "httpcore", "h11",
            "jupyter_server.kernelspecs.handlers", "jupyter_server.nbconvert.handlers",
            "jupyter_server.services.api.handlers", "tornado.platform.asyncio",
            # the rest of the handler modules the server's web application loads: 28 ms
            # of a bound start on a slow machine, profiled
            "jupyter_server.services.config.handlers",
            "jupyter_server.services.contents.handlers",
            "jupyter_server.services.events.handlers",
            "jupyter_server.services.kernels.handlers",
            "jupyter_server.services.nbconvert.handlers",
            "jupyter_server.services.security.handlers",
            "jupyter_server.services.sessions.handlers", "jupyter_server.services.shutdown",
            "jupyter_server.view.handlers",
            "notebook_shim.nbserver", "jinja2.ext", "jupyter_core.migrate", "codeop",
            # the status bar's meter (its limits are read from the environment when its
            # extension starts, not when imported): 12 ms of a bound start, profiled
            "psutil", "jupyter_resource_usage.server_extension", "jupyter_resource_usage.api"):
    try:
        importlib.import_module(mod)
    except Exception:
        pass
print("backendai-pool: ready", flush=True)
path = "/home/config/pool/pool-bind.json"
while not os.path.exists(path):
    time.sleep(0.005)
# The agent renames it into place whole, the user's and 0600 already; should it ever
# appear before it can be opened or parsed (it once came by Docker's archive, made as
# root and handed over after), that is waited out.
deadline = time.monotonic() + 60
while True:
    try:
        with open(path) as f:
            bind = json.load(f)
        break
    except (ValueError, PermissionError):
        if time.monotonic() > deadline:
            raise
        time.sleep(0.005)
os.unlink(path)
os.environ.update(bind["environ"])
home = os.environ.get("HOME") or "/home/work"
os.chdir("/home/work")
if os.path.isdir(home) and os.access(home, os.W_OK):
    skel = [n for n in os.listdir("/etc/skel")] if os.path.isdir("/etc/skel") else []
    if skel and not any(os.path.lexists(os.path.join(home, n)) for n in skel):
        for n in skel:
            src, dst = os.path.join("/etc/skel", n), os.path.join(home, n)
            try:
                if os.path.isdir(src) and not os.path.islink(src):
                    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
                else:
                    shutil.copy2(src, dst, follow_symlinks=False)
            except OSError:
                pass
sys.argv = ["jupyterhub-singleuser"]
from jupyterhub.singleuser import main
sys.exit(main())
'''.replace("# (ENTRY_POINTS_MEMO)\n", ENTRY_POINTS_MEMO, 1)


class PoolUnavailable(Exception):
    """This agent cannot keep a warm pool (it cannot mount); says why."""


def waiter_archive() -> bytes:
    """The waiter as a tar for the container's ``/`` (put before its start)."""
    return tar_archive([("opt/backendai-pool", 0o755, None, 0),
                 (WAITER_PATH.lstrip("/"), 0o755, WAITER.encode(), 0)])


def tar_archive(entries) -> bytes:
    """A tar of ``(path, mode, data, uid)`` entries (``data`` None: a directory), owned
    by ``uid`` (group too): what the agent puts into a container (put_archive)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, mode, data, uid in entries:
            info = tarfile.TarInfo(path)
            info.uid = info.gid = uid
            info.mode = mode
            info.mtime = int(time.time())
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# -- host mounts ---------------------------------------------------------------------

_MS_RDONLY = 1
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_SHARED = 1 << 20
_MNT_DETACH = 2
_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _mount(source: str | None, target: str, flags: int) -> None:
    rc = _c().mount(source.encode() if source else None, target.encode(), None,
                    ctypes.c_ulong(flags), None)
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {source} on {target}: {os.strerror(e)}")


def _umount(target: str) -> None:
    if _c().umount2(target.encode(), _MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):
            raise OSError(e, f"umount {target}: {os.strerror(e)}")


def _mounted_at(path: str) -> list[str]:
    """Mount points at or under ``path`` (deepest first), from /proc/self/mountinfo."""
    path = os.path.realpath(path)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == path or point.startswith(path + "/"):
                out.append(point)
    return sorted(set(out), key=len, reverse=True)


class PoolRoot:
    """The host directory under which pooled containers' ``/home/work`` lie: a shared
    mount, so that what is mounted under it reaches the containers (``rslave``)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.ready = False

    def ensure(self) -> None:
        """Make the root a shared mount of itself (once); PoolUnavailable if it cannot."""
        if self.ready:
            return
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        try:
            if self.root not in _mounted_at(self.root):
                _mount(self.root, self.root, _MS_BIND)
            _mount(None, self.root, _MS_SHARED | _MS_REC)
        except OSError as e:
            raise PoolUnavailable(
                f"this agent cannot mount folders into pooled kernels ({e.strerror}: it must "
                "run as root in the Docker engine's mount namespace)") from None
        self.ready = True

    def slot(self, kernel_id: str) -> tuple[str, str]:
        """The pooled kernel's two host directories (made here): the empty one its
        /home/work is bound to, and its inbox (at ``INBOX``). Both lie in a directory
        only root may enter: the inbox gets a session's token, and the home there is
        a user's."""
        base = os.path.join(self.root, kernel_id)
        os.makedirs(base, mode=0o700, exist_ok=True)
        os.chmod(base, 0o700)
        work, inbox = os.path.join(base, "work"), os.path.join(base, "inbox")
        os.makedirs(work, mode=0o755, exist_ok=True)
        os.makedirs(inbox, mode=0o700, exist_ok=True)
        os.chown(inbox, KERNEL_UID, KERNEL_UID)
        return work, inbox

    def deliver(self, kernel_id: str, environ: dict) -> None:
        """The binding's environment into the kernel's inbox: written under a temporary
        name, 0600 and the kernel user's from the start, then renamed into place (the
        waiter polls for the name, reads and deletes it). OSError where the kernel has
        no inbox (one made by an agent before inboxes: not bindable)."""
        inbox = os.path.join(self.root, kernel_id, "inbox")
        tmp = os.path.join(inbox, f".{BIND_NAME}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchown(fd, KERNEL_UID, KERNEL_UID)
            os.write(fd, json.dumps({"environ": environ}).encode())
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(inbox, BIND_NAME))

    def bind(self, kernel_id: str, mounts: list[dict]) -> None:
        """The session's folders into the pooled kernel: the home on the slot, each other
        folder at ``<slot>/<name>`` (its mount point made in the home by the manager,
        or here). Undone whole on failure."""
        work = os.path.join(self.root, kernel_id, "work")
        home = next(m for m in mounts if m["target"] == "/home/work")
        try:
            self._one(home["source"], work, home["mode"])
            for m in mounts:
                if m is home:
                    continue
                point = os.path.join(work, m["target"][len("/home/work") + 1:])
                if not os.path.isdir(point):
                    os.mkdir(point)
                    os.chown(point, KERNEL_UID, KERNEL_UID)
                self._one(m["source"], point, m["mode"])
            with open(os.path.join(self.root, kernel_id, "bound.json"), "w") as f:
                json.dump([{"Source": m["source"], "Destination": m["target"]} for m in mounts], f)
        except OSError:
            self.release(kernel_id)
            raise

    @staticmethod
    def _one(source: str, target: str, mode: str) -> None:
        _mount(source, target, _MS_BIND | _MS_REC)
        if mode == "ro":
            _mount(None, target, _MS_BIND | _MS_REMOUNT | _MS_RDONLY)

    def bound_mounts(self, kernel_id: str) -> list[dict] | None:
        """The folders a bound kernel has, as Docker lists mounts (Source, Destination)."""
        try:
            with open(os.path.join(self.root, kernel_id, "bound.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """The agent stops: the root's own mount goes when no pooled kernel is left under
        it (a kernel kept for the agent's restart keeps it, and its mounts)."""
        if not self.ready:
            return
        self.ready = False
        try:
            if any(os.scandir(self.root)):
                return
        except OSError:
            return
        for _ in range(8):  # the root may have been bound more than once
            if self.root not in _mounted_at(self.root):
                break
            _umount(self.root)

    def release(self, kernel_id: str) -> None:
        """Unmount everything under the kernel's slot and remove it (its container gone)."""
        base = os.path.join(self.root, kernel_id)
        if not os.path.isdir(base):
            return
        for point in _mounted_at(base):
            _umount(point)
        if not _mounted_at(base):
            shutil.rmtree(base, ignore_errors=True)
