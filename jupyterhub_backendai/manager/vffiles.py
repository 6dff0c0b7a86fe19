"""The files in virtual folders, on the storage proxy: list, delete, mkdir, rename,
upload (within the folder's room) and download. Each takes ``where``, the folder's
place that :func:`.vfolders.file_access` gives once it has checked the caller may do the
operation; none runs inside a transaction.
"""

from __future__ import annotations

from ..common.errors import StorageQuotaExceeded


async def list_files(manager, where: dict, path: str) -> dict:
    items = await manager.storage.list_files(where["host"], where["quota_scope_id"], where["id"],
                                             path)
    return {"path": path, "items": items}


async def delete_files(manager, where: dict, path: str, recursive: bool) -> None:
    await manager.storage.delete(where["host"], where["quota_scope_id"], where["id"], path,
                                 recursive=recursive)


async def mkdir(manager, where: dict, path: str, *, parents: bool) -> None:
    await manager.storage.mkdir(where["host"], where["quota_scope_id"], where["id"], path,
                                parents=parents)


async def rename(manager, where: dict, src: str, dst: str) -> None:
    await manager.storage.rename(where["host"], where["quota_scope_id"], where["id"], src, dst)


async def upload(manager, where: dict, path: str, chunks) -> int:
    """Write ``chunks`` (an async iterator of bytes) to ``path``; returns the size.

    The scope's limit is set from the resource policy as it is now (a policy
    changed since the folder was made applies from the next upload on)."""
    await manager.storage.set_quota_scope(where["host"], where["quota_scope_id"],
                                          where.get("quota_bytes") or None)
    out = await manager.storage.upload(where["host"], where["quota_scope_id"], where["id"], path,
                                       chunks)
    return out["size"] if isinstance(out, dict) else int(out)


async def check_folder_room(manager, where: dict, path: str, size: int) -> None:
    """413 where ``size`` more bytes do not fit in the folder's own limit (``where`` from
    :func:`file_access`): a tus grant's check before its bytes come, as the scope's."""
    limit = where.get("max_size_bytes")
    if limit is None:
        return
    used = (await manager.storage.folder_usage(where["host"], where["quota_scope_id"],
                                               where["id"]))["used_bytes"]
    if used + size > limit:
        raise StorageQuotaExceeded(
            f"vfolder {where['name']!r} is limited to {limit} bytes (its own limit) and "
            f"{used} are used; {path!r} needs {size}")


async def download(manager, where: dict, path: str):
    """(size, async iterator of the file's bytes)."""
    return await manager.storage.download(where["host"], where["quota_scope_id"], where["id"],
                                          path)


