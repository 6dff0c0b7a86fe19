"""Volumes: where a storage proxy keeps folders. ``vfs`` is a plain directory tree.

Layout (as Backend.AI's): ``<root>/<scope type>/<scope id>/<folder id>``, so that
everything of one quota scope (a user's or a project's folders) lies under one
directory that the volume can measure and bound. A scope's limit, when it has one,
is ``<root>/<scope type>/<scope id>/.quota.json``, and the folders' own limits (those
that have one) ``<root>/<scope type>/<scope id>/.folder-quotas.json`` (never inside a
folder, so no session can see or change them).

File operations take a path relative to the folder. Running sessions write in the
same folders (as the kernel's user, while this process may be root), so a path is
never resolved by name in one step: each directory on the way is opened with
``O_NOFOLLOW`` relative to the previous one (``openat``), and the final entry is acted
on through its parent's descriptor. A symbolic link is listed but never followed, not
even one pointing inside the folder; a link swapped in during an operation makes the
operation fail instead of escaping the folder.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
import subprocess
import threading
from collections.abc import Iterable, Iterator

from ..common.errors import (
    BackendAIError,
    Conflict,
    InvalidRequest,
    NotFound,
    StorageQuotaExceeded,
)

FOLDER_ID_RE = re.compile(r"^[0-9a-f]{32}$")
QUOTA_SCOPE_RE = re.compile(r"^(user|project):[0-9a-f]{32}$")
QUOTA_FILE = ".quota.json"
FOLDER_QUOTA_FILE = ".folder-quotas.json"  # {folder id: limit in bytes}, beside QUOTA_FILE
STAGING = ".tus"  # a scope's tus uploads while their bytes arrive
CHUNK_SIZE = 1 << 20
# Folders and the directories made in them through the API: only their owner (the
# kernel's user, ``folder_uid``) enters them.
FOLDER_MODE = 0o700

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def check_ids(quota_scope_id: str, folder_id: str | None = None) -> None:
    if not isinstance(quota_scope_id, str) or not QUOTA_SCOPE_RE.fullmatch(quota_scope_id):
        raise InvalidRequest(f"invalid quota scope id {quota_scope_id!r}")
    if folder_id is not None and (
        not isinstance(folder_id, str) or not FOLDER_ID_RE.fullmatch(folder_id)
    ):
        raise InvalidRequest(f"invalid folder id {folder_id!r}")


def split_path(path: str, *, allow_root: bool = False) -> list[str]:
    """A path inside a folder -> its components. Relative POSIX paths only; ``""``
    and ``"."`` name the folder itself (only where ``allow_root``)."""
    if not isinstance(path, str):
        raise InvalidRequest(f"a path must be a string, not {type(path).__name__}")
    if "\x00" in path:
        raise InvalidRequest("a path must not contain NUL")
    if path.startswith("/"):
        raise InvalidRequest(f"path {path!r} must be relative to the folder")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidRequest(f"path {path!r} must not contain '..'")
    if not parts and not allow_root:
        raise InvalidRequest("the path names the folder itself; name an entry inside it")
    for p in parts:
        if len(p.encode("utf-8", "surrogateescape")) > 255:
            raise InvalidRequest(f"path component {p[:40]!r}... is longer than 255 bytes")
    return parts


class TreeChanged(OSError):
    """A directory being walked was moved away while the walk was inside it."""


def _walk_fd(top_fd: int, on_entry, on_dir_left=None, skip: tuple[str, ...] = ()) -> None:
    """Walk the tree under the open directory ``top_fd`` depth first, without
    recursion and holding one directory open at a time, so that no depth of tree
    (a kernel can make one 100,000 levels deep) exhausts the stack or the open files.

    ``on_entry(dir_fd, name, st)`` is called for every entry that is not a
    directory (``st`` from lstat: links are never followed), ``on_dir_left(dir_fd,
    name)`` after the content of the subdirectory ``name`` of ``dir_fd`` has been
    walked. ``skip``: names left out at the top. Entries that vanish during the
    walk are skipped. The walk climbs back through ``..`` and checks that it arrives
    where it came from: a directory moved away under it raises :class:`TreeChanged`
    rather than walking somewhere else. ``top_fd`` stays open."""
    fd = os.dup(top_fd)
    try:
        st = os.fstat(fd)
        idents = [(st.st_dev, st.st_ino)]  # the directories from the top to ``fd``
        names: list[str] = []  # the name of each of them but the top in its parent
        pending = [[n for n in os.listdir(fd) if n not in skip]]  # names left to visit, per level
        while True:
            if not pending[-1]:
                if not names:
                    return
                up = os.open("..", _DIR_FLAGS, dir_fd=fd)
                ust = os.fstat(up)
                os.close(fd)
                fd = up
                idents.pop()
                pending.pop()
                name = names.pop()
                if (ust.st_dev, ust.st_ino) != idents[-1]:
                    raise TreeChanged(errno.ESTALE, "a directory was moved during the walk")
                if on_dir_left is not None:
                    on_dir_left(fd, name)
                continue
            name = pending[-1].pop()
            try:
                est = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(est.st_mode):
                on_entry(fd, name, est)
                continue
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as e:
                if e.errno == errno.ELOOP:  # replaced by a link since the lstat
                    continue
                raise
            sst = os.fstat(sub)
            if (sst.st_dev, sst.st_ino) != (est.st_dev, est.st_ino):
                os.close(sub)  # swapped since the lstat: leave it
                continue
            try:
                listing = os.listdir(sub)
            except BaseException:
                os.close(sub)
                raise
            os.close(fd)
            fd = sub
            idents.append((sst.st_dev, sst.st_ino))
            names.append(name)
            pending.append(listing)
    finally:
        os.close(fd)


def _usage_fd(dir_fd: int, skip: tuple[str, ...] = ()) -> tuple[int, int]:
    """(bytes, entries that are not directories) under an open directory, without
    following symbolic links; entries that vanish during the walk are skipped."""
    total = [0, 0]

    def count(_fd, _name, st):
        total[0] += st.st_size
        total[1] += 1

    _walk_fd(dir_fd, count, skip=skip)
    return total[0], total[1]


def _rmtree_fd(parent_fd: int, name: str) -> None:
    """Remove the directory ``name`` of ``parent_fd`` and everything under it
    (links are removed, never followed), without recursion (see :func:`_walk_fd`)."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        _walk_fd(
            fd,
            lambda dfd, n, _st: _unlink_gone_ok(n, dfd),
            lambda dfd, n: os.rmdir(n, dir_fd=dfd),
        )
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def _unlink_gone_ok(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


#: errno -> (the 4xx it means on a user's path, what it says; ``{0}``: the OS's words)
_OS_ERRORS = {
    errno.ENOENT: (NotFound, "no such file or directory"),
    errno.EEXIST: (Conflict, "already exists"),
    errno.ENOTEMPTY: (Conflict, "directory not empty (delete it recursively)"),
    errno.ENOTDIR: (InvalidRequest, "a component of the path is not a directory"),
    errno.EISDIR: (Conflict, "is a directory"),
    errno.ELOOP: (InvalidRequest, "is a symbolic link (links are not followed)"),
    errno.ENAMETOOLONG: (InvalidRequest, "name too long"),
    errno.EINVAL: (InvalidRequest, "invalid operation ({0})"),
    errno.EDQUOT: (StorageQuotaExceeded, "quota exceeded (the file system refused the "
                   "write: the folder's own limit or its quota scope's is reached)"),
    errno.ENOSPC: (StorageQuotaExceeded, "no space left on the volume"),
}


def _os_error(e: OSError, what: str) -> BackendAIError:
    """An OS error on a user's path -> the 4xx that says what is wrong with it."""
    kind, text = _OS_ERRORS.get(e.errno, (BackendAIError, "{0}"))
    return kind(f"{what}: {text.format(e.strerror)}")


def _check_limit(limit_bytes) -> None:
    if limit_bytes is not None and (
        not isinstance(limit_bytes, int) or isinstance(limit_bytes, bool) or limit_bytes < 0
    ):
        raise InvalidRequest(
            f"limit_bytes must be a non-negative integer or null, not {limit_bytes!r}"
        )


def _write_json(path: str, obj) -> None:
    """Replace a small file atomically (a temp file, fsync, rename)."""
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# One process changes the folder-limit files of its volumes; a read-modify-write of one
# must not lose another's change.
_folder_limits_lock = threading.Lock()


class Upload:
    """One file being written: a hidden temporary file beside the target, renamed
    over it on :meth:`commit`, removed on :meth:`abort` (or any error). Every write
    first checks the quota scope's limit, so the temporary file never exceeds it."""

    def __init__(self, volume: VFSVolume, quota_scope_id: str, parent_fd: int, name: str,
                 path: str, limit: int | None, used: int, bounded: str = ""):
        self.volume = volume
        self.quota_scope_id = quota_scope_id
        # what ``limit`` bounds: the quota scope, or the folder where its own limit is tighter
        self.bounded = bounded or f"quota scope {quota_scope_id}"
        self.path = path
        self.limit = limit
        self.used = used
        self.written = 0
        self._lock = threading.Lock()  # a cancelled caller's write may still run in a thread
        self._parent = parent_fd
        self._name = name
        self._tmp = f".upload-{secrets.token_hex(8)}.tmp"
        self._fd: int | None = os.open(
            self._tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=parent_fd,
        )
        self.done = False
        if os.geteuid() == 0:
            try:
                os.fchown(self._fd, volume.folder_uid, volume.folder_gid)
            except OSError:
                os.close(self._fd)
                os.unlink(self._tmp, dir_fd=parent_fd)
                self.done = True
                raise

    def write(self, data: bytes) -> None:
        with self._lock:
            self._write(data)

    def _write(self, data: bytes) -> None:
        if self.done:
            raise InvalidRequest("the upload is already finished")
        if self.limit is not None and self.used + self.written + len(data) > self.limit:
            self._abort()
            raise StorageQuotaExceeded(
                f"{self.bounded} on volume {self.volume.name} is limited "
                f"to {self.limit} bytes and {self.used} are used; the upload of {self.path!r} "
                f"would need more than the {max(self.limit - self.used, 0)} bytes left"
            )
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
                self.written += n
        except OSError as e:
            self._abort()
            raise _os_error(e, self.path) from None

    def commit(self) -> dict:
        with self._lock:
            return self._commit()

    def _commit(self) -> dict:
        if self.done:
            raise InvalidRequest("the upload is already finished")
        try:
            os.close(self._fd)
            self._fd = None
            os.rename(self._tmp, self._name, src_dir_fd=self._parent, dst_dir_fd=self._parent)
        except OSError as e:
            self._abort()
            raise _os_error(e, self.path) from None
        self.done = True
        os.close(self._parent)
        return {"path": self.path, "size": self.written}

    def abort(self) -> None:
        """Idempotent; leaves the target as it was."""
        with self._lock:
            self._abort()

    def _abort(self) -> None:
        if self.done:
            return
        self.done = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            os.unlink(self._tmp, dir_fd=self._parent)
        except FileNotFoundError:
            pass
        os.close(self._parent)

    def __del__(self):
        if not getattr(self, "done", True):
            self._abort()


class FileChunks:
    """A download: at most ``size`` bytes of one open file, ``CHUNK_SIZE`` at a time
    (the size is the one answered before the first byte; a file that grows meanwhile
    is cut there)."""

    def __init__(self, fd: int, size: int):
        self._fd: int | None = fd
        self.size = size
        self._left = size
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        chunk = self.read()
        if not chunk:
            raise StopIteration
        return chunk

    def read(self) -> bytes:
        """The next chunk, or ``b""`` at the end (the file is then closed)."""
        with self._lock:
            if self._fd is None:
                return b""
            chunk = os.read(self._fd, min(CHUNK_SIZE, self._left)) if self._left else b""
            self._left -= len(chunk)
            if not chunk:
                os.close(self._fd)
                self._fd = None
            return chunk

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None


class VFSVolume:
    """A volume on a local (or NFS-mounted) directory.

    ``folder_uid``/``folder_gid``: owner given to new folders, directories and
    uploaded files when the proxy runs as root, so that the kernel's user (``work``,
    1000 in our images) can write in them.
    """

    backend = "vfs"

    def __init__(self, name: str, path: str, folder_uid: int = 1000, folder_gid: int = 1000):
        self.name = name
        self.path = os.path.abspath(path)
        self.folder_uid = folder_uid
        self.folder_gid = folder_gid
        os.makedirs(self.path, exist_ok=True)

    def scope_path(self, quota_scope_id: str) -> str:
        check_ids(quota_scope_id)
        kind, sid = quota_scope_id.split(":", 1)
        return os.path.join(self.path, kind, sid)

    def folder_path(self, quota_scope_id: str, folder_id: str) -> str:
        check_ids(quota_scope_id, folder_id)
        return os.path.join(self.scope_path(quota_scope_id), folder_id)

    def _chown(self, path: str, dir_fd: int | None = None) -> None:
        if os.geteuid() == 0:
            os.chown(path, self.folder_uid, self.folder_gid, dir_fd=dir_fd, follow_symlinks=False)

    def create_folder(self, quota_scope_id: str, folder_id: str) -> None:
        """Idempotent: an existing folder is left as it is."""
        path = self.folder_path(quota_scope_id, folder_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path, FOLDER_MODE)
        except FileExistsError:
            return
        self._chown(path)
        os.chmod(path, FOLDER_MODE)  # whatever the umask

    def delete_folder(self, quota_scope_id: str, folder_id: str) -> None:
        """Idempotent: a missing folder is not an error. Any depth of tree inside it
        is removed (no recursion); links are removed, never followed."""
        scope = self.scope_path(quota_scope_id)
        check_ids(quota_scope_id, folder_id)
        try:
            sfd = os.open(scope, _DIR_FLAGS)
        except FileNotFoundError:
            return
        try:
            _rmtree_fd(sfd, folder_id)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise BackendAIError(
                f"folder {folder_id} on volume {self.name} was not fully deleted: {e.strerror}"
            ) from None
        finally:
            os.close(sfd)
        self._write_folder_limit(quota_scope_id, folder_id, None)

    def info(self) -> dict:
        return {"name": self.name, "backend": self.backend, "path": self.path}

    def clone_folder(self, src_scope: str, src_id: str, dst_scope: str, dst_id: str) -> None:
        """Make folder ``dst_id`` of ``dst_scope`` a copy of ``src_id`` (``cp -a``:
        links copied as links, never followed; ``--reflink=auto`` shares the blocks
        where the file system can). The copy is made under a hidden name beside the
        target and renamed into place, so the folder appears whole or not at all. The
        target scope's limit is checked first (413, nothing made)."""
        check_ids(src_scope, src_id)
        check_ids(dst_scope, dst_id)
        src = self.folder_path(src_scope, src_id)
        dst = self.folder_path(dst_scope, dst_id)
        if not os.path.isdir(src) or os.path.islink(src):
            raise NotFound(f"no folder {src_id} in quota scope {src_scope} on volume {self.name}")
        if os.path.lexists(dst):
            raise Conflict(f"folder {dst_id} exists in quota scope {dst_scope}")
        self._check_clone_room(src_scope, src_id, dst_scope)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = os.path.join(os.path.dirname(dst), f".clone-{secrets.token_hex(8)}")
        try:
            out = subprocess.run(["cp", "-a", "--reflink=auto", "--no-target-directory", src, tmp],
                                 capture_output=True, text=True)
            if out.returncode:
                err = out.stderr.strip()
                if "quota" in err.lower() or "No space" in err:
                    raise StorageQuotaExceeded(f"clone of folder {src_id}: {err}")
                raise BackendAIError(f"clone of folder {src_id} failed: {err}")
            os.chmod(tmp, FOLDER_MODE)
            self._chown(tmp)
            self._keep_folder_limit(src_scope, src_id, dst_scope, dst_id)
            os.rename(tmp, dst)
        except BaseException:
            if os.path.lexists(tmp):
                pfd = os.open(os.path.dirname(tmp), _DIR_FLAGS)
                try:
                    _rmtree_fd(pfd, os.path.basename(tmp))
                finally:
                    os.close(pfd)
            raise

    def _check_clone_room(self, src_scope: str, src_id: str, dst_scope: str) -> None:
        limit = self._read_limit(dst_scope)
        if limit is None:
            return
        need = self.folder_usage(src_scope, src_id)["used_bytes"]
        used = self.scope_usage(dst_scope)["used_bytes"]
        if used + need > limit:
            raise StorageQuotaExceeded(
                f"quota scope {dst_scope} on volume {self.name} is limited to {limit} bytes "
                f"and {used} are used; the clone needs {need} more")

    # -- where tus uploads are staged (storageproxy/transfer.py) -----------------

    def make_staging(self, quota_scope_id: str) -> str:
        """The directory of a scope where tus uploads gather their bytes (made if
        missing): beside the folders, so it counts against the scope."""
        path = os.path.join(self.scope_path(quota_scope_id), STAGING)
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def place_staged(self, staged: str, dir_fd: int, name: str, owned: bool = False) -> None:
        """Move a finished staged file to ``name`` in the open directory ``dir_fd``
        (one rename: whole, or not there). ``owned``: the folder has a limit of its
        own, whose accounting must see the bytes (btrfs)."""
        os.rename(staged, name, dst_dir_fd=dir_fd)

    # -- usage and quota scopes ------------------------------------------------

    def _at_folder(self, quota_scope_id: str, folder_id: str, fn):
        """``fn(path)`` of the folder's path; NotFound when the folder is not there."""
        try:
            return fn(self.folder_path(quota_scope_id, folder_id))
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(
                f"no folder {folder_id} in quota scope {quota_scope_id} on volume {self.name}"
            ) from None

    def _open_folder(self, quota_scope_id: str, folder_id: str) -> int:
        return self._at_folder(quota_scope_id, folder_id, lambda path: os.open(path, _DIR_FLAGS))

    def folder_usage(self, quota_scope_id: str, folder_id: str) -> dict:
        """Bytes (apparent sizes) and files (every entry that is not a directory) in a folder."""
        fd = self._open_folder(quota_scope_id, folder_id)
        try:
            used, count = _usage_fd(fd)
        finally:
            os.close(fd)
        return {"used_bytes": used, "file_count": count}

    def folders_usage(self, folders: list[tuple[str, str]]) -> list[dict | None]:
        """:meth:`folder_usage` of each ``(quota_scope_id, folder_id)``, in order; None for
        one that does not exist (a listing's folder deleted meanwhile)."""
        out: list[dict | None] = []
        for scope, fid in folders:
            try:
                out.append(self.folder_usage(scope, fid))
            except NotFound:
                out.append(None)
        return out

    def scope_usage(self, quota_scope_id: str) -> dict:
        """The same over every folder of a quota scope (zero for a scope with none)."""
        try:
            fd = os.open(self.scope_path(quota_scope_id), _DIR_FLAGS)
        except FileNotFoundError:
            return {"used_bytes": 0, "file_count": 0}
        try:
            used, count = _usage_fd(fd, skip=(QUOTA_FILE, FOLDER_QUOTA_FILE))
        finally:
            os.close(fd)
        return {"used_bytes": used, "file_count": count}

    def _read_limit(self, quota_scope_id: str) -> int | None:
        try:
            with open(os.path.join(self.scope_path(quota_scope_id), QUOTA_FILE)) as f:
                limit = json.load(f)["limit_bytes"]
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            raise BackendAIError(f"quota file of {quota_scope_id} is unreadable: {e}") from None
        return limit

    def set_quota_scope(self, quota_scope_id: str, limit_bytes: int | None) -> None:
        """Bound a scope's bytes (None: no limit). A limit below the current usage is
        accepted: it refuses further uploads until enough is deleted."""
        _check_limit(limit_bytes)
        scope = self.scope_path(quota_scope_id)
        qfile = os.path.join(scope, QUOTA_FILE)
        if limit_bytes is None:
            try:
                os.unlink(qfile)
            except FileNotFoundError:
                pass
            return
        os.makedirs(scope, exist_ok=True)
        _write_json(qfile, {"limit_bytes": limit_bytes})

    def quota_scope(self, quota_scope_id: str) -> dict:
        return {
            "limit_bytes": self._read_limit(quota_scope_id),
            "used_bytes": self.scope_usage(quota_scope_id)["used_bytes"],
        }

    # -- a folder's own limit ----------------------------------------------------
    #
    # A folder may have a limit of its own, below its scope's (the hub checks that):
    # Backend.AI's ``max_size``. vfs keeps the limits of a scope's folders in one file
    # beside the folders and checks uploads against them as against the scope's; btrfs
    # also sets the folder's qgroup limit, which the kernel enforces.

    def _folder_limits(self, quota_scope_id: str) -> dict[str, int]:
        try:
            with open(os.path.join(self.scope_path(quota_scope_id), FOLDER_QUOTA_FILE)) as f:
                limits = json.load(f)
        except FileNotFoundError:
            return {}
        except ValueError as e:
            raise BackendAIError(
                f"folder quota file of {quota_scope_id} is unreadable: {e}") from None
        return limits if isinstance(limits, dict) else {}

    def _read_folder_limit(self, quota_scope_id: str, folder_id: str) -> int | None:
        return self._folder_limits(quota_scope_id).get(folder_id)

    def _write_folder_limit(self, quota_scope_id: str, folder_id: str,
                            limit_bytes: int | None) -> None:
        """Record (or with None drop) a folder's limit in its scope's file: read, changed
        and replaced whole under the volume's lock (a temp file, fsync, rename)."""
        path = os.path.join(self.scope_path(quota_scope_id), FOLDER_QUOTA_FILE)
        with _folder_limits_lock:
            limits = self._folder_limits(quota_scope_id)
            if limit_bytes is None:
                if limits.pop(folder_id, None) is None:
                    return
            else:
                limits[folder_id] = limit_bytes
            if not limits:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                return
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _write_json(path, limits)

    def set_folder_quota(self, quota_scope_id: str, folder_id: str,
                         limit_bytes: int | None) -> None:
        """Bound one folder's bytes (None: only its scope's limit). Like a scope's, a
        limit below the folder's usage is accepted and refuses every further upload
        into the folder until files are deleted."""
        _check_limit(limit_bytes)
        fd = self._open_folder(quota_scope_id, folder_id)  # 404 for a folder not there
        os.close(fd)
        self._write_folder_limit(quota_scope_id, folder_id, limit_bytes)

    def folder_quota(self, quota_scope_id: str, folder_id: str) -> dict:
        """``{"limit_bytes", "used_bytes"}`` of a folder (limit None: it has none)."""
        return {
            "limit_bytes": self._read_folder_limit(quota_scope_id, folder_id),
            "used_bytes": self.folder_usage(quota_scope_id, folder_id)["used_bytes"],
        }

    def _keep_folder_limit(self, src_scope: str, src_id: str, dst_scope: str,
                           dst_id: str) -> None:
        """A clone keeps its source's limit."""
        limit = self._read_folder_limit(src_scope, src_id)
        if limit is not None:
            self._write_folder_limit(dst_scope, dst_id, limit)

    def upload_bound(self, quota_scope_id: str, folder_id: str, replaced: int = 0,
                     staged: int = 0) -> tuple[str, int, int] | None:
        """The limit an upload into the folder must keep: ``(what it bounds, limit, bytes
        used)`` of the scope or of the folder, whichever leaves less room; None where
        neither has a limit. ``replaced``: the size of the file the upload replaces
        (freed when it succeeds); ``staged``: bytes of the upload already written
        outside the folder (tus; they count in the scope's usage, not the folder's)."""
        bounds = []
        limit = self._read_limit(quota_scope_id)
        if limit is not None:
            used = max(self.scope_usage(quota_scope_id)["used_bytes"] - replaced, 0)
            bounds.append((f"quota scope {quota_scope_id}", limit, used))
        limit = self._read_folder_limit(quota_scope_id, folder_id)
        if limit is not None:
            used = max(self.folder_usage(quota_scope_id, folder_id)["used_bytes"] - replaced, 0)
            bounds.append((f"folder {folder_id}", limit, used + staged))
        return min(bounds, key=lambda b: b[1] - b[2], default=None)

    # -- files inside a folder -------------------------------------------------

    def _open_dir(self, quota_scope_id: str, folder_id: str, parts: list[str], shown: str) -> int:
        """Open the directory ``parts`` inside a folder, one component at a time and
        never through a symbolic link."""
        fd = self._open_folder(quota_scope_id, folder_id)
        try:
            for i, part in enumerate(parts):
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    where = "/".join(parts[: i + 1])
                    if e.errno == errno.ENOTDIR or e.errno == errno.ELOOP:
                        try:
                            is_link = stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode)
                        except OSError:
                            is_link = False
                        if is_link:
                            raise InvalidRequest(
                                f"{shown!r}: {where!r} is a symbolic link (links are not followed)"
                            ) from None
                        raise InvalidRequest(f"{shown!r}: {where!r} is not a directory") from None
                    if e.errno == errno.ENOENT:
                        raise NotFound(f"{shown!r}: no directory {where!r} in the folder") from None
                    raise _os_error(e, shown) from None
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _parent(self, quota_scope_id: str, folder_id: str, path: str) -> tuple[int, str, str]:
        """(open parent directory, entry name, normalized path) of a non-root path."""
        parts = split_path(path)
        shown = "/".join(parts)
        return self._open_dir(quota_scope_id, folder_id, parts[:-1], shown), parts[-1], shown

    def list_files(self, quota_scope_id: str, folder_id: str, path: str = "") -> list[dict]:
        """Entries of a directory, by name: {name, type (file, dir, symlink or other),
        size, mtime}; a link's size is that of the link itself."""
        parts = split_path(path, allow_root=True)
        fd = self._open_dir(quota_scope_id, folder_id, parts, "/".join(parts) or ".")
        try:
            with os.scandir(fd) as it:
                entries = list(it)
            out = []
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    kind = "file"
                elif stat.S_ISDIR(st.st_mode):
                    kind = "dir"
                elif stat.S_ISLNK(st.st_mode):
                    kind = "symlink"
                else:
                    kind = "other"
                out.append(
                    {"name": e.name, "type": kind, "size": st.st_size, "mtime": st.st_mtime}
                )
        finally:
            os.close(fd)
        return sorted(out, key=lambda x: x["name"])

    def mkdir(self, quota_scope_id: str, folder_id: str, path: str, parents: bool = False) -> None:
        """Create a directory; with ``parents`` also the missing ones above it, and an
        existing directory is not an error (``mkdir -p``)."""
        parts = split_path(path)
        shown = "/".join(parts)
        if not parents:
            fd, name, _ = self._parent(quota_scope_id, folder_id, path)
            try:
                os.mkdir(name, FOLDER_MODE, dir_fd=fd)
                self._chown(name, fd)
            except OSError as e:
                raise _os_error(e, shown) from None
            finally:
                os.close(fd)
            return
        fd = self._open_folder(quota_scope_id, folder_id)
        try:
            for part in parts:
                try:
                    os.mkdir(part, FOLDER_MODE, dir_fd=fd)
                    self._chown(part, fd)
                except FileExistsError:
                    pass
                except OSError as e:
                    raise _os_error(e, shown) from None
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ENOTDIR, errno.ELOOP):
                        if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                            raise InvalidRequest(
                                f"{shown!r}: {part!r} is a symbolic link (links are not followed)"
                            ) from None
                        raise Conflict(f"{shown!r}: {part!r} exists and is not a directory") from None
                    raise _os_error(e, shown) from None
                os.close(fd)
                fd = nxt
        finally:
            os.close(fd)

    def rename(self, quota_scope_id: str, folder_id: str, path: str, new_path: str) -> None:
        """Move an entry within the folder; an existing destination is not replaced."""
        src_fd, src, shown = self._parent(quota_scope_id, folder_id, path)
        try:
            dst_fd, dst, new_shown = self._parent(quota_scope_id, folder_id, new_path)
            try:
                try:
                    os.lstat(src, dir_fd=src_fd)
                except OSError as e:
                    raise _os_error(e, shown) from None
                try:
                    os.lstat(dst, dir_fd=dst_fd)
                    raise Conflict(f"{new_shown!r}: already exists")
                except FileNotFoundError:
                    pass
                try:
                    os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                except OSError as e:
                    raise _os_error(e, f"{shown} -> {new_shown}") from None
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)

    def delete(self, quota_scope_id: str, folder_id: str, path: str, recursive: bool = False) -> None:
        """Remove a file, a link (not its target) or a directory (an empty one unless
        ``recursive``)."""
        fd, name, shown = self._parent(quota_scope_id, folder_id, path)
        try:
            try:
                st = os.lstat(name, dir_fd=fd)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(name, dir_fd=fd)
                elif recursive:
                    _rmtree_fd(fd, name)
                else:
                    os.rmdir(name, dir_fd=fd)
            except OSError as e:
                raise _os_error(e, shown) from None
        finally:
            os.close(fd)

    def begin_upload(self, quota_scope_id: str, folder_id: str, path: str) -> Upload:
        """Start writing a file (new, or replacing one: the quota then counts the
        old file's bytes as freed). The caller writes, then commits or aborts."""
        fd, name, shown = self._parent(quota_scope_id, folder_id, path)
        try:
            replaced = 0
            try:
                st = os.lstat(name, dir_fd=fd)
                if stat.S_ISDIR(st.st_mode):
                    raise Conflict(f"{shown!r}: is a directory")
                if stat.S_ISREG(st.st_mode):
                    replaced = st.st_size
            except FileNotFoundError:
                pass
            bound = self.upload_bound(quota_scope_id, folder_id, replaced)
            bounded, limit, used = bound or ("", None, 0)
            if bound is not None and used > limit:
                raise StorageQuotaExceeded(
                    f"{bounded} on volume {self.name} is limited to "
                    f"{limit} bytes and {used} are used; delete files before uploading"
                )
            return Upload(self, quota_scope_id, fd, name, shown, limit, used, bounded)
        except OSError as e:
            os.close(fd)
            raise _os_error(e, shown) from None
        except BaseException:
            os.close(fd)
            raise

    def upload(self, quota_scope_id: str, folder_id: str, path: str, chunks: Iterable[bytes]) -> dict:
        """Write a file from ``chunks``: all or nothing ({path, size} once renamed into place)."""
        up = self.begin_upload(quota_scope_id, folder_id, path)
        try:
            for chunk in chunks:
                up.write(chunk)
            return up.commit()
        finally:
            up.abort()

    def download(self, quota_scope_id: str, folder_id: str, path: str) -> tuple[int, FileChunks]:
        """(size, chunks) of a regular file; a directory, link or device is refused."""
        fd, name, shown = self._parent(quota_scope_id, folder_id, path)
        try:
            try:
                f = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as e:
                if e.errno == errno.EISDIR:
                    raise InvalidRequest(f"{shown!r} is a directory, not a file") from None
                raise _os_error(e, shown) from None
        finally:
            os.close(fd)
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            os.close(f)
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise InvalidRequest(f"{shown!r} is {what}; only files can be downloaded")
        os.set_blocking(f, True)
        return st.st_size, FileChunks(f, st.st_size)

