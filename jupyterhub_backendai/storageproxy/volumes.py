"""Volumes: where a storage proxy keeps folders. ``vfs`` is a plain directory tree.

Layout (as Backend.AI's): ``<root>/<scope type>/<scope id>/<folder id>``, so that
everything of one quota scope (a user's or a project's folders) lies under one
directory that the volume can measure and bound; the scope's tus uploads gather their
bytes beside its folders, in ``<root>/<scope type>/<scope id>/.tus``.

:class:`VFSVolume` owns that layout and the folders as wholes (made, deleted, cloned,
their staged uploads placed); it is made of the operations on the files inside a folder
(:class:`~.files.FolderFiles`) and of the usage and limits of folders and quota scopes
(:class:`~.quotas.VFSQuotas`). Paths are checked and reached as :mod:`.paths` says.
"""

from __future__ import annotations

import os
import secrets
import subprocess

from ..common.errors import BackendAIError, Conflict, NotFound, StorageQuotaExceeded
from .files import FolderFiles
from .paths import _DIR_FLAGS, FOLDER_MODE, _rmtree_fd, check_ids
from .quotas import VFSQuotas

STAGING = ".tus"  # a scope's tus uploads while their bytes arrive


class VFSVolume(FolderFiles, VFSQuotas):
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
