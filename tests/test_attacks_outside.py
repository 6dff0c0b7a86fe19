"""Attacks from outside, as a tenant and as an anonymous client, on the routes the
isolation matrix (tests/test_api_isolation.py) does not cover: Backend.AI's own REST
routes and its GraphQL endpoint (``/admin/gql``) under ``/hub/api/backendai/``, and the
bounds of what one request may ask. Each attack worked against the version before this
module; each test performs it against a real hub and shows it refused.

- every Backend.AI route that names a session, folder or invitation, called by a user of
  domain A with the ids and names of domain B's objects: 404 (not even existence shows),
  nothing changes in the record, and the lists show nothing of B's (a test that fails
  when a route is added without a row here);
- the same through GraphQL: queries answer nothing of B's, mutations change nothing;
- thousands of GraphQL aliases (``a1: users {...} a2: users {...} ...``) in one request
  held a database thread for a minute each; a few such requests stopped every other
  tenant's API calls. Now a 400 before any work;
- ``clusterSize: 10**12`` (Backend.AI's route, or ``cluster_size`` in JupyterHub's spawn
  API) made the hub count kernels one by one on its event loop: the hub stopped
  answering anyone. Now a 400, as is ``cpu: 1e30`` (a 500 before);
- NUL characters and lone surrogates in Backend.AI routes' bodies, query parameters and
  GraphQL variables gave 500s on PostgreSQL (and GraphQL echoed the database driver's
  message); now a 400 in plain words, and GraphQL never answers an internal error's text.

PostgreSQL only: it is where NUL cannot be stored (SQLite takes it), and the rest does
not depend on the database.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
import uuid

import pytest
import requests
from graphql import GraphQLError, build_schema, execute_sync, parse

from jupyterhub_backendai.api.compat import gql
from jupyterhub_backendai.api.compat import routes as compat_routes
from jupyterhub_backendai.common import signing

from . import api_world
from .api_world import PREFIX, snapshot
from .hub import Hub

FAR = "2100-01-01T00:00:00+00:00"
HOSTS = {"local:volume1": ["create-vfolder", "modify-vfolder", "delete-vfolder",
                           "mount-in-session", "upload-file", "download-file", "invite-others",
                           "set-user-specific-permission"]}


@pytest.fixture(scope="module")
def hub(postgres, tmp_path_factory):
    yield from api_world.local_hub(postgres.new_database("t_" + uuid.uuid4().hex[:12]))


class Tenant:
    """A user of the hub with their keypair: calls signed as Backend.AI's clients do."""

    def __init__(self, hub: Hub, user: dict):
        self.hub, self.user = hub, user
        self.keys = (user["keypair"]["access_key"], user["keypair"]["secret_key"])

    def __call__(self, method: str, path: str, body=None, params=None,
                 files=None) -> requests.Response:
        url = self.hub.base + PREFIX + path
        if params:
            url += "?" + urllib.parse.urlencode(params, errors="surrogatepass")
        data = None if body is None else json.dumps(body).encode()
        content_type = "application/json"
        if files is not None:  # multipart, as `backend.ai run` uploads
            prep = requests.Request(method, url, files=files).prepare()
            data, content_type = prep.body, prep.headers["Content-Type"]
        headers = signing.sign_request(method, url, *self.keys, content_type=content_type)
        headers["Content-Type"] = content_type
        return requests.request(method, url, headers=headers, data=data, timeout=60)

    def gql(self, query: str, variables: dict | None = None) -> requests.Response:
        return self("POST", "/admin/gql", {"query": query, "variables": variables or {}})


class World:
    """Domain da with alice, domain db with bob; bob has a queued session, a folder with
    a file, a folder named like one of alice's, and a pending invitation to bob2."""

    def __init__(self, hub: Hub):
        sa = self.sa = api_world.superadmin(hub)
        for d in ("da", "db"):
            sa.ok("POST", "/domains", json={"name": d, "allowed_vfolder_hosts": HOSTS})
        self.alice = Tenant(hub, self._user(sa, "da", "alice"))
        self.bob = Tenant(hub, self._user(sa, "db", "bob"))
        self.bob2 = Tenant(hub, self._user(sa, "db", "bob2"))
        r = self.bob("POST", "/sessions", {
            "name": "bobsess", "image": "local/python", "startup_command": "true",
            "starts_at": FAR, "resources": {"cpu": "0.1", "mem": "64m"}})
        assert r.status_code == 201, r.text
        self.session = r.json()["id"]
        self.folder = self._folder(self.bob, "bobdata")
        r = self.bob("POST", "/folders/bobdata/request-upload", {"path": "a.txt", "size": 0})
        assert r.status_code == 200, r.text
        self._folder(self.alice, "same")
        self.bob_same = self._folder(self.bob, "same")
        r = self.bob("POST", "/folders/bobdata/invite",
                     {"user_ids": [self.bob2.user["email"]], "perm": "ro"})
        assert r.status_code == 201, r.text
        r = self.bob2("GET", "/folders/invitations/list")
        self.invitation = r.json()["invitations"][0]["id"]
        r = self.bob("POST", "/template/session", {"payload": json.dumps({
            "name": "bobtpl", "template": {"kind": "taskTemplate", "spec": {
                "session_type": "batch", "kernel": {"image": "local/python"}}}})})
        assert r.status_code == 200, r.text
        self.template = r.json()[0]["id"]
        r = self.bob("POST", "/user-config/dotfiles",
                     {"path": ".bobrc", "data": "bob's", "permission": "644"})
        assert r.status_code == 200, r.text

    @staticmethod
    def _user(sa, domain: str, name: str) -> dict:
        return sa.ok("POST", "/users", json={
            "email": f"{name}@example.com", "password": api_world.PASSWORD, "username": name,
            "domain_name": domain, "role": "user"})

    @staticmethod
    def _folder(who: Tenant, name: str) -> str:
        r = who("POST", "/folders", {"name": name})
        assert r.status_code == 201, r.text
        return r.json()["id"]


@pytest.fixture(scope="module")
def world(hub):
    return World(hub)


def _dashed(hex_id: str) -> str:
    return str(uuid.UUID(hex_id))


# -- Backend.AI's REST routes, crossed between domains -----------------------------------

# Route (as declared, without the prefix) -> the calls a user of another domain makes on
# domain B's objects: (method, path, body). {sid}/{fid}/{inv}: bob's session, folder and
# invitation (hex or dashed ids and names, as Backend.AI's clients name them).
CROSS = {
    "/session/([^/]+)": [("GET", "/session/{sid}", None), ("GET", "/session/bobsess", None),
                         ("GET", "/session/{sid_dashed}", None),
                         ("DELETE", "/session/{sid}", None),
                         ("DELETE", "/session/bobsess", None),
                         ("PATCH", "/session/{sid}", None)],
    "/session/([^/]+)/status-history": [("GET", "/session/{sid}/status-history", None)],
    "/session/([^/]+)/rename": [("POST", "/session/{sid}/rename?name=mine", None)],
    "/events/session": [("GET", "/events/session?sessionId={sid_dashed}", None),
                        ("GET", "/events/session?sessionName=bobsess", None)],
    "/folders/([^/]+)/update-options": [("POST", "/folders/{fid}/update-options",
                                         {"permission": "ro"})],
    "/session/([^/]+)/logs": [("GET", "/session/{sid}/logs", None)],
    "/session/([^/]+)/commit": [("POST", "/session/{sid}/commit", None),
                                ("POST", "/session/bobsess/commit", None)],
    "/session/([^/]+)/imagify": [("POST", "/session/{sid}/imagify?image_name=mine", None)],
    "/session/([^/]+)/upload": [("POST", "/session/{sid}/upload", "files")],
    "/folders/_/id": [("GET", "/folders/_/id", {"name": "bobdata"})],
    "/stream/session/([^/]+)/apps": [("GET", "/stream/session/{sid}/apps", None)],
    "/session/([^/]+)/files": [("GET", "/session/{sid}/files", {"path": "."}),
                               ("GET", "/session/bobsess/files", None)],
    "/session/([^/]+)/download": [("GET", "/session/{sid}/download", {"files": ["id_container"]}),
                                  ("GET", "/session/{sid}/download", {"files": ["a.txt"]}),
                                  ("POST", "/session/bobsess/download?files=id_container",
                                   None)],
    "/template/session/([^/]+)": [("GET", "/template/session/{tpl}", None),
                                  ("GET", "/template/session/{tpl}?format=json", None),
                                  ("PUT", "/template/session/{tpl}", {"payload": "{}"}),
                                  ("DELETE", "/template/session/{tpl}", None)],
    "/session/_/create-from-template": [("POST", "/session/_/create-from-template",
                                         {"template_id": "{tpl}", "name": "stolen",
                                          "type": "batch"})],
    "/user-config/dotfiles": [("GET", "/user-config/dotfiles?owner_access_key={bobkey}", None),
                              ("GET", "/user-config/dotfiles?path=.bobrc&owner_access_key="
                               "{bobkey}", None),
                              ("DELETE", "/user-config/dotfiles?path=.bobrc&owner_access_key="
                               "{bobkey}", None),
                              ("POST", "/user-config/dotfiles",
                               {"path": ".x", "data": "x", "permission": "644",
                                "owner_access_key": "{bobkey}"})],
    "/domain-config/dotfiles": [("GET", "/domain-config/dotfiles?domain=db", None),
                                ("POST", "/domain-config/dotfiles",
                                 {"domain": "db", "path": ".x", "data": "x",
                                  "permission": "644"})],
    "/stream/session/([^/]+)/tcpproxy": [("GET", "/stream/session/{sid}/tcpproxy?app=jupyter",
                                          None)],
    "/folders/invitations/accept": [("POST", "/folders/invitations/accept", {"inv_id": "{inv}"})],
    "/folders/invitations/delete": [("DELETE", "/folders/invitations/delete",
                                     {"inv_id": "{inv}"})],
    "/folders/restore-from-trash-bin": [("POST", "/folders/restore-from-trash-bin",
                                         {"id": "{fid}"})],
    "/folders/purge": [("POST", "/folders/purge", {"id": "{fid}"})],
    "/folders/delete-from-trash-bin": [("POST", "/folders/delete-from-trash-bin",
                                        {"id": "{fid}"})],
    "/folders": [("DELETE", "/folders", {"id": "{fid}"}),
                 ("DELETE", "/folders", {"id": "bobdata"})],
    "/folders/([^/]+)": [("GET", "/folders/{fid}", None), ("GET", "/folders/bobdata", None),
                         ("GET", "/folders/{fid_dashed}", None),
                         ("DELETE", "/folders/{fid}", None)],
    "/folders/([^/]+)/files": [("GET", "/folders/{fid}/files", None)],
    "/folders/([^/]+)/mkdir": [("POST", "/folders/{fid}/mkdir", {"path": "x"})],
    "/folders/([^/]+)/rename": [("POST", "/folders/{fid}/rename", {"new_name": "mine"})],
    "/events/background-task": [("GET", "/events/background-task?task_id=bobs-rescan", None)],
    "/folders/([^/]+)/clone": [("POST", "/folders/{fid}/clone", {"target_name": "stolen"}),
                               ("POST", "/folders/bobdata/clone", {"target_name": "stolen"})],
    "/folders/([^/]+)/rename-file": [("POST", "/folders/{fid}/rename-file",
                                      {"target_path": "a.txt", "new_name": "b.txt"})],
    "/folders/([^/]+)/move-file": [("POST", "/folders/{fid}/move-file",
                                    {"src": "a.txt", "dst": "b.txt"})],
    "/folders/([^/]+)/invite": [("POST", "/folders/{fid}/invite",
                                 {"user_ids": ["alice@example.com"], "perm": "rw"})],
    "/folders/([^/]+)/share": [("POST", "/folders/{fid}/share",
                                {"emails": ["alice@example.com"], "permission": "rw"})],
    "/folders/([^/]+)/unshare": [("DELETE", "/folders/{fid}/unshare",
                                  {"emails": ["bob2@example.com"]})],
    "/folders/([^/]+)/leave": [("POST", "/folders/{fid}/leave",
                                {"shared_user_uuid": "{bob2}"})],
    "/folders/([^/]+)/delete-files": [("DELETE", "/folders/{fid}/delete-files",
                                       {"files": ["a.txt"]})],
    "/folders/([^/]+)/request-upload": [("POST", "/folders/{fid}/request-upload",
                                         {"path": "evil.txt", "size": 1})],
    "/folders/([^/]+)/request-download": [("POST", "/folders/{fid}/request-download",
                                           {"path": "a.txt"})],
}
# Routes without another tenant's object to name, or attacked elsewhere.
NOT_CROSSED = {
    "/?": "version negotiation, public as in Backend.AI",
    "/manager/announcement": "the same for everyone",
    "/admin/gql": "test_graphql_keeps_other_domains_out",
    "/session": "creates the caller's own session (test_sizes_are_bounded_on_every_path)",
    "/folders/_/hosts": "the caller's own hosts",
    "/folders/invitations/list": "test_lists_show_nothing_of_another_domain",
    "/stream/session/([^/]+)/execute": "test_backendai_client.py::_attack_execute_websocket",
    "/config/resource-slots": "the installation's slot names, the same for everyone",
    "/config/vfolder-types": "the same for everyone",
    "/folders/_/allowed_types": "the same for everyone",
    "/template/session": "lists the caller's own and their projects' templates; "
                         "test_backendai_client_templates.py (a user outside the project "
                         "sees none)",
    "/group-config/dotfiles": "names a project: one the caller cannot see is 404 "
                              "(test_backendai_client_templates.py::test_dotfiles_are_"
                              "written_into_new_sessions)",
    "/config/get": "superadmins only, the installation's registries (test_images_cli.py::"
                   "test_cli_configures_a_registry_through_its_etcd_keys: a domain admin "
                   "and a user refused)",
    "/config/set": "the same",
    "/config/delete": "the same",
    "/scaling-groups": "names a project: one the caller cannot see is refused "
                       "(test_backendai_client_more.py::test_admin_agent_list_query_slots_and_"
                       "usable_scaling_groups)",
}
# What this hub does not offer: refused for everyone with what to use instead, whatever
# the object (api/compat RefusedHandler; test_backendai_client_more.py::test_refused_routes).
NOT_CROSSED.update({
    row[0].removeprefix(PREFIX.removeprefix("/hub")): "refused for everyone"
    for row in compat_routes() if row[1].__name__ == "RefusedHandler"})


def _declared() -> list[str]:
    prefix = PREFIX.removeprefix("/hub")
    out = []
    for row in compat_routes():
        path = row[0].removeprefix(prefix)
        if path.startswith("/storage/"):
            continue  # token-authenticated transfers: tests/test_tus.py
        out.append(path)
    return out


def test_every_backendai_route_has_a_cross_domain_row():
    missing = [r for r in _declared() if r not in CROSS and r not in NOT_CROSSED]
    assert not missing, "Backend.AI routes without a cross-domain attack here: " + ", ".join(
        missing)
    assert set(CROSS) | set(NOT_CROSSED) <= set(_declared())


def _fill(value, world: World):
    subs = {"{sid}": world.session, "{sid_dashed}": _dashed(world.session),
            "{fid}": world.folder, "{fid_dashed}": _dashed(world.folder),
            "{inv}": world.invitation, "{bob2}": world.bob2.user["id"],
            "{tpl}": world.template, "{bobkey}": world.bob.keys[0]}
    if isinstance(value, str):
        for k, v in subs.items():
            value = value.replace(k, v)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, world) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, world) for v in value]
    return value


def test_backendai_routes_keep_other_domains_out(hub, world):
    before = snapshot(hub)
    wrong = []
    for route, calls in CROSS.items():
        for method, path, body in calls:
            if body == "files":  # (multipart, as `backend.ai run` uploads)
                r = world.alice(method, _fill(path, world),
                                files={"src": ("x.py", b"print(1)")})
            else:
                r = world.alice(method, _fill(path, world), _fill(body, world))
            if r.status_code != 404:
                wrong.append(f"{method} {path} {body}: {r.status_code} {r.text[:200]}")
            else:
                # not even existence shows: the same answer as for an object that never was
                assert r.json()["type"].endswith("/object-not-found"), (route, r.text)
    assert not wrong, "cross-domain calls not refused as unknown:\n" + "\n".join(wrong)
    assert snapshot(hub) == before, "a refused cross-domain call changed the record"
    # what bob has is still there and his
    assert world.bob("GET", "/folders/bobdata/files").status_code == 200
    assert world.bob("GET", f"/session/{world.session}").status_code == 200


def test_a_name_resolves_to_the_callers_own_folder(world):
    r = world.alice("GET", "/folders/same")
    assert r.status_code == 200, r.text
    assert r.json()["id"] != _dashed(world.bob_same)
    assert r.json()["user"] == _dashed(world.alice.user["id"])


def test_lists_show_nothing_of_another_domain(world):
    text = json.dumps([
        world.alice("GET", "/folders").json(),
        world.alice("GET", "/folders/invitations/list").json(),
        world.alice.gql("{ vfolder_list(limit: 100, offset: 0) { items { id name } } }").json(),
        world.alice.gql("{ compute_session_list(limit: 100, offset: 0) "
                        "{ items { id name } } }").json(),
        world.alice.gql("{ users { email } keypairs { access_key user_id } domains { name } "
                        "groups { name } }").json(),
    ])
    for secret in (world.session, _dashed(world.session), world.folder, _dashed(world.folder),
                   "bobdata", "bobsess", "bob@example.com", world.bob.keys[0], '"db"'):
        assert secret not in text, secret


# -- GraphQL ----------------------------------------------------------------------------


def test_graphql_keeps_other_domains_out(hub, world):
    bob, bak = world.bob.user, world.bob.keys[0]
    queries = [
        f'{{ keypair(access_key: "{bak}") {{ access_key secret_key }} }}',
        f'{{ keypairs(email: "{bob["email"]}") {{ access_key }} }}',
        f'{{ user(email: "{bob["email"]}") {{ email main_access_key }} }}',
        f'{{ user_from_uuid(user_id: "{bob["id"]}") {{ email }} }}',
        f'{{ compute_session(id: "{world.session}") {{ name }} }}',
        '{ domain(name: "db") { name } }',
        f'{{ compute_session_list(limit: 10, offset: 0, access_key: "{bak}") '
        '{ total_count items { name } } }',
    ]
    for q in queries:
        r = world.alice.gql(q)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        value = next(iter(data.values())) if data else None
        assert value in (None, {"total_count": 0, "items": []}), (q, r.text)
    before = snapshot(hub)
    mutations = [
        f'mutation {{ modify_user(email: "{bob["email"]}", props: {{full_name: "x"}}) '
        '{ ok msg } }',
        f'mutation {{ create_keypair(user_id: "{bob["email"]}", props: {{}}) '
        '{ ok msg keypair { secret_key } } }',
        f'mutation {{ modify_keypair(access_key: "{bak}", props: {{is_active: false}}) '
        '{ ok msg } }',
        f'mutation {{ delete_keypair(access_key: "{bak}") {{ ok msg }} }}',
        'mutation { modify_domain(name: "db", props: {description: "x"}) { ok msg } }',
        f'mutation {{ purge_user(email: "{bob["email"]}") {{ ok msg }} }}',
        'mutation { modify_user(email: "alice@example.com", props: {role: "superadmin"}) '
        '{ ok msg } }',
    ]
    for q in mutations:
        r = world.alice.gql(q)
        assert r.status_code == 200, r.text
        (out,) = r.json()["data"].values()
        assert out["ok"] is False, (q, r.text)
    assert snapshot(hub) == before


def test_graphql_alias_floods_are_refused_before_any_work(world):
    many = "{" + " ".join(f"a{i}: users {{ email }}" for i in range(1000)) + "}"
    r = world.alice.gql(many)
    assert r.status_code == 400, r.text[:300]
    assert "top-level fields" in r.json()["detail"]
    r = world.alice.gql("{" + " ".join(f"a{i}: users {{ email }}" for i in range(3000)) + "}")
    assert r.status_code == 400 and "characters" in r.json()["detail"], r.text[:300]
    r = world.alice.gql("{" + " ".join(f"a{i}: users {{ email }}" for i in range(11)) + "}")
    assert r.status_code == 400 and "more than 10 top-level" in r.json()["detail"], r.text
    # ten are fine (and more than any Backend.AI client sends)
    r = world.alice.gql("{" + " ".join(f"a{i}: users {{ email }}" for i in range(10)) + "}")
    assert r.status_code == 200 and len(r.json()["data"]) == 10, r.text[:300]
    # fragments spread into each other: 2**20 fields once expanded
    frags = "fragment F0 on UserInfo { email full_name } " + " ".join(
        f"fragment F{i} on UserInfo {{ ...F{i - 1} ...F{i - 1} }}" for i in range(1, 21))
    r = world.alice.gql("{ keypair { user_info { ...F20 } } } " + frags)
    assert r.status_code == 400 and "fields" in r.json()["detail"], r.text[:300]
    # a fragment cycle is the validator's error, not a hang
    r = world.alice.gql("{ keypair { ...A } } fragment A on KeyPair { ...B } "
                        "fragment B on KeyPair { access_key ...A }")
    assert r.status_code == 200 and r.json()["errors"], r.text[:300]
    r = world.alice.gql("{ keypair { access_key } }" + " " * 40000)
    assert r.status_code == 400 and "characters" in r.json()["detail"]


def test_sizes_are_bounded_on_every_path(hub, world):
    s = hub.login("alice@example.com", api_world.PASSWORD)
    token = hub.token_for(s, "alice")
    before = snapshot(hub)
    body = {"name": "huge", "image": "local/python", "type": "batch", "startupCommand": "true",
            "enqueueOnly": True, "starts_at": FAR,
            "config": {"resources": {"cpu": "0.1", "mem": "64m"}}}
    for size in (10**12, 17, -1, "3", True):
        r = world.alice("POST", "/session", {**body, "clusterSize": size})
        assert r.status_code == 400, (size, r.text)
        assert "clusterSize" in r.json()["detail"]
    r = world.alice("POST", "/sessions", {"name": "huge", "image": "local/python",
                                          "startup_command": "true", "starts_at": FAR,
                                          "cluster_size": 10**12})
    assert r.status_code == 400, r.text
    # JupyterHub's spawn API, with the user's own token
    r = hub.spawn("alice", "huge", {"cluster_size": str(10**12)}, token=token)
    assert r.status_code == 400, r.text
    assert "cluster_size must be at most 16" in r.text
    # more cores than Decimal keeps digits for: a 500 on the API paths, a bare
    # "Invalid user options" on JupyterHub's
    for cpu in ("1e30", 1e300):
        r = world.alice("POST", "/sessions", {"name": "huge", "image": "local/python",
                                              "startup_command": "true", "starts_at": FAR,
                                              "resources": {"cpu": cpu}})
        assert r.status_code == 400 and "more cores" in r.text, r.text
        r = world.alice("POST", "/session", {**body, "config": {"resources": {"cpu": cpu}}})
        assert r.status_code == 400 and "more cores" in r.text, r.text
        r = hub.spawn("alice", "huge", {"cpu": str(cpu)}, token=token)
        assert r.status_code == 400 and "more cores" in r.text, r.text
    assert snapshot(hub) == before
    # and the hub still answers everyone
    assert world.bob("GET", "/folders").status_code == 200


def test_backendai_session_create_checks_its_fields(hub, world):
    """Each of these was a 500 (int('abc'), a 300-character name on PostgreSQL, ...)."""
    body = {"name": "ok", "image": "local/python", "type": "batch", "startupCommand": "true",
            "enqueueOnly": True, "starts_at": FAR,
            "config": {"resources": {"cpu": "0.1", "mem": "64m"}}}
    before = snapshot(hub)
    for change, field in (({"clusterSize": "abc"}, "clusterSize"),
                          ({"maxWaitSeconds": "x"}, "maxWaitSeconds"),
                          ({"name": "a" * 300}, "name"), ({"name": "x\n"}, "name"),
                          ({"dependencies": 5}, "dependencies"),
                          ({"dependencies": [5]}, "dependencies"),
                          ({"dependencies": ["bobsess"] * 65}, "dependencies"),
                          ({"starts_at": 5}, "starts_at"),
                          ({"config": {"mounts": [5]}}, "config.mounts"),
                          ({"config": {"resources": "x"}}, "config.resources")):
        r = world.alice("POST", "/session", {**body, **change})
        assert r.status_code == 400, (change, r.text)
        assert r.json()["detail"].startswith(field), (change, r.text)
    assert snapshot(hub) == before
    assert "Uncaught exception" not in hub.log()


def test_lists_in_one_request_are_bounded(hub, world):
    """20,000 paths or users in one request took the hub 4 to 13 s of work, counted once
    by the rate limit; now a 400 before any of it."""
    before = snapshot(hub)
    names = [f"d{i}" for i in range(1001)]
    emails = [f"u{i}@example.com" for i in range(101)]
    for method, path, body in (
            ("POST", "/folders/same/mkdir", {"path": names}),
            ("DELETE", "/folders/same/delete-files", {"files": names}),
            ("POST", "/folders/same/invite", {"user_ids": emails, "perm": "ro"}),
            ("POST", "/folders/same/share", {"emails": emails, "permission": "ro"}),
            ("DELETE", "/folders/same/unshare", {"emails": emails})):
        r = world.alice(method, path, body)
        assert r.status_code == 400 and "at most" in r.json()["detail"], (path, r.text[:300])
    assert world.alice("GET", "/folders/same/files").json()["items"] == []
    assert snapshot(hub) == before


# -- text a database cannot store -------------------------------------------------------

NUL, SURROGATE = "a\u0000b", "\ud800"


def test_text_a_database_cannot_store_is_a_400_everywhere(hub, world):
    session = {"image": "local/python", "type": "batch", "startupCommand": "true",
               "enqueueOnly": True, "starts_at": FAR,
               "config": {"resources": {"cpu": "0.1", "mem": "64m"}}}
    before = snapshot(hub)
    for bad in (NUL, SURROGATE):
        calls = [
            ("POST", "/session", {**session, "name": bad}, None),
            ("GET", "/folders/_/id", {"name": bad}, None),
            ("GET", "/folders/_/id", None, {"name": bad}),
            ("POST", "/folders/invitations/accept", {"inv_id": bad}, None),
            ("POST", "/folders/restore-from-trash-bin", {"id": bad}, None),
            ("GET", "/folders/bobdata/files", None, {"path": bad}),
            ("POST", "/folders", {"name": "ok", "usage_mode": bad}, None),
        ]
        for method, path, body, params in calls:
            r = world.alice(method, path, body, params)
            assert r.status_code == 400, (method, path, body, params, r.status_code, r.text)
            assert re.search("NUL characters|invalid unicode|not UTF-8",
                             r.json()["detail"]), r.text
        for q, v in (("query($s: String) { users(status: $s) { email } }", {"s": bad}),
                     ("query($s: String) { domain(name: $s) { name } }", {"s": bad})):
            r = world.alice.gql(q, v)
            assert r.status_code == 400, (q, r.text)
    # the same in a literal of the query itself
    r = world.alice.gql('{ domain(name: "a\\u0000b") { name } }')
    assert r.status_code == 400 and "NUL" in r.json()["detail"], r.text
    assert snapshot(hub) == before
    assert "Uncaught exception" not in hub.log()


def test_graphql_never_answers_an_internal_errors_text():
    """A resolver failing for a reason that is not a refusal (a database error, a bug):
    the answer says so without its text (which showed SQL, parameters, paths)."""
    schema = build_schema("type Query { boom: String ok: String }")

    class Root:
        def boom(self, info):
            raise RuntimeError("(psycopg2.errors.Foo) SELECT secret_key FROM keypairs")

        def ok(self, info):
            raise GraphQLError("no such thing")

    result = execute_sync(schema, parse("{ boom ok }"), root_value=Root(),
                          field_resolver=lambda src, info, **kw: getattr(src, info.field_name)(info))
    out = gql._answer(result)
    text = json.dumps(out)
    assert "secret_key" not in text and "psycopg2" not in text
    messages = sorted(e["message"] for e in out["errors"])
    assert messages == ["internal error; the hub's log has the details", "no such thing"]


def test_a_refusal_in_words_is_kept(world):
    # (the masking above must not hide the words of ordinary refusals)
    r = world.alice.gql('{ domain(name: "db") { name } }')
    assert r.json()["errors"][0]["message"] == "no domain 'db'"


def test_the_hub_log_shows_no_secret(hub, world):
    """After everything above (keys made, transfers requested, errors answered): no secret
    key, transfer token or API token in the hub's log."""
    r = world.alice("POST", "/folders/same/request-download", {"path": "nothing.txt"})
    assert r.status_code == 200, r.text
    transfer = r.json()["token"]
    r = requests.get(r.json()["url"], params={"token": transfer}, timeout=60)
    assert r.status_code == 404, r.text
    deadline = time.monotonic() + 30
    while True:  # (the request above, scrubbed, once the hub has written its line)
        with open(os.path.join(hub.dir, "hub.log"), errors="replace") as f:
            log = f.read()
        if "/storage/download?token=[secret]" in log or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "/storage/download?token=[secret]" in log
    for secret in (world.alice.keys[1], world.bob.keys[1], world.bob2.keys[1], transfer,
                   transfer.split(".")[1], hub.admin_token):
        assert secret not in log


def test_password_page_guesses_are_throttled_as_logins_are(hub, world):
    """With a logged-in browser (a borrowed laptop, a stolen cookie) the password page
    checked the current password without limit, by bcrypt inside a locking transaction on
    the hub's shared database pool. Now it counts as a failed login of the account."""
    world.sa.ok("POST", "/users", json={
        "email": "carol@example.com", "password": api_world.PASSWORD, "username": "carol",
        "domain_name": "da", "role": "user"})
    s = hub.login("carol@example.com", api_world.PASSWORD)
    page = s.get(hub.base + "/hub/backendai/password")
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text).group(1)

    def change(current):
        return s.post(hub.base + "/hub/backendai/password", data={
            "current": current, "new": "new-pass-word-1", "confirm": "new-pass-word-1",
            "_xsrf": xsrf})

    for i in range(10):  # LoginGuard.max_failures_per_account
        r = change(f"guess-{i}")
        assert r.status_code == 400 and "The current password is wrong" in r.text
    r = change(api_world.PASSWORD)  # even the right one now
    assert r.status_code == 429, r.status_code
    assert "Too many failed logins for this account" in r.text and r.headers["Retry-After"]
    # the same window as the login form's: the guesser gets no more tries there either
    assert hub.login("carol@example.com", api_world.PASSWORD).last_login.status_code == 429
    with hub.sm() as db:
        from jupyterhub_backendai.manager import tenancy
        from jupyterhub_backendai.models import User
        carol = db.query(User).filter_by(username="carol").one()
        assert tenancy.check_password(api_world.PASSWORD, carol.password)


def test_minted_keypairs_share_the_users_rate_limit(hub, world):
    """Each keypair had its own window: a user who minted k keypairs made k times their
    rate limit. Now every signed request also spends the user's main keypair's window."""
    dave = Tenant(hub, World._user(world.sa, "da", "dave"))
    world.sa.ok("PATCH", f"/keypairs/{dave.keys[0]}", json={"rate_limit": 8})
    minted = []
    for _ in range(3):  # 3 of the 8
        r = dave("POST", "/keypairs", {})
        assert r.status_code == 201, r.text
        assert r.json()["rate_limit"] == 8
        minted.append(Tenant(hub, {"keypair": r.json()}))
    codes = [k("GET", "/whoami").status_code for _ in range(3) for k in minted]
    assert codes.count(200) == 5 and codes.count(429) == 4, codes
    r = minted[0]("GET", "/whoami")
    assert r.status_code == 429 and "user 'dave'" in r.json()["detail"], r.text
    assert world.alice("GET", "/whoami").status_code == 200  # others keep theirs


def _rss_peak_during(pid: int, work) -> int:
    """Run ``work()``; the growth of ``pid``'s peak resident memory meanwhile, in bytes
    (the kernel's high-water mark, reset first through /proc/PID/clear_refs)."""
    def status(key: str) -> int:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise AssertionError(f"no {key} for {pid}")

    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    work()
    return status("VmHWM") - before


def test_bodies_of_unknown_senders_are_not_held(hub, world):
    """The hub read every request body whole (up to tornado's 100 MiB) before anything
    knew who sent it, on every route: four anonymous 60 MiB POSTs at once took the hub
    from about 170 to over 400 MB, and a few more would exhaust the machine. Now a body
    a handler would read whole is dropped as it arrives past 1 MiB and answered with a
    413 in words; streamed uploads authenticate before they keep anything."""
    big = 60 * 2**20
    sid = world.session
    targets = [
        ("/hub/login", {}),                               # JupyterHub's own form
        ("/hub/api/users", {}),                           # JupyterHub's own API
        (PREFIX + "/sessions", {"Content-Type": "application/json"}),  # ours
        (PREFIX + f"/session/{sid}/upload",               # streamed: refused before kept
         {"Content-Type": "multipart/form-data; boundary=x"}),
    ]
    answers: dict[str, requests.Response] = {}

    def send_all():
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(len(targets) + 1) as pool:
            futs = {pool.submit(requests.post, hub.base + path, data=b"\0" * big,
                                headers=headers, timeout=120): path
                    for path, headers in targets}

            def chunked():  # no Content-Length: counted as it arrives
                for _ in range(big >> 20):
                    yield b"{" * 2**20
            futs[pool.submit(requests.post, hub.base + PREFIX + "/domains", data=chunked(),
                             timeout=120)] = "chunked"
            for f in concurrent.futures.as_completed(futs):
                answers[futs[f]] = f.result()

    grew = _rss_peak_during(hub.proc.pid, send_all)
    assert grew < 64 * 2**20, f"the hub's peak memory grew by {grew >> 20} MiB"
    for path in ("/hub/login", "/hub/api/users", PREFIX + "/sessions", "chunked"):
        r = answers[path]
        assert r.status_code == 413, (path, r.status_code, r.text[:200])
        assert "request body too large: at most 1 MiB here" in r.json()["message"], r.text
    r = answers[PREFIX + f"/session/{sid}/upload"]
    assert r.status_code == 401, (r.status_code, r.text[:300])
    assert "signature" in r.text.lower() or "credentials" in r.text.lower(), r.text
    # The hub still answers, and a signed caller's upload is gathered past 1 MiB: bob's
    # session is queued, so the answer is about the session, not the body's size.
    r = world.bob("POST", f"/session/{sid}/upload",
                  files={"src": ("data.bin", os.urandom(3 * 2**20))})
    assert r.status_code == 400, r.text
    assert "bobsess" in r.json()["detail"] and "too large" not in r.text
    # and past its own bound it is a 400 in words, with nothing kept
    r = world.bob("POST", f"/session/{sid}/upload",
                  files={"src": ("data.bin", b"\0" * (66 * 2**20))})
    assert r.status_code == 400 and "at most 64 MiB per upload" in r.json()["detail"], r.text
