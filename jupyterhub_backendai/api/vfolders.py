"""The admin API's virtual folders: the storage hosts, folders, their shares, and their
files through the storage proxy (the rules in :mod:`..manager.vfolders`,
:mod:`..manager.vfshares` and :mod:`..manager.vffiles`). Thin handlers, as in
:mod:`.handlers`; the invitations are in :mod:`.vfolder_invitations`."""

from __future__ import annotations

import asyncio
import urllib.parse

from tornado import web

from ..common.errors import BackendAIError
from ..common.types import VFolderOwnership, VFolderStatus
from ..manager import vffiles, vfolders
from . import models, spec
from .base import APIBase
from .spec import Op, Route, route

F_STR, enum = spec.F_STR, spec.enum
PATH_PARAM = {"path": (spec.FILE_PATH, True)}


def _filters(path: str) -> dict:
    """The query filters declared for the list ``GET path`` (:data:`ROUTES`)."""
    return spec.find(ROUTES, "get", path).filters


def _params(method: str, path: str) -> dict:
    """The query parameters declared for ``method path`` (:data:`ROUTES`)."""
    return spec.find(ROUTES, method, path).params


class VFolderHostsHandler(APIBase):
    async def get(self):
        self.query()
        self.reply(await vfolders.hosts(self.manager, self.principal))


class VFoldersHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/vfolders"))
        page = await self.manager.ops.list_folders(self.principal, f, o, n)
        await vfolders.with_usage(self.manager, page["items"])
        self.reply(page)

    async def post(self):
        self.query()
        body = self.body("VFolderCreate")
        self.reply(await vfolders.create(self.manager, self.principal, body), 201)


class VFolderHandler(APIBase):
    async def get(self, fid):
        self.query()
        folder = await self.manager.ops.get_folder(self.principal, fid)
        self.reply((await vfolders.with_usage(self.manager, [folder], walk=True))[0])

    async def patch(self, fid):
        self.query()
        body = self.body("VFolderUpdate")
        if "max_size_bytes" in body:  # on the storage first (vfolders.change_limit)
            await vfolders.change_limit(self.manager, self.principal, fid,
                                        body.pop("max_size_bytes"))
        self.reply(await self.manager.ops.update_folder(self.principal, fid, body))

    async def delete(self, fid):
        self.query()
        await vfolders.delete(self.manager, self.principal, fid)
        self.reply(None, 204)


class VFolderCloneHandler(APIBase):
    async def post(self, fid):
        self.query()
        body = self.body("VFolderClone")
        self.reply(await vfolders.clone(self.manager, self.principal, fid, body), 201)


class VFolderSharesHandler(APIBase):
    async def get(self, fid):
        _, o, n = self.query(_filters("/vfolders/{id}/shares"))
        self.reply(await self.manager.ops.list_shares(self.principal, fid, o, n))

    async def post(self, fid):
        self.query()
        body = self.body("VFolderShareCreate")
        self.reply(await self.manager.ops.add_share(self.principal, fid, body), 201)


class VFolderShareHandler(APIBase):
    async def patch(self, fid, who):
        self.query()
        body = self.body("VFolderShareUpdate")
        # (tornado has already unquoted the path's segments)
        self.reply(await self.manager.ops.update_share(self.principal, fid, who, body))

    async def delete(self, fid, who):
        self.query()
        await self.manager.ops.remove_share(self.principal, fid, who)
        self.reply(None, 204)


class VFolderFilesHandler(APIBase):
    async def get(self, fid):
        q, _, _ = self.query(params=_params("get", "/vfolders/{id}/files"))
        path = vfolders.check_path(q.get("path", ""))
        where = await self.manager.ops.file_access(self.principal, fid, "list")
        self.reply(await vffiles.list_files(self.manager, where, path))

    async def delete(self, fid):
        q, _, _ = self.query(params=_params("delete", "/vfolders/{id}/files"))
        path = vfolders.check_path(q["path"], allow_root=False)
        where = await self.manager.ops.file_access(self.principal, fid, "delete")
        await vffiles.delete_files(self.manager, where, path, q.get("recursive", False))
        self.reply(None, 204)


class VFolderMkdirHandler(APIBase):
    async def post(self, fid):
        self.query()
        body = self.body("VFolderMkdir")
        path = vfolders.check_path(body["path"], allow_root=False)
        where = await self.manager.ops.file_access(self.principal, fid, "write")
        await vffiles.mkdir(self.manager, where, path, parents=body.get("parents", False))
        self.reply({"path": path}, 201)


class VFolderRenameHandler(APIBase):
    async def post(self, fid):
        self.query()
        body = self.body("VFolderRename")
        src = vfolders.check_path(body["path"], allow_root=False)
        dst = vfolders.check_path(body["new_path"], "new_path", allow_root=False)
        where = await self.manager.ops.file_access(self.principal, fid, "write")
        await vffiles.rename(self.manager, where, src, dst)
        self.reply({"path": dst})


# Largest upload accepted in one request; the quota scope's limit applies as well.
MAX_UPLOAD = 64 * 2**30
_END = object()


@web.stream_request_body
class VFolderUploadHandler(APIBase):
    """``PUT`` streams the request body to the storage as it arrives: nothing is
    buffered whole, and a write the storage refuses (quota, permission) leaves no
    file (the storage writes to a temporary name and renames at the end)."""

    _queue: asyncio.Queue | None = None
    _task: asyncio.Task | None = None
    _refused: Exception | None = None

    async def prepare(self):
        # A refusal is answered after the body is read: answering first would make the
        # hub drop the connection, and the proxy in front may already be reusing it.
        if self.request.method != "PUT":
            await super().prepare()
            return
        try:
            await self._start()
        except (BackendAIError, web.HTTPError) as e:
            self._refused = e

    async def _start(self):
        await super().prepare()
        q, _, _ = self.query(params=_params("put", "/vfolders/{id}/upload"))
        self._path = vfolders.check_path(q["path"], allow_root=False)
        where = await self.manager.ops.file_access(self.principal, self.path_args[0], "upload")
        self.request.connection.set_max_body_size(MAX_UPLOAD)
        self._queue = asyncio.Queue(maxsize=8)

        async def chunks():
            while True:
                chunk = await self._queue.get()
                if chunk is _END:
                    return
                yield chunk

        self._task = asyncio.ensure_future(
            vffiles.upload(self.manager, where, self._path, chunks()))

    async def data_received(self, chunk: bytes):
        if self._task is None or self._task.done():
            return  # refused already: the rest of the body is read and dropped
        put = asyncio.ensure_future(self._queue.put(chunk))
        await asyncio.wait([put, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()

    async def put(self, fid):
        if self._refused is not None:
            raise self._refused
        if not self._task.done():
            put = asyncio.ensure_future(self._queue.put(_END))
            await asyncio.wait([put, self._task], return_when=asyncio.FIRST_COMPLETED)
        size = await self._task
        self.reply({"path": self._path, "size": size}, 201)

    def on_connection_close(self):
        # The client went away mid-body: the storage drops what it had started.
        if self._task is not None and not self._task.done():
            self._task.cancel()
        super().on_connection_close()


class VFolderDownloadHandler(APIBase):
    async def get(self, fid):
        q, _, _ = self.query(params=_params("get", "/vfolders/{id}/download"))
        path = vfolders.check_path(q["path"], allow_root=False)
        where = await self.manager.ops.file_access(self.principal, fid, "download")
        size, chunks = await vffiles.download(self.manager, where, path)
        name = path.rsplit("/", 1)[-1]
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Length", str(size))
        self.set_header("Content-Disposition",
                        f"attachment; filename*=UTF-8''{urllib.parse.quote(name)}")
        try:
            async for chunk in chunks:
                self.write(chunk)
                await self.flush()  # raises when the client went away
        finally:
            await chunks.aclose()  # the storage's open file, whatever happened
        self.finish()


# Declared once: the tornado URL list and the OpenAPI document's paths are made from these.
ROUTES: list[Route] = [
    route("/vfolder-hosts", VFolderHostsHandler,
          get=Op("listVFolderHosts", "Storage hosts the caller may use, and for what",
                 response=models.VFolderHosts)),
    route("/vfolders", VFoldersHandler,
          get=Op("listVFolders", "Folders the caller sees: own, shared with them, their "
                 "projects' (admins: the domain's)",
                 filters={"name": F_STR, "host": F_STR, "ownership_type": enum(VFolderOwnership),
                          "project_id": F_STR, "user_id": F_STR, "status": enum(VFolderStatus)},
                 response=models.VFolder),
          post=Op("createVFolder", "Create a user folder, or a project folder (admins)",
                  body=models.VFolderCreate, status=201, response=models.VFolder)),
    route("/vfolders/{id}", VFolderHandler,
          get=Op("getVFolder", "One folder", response=models.VFolder),
          patch=Op("updateVFolder", "Rename a folder or change a project folder's permission",
                   body=models.VFolderUpdate, response=models.VFolder),
          delete=Op("deleteVFolder",
                    "Delete a folder and its files (not while a live session mounts it)",
                    status=204)),
    route("/vfolders/{id}/clone", VFolderCloneHandler,
          post=Op("cloneVFolder", "A new folder with a folder's files (a snapshot on btrfs "
                  "volumes, a copy on vfs; needs download access to the source)",
                  body=models.VFolderClone, status=201, response=models.VFolder)),
    route("/vfolders/{id}/shares", VFolderSharesHandler,
          get=Op("listVFolderShares", "Users a folder is shared with", filters={},
                 response=models.VFolderShare),
          post=Op("shareVFolder", "Share a user folder with a user of its domain (owner)",
                  body=models.VFolderShareCreate, status=201, response=models.VFolderShare)),
    route("/vfolders/{id}/shares/{user}", VFolderShareHandler,
          patch=Op("updateVFolderShare", "Change a share's permission",
                   body=models.VFolderShareUpdate, response=models.VFolderShare),
          delete=Op("unshareVFolder", "Unshare (owner), or leave a folder shared with you",
                    status=204)),
    route("/vfolders/{id}/files", VFolderFilesHandler,
          get=Op("listVFolderFiles", "Entries of a directory in a folder",
                 params={"path": (spec._str(spec.MAX_PATH), False)},
                 response=models.VFolderFiles),
          delete=Op("deleteVFolderFiles", "Delete a file or directory (wd)",
                    params={**PATH_PARAM, "recursive": (spec.BOOL, False)}, status=204)),
    route("/vfolders/{id}/upload", VFolderUploadHandler,
          put=Op("uploadVFolderFile", "Write a file (the request body, streamed; rw or wd)",
                 params=PATH_PARAM, raw_body=True, status=201,
                 response=models.VFolderFileDone)),
    route("/vfolders/{id}/download", VFolderDownloadHandler,
          get=Op("downloadVFolderFile", "Read a file (streamed)", params=PATH_PARAM,
                 raw_response=True)),
    route("/vfolders/{id}/mkdir", VFolderMkdirHandler,
          post=Op("mkdirVFolder", "Make a directory (rw or wd)", body=models.VFolderMkdir,
                  status=201, response=models.VFolderPath)),
    route("/vfolders/{id}/rename", VFolderRenameHandler,
          post=Op("renameVFolderFile", "Move or rename a file or directory (rw or wd)",
                  body=models.VFolderRename, response=models.VFolderPath)),
]
