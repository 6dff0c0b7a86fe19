"""``btrfs`` volumes: the file system enforces the quotas.

The layout is vfs's (``<root>/<scope type>/<scope id>/<folder id>``) and every file
operation inside a folder is vfs's (:class:`~.volumes.VFSVolume`); what changes:

- each folder is a **subvolume**, so btrfs accounts it in its own qgroup ``0/<subvolume
  id>``; deleting it is ``btrfs subvolume delete`` (no walk), cloning it a writable
  **snapshot** (instant, whatever its size; the blocks are shared until written);
- each quota scope is a **level-1 qgroup** ``1/<inode of the scope directory>`` that
  every folder of the scope belongs to from its creation (``subvolume create -i``,
  ``snapshot -i``), limited (``max_rfer``) to the scope's quota. The kernel refuses a
  write past it with EDQUOT, whoever writes: a kernel through its mount, the API, tus.
  A folder with a limit of its own (Backend.AI's ``max_size``) has it on its qgroup
  ``0/<subvolume id>`` too, enforced the same way (a clone gets its source's).
  The scope directory's inode names the qgroup, so no table is kept; the numbers are
  unique within one subvolume of the file system (docs/storage.md: one volume per
  btrfs file system, or several volumes in the same subvolume);
- quotas must be **simple quotas** (squota, Linux 6.7+): under them a subvolume made
  inside a folder (``btrfs subvolume create``, an ioctl any user may call on a directory
  they can write, from inside a kernel too) joins its parent folder's scope qgroup by
  itself, so its bytes count against the same limit. Under full qgroup accounting it
  would belong to no scope and escape every limit; a volume on such a file system is
  refused unless its configuration says ``allow_full_qgroups`` (a trusted one). Under
  simple quotas an extent counts where it was first written: a clone costs its scope
  nothing until it is written to, and the bytes a clone shares stay charged to the
  source's scope while the clone lives (docs/storage.md);
- usage is the qgroups' ``referenced`` bytes (``btrfs qgroup show --raw --sync``): no
  walk of the tree, a transaction commit and one read of the quota tree. Bytes on
  disk as btrfs counts them (data extents and the folder's metadata blocks; blocks
  shared by a clone count once per scope), not apparent sizes; btrfs counts no files,
  so ``file_count`` is null;
- tus uploads stage their bytes in ``<scope>/.tus``, itself a subvolume of the scope's
  qgroup (so staged bytes count), and a finished file moves into the folder by a
  reflink (``FICLONE``: blocks shared, not copied) and a rename inside the folder:
  btrfs refuses a rename between subvolumes.

The btrfs command line is run in the caller's thread (every volume method runs in a
worker thread: ``asyncio.to_thread`` in the hub, the daemon alike), so nothing blocks
an event loop and no Python dependency is added.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import struct
import subprocess
import threading
import time

from ..common.errors import BackendAIError, Conflict, NotFound, StorageQuotaExceeded
from .paths import _DIR_FLAGS, FOLDER_MODE, check_ids
from .volumes import STAGING, VFSVolume

# BTRFS_IOC_INO_LOOKUP = _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args (4096 bytes))
_IOC_INO_LOOKUP = 0xC0000000 | (4096 << 16) | (0x94 << 8) | 18
# FICLONE = _IOW(0x94, 9, int)
_FICLONE = 0x40049409
# BTRFS_IOC_FS_INFO = _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args (1024 bytes))
_IOC_FS_INFO = 0x80000000 | (1024 << 16) | (0x94 << 8) | 31
# BTRFS_IOC_QUOTA_CTL = _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args {u64 cmd, status})
_IOC_QUOTA_CTL = 0xC0000000 | (16 << 16) | (0x94 << 8) | 40
_QUOTA_CTL_ENABLE_SIMPLE = 4  # BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA
_SUBVOL_ROOT_INO = 256  # BTRFS_FIRST_FREE_OBJECTID: the root directory of every subvolume
_QGROUP_LINE = re.compile(r"^(\d+/\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)")
# How often a quota-tree read that raced with a qgroup's removal is tried (qgroups()).
_QGROUP_READS = 8


class BtrfsError(BackendAIError):
    """The btrfs command line failed (its message is in the detail)."""


def btrfs(*args: str) -> str:
    """Run ``btrfs <args>``; its stdout, or :class:`BtrfsError` with its stderr."""
    try:
        out = subprocess.run(["btrfs", *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise BtrfsError("the btrfs command is not installed (package btrfs-progs)") from None
    if out.returncode:
        msg = (out.stderr or out.stdout).strip()
        if "quota exceeded" in msg.lower() or "Disk quota" in msg:
            raise StorageQuotaExceeded(f"btrfs {args[0]} {args[1]}: {msg}")
        raise BtrfsError(f"btrfs {' '.join(args[:2])}: {msg}")
    return out.stdout


def subvolume_id(path: str) -> int | None:
    """The id of the subvolume whose root ``path`` is; None if ``path`` is a plain
    directory (a folder moved from vfs); OSError(ENOTTY) if it is not on btrfs."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        st = os.fstat(fd)
        buf = bytearray(4096)
        struct.pack_into("=QQ", buf, 0, 0, _SUBVOL_ROOT_INO)
        fcntl.ioctl(fd, _IOC_INO_LOOKUP, buf, True)
        if st.st_ino != _SUBVOL_ROOT_INO:
            return None
        return struct.unpack_from("=Q", buf, 0)[0]
    finally:
        os.close(fd)


def quota_mode(path: str) -> str | None:
    """How the file system at ``path`` accounts quotas: ``"squota"`` (simple quotas),
    ``"qgroup"`` (full accounting) or None (quotas off), from its sysfs entry."""
    import uuid

    fd = os.open(path, _DIR_FLAGS)
    try:
        buf = bytearray(1024)
        fcntl.ioctl(fd, _IOC_FS_INFO, buf, True)
    finally:
        os.close(fd)
    fsid = uuid.UUID(bytes=bytes(buf[16:32]))
    try:
        with open(f"/sys/fs/btrfs/{fsid}/qgroups/mode") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def enable_simple_quotas(path: str) -> None:
    """``btrfs quota enable --simple`` for btrfs-progs older than 6.7 (Debian 12 has
    6.2): the quota-control ioctl with the simple-quota command; as root, on a file
    system whose quotas are off (turn full accounting off first: ``btrfs quota disable``)."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        fcntl.ioctl(fd, _IOC_QUOTA_CTL, struct.pack("=QQ", _QUOTA_CTL_ENABLE_SIMPLE, 0))
    finally:
        os.close(fd)


def qgroups(path: str, sync: bool = True) -> dict[str, dict]:
    """Every qgroup of the file system at ``path``: ``{"0/257": {"rfer", "excl",
    "max_rfer"}}`` (``max_rfer`` None without a limit). ``sync`` commits the running
    transaction first, so that bytes just written are counted.

    ``btrfs qgroup show`` reads the quota tree in several searches, and fails ("cannot
    find the qgroup 0/<id>") when a qgroup goes between them: one destroyed with its
    folder, or one btrfs drops by itself once a deleted subvolume is cleaned. That is a
    read of a tree that changed, not an error of the file system: it is read again."""
    args = ["qgroup", "show", "--raw", "-re"]
    if sync:
        args.append("--sync")
    for attempt in range(_QGROUP_READS):
        try:
            text = btrfs(*args, path)
            break
        except BtrfsError as e:
            if "cannot find the qgroup" not in str(e) or attempt == _QGROUP_READS - 1:
                raise
            time.sleep(0.01 * (attempt + 1))
    out = {}
    for line in text.splitlines():
        m = _QGROUP_LINE.match(line.strip())
        if m:
            qid, rfer, excl, max_rfer, _ = m.groups()
            out[qid] = {"rfer": int(rfer), "excl": int(excl),
                        "max_rfer": None if max_rfer == "none" else int(max_rfer)}
    return out


def _copy_data(src: int, dst: int, size: int) -> None:
    """Write ``size`` bytes of ``src`` into ``dst`` as new extents (``sendfile``: no
    reflink, which ``copy_file_range`` may make on btrfs)."""
    offset = 0
    while offset < size:
        n = os.sendfile(dst, src, offset, min(size - offset, 1 << 30))
        if n == 0:
            break
        offset += n


class BtrfsVolume(VFSVolume):
    """A volume on a btrfs file system with quotas enabled (``btrfs quota enable``)."""

    backend = "btrfs"

    def __init__(self, name: str, path: str, folder_uid: int = 1000, folder_gid: int = 1000,
                 allow_full_qgroups: bool = False):
        super().__init__(name, path, folder_uid, folder_gid)
        self._lock = threading.Lock()
        self._scopes: set[str] = set()  # level-1 qgroups known to exist
        try:
            subvolume_id(self.path)
        except OSError as e:
            if e.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
                raise ValueError(
                    f"volume {name!r}: {self.path} is not on a btrfs file system "
                    "(backend 'btrfs' needs one; docs/storage.md)") from None
            raise
        try:
            qgroups(self.path, sync=False)
        except BtrfsError as e:
            if "quota" in e.detail.lower() or "not enabled" in e.detail.lower():
                raise ValueError(
                    f"volume {name!r}: quotas are not enabled on the btrfs file system at "
                    f"{self.path}, so its folders' limits could not be enforced; run "
                    f"'btrfs quota enable <its mount point>' first (docs/storage.md). "
                    f"btrfs said: {e.detail}") from None
            raise ValueError(f"volume {name!r}: {e.detail}") from None
        mode = quota_mode(self.path)
        if mode != "squota" and not allow_full_qgroups:
            raise ValueError(
                f"volume {name!r}: the btrfs file system at {self.path} accounts quotas "
                f"in full ({mode or 'unknown'}) mode, where a subvolume a user makes inside "
                "a folder escapes the folder's limit; enable simple quotas before making "
                "folders ('btrfs quota disable <mount>', then 'btrfs quota enable --simple "
                "<mount>' with btrfs-progs 6.7 or later, or 'python -m "
                "jupyterhub_backendai.storageproxy.btrfs enable-simple-quotas <mount>'), "
                "or set allow_full_qgroups for a volume whose users you trust "
                "(docs/storage.md)")

    # -- quota scopes as level-1 qgroups ----------------------------------------

    def _scope_qgroup(self, quota_scope_id: str, create: bool = True) -> str | None:
        """``1/<inode>`` of a scope's directory, made (with its qgroup) if ``create``;
        None if the scope does not exist and ``create`` is false."""
        scope = self.scope_path(quota_scope_id)
        if create:
            os.makedirs(scope, exist_ok=True)
        try:
            qid = f"1/{os.stat(scope).st_ino}"
        except FileNotFoundError:
            return None
        if create and qid not in self._scopes:
            with self._lock:
                if qid not in self._scopes:
                    try:
                        btrfs("qgroup", "create", qid, self.path)
                    except BtrfsError as e:
                        if "exists" not in e.detail:
                            raise
                    self._scopes.add(qid)
        return qid

    def set_quota_scope(self, quota_scope_id: str, limit_bytes: int | None) -> None:
        """The scope's qgroup limit, in force at once for every writer (a limit below
        the current usage is accepted: every further write fails until enough is
        deleted)."""
        super().set_quota_scope(quota_scope_id, limit_bytes)  # checks, and keeps .quota.json
        qid = self._scope_qgroup(quota_scope_id)
        btrfs("qgroup", "limit", "none" if limit_bytes is None else str(limit_bytes), qid,
              self.path)

    # (_read_limit stays vfs's: .quota.json, written with the qgroup's limit, is read
    # without running the btrfs command for every upload's check.)

    def scope_usage(self, quota_scope_id: str) -> dict:
        """The scope's qgroup's referenced bytes. For a scope with a limit the running
        transaction is committed first, so that what was just written or deleted counts
        (the checks before uploads); without one, as of the last commit (at most btrfs's
        commit interval, 30 s, behind), which spares every upload a commit."""
        qid = self._scope_qgroup(quota_scope_id, create=False)
        if qid is None:
            return {"used_bytes": 0, "file_count": None}
        limited = self._read_limit(quota_scope_id) is not None
        q = qgroups(self.path, sync=limited).get(qid)
        return {"used_bytes": q["rfer"] if q else 0, "file_count": None}

    def quota_scope(self, quota_scope_id: str) -> dict:
        qid = self._scope_qgroup(quota_scope_id, create=False)
        q = qgroups(self.path).get(qid) if qid is not None else None
        return {"limit_bytes": q["max_rfer"] if q else None, "used_bytes": q["rfer"] if q else 0}

    # -- folders as subvolumes -------------------------------------------------

    def _subvolume(self, quota_scope_id: str, folder_id: str) -> tuple[str, int | None]:
        return self._at_folder(quota_scope_id, folder_id, lambda path: (path, subvolume_id(path)))

    def create_folder(self, quota_scope_id: str, folder_id: str) -> None:
        """Idempotent: an existing folder is left as it is."""
        path = self.folder_path(quota_scope_id, folder_id)
        if os.path.lexists(path):
            return
        qid = self._scope_qgroup(quota_scope_id)
        btrfs("subvolume", "create", "-i", qid, path)
        self._chown(path)
        os.chmod(path, FOLDER_MODE)

    def delete_folder(self, quota_scope_id: str, folder_id: str) -> None:
        """Idempotent. A subvolume goes with ``subvolume delete`` (with any subvolume a
        session made inside it); a plain directory (moved from vfs) as vfs deletes it."""
        check_ids(quota_scope_id, folder_id)
        path = self.folder_path(quota_scope_id, folder_id)
        try:
            sid = subvolume_id(path)
        except (FileNotFoundError, NotADirectoryError):
            self._write_folder_limit(quota_scope_id, folder_id, None)
            return
        if sid is None:
            return super().delete_folder(quota_scope_id, folder_id)
        try:
            self._delete_subvolume(path, sid)
        except StorageQuotaExceeded:
            # A delete writes metadata too, and a scope at its limit refuses that (a
            # nested subvolume's delete does, when the user filled the scope through it):
            # lifted for the delete only, then put back. (The folder's own limit goes
            # with it.)
            qid = self._scope_qgroup(quota_scope_id, create=False)
            if qid is None:
                raise
            limit = qgroups(self.path, sync=False).get(qid, {}).get("max_rfer")
            btrfs("qgroup", "limit", "none", f"0/{sid}", self.path)
            btrfs("qgroup", "limit", "none", qid, self.path)
            try:
                self._delete_subvolume(path, sid)
            finally:
                btrfs("qgroup", "limit", "none" if limit is None else str(limit), qid,
                      self.path)
        self._write_folder_limit(quota_scope_id, folder_id, None)

    def _delete_subvolume(self, path: str, sid: int) -> None:
        try:
            btrfs("subvolume", "delete", path)
        except StorageQuotaExceeded:
            raise
        except BtrfsError:
            # subvolumes made inside it (a session may): deepest first, then it
            nested = []
            for line in btrfs("subvolume", "list", "-o", path).splitlines():
                rel = line.split(" path ", 1)[-1].strip()
                nested.append(rel)
            root = self._fs_root()
            for rel in sorted(nested, key=len, reverse=True):
                btrfs("subvolume", "delete", os.path.join(root, rel))
            btrfs("subvolume", "delete", path)
        try:
            btrfs("qgroup", "destroy", f"0/{sid}", self.path)
        except BtrfsError:
            pass  # still being cleaned by the kernel: `btrfs qgroup clear-stale` drops it

    def _fs_root(self) -> str:
        """The mount point of the file system's top-level subvolume (the paths ``subvolume
        list`` prints are relative to it); the volume must be on that mount."""
        path = self.path
        while not os.path.ismount(path):
            path = os.path.dirname(path)
        return path

    def folder_usage(self, quota_scope_id: str, folder_id: str) -> dict:
        """The folder's qgroup's referenced bytes (no walk); a plain directory (moved
        from vfs) is walked as vfs does."""
        _, sid = self._subvolume(quota_scope_id, folder_id)
        if sid is None:
            return super().folder_usage(quota_scope_id, folder_id)
        q = qgroups(self.path).get(f"0/{sid}")
        return {"used_bytes": q["rfer"] if q else 0, "file_count": None}

    def folders_usage(self, folders: list[tuple[str, str]]) -> list[dict | None]:
        """:meth:`folder_usage` of many folders with one read of the quota tree (a listing
        of 500 folders is one ``btrfs qgroup show``, not 500 of them, each a transaction
        commit); None for a folder that does not exist."""
        sids: list[int | None | bool] = []
        for scope, fid in folders:
            try:
                sids.append(self._subvolume(scope, fid)[1])
            except NotFound:
                sids.append(False)
        read = qgroups(self.path) if any(type(s) is int for s in sids) else {}
        out: list[dict | None] = []
        for (scope, fid), sid in zip(folders, sids, strict=True):
            if sid is False:
                out.append(None)
            elif sid is None:  # a plain directory (moved from vfs): walked
                out.extend(super().folders_usage([(scope, fid)]))
            else:
                q = read.get(f"0/{sid}")
                out.append({"used_bytes": q["rfer"] if q else 0, "file_count": None})
        return out

    def set_folder_quota(self, quota_scope_id: str, folder_id: str,
                         limit_bytes: int | None) -> None:
        """The folder's own qgroup limit (``0/<subvolume id>``), in force at once for
        every writer, kept in the scope's folder-limit file too (which uploads read
        without running the btrfs command). A plain directory (moved from vfs) is in no
        qgroup: its limit is checked by uploads only, as on vfs."""
        _, sid = self._subvolume(quota_scope_id, folder_id)
        super().set_folder_quota(quota_scope_id, folder_id, limit_bytes)
        if sid is not None:
            btrfs("qgroup", "limit", "none" if limit_bytes is None else str(limit_bytes),
                  f"0/{sid}", self.path)

    def folder_quota(self, quota_scope_id: str, folder_id: str) -> dict:
        """The folder's qgroup's limit and referenced bytes (one read of the quota tree)."""
        _, sid = self._subvolume(quota_scope_id, folder_id)
        if sid is None:
            return super().folder_quota(quota_scope_id, folder_id)
        q = qgroups(self.path).get(f"0/{sid}") or {}
        return {"limit_bytes": q.get("max_rfer"), "used_bytes": q.get("rfer", 0)}

    def clone_folder(self, src_scope: str, src_id: str, dst_scope: str, dst_id: str) -> None:
        """A writable snapshot in the target scope's qgroup: instant, whatever the size
        (blocks shared until either side writes). A source that is a plain directory
        (moved from vfs) is copied with reflinks as vfs does."""
        check_ids(dst_scope, dst_id)
        _, sid = self._subvolume(src_scope, src_id)
        if sid is None:
            return super().clone_folder(src_scope, src_id, dst_scope, dst_id)
        src = self.folder_path(src_scope, src_id)
        dst = self.folder_path(dst_scope, dst_id)
        if os.path.lexists(dst):
            raise Conflict(f"folder {dst_id} exists in quota scope {dst_scope}")
        if dst_scope != src_scope:
            self._check_clone_room(src_scope, src_id, dst_scope)
        qid = self._scope_qgroup(dst_scope)
        btrfs("subvolume", "snapshot", "-i", qid, src, dst)
        # A snapshot's qgroup starts without a limit: the clone keeps its source's.
        limit = self._read_folder_limit(src_scope, src_id)
        if limit is not None:
            try:
                self.set_folder_quota(dst_scope, dst_id, limit)
            except BaseException:
                self.delete_folder(dst_scope, dst_id)
                raise

    # -- tus staging ---------------------------------------------------------------

    def make_staging(self, quota_scope_id: str) -> str:
        """``<scope>/.tus`` as a subvolume of the scope's qgroup: staged bytes count
        against the scope, and the kernel stops them at its limit."""
        path = os.path.join(self.scope_path(quota_scope_id), STAGING)
        if os.path.lexists(path):
            return path
        qid = self._scope_qgroup(quota_scope_id)
        with self._lock:
            if not os.path.lexists(path):
                btrfs("subvolume", "create", "-i", qid, path)
                os.chmod(path, 0o700)
        return path

    def place_staged(self, staged: str, dir_fd: int, name: str, owned: bool = False) -> None:
        """Reflink the staged file into the folder under a hidden name, rename it over
        ``name``, then drop the staged file (a rename cannot cross subvolumes).

        ``owned``: the folder has a limit of its own. Under simple quotas an extent stays
        charged where it was first written (the staging subvolume, in the scope's
        qgroup, not the folder's), so for such a folder the bytes are copied instead of
        shared: the folder's qgroup counts them, and refuses them past its limit."""
        if not owned:
            try:
                os.rename(staged, name, dst_dir_fd=dir_fd)
                return
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise
        tmp = f".upload-{secrets.token_hex(8)}.tmp"
        src = os.open(staged, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(src)
            dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                          st.st_mode & 0o777, dir_fd=dir_fd)
            try:
                if owned:
                    _copy_data(src, dst, st.st_size)
                else:
                    fcntl.ioctl(dst, _FICLONE, src)
                if os.geteuid() == 0:
                    os.fchown(dst, st.st_uid, st.st_gid)
            except BaseException:
                os.close(dst)
                os.unlink(tmp, dir_fd=dir_fd)
                raise
            os.close(dst)
        finally:
            os.close(src)
        try:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.unlink(staged)


def main(argv: list[str] | None = None) -> int:
    """``python -m jupyterhub_backendai.storageproxy.btrfs enable-simple-quotas <mount>``."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "enable-simple-quotas":
        print("usage: python -m jupyterhub_backendai.storageproxy.btrfs "
              "enable-simple-quotas <mount point>", file=sys.stderr)
        return 2
    try:
        enable_simple_quotas(args[1])
    except OSError as e:
        print(f"enabling simple quotas on {args[1]} failed: {e} (as root, on btrfs, on "
              "Linux 6.7 or later, with quotas off)", file=sys.stderr)
        return 1
    print(f"simple quotas enabled on {args[1]} (mode: {quota_mode(args[1])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
