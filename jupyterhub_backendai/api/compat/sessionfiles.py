"""``session download SESSION id_container``: the SSH key ``backend.ai ssh`` / ``scp``
fetch first (issue 27).

Backend.AI keeps a session's SSH private key in its container as
``/home/work/id_container``; ``ssh SESSION`` downloads it (``GET /session/{id}/download``
with ``{"files": ["id_container"]}``, answered as ``multipart`` with one tar per file),
(26.09: ``POST`` with ``?files=id_container``), then forwards a local port to the session's ``sshd`` (``app SESSION sshd``, the app proxy)
and runs ``ssh -i KEY work@localhost -p PORT``. Here a session's sshd is published in
resource groups that offer SSH (issue 12), and its key is derived from the session's
keypair (:mod:`...manager.sshkeys`, the same key ``GET /sessions/{id}/ssh-key`` gives
its owner): that key is the ``id_container`` answered, to the session's owner only.

**Other files** (``session download SESSION FILE...``, ``session ls SESSION [PATH]``) of
the caller's own running interactive session are read through its Jupyter server's
contents API (as ``run`` uploads them, :mod:`.execute`): paths relative to ``/home/work``
(``/home/work/...`` is taken as such), no hidden ones (the server does not serve them),
files only for a download (each as a tar of the file under its own name, at most
:data:`MAX_DOWNLOAD_BYTES` in all), a directory for ``ls``. ``ls``'s ``mode`` is the
server's kind of entry (``file``, ``directory``, ``notebook``) followed by ``rw`` or
``r-`` for what the server may do with it: the contents API says no more (no Unix mode).
A batch session has no Jupyter server: a folder mounted in it (``vfolder download``).
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import posixpath
import secrets
import tarfile
import time
import urllib.parse

import aiohttp

from ...common.errors import InvalidRequest, NotFound
from .base import CompatBase
from .execute import ServerUnavailable, _fetch, _JupyterServer, _ServerError

KEY_FILE = "id_container"
#: The most one download request carries (larger data: a folder, ``vfolder download``).
MAX_DOWNLOAD_BYTES = 64 * 2**20
MAX_FILES = 100
HOME = "/home/work"


def _tar(name: str, data: bytes, mode: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _relative(path, *, allow_root: bool) -> str:
    """``path`` relative to the home folder, checked; "" for the home folder itself."""
    if not isinstance(path, str) or "\0" in path or len(path) > 1024:
        raise InvalidRequest("path: a path of at most 1024 characters is required")
    if path == HOME or path.startswith(HOME + "/"):
        path = path[len(HOME):].lstrip("/")
    if path.startswith("/"):
        raise InvalidRequest(f"{path!r}: only paths under {HOME}")
    rel = posixpath.normpath(path) if path else "."
    if rel == ".." or rel.startswith("../"):
        raise InvalidRequest(f"{path!r}: only paths under {HOME}")
    rel = "" if rel == "." else rel
    if any(part.startswith(".") for part in rel.split("/") if part):
        raise InvalidRequest(f"{path!r}: hidden files and directories are not served by the "
                             "session's Jupyter server")
    if not rel and not allow_root:
        raise InvalidRequest(f"name a file under {HOME}")
    return rel


class _SessionFiles(_JupyterServer):
    _needs = ("files are read", "its Jupyter server serves them; a batch session's files: a "
              "folder mounted in it, `vfolder download`")

    async def _contents(self, path: str, **query) -> dict:
        url = f"{self._base}api/contents/{urllib.parse.quote(path)}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        try:
            return json.loads(await _fetch(url, headers=self._auth(), timeout=120))
        except _ServerError as e:
            if e.code == 404:
                raise NotFound(f"no file or directory {path or '.'!r} in the session's "
                               f"{HOME}") from None
            if e.code in (400, 403):
                raise InvalidRequest(f"{path!r}: the session's Jupyter server refused it "
                                     f"({e.code})") from None
            raise ServerUnavailable(f"the session's Jupyter server answered {e.code}") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise ServerUnavailable(f"the session's Jupyter server did not answer: {e}") \
                from None


class SessionFilesHandler(CompatBase, _SessionFiles):
    """``GET /session/{id}/files`` (``session ls SESSION [PATH]``): ``{"files": JSON text
    of [{filename, size, mtime, mode}], "errors": ""}``, as the clients read it."""

    async def get(self, ref):
        path = _relative(self.json_body().get("path", self.get_query_argument("path", ".")),
                         allow_root=True)
        await self._open_server(ref)
        try:
            model = await self._contents(path, content="1")
        finally:
            self._drop_token()
        if model.get("type") != "directory":
            model = {"content": [model]}
        out = []
        for entry in model.get("content") or []:
            mtime = dt.datetime.fromisoformat(entry["last_modified"].replace("Z", "+00:00"))
            out.append({"filename": entry["name"], "size": entry.get("size") or 0,
                        "mtime": mtime.timestamp(),
                        "mode": f"{entry['type']} {'rw' if entry.get('writable') else 'r-'}"})
        self.reply({"files": json.dumps(out), "errors": "", "abspath": f"{HOME}/{path}"})


class SessionDownloadHandler(CompatBase, _SessionFiles):
    """``GET /session/{id}/download`` (see the module's doc). It may hand out a shell's
    key: a JupyterHub token needs the write scope, though it is a GET."""

    grants_shell = True

    async def get(self, ref):
        # 23.09: GET with {"files": [...]} as its body; 26.09: POST, ?files=...&files=...
        files = self.json_body().get("files") or self.get_query_arguments("files")
        if not isinstance(files, list) or not files or not all(
                isinstance(f, str) for f in files):
            raise InvalidRequest("files: a list of paths is required")
        if files != [KEY_FILE]:
            await self._download(ref, files)
            return
        ops = self.manager.ops
        sid = await ops.resolve_session(self.principal, ref)
        sess = await ops.get_session(self.principal, sid)
        if sess["user_id"] != self.principal.user_id:
            raise NotFound(f"no session {ref!r} of yours (its SSH key is its owner's)")
        try:
            key = await ops.session_ssh_key(self.principal, sid)
        except NotFound as e:  # (the session is the caller's: it has no sshd)
            raise InvalidRequest(f"{e.detail}: `ssh`/`scp` need a session in a resource "
                                 "group that offers SSH (docs/service-ports.md)") from None
        self._send_tars([(KEY_FILE, _tar(KEY_FILE, key["private_key"].encode(), 0o600))])

    post = get

    async def _download(self, ref: str, files: list[str]) -> None:
        if len(files) > MAX_FILES:
            raise InvalidRequest(f"files: at most {MAX_FILES} at a time")
        paths = [_relative(f, allow_root=False) for f in files]
        await self._open_server(ref)
        parts, total = [], 0
        try:
            for path in paths:
                model = await self._contents(path, content="1", format="base64", type="file")
                data = base64.b64decode(model.get("content") or "")
                total += len(data)
                if total > MAX_DOWNLOAD_BYTES:
                    raise InvalidRequest(
                        f"at most {MAX_DOWNLOAD_BYTES >> 20} MiB per download (larger data: "
                        "a folder mounted in the session, `vfolder download`)")
                name = posixpath.basename(path)
                parts.append((name, _tar(name, data, 0o644)))
        finally:
            self._drop_token()
        self._send_tars(parts)

    def _send_tars(self, parts: list[tuple[str, bytes]]) -> None:
        """Backend.AI's answer: multipart, one tar per file."""
        boundary = secrets.token_hex(16)
        self.set_header("Content-Type", f"multipart/mixed; boundary={boundary}")
        body = []
        for name, tar in parts:
            body += [f"--{boundary}\r\nContent-Type: application/x-tar\r\n"
                     f'Content-Disposition: attachment; filename="{name}"\r\n\r\n'.encode(),
                     tar, b"\r\n"]
        body.append(f"--{boundary}--\r\n".encode())
        self.finish(b"".join(body))


__all__ = ["SessionDownloadHandler", "SessionFilesHandler"]
