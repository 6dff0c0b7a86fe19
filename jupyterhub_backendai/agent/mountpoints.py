"""Mount points of folders inside the user's home folder, removed when a kernel goes.

A session with a home folder at ``/home/work`` mounts its other folders at
``/home/work/<name>``: the directory they mount on lies in the home folder's own
directory on the volume (made there, owned like the home's files, before the start),
so without this it would stay behind, empty, in every later session. When a
container is removed, each such directory is removed again if it is empty and no
other container of this agent mounts a folder there from the same home
(``rmdir`` of a directory that another mount namespace mounts on would detach that
mount). A directory that is not empty (files the user wrote at that path while the
folder was not mounted) is left as it is, and so is anything that is not a
directory: ``rmdir`` follows no link.

Also the check of a kernel's mounts as the manager asks for them (:func:`check_mounts`).
"""

from __future__ import annotations

import errno
import os

from ..common.errors import InvalidRequest

MOUNT_ROOT = "/home/work"


def _home_and_points(mounts: list[dict]) -> tuple[str | None, list[str]]:
    """(the home folder's source, the names mounted under /home/work) from a
    container's ``Mounts`` as Docker lists them (``Source``, ``Destination``)."""
    home = None
    names = []
    for m in mounts or []:
        dest = m.get("Destination") or ""
        if dest == MOUNT_ROOT:
            home = m.get("Source")
        elif dest.startswith(MOUNT_ROOT + "/"):
            name = dest[len(MOUNT_ROOT) + 1:]
            if name and "/" not in name and name not in (".", ".."):
                names.append(name)
    return home, names


def remove_unused(gone: dict, others: list[dict]) -> list[str]:
    """Remove the empty mount points that the container ``gone`` (a Docker listing
    entry) used in its home folder and that none of ``others`` (this agent's other
    containers) still uses; returns the paths removed."""
    home, names = _home_and_points(gone.get("Mounts"))
    if not home or not names:
        return []
    in_use = set()
    for c in others:
        h, ns = _home_and_points(c.get("Mounts"))
        if h == home:
            in_use.update(ns)
    removed = []
    for name in names:
        if name in in_use:
            continue
        path = os.path.join(home, name)
        try:
            os.rmdir(path)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR,
                               errno.EBUSY, errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            continue
        removed.append(path)
    return removed


MOUNT_MODES = ("ro", "rw")


def check_mounts(mounts) -> list[dict]:
    """Check a kernel's ``mounts``: ``[{"source": a directory on this node, "target":
    "/home/work/<name>" (or "/home/work" itself: the user's home folder), "mode": "ro" |
    "rw"}]``; raise InvalidRequest otherwise.

    A target is one path component under /home/work (what the backends can
    place: a bind mount, or a link in the local backend's working folder), and
    two mounts never share one.
    """
    if mounts is None:
        return []
    if not isinstance(mounts, list):
        raise InvalidRequest("mounts must be a list")
    out, targets = [], set()
    for m in mounts:
        if not isinstance(m, dict) or set(m) - {"source", "target", "mode"}:
            raise InvalidRequest(f"a mount is {{source, target, mode}}, not {m!r}")
        source, target, mode = m.get("source"), m.get("target"), m.get("mode", "rw")
        if mode not in MOUNT_MODES:
            raise InvalidRequest(f"mount mode must be ro or rw, not {mode!r}")
        if target == MOUNT_ROOT:
            pass  # the user's home folder: /home/work itself
        elif not isinstance(target, str) or not target.startswith(MOUNT_ROOT + "/"):
            raise InvalidRequest(f"mount target must be {MOUNT_ROOT}/<name>, not {target!r}")
        elif not (name := target[len(MOUNT_ROOT) + 1:]) or "/" in name or name in (".", "..") \
                or "\0" in name:
            raise InvalidRequest(
                f"mount target must be one folder directly under {MOUNT_ROOT}, not {target!r}")
        if target in targets:
            raise InvalidRequest(f"two mounts at {target}")
        if not isinstance(source, str) or not os.path.isabs(source):
            raise InvalidRequest(f"mount source must be an absolute path, not {source!r}")
        if not os.path.isdir(source):
            raise InvalidRequest(f"mount source {source} of {target} is not a directory on this agent")
        targets.add(target)
        out.append({"source": os.path.normpath(source), "target": target, "mode": mode})
    return out
