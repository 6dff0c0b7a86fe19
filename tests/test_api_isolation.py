"""The isolation matrix: every endpoint x every role x objects of the caller's own and of
another domain / project. Allowed calls succeed; forbidden ones get 403 (visible, not
changeable) or 404 (not visible) and change nothing in the record; lists never show an
object outside the caller's visibility.

The matrix is a table written here, independently of the code under test; a path of the
OpenAPI document without rows for all four roles fails the test.
"""

from __future__ import annotations

import os
import uuid

import pytest

from jupyterhub_backendai.api import document, spec
from jupyterhub_backendai.common.types import HOST_PERMISSIONS
from jupyterhub_backendai.models import Agent, VFolder, VFolderPermissionRow
from jupyterhub_backendai.models.vfolder import VFolderInvitation

from . import api_world
from .api_world import Client, new_user, park_session, snapshot, superadmin

api_hub = api_world.api_hub  # the module's hub fixture

ROLES = ("SA", "AD", "US", "MO")
FAR = "2100-01-01T00:00:00+00:00"


def uid() -> str:
    return uuid.uuid4().hex[:8]


class World:
    """Two domains; in dom-a two projects and one user of each role; in dom-b one of each."""

    def __init__(self, hub):
        self.hub = hub
        sa = self.sa = superadmin(hub)
        hosts = {"local:volume1": list(HOST_PERMISSIONS)}
        sa.ok("POST", "/domains", json={"name": "dom-a", "allowed_vfolder_hosts": hosts})
        sa.ok("POST", "/domains", json={"name": "dom-b", "allowed_vfolder_hosts": hosts})
        self.pa1 = sa.ok("POST", "/projects", json={"name": "pa1", "domain_name": "dom-a"})["id"]
        self.pa2 = sa.ok("POST", "/projects", json={"name": "pa2", "domain_name": "dom-a"})["id"]
        self.pb1 = sa.ok("POST", "/projects", json={"name": "pb1", "domain_name": "dom-b"})["id"]
        sa.ok("POST", "/resource-groups", json={"name": "parked"})
        sa.ok("POST", "/resource-groups", json={"name": "rg-a", "is_public": False,
                                                "allowed_domains": ["dom-a"]})
        sa.ok("POST", "/resource-groups", json={"name": "rg-b", "is_public": False,
                                                "allowed_domains": ["dom-b"]})
        with hub.sm.begin() as s:
            s.add(Agent(id="agent-b", resource_group="rg-b", status="TERMINATED"))
        me = sa.ok("GET", "/whoami")["user"]
        me["keypair"] = sa.ok("GET", "/keypairs", params={"user_id": me["id"]})["items"][0]
        self.users = {"SA": me}
        for role, name in (("AD", "admin"), ("US", "user"), ("MO", "monitor")):
            self.users[role] = new_user(sa, role=name, domain="dom-a", projects=[self.pa1],
                                        name=f"{role.lower()}-a")
        self.peer = self._user("dom-a", [self.pa2], "peer-a")
        self.other = self._user("dom-b", [self.pb1], "user-b")
        self.sa_a = self._user("dom-a", [self.pa1], "sa-a", role="superadmin")
        self.clients = {"SA": sa, **{r: self.users[r]["client"] for r in ("AD", "US", "MO")}}
        self.sessions = {r: park_session(hub, u) for r, u in self.users.items()}
        self.peer_session = park_session(hub, self.peer)
        self.other_session = park_session(hub, self.other)
        self.hub_agent = hub.agent_id
        self.other2 = self._user("dom-b", [self.pb1], "user-b2")
        self.folders = {
            "us": self.folder(owner=self.users["US"]),
            "peer": self.folder(owner=self.peer),
            "other": self.folder(owner=self.other),
            "proj": self.folder(project=self.pa1, domain="dom-a"),
            "sibling": self.folder(project=self.pa2, domain="dom-a"),
            "shared": self.folder(owner=self.peer, share=(self.users["US"], "ro")),
        }

    def folder(self, *, owner=None, project=None, domain=None, share=None,
               file: str | None = None) -> str:
        """A ready folder written straight into the record and the hub's volume."""
        f = VFolder(
            name=f"f-{uid()}", host="local:volume1",
            quota_scope_id=f"user:{owner['id']}" if owner else f"project:{project}",
            ownership_type="user" if owner else "project",
            user_id=owner["id"] if owner else None, project_id=project,
            domain_name=owner["domain_name"] if owner else domain, status="ready",
        )
        with self.hub.sm.begin() as s:
            s.add(f)
            s.flush()
            if share:
                s.add(VFolderPermissionRow(vfolder_id=f.id, user_id=share[0]["id"],
                                           permission=share[1]))
            fid, scope = f.id, f.quota_scope_id
        path = os.path.join(self.hub.volume_path, *scope.split(":"), fid)
        os.makedirs(path)
        if file:
            with open(os.path.join(path, file), "w") as fh:
                fh.write("hello")
        return fid

    def _user(self, domain, projects, name=None, role="user") -> dict:
        return self.sa.ok("POST", "/users", json={
            "email": f"{name or uid()}@example.com", "password": api_world.PASSWORD,
            "username": name or f"u-{uid()}", "domain_name": domain, "project_ids": projects,
            "role": role})

    def _kp(self, user_id) -> str:
        return self.sa.ok("POST", "/keypairs", json={"user_id": user_id})["access_key"]

    def resolve(self, target: str | None, role: str) -> dict:
        """Path parameters for a target, seen from ``role`` (fresh objects are made here);
        a target's ``?name=value`` becomes the query (key ``_query``)."""
        me = self.users[role]
        sa = self.sa
        if target is None:
            return {}
        if "?" in target:
            target, q = target.split("?", 1)
            return {**self.resolve(target, role), "_query": dict([q.split("=", 1)])}
        kind, which = target.split(":")
        us, peer, other = self.users["US"], self.peer, self.other
        if kind == "vf":
            if not which.startswith("new-"):
                return {"id": self.folders[which]}
            return {"id": {
                "new-us": lambda: self.folder(owner=us),
                "new-peer": lambda: self.folder(owner=peer),
                "new-other": lambda: self.folder(owner=other),
                "new-proj": lambda: self.folder(project=self.pa1, domain="dom-a"),
                "new-shared": lambda: self.folder(owner=peer, share=(us, "ro")),
            }[which]()}
        if kind == "file":  # a fresh folder with a file a.txt
            return {"id": {
                "us": lambda: self.folder(owner=us, file="a.txt"),
                "shared-ro": lambda: self.folder(owner=peer, share=(us, "ro"), file="a.txt"),
                "other": lambda: self.folder(owner=other, file="a.txt"),
            }[which]()}
        if kind == "share":  # a fresh folder shared with a user of its domain
            if which == "us":
                return {"id": self.folder(owner=us, share=(peer, "ro")), "user": peer["id"]}
            return {"id": self.folder(owner=other, share=(self.other2, "ro")),
                    "user": self.other2["id"]}
        if kind == "inv":  # a fresh pending invitation to a new folder of the peer
            invitee = {"me": me, "us": us}[which]
            fid = self.folder(owner=peer)
            with self.hub.sm.begin() as s:
                inv = VFolderInvitation(vfolder_id=fid, inviter_id=peer["id"],
                                        invitee_id=invitee["id"], permission="ro")
                s.add(inv)
                s.flush()
                return {"id": inv.id}
        if kind == "dom":
            if which == "new":
                return {"name": sa.ok("POST", "/domains", json={"name": f"d-{uid()}"})["name"]}
            return {"name": {"own": "dom-a", "other": "dom-b"}[which]}
        if kind == "proj":
            if which.startswith("new"):
                dom = "dom-a" if which == "new-a" else "dom-b"
                return {"id": sa.ok("POST", "/projects", json={"name": f"p-{uid()}",
                                                                "domain_name": dom})["id"]}
            return {"id": {"own": self.pa1, "sibling": self.pa2, "other": self.pb1}[which]}
        if kind == "member":
            pid, dom = (self.pa1, "dom-a") if which == "own" else (self.pb1, "dom-b")
            return {"id": pid, "user_id": self._user(dom, [pid])["id"]}
        if kind == "user":
            if which == "new-peer":
                return {"id": self._user("dom-a", [self.pa2])["id"]}
            if which == "new-other":
                return {"id": self._user("dom-b", [self.pb1])["id"]}
            return {"id": {"self": me["id"], "peer": self.peer["id"], "other": self.other["id"],
                           "sa-in-domain": self.sa_a["id"]}[which]}
        if kind == "kp":
            owners = {"self": me, "peer": self.peer, "other": self.other}
            if which.startswith("new-"):
                return {"access_key": self._kp(owners[which[4:]]["id"])}
            return {"access_key": owners[which]["keypair"]["access_key"]}
        if kind.startswith("policy"):
            if which == "new":
                base = "/" + kind.split("/", 1)[1]
                return {"name": sa.ok("POST", base, json={"name": f"pol-{uid()}"})["name"]}
            return {"name": "default"}
        if kind == "rg":
            if which == "new":
                return {"name": sa.ok("POST", "/resource-groups", json={"name": f"g-{uid()}"})["name"]}
            return {"name": {"public": "default", "own": "rg-a", "other": "rg-b"}[which]}
        if kind == "preset":  # packaged (every group), new, or only in rg-b
            if which == "public":
                return {"name": "small"}
            body = {"name": f"pr-{uid()}", "resource_slots": {"cpu": "1"}}
            if which == "other":
                body["resource_group"] = "rg-b"
            return {"name": sa.ok("POST", "/resource-presets", json=body)["name"]}
        if kind == "agent":
            if which == "gone":  # a LOST agent of rg-b without sessions: removable
                aid = f"gone-{uid()}"
                with self.hub.sm.begin() as s:
                    s.add(Agent(id=aid, resource_group="rg-b", status="LOST"))
                return {"id": aid}
            return {"id": self.hub_agent if which == "hub" else "agent-b"}
        if kind == "sess":
            owners = {"self": me, "peer": self.peer, "other": self.other}
            if which.startswith("new-"):
                return {"id": park_session(self.hub, owners[which[4:]])}
            return {"id": {"self": self.sessions[role], "peer": self.peer_session,
                           "other": self.other_session}[which]}
        if kind in ("reg", "img", "alias"):  # issue 25: registries and the catalogue
            return self._image_target(kind, which)
        raise KeyError(target)

    def _image_target(self, kind: str, which: str) -> dict:
        import urllib.parse

        from jupyterhub_backendai.models import Image, ImageAlias

        if kind == "reg":
            if which == "local":
                return {"name": "local"}
            return {"name": self.sa.ok("POST", "/container-registries", json={
                "name": f"r-{uid()}", "url": "https://127.0.0.1:9"})["name"]}
        name = f"127.0.0.1:9/iso/img-{uid()}:1"
        alias = f"al-{uid()}"
        with self.hub.sm.begin() as s:
            s.add(Image(name=name, source="local", repo=f"iso/{name}", tag="1", digest="",
                        architecture="x86_64", size_bytes=0, labels={}, description="",
                        hidden=which == "hidden", is_default=False))
            if kind == "alias":
                s.flush()
                s.add(ImageAlias(alias=alias, image=name))
        if kind == "alias":
            return {"alias": alias}
        return {"name": urllib.parse.quote(name, safe="")}


def E(sa, ad, us, mo) -> dict:  # noqa: N802 - reads like a table header
    return dict(zip(ROLES, (sa, ad, us, mo), strict=True))


ALL200 = E(200, 200, 200, 200)


def _new(prefix):
    return lambda: {"name": f"{prefix}-{uid()}"}


def _user_body(domain, role="user"):
    def body():
        n = f"n-{uid()}"
        return {"email": f"{n}@example.com", "password": api_world.PASSWORD, "username": n,
                "domain_name": domain, "role": role}
    return body


def _session_body():
    return {"name": f"s-{uid()}", "image": "local/python", "startup_command": "true",
            "starts_at": FAR, "resources": {"cpu": "0.1", "mem": "64m"}}


# (method, document path) -> [(target, expected by role, body or body factory)]
MATRIX: dict[tuple[str, str], list[tuple]] = {
    ("get", "/whoami"): [(None, ALL200, None)],
    ("get", "/domains"): [(None, ALL200, None)],
    ("post", "/domains"): [(None, E(201, 403, 403, 403), _new("d"))],
    ("get", "/domains/{name}"): [("dom:own", ALL200, None),
                                 ("dom:other", E(200, 404, 404, 404), None)],
    ("patch", "/domains/{name}"): [("dom:own", E(200, 403, 403, 403), {"description": "x"}),
                                   ("dom:other", E(200, 404, 404, 404), {"description": "x"})],
    ("delete", "/domains/{name}"): [("dom:new", E(204, 404, 404, 404), None),
                                    ("dom:own", E(409, 403, 403, 403), None)],
    ("get", "/projects"): [(None, ALL200, None)],
    ("post", "/projects"): [
        (None, E(201, 201, 403, 403), lambda: {"name": f"p-{uid()}", "domain_name": "dom-a"}),
        (None, E(201, 403, 403, 403), lambda: {"name": f"p-{uid()}", "domain_name": "dom-b"})],
    ("get", "/projects/{id}"): [("proj:own", ALL200, None),
                                ("proj:sibling", E(200, 200, 404, 200), None),
                                ("proj:other", E(200, 404, 404, 404), None)],
    ("patch", "/projects/{id}"): [
        ("proj:own", E(200, 200, 403, 403), {"description": "x"}),
        ("proj:sibling", E(200, 200, 404, 403), {"description": "x"}),
        ("proj:other", E(200, 404, 404, 404), {"description": "x"})],
    ("delete", "/projects/{id}"): [("proj:new-a", E(204, 204, 404, 403), None),
                                   ("proj:new-b", E(204, 404, 404, 404), None)],
    ("get", "/projects/{id}/members"): [("proj:own", E(200, 200, 403, 200), None),
                                        ("proj:sibling", E(200, 200, 404, 200), None),
                                        ("proj:other", E(200, 404, 404, 404), None)],
    ("post", "/projects/{id}/members"): [
        ("proj:own", E(200, 200, 403, 403), "peer-ids"),
        ("proj:other", E(200, 404, 404, 404), "other-ids")],
    ("delete", "/projects/{id}/members/{user_id}"): [
        ("member:own", E(204, 204, 403, 403), None),
        ("member:other", E(204, 404, 404, 404), None)],
    ("get", "/users"): [(None, ALL200, None)],
    ("post", "/users"): [(None, E(201, 201, 403, 403), _user_body("dom-a")),
                         (None, E(201, 403, 403, 403), _user_body("dom-b")),
                         (None, E(201, 403, 403, 403), _user_body("dom-a", "superadmin"))],
    ("get", "/users/{id}"): [("user:self", ALL200, None),
                             ("user:peer", E(200, 200, 404, 200), None),
                             ("user:other", E(200, 404, 404, 404), None)],
    ("patch", "/users/{id}"): [
        ("user:self", E(200, 200, 403, 403), {"full_name": "x"}),
        ("user:peer", E(200, 200, 404, 403), {"full_name": "x"}),
        ("user:other", E(200, 404, 404, 404), {"full_name": "x"}),
        ("user:sa-in-domain", E(200, 403, 404, 403), {"full_name": "x"}),
        ("user:new-peer", E(200, 403, 404, 403), {"role": "superadmin"}),
        ("user:new-peer", E(200, 403, 404, 403), {"domain_name": "dom-b", "project_ids": []})],
    ("delete", "/users/{id}"): [("user:new-peer", E(204, 204, 404, 403), None),
                                ("user:new-other", E(204, 404, 404, 404), None),
                                ("user:self", E(409, 409, 403, 403), None)],
    ("get", "/keypairs"): [(None, ALL200, None)],
    ("post", "/keypairs"): [(None, E(201, 201, 201, 403), {}),
                            (None, E(201, 201, 404, 403), "peer-user"),
                            (None, E(201, 404, 404, 404), "other-user"),
                            (None, E(201, 403, 403, 403), {"rate_limit": 5})],
    ("get", "/keypairs/{access_key}"): [("kp:self", ALL200, None),
                                        ("kp:peer", E(200, 200, 404, 200), None),
                                        ("kp:other", E(200, 404, 404, 404), None)],
    ("patch", "/keypairs/{access_key}"): [
        ("kp:new-self", E(200, 200, 200, 403), {"is_active": False}),
        ("kp:new-self", E(200, 403, 403, 403), {"rate_limit": 10}),
        ("kp:new-peer", E(200, 200, 404, 403), {"is_active": False}),
        ("kp:new-other", E(200, 404, 404, 404), {"is_active": False})],
    ("delete", "/keypairs/{access_key}"): [("kp:new-self", E(204, 204, 204, 403), None),
                                           ("kp:new-peer", E(204, 204, 404, 403), None),
                                           ("kp:new-other", E(204, 404, 404, 404), None)],
    ("get", "/resource-groups"): [(None, ALL200, None)],
    ("post", "/resource-groups"): [(None, E(201, 403, 403, 403), _new("g"))],
    ("get", "/resource-groups/{name}"): [("rg:public", ALL200, None), ("rg:own", ALL200, None),
                                         ("rg:other", E(200, 404, 404, 404), None)],
    ("patch", "/resource-groups/{name}"): [
        ("rg:own", E(200, 403, 403, 403), {"description": "x"}),
        ("rg:other", E(200, 404, 404, 404), {"description": "x"})],
    ("delete", "/resource-groups/{name}"): [("rg:new", E(204, 403, 403, 403), None),
                                            ("rg:other", E(409, 404, 404, 404), None)],
    ("get", "/resource-presets"): [(None, ALL200, None)],
    ("post", "/resource-presets"): [
        (None, E(201, 403, 403, 403), lambda: {"name": f"pr-{uid()}",
                                               "resource_slots": {"cpu": "1", "mem": "1g"}})],
    ("get", "/resource-presets/{name}"): [("preset:public", ALL200, None),
                                          ("preset:other", E(200, 404, 404, 404), None)],
    ("patch", "/resource-presets/{name}"): [
        ("preset:new", E(200, 403, 403, 403), {"description": "x"}),
        ("preset:other", E(200, 404, 404, 404), {"description": "x"})],
    ("delete", "/resource-presets/{name}"): [("preset:new", E(204, 403, 403, 403), None),
                                             ("preset:other", E(204, 404, 404, 404), None)],
    ("get", "/usage"): [(None, ALL200, None)],
    ("get", "/agents"): [(None, E(200, 200, 403, 200), None)],
    ("get", "/agents/{id}"): [("agent:hub", E(200, 200, 403, 200), None),
                              ("agent:other", E(200, 404, 403, 404), None)],
    ("patch", "/agents/{id}"): [("agent:hub", E(200, 403, 403, 403), {"schedulable": True}),
                                ("agent:other", E(200, 404, 403, 404), {"schedulable": False})],
    ("delete", "/agents/{id}"): [("agent:hub", E(409, 403, 403, 403), None),
                                 ("agent:gone", E(204, 404, 403, 404), None)],
    ("get", "/sessions"): [(None, ALL200, None)],
    ("post", "/sessions"): [(None, E(201, 201, 201, 403), _session_body)],
    ("get", "/sessions/{id}"): [("sess:self", ALL200, None),
                                ("sess:peer", E(200, 200, 404, 200), None),
                                ("sess:other", E(200, 404, 404, 404), None)],
    ("delete", "/sessions/{id}"): [("sess:new-self", E(204, 204, 204, 403), None),
                                   ("sess:new-peer", E(204, 204, 404, 403), None),
                                   ("sess:new-other", E(204, 404, 404, 404), None)],
    ("get", "/sessions/{id}/logs"): [("sess:self", ALL200, None),
                                     ("sess:peer", E(200, 200, 404, 200), None),
                                     ("sess:other", E(200, 404, 404, 404), None)],
    ("get", "/sessions/{id}/service-ports"): [("sess:self", ALL200, None),
                                              ("sess:peer", E(200, 200, 404, 200), None),
                                              ("sess:other", E(200, 404, 404, 404), None)],
    ("get", "/sessions/{id}/lifetime"): [("sess:self", ALL200, None),
                                         ("sess:peer", E(200, 200, 404, 200), None),
                                         ("sess:other", E(200, 404, 404, 404), None)],
    # This world's sessions never run: who may extend one is told so (409), the others 403/404.
    ("post", "/sessions/{id}/extend"): [("sess:self", E(409, 409, 409, 403), {"seconds": 60}),
                                        ("sess:peer", E(409, 409, 404, 403), {"seconds": 60}),
                                        ("sess:other", E(409, 404, 404, 404), {"seconds": 60})],
    # Only a running session is restarted (409 for who may); the others 403/404.
    ("post", "/sessions/{id}/restart"): [("sess:self", E(409, 409, 409, 403), None),
                                         ("sess:peer", E(409, 409, 404, 403), None),
                                         ("sess:other", E(409, 404, 404, 404), None)],
    # Issue 27: the same for a commit (who may is told the session does not run: 409).
    ("post", "/sessions/{id}/commit"): [("sess:self", E(409, 409, 409, 403), {"name": "snap"}),
                                        ("sess:peer", E(409, 409, 404, 403), {"name": "snap"}),
                                        ("sess:other", E(409, 404, 404, 404), {"name": "snap"})],
    # Only the owner gets the key; this world's sessions are in groups without SSH (404).
    ("get", "/sessions/{id}/ssh-key"): [("sess:self", E(404, 404, 404, 404), None),
                                        ("sess:peer", E(403, 403, 404, 403), None),
                                        ("sess:other", E(403, 404, 404, 404), None)],
    ("get", "/scheduler"): [(None, E(200, 200, 403, 403), None)],
    # Issue 30: superadmins only; size 0 of a pool that does not exist changes nothing.
    ("get", "/warm-pools"): [(None, E(200, 403, 403, 403), None)],
    ("put", "/warm-pools"): [(None, E(200, 403, 403, 403),
                              {"resource_group": "default", "image": "x/none:1",
                               "preset": "small", "size": 0})],
    # (a superadmin's call names nothing to clear here: 400; tests/test_login_guard.py
    # clears throttles for real)
    ("delete", "/login-throttles"): [(None, E(400, 403, 403, 403), None)],
}
for _kind in spec.POLICY_KINDS:
    _base = f"/{_kind}-resource-policies"
    _field = "max_concurrent_sessions" if _kind == "keypair" else "max_vfolder_count"
    MATRIX.update({
        ("get", _base): [(None, E(200, 200, 403, 200), None)],
        ("post", _base): [(None, E(201, 403, 403, 403), _new("pol"))],
        ("get", _base + "/{name}"): [(f"policy{_base}:default", E(200, 200, 403, 200), None)],
        ("patch", _base + "/{name}"): [(f"policy{_base}:new", E(200, 403, 403, 403),
                                        {_field: 3})],
        ("delete", _base + "/{name}"): [(f"policy{_base}:new", E(204, 403, 403, 403), None)],
    })
NO_FILES = E(403, 403, 403, 403)  # visible, but no permission on the files
MATRIX.update({
    ("get", "/vfolder-hosts"): [(None, ALL200, None)],
    ("get", "/vfolders"): [(None, ALL200, None)],
    ("post", "/vfolders"): [
        (None, E(201, 201, 201, 403), _new("f")),
        (None, E(201, 201, 403, 403), "project-pa1"),
        (None, E(201, 400, 400, 403), "project-pb1")],
    ("get", "/vfolders/{id}"): [
        ("vf:us", ALL200, None), ("vf:peer", E(200, 200, 404, 200), None),
        ("vf:other", E(200, 404, 404, 404), None), ("vf:proj", ALL200, None),
        ("vf:sibling", E(200, 200, 404, 200), None), ("vf:shared", ALL200, None)],
    ("patch", "/vfolders/{id}"): [
        ("vf:new-us", E(200, 200, 200, 403), {"usage_mode": "data"}),
        ("vf:new-peer", E(200, 200, 404, 403), {"usage_mode": "data"}),
        ("vf:new-other", E(200, 404, 404, 404), {"usage_mode": "data"}),
        ("vf:new-proj", E(200, 200, 403, 403), {"permission": "ro"}),
        ("vf:new-shared", E(200, 200, 403, 403), {"usage_mode": "data"})],
    ("delete", "/vfolders/{id}"): [
        ("vf:new-us", E(204, 204, 204, 403), None),
        ("vf:new-peer", E(204, 204, 404, 403), None),
        ("vf:new-other", E(204, 404, 404, 404), None),
        ("vf:new-proj", E(204, 204, 403, 403), None),
        ("vf:new-shared", E(204, 204, 403, 403), None)],
    ("post", "/vfolders/{id}/clone"): [
        ("vf:us", E(403, 403, 201, 403), _new("c")),
        ("vf:proj", E(403, 201, 201, 403), _new("c")),
        ("vf:other", E(403, 404, 404, 404), _new("c"))],
    ("get", "/vfolders/{id}/shares"): [
        ("vf:us", ALL200, None), ("vf:shared", E(200, 200, 403, 200), None),
        ("vf:other", E(200, 404, 404, 404), None)],
    ("post", "/vfolders/{id}/shares"): [
        ("vf:new-us", E(403, 403, 201, 403), "share-peer"),
        ("vf:new-shared", E(403, 403, 403, 403), "share-peer"),
        ("vf:new-other", E(403, 404, 404, 404), "share-other2"),
        ("vf:new-proj", E(400, 400, 400, 400), "share-peer")],
    ("post", "/vfolders/{id}/invitations"): [
        ("vf:new-us", E(403, 403, 201, 403), "share-peer"),
        ("vf:new-shared", E(403, 403, 403, 403), "share-peer"),
        ("vf:new-other", E(403, 404, 404, 404), "share-other2"),
        ("vf:new-proj", E(400, 400, 400, 400), "share-peer")],
    ("get", "/vfolder-invitations"): [(None, ALL200, None)],
    # Only the invitee answers (a monitor changes nothing); others do not see it.
    ("post", "/vfolder-invitations/{id}/accept"): [
        ("inv:me", E(200, 200, 200, 403), None), ("inv:us", E(404, 404, 200, 404), None)],
    ("post", "/vfolder-invitations/{id}/decline"): [
        ("inv:me", E(200, 200, 200, 403), None), ("inv:us", E(404, 404, 200, 404), None)],
    ("patch", "/vfolders/{id}/shares/{user}"): [
        ("share:us", E(403, 403, 200, 403), {"permission": "rw"}),
        ("share:other", E(403, 404, 404, 404), {"permission": "rw"})],
    ("delete", "/vfolders/{id}/shares/{user}"): [
        ("share:us", E(204, 204, 204, 403), None),
        ("share:other", E(204, 404, 404, 404), None)],
    ("get", "/vfolders/{id}/files"): [
        ("vf:us", E(403, 403, 200, 403), None), ("vf:shared", E(403, 403, 200, 403), None),
        ("vf:proj", E(403, 200, 200, 200), None), ("vf:other", E(403, 404, 404, 404), None)],
    ("delete", "/vfolders/{id}/files"): [
        ("file:us?path=a.txt", E(403, 403, 204, 403), None),
        ("file:shared-ro?path=a.txt", NO_FILES, None),
        ("file:other?path=a.txt", E(403, 404, 404, 404), None)],
    ("put", "/vfolders/{id}/upload"): [
        ("vf:new-us?path=x.txt", E(403, 403, 201, 403), b"bytes"),
        ("vf:new-shared?path=x.txt", NO_FILES, b"bytes"),
        ("vf:new-proj?path=x.txt", E(403, 201, 201, 403), b"bytes"),
        ("vf:new-other?path=x.txt", E(403, 404, 404, 404), b"bytes")],
    ("get", "/vfolders/{id}/download"): [
        ("file:us?path=a.txt", E(403, 403, 200, 403), None),
        ("file:shared-ro?path=a.txt", E(403, 403, 200, 403), None),
        ("file:other?path=a.txt", E(403, 404, 404, 404), None)],
    ("post", "/vfolders/{id}/mkdir"): [
        ("vf:new-us", E(403, 403, 201, 403), {"path": "d"}),
        ("vf:new-shared", NO_FILES, {"path": "d"}),
        ("vf:new-other", E(403, 404, 404, 404), {"path": "d"})],
    ("post", "/vfolders/{id}/rename"): [
        ("file:us", E(403, 403, 200, 403), {"path": "a.txt", "new_path": "b.txt"}),
        ("file:shared-ro", NO_FILES, {"path": "a.txt", "new_path": "b.txt"}),
        ("file:other", E(403, 404, 404, 404), {"path": "a.txt", "new_path": "b.txt"})],
})
MATRIX.update({  # issue 25: registries (superadmins) and the image catalogue
    ("get", "/container-registries"): [(None, E(200, 403, 403, 403), None)],
    ("post", "/container-registries"): [
        (None, E(201, 403, 403, 403),
         lambda: {"name": f"r-{uid()}", "url": "https://127.0.0.1:9", "password": "s"})],
    ("get", "/container-registries/{name}"): [("reg:new", E(200, 403, 403, 403), None)],
    ("patch", "/container-registries/{name}"): [
        ("reg:new", E(200, 403, 403, 403), {"project": "lab"})],
    ("delete", "/container-registries/{name}"): [("reg:new", E(204, 403, 403, 403), None)],
    ("post", "/container-registries/{name}/rescan"): [
        ("reg:local", E(200, 403, 403, 403), None)],
    ("get", "/images"): [(None, ALL200, None)],
    ("get", "/images/{name}"): [("img:shown", ALL200, None),
                                ("img:hidden", E(200, 200, 404, 404), None)],
    ("patch", "/images/{name}"): [("img:shown", E(200, 403, 403, 403), {"description": "x"})],
    ("post", "/images/{name}/aliases"): [
        ("img:shown", E(201, 403, 403, 403), lambda: {"alias": f"al-{uid()}"})],
    ("delete", "/image-aliases/{alias}"): [("alias:new", E(204, 403, 403, 403), None)],
})
PUBLIC = {("get", "/openapi.json")}


@pytest.fixture(scope="module")
def world(api_hub):
    return World(api_hub)


def test_matrix_covers_every_documented_operation():
    doc = document.build_document()
    missing = []
    for path, ops in doc["paths"].items():
        for method in ops:
            if (method, path) in PUBLIC:
                continue
            rows = MATRIX.get((method, path), [])
            roles = {r for _, exp, _ in rows for r in exp}
            if roles != set(ROLES):
                missing.append(f"{method.upper()} {path}: roles {sorted(roles)}")
    assert not missing, "matrix rows missing for:\n" + "\n".join(missing)
    assert set(MATRIX) - {(m, p) for p, ops in doc["paths"].items() for m in ops} == set()


def _body(world: World, spec_body, role: str):
    if spec_body == "peer-ids":
        return {"user_ids": [world.peer["id"]]}
    if spec_body == "other-ids":
        return {"user_ids": [world.other["id"]]}
    if spec_body == "peer-user":
        return {"user_id": world.peer["id"]}
    if spec_body == "other-user":
        return {"user_id": world.other["id"]}
    if spec_body == "project-pa1":
        return {"name": f"f-{uid()}", "project": world.pa1}
    if spec_body == "project-pb1":
        return {"name": f"f-{uid()}", "project": world.pb1}
    if spec_body == "share-peer":
        return {"email": world.peer["email"]}
    if spec_body == "share-other2":
        return {"email": world.other2["email"]}
    return spec_body() if callable(spec_body) else spec_body


def volume_files(hub) -> list[tuple[str, int]]:
    """Every entry on the hub's storage volume, with its size."""
    root = hub.volume_path
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            out.append((os.path.relpath(p, root), os.lstat(p).st_size if n in filenames else 0))
    return sorted(out)


def test_isolation_matrix(world):
    failures = []
    calls = 0
    for (method, path), rows in MATRIX.items():
        for target, expected, spec_body in rows:
            for role, status in expected.items():
                params = world.resolve(target, role)
                query = params.pop("_query", None)
                url = path.format(**params)
                body = _body(world, spec_body, role)
                before = (snapshot(world.hub), volume_files(world.hub)) if status >= 400 else None
                if isinstance(body, bytes):
                    r = world.clients[role](method.upper(), url, data=body, params=query,
                                            headers={"Content-Type": "application/octet-stream"})
                else:
                    r = world.clients[role](method.upper(), url, json=body, params=query)
                calls += 1
                where = f"{role} {method.upper()} {path} [{target}] {body}"
                if r.status_code != status:
                    failures.append(f"{where}: expected {status}, got {r.status_code} {r.text[:200]}")
                    continue
                if status >= 400:
                    if not r.headers.get("Content-Type", "").startswith("application/problem+json"):
                        failures.append(f"{where}: error is not problem+json")
                    if r.json()["status"] != status or not r.json()["detail"]:
                        failures.append(f"{where}: bad problem body {r.text}")
                    if (snapshot(world.hub), volume_files(world.hub)) != before:
                        failures.append(f"{where}: refused ({status}) but the record or the "
                                        "storage changed")
    assert calls > 350
    assert not failures, f"{len(failures)} of {calls} calls wrong:\n" + "\n".join(failures)


def _all(client: Client, path: str, **params) -> list[dict]:
    out, offset = [], 0
    while True:
        page = client.ok("GET", path, params={**params, "offset": offset, "limit": 500})
        out += page["items"]
        offset += len(page["items"])
        if offset >= page["total"] or not page["items"]:
            return out


def shared_with(world, user_id: str) -> set[str]:
    from sqlalchemy import select

    with world.hub.sm() as s:
        return set(s.scalars(select(VFolderPermissionRow.vfolder_id).where(
            VFolderPermissionRow.user_id == user_id)))


def test_lists_never_leak(world):
    """Every list, read by every role, holds exactly what that role may see."""
    sa = world.sa
    every = {path: _all(sa, path) for path in (
        "/domains", "/projects", "/users", "/keypairs", "/resource-groups", "/agents",
        "/sessions", "/vfolders")}
    dom_a_users = {u["id"] for u in every["/users"] if u["domain_name"] == "dom-a"}
    # A superadmin's keypairs, sessions and own folders are not their domain's to see.
    superadmins = {u["id"] for u in every["/users"] if u["role"] == "superadmin"}
    usable_a = {g["name"] for g in every["/resource-groups"]
                if g["is_public"] or "dom-a" in g["allowed_domains"]}
    for role in ("AD", "US", "MO"):
        me = world.users[role]
        c = world.clients[role]
        domain_reader = role in ("AD", "MO")
        visible = {
            "/domains": lambda x: x["name"] == "dom-a",
            "/projects": (lambda x: x["domain_name"] == "dom-a") if domain_reader
            else (lambda x, me=me: x["id"] in me["project_ids"]),
            "/users": (lambda x: x["domain_name"] == "dom-a") if domain_reader
            else (lambda x, me=me: x["id"] == me["id"]),
            "/keypairs": (lambda x: x["user_id"] in dom_a_users - superadmins) if domain_reader
            else (lambda x, me=me: x["user_id"] == me["id"]),
            "/resource-groups": lambda x: x["name"] in usable_a,
            "/agents": lambda x: x["resource_group"] in usable_a,
            "/sessions": (lambda x: x["domain_name"] == "dom-a"
                          and x["user_id"] not in superadmins) if domain_reader
            else (lambda x, me=me: x["user_id"] == me["id"]),
            "/vfolders": (lambda x: x["domain_name"] == "dom-a" and not (
                x["ownership_type"] == "user" and x["user_id"] in superadmins))
            if domain_reader
            else (lambda x, me=me: (x["ownership_type"] == "user" and x["user_id"] == me["id"])
                  or (x["ownership_type"] == "project" and x["project_id"] in me["project_ids"])
                  or x["id"] in shared_with(world, me["id"])),
        }
        for path, rule in visible.items():
            if path == "/agents" and role == "US":
                assert c("GET", path).status_code == 403
                continue
            key = "access_key" if path == "/keypairs" else (
                "name" if path in ("/domains", "/resource-groups") else "id")
            got = sorted(x[key] for x in _all(c, path))
            want = sorted(x[key] for x in every[path] if rule(x))
            assert got == want, (role, path)
            assert want, (role, path)  # the rule is not vacuous
        members = c("GET", f"/projects/{world.pa1}/members")
        if domain_reader:
            assert {u["domain_name"] for u in members.json()["items"]} == {"dom-a"}
        else:
            assert members.status_code == 403
    # Filters cannot widen the view: asking for another domain's objects yields nothing.
    us = world.clients["US"]
    assert us.ok("GET", "/users", params={"domain": "dom-b"})["items"] == []
    assert world.clients["AD"].ok("GET", "/sessions",
                                  params={"user_id": world.other["id"]})["items"] == []
    assert world.clients["MO"].ok("GET", "/keypairs",
                                  params={"user_id": world.other["id"]})["total"] == 0


def test_inactive_user_and_domain_are_refused(world):
    sa = world.sa
    u = new_user(sa, domain="dom-a", projects=[world.pa1])
    assert u["client"]("GET", "/whoami").status_code == 200
    sa.ok("PATCH", f"/users/{u['id']}", json={"status": "inactive"})
    # Deactivation revokes the account's tokens at once (test_attacks_tenancy has the rest).
    assert u["client"]("GET", "/whoami").status_code == 401
    problem = world.hub.login(u["email"], api_world.PASSWORD).last_login
    assert problem.status_code == 403 and "not active" in problem.text
    sa.ok("PATCH", f"/users/{u['id']}", json={"status": "active"})
    sa.ok("POST", "/domains", json={"name": "dom-off"})
    v = new_user(sa, domain="dom-off", projects=[])
    sa.ok("PATCH", "/domains/dom-off", json={"is_active": False})
    assert v["client"]("GET", "/whoami").status_code == 401
    r = world.hub.login(v["email"], api_world.PASSWORD).last_login
    assert r.status_code == 403 and "domain is not active" in r.text


def test_token_scopes_are_respected(world):
    hub = world.hub
    s = hub.login()
    xsrf = {"X-XSRFToken": s.cookies.get("_xsrf", path="/hub/")}

    def token(scopes):
        r = s.post(hub.base + "/hub/api/users/admin/tokens", json={"scopes": scopes},
                   headers=xsrf)
        assert r.status_code == 201, r.text
        return r.json()["token"]

    none = Client(hub, token(["read:users:name"]))
    r = none("GET", "/whoami")
    assert r.status_code == 403 and "custom:backendai:read" in r.json()["detail"]
    reader = Client(hub, token(["custom:backendai:read"]))
    assert reader("GET", "/domains").status_code == 200
    before = snapshot(hub)
    r = reader("POST", "/domains", json={"name": "by-reader"})
    assert r.status_code == 403 and "custom:backendai:write" in r.json()["detail"]
    assert snapshot(hub) == before
    writer = Client(hub, token(["custom:backendai:read", "custom:backendai:write"]))
    writer.ok("POST", "/domains", json={"name": "by-writer"})
    anonymous = Client(hub, None)
    r = anonymous("GET", "/whoami")
    assert r.status_code == 401 and r.headers["Content-Type"].startswith("application/problem+json")
    assert Client(hub, "not-a-token")("GET", "/whoami").status_code == 401


def test_browser_cookie_follows_xsrf_rules(world):
    hub = world.hub
    s = hub.login()
    url = hub.base + api_world.PREFIX
    xsrf = s.cookies.get("_xsrf", path="/hub/")
    assert s.get(url + "/whoami", headers={"X-XSRFToken": xsrf}).json()["role"] == "superadmin"
    before = snapshot(hub)
    r = s.post(url + "/domains", json={"name": "no-xsrf"})
    assert r.status_code == 403 and r.headers["Content-Type"].startswith("application/problem+json")
    assert snapshot(hub) == before
    r = s.post(url + "/domains", json={"name": "with-xsrf"}, headers={"X-XSRFToken": xsrf})
    assert r.status_code == 201, r.text


def test_signed_requests_follow_the_same_rules(world):
    """A keypair acts as its owner: same visibility, same refusals, nothing changed."""
    import requests

    from jupyterhub_backendai.common.signing import sign_request

    us = world.users["US"]
    ak, sk = us["keypair"]["access_key"], us["keypair"]["secret_key"]

    def signed(method, path, body=None):
        url = world.hub.base + api_world.PREFIX + path
        return requests.request(method, url, json=body, timeout=30,
                                headers=sign_request(method, url, ak, sk))

    me = signed("GET", "/whoami").json()
    assert me["keypair"] == ak and me["user"]["id"] == us["id"] and me["role"] == "user"
    assert [u["id"] for u in signed("GET", "/users").json()["items"]] == [us["id"]]
    before = snapshot(world.hub)
    assert signed("GET", f"/users/{world.peer['id']}").status_code == 404
    assert signed("POST", "/domains", {"name": f"d-{uid()}"}).status_code == 403
    assert signed("DELETE", f"/keypairs/{world.other['keypair']['access_key']}").status_code == 404
    r = signed("DELETE", f"/keypairs/{ak}")
    assert r.status_code == 409 and "signed this request" in r.json()["detail"]
    assert r.headers.get("X-RateLimit-Limit")  # the signing layer's headers survive errors
    assert snapshot(world.hub) == before
