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
Other files of a running session are not downloaded through the API here (a folder
mounted in it: ``vfolder download``).
"""

from __future__ import annotations

import io
import secrets
import tarfile
import time

from ...common.errors import InvalidRequest, NotFound
from .base import CompatBase

KEY_FILE = "id_container"


def _tar(name: str, data: bytes, mode: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class SessionDownloadHandler(CompatBase):
    """``GET /session/{id}/download`` (see the module's doc). It hands out a shell's key:
    a JupyterHub token needs the write scope, though it is a GET."""

    grants_shell = True

    async def get(self, ref):
        # 23.09: GET with {"files": [...]} as its body; 26.09: POST, ?files=...&files=...
        files = self.json_body().get("files") or self.get_query_arguments("files")
        if not isinstance(files, list) or not files or not all(
                isinstance(f, str) for f in files):
            raise InvalidRequest("files: a list of paths is required")
        if files != [KEY_FILE]:
            from .handlers import REFUSALS

            raise InvalidRequest(REFUSALS["session-files"])
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
        boundary = secrets.token_hex(16)
        part = _tar(KEY_FILE, key["private_key"].encode(), 0o600)
        self.set_header("Content-Type", f"multipart/mixed; boundary={boundary}")
        self.finish(b"".join([
            f"--{boundary}\r\nContent-Type: application/x-tar\r\n"
            f'Content-Disposition: attachment; filename="{KEY_FILE}"\r\n\r\n'.encode(),
            part, f"\r\n--{boundary}--\r\n".encode()]))

    post = get


__all__ = ["SessionDownloadHandler"]
