"""vfs quotas: the usage of folders and quota scopes, and the limits kept in files.

A scope's limit, when it has one, is ``<root>/<scope type>/<scope id>/.quota.json``,
and the folders' own limits (those that have one) ``<root>/<scope type>/<scope
id>/.folder-quotas.json`` (never inside a folder, so no session can see or change
them). Usage is measured by walking the tree (apparent sizes, links not followed).
The proxy checks its own writes (uploads, tus, clones) against the limits before it
makes them (:meth:`VFSQuotas.upload_bound`); a session writing into its mounted folder
is not bounded (docs/storage.md). :class:`VFSQuotas` is a part of
:class:`~.volumes.VFSVolume`; the btrfs backend (:mod:`.btrfs`) keeps these files but
measures and enforces with qgroups.
"""

from __future__ import annotations

import json
import os
import secrets
import threading

from ..common.errors import BackendAIError, InvalidRequest, NotFound, StorageQuotaExceeded
from .paths import _DIR_FLAGS, _usage_fd

QUOTA_FILE = ".quota.json"
FOLDER_QUOTA_FILE = ".folder-quotas.json"  # {folder id: limit in bytes}, beside QUOTA_FILE


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


class VFSQuotas:
    """The usage and the limits of a volume's folders and quota scopes. A part of
    :class:`~.volumes.VFSVolume`, whose layout (``scope_path``, ``_open_folder``) and
    ``name`` it uses."""

    # -- usage and quota scopes ------------------------------------------------

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
