"""``backendai-storage-proxy``: serves vfolder operations on this node's volumes.

The same operations as the in-hub proxy (:class:`..client.InProcessStorageClient`
over :class:`..volumes.VFSVolume`), over an HTTP API (mutual TLS, ``common/httpbase.py``) for the
manager's :class:`..client.HTTPStorageClient`: JSON bodies, ``application/problem+json``
errors (``status``, ``title``, ``detail`` and ``error``, the error's class name, which
the client turns back into that class), uploads streamed to disk as they arrive and
downloads streamed from disk with flow control. docs/storage.md has the API table.
"""

from __future__ import annotations

import asyncio
import functools

from tornado import web
from traitlets import Bool, Dict, Integer, Unicode, default

from ..common import bodylimit
from ..common.daemon import NodeDaemon
from ..common.errors import BackendAIError, InvalidRequest
from ..common.httpbase import NodeAuth, NodeHandler, NotFoundHandler, listen
from . import transfer
from .backends import make_volumes
from .client import InProcessStorageClient
from .files import CHUNK_SIZE, Upload
from .transfer import TransferTokens

# The most folders one usage request names (the admin API's largest page is 500).
MAX_USAGE_BATCH = 1000


def problems(method):
    """Answer a :class:`BackendAIError` raised by a handler as problem+json."""

    @functools.wraps(method)
    async def wrapper(self, *args, **kw):
        try:
            return await method(self, *args, **kw)
        except BackendAIError as e:
            self.problem(e)

    return wrapper


class _Handler(NodeHandler):
    @property
    def storage(self) -> InProcessStorageClient:
        return self.settings["storage"]

    def query(self, name: str, default: str = "") -> str:
        """A query argument exactly as sent (tornado's ``get_argument`` would strip
        spaces and turn control characters, NUL included, into spaces)."""
        values = self.request.query_arguments.get(name)
        if not values:
            return default
        return values[-1].decode("utf-8", "surrogateescape")

    def flag(self, name: str) -> bool:
        v = self.query(name, "0").lower()
        if v not in ("0", "1", "true", "false"):
            raise InvalidRequest(f"{name} must be 0, 1, true or false, not {v!r}")
        return v in ("1", "true")


class VolumesHandler(_Handler):
    @problems
    async def get(self):
        self.write_json({"volumes": await self.storage.volumes()})


class QuotaScopeHandler(_Handler):
    @problems
    async def get(self, volume, scope):
        self.write_json(await self.storage.quota_scope(volume, scope))

    @problems
    async def put(self, volume, scope):
        body = self.body()
        if "limit_bytes" not in body:
            raise InvalidRequest("the body needs limit_bytes (an integer, or null for no limit)")
        await self.storage.set_quota_scope(volume, scope, body["limit_bytes"])
        self.write_json(await self.storage.quota_scope(volume, scope))


class ScopeUsageHandler(_Handler):
    @problems
    async def get(self, volume, scope):
        self.write_json(await self.storage.scope_usage(volume, scope))


class FolderHandler(_Handler):
    @problems
    async def get(self, volume, scope, folder):
        self.write_json({"path": await self.storage.mount_path(volume, scope, folder)})

    @problems
    async def put(self, volume, scope, folder):
        await self.storage.create_folder(volume, scope, folder)
        self.write_json({"path": await self.storage.mount_path(volume, scope, folder)}, 201)

    @problems
    async def delete(self, volume, scope, folder):
        await self.storage.delete_folder(volume, scope, folder)
        self.set_status(204)
        self.finish()


class FolderUsageHandler(_Handler):
    @problems
    async def get(self, volume, scope, folder):
        self.write_json(await self.storage.folder_usage(volume, scope, folder))


class FoldersUsageHandler(_Handler):
    """``POST /v1/volumes/{vol}/folders-usage``: many folders' usage in one request (a
    listing's); ``{"folders": [{"quota_scope_id", "folder_id"}, ...]}`` (at most
    :data:`MAX_USAGE_BATCH`) -> ``{"items": [usage or null, ...]}`` in the same order."""

    @problems
    async def post(self, volume):
        folders = self.body().get("folders")
        if not isinstance(folders, list) or len(folders) > MAX_USAGE_BATCH or not all(
                isinstance(f, dict) and isinstance(f.get("quota_scope_id"), str)
                and isinstance(f.get("folder_id"), str) for f in folders):
            raise InvalidRequest(
                f"the body needs folders: a list of at most {MAX_USAGE_BATCH} objects with "
                "quota_scope_id and folder_id (strings)")
        pairs = [(f["quota_scope_id"], f["folder_id"]) for f in folders]
        self.write_json({"items": await self.storage.folders_usage(volume, pairs)})


class FolderQuotaHandler(_Handler):
    """A folder's own limit: ``GET``/``PUT .../folders/{scope}/{folder}/quota``."""

    @problems
    async def get(self, volume, scope, folder):
        self.write_json(await self.storage.folder_quota(volume, scope, folder))

    @problems
    async def put(self, volume, scope, folder):
        body = self.body()
        if "limit_bytes" not in body:
            raise InvalidRequest("the body needs limit_bytes (an integer, or null for no limit)")
        await self.storage.set_folder_quota(volume, scope, folder, body["limit_bytes"])
        self.write_json(await self.storage.folder_quota(volume, scope, folder))


class FilesHandler(_Handler):
    @problems
    async def get(self, volume, scope, folder):
        entries = await self.storage.list_files(volume, scope, folder, self.query("path"))
        self.write_json({"entries": entries})

    @problems
    async def delete(self, volume, scope, folder):
        await self.storage.delete(
            volume, scope, folder, self.query("path"), self.flag("recursive")
        )
        self.set_status(204)
        self.finish()


class MkdirHandler(_Handler):
    @problems
    async def post(self, volume, scope, folder):
        body = self.body()
        parents = body.get("parents", False)
        if not isinstance(parents, bool):
            raise InvalidRequest("parents must be true or false")
        await self.storage.mkdir(volume, scope, folder, body.get("path"), parents)
        self.write_json({"path": body["path"]}, 201)


class CloneHandler(_Handler):
    @problems
    async def post(self, volume, scope, folder):
        body = self.body()
        dst_scope, dst_folder = body.get("target_scope"), body.get("target_folder")
        await self.storage.clone_folder(volume, scope, folder, dst_scope, dst_folder)
        self.write_json({"path": await self.storage.mount_path(volume, dst_scope, dst_folder)},
                        201)


class RenameHandler(_Handler):
    @problems
    async def post(self, volume, scope, folder):
        body = self.body()
        await self.storage.rename(volume, scope, folder, body.get("path"), body.get("new_path"))
        self.write_json({"path": body["new_path"]})


@web.stream_request_body
class ContentHandler(_Handler):
    """PUT streams the request body into :class:`Upload`, 1 MiB per write in a
    thread, receiving the next MiB while the previous one is written; GET streams a
    file out, reading the next chunk while the socket takes the previous one."""

    upload: Upload | None = None
    error: BackendAIError | None = None
    _pending: asyncio.Future | None = None

    async def prepare(self):
        if self.request.method != "PUT":
            super().prepare()
            return
        self._buf: list[bytes] = []
        self._buffered = 0
        refused = self.authorized()
        if refused is not None:
            # Like every refusal of an upload, answered once the body has arrived
            # (tornado's default bound, 100 MB, still applies to it): a client still
            # sending would otherwise see a reset instead of the error.
            self.error = refused
            return
        self.request.connection.set_max_body_size(self.settings["max_upload_bytes"])
        volume, scope, folder = self.path_args
        try:
            vol = self.storage.volume(volume)
            self.upload = await asyncio.to_thread(
                vol.begin_upload, scope, folder, self.query("path")
            )
            if self.request.connection.stream.closed():
                self.upload.abort()  # the client left while the file was being opened
        except BackendAIError as e:
            self.error = e

    async def data_received(self, chunk: bytes):
        if self.upload is None or self.error is not None:
            return  # discarded: the request already failed
        self._buf.append(chunk)
        self._buffered += len(chunk)
        if self._buffered >= CHUNK_SIZE:
            await self._write_received()

    async def _write_received(self):
        """Start writing what is buffered once the previous write is done (the
        body keeps arriving meanwhile; at most two MiB are held)."""
        data, self._buf, self._buffered = b"".join(self._buf), [], 0
        await self._settle()
        if self.error is None:
            self._pending = asyncio.ensure_future(asyncio.to_thread(self.upload.write, data))

    async def _settle(self):
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                await pending
            except BackendAIError as e:
                self.error = e

    async def put(self, volume, scope, folder):
        if self.error is None and self._buf:
            await self._write_received()
        await self._settle()
        if self.error is not None:
            self.problem(self.error)
            return
        try:
            result = await asyncio.to_thread(self.upload.commit)
        except BackendAIError as e:
            self.problem(e)
            return
        self.write_json(result, 201)

    def _drop(self):
        if self._pending is not None:  # a write still running fails once aborted; unread
            self._pending.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._pending = None
        if self.upload is not None:
            self.upload.abort()  # no-op after a commit; waits for a write in flight

    def on_finish(self):
        self._drop()

    def on_connection_close(self):
        self._drop()
        super().on_connection_close()  # fails the body future, so the handler ends

    @problems
    async def get(self, volume, scope, folder):
        vol = self.storage.volume(volume)
        size, chunks = await asyncio.to_thread(vol.download, scope, folder, self.query("path"))
        try:
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header("Content-Length", str(size))
            nxt = asyncio.ensure_future(asyncio.to_thread(chunks.read))
            while chunk := await nxt:
                nxt = asyncio.ensure_future(asyncio.to_thread(chunks.read))
                self.write(chunk)
                await self.flush()
        except Exception:
            return  # the client went away (its side sees a short body), or the file failed
        finally:
            chunks.close()
        self.finish()


def make_app(storage: InProcessStorageClient, auth: NodeAuth | str, max_upload_bytes: int = 0) -> web.Application:
    if isinstance(auth, str):
        auth = NodeAuth(token=auth)
    folder = r"/v1/volumes/([^/]+)/folders/([^/]+)/([^/]+)"
    scope = r"/v1/volumes/([^/]+)/quota-scopes/([^/]+)"
    return web.Application(
        [
            (r"/v1/volumes", VolumesHandler),
            (r"/v1/volumes/([^/]+)/folders-usage", FoldersUsageHandler),
            (scope, QuotaScopeHandler),
            (scope + "/usage", ScopeUsageHandler),
            (folder, FolderHandler),
            (folder + "/usage", FolderUsageHandler),
            (folder + "/quota", FolderQuotaHandler),
            (folder + "/files", FilesHandler),
            (folder + "/mkdir", MkdirHandler),
            (folder + "/rename", RenameHandler),
            (folder + "/clone", CloneHandler),
            (folder + "/content", ContentHandler),
        ],
        default_handler_class=NotFoundHandler,
        storage=storage,
        auth=auth,
        max_upload_bytes=max_upload_bytes or 2**62,
    )


class StorageProxyApp(NodeDaemon):
    name = "backendai-storage-proxy"
    token_env = "BACKENDAI_STORAGE_TOKEN"
    description = "Serve vfolders on this node's volumes to jupyterhub-backendai managers."
    listen_host = Unicode("127.0.0.1", help="Address the storage API listens on.").tag(config=True)
    listen_port = Integer(6021, help="Port the storage API listens on.").tag(config=True)
    volumes = Dict(
        help="""Volumes served, by name: {"volume1": {"backend": "vfs", "path":
        "/srv/vfroot/volume1", "folder_uid": 1000, "folder_gid": 1000}}. Only vfs
        exists. Agents bind-mount folders from these paths, so the path must be the
        same on the agents' hosts (this node, or an NFS mount there). folder_uid/gid:
        owner of new folders, directories and files when the proxy runs as root.""",
    ).tag(config=True)
    client_port = Integer(
        0,
        help="""Port of the client-facing transfer API (tus uploads at /upload, downloads
        at /download, authorized by the tokens the manager signs; see
        storageproxy/transfer.py). 0: not served. Set the manager's
        c.BackendAIManager.storage_proxies[<name>]["client_url"] to the URL clients reach
        it at, and the same c.TransferTokens.secret (or BACKENDAI_TRANSFER_SECRET) here
        and on the hub.""",
    ).tag(config=True)
    client_host = Unicode("0.0.0.0", help="Address the transfer API listens on.").tag(config=True)
    grant_url = Unicode(
        "",
        help="""The hub's grant check, ``<hub URL>/hub/api/backendai/storage/grant``: every
        transfer request (at most every 2 s per token) asks there whether the access its
        token was issued for still holds, so that unsharing, deactivation, trashing,
        deletion and a lowered permission end a token within seconds. Empty: tokens are
        checked for their signature and expiry only (warned at start).""",
    ).tag(config=True)
    grant_ca = Unicode(
        "",
        help="CA file that the hub's certificate at grant_url is checked against "
             "(empty: the system's).",
    ).tag(config=True)
    client_tls = Dict(
        help="""HTTPS for the transfer API: {"cert": ..., "key": ...} (a certificate
        clients trust; no client certificates: the token authorizes). Empty: plain
        HTTP (put a TLS-terminating proxy in front).""",
    ).tag(config=True)
    transfer_inline_io = Bool(
        True,
        help="""Serve small transfers (under 256 KiB: open, check, write, rename) on
        the transfer API's event loop itself, faster than a hop to a worker thread on a
        local file system. Set False when the volumes are on a file system whose calls
        can stall (NFS and the like): they then run in worker threads.""",
    ).tag(config=True)
    max_upload_bytes = Integer(
        0,
        help="""Refuse an upload body larger than this (0: no limit besides the
        quota scopes).""",
    ).tag(config=True)

    @default("volumes")
    def _volumes_default(self):
        return {"volume1": {"backend": "vfs", "path": "/var/lib/backendai/vfroot/volume1"}}

    aliases = {
        "config": "StorageProxyApp.config_file",
        "port": "StorageProxyApp.listen_port",
        "host": "StorageProxyApp.listen_host",
    }

    async def run(self):
        try:
            auth = self.node_auth()
            storage = InProcessStorageClient(make_volumes(self.volumes))
            app = make_app(storage, auth, self.max_upload_bytes)
            server = listen(app, self.listen_port, self.listen_host, auth, chunk_size=CHUNK_SIZE)
            client_server = None
            if self.client_port:
                client_server = self._listen_clients(storage)
        except (ValueError, OSError) as e:
            raise SystemExit(f"backendai-storage-proxy: {e}") from None
        self.log.info(
            "storage proxy on %s:%s serving %s", self.listen_host, self.listen_port,
            ", ".join(f"{n} ({c['path']})" for n, c in self.volumes.items()),
        )
        await self.until_stopped()
        server.stop()
        if client_server is not None:
            client_server.stop()
        if getattr(self, "_grants", None) is not None:
            await self._grants.close()

    def _listen_clients(self, storage: InProcessStorageClient):
        import ssl

        TransferTokens.instance(config=self.config)  # the secret is read once, at start
        grants = None
        if self.grant_url:
            grants = self._grants = transfer.HubGrants(self.grant_url, self.grant_ca or None)
        else:
            self.log.warning(
                "StorageProxyApp.grant_url is not set: transfer tokens are checked for "
                "their signature and expiry only, and outlive the access they were issued "
                "for (an unshared folder, a deactivated user) until they expire")
        app = web.Application(
            transfer.routes("", lambda _handler, name: storage.volume(name), grants),
            config=self.config,
            log_function=transfer.log_request,
            transfer_inline_io=self.transfer_inline_io,
        )
        ssl_ctx = None
        if self.client_tls:
            ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_ctx.load_cert_chain(self.client_tls["cert"], self.client_tls["key"])
        self.log.info("transfer API (tus, downloads) on %s:%s", self.client_host, self.client_port)
        # Uploads stream (tus PATCH, authenticated first); nothing else is large.
        return bodylimit.wrap(app.listen(self.client_port, self.client_host,
                                         ssl_options=ssl_ctx, chunk_size=CHUNK_SIZE))


def main(argv=None):
    StorageProxyApp.main(argv)
