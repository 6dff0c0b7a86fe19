"""Large tus PATCH bodies on a real ``backendai-storage-proxy`` daemon's transfer port
(storageproxy/transfer.py): a body of RAW_MIN or more is moved by a thread of its own
on the taken-over connection, which also ends the upload (commit or discard) and
answers. The quota is checked per piece (a PATCH past it is refused and leaves
nothing), a cut connection keeps what arrived for a resume, and the finished file is
the bytes sent. Tokens are signed with the secret the daemon was given (the
manager's part)."""

from __future__ import annotations

import os
import shutil
import socket
import time
import uuid

import pytest
import requests

from jupyterhub_backendai.storageproxy.client import HTTPStorageClient
from jupyterhub_backendai.storageproxy.transfer import (
    RAW_BUF,
    RAW_MIN,
    TransferTokens,
    upload_claims,
)

from .services import StorageDaemon, free_port

MiB = 1 << 20
TUS = {"Tus-Resumable": "1.0.0", "Content-Type": "application/offset+octet-stream"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("transfer-large"))
    secret, cport = uuid.uuid4().hex, free_port()
    d = StorageDaemon(root, extra_config=(
        f"c.StorageProxyApp.client_port = {cport}\n"
        "c.StorageProxyApp.client_host = '127.0.0.1'\n"
        f"c.TransferTokens.secret = {secret!r}\n"))
    d.start()
    d.base = f"http://127.0.0.1:{cport}"
    d.tokens = TransferTokens(secret=secret)
    yield d
    d.stop()
    shutil.rmtree(root, ignore_errors=True)


async def _scope(proxy, limit: int | None = None) -> tuple[str, str]:
    scope, folder = f"user:{uuid.uuid4().hex}", uuid.uuid4().hex
    client = HTTPStorageClient(proxy.url, proxy.token)
    try:
        await client.create_folder("volume1", scope, folder)
        if limit is not None:
            await client.set_quota_scope("volume1", scope, limit)
    finally:
        await client.close()
    return scope, folder


def _files(proxy, scope: str) -> list[str]:
    """Every file under the scope's directory (folders and staging), but its quota file."""
    kind, sid = scope.split(":")
    top = os.path.join(proxy.volumes["volume1"]["path"], kind, sid)
    return sorted(os.path.relpath(os.path.join(d, n), top)
                  for d, _, names in os.walk(top) for n in names if n != ".quota.json")


def _url(proxy, scope, folder, path, size) -> str:
    return f"{proxy.base}/upload?token=" + proxy.tokens.sign(
        upload_claims("volume1", scope, folder, path, size))


async def test_large_patch_past_the_quota_is_refused_and_leaves_nothing(proxy):
    assert 12 * MiB > 6 * MiB > RAW_MIN and 6 * MiB > RAW_BUF  # refused a piece later
    scope, folder = await _scope(proxy, limit=6 * MiB)
    url = _url(proxy, scope, folder, "big.bin", 12 * MiB)
    r = requests.patch(url, data=os.urandom(12 * MiB), headers={**TUS, "Upload-Offset": "0"},
                       timeout=60)
    assert r.status_code == 413 and "big.bin" in r.json()["title"], r.text
    assert _files(proxy, scope) == []
    # What fits goes through the same path, byte for byte.
    body = os.urandom(5 * MiB + 7)
    url = _url(proxy, scope, folder, "fits.bin", len(body))
    r = requests.patch(url, data=body, headers={**TUS, "Upload-Offset": "0"}, timeout=60)
    assert r.status_code == 204 and r.headers["Upload-Offset"] == str(len(body)), r.text
    # (a finished upload leaves its done marker in the staging directory)
    assert [f for f in _files(proxy, scope) if not f.endswith(".done")] == [f"{folder}/fits.bin"]
    kind, sid = scope.split(":")
    with open(os.path.join(proxy.volumes["volume1"]["path"], kind, sid, folder, "fits.bin"),
              "rb") as f:
        assert f.read() == body


async def test_large_patch_cut_midway_keeps_what_arrived_and_resumes(proxy):
    scope, folder = await _scope(proxy)
    data = os.urandom(24 * MiB + 5)
    url = _url(proxy, scope, folder, "cut.bin", len(data))
    u = requests.utils.urlparse(url)
    s = socket.create_connection((u.hostname, u.port))
    s.sendall((f"PATCH {u.path}?{u.query} HTTP/1.1\r\nHost: {u.netloc}\r\n"
               "Tus-Resumable: 1.0.0\r\nUpload-Offset: 0\r\n"
               "Content-Type: application/offset+octet-stream\r\n"
               f"Content-Length: {len(data)}\r\n\r\n").encode() + data[:10 * MiB])
    s.close()
    deadline = time.monotonic() + 30
    while True:  # HEAD waits for the cut PATCH to end; then the offset stays
        r = requests.head(url, headers={"Tus-Resumable": "1.0.0"}, timeout=30)
        assert r.status_code == 200, r.status_code
        off = int(r.headers["Upload-Offset"])
        if off >= 8 * MiB or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert 0 < off <= 10 * MiB
    r = requests.patch(url, data=data[off:], headers={**TUS, "Upload-Offset": str(off)},
                       timeout=60)
    assert r.status_code == 204 and r.headers["Upload-Offset"] == str(len(data)), r.text
    assert [f for f in _files(proxy, scope) if not f.endswith(".done")] == [f"{folder}/cut.bin"]
    kind, sid = scope.split(":")
    with open(os.path.join(proxy.volumes["volume1"]["path"], kind, sid, folder, "cut.bin"),
              "rb") as f:
        assert f.read() == data
