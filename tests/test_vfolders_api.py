"""Virtual folders through the admin API of a real hub (in-hub storage volume), on SQLite
and PostgreSQL: the record and the volume's directory tree move together, refusals say
why and leave both as they were."""

from __future__ import annotations

import os
import uuid

import pytest

from jupyterhub_backendai.common.types import HOST_PERMISSIONS
from jupyterhub_backendai.models import Session, VFolder

from . import api_world
from .api_world import new_user, park_session, snapshot, superadmin

api_hub = api_world.api_hub  # the module's hub fixture

HOST = "local:volume1"
ALL = list(HOST_PERMISSIONS)


def uid() -> str:
    return uuid.uuid4().hex[:8]


def volume_root(hub) -> str:
    return hub.volume_path


def folder_dir(hub, f: dict) -> str:
    kind, sid = f["quota_scope_id"].split(":")
    return os.path.join(volume_root(hub), kind, sid, f["id"])


def tree(hub) -> list[str]:
    """Every folder directory on the volume (what deletes must leave nothing of)."""
    root = volume_root(hub)
    out = []
    for kind in ("user", "project"):
        for sid in sorted(os.listdir(os.path.join(root, kind))) if os.path.isdir(
                os.path.join(root, kind)) else []:
            for fid in sorted(os.listdir(os.path.join(root, kind, sid))):
                if not fid.startswith("."):
                    out.append(f"{kind}/{sid}/{fid}")
    return out


class Lab:
    """A fresh domain with vfolder host permissions, a project and users of each role."""

    def __init__(self, hub, perms=ALL):
        self.hub = hub
        self.sa = superadmin(hub)
        self.domain = f"d-{uid()}"
        self.sa.ok("POST", "/domains", json={"name": self.domain,
                                              "allowed_vfolder_hosts": {HOST: perms}})
        self.project = self.sa.ok("POST", "/projects", json={"name": "p", "domain_name": self.domain})
        self.other_project = self.sa.ok("POST", "/projects", json={"name": "q",
                                                                   "domain_name": self.domain})

    def user(self, role="user", projects=None):
        return new_user(self.sa, role=role, domain=self.domain,
                        projects=[self.project["id"]] if projects is None else projects)


@pytest.fixture
def lab(api_hub):
    return Lab(api_hub)


def test_create_list_get_rename_delete(lab, api_hub):
    u = lab.user()
    c = u["client"]
    f = c.ok("POST", "/vfolders", json={"name": "data"})
    assert (f["name"], f["host"], f["ownership_type"], f["user_id"], f["status"],
            f["permission"], f["my_permission"], f["domain_name"]) == (
        "data", HOST, "user", u["id"], "ready", "rw", "rw", lab.domain)
    assert f["quota_scope_id"] == f"user:{u['id']}"
    assert os.path.isdir(folder_dir(api_hub, f))
    listed = c.ok("GET", "/vfolders")
    assert [x["id"] for x in listed["items"]] == [f["id"]] and listed["total"] == 1
    # a folder's own view adds the storage's usage (empty: 0 bytes); a listing on vfs
    # does not read it (a walk of every folder listed)
    assert f["used_bytes"] is None and f["max_size_bytes"] is None
    assert c.ok("GET", f"/vfolders/{f['id']}") == {**f, "used_bytes": 0}
    assert listed["items"][0]["used_bytes"] is None
    assert c.ok("GET", "/vfolders", params={"name": "nope"})["items"] == []
    renamed = c.ok("PATCH", f"/vfolders/{f['id']}", json={"name": "data2"})
    assert renamed["name"] == "data2" and renamed["id"] == f["id"]
    assert os.path.isdir(folder_dir(api_hub, f))  # the directory is named by id: unchanged
    c.ok("DELETE", f"/vfolders/{f['id']}")
    assert not os.path.exists(folder_dir(api_hub, f))
    assert c("GET", f"/vfolders/{f['id']}").status_code == 404
    with api_hub.sm() as s:
        assert s.get(VFolder, f["id"]) is None


def test_bad_names_hosts_and_duplicates(lab, api_hub):
    c = lab.user()["client"]
    before = snapshot(api_hub), tree(api_hub)
    for body, status, word in [
        ({"name": "..hidden"}, 400, "name"),
        ({"name": ".-x"}, 400, "name"),
        ({"name": "a/b"}, 400, "name"),
        ({"name": "x", "host": "nowhere:volume1"}, 400, "unknown vfolder host"),
        ({"name": "x", "host": "local:nope"}, 400, "unknown vfolder host"),
        ({"name": "x", "permission": "all"}, 400, "permission"),  # (a user folder takes one)
        ({"name": "x", "extra": 1}, 400, "extra"),
    ]:
        r = c("POST", "/vfolders", json=body)
        assert r.status_code == status and word in r.json()["detail"], (body, r.text)
    assert (snapshot(api_hub), tree(api_hub)) == before
    c.ok("POST", "/vfolders", json={"name": "dup"})
    before = snapshot(api_hub), tree(api_hub)
    r = c("POST", "/vfolders", json={"name": "dup"})
    assert r.status_code == 409 and "dup" in r.json()["detail"]
    assert (snapshot(api_hub), tree(api_hub)) == before


def test_host_not_allowed_is_refused_with_the_reason(api_hub):
    lab = Lab(api_hub, perms=["mount-in-session"])
    c = lab.user()["client"]
    before = snapshot(api_hub), tree(api_hub)
    r = c("POST", "/vfolders", json={"name": "x"})
    assert r.status_code == 403 and "create-vfolder" in r.json()["detail"], r.text
    assert (snapshot(api_hub), tree(api_hub)) == before
    hosts = c.ok("GET", "/vfolder-hosts")
    assert hosts["hosts"][HOST]["permissions"] == ["mount-in-session"]
    assert "path" not in hosts["hosts"][HOST]["volume"]
    # The project grants it: the union decides.
    lab.sa.ok("PATCH", f"/projects/{lab.project['id']}",
              json={"allowed_vfolder_hosts": {HOST: ["create-vfolder"]}})
    c.ok("POST", "/vfolders", json={"name": "x"})
    assert "create-vfolder" in c.ok("GET", "/vfolder-hosts")["hosts"][HOST]["permissions"]


def test_count_limit_of_the_user_resource_policy(lab, api_hub):
    pol = lab.sa.ok("POST", "/user-resource-policies", json={"name": f"two-{uid()}",
                                                             "max_vfolder_count": 2})
    u = lab.user()
    lab.sa.ok("PATCH", f"/users/{u['id']}", json={"resource_policy": pol["name"]})
    c = u["client"]
    c.ok("POST", "/vfolders", json={"name": "a"})
    c.ok("POST", "/vfolders", json={"name": "b"})
    before = snapshot(api_hub), tree(api_hub)
    r = c("POST", "/vfolders", json={"name": "c"})
    assert r.status_code == 412 and "2 of 2" in r.json()["detail"], r.text
    assert (snapshot(api_hub), tree(api_hub)) == before


def test_count_limit_of_the_project_resource_policy(lab, api_hub):
    pol = lab.sa.ok("POST", "/project-resource-policies", json={"name": f"one-{uid()}",
                                                                "max_vfolder_count": 1})
    lab.sa.ok("PATCH", f"/projects/{lab.project['id']}", json={"resource_policy": pol["name"]})
    admin = lab.user(role="admin")
    admin["client"].ok("POST", "/vfolders", json={"name": "a", "project": lab.project["id"]})
    before = snapshot(api_hub), tree(api_hub)
    r = admin["client"]("POST", "/vfolders", json={"name": "b", "project": lab.project["id"]})
    assert r.status_code == 412 and pol["name"] in r.json()["detail"], r.text
    assert (snapshot(api_hub), tree(api_hub)) == before
    # The admin's own folders are another scope, under another policy.
    admin["client"].ok("POST", "/vfolders", json={"name": "b"})


def test_share_read_only(lab, api_hub):
    owner, peer, stranger = lab.user(), lab.user(projects=[]), lab.user(projects=[])
    f = owner["client"].ok("POST", "/vfolders", json={"name": "shared"})
    assert peer["client"]("GET", f"/vfolders/{f['id']}").status_code == 404
    s = owner["client"].ok("POST", f"/vfolders/{f['id']}/shares",
                           json={"email": peer["email"], "permission": "ro"})
    assert (s["user_id"], s["permission"], s["email"]) == (peer["id"], "ro", peer["email"])
    seen = peer["client"].ok("GET", f"/vfolders/{f['id']}")
    assert seen["my_permission"] == "ro" and seen["permission"] == "rw"
    assert [x["id"] for x in peer["client"].ok("GET", "/vfolders")["items"]] == [f["id"]]
    assert stranger["client"]("GET", f"/vfolders/{f['id']}").status_code == 404
    # The sharee may neither rename, delete nor reshare it.
    other_dom = new_user(lab.sa, domain="default")
    before = snapshot(api_hub), tree(api_hub)
    assert peer["client"]("PATCH", f"/vfolders/{f['id']}", json={"name": "z"}).status_code == 403
    assert peer["client"]("DELETE", f"/vfolders/{f['id']}").status_code == 403
    assert peer["client"]("POST", f"/vfolders/{f['id']}/shares",
                          json={"email": stranger["email"]}).status_code == 403
    r = owner["client"]("POST", f"/vfolders/{f['id']}/shares", json={"email": peer["email"]})
    assert r.status_code == 409
    r = owner["client"]("POST", f"/vfolders/{f['id']}/shares", json={"email": other_dom["email"]})
    assert r.status_code == 400 and "no user" in r.json()["detail"]
    assert (snapshot(api_hub), tree(api_hub)) == before
    shares = owner["client"].ok("GET", f"/vfolders/{f['id']}/shares")
    assert [x["user_id"] for x in shares["items"]] == [peer["id"]]
    owner["client"].ok("PATCH", f"/vfolders/{f['id']}/shares/{peer['email']}",
                       json={"permission": "rw"})
    assert peer["client"].ok("GET", f"/vfolders/{f['id']}")["my_permission"] == "rw"
    owner["client"].ok("DELETE", f"/vfolders/{f['id']}/shares/{peer['id']}")
    assert peer["client"]("GET", f"/vfolders/{f['id']}").status_code == 404
    assert owner["client"].ok("GET", f"/vfolders/{f['id']}/shares")["items"] == []


def test_delete_while_mounted_is_refused(lab, api_hub):
    u = lab.user()
    c = u["client"]
    f = c.ok("POST", "/vfolders", json={"name": "busy"})
    kp = lab.sa.ok("GET", "/keypairs", params={"user_id": u["id"]})["items"][0]
    # A group without agents: the session stays PENDING (in "default" the scheduler
    # would place and run it while the test compares the record before and after).
    r = lab.sa("POST", "/resource-groups", json={"name": "vf-parked"})
    assert r.status_code in (201, 409), r.text
    sid = park_session(api_hub, {**u, "keypair": kp}, group="vf-parked")
    with api_hub.sm.begin() as s:
        s.get(Session, sid).vfolder_mounts = [{"id": f["id"], "name": "busy"}]
    before = snapshot(api_hub), tree(api_hub)
    r = c("DELETE", f"/vfolders/{f['id']}")
    assert r.status_code == 409 and sid in r.json()["detail"], r.text
    assert (snapshot(api_hub), tree(api_hub)) == before
    with api_hub.sm.begin() as s:  # the session ends
        sess = s.get(Session, sid)
        sess.alive_marker = None
        sess.status = "TERMINATED"
    c.ok("DELETE", f"/vfolders/{f['id']}")
    assert not os.path.exists(folder_dir(api_hub, f))


def test_project_folders(lab, api_hub):
    admin = lab.user(role="admin", projects=[])
    member, outsider = lab.user(), lab.user(projects=[lab.other_project["id"]])
    before = snapshot(api_hub), tree(api_hub)
    r = member["client"]("POST", "/vfolders", json={"name": "team", "project": lab.project["id"]})
    assert r.status_code == 403
    r = member["client"]("POST", "/vfolders", json={"name": "team", "project": "no-such"})
    assert r.status_code == 400
    assert (snapshot(api_hub), tree(api_hub)) == before
    f = admin["client"].ok("POST", "/vfolders", json={"name": "team", "project": "p",
                                                      "permission": "ro"})
    assert (f["ownership_type"], f["project_id"], f["user_id"], f["permission"]) == (
        "project", lab.project["id"], None, "ro")
    assert f["quota_scope_id"] == f"project:{lab.project['id']}"
    assert os.path.isdir(folder_dir(api_hub, f))
    assert member["client"].ok("GET", f"/vfolders/{f['id']}")["my_permission"] == "ro"
    assert outsider["client"]("GET", f"/vfolders/{f['id']}").status_code == 404
    assert f["id"] not in {x["id"] for x in outsider["client"].ok("GET", "/vfolders")["items"]}
    assert member["client"]("DELETE", f"/vfolders/{f['id']}").status_code == 403
    admin["client"].ok("PATCH", f"/vfolders/{f['id']}", json={"permission": "rw"})
    assert member["client"].ok("GET", f"/vfolders/{f['id']}")["my_permission"] == "rw"
    r = admin["client"]("POST", f"/vfolders/{f['id']}/shares", json={"email": outsider["email"]})
    assert r.status_code == 400 and "membership" in r.json()["detail"]
    admin["client"].ok("DELETE", f"/vfolders/{f['id']}")
    assert not os.path.exists(folder_dir(api_hub, f))


def _upload(client, fid, path, data, **kw):
    return client("PUT", f"/vfolders/{fid}/upload", params={"path": path}, data=data,
                  headers={"Content-Type": "application/octet-stream"}, **kw)


def test_upload_download_round_trip(lab, api_hub):
    c = lab.user()["client"]
    f = c.ok("POST", "/vfolders", json={"name": "files"})
    data = os.urandom(5 * 2**20 + 123)

    def body():  # streamed by the client in pieces, as a large upload would be
        for i in range(0, len(data), 256 * 1024):
            yield data[i:i + 256 * 1024]

    r = _upload(c, f["id"], "sub/dir/blob.bin", body())
    assert r.status_code == 404 and "no directory" in r.json()["detail"], r.text  # no parents made
    c.ok("POST", f"/vfolders/{f['id']}/mkdir", json={"path": "sub/dir", "parents": True})
    r = _upload(c, f["id"], "sub/dir/blob.bin", body())
    assert r.status_code == 201 and r.json() == {"path": "sub/dir/blob.bin", "size": len(data)}
    with open(os.path.join(folder_dir(api_hub, f), "sub", "dir", "blob.bin"), "rb") as fh:
        assert fh.read() == data
    r = c("GET", f"/vfolders/{f['id']}/download", params={"path": "sub/dir/blob.bin"})
    assert r.status_code == 200 and r.content == data
    assert r.headers["Content-Type"] == "application/octet-stream"
    assert "blob.bin" in r.headers["Content-Disposition"]
    listing = c.ok("GET", f"/vfolders/{f['id']}/files", params={"path": "sub/dir"})
    assert [(e["name"], e["type"], e["size"]) for e in listing["items"]] == [
        ("blob.bin", "file", len(data))]
    assert [e["name"] for e in c.ok("GET", f"/vfolders/{f['id']}/files")["items"]] == ["sub"]
    assert c.ok("POST", f"/vfolders/{f['id']}/rename", status=200,
                json={"path": "sub/dir/blob.bin", "new_path": "top.bin"}) == {"path": "top.bin"}
    assert sorted(e["name"] for e in c.ok("GET", f"/vfolders/{f['id']}/files")["items"]) == [
        "sub", "top.bin"]
    r = c("DELETE", f"/vfolders/{f['id']}/files", params={"path": "sub"})
    assert r.status_code == 409 and "not empty" in r.json()["detail"]
    c.ok("DELETE", f"/vfolders/{f['id']}/files", params={"path": "sub", "recursive": "true"})
    c.ok("DELETE", f"/vfolders/{f['id']}/files", params={"path": "top.bin"})
    assert c.ok("GET", f"/vfolders/{f['id']}/files")["items"] == []
    c.ok("DELETE", f"/vfolders/{f['id']}")
    assert not os.path.exists(folder_dir(api_hub, f))


def test_quota_scope_size_limit_leaves_no_file(lab, api_hub):
    pol = lab.sa.ok("POST", "/user-resource-policies",
                    json={"name": f"small-{uid()}", "max_quota_scope_size": 1_000_000})
    u = lab.user()
    lab.sa.ok("PATCH", f"/users/{u['id']}", json={"resource_policy": pol["name"]})
    c = u["client"]
    a = c.ok("POST", "/vfolders", json={"name": "a"})
    b = c.ok("POST", "/vfolders", json={"name": "b"})
    assert _upload(c, a["id"], "one", b"x" * 600_000).status_code == 201
    # The limit is the scope's: the user's folders together.
    r = _upload(c, b["id"], "two", b"y" * 600_000)
    assert r.status_code == 413 and "1000000" in r.json()["detail"], r.text
    assert os.listdir(folder_dir(api_hub, b)) == []
    assert c.ok("GET", f"/vfolders/{b['id']}/files")["items"] == []
    assert _upload(c, b["id"], "two", b"y" * 300_000).status_code == 201


def test_paths_cannot_leave_the_folder(lab, api_hub):
    c = lab.user()["client"]
    f = c.ok("POST", "/vfolders", json={"name": "jail"})
    victim = c.ok("POST", "/vfolders", json={"name": "victim"})
    _upload(c, victim["id"], "secret", b"s")
    before = snapshot(api_hub), tree(api_hub), sorted(os.listdir(folder_dir(api_hub, victim)))
    for path in ("../" + victim["id"] + "/secret", "/etc/passwd", "a/../../x", "..", ""):
        r = c("GET", f"/vfolders/{f['id']}/download", params={"path": path})
        assert r.status_code == 400, (path, r.text)
        r = _upload(c, f["id"], path, b"x")
        assert r.status_code == 400, (path, r.text)
        r = c("DELETE", f"/vfolders/{f['id']}/files", params={"path": path, "recursive": "true"})
        assert r.status_code == 400, (path, r.text)
        r = c("POST", f"/vfolders/{f['id']}/rename", json={"path": "x", "new_path": path or "."})
        assert r.status_code == 400, (path, r.text)
    # A symbolic link planted in the folder (as a session could) is not followed.
    os.symlink(folder_dir(api_hub, victim), os.path.join(folder_dir(api_hub, f), "link"))
    r = c("GET", f"/vfolders/{f['id']}/download", params={"path": "link/secret"})
    assert r.status_code == 400 and "link" in r.json()["detail"], r.text
    assert _upload(c, f["id"], "link/new", b"x").status_code == 400
    assert (snapshot(api_hub), tree(api_hub),
            sorted(os.listdir(folder_dir(api_hub, victim)))) == before


def test_sharee_reads_but_cannot_write_then_leaves(lab, api_hub):
    owner, peer = lab.user(), lab.user(projects=[])
    f = owner["client"].ok("POST", "/vfolders", json={"name": "pub"})
    _upload(owner["client"], f["id"], "note.txt", b"hello")
    owner["client"].ok("POST", f"/vfolders/{f['id']}/shares", json={"email": peer["email"]})
    p = peer["client"]
    assert p("GET", f"/vfolders/{f['id']}/download", params={"path": "note.txt"}).content == b"hello"
    before = tree(api_hub), sorted(os.listdir(folder_dir(api_hub, f)))
    r = _upload(p, f["id"], "mine.txt", b"x")
    assert r.status_code == 403 and "ro" in r.json()["detail"], r.text
    assert p("POST", f"/vfolders/{f['id']}/mkdir", json={"path": "d"}).status_code == 403
    assert p("DELETE", f"/vfolders/{f['id']}/files", params={"path": "note.txt"}).status_code == 403
    assert (tree(api_hub), sorted(os.listdir(folder_dir(api_hub, f)))) == before
    p.ok("DELETE", f"/vfolders/{f['id']}/shares/{peer['email']}")  # leaves
    assert p("GET", f"/vfolders/{f['id']}").status_code == 404


def test_download_needs_the_host_permission(api_hub):
    lab = Lab(api_hub, perms=["create-vfolder", "upload-file"])
    c = lab.user()["client"]
    f = c.ok("POST", "/vfolders", json={"name": "up-only"})
    assert _upload(c, f["id"], "f", b"1").status_code == 201
    r = c("GET", f"/vfolders/{f['id']}/download", params={"path": "f"})
    assert r.status_code == 403 and "download-file" in r.json()["detail"]


def test_deleting_every_folder_leaves_nothing_on_the_volume(lab, api_hub):
    admin, u = lab.user(role="admin"), lab.user()
    made = [u["client"].ok("POST", "/vfolders", json={"name": f"x{i}"}) for i in range(3)]
    made.append(admin["client"].ok("POST", "/vfolders", json={"name": "team",
                                                              "project": lab.project["id"]}))
    for f in made:
        _upload(u["client"], f["id"], "data", b"z" * 1000)
    for f in made:
        assert os.path.isfile(os.path.join(folder_dir(api_hub, f), "data"))
        admin["client"].ok("DELETE", f"/vfolders/{f['id']}")
    left = [t for t in tree(api_hub) if t.split("/")[2] in {f["id"] for f in made}]
    assert left == []
    with api_hub.sm() as s:
        assert s.query(VFolder).filter(VFolder.id.in_([f["id"] for f in made])).count() == 0


def test_storage_failure_leaves_no_row(lab, api_hub):
    u = lab.user()
    c = u["client"]
    # Something on the volume is in the way of the user's scope directory.
    blocker = os.path.join(volume_root(api_hub), "user", u["id"])
    os.makedirs(os.path.dirname(blocker), exist_ok=True)
    with open(blocker, "w") as fh:
        fh.write("in the way")
    try:
        before = snapshot(api_hub)
        r = c("POST", "/vfolders", json={"name": "doomed"})
        assert r.status_code == 503 and "storage" in r.json()["detail"], r.text
        assert snapshot(api_hub) == before
        assert c.ok("GET", "/vfolders")["items"] == []
    finally:
        os.unlink(blocker)
    assert c.ok("POST", "/vfolders", json={"name": "doomed"})["status"] == "ready"


def test_session_mounts_through_the_api(lab, api_hub):
    """POST /sessions mounts folders by name; the folder cannot go while the session lives."""
    u = lab.user()
    c = u["client"]
    f = c.ok("POST", "/vfolders", json={"name": "work-data"})
    body = {"name": f"s-{uid()}", "image": "local/python", "startup_command": "true",
            "starts_at": "2100-01-01T00:00:00+00:00", "resources": {"cpu": "0.1", "mem": "64m"}}
    r = c("POST", "/sessions", json={**body, "mounts": ["no-such-folder"]})
    assert r.status_code == 400 and "no-such-folder" in r.json()["detail"], r.text
    sess = c.ok("POST", "/sessions", json={**body, "mounts": ["work-data"]})
    assert [(m["id"], m["name"], m["permission"], m["target"]) for m in sess["vfolder_mounts"]] == [
        (f["id"], "work-data", "rw", "/home/work/work-data")]
    assert c.ok("GET", f"/sessions/{sess['id']}")["vfolder_mounts"] == sess["vfolder_mounts"]
    r = c("DELETE", f"/vfolders/{f['id']}")
    assert r.status_code == 409 and sess["id"] in r.json()["detail"], r.text
    assert os.path.isdir(folder_dir(api_hub, f))
    c.ok("DELETE", f"/sessions/{sess['id']}")
    c.ok("DELETE", f"/vfolders/{f['id']}")
    assert not os.path.exists(folder_dir(api_hub, f))


def test_an_interrupted_upload_leaves_nothing(lab, api_hub):
    """The client goes away mid-body: no file, no temporary file, the old file intact."""
    import socket
    import time
    import urllib.parse

    c = lab.user()["client"]
    f = c.ok("POST", "/vfolders", json={"name": "flaky"})
    assert _upload(c, f["id"], "keep.bin", b"old").status_code == 201
    url = urllib.parse.urlsplit(api_hub.base)
    target = f"{api_world.PREFIX}/vfolders/{f['id']}/upload?path=keep.bin"
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall((f"PUT {target} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                      f"Authorization: token {c.token}\r\n"
                      "Content-Type: application/octet-stream\r\n"
                      f"Content-Length: {50 * 2**20}\r\n\r\n").encode())
        sock.sendall(b"n" * (4 * 2**20))
        # Wait (bounded) until the hub has started writing, then hang up.
        where = folder_dir(api_hub, f)
        deadline = time.monotonic() + 30
        while not [n for n in os.listdir(where) if n.startswith(".upload-")]:
            assert time.monotonic() < deadline, "the upload never started"
            time.sleep(0.05)
    deadline = time.monotonic() + 30
    while sorted(os.listdir(where)) != ["keep.bin"]:
        assert time.monotonic() < deadline, os.listdir(where)
        time.sleep(0.05)
    r = c("GET", f"/vfolders/{f['id']}/download", params={"path": "keep.bin"})
    assert r.content == b"old"
