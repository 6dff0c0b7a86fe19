"""Backend.AI's virtual-folder routes (``/folders``: create, list, info, files, mkdir,
rename, move, invitations, sharing, the 26.09 trash, upload and download grants) as thin
handlers over :mod:`...manager.vfolders`: a folder is named as the clients name it and
found through the caller's view (``resolve_folder`` of :mod:`...manager.compatviews`)."""

from __future__ import annotations

import datetime as dt
import json
import uuid

from tornado import web

from ...common.errors import (
    BackendAIError,
    Conflict,
    InvalidRequest,
    NotFound,
    StorageQuotaExceeded,
    Unauthorized,
)
from ...common.slots import parse_size
from ...manager import vffiles, vfolders
from ...manager.compatviews import as_hex as _as_hex
from ...manager.compatviews import dashed
from ...storageproxy import transfer
from ...storageproxy.client import InProcessStorageClient
from .. import spec
from .base import CompatBase

# Paths one mkdir or delete-files names: each is a storage operation (20,000 took 4 s).
MAX_PATHS = 1000


# -- virtual folders -----------------------------------------------------------------------


class FoldersHandler(CompatBase):
    async def get(self):
        page = await self.manager.ops.list_folders(self.principal, {}, 0, spec.MAX_LIMIT)
        out = []
        for item in page["items"]:
            out.append(await self.manager.ops.folder_rest(self.principal, item["id"]))
        self.reply(out)

    async def post(self):
        body = self.json_body()
        if body.get("unmanaged_path"):
            raise InvalidRequest("unmanaged folders are not supported by this server")
        # (every folder may be cloned by whoever may read it: `cloneable` is always true)
        create = {"name": body.get("name")}
        # `vfolder create -q 10m`: the folder's own limit ("0": none), binary units
        if str(body.get("quota") or "0") not in ("0", "0.0"):
            try:
                create["max_size_bytes"] = int(parse_size(body["quota"]))
            except InvalidRequest as e:
                raise InvalidRequest(f"quota: {e.detail}") from None
        if body.get("host"):
            create["host"] = body["host"]
        if body.get("usage_mode") and body["usage_mode"] != "general":
            create["usage_mode"] = body["usage_mode"]
        if body.get("group"):
            create["project"] = str(body["group"])
        # `-p ro`: a project folder's members' permission, a user folder's owner's
        create["permission"] = body.get("permission") or "rw"
        if not isinstance(create["name"], str) or not create["name"]:
            raise InvalidRequest("name: required field missing")
        out = await vfolders.create(self.manager, self.principal, create)
        self.reply(await self.manager.ops.folder_rest(self.principal, out["id"]), 201)


    async def delete(self):
        """26.09's delete: ``DELETE /folders {"id"}`` moves the folder to the trash."""
        fid = await self.manager.ops.resolve_folder(self.principal, _body_id(self))
        await self.manager.ops.move_to_trash(self.principal, fid)
        self.set_status(204)
        self.finish()


def _body_id(handler: CompatBase) -> str:
    ref = handler.json_body().get("id")
    if not isinstance(ref, str) or not ref:
        raise InvalidRequest("id: the folder's id is required")
    return ref


class FolderTrashHandler(CompatBase):
    """26.09's trash: ``POST /folders/restore-from-trash-bin``, ``/folders/purge`` and
    ``/folders/delete-from-trash-bin`` (both delete a trashed folder for good), ``{"id"}``."""

    def initialize(self, action: str):
        self.action = action

    async def post(self):
        fid = await self.manager.ops.resolve_folder(self.principal, _body_id(self))
        if self.action == "restore":
            await self.manager.ops.restore_from_trash(self.principal, fid)
        else:
            await vfolders.delete(self.manager, self.principal, fid, trashed=True)
        self.set_status(204)
        self.finish()


class FolderRenameHandler(CompatBase):
    """``vfolder rename OLD NEW``: ``POST /folders/{ref}/rename {"new_name"}``."""

    async def post(self, ref):
        name = self.json_body().get("new_name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("new_name: the folder's new name is required")
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        await self.manager.ops.update_folder(self.principal, fid, {"name": name})
        self.set_status(201)
        self.finish()


class FolderRenameFileHandler(CompatBase):
    """``vfolder rename-file NAME PATH NEW_NAME``: the entry keeps its directory."""

    async def post(self, ref):
        body = self.json_body()
        path = vfolders.check_path(body.get("target_path"), "target_path", allow_root=False)
        new_name = body.get("new_name")
        if not isinstance(new_name, str) or not new_name or "/" in new_name or new_name in (
                ".", ".."):
            raise InvalidRequest("new_name: a file name (no '/') is required")
        parent = path.rpartition("/")[0]
        dst = vfolders.check_path(f"{parent}/{new_name}" if parent else new_name, "new_name",
                                  allow_root=False)
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "write")
        await vffiles.rename(self.manager, where, path, dst)
        self.reply({})


class FolderMoveFileHandler(CompatBase):
    """``vfolder mv NAME SRC DST``: DST names the new path, or an existing directory to
    move SRC into (as ``mv`` does); an existing file is not replaced (409)."""

    async def post(self, ref):
        body = self.json_body()
        src = vfolders.check_path(body.get("src"), "src", allow_root=False)
        dst = vfolders.check_path(body.get("dst"), "dst")
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "write")
        base = src.rpartition("/")[2]
        if dst == "":
            dst = base
        else:
            try:
                listing = await vffiles.list_files(self.manager, where, dst)
            except BackendAIError:
                listing = None  # not a directory (or not there): DST is the new path
            if listing is not None:
                dst = f"{dst}/{base}"
        if dst == src:
            raise InvalidRequest(f"src and dst are the same path {src!r}")
        await vffiles.rename(self.manager, where, src, dst)
        self.reply({})


class FolderUpdateOptionsHandler(CompatBase):
    """``vfolder update-options NAME -p PERM --set-cloneable B``: the owner's (or an
    admin's) change of the folder's own permission; every folder is cloneable here."""

    async def post(self, ref):
        body = self.json_body()
        perm, cloneable = body.get("permission"), body.get("cloneable")
        if cloneable is not None and cloneable is not True:
            raise InvalidRequest("cloneable: every folder here may be cloned by whoever may "
                                 "read it; it cannot be turned off (use a share's permission "
                                 "to decide who reads it)")
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        if perm is not None:
            await self.manager.ops.update_folder(self.principal, fid, {"permission": perm})
        self.reply({})


class FolderInviteHandler(CompatBase):
    """``vfolder invite NAME EMAIL... -p PERM``: ``{"perm", "user_ids"}`` ->
    ``{"invited_ids"}`` (the emails invited; each invitee accepts or declines)."""

    async def post(self, ref):
        body = self.json_body()
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        made = await self.manager.ops.invite(self.principal, fid,
                                             body.get("user_ids"), body.get("perm", "rw"))
        self.reply({"invited_ids": [i["invitee"] for i in made]}, 201)


class FolderShareHandler(CompatBase):
    """``vfolder share NAME EMAIL... -p PERM``: ``{"permission", "emails"}`` ->
    ``{"shared_emails"}`` (at once: a project folder's members, or a user folder's)."""

    async def post(self, ref):
        body = self.json_body()
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        emails = await self.manager.ops.share_with(self.principal, fid,
                                                   body.get("emails"), body.get("permission", "rw"))
        self.reply({"shared_emails": emails}, 201)


class FolderUnshareHandler(CompatBase):
    """``vfolder unshare NAME EMAIL...``: ``DELETE {"emails"}`` -> ``{"unshared_emails"}``."""

    async def delete(self, ref):
        body = self.json_body()
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        emails = await self.manager.ops.unshare_with(self.principal, fid, body.get("emails"))
        self.reply({"unshared_emails": emails})


class FolderLeaveHandler(CompatBase):
    """``vfolder leave NAME``: the caller leaves a user folder shared with them."""

    async def post(self, ref):
        body = self.json_body()
        who = body.get("shared_user_uuid") or self.principal.user_id
        who = _as_hex(str(who)) or str(who)
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        await self.manager.ops.remove_share(self.principal, fid, who)
        self.reply({})


def _invitation_bai(inv: dict) -> dict:
    return {"id": inv["id"], "inviter": inv["inviter"], "invitee": inv["invitee"],
            "perm": inv["permission"], "state": inv["state"], "created_at": inv["created_at"],
            "modified_at": inv["modified_at"], "vfolder_id": dashed(inv["vfolder_id"]),
            "vfolder_name": inv["vfolder_name"]}


class InvitationsHandler(CompatBase):
    """``vfolder invitations``: list (``GET .../list``), ``POST .../accept`` and
    ``DELETE .../delete`` ``{"inv_id"}`` (the invitee declines; the inviter withdraws)."""

    def initialize(self, action: str):
        self.action = action

    async def get(self):
        if self.action != "list":
            raise web.HTTPError(405)
        items = await self.manager.ops.list_invitations(self.principal)
        self.reply({"invitations": [_invitation_bai(i) for i in items]})

    def _inv_id(self) -> str:
        inv_id = self.json_body().get("inv_id")
        if not isinstance(inv_id, str) or not inv_id:
            raise InvalidRequest("inv_id: the invitation's id is required")
        return _as_hex(inv_id) or inv_id

    async def post(self):
        if self.action != "accept":
            raise web.HTTPError(405)
        await self.manager.ops.accept_invitation(self.principal, self._inv_id())
        self.reply({"msg": "accepted"})

    async def delete(self):
        if self.action != "delete":
            raise web.HTTPError(405)
        await self.manager.ops.decline_invitation(self.principal, self._inv_id())
        self.reply({"msg": "rejected"})


class FolderIdHandler(CompatBase):
    """``GET /folders/_/id`` ``{"name"}``: the id of a folder named so (26.09 looks every
    folder up this way before it calls the folder's routes by id)."""

    async def get(self):
        body = self.json_body()
        name = body.get("name") or self.get_query_argument("name", None)
        if not isinstance(name, str) or not name:
            raise InvalidRequest("name: the folder's name is required")
        fid = await self.manager.ops.resolve_folder(self.principal, name)
        self.reply({"id": str(uuid.UUID(fid))})


class FolderCloneHandler(CompatBase):
    """``vfolder clone NAME TARGET_NAME TARGET_HOST``: ``POST /folders/{ref}/clone
    {"target_name", "target_host", "usage_mode", "permission"}``. Done when answered (a
    snapshot on btrfs, a copy on vfs), so the answer carries no ``bgtask_id`` and the
    client reports completion at once."""

    async def post(self, ref):
        body = self.json_body()
        name = body.get("target_name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("target_name: the new folder's name is required")
        clone = {"name": name}
        if body.get("target_host"):
            clone["host"] = body["target_host"]
        if body.get("usage_mode") and body["usage_mode"] != "general":
            clone["usage_mode"] = body["usage_mode"]
        if body.get("permission") not in (None, "", "rw"):
            clone["permission"] = body["permission"]
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        out = await vfolders.clone(self.manager, self.principal, fid, clone)
        self.reply(await self.manager.ops.folder_rest(self.principal, out["id"]), 201)


class FolderHostsHandler(CompatBase):
    async def get(self):
        view = await vfolders.hosts(self.manager, self.principal)
        self.reply({"default": view["default"], "allowed": view["allowed"]})


class FolderHandler(CompatBase):
    async def get(self, ref):
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        self.reply(await self.manager.ops.folder_rest(self.principal, fid))

    async def delete(self, ref):
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        await vfolders.delete(self.manager, self.principal, fid)
        self.set_status(204)
        self.finish()


class FolderFilesHandler(CompatBase):
    async def get(self, ref):
        body = self.json_body()
        path = self.get_query_argument("path", None) or body.get("path") or ""
        path = vfolders.check_path("" if path in (".", "/") else str(path))
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "list")
        listing = await vffiles.list_files(self.manager, where, path)
        files = []
        for item in listing["items"]:
            mode = {"dir": "drwxr-xr-x", "file": "-rw-r--r--", "symlink": "lrwxrwxrwx"}.get(
                item["type"], "?---------")
            mtime = item.get("mtime")
            if isinstance(mtime, str):
                try:
                    mtime = dt.datetime.fromisoformat(mtime).timestamp()
                except ValueError:
                    mtime = 0
            files.append({"filename": item["name"], "size": item.get("size") or 0,
                          "mtime": mtime or 0, "mode": mode, "type": item["type"]})
        # 23.09 parses "files" as a JSON string; 26.09 reads "items" (ISO "modified").
        items = [{"name": f["filename"], "size": f["size"], "mode": f["mode"], "type": f["type"],
                  "modified": dt.datetime.fromtimestamp(f["mtime"], dt.UTC).isoformat()}
                 for f in files]
        self.reply({"files": json.dumps(files), "items": items, "folder_path": path})


class FolderMkdirHandler(CompatBase):
    async def post(self, ref):
        body = self.json_body()
        paths = body.get("path")
        paths = paths if isinstance(paths, list) else [paths]
        if len(paths) > MAX_PATHS:
            raise InvalidRequest(f"path: at most {MAX_PATHS} directories at a time")
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "write")
        for raw in paths:
            path = vfolders.check_path(raw, allow_root=False)
            try:
                await vffiles.mkdir(self.manager, where, path, parents=bool(body.get("parents")))
            except Conflict:
                if not body.get("exist_ok"):
                    raise
        # {success, failed}: what 26.09 prints (23.09 ignores it).
        self.reply({"results": {"success": [{"item": p, "msg": None} for p in paths],
                                "failed": []}}, 201)


class FolderDeleteFilesHandler(CompatBase):
    async def delete(self, ref):
        body = self.json_body()
        files = body.get("files")
        if not isinstance(files, list) or not files:
            raise InvalidRequest("files: a list of paths is required")
        if len(files) > MAX_PATHS:
            raise InvalidRequest(f"files: at most {MAX_PATHS} paths at a time")
        paths = [vfolders.check_path(str(f), allow_root=False) for f in files]
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "delete")
        for path in paths:
            await vffiles.delete_files(self.manager, where, path, bool(body.get("recursive")))
        self.reply({})


def _transfer_base(handler: CompatBase, host: str) -> tuple[str, str]:
    """(URL prefix of the storage proxy's /upload and /download for ``host``, volume).

    The in-hub proxy is served under the hub's API prefix (``.../storage``, the URL
    the request came to); a ``backendai-storage-proxy`` daemon at the ``client_url``
    of its ``c.BackendAIManager.storage_proxies`` entry (its ``client_port``)."""
    manager = handler.manager
    client, volume = manager.storage.resolve(host)
    proxy = host.split(":", 1)[0]
    if isinstance(client, InProcessStorageClient):
        path = handler.request.path
        prefix = path[: path.rindex("/folders/")]
        return f"{handler.request.protocol}://{handler.request.host}{prefix}/storage", volume
    conf = getattr(manager, "storage_proxies", {}).get(proxy) or {}
    url = conf.get("client_url")
    if not url:
        raise NotSupported(
            f"storage proxy {proxy!r} has no client_url in c.BackendAIManager.storage_proxies, "
            "so clients cannot reach it for direct transfers")
    return url.rstrip("/"), volume


def _tokens(handler) -> transfer.TransferTokens:
    return transfer.TransferTokens.instance(config=handler.settings.get("config"))


class FolderRequestUploadHandler(CompatBase):
    """A token and URL for one tus upload straight to the folder's storage proxy."""

    async def post(self, ref):
        body = self.json_body()
        path = vfolders.check_path(str(body.get("path") or ""), allow_root=False)
        size = body.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidRequest("size: the file's size in bytes (an integer >= 0) is required")
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "upload")
        base, volume = _transfer_base(self, where["host"])
        storage = self.manager.storage
        limit = where.get("quota_bytes") or None
        await storage.set_quota_scope(where["host"], where["quota_scope_id"], limit)
        if limit is not None:
            used = (await storage.scope_usage(where["host"], where["quota_scope_id"]))["used_bytes"]
            if used + size > limit:
                raise StorageQuotaExceeded(
                    f"vfolder {where['name']!r}: its quota scope is limited to {limit} bytes "
                    f"and {used} are used; {path!r} needs {size}")
        await vffiles.check_folder_room(self.manager, where, path, size)
        if size == 0:  # tus clients send no PATCH for an empty file
            async def nothing():
                return
                yield b""

            await vffiles.upload(self.manager, where, path, nothing())
        token = _tokens(self).sign(
            transfer.upload_claims(volume, where["quota_scope_id"], where["id"], path, size,
                                   self.principal.user_id))
        self.reply({"token": token, "url": base + "/upload"})


class FolderRequestDownloadHandler(CompatBase):
    async def post(self, ref):
        body = self.json_body()
        path = vfolders.check_path(str(body.get("path") or ""), allow_root=False)
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "download")
        base, volume = _transfer_base(self, where["host"])
        token = _tokens(self).sign(
            transfer.download_claims(volume, where["quota_scope_id"], where["id"], path,
                                     self.principal.user_id))
        self.reply({"token": token, "url": base + "/download"})


async def _local_grants(handler, claims: dict) -> None:
    """The in-hub proxy asks the record itself: does the token's user still have the
    access it was issued for (active, the folder ready and theirs to read or write)?"""
    await _manager_of(handler).ops.transfer_grant(claims["user"], claims.get("folder"),
                                                  claims["op"])


class TransferGrantHandler(transfer.TransferHandler):
    """``POST .../storage/grant?token=``: a storage proxy daemon asks whether the access
    a transfer token (signed by this hub) was issued for still holds: 204, or 403 with
    the reason. The token is the only credential: the answer tells its holder nothing
    they could not learn by using it."""

    def initialize(self):
        super().initialize(volume=None)  # (no volume: it moves no bytes)

    async def post(self):
        try:
            claims = self.tokens.check(self.token(), None)
            if not isinstance(claims.get("user"), str):
                raise Unauthorized("the transfer token names no user; request a new one")
            await _local_grants(self, claims)
        except BackendAIError as e:
            return self.problem(e)
        self.set_status(204)
        self.finish()


def _manager_of(handler):
    from ...manager.core import BackendAIManager

    auth = handler.settings.get("authenticator")
    return getattr(auth, "manager", None) or BackendAIManager.instance(
        config=handler.settings.get("config"))


def _local_volume(handler, name):
    """The in-hub proxy's volume ``name`` (for the transfer routes)."""
    client = _manager_of(handler).storage.clients.get("local")
    if not isinstance(client, InProcessStorageClient):
        raise NotFound("this hub runs no storage proxy of its own")
    return client.volume(name)


class NotSupported(BackendAIError):
    status_code = 501
    title = "Not implemented"
