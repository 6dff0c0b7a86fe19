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
    # The hub runs in its directory and keeps the default volume: ./backendai-vfroot/volume1.
    return os.path.join(hub.dir, "backendai-vfroot", "volume1")


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
    assert c.ok("GET", f"/vfolders/{f['id']}") == f
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
        ({"name": ".hidden"}, 400, "name"),
        ({"name": "a/b"}, 400, "name"),
        ({"name": "x", "host": "nowhere:volume1"}, 400, "unknown vfolder host"),
        ({"name": "x", "host": "local:nope"}, 400, "unknown vfolder host"),
        ({"name": "x", "permission": "wd"}, 400, "project folders"),
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
    sid = park_session(api_hub, {**u, "keypair": kp}, group="default")
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
