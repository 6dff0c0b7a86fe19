"""The volume backends by name, and the volumes of a configuration."""

from __future__ import annotations

from .btrfs import BtrfsVolume
from .volumes import VFSVolume

BACKENDS: dict[str, type[VFSVolume]] = {"vfs": VFSVolume, "btrfs": BtrfsVolume}


def make_volumes(conf: dict) -> dict[str, VFSVolume]:
    """Volumes from a config dict: {name: {"backend": "vfs" | "btrfs", "path": ...,
    "folder_uid": 1000, "folder_gid": 1000}} (the manager's ``storage_volumes``, the
    daemon's ``volumes``). A btrfs volume refuses to be made (ValueError, saying why)
    on another file system, one without quotas, or one whose quotas are not simple
    quotas unless ``allow_full_qgroups`` says so (storageproxy/btrfs.py)."""
    volumes = {}
    for vname, vconf in conf.items():
        backend = vconf.get("backend", "vfs")
        if backend not in BACKENDS:
            raise ValueError(f"volume {vname!r}: unknown backend {backend!r} "
                             f"(known: {', '.join(BACKENDS)})")
        if not vconf.get("path"):
            raise ValueError(f"volume {vname!r} needs a path")
        extra = ({"allow_full_qgroups": bool(vconf.get("allow_full_qgroups"))}
                 if backend == "btrfs" else {})
        volumes[vname] = BACKENDS[backend](
            vname, vconf["path"], vconf.get("folder_uid", 1000), vconf.get("folder_gid", 1000),
            **extra)
    return volumes
