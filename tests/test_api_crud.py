"""CRUD of every entity through the admin API, pagination, filters, problem+json errors,
secrets shown once, and bad input refused with a 400 that names the field and creates nothing."""

from __future__ import annotations

import uuid

import pytest
import requests

from . import api_world
from .api_world import PASSWORD, Client, new_user, snapshot, superadmin

api_hub = api_world.api_hub  # the module's hub fixture
FAR = "2100-01-01T00:00:00Z"


def uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def sa(api_hub) -> Client:
    return superadmin(api_hub)


def hub_api(hub, method, path, **kw):
    return hub.api(method, path, **kw)


def problem(r: requests.Response, status: int, *words: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["Content-Type"].startswith("application/problem+json"), r.headers
    body = r.json()
    assert body["type"] == "about:blank" and body["status"] == status and body["title"]
    for w in words:
        assert w in body["detail"], (w, body["detail"])
    return body


def test_whoami(sa):
    me = sa.ok("GET", "/whoami")
    assert me["role"] == "superadmin" and me["user"]["username"] == "admin"
    assert me["domain"]["name"] == "default" and me["keypair"] is None
    assert [p["name"] for p in me["projects"]] == ["default"]
    assert "password" not in me["user"]


def test_domain_crud(sa):
    name = f"dom-{uid()}"
    d = sa.ok("POST", "/domains", json={"name": name, "description": "research",
                                        "total_resource_slots": {"cpu": 4, "mem": "8g"}})
    assert d["total_resource_slots"] == {"cpu": "4", "mem": str(8 * 2**30)}
    assert sa.ok("GET", f"/domains/{name}")["description"] == "research"
    problem(sa("POST", "/domains", json={"name": name}), 409, "exists")
    d = sa.ok("PATCH", f"/domains/{name}", json={"is_active": False,
                                                 "allowed_docker_registries": ["cr.example"]})
    assert d["is_active"] is False and d["allowed_docker_registries"] == ["cr.example"]
    assert name in [x["name"] for x in sa.ok("GET", "/domains", params={"is_active": "false"})["items"]]
    assert name not in [x["name"] for x in sa.ok("GET", "/domains", params={"is_active": "true"})["items"]]
    sa.ok("DELETE", f"/domains/{name}")
    problem(sa("GET", f"/domains/{name}"), 404, name)
    problem(sa("DELETE", "/domains/default"), 409, "default")


def test_project_crud_mirrors_hub_groups(sa, api_hub):
    dom = f"dom-{uid()}"
    sa.ok("POST", "/domains", json={"name": dom})
    p = sa.ok("POST", "/projects", json={"name": "ml", "domain_name": dom,
                                         "total_resource_slots": {"cuda.device": 2}})
    assert p["domain_name"] == dom and p["total_resource_slots"] == {"cuda.device": "2"}
    assert hub_api(api_hub, "GET", f"/groups/{dom}:ml").status_code == 200
    problem(sa("POST", "/projects", json={"name": "ml", "domain_name": dom}), 409, "exists")
    u = new_user(sa, domain=dom, projects=[])
    added = sa.ok("POST", f"/projects/{p['id']}/members", 200, json={"user_ids": [u["id"]]})
    assert added["added"] == [u["username"]] and u["id"] in added["user_ids"]
    assert hub_api(api_hub, "GET", f"/groups/{dom}:ml").json()["users"] == [u["username"]]
    members = sa.ok("GET", f"/projects/{p['id']}/members")
    assert [m["id"] for m in members["items"]] == [u["id"]] and members["total"] == 1
    # Members come from the project's domain only.
    problem(sa("POST", f"/projects/{p['id']}/members",
               json={"user_ids": [sa.ok("GET", "/whoami")["user"]["id"]]}), 400, "domain")
    renamed = sa.ok("PATCH", f"/projects/{p['id']}", json={"name": "ml2", "description": "d"})
    assert renamed["name"] == "ml2" and renamed["description"] == "d"
    assert hub_api(api_hub, "GET", f"/groups/{dom}:ml").status_code == 404
    assert hub_api(api_hub, "GET", f"/groups/{dom}:ml2").json()["users"] == [u["username"]]
    sa.ok("DELETE", f"/projects/{p['id']}/members/{u['id']}")
    assert hub_api(api_hub, "GET", f"/groups/{dom}:ml2").json()["users"] == []
    problem(sa("DELETE", f"/projects/{p['id']}/members/{u['id']}"), 404, "not a member")
    assert sa.ok("GET", "/projects", params={"domain": dom, "name": "ml2"})["total"] == 1
    sa.ok("DELETE", f"/projects/{p['id']}")
    problem(sa("GET", f"/projects/{p['id']}"), 404)
    assert hub_api(api_hub, "GET", f"/groups/{dom}:ml2").status_code == 404


def test_user_crud_roles_follow_hub_admin(sa, api_hub):
    name = f"u-{uid()}"
    u = sa.ok("POST", "/users", json={"email": f"{name}@example.com", "password": PASSWORD,
                                      "username": name, "full_name": "Ursula"})
    assert u["role"] == "user" and u["domain_name"] == "default" and u["status"] == "active"
    assert len(u["keypair"]["secret_key"]) == 40 and u["keypair"]["access_key"].startswith("AKIA")
    got = sa.ok("GET", f"/users/{u['id']}")
    assert "keypair" not in got and "password" not in got and got["full_name"] == "Ursula"
    problem(sa("POST", "/users", json={"email": f"{name}@example.com", "password": PASSWORD}),
            409, "exists")
    # Log in once so that the hub knows the account, then promote and demote.
    assert api_hub.login(u["email"], PASSWORD).last_login.status_code == 200
    assert hub_api(api_hub, "GET", f"/users/{name}").json()["admin"] is False
    assert sa.ok("PATCH", f"/users/{u['id']}", json={"role": "superadmin"})["role"] == "superadmin"
    assert hub_api(api_hub, "GET", f"/users/{name}").json()["admin"] is True
    kps = sa.ok("GET", "/keypairs", params={"user_id": u["id"]})["items"]
    assert [k["is_admin"] for k in kps] == [True]
    sa.ok("PATCH", f"/users/{u['id']}", json={"role": "user", "password": "new-pass-456"})
    assert hub_api(api_hub, "GET", f"/users/{name}").json()["admin"] is False
    assert api_hub.login(u["email"], "new-pass-456").last_login.status_code == 200
    for params in ({"email": u["email"]}, {"role": "user", "email": u["email"]},
                   {"status": "active", "email": u["email"]}, {"domain": "default", "email": u["email"]}):
        assert [x["id"] for x in sa.ok("GET", "/users", params=params)["items"]] == [u["id"]]
    assert sa.ok("GET", "/users", params={"role": "monitor", "email": u["email"]})["total"] == 0
    default_project = sa.ok("GET", "/projects", params={"domain": "default", "name": "default"})
    pid = default_project["items"][0]["id"]
    assert u["id"] in [x["id"] for x in sa.ok("GET", "/users", params={"project": pid,
                                                                        "limit": 500})["items"]]
    problem(sa("PATCH", f"/users/{sa.ok('GET', '/whoami')['user']['id']}",
               json={"role": "user"}), 409, "your own")
    assert "default:default" in hub_api(api_hub, "GET", f"/users/{name}").json()["groups"]
    sa.ok("DELETE", f"/users/{u['id']}")
    problem(sa("GET", f"/users/{u['id']}"), 404)
    assert sa.ok("GET", "/keypairs", params={"user_id": u["id"]})["total"] == 0
    # Identity by id: the hub's account goes with the user (groups, tokens, cookies).
    assert hub_api(api_hub, "GET", f"/users/{name}").status_code == 404


def test_an_email_is_one_account_whatever_the_case_of_its_letters(sa, api_hub):
    """``Carol@Example.COM`` and ``carol@example.com`` are one mailbox: one account to log
    in with, find and share with, and never a second account (with its own keypair)."""
    tag = uid()
    given = f"Carol.{tag.upper()}@Example.COM"
    u = sa.ok("POST", "/users", json={"email": given, "password": PASSWORD,
                                      "username": f"carol-{tag}"})
    assert u["email"] == given  # stored as given
    before = snapshot(api_hub)
    for variant in (given.lower(), given.upper(), given.swapcase()):
        problem(sa("POST", "/users", json={"email": variant, "password": PASSWORD,
                                           "username": f"other-{uid()}"}), 409, "exists")
    assert snapshot(api_hub) == before  # no second user, no keypair
    for variant in (given, given.lower(), given.upper()):
        assert api_hub.login(variant, PASSWORD).last_login.status_code == 200, variant
    assert api_hub.login(given.lower(), "wrong-password").last_login.status_code == 403
    assert [x["id"] for x in sa.ok("GET", "/users", params={"email": given.lower()})["items"]] == [
        u["id"]]
    other = new_user(sa)
    problem(sa("PATCH", f"/users/{other['id']}", json={"email": given.upper()}), 409, "exists")
    # The owner may change the case of their own address.
    assert sa.ok("PATCH", f"/users/{u['id']}", json={"email": given.lower()})["email"] == given.lower()
    # Sharing a folder by the address in other letters reaches the same account.
    f = other["client"].ok("POST", "/vfolders", json={"name": f"case-{tag}"})
    share = other["client"].ok("POST", f"/vfolders/{f['id']}/shares",
                               json={"email": given.upper(), "permission": "ro"})
    assert share["user_id"] == u["id"], share


def test_keypair_secret_is_shown_once(sa, api_hub):
    u = new_user(sa)
    c = u["client"]
    kp = c.ok("POST", "/keypairs", json={})
    secret = kp["secret_key"]
    assert len(secret) == 40 and kp["user_id"] == u["id"] and kp["is_default"] is False
    for r in (c("GET", f"/keypairs/{kp['access_key']}"), c("GET", "/keypairs"),
              sa("GET", "/keypairs", params={"limit": 500}), sa("GET", f"/users/{u['id']}")):
        assert r.status_code == 200
        assert secret not in r.text and "secret_key" not in r.text
    assert secret not in u["client"]("GET", "/whoami").text
    # The owner deactivates, may not reactivate; an admin may.
    assert c.ok("PATCH", f"/keypairs/{kp['access_key']}", json={"is_active": False})["is_active"] is False
    problem(c("PATCH", f"/keypairs/{kp['access_key']}", json={"is_active": True}), 403, "is_active")
    assert sa.ok("PATCH", f"/keypairs/{kp['access_key']}",
                 json={"is_active": True, "rate_limit": 77, "is_default": True})["rate_limit"] == 77
    kps = {k["access_key"]: k for k in c.ok("GET", "/keypairs")["items"]}
    assert [a for a, k in kps.items() if k["is_default"]] == [kp["access_key"]]
    assert c.ok("GET", "/keypairs", params={"is_active": "true"})["total"] == 2
    problem(sa("PATCH", f"/keypairs/{kp['access_key']}", json={"resource_policy": "nope"}),
            400, "resource_policy")
    # The main keypair stays until another one is made the main keypair.
    problem(c("DELETE", f"/keypairs/{kp['access_key']}"), 409, "main keypair")
    first = next(a for a in kps if a != kp["access_key"])
    sa.ok("PATCH", f"/keypairs/{first}", json={"is_default": True})
    c.ok("DELETE", f"/keypairs/{kp['access_key']}")
    problem(c("GET", f"/keypairs/{kp['access_key']}"), 404)


@pytest.mark.parametrize("kind", ["keypair", "user", "project"])
def test_resource_policy_crud(sa, kind):
    base = f"/{kind}-resource-policies"
    name = f"pol-{uid()}"
    if kind == "keypair":
        body = {"name": name, "total_resource_slots": {"cpu": "8.5", "mem": "16g"},
                "max_concurrent_sessions": 3, "max_priority": 40, "idle_timeout": 600,
                "max_pending_session_count": 5,
                "max_pending_session_resource_slots": {"cpu": 2}}
    else:
        body = {"name": name, "max_vfolder_count": 7, "max_quota_scope_size": 2**40}
    pol = sa.ok("POST", base, json=body)
    for k, v in body.items():
        if k.endswith("_slots"):
            continue
        assert pol[k] == v
    if kind == "keypair":
        assert pol["total_resource_slots"] == {"cpu": "8.5", "mem": str(16 * 2**30)}
        assert pol["max_pending_session_resource_slots"] == {"cpu": "2"}
        assert sa.ok("PATCH", f"{base}/{name}", json={"max_priority": 10,
                     "max_pending_session_count": None})["max_pending_session_count"] is None
        kp = sa.ok("POST", "/keypairs", json={"resource_policy": name})
        problem(sa("DELETE", f"{base}/{name}"), 409, "in use")
        sa.ok("DELETE", f"/keypairs/{kp['access_key']}")
    else:
        assert sa.ok("PATCH", f"{base}/{name}", json={"max_vfolder_count": 1})["max_vfolder_count"] == 1
    assert name in [p["name"] for p in sa.ok("GET", base)["items"]]
    problem(sa("POST", base, json={"name": name}), 409, "exists")
    sa.ok("DELETE", f"{base}/{name}")
    problem(sa("GET", f"{base}/{name}"), 404, name)
    problem(sa("DELETE", f"{base}/default"), 409, "default")


def test_resource_group_crud(sa):
    name = f"rg-{uid()}"
    g = sa.ok("POST", "/resource-groups", json={
        "name": name, "scheduler": "drf", "is_public": False, "allowed_domains": ["default"],
        "scheduler_opts": {"agent_selector": "dispersed", "pending_timeout": 30}})
    assert g["scheduler"] == "drf" and g["scheduler_opts"]["agent_selector"] == "dispersed"
    problem(sa("PATCH", f"/resource-groups/{name}", json={"scheduler_opts": {"nope": 1}}),
            400, "scheduler_opts")
    problem(sa("PATCH", f"/resource-groups/{name}", json={"allowed_domains": ["no-such"]}),
            400, "allowed_domains")
    problem(sa("PATCH", f"/resource-groups/{name}", json={"scheduler": "random"}), 400, "scheduler")
    assert sa.ok("PATCH", f"/resource-groups/{name}", json={"scheduler": "lifo"})["scheduler"] == "lifo"
    assert sa.ok("GET", f"/resource-groups/{name}")["allowed_domains"] == ["default"]
    sa.ok("DELETE", f"/resource-groups/{name}")
    problem(sa("GET", f"/resource-groups/{name}"), 404)
    problem(sa("DELETE", "/resource-groups/default"), 409)


def test_agents_and_scheduler(sa, api_hub):
    agents = sa.ok("GET", "/agents")
    assert [a["id"] for a in agents["items"]] == [api_hub.agent_id]
    a = sa.ok("GET", f"/agents/{api_hub.agent_id}")
    assert a["backend"] == "local" and a["resource_group"] == "default"
    assert sa.ok("GET", "/agents", params={"resource_group": "nope"})["total"] == 0
    assert "default" in sa.ok("GET", "/scheduler")
    problem(sa("GET", "/agents/nope"), 404)


def test_sessions_through_the_api(sa, api_hub):
    u = new_user(sa)
    c = u["client"]
    body = {"name": "train", "image": api_hub.image, "startup_command": "python train.py",
            "resources": {"cpu": "0.5", "mem": "128m"}, "starts_at": FAR, "priority": 30,
            "batch_timeout": 60}
    s = c.ok("POST", "/sessions", json=body)
    assert s["status"] == "PENDING" and s["type"] == "batch" and s["user_id"] == u["id"]
    assert s["requested_slots"] == {"cpu": "0.5", "mem": str(128 * 2**20)}
    assert s["startup_command"] == "python train.py" and s["priority"] == 30
    assert s["starts_at"].startswith("2100-01-01") and s["batch_timeout"] == 60
    assert s["project_id"] == u["project_ids"][0] and len(s["kernels"]) == 1
    problem(c("POST", "/sessions", json=body), 409, "exists")
    dep = c.ok("POST", "/sessions", json={**body, "name": "eval", "dependencies": [s["id"]]})
    assert dep["dependencies"] == [s["id"]]
    assert c.ok("GET", f"/sessions/{s['id']}")["name"] == "train"
    listed = c.ok("GET", "/sessions", params={"status": "PENDING", "type": "batch"})
    assert sorted(x["id"] for x in listed["items"]) == sorted([s["id"], dep["id"]])
    assert c.ok("GET", "/sessions", params={"type": "interactive"})["total"] == 0
    logs = c.ok("GET", f"/sessions/{s['id']}/logs")
    assert logs["session_id"] == s["id"] and logs["kernels"][0]["logs"] is None
    for bad, word in (({**body, "name": "x1", "type": "interactive"}, "type"),
                      ({k: v for k, v in body.items() if k != "startup_command"}, "startup_command"),
                      ({**body, "name": "x2", "starts_at": "tomorrow"}, "starts_at"),
                      ({**body, "name": "x3", "image": "no/such:image"}, "image"),
                      ({**body, "name": "x4", "dependencies": ["0" * 32]}, "dependency"),
                      ({**body, "name": "x5", "resources": {"cpu": "-1"}}, "cpu"),
                      ({**body, "name": "x6", "resource_group": "nope"}, "resource_group")):
        before = snapshot(api_hub)
        problem(c("POST", "/sessions", json=bad), 400, word)
        assert snapshot(api_hub) == before
    c.ok("DELETE", f"/sessions/{dep['id']}")
    c.ok("DELETE", f"/sessions/{s['id']}")
    assert c.ok("GET", f"/sessions/{s['id']}")["status"] == "CANCELLED"
    assert c.ok("GET", "/sessions", params={"status": "PENDING"})["total"] == 0


def test_pagination(sa):
    dom = f"dom-{uid()}"
    sa.ok("POST", "/domains", json={"name": dom})
    names = sorted(f"p{i}" for i in range(7))
    for n in names:
        sa.ok("POST", "/projects", json={"name": n, "domain_name": dom})
    seen = []
    for offset, size in ((0, 3), (3, 3), (6, 1), (9, 0)):
        page = sa.ok("GET", "/projects", params={"domain": dom, "offset": offset, "limit": 3})
        assert (page["total"], page["offset"], page["limit"]) == (7, offset, 3)
        assert len(page["items"]) == size
        seen += [p["name"] for p in page["items"]]
    assert seen == names
    assert sa.ok("GET", "/projects", params={"domain": dom})["limit"] == 50
    for params, word in (({"limit": 0}, "limit"), ({"limit": 501}, "limit"),
                         ({"offset": -1}, "offset"), ({"limit": "ten"}, "limit"),
                         ({"offset": "1.5"}, "offset"), ({"colour": "red"}, "colour"),
                         ({"is_active": "yes"}, "is_active")):
        problem(sa("GET", "/projects", params=params), 400, word)
    problem(sa("GET", "/projects?limit=1&limit=2"), 400, "more than once")
    problem(sa("GET", "/users", params={"role": "king"}), 400, "role")
    problem(sa("GET", "/whoami", params={"x": 1}), 400, "takes none")


BAD_BODIES = [
    ("/domains", b"{not json", "malformed JSON"),
    ("/domains", b"[1, 2]", "JSON object"),
    ("/domains", b"", "body is required"),
    ("/domains", b'{"name": "d-nan", "total_resource_slots": {"cpu": NaN}}', "malformed JSON"),
    ("/domains", {"name": "d1", "colour": "red"}, "colour"),
    ("/domains", {"description": "no name"}, "name"),
    ("/domains", {"name": 5}, "name"),
    ("/domains", {"name": "bad name!"}, "name"),
    ("/domains", {"name": "d2", "is_active": "yes"}, "is_active"),
    ("/domains", {"name": "d3", "total_resource_slots": {"disk": 1}}, "total_resource_slots"),
    ("/domains", {"name": "d4", "total_resource_slots": {"cpu": "lots"}}, "cpu"),
    ("/domains", {"name": "d5", "description": "nul\x00byte"}, "description"),
    ("/projects", {"name": "p1", "domain_name": "no-such-domain"}, "domain_name"),
    ("/projects", {"name": "p2", "resource_policy": "no-such"}, "resource_policy"),
    ("/users", {"email": "not-an-email", "password": PASSWORD}, "email"),
    ("/users", {"email": "short@example.com", "password": "short"}, "password"),
    ("/users", {"email": "r@example.com", "password": PASSWORD, "role": "king"}, "role"),
    ("/users", {"email": "p@example.com", "password": PASSWORD, "project_ids": ["nope"]},
     "project_ids"),
    ("/users", {"email": "u@example.com", "password": PASSWORD, "username": "Bad Name"}, "username"),
    ("/keypair-resource-policies", {"name": "k1", "max_priority": 101}, "max_priority"),
    ("/keypair-resource-policies", {"name": "k2", "max_concurrent_sessions": 2.0},
     "max_concurrent_sessions"),
    ("/keypair-resource-policies", {"name": "k3", "idle_timeout": 2**40}, "idle_timeout"),
    ("/user-resource-policies", {"name": "u1", "max_vfolder_count": True}, "max_vfolder_count"),
    ("/resource-groups", {"name": "g1", "allowed_projects": ["nope"]}, "allowed_projects"),
    ("/keypairs", {"user_id": "nope"}, "nope"),
    ("/vfolders", {"name": 5}, "name"),
    ("/vfolders", {"name": "-dash"}, "name"),
    ("/vfolders", {"name": "v1", "permission": "all"}, "permission"),
    ("/vfolders", {"name": "v2", "usage_mode": "fun"}, "usage_mode"),
    ("/vfolders", {"name": "v3", "host": "nowhere"}, "host"),
    ("/vfolders", {"name": "v4", "project": "no-such-project"}, "project"),
    ("/vfolders", {"name": "v5", "owner": "someone"}, "owner"),
    ("/sessions", {"name": "s1", "image": "local/python", "startup_command": "true",
                   "mounts": "data"}, "mounts"),
    ("/sessions", {"name": "s2", "image": "local/python", "startup_command": "true",
                   "mounts": ["x"] * 65}, "mounts"),
]


@pytest.mark.parametrize("path,body,word", BAD_BODIES,
                         ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(BAD_BODIES)])
def test_bad_input_is_400_and_creates_nothing(sa, api_hub, path, body, word):
    before = snapshot(api_hub)
    if isinstance(body, bytes):
        r = sa("POST", path, data=body, headers={"Content-Type": "application/json"})
    else:
        r = sa("POST", path, json=body)
    expected = 404 if path == "/keypairs" else 400
    problem(r, expected, word)
    assert snapshot(api_hub) == before


def test_errors_are_problem_json(sa, api_hub):
    problem(Client(api_hub, None)("GET", "/domains"), 401, "credentials")
    problem(sa("GET", "/no-such-endpoint"), 404, "no endpoint")
    problem(sa("PUT", "/domains"), 405)
    problem(sa("GET", "/users/" + "0" * 32), 404, "no user")
    problem(sa("POST", "/domains", json={"name": "default"}), 409, "exists")
    r = requests.get(api_hub.base + api_world.PREFIX + "/openapi.json", timeout=30)
    assert r.status_code == 200 and r.json()["openapi"].startswith("3.1")


def test_running_batch_session_logs_are_live_then_kept(sa, api_hub):
    """GET /sessions/{id}/logs reads the agent while the kernel runs, the kept tail after."""
    import time

    u = new_user(sa)
    c = u["client"]
    s = c.ok("POST", "/sessions", json={
        "name": "live", "image": api_hub.image, "resources": {"cpu": "0.25", "mem": "128m"},
        "startup_command": "echo first-line; sleep 60"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = c.ok("GET", f"/sessions/{s['id']}/logs")
        if logs["status"] == "RUNNING" and "first-line" in (logs["kernels"][0]["logs"] or ""):
            break
        assert logs["status"] in ("PENDING", "SCHEDULED", "PREPARING", "CREATING", "RUNNING"), logs
        time.sleep(0.2)
    else:
        raise AssertionError(f"no live output: {logs}")
    c.ok("DELETE", f"/sessions/{s['id']}")
    done = c.ok("GET", f"/sessions/{s['id']}")
    assert done["status"] not in ("RUNNING", "PENDING")
    assert "first-line" in c.ok("GET", f"/sessions/{s['id']}/logs")["kernels"][0]["logs"]
