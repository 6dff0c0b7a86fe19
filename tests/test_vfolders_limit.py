"""A folder's own size limit (issue 26; Backend.AI's ``max_size``, its CLI's ``vfolder
create -q``) on a real hub's vfs volume: set at creation through the admin API and
Backend.AI's create, never above the quota scope's limit, checked by uploads through the
API and tus, kept by a clone, shown in listings. (On btrfs the kernel enforces it:
tests/test_btrfs.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid

import pytest
import requests

from jupyterhub_backendai.models import VFolder

from .api_world import local_hub, new_user, snapshot, superadmin
from .test_backendai_client import BAI, CLI, CLI26

HOST = "local:volume1"
SCOPE_LIMIT = 1_000_000


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    assert os.access(CLI, os.X_OK) and os.access(CLI26, os.X_OK), (
        "the official clients' venvs are missing: run scripts/install-backendai-clients.sh")
    yield from local_hub(f"sqlite:///{tmp_path_factory.mktemp('limit')}/backendai.sqlite")


@pytest.fixture
def user(hub, tmp_path):
    """A user whose resource policy bounds their quota scope to SCOPE_LIMIT bytes, with
    the official 23.09 CLI signed by their keypair."""
    sa = superadmin(hub)
    pol = sa.ok("POST", "/user-resource-policies",
                json={"name": f"lim-{uuid.uuid4().hex[:8]}", "max_quota_scope_size": SCOPE_LIMIT})
    u = new_user(sa)
    sa.ok("PATCH", f"/users/{u['id']}", json={"resource_policy": pol["name"]})
    u["bai"] = BAI(hub, u, str(tmp_path))
    return u


def folder_dir(hub, f: dict) -> str:
    kind, sid = f["quota_scope_id"].split(":")
    return os.path.join(hub.volume_path, kind, sid, f["id"])


def upload(c, fid, path, data):
    return c("PUT", f"/vfolders/{fid}/upload", params={"path": path}, data=data,
             headers={"Content-Type": "application/octet-stream"})


def test_uploads_stop_at_the_folders_limit_below_its_scopes(hub, user):
    c = user["client"]
    a = c.ok("POST", "/vfolders", json={"name": "small", "max_size_bytes": 300_000})
    assert a["max_size_bytes"] == 300_000
    assert c.ok("GET", f"/vfolders/{a['id']}")["used_bytes"] == 0
    assert upload(c, a["id"], "one", b"1" * 200_000).status_code == 201
    r = upload(c, a["id"], "two", b"2" * 100_001)
    assert r.status_code == 413, r.text
    assert f"folder {a['id']}" in r.json()["detail"] and "300000" in r.json()["detail"]
    assert sorted(os.listdir(folder_dir(hub, a))) == ["one"]  # nothing of it left
    assert upload(c, a["id"], "two", b"2" * 100_000).status_code == 201  # up to the limit
    # a folder's own view shows its limit and usage; the listing its limit (on vfs the
    # usage is a walk of the folder, so a listing does not read it)
    b = c.ok("POST", "/vfolders", json={"name": "big"})
    listed = {f["name"]: f for f in c.ok("GET", "/vfolders")["items"]}
    assert (listed["small"]["max_size_bytes"], listed["small"]["used_bytes"]) == (300_000, None)
    assert (listed["big"]["max_size_bytes"], listed["big"]["used_bytes"]) == (None, None)
    assert c.ok("GET", f"/vfolders/{a['id']}")["used_bytes"] == 300_000
    assert c.ok("GET", f"/vfolders/{b['id']}")["used_bytes"] == 0
    # another folder of the scope has the scope's room, not the small one's
    assert upload(c, b["id"], "x", b"x" * 600_000).status_code == 201
    r = upload(c, b["id"], "y", b"y" * 100_001)
    assert r.status_code == 413 and "quota scope" in r.json()["detail"], r.text
    # a clone keeps its source's limit, in the record and on the volume
    c.ok("DELETE", f"/vfolders/{b['id']}")
    c.ok("DELETE", f"/vfolders/{a['id']}/files", params={"path": "two"})
    clone = c.ok("POST", f"/vfolders/{a['id']}/clone", json={"name": "small2"})
    assert clone["max_size_bytes"] == 300_000
    assert upload(c, clone["id"], "more", b"m" * 100_001).status_code == 413
    assert upload(c, clone["id"], "more", b"m" * 100_000).status_code == 201


@pytest.mark.parametrize("bad, words", [
    (-1, "less than the minimum of 1"), (0, "less than the minimum of 1"),
    ("100", "whole number"), (True, "whole number"), (1.5, "whole number"),
    (SCOPE_LIMIT + 1, "more than the folder's quota scope may hold"),
])
def test_bad_limits_are_400_and_make_nothing(hub, user, bad, words):
    c = user["client"]
    before = snapshot(hub)
    folders = sorted(os.listdir(hub.volume_path))
    r = c("POST", "/vfolders", json={"name": "nope", "max_size_bytes": bad})
    assert r.status_code == 400 and words in r.json()["detail"], r.text
    assert snapshot(hub) == before
    assert sorted(os.listdir(hub.volume_path)) == folders
    assert c.ok("GET", "/vfolders", params={"name": "nope"})["items"] == []


def test_a_limit_changes_and_goes_on_the_storage_at_once(hub, user):
    """PATCH max_size_bytes: lowered, the next upload past it is 413; removed (null),
    only the scope's limit applies; above the scope's, or on another user's folder,
    refused with nothing changed (record and storage)."""
    c = user["client"]
    f = c.ok("POST", "/vfolders", json={"name": f"ch-{uuid.uuid4().hex[:6]}"})
    assert upload(c, f["id"], "a", b"a" * 200_000).status_code == 201
    assert c.ok("PATCH", f"/vfolders/{f['id']}", json={"max_size_bytes": 250_000})[
        "max_size_bytes"] == 250_000
    r = upload(c, f["id"], "b", b"b" * 50_001)
    assert r.status_code == 413 and "250000" in r.json()["detail"], r.text
    # above the scope's limit: 400, the old limit still holds on the storage
    r = c("PATCH", f"/vfolders/{f['id']}", json={"max_size_bytes": SCOPE_LIMIT + 1})
    assert r.status_code == 400 and "quota scope" in r.json()["detail"], r.text
    assert c.ok("GET", f"/vfolders/{f['id']}")["max_size_bytes"] == 250_000
    assert upload(c, f["id"], "b", b"b" * 50_001).status_code == 413
    # another user may not change it
    other = new_user(superadmin(hub))
    r = other["client"]("PATCH", f"/vfolders/{f['id']}", json={"max_size_bytes": 900_000})
    assert r.status_code in (403, 404), r.text
    assert c.ok("GET", f"/vfolders/{f['id']}")["max_size_bytes"] == 250_000
    # null removes it: the scope's limit is what is left
    assert c.ok("PATCH", f"/vfolders/{f['id']}", json={"max_size_bytes": None})[
        "max_size_bytes"] is None
    assert upload(c, f["id"], "b", b"b" * 300_000).status_code == 201


def sdk(user: dict, cli: str, call: str, rc: int = 0) -> str:
    """``call`` on a session of an official client's SDK (the one beside ``cli``), as
    its CLI makes them; its output as JSON, or with rc=1 the error it raised."""
    py = os.path.join(os.path.dirname(cli), "python")
    code = ("import json, sys; from ai.backend.client.session import Session\n"
            "with Session() as s:\n"
            "    try:\n"
            f"        print(json.dumps(s.{call}))\n"
            "    except Exception as e:\n"
            "        print(repr(e)); sys.exit(1)")
    p = subprocess.run([py, "-c", code], env=user["bai"].env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == rc, p.stdout + p.stderr
    return p.stdout.strip().splitlines()[-1]


def bai26_info(user: dict, name: str) -> dict:
    """``VFolder(name).info()`` of the 26.09 client."""
    return json.loads(sdk(user, CLI26, f"VFolder({name!r}).info()"))


def test_backendai_create_with_a_quota_and_a_tus_upload_past_it(hub, user, tmp_path):
    bai, c = user["bai"], user["client"]
    out = bai("vfolder", "create", "q1", HOST, "-q", "300k")
    assert 'Virtual folder "q1" is created' in out
    f = c.ok("GET", "/vfolders", params={"name": "q1"})["items"][0]
    assert f["max_size_bytes"] == 300 * 1024
    # Backend.AI's max_size is in MiB: both clients read it
    assert bai26_info(user, "q1")["max_size"] == 1
    # a tus grant for more than the folder's limit is refused at once (the CLI says so)
    big, fits = tmp_path / "big.bin", tmp_path / "fits.bin"
    big.write_bytes(os.urandom(300 * 1024 + 1))
    fits.write_bytes(os.urandom(200 * 1024))
    out = bai("vfolder", "upload", "q1", str(big), rc=1, cwd=str(tmp_path))
    assert re.search(r"\b413\b", out) or "quota" in out.lower(), out
    assert [e["name"] for e in c.ok("GET", f"/vfolders/{f['id']}/files")["items"]] == []
    bai("vfolder", "upload", "q1", str(fits), cwd=str(tmp_path))
    assert [e["name"] for e in c.ok("GET", f"/vfolders/{f['id']}/files")["items"]] == [
        "fits.bin"]
    # without -q: no limit of its own
    bai("vfolder", "create", "q0", HOST)
    assert c.ok("GET", "/vfolders", params={"name": "q0"})["items"][0]["max_size_bytes"] is None
    assert bai26_info(user, "q0")["max_size"] == 0


@pytest.mark.parametrize("quota, words", [
    ("2m", "more than the folder's quota scope may hold"),  # above the scope's 1,000,000
    ("-1m", "quota: invalid size"),
    ("ten", "quota: invalid size"),
    (-5, "positive number of bytes"),
])
def test_backendai_create_with_a_bad_quota_says_why_and_makes_nothing(hub, user, quota, words):
    """The CLI checks the form of -q itself; its SDK (which the CLI calls) sends any."""
    before = snapshot(hub)
    if quota == "2m":
        out = user["bai"]("vfolder", "create", "bad", HOST, "-q", quota, rc=1)
    else:
        out = sdk(user, CLI, f"VFolder.create('bad', {HOST!r}, quota={quota!r})", rc=1)
    assert words in out and re.search(r"\b400\b", out), out
    assert snapshot(hub) == before
    with hub.sm() as s:
        assert s.query(VFolder).filter_by(name="bad").count() == 0


def test_a_tus_upload_granted_while_it_fitted_stops_at_the_folders_limit(hub, user):
    """The storage's own check: the grant came before the folder filled up, so the
    PATCH past the folder's limit is what refuses (413), leaving nothing."""
    c = user["client"]
    f = c.ok("POST", "/vfolders", json={"name": "tus1", "max_size_bytes": 500_000})
    r = c("POST", "/folders/tus1/request-upload", json={"path": "late.bin", "size": 400_000})
    assert r.status_code == 200, r.text
    url = f"{r.json()['url']}?token={r.json()['token']}"
    assert upload(c, f["id"], "fill", b"f" * 200_000).status_code == 201
    r = requests.patch(url, data=os.urandom(400_000), timeout=30, headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": "0",
        "Content-Type": "application/offset+octet-stream"})
    assert r.status_code == 413 and f"folder {f['id']}" in r.json()["detail"], r.text
    assert sorted(os.listdir(folder_dir(hub, f))) == ["fill"]
    staging = os.path.join(os.path.dirname(folder_dir(hub, f)), ".tus")
    assert [n for n in os.listdir(staging) if not n.endswith(".done")] == []
    # what fits still goes through
    r = c("POST", "/folders/tus1/request-upload", json={"path": "ok.bin", "size": 300_000})
    url = f"{r.json()['url']}?token={r.json()['token']}"
    r = requests.patch(url, data=os.urandom(300_000), timeout=30, headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": "0",
        "Content-Type": "application/offset+octet-stream"})
    assert r.status_code == 204 and r.headers["Upload-Offset"] == "300000", r.text
