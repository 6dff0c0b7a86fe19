"""A folder's tree, reached safely: ids, paths, walks through open directories, OS errors.

Running sessions write in the same folders (as the kernel's user, while this process
may be root), so a path is never resolved by name in one step: each directory on the
way is opened with ``O_NOFOLLOW`` relative to the previous one (``openat``), and the
final entry is acted on through its parent's descriptor. A symbolic link is listed but
never followed, not even one pointing inside the folder; a link swapped in during an
operation makes the operation fail instead of escaping the folder. Trees are walked
(measured, removed) the same way, without recursion (:func:`_walk_fd`). An OS error on
a user's path becomes the 4xx that says what is wrong with it (:func:`_os_error`).
"""

from __future__ import annotations

import errno
import os
import re
import stat

from ..common.errors import (
    BackendAIError,
    Conflict,
    InvalidRequest,
    NotFound,
    StorageQuotaExceeded,
)

FOLDER_ID_RE = re.compile(r"^[0-9a-f]{32}$")
QUOTA_SCOPE_RE = re.compile(r"^(user|project):[0-9a-f]{32}$")
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
