"""Direct transfers to the storage proxy (tus 1.0.0 uploads, Range downloads) with
signed tokens, against a real hub (the in-hub proxy), with ``tuspy`` as the client
where a client is needed and raw HTTP where the test must misbehave.

``POST /folders/<ref>/request-upload`` / ``request-download`` (Backend.AI's client
API, :mod:`jupyterhub_backendai.api.compat`) answer ``{url, token}``; the proxy
checks only the token (storageproxy/transfer.py).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import socket
import time
import uuid
from urllib.parse import urlsplit

import pytest
import requests
from tusclient import client as tus_client

from .api_world import PASSWORD, Client, new_user, superadmin
from .hub import Hub

SECRET = "test-transfer-secret-" + uuid.uuid4().hex
MiB = 2**20


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('tus')}/backendai.sqlite"
    hub = Hub(db_url=url, backend="local",
              extra_env={"BACKENDAI_TRANSFER_SECRET": SECRET}).start()
    yield hub
    hub.close()
    shutil.rmtree(hub.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def sa(hub):
    return superadmin(hub)


def _folder(user: dict, name: str | None = None) -> dict:
    return user["client"].ok("POST", "/vfolders", json={"name": name or f"f-{uuid.uuid4().hex[:6]}"})


def _dir(hub, f: dict) -> str:
    kind, sid = f["quota_scope_id"].split(":")
    return os.path.join(hub.volume_path, kind, sid, f["id"])


def _staging(hub, f: dict) -> list[str]:
    kind, sid = f["quota_scope_id"].split(":")
    d = os.path.join(hub.volume_path, kind, sid, ".tus")
    return sorted(n for n in os.listdir(d) if not n.endswith(".done")) if os.path.isdir(d) else []


def _request(user: dict, f: dict, op: str, **body) -> requests.Response:
    return user["client"]("POST", f"/folders/{f['name']}/request-{op}", json=body)


def _grant(user, f, op, **body) -> str:
    r = _request(user, f, op, **body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"url", "token"}
    return f"{out['url']}?token={out['token']}"


def _forge(claims: dict) -> str:
    raw = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    mac = hmac.new(SECRET.encode(), raw, hashlib.sha256).digest()

    def b64(b):
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    return f"{b64(raw)}.{b64(mac)}"


def _claims(token: str) -> dict:
    raw = token.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))


def _patch_cut(url: str, offset: int, data: bytes, declared: int) -> None:
    """A PATCH that announces ``declared`` bytes, sends ``data`` and drops the connection."""
    u = urlsplit(url)
    s = socket.create_connection((u.hostname, u.port))
    head = (f"PATCH {u.path}?{u.query} HTTP/1.1\r\nHost: {u.netloc}\r\n"
            f"Tus-Resumable: 1.0.0\r\nUpload-Offset: {offset}\r\n"
            f"Content-Type: application/offset+octet-stream\r\nContent-Length: {declared}\r\n\r\n")
    s.sendall(head.encode() + data)
    s.close()


def _wait_offset(url: str, at_least: int) -> int:
    """HEAD until the cut PATCH has reached the proxy. HEAD waits for a PATCH under way
    to end, so once it answers past the old offset the value no longer moves."""
    deadline = time.monotonic() + 30
    while True:
        r = requests.head(url, headers={"Tus-Resumable": "1.0.0"}, timeout=30)
        assert r.status_code == 200, r.status_code
        off = int(r.headers["Upload-Offset"])
        if off >= at_least or time.monotonic() > deadline:
            return off
        time.sleep(0.1)


def test_tus_upload_interrupted_and_resumed_is_byte_identical(hub, sa):
    u = new_user(sa)
    f = _folder(u)
    data = os.urandom(50 * MiB + 4321)
    url = _grant(u, f, "upload", path="big.bin", size=len(data))
    # Discovery and creation (tuspy POSTs to the URL; Location is where it PATCHes).
    r = requests.options(url, timeout=30)
    assert (r.status_code, r.headers["Tus-Version"], r.headers["Tus-Extension"]) == (
        204, "1.0.0", "creation")
    client = tus_client.TusClient(url)
    up = client.uploader(file_stream=open_bytes(data), chunk_size=16 * MiB)
    up.upload(stop_at=16 * MiB)
    assert up.url == url  # Location: the same URL
    assert up.offset == 16 * MiB
    # Not visible before the last byte.
    assert os.listdir(_dir(hub, f)) == []
    assert len(_staging(hub, f)) == 1
    # The connection dies in the middle of the next PATCH: 9 MiB of 16 arrived.
    _patch_cut(url, 16 * MiB, data[16 * MiB: 25 * MiB], 16 * MiB)
    off = _wait_offset(url, 24 * MiB)
    assert 16 * MiB < off <= 25 * MiB
    assert os.listdir(_dir(hub, f)) == []
    # A new client resumes from the server's offset (HEAD), in 16 MiB chunks.
    up2 = tus_client.TusClient(url).uploader(file_stream=open_bytes(data), url=url,
                                             chunk_size=16 * MiB)
    assert up2.offset == off  # the offset stood still: HEAD waited for the cut PATCH
    up2.upload()
    with open(os.path.join(_dir(hub, f), "big.bin"), "rb") as fh:
        assert hashlib.sha256(fh.read()).digest() == hashlib.sha256(data).digest()
    assert _staging(hub, f) == []
    # The finished upload answers its full length; another PATCH is refused.
    r = requests.head(url, headers={"Tus-Resumable": "1.0.0"}, timeout=30)
    assert int(r.headers["Upload-Offset"]) == len(data)
    r = requests.patch(url, data=b"x", timeout=30, headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": str(len(data)),
        "Content-Type": "application/offset+octet-stream"})
    assert r.status_code == 409 and "already complete" in r.json()["title"]

    # Downloads: whole, a range, a suffix, If-Range with a stale date, a bad range.
    durl = _grant(u, f, "download", path="big.bin")
    r = requests.get(durl, timeout=60)
    assert r.status_code == 200 and r.content == data
    assert r.headers["Accept-Ranges"] == "bytes" and int(r.headers["Content-Length"]) == len(data)
    r = requests.get(durl, headers={"Range": "bytes=1000-1999"}, timeout=30)
    assert (r.status_code, r.content) == (206, data[1000:2000])
    assert r.headers["Content-Range"] == f"bytes 1000-1999/{len(data)}"
    r = requests.get(durl, headers={"Range": "bytes=-10"}, timeout=30)
    assert (r.status_code, r.content) == (206, data[-10:])
    r = requests.get(durl, headers={"Range": f"bytes={len(data) - 5}-",
                                    "If-Range": r.headers["Last-Modified"]}, timeout=30)
    assert (r.status_code, r.content) == (206, data[-5:])
    r = requests.get(durl, headers={"Range": "bytes=0-9",
                                    "If-Range": "Mon, 01 Jan 2001 00:00:00 GMT"}, timeout=60)
    assert r.status_code == 200 and len(r.content) == len(data)
    r = requests.get(durl, headers={"Range": f"bytes={len(data)}-"}, timeout=30)
    assert r.status_code == 416 and r.headers["Content-Range"] == f"bytes */{len(data)}"


def open_bytes(data: bytes):
    import io

    return io.BytesIO(data)


def test_upload_past_the_quota_is_refused_and_leaves_nothing(hub, sa):
    pol = sa.ok("POST", "/user-resource-policies",
                json={"name": f"tus-{uuid.uuid4().hex[:6]}", "max_quota_scope_size": 1_000_000})
    u = new_user(sa)
    sa.ok("PATCH", f"/users/{u['id']}", json={"resource_policy": pol["name"]})
    f = _folder(u)
    # Asked for more than the scope's limit: refused at once.
    r = _request(u, f, "upload", path="huge.bin", size=2_000_000)
    assert r.status_code == 413 and "1000000" in r.json()["title"], r.text
    # Granted while it fitted, then the scope filled up: the PATCH past it fails,
    # the partial upload is removed, the folder shows nothing.
    url = _grant(u, f, "upload", path="late.bin", size=900_000)
    other = _folder(u)
    r = u["client"]("PUT", f"/vfolders/{other['id']}/upload", params={"path": "fill"},
                    data=b"f" * 600_000, headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    r = requests.patch(url, data=os.urandom(900_000), timeout=30, headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": "0",
        "Content-Type": "application/offset+octet-stream"})
    assert r.status_code == 413 and "late.bin" in r.json()["title"], r.text
    assert os.listdir(_dir(hub, f)) == [] and _staging(hub, f) == []
    assert u["client"].ok("GET", f"/vfolders/{f['id']}/files")["items"] == []
    # What fits still goes through.
    url = _grant(u, f, "upload", path="small.bin", size=300_000)
    body = os.urandom(300_000)
    r = requests.patch(url, data=body, timeout=30, headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": "0",
        "Content-Type": "application/offset+octet-stream"})
    assert r.status_code == 204 and r.headers["Upload-Offset"] == "300000"
    with open(os.path.join(_dir(hub, f), "small.bin"), "rb") as fh:
        assert fh.read() == body


def test_expired_tampered_and_misused_tokens_are_refused(hub, sa):
    u = new_user(sa)
    f = _folder(u)
    victim_user = new_user(sa)
    victim = _folder(victim_user)
    url = _grant(u, f, "upload", path="a.bin", size=10)
    base, token = url.split("?token=")
    claims = _claims(token)
    hdr = {"Tus-Resumable": "1.0.0", "Upload-Offset": "0",
           "Content-Type": "application/offset+octet-stream"}

    def patch(tok):
        return requests.patch(f"{base}?token={tok}", data=b"0123456789", headers=hdr, timeout=30)

    # Expired (signed with the right secret, exp in the past).
    r = patch(_forge(dict(claims, exp=int(time.time()) - 1)))
    assert r.status_code == 401 and "expired" in r.json()["title"]
    # Tampered: pointed at another user's folder without re-signing.
    raw = json.dumps(dict(claims, scope=victim["quota_scope_id"], folder=victim["id"]),
                     separators=(",", ":"), sort_keys=True).encode()
    r = patch(base64.urlsafe_b64encode(raw).rstrip(b"=").decode() + "." + token.split(".")[1])
    assert r.status_code == 401 and "signature" in r.json()["title"]
    # A flipped byte of the signature; garbage; none.
    sig = token.split(".")[1]
    r = patch(token.split(".")[0] + "." + ("A" if sig[0] != "A" else "B") + sig[1:])
    assert r.status_code == 401 and "signature" in r.json()["title"]
    assert patch("not-a-token").status_code == 401
    r = requests.patch(base, data=b"0123456789", headers=hdr, timeout=30)
    assert r.status_code == 401 and "token is required" in r.json()["title"]
    # A download token is not an upload token (and the other way round).
    durl = _grant(u, f, "download", path="a.bin")
    r = patch(durl.split("?token=")[1])
    assert r.status_code == 403
    r = requests.get(url, timeout=30)
    assert r.status_code in (403, 405)
    assert os.listdir(_dir(hub, f)) == [] and os.listdir(_dir(hub, victim)) == []
    assert _staging(hub, f) == [] and _staging(hub, victim) == []
    # The manager checks access before it signs: no token for another's folder.
    r = u["client"]("POST", f"/folders/{victim['id']}/request-upload",
                    json={"path": "x", "size": 1})
    assert r.status_code in (403, 404), r.text
    # Bad requests get plain words: offset mismatch, wrong content type, bad size.
    r = requests.patch(url, data=b"01234", headers=dict(hdr, **{"Upload-Offset": "3"}), timeout=30)
    assert r.status_code == 409 and "Upload-Offset is 3" in r.json()["title"]
    r = requests.patch(url, data=b"01234", headers=dict(hdr, **{"Content-Type": "text/plain"}),
                       timeout=30)
    assert r.status_code == 415
    r = _request(u, f, "upload", path="b", size=-1)
    assert r.status_code == 400 and "size" in r.json()["title"]
    r = _request(u, f, "upload", path="../x", size=1)
    assert r.status_code == 400
    # The genuine token still works.
    r = patch(token)
    assert r.status_code == 204
    with open(os.path.join(_dir(hub, f), "a.bin"), "rb") as fh:
        assert fh.read() == b"0123456789"


def test_cluster_mode_transfers_go_to_the_daemon_not_the_hub(tmp_path):
    """A folder on a ``backendai-storage-proxy`` daemon: request-upload answers the
    daemon's client_url, the CLI-style tus upload and the download go there (the hub
    serves none of the bytes), signed with the secret both share; the daemon asks the hub
    whether each token's grant still holds."""
    from jupyterhub_backendai.common.types import HOST_PERMISSIONS

    from .services import StorageDaemon, free_port

    cport = free_port()
    hub = Hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="local",
              extra_env={"BACKENDAI_TRANSFER_SECRET": SECRET})
    d = StorageDaemon(tmp_path / "storage", extra_config=(
        f"c.StorageProxyApp.client_port = {cport}\n"
        "c.StorageProxyApp.client_host = '127.0.0.1'\n"
        # every transfer asks the hub whether its token's grant still holds (row 4)
        f"c.StorageProxyApp.grant_url = '{hub.base}/hub/api/backendai/storage/grant'\n"))
    os.makedirs(d.root, exist_ok=True)
    client_url = f"http://127.0.0.1:{cport}"
    proxies = {"remote": {"url": d.url, "token": d.token, "client_url": client_url}}
    old = os.environ.get("BACKENDAI_TRANSFER_SECRET")
    os.environ["BACKENDAI_TRANSFER_SECRET"] = SECRET  # the daemon inherits it
    try:
        d.start()
    finally:
        if old is None:
            os.environ.pop("BACKENDAI_TRANSFER_SECRET")
        else:
            os.environ["BACKENDAI_TRANSFER_SECRET"] = old
    try:
        hub.extra_args += [f"--BackendAIManager.storage_proxies={json.dumps(proxies)}"]
        try:
            hub.start()
        except Exception as e:
            raise AssertionError(hub.log()[-3000:]) from e
        sa = superadmin(hub)
        dom = f"d-{uuid.uuid4().hex[:6]}"
        sa.ok("POST", "/domains", json={"name": dom, "allowed_vfolder_hosts": {
            "remote:volume1": list(HOST_PERMISSIONS)}})
        u = new_user(sa, domain=dom)
        f = u["client"].ok("POST", "/vfolders", json={"name": "far", "host": "remote:volume1"})
        data = os.urandom(5 * MiB + 3)
        url = _grant(u, f, "upload", path="far.bin", size=len(data))
        assert url.startswith(client_url + "/upload?token=")
        up = tus_client.TusClient(url).uploader(file_stream=open_bytes(data), url=url,
                                                chunk_size=2 * MiB)
        up.upload()
        kind, sid = f["quota_scope_id"].split(":")
        where = os.path.join(d.volumes["volume1"]["path"], kind, sid, f["id"], "far.bin")
        with open(where, "rb") as fh:
            assert fh.read() == data
        durl = _grant(u, f, "download", path="far.bin")
        assert durl.startswith(client_url + "/download?token=")
        assert requests.get(durl, timeout=60).content == data
        assert "far.bin" in [i["name"] for i in
                             u["client"].ok("GET", f"/vfolders/{f['id']}/files")["items"]]
        # Past its TTL a token goes on with the upload it began (the daemon asks the hub
        # about the grant with the claims signed afresh: the hub refuses expired
        # tokens), but starts none.
        url = _grant(u, f, "upload", path="late.bin", size=len(data))
        base, token = url.split("?token=")
        exp = int(time.time()) + 2
        short = f"{base}?token={_forge(dict(_claims(token), exp=exp))}"
        hdr = {"Tus-Resumable": "1.0.0", "Content-Type": "application/offset+octet-stream"}
        r = requests.patch(short, data=data[:MiB], headers=dict(hdr, **{"Upload-Offset": "0"}),
                           timeout=30)
        assert r.status_code == 204, r.text
        _until_past(exp)
        r = requests.patch(short, data=data[MiB:], timeout=30,
                           headers=dict(hdr, **{"Upload-Offset": str(MiB)}))
        assert r.status_code == 204, r.text
        with open(os.path.join(os.path.dirname(where), "late.bin"), "rb") as fh:
            assert fh.read() == data
        stale = _forge(dict(_claims(durl.split("?token=")[1]), exp=int(time.time()) - 1))
        r = requests.get(f"{client_url}/download?token={stale}", timeout=60)
        assert r.status_code == 401 and "expired" in r.json()["title"], r.text
        # The daemon asks the hub about every token: deactivated, the user's download
        # token is refused there within seconds (GRANT_FRESH), with the hub's reason.
        sa.ok("PATCH", f"/users/{u['id']}", json={"status": "inactive"})
        deadline = time.monotonic() + 15
        while (r := requests.get(durl, timeout=60)).status_code != 403:
            assert r.status_code == 200 and time.monotonic() < deadline, r.status_code
            time.sleep(0.1)
        assert "this transfer token's access has ended" in r.json()["title"], r.text
        assert "not active" in r.json()["title"], r.text
    finally:
        hub.close()
        shutil.rmtree(hub.dir, ignore_errors=True)
        d.stop()


def test_directory_removed_before_the_last_byte_leaves_nothing(hub, sa):
    u = new_user(sa)
    f = _folder(u)
    u["client"].ok("POST", f"/vfolders/{f['id']}/mkdir", json={"path": "sub"})
    url = _grant(u, f, "upload", path="sub/x.bin", size=8)
    hdr = {"Tus-Resumable": "1.0.0", "Content-Type": "application/offset+octet-stream"}
    r = requests.patch(url, data=b"0123", headers=dict(hdr, **{"Upload-Offset": "0"}), timeout=30)
    assert r.status_code == 204 and r.headers["Upload-Offset"] == "4"
    assert len(_staging(hub, f)) == 1
    u["client"].ok("DELETE", f"/vfolders/{f['id']}/files", params={"path": "sub"})
    r = requests.patch(url, data=b"4567", headers=dict(hdr, **{"Upload-Offset": "4"}), timeout=30)
    assert r.status_code == 404 and "sub" in r.json()["title"], r.text
    assert os.listdir(_dir(hub, f)) == [] and _staging(hub, f) == []
    # A grant for a directory that is not there fails at the first contact.
    url = _grant(u, f, "upload", path="nowhere/y.bin", size=1)
    r = requests.patch(url, data=b"y", headers=dict(hdr, **{"Upload-Offset": "0"}), timeout=30)
    assert r.status_code == 404 and _staging(hub, f) == []


# -- issue 22, row 4: a token dies with the access it was issued for ---------------------


@pytest.fixture(scope="module")
def pg_hub(tmp_path_factory, postgres):
    """The same hub on PostgreSQL: the grant is read from the record on each database."""
    url = postgres.new_database("tus_" + uuid.uuid4().hex[:10])
    hub = Hub(db_url=url, backend="local",
              extra_env={"BACKENDAI_TRANSFER_SECRET": SECRET}).start()
    yield hub
    hub.close()
    shutil.rmtree(hub.dir, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def grant_world(request):
    """(hub, superadmin client) on SQLite, then on PostgreSQL."""
    hub = request.getfixturevalue("hub" if request.param == "sqlite" else "pg_hub")
    return hub, (request.getfixturevalue("sa") if request.param == "sqlite"
                 else superadmin(hub))


def test_a_transfer_token_dies_with_its_grant(grant_world):
    """dave (read-write share of alice's folder) takes upload and download tokens; each
    way his access ends (unshared, read-only now, deactivated, the folder in the trash)
    ends his tokens within seconds: the proxy asks the record again (at most every 2 s
    per token), and nothing of his lands in her folder. On both databases."""
    hub, sa = grant_world
    alice, dave = new_user(sa), new_user(sa)
    f = _folder(alice)
    with open(os.path.join(_dir(hub, f), "secret.txt"), "wb") as fh:
        fh.write(b"alice's secret")
    hdr = {"Tus-Resumable": "1.0.0", "Content-Type": "application/offset+octet-stream"}

    def share(permission: str) -> None:
        alice["client"].ok("POST", f"/vfolders/{f['id']}/shares",
                           json={"email": dave["email"], "permission": permission})

    def tokens() -> tuple[str, str]:
        r = dave["client"]("POST", f"/folders/{f['id']}/request-upload",
                           json={"path": "secret.txt", "size": 4})
        assert r.status_code == 200, r.text
        up = f"{r.json()['url']}?token={r.json()['token']}"
        r = dave["client"]("POST", f"/folders/{f['id']}/request-download",
                           json={"path": "secret.txt"})
        assert r.status_code == 200, r.text
        return up, f"{r.json()['url']}?token={r.json()['token']}"

    def works(up: str, down: str) -> None:
        assert requests.get(down, timeout=30).content == b"alice's secret"
        r = requests.post(up, headers={"Tus-Resumable": "1.0.0", "Upload-Length": "4"},
                          timeout=30)
        assert r.status_code == 201, r.text

    def refused(url: str, method: str = "GET", **kw) -> str:
        r = requests.request(method, url, timeout=30, **kw)
        assert r.status_code == 403, (method, r.status_code, r.text[:300])
        assert "this transfer token's access has ended" in r.json()["title"], r.text
        return r.json()["title"]

    def settled(url: str) -> None:
        """Until the proxy has heard the end of the grant: it keeps a "still granted"
        answer for GRANT_FRESH (2) seconds per token (HEAD: changes nothing)."""
        deadline = time.monotonic() + 15
        while requests.head(url, headers={"Tus-Resumable": "1.0.0"},
                            timeout=30).status_code != 403:
            assert time.monotonic() < deadline, url
            time.sleep(0.1)

    def ended(up: str, down: str, why: str) -> None:
        settled(up)
        settled(down)
        assert why in refused(down)
        refused(up, "POST", headers={"Tus-Resumable": "1.0.0", "Upload-Length": "4"})
        refused(up, "PATCH", data=b"mine", headers=dict(hdr, **{"Upload-Offset": "0"}))

    # Unshared.
    share("rw")
    up, down = tokens()
    works(up, down)
    alice["client"].ok("DELETE", f"/vfolders/{f['id']}/shares/{dave['email']}", status=204)
    ended(up, down, "no vfolder")
    # Read-only now: the download token lives on, the upload token does not.
    share("rw")
    up, down = tokens()
    alice["client"].ok("PATCH", f"/vfolders/{f['id']}/shares/{dave['email']}",
                       json={"permission": "ro"})
    settled(up)
    assert requests.get(down, timeout=30).content == b"alice's secret"
    assert "your permission on vfolder" in refused(
        up, "PATCH", data=b"mine", headers=dict(hdr, **{"Upload-Offset": "0"}))
    # Deactivated.
    alice["client"].ok("PATCH", f"/vfolders/{f['id']}/shares/{dave['email']}",
                       json={"permission": "rw"})
    up, down = tokens()
    sa.ok("PATCH", f"/users/{dave['id']}", json={"status": "inactive"})
    ended(up, down, "not active")
    sa.ok("PATCH", f"/users/{dave['id']}", json={"status": "active"})
    # (deactivating him ended his JupyterHub tokens too: he logs in again)
    dave["client"] = Client(hub, hub.token_for(hub.login(dave["email"], PASSWORD),
                                               dave["username"]), dave["username"])
    # Nothing of his landed in her file meanwhile.
    with open(os.path.join(_dir(hub, f), "secret.txt"), "rb") as fh:
        assert fh.read() == b"alice's secret"
    # The folder in the trash.
    up, down = tokens()
    alice["client"].ok("DELETE", f"/vfolders/{f['id']}", status=204)
    ended(up, down, "vfolder")


# -- issue 22, "credentials bound to current access": short-lived tokens --------------


def _until_past(exp: int) -> None:
    while time.time() <= exp + 0.05:
        time.sleep(0.05)


def test_a_token_past_its_ttl_starts_nothing_but_finishes_what_it_began(hub, sa):
    """Tokens are valid minutes (ttl 300 s), not half an hour. A token past its TTL
    cannot start a transfer (a new upload, a new download), but an upload it created in
    time keeps taking PATCHes and a download it began runs to its end and resumes; and
    past the TTL the grant still governs: unshared, the running upload stops."""
    alice, dave = new_user(sa), new_user(sa)
    f = _folder(alice)
    alice["client"].ok("POST", f"/vfolders/{f['id']}/shares",
                       json={"email": dave["email"], "permission": "rw"})
    data = os.urandom(3 * MiB + 17)
    with open(os.path.join(_dir(hub, f), "src.bin"), "wb") as fh:
        fh.write(data)
    hdr = {"Tus-Resumable": "1.0.0", "Content-Type": "application/offset+octet-stream"}
    # The default TTL: minutes.
    url = _grant(dave, f, "upload", path="up.bin", size=len(data))
    base, token = url.split("?token=")
    assert 290 <= _claims(token)["exp"] - time.time() <= 301
    # An upload created with a token that then passes its TTL goes on (raw and small
    # PATCHes, HEAD), to the last byte.
    exp = int(time.time()) + 2
    short = f"{base}?token={_forge(dict(_claims(token), exp=exp))}"
    r = requests.patch(short, data=data[:MiB], headers=dict(hdr, **{"Upload-Offset": "0"}),
                       timeout=30)
    assert r.status_code == 204, r.text
    _until_past(exp)
    r = requests.head(short, headers={"Tus-Resumable": "1.0.0"}, timeout=30)
    assert (r.status_code, r.headers.get("Upload-Offset")) == (200, str(MiB))
    r = requests.patch(short, data=data[MiB:-100], headers=dict(hdr, **{"Upload-Offset": str(MiB)}),
                       timeout=30)
    assert r.status_code == 204, r.text
    r = requests.patch(short, data=data[-100:],
                       headers=dict(hdr, **{"Upload-Offset": str(len(data) - 100)}), timeout=30)
    assert r.status_code == 204, r.text
    with open(os.path.join(_dir(hub, f), "up.bin"), "rb") as fh:
        assert fh.read() == data
    # Finished: the expired token is of no more use (nothing under way).
    r = requests.head(short, headers={"Tus-Resumable": "1.0.0"}, timeout=30)
    assert r.status_code == 401
    # A token past its TTL starts no upload: neither tus creation nor a first PATCH.
    url = _grant(dave, f, "upload", path="late.bin", size=4)
    base, token = url.split("?token=")
    stale = f"{base}?token={_forge(dict(_claims(token), exp=int(time.time()) - 1))}"
    r = requests.post(stale, headers={"Tus-Resumable": "1.0.0", "Upload-Length": "4"},
                      timeout=30)
    assert r.status_code == 401 and "expired" in r.json()["title"], r.text
    r = requests.patch(stale, data=b"late", headers=dict(hdr, **{"Upload-Offset": "0"}),
                       timeout=30)
    assert r.status_code == 401 and "expired" in r.json()["title"], r.text
    assert "late.bin" not in os.listdir(_dir(hub, f)) and _staging(hub, f) == []
    # ... and the client that still holds access simply asks again.
    r = requests.patch(url, data=b"late", headers=dict(hdr, **{"Upload-Offset": "0"}),
                       timeout=30)
    assert r.status_code == 204, r.text

    # Downloads: one that began in time runs to its end past the TTL, and resumes
    # (Range) with the same token; a new one with an expired token does not start.
    durl = _grant(dave, f, "download", path="src.bin")
    dbase, dtoken = durl.split("?token=")
    exp = int(time.time()) + 2
    dshort = f"{dbase}?token={_forge(dict(_claims(dtoken), exp=exp))}"
    with requests.get(dshort, stream=True, timeout=60) as r:
        assert r.status_code == 200
        it = r.iter_content(64 << 10)
        got = next(it)
        _until_past(exp)
        got += b"".join(it)
    assert got == data
    r = requests.get(dshort, headers={"Range": f"bytes={MiB}-"}, timeout=60)
    assert (r.status_code, r.content) == (206, data[MiB:])
    r = requests.get(dshort, timeout=60)  # not a resume: a new download
    assert r.status_code == 401 and "expired" in r.json()["title"]
    unused = f"{dbase}?token={_forge(dict(_claims(dtoken), exp=int(time.time()) - 1))}"
    for headers in ({}, {"Range": "bytes=0-"}):
        r = requests.get(unused, headers=headers, timeout=60)
        assert r.status_code == 401 and "expired" in r.json()["title"], headers
    assert requests.get(durl, timeout=60).content == data  # a fresh token: fine

    # Past its TTL the grant still governs an upload under way: unshared, it stops.
    url = _grant(dave, f, "upload", path="cut.bin", size=2 * MiB)
    base, token = url.split("?token=")
    exp = int(time.time()) + 2
    short = f"{base}?token={_forge(dict(_claims(token), exp=exp))}"
    r = requests.patch(short, data=data[:MiB], headers=dict(hdr, **{"Upload-Offset": "0"}),
                       timeout=30)
    assert r.status_code == 204, r.text
    _until_past(exp)
    alice["client"].ok("DELETE", f"/vfolders/{f['id']}/shares/{dave['email']}", status=204)
    deadline = time.monotonic() + 15
    while (r := requests.head(short, headers={"Tus-Resumable": "1.0.0"}, timeout=30)
           ).status_code != 403:
        assert r.status_code == 200 and time.monotonic() < deadline, r.status_code
        time.sleep(0.1)
    r = requests.patch(short, data=data[MiB:2 * MiB],
                       headers=dict(hdr, **{"Upload-Offset": str(MiB)}), timeout=30)
    assert r.status_code == 403 and "access has ended" in r.json()["title"], r.text
    assert "cut.bin" not in os.listdir(_dir(hub, f))
