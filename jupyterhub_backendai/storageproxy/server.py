"""``backendai-storage-proxy``: serves vfolder operations on local volumes.

This first version manages folders on one vfs volume (create, list, delete) over
a token-authenticated JSON API; quotas, uploads and downloads come with the
vfolder work.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import re
import shutil
import signal

from tornado import web
from traitlets import Integer, Unicode
from traitlets.config import Application

NAME_RE = re.compile(r"^[a-f0-9]{32}$")


class _Base(web.RequestHandler):
    def prepare(self):
        token = self.settings["token"]
        got = self.request.headers.get("Authorization", "")
        if not token or not hmac.compare_digest(got, f"Bearer {token}"):
            raise web.HTTPError(401)

    def path_for(self, folder_id: str) -> str:
        if not NAME_RE.match(folder_id):
            raise web.HTTPError(400, "folder id must be 32 hex characters")
        return os.path.join(self.settings["root"], folder_id[:2], folder_id[2:4], folder_id)


class FoldersHandler(_Base):
    def get(self):
        root = self.settings["root"]
        out = []
        for a in sorted(os.listdir(root)):
            for b in sorted(os.listdir(os.path.join(root, a))):
                out.extend(sorted(os.listdir(os.path.join(root, a, b))))
        self.finish(json.dumps({"folders": out}))


class FolderHandler(_Base):
    def put(self, folder_id):
        path = self.path_for(folder_id)
        os.makedirs(path, exist_ok=True)
        self.set_status(201)
        self.finish(json.dumps({"id": folder_id, "path": path}))

    def delete(self, folder_id):
        shutil.rmtree(self.path_for(folder_id), ignore_errors=True)
        self.set_status(204)
        self.finish()


class StorageProxyApp(Application):
    name = "backendai-storage-proxy"
    root = Unicode("/var/lib/backendai/vfroot/local", help="Volume root directory.").tag(config=True)
    listen_host = Unicode("127.0.0.1").tag(config=True)
    listen_port = Integer(6021).tag(config=True)
    token = Unicode(os.environ.get("BACKENDAI_STORAGE_TOKEN", "")).tag(config=True)
    aliases = {
        "root": "StorageProxyApp.root",
        "port": "StorageProxyApp.listen_port",
        "host": "StorageProxyApp.listen_host",
    }

    async def run(self):
        if not self.token:
            raise SystemExit("backendai-storage-proxy: set BACKENDAI_STORAGE_TOKEN")
        os.makedirs(self.root, exist_ok=True)
        app = web.Application(
            [(r"/folders", FoldersHandler), (r"/folders/([^/]+)", FolderHandler)],
            root=self.root,
            token=self.token,
        )
        server = app.listen(self.listen_port, self.listen_host)
        self.log.info("storage proxy on %s:%s serving %s", self.listen_host, self.listen_port, self.root)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.stop()


def main(argv=None):
    logging.basicConfig(level=logging.INFO)
    app = StorageProxyApp()
    app.initialize(argv)
    asyncio.run(app.run())
