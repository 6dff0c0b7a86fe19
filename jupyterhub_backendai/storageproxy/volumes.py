"""Volumes: where a storage proxy keeps folders. ``vfs`` is a plain directory tree.

Layout (as Backend.AI's): ``<root>/<scope type>/<scope id>/<folder id>``, so that
everything of one quota scope (a user's or a project's folders) lies under one
directory that the volume can measure and bound.
"""

from __future__ import annotations

import os
import re
import shutil

from ..common.errors import InvalidRequest

FOLDER_ID_RE = re.compile(r"^[0-9a-f]{32}$")
QUOTA_SCOPE_RE = re.compile(r"^(user|project):[0-9a-f]{32}$")


def check_ids(quota_scope_id: str, folder_id: str | None = None) -> None:
    if not isinstance(quota_scope_id, str) or not QUOTA_SCOPE_RE.fullmatch(quota_scope_id):
        raise InvalidRequest(f"invalid quota scope id {quota_scope_id!r}")
    if folder_id is not None and (
        not isinstance(folder_id, str) or not FOLDER_ID_RE.fullmatch(folder_id)
    ):
        raise InvalidRequest(f"invalid folder id {folder_id!r}")


class VFSVolume:
    """A volume on a local (or NFS-mounted) directory.

    ``folder_uid``/``folder_gid``: owner given to new folders when the proxy runs as
    root, so that the kernel's user (``work``, 1000 in our images) can write in them.
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

    def _chown(self, path: str) -> None:
        if os.geteuid() == 0:
            os.chown(path, self.folder_uid, self.folder_gid)

    def create_folder(self, quota_scope_id: str, folder_id: str) -> None:
        """Idempotent: an existing folder is left as it is."""
        path = self.folder_path(quota_scope_id, folder_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            return
        self._chown(path)

    def delete_folder(self, quota_scope_id: str, folder_id: str) -> None:
        """Idempotent: a missing folder is not an error."""
        shutil.rmtree(self.folder_path(quota_scope_id, folder_id), ignore_errors=True)

    def info(self) -> dict:
        return {"name": self.name, "backend": self.backend, "path": self.path}
