"""Attacks across the tenant boundary (issue 10, rows 5, 7, 8, 9, 12, 14; issue 9 item 7),
each performed against a real hub (local backend, SQLite and PostgreSQL) and shown refused.

One decides (``manager/access.py``): the admin API, the manager's enqueue (every path
that starts a session: the spawn form, JupyterHub's REST API, the admin API, batch),
mounts and the authenticator's ``refresh_user`` all ask it.
"""

from __future__ import annotations

import uuid

import pytest
import requests

from jupyterhub_backendai.models import Session

from . import api_world
from .api_world import PASSWORD, Client, new_user, park_session, superadmin

api_hub = api_world.api_hub  # the module's hub fixture (SQLite and PostgreSQL)
FAR = "2100-01-01T00:00:00+00:00"


def uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def sa(api_hub) -> Client:
    c = superadmin(api_hub)
    c.ok("POST", "/resource-groups", json={"name": "parked"})  # no agents: sessions stay
    return c


def problem(r: requests.Response, status: int, *fragments: str) -> dict:
    assert r.status_code == status, (status, r.status_code, r.text)
    body = r.json()
    for f in fragments:
        assert f in body["detail"], (f, body["detail"])
    return body


def future_session(client: Client, **extra) -> requests.Response:
    body = {"name": f"s-{uid()}", "image": "local/python", "startup_command": "true",
            "starts_at": FAR, "resources": {"cpu": "0.1", "mem": "64m"}, **extra}
    return client("POST", "/sessions", json=body)


def main_key(sa: Client, user: dict) -> dict:
    keys = sa.ok("GET", "/keypairs", params={"user_id": user["id"]})["items"]
    return next(k for k in keys if k["is_default"])


def session_row(hub, sid: str) -> Session:
    with hub.sm() as s:
        row = s.get(Session, sid)
        s.expunge(row)
        return row


# -- row 5: limits attach to the user, not to a key the user can mint ---------------------


def test_minted_keypair_cannot_escape_the_main_keypairs_policy(sa, api_hub):
    pol = sa.ok("POST", "/keypair-resource-policies", json={
        "name": f"tight-{uid()}", "max_concurrent_sessions": 1, "max_pending_session_count": 1,
    })["name"]
    u = new_user(sa)
    main = main_key(sa, u)
    sa.ok("PATCH", f"/keypairs/{main['access_key']}", json={"resource_policy": pol,
                                                            "rate_limit": 7})
    me = u["client"]
    # The attack: mint a keypair (it used to get policy "default"), deactivate the tight one.
    minted = me.ok("POST", "/keypairs", json={})
    assert (minted["resource_policy"], minted["rate_limit"], minted["is_default"]) == (pol, 7, False)
    problem(me("POST", "/keypairs", json={"resource_policy": "default"}), 403,
            "resource_policy", "main keypair")
    problem(me("PATCH", f"/keypairs/{main['access_key']}", json={"is_active": False}), 409,
            "main keypair")
    problem(me("DELETE", f"/keypairs/{main['access_key']}"), 409, "main keypair")
    assert main_key(sa, u)["is_active"] is True
    # Deactivating the minted one is the owner's right; it changes nothing about the limits.
    me.ok("PATCH", f"/keypairs/{minted['access_key']}", json={"is_active": False})
    first = future_session(me)
    assert first.status_code == 201, first.text
    problem(future_session(me), 412, "max_pending_session_count", "1 of 1 pending")


def test_a_default_pending_limit_stops_unbounded_queues(sa, api_hub):
    fresh = sa.ok("POST", "/keypair-resource-policies", json={"name": f"fresh-{uid()}"})
    assert fresh["max_pending_session_count"] == 30
    assert sa.ok("GET", "/keypair-resource-policies/default")["max_pending_session_count"] == 30
    u = new_user(sa)
    sa.ok("PATCH", f"/keypairs/{main_key(sa, u)['access_key']}",
          json={"resource_policy": fresh["name"]})
    codes = [future_session(u["client"]).status_code for _ in range(31)]
    assert codes == [201] * 30 + [412]


def test_project_groups_are_unambiguous(sa, api_hub):
    tag = uid()
    sa.ok("POST", "/domains", json={"name": f"x{tag}.y"})
    sa.ok("POST", "/domains", json={"name": f"x{tag}"})
    sa.ok("POST", "/projects", json={"name": "z", "domain_name": f"x{tag}.y"})
    sa.ok("POST", "/projects", json={"name": "y.z", "domain_name": f"x{tag}"})
    groups = {g["name"] for g in api_hub.api("GET", "/groups").json()}
    assert {f"x{tag}.y:z", f"x{tag}:y.z"} <= groups


# -- row 12: a domain admin never acts on superadmins' objects, nobody raises their limits --


@pytest.fixture(scope="module")
def dom(sa):
    """A domain with two projects, an admin (member of the first), a superadmin in it."""
    name = f"dom-{uid()}"
    sa.ok("POST", "/domains", json={"name": name,
                                     "allowed_vfolder_hosts": {"local:volume1": ["create-vfolder",
                                                                                 "mount-in-session",
                                                                                 "upload-file",
                                                                                 "download-file"]}})
    own = sa.ok("POST", "/projects", json={"name": "own", "domain_name": name})["id"]
    other = sa.ok("POST", "/projects", json={"name": "other", "domain_name": name})["id"]
    admin = new_user(sa, role="admin", domain=name, projects=[own])
    boss = new_user(sa, role="superadmin", domain=name, projects=[own])
    return {"name": name, "own": own, "other": other, "admin": admin, "boss": boss}


def test_domain_admin_keeps_off_superadmins_objects(sa, api_hub, dom):
    """A superadmin's sessions, folders and keypairs are the installation's: an admin (or
    monitor) of the superadmin's domain neither acts on them nor sees them, in lists or
    by id (issue 22, row 9: they listed the superadmin's access keys)."""
    ad, boss = dom["admin"]["client"], dom["boss"]
    monitor = new_user(sa, role="monitor", domain=dom["name"], projects=[dom["own"]])["client"]
    sid = park_session(api_hub, boss)
    folder = boss["client"].ok("POST", "/vfolders", json={"name": f"f-{uid()}"})
    keys = {k["access_key"] for k in sa.ok("GET", "/keypairs", params={"limit": 500})["items"]
            if k["user_id"] == boss["id"]}
    assert keys
    for reader in (ad, monitor):
        problem(reader("GET", f"/sessions/{sid}"), 404)
        problem(reader("GET", f"/sessions/{sid}/logs"), 404)
        problem(reader("GET", f"/vfolders/{folder['id']}"), 404)
        for key in keys:
            problem(reader("GET", f"/keypairs/{key}"), 404)
        listed = reader.ok("GET", "/sessions", params={"limit": 500})["items"]
        assert sid not in {s["id"] for s in listed}
        listed = reader.ok("GET", "/vfolders", params={"limit": 500})["items"]
        assert folder["id"] not in {f["id"] for f in listed}
        listed = reader.ok("GET", "/keypairs", params={"limit": 500})["items"]
        assert not keys & {k["access_key"] for k in listed}
        assert boss["id"] not in {k["user_id"] for k in listed}
    problem(ad("DELETE", f"/sessions/{sid}"), 404)
    assert session_row(api_hub, sid).status == "PENDING"
    problem(ad("PATCH", f"/vfolders/{folder['id']}", json={"name": "stolen"}), 404)
    problem(ad("DELETE", f"/vfolders/{folder['id']}"), 404)
    assert sa.ok("GET", f"/vfolders/{folder['id']}")["name"] == folder["name"]
    # The domain's own objects stay visible to them.
    plain = new_user(sa, domain=dom["name"], projects=[dom["own"]])
    mine = park_session(api_hub, plain)
    assert mine in {s["id"] for s in ad.ok("GET", "/sessions", params={"limit": 500})["items"]}
    assert plain["id"] in {k["user_id"] for k in ad.ok("GET", "/keypairs",
                                                        params={"limit": 500})["items"]}
    # Their own domain's ordinary users' objects remain theirs to manage.
    ad.ok("DELETE", f"/sessions/{mine}")


def test_nobody_raises_their_own_limits(sa, api_hub, dom):
    ad, me = dom["admin"]["client"], dom["admin"]
    key = main_key(sa, me)["access_key"]
    problem(ad("PATCH", f"/keypairs/{key}", json={"rate_limit": 100000}), 403, "your own limits")
    problem(ad("PATCH", f"/keypairs/{key}", json={"resource_policy": "default"}), 403,
            "your own limits")
    problem(ad("POST", "/keypairs", json={"rate_limit": 100000}), 403, "rate_limit")
    big = sa.ok("POST", "/user-resource-policies", json={"name": f"big-{uid()}"})["name"]
    problem(ad("PATCH", f"/users/{me['id']}", json={"resource_policy": big}), 403,
            "your own limits")
    problem(ad("PATCH", f"/projects/{dom['own']}", json={"total_resource_slots": {"cpu": 999}}),
            403, "member of")
    # The level below is theirs to set: a project they are not in, another user's keypair.
    ad.ok("PATCH", f"/projects/{dom['other']}", json={"total_resource_slots": {"cpu": 4}})
    plain = new_user(sa, domain=dom["name"], projects=[dom["own"]])
    ad.ok("PATCH", f"/keypairs/{main_key(sa, plain)['access_key']}", json={"rate_limit": 50})


def test_refusals_name_the_action(sa, dom):
    u = new_user(sa, domain=dom["name"], projects=[dom["own"]])
    problem(u["client"]("POST", "/users", json={"email": f"n{uid()}@example.com",
                                                "password": PASSWORD}),
            403, f"you may not create users in domain {dom['name']!r}")
    problem(u["client"]("POST", "/keypair-resource-policies", json={"name": f"p{uid()}"}),
            403, "you may not create keypair resource policies")


# -- row 7: identity by id --------------------------------------------------------------


def test_deleted_user_leaves_nothing_to_a_namesake(sa, api_hub):
    name = f"eve-{uid()}"
    old = new_user(sa, name=name)
    cookie = api_hub.login(old["email"], PASSWORD)
    ended = park_session(api_hub, old)
    sa.ok("DELETE", f"/sessions/{ended}")
    sa.ok("DELETE", f"/users/{old['id']}")
    assert api_hub.api("GET", f"/users/{name}").status_code == 404
    dom = f"dom-{uid()}"
    sa.ok("POST", "/domains", json={"name": dom})
    sa.ok("POST", "/users", json={"email": f"{name}@other.example", "password": PASSWORD,
                                  "username": name, "domain_name": dom})
    # The old token and cookie are nothing now; the namesake has no sessions of the old one.
    assert api_hub.api("GET", "/user", token=old["token"]).status_code == 403
    problem(Client(api_hub, old["token"])("GET", "/whoami"), 401)
    r = cookie.get(api_hub.base + "/hub/api/user")
    assert r.status_code == 403, r.text
    new = api_hub.login(f"{name}@other.example", PASSWORD)
    assert new.last_login.status_code == 200
    token = api_hub.token_for(new, name)
    assert Client(api_hub, token).ok("GET", "/sessions")["total"] == 0


# -- row 8: deactivation takes effect everywhere at once ---------------------------------


def test_deactivated_domain_ends_everything(sa, api_hub):
    dom = f"dom-{uid()}"
    sa.ok("POST", "/domains", json={"name": dom})
    pid = sa.ok("POST", "/projects", json={"name": "p", "domain_name": dom})["id"]
    u = new_user(sa, domain=dom, projects=[pid])
    cookie = api_hub.login(u["email"], PASSWORD)
    batch = park_session(api_hub, u)
    sa.ok("PATCH", f"/domains/{dom}", json={"is_active": False})
    row = session_row(api_hub, batch)
    assert row.status == "CANCELLED" and row.status_info == f"ended: the domain {dom!r} was deactivated"
    # Tokens and cookies stop working, on JupyterHub's API and ours.
    assert api_hub.api("GET", "/user", token=u["token"]).status_code == 403
    problem(u["client"]("GET", "/whoami"), 401)
    assert cookie.get(api_hub.base + "/hub/api/user").status_code == 403
    # No new sessions through JupyterHub's REST API (even an admin's spawn for them) ...
    r = api_hub.spawn(u["username"], "")
    assert r.status_code == 403, r.text
    # ... nor a fresh login.
    assert api_hub.login(u["email"], PASSWORD).last_login.status_code == 403
    sa.ok("PATCH", f"/domains/{dom}", json={"is_active": True})


def test_deactivated_project_starts_nothing_and_ends_its_sessions(sa, api_hub):
    dom = f"dom-{uid()}"
    sa.ok("POST", "/domains", json={"name": dom})
    pid = sa.ok("POST", "/projects", json={"name": "p", "domain_name": dom})["id"]
    u = new_user(sa, domain=dom, projects=[pid])
    batch = park_session(api_hub, u)
    sa.ok("PATCH", f"/projects/{pid}", json={"is_active": False})
    assert session_row(api_hub, batch).status_info == "ended: the project 'p' was deactivated"
    problem(future_session(u["client"], project=pid), 403, "no new sessions",
            "the project 'p' is not active")


def test_deactivated_user_is_cut_off(sa, api_hub):
    u = new_user(sa)
    batch = park_session(api_hub, u)
    sa.ok("PATCH", f"/users/{u['id']}", json={"status": "inactive"})
    assert session_row(api_hub, batch).status_info == f"ended: the account {u['username']!r} is inactive"
    assert api_hub.api("GET", "/user", token=u["token"]).status_code == 403
    assert api_hub.spawn(u["username"], "").status_code == 403


# -- issue 9 item 7: JupyterHub's "Add Users" makes real users ----------------------------


def test_hub_add_users_makes_backendai_users_without_a_password(sa, api_hub):
    name = f"dave-{uid()}"
    r = api_hub.api("POST", "/users", json={"usernames": [name]})
    assert r.status_code == 201, r.text
    found = sa.ok("GET", "/users", params={"email": f"{name}@localhost"})["items"]
    assert [(x["username"], x["domain_name"], x["need_password_change"]) for x in found] == [
        (name, "default", True)]
    default = sa.ok("GET", "/projects", params={"domain": "default", "name": "default"})["items"]
    assert found[0]["project_ids"] == [default[0]["id"]]
    # No password until one is set: nothing logs in, not even the empty-looking ones.
    for guess in ("!", "password", name):
        assert api_hub.login(name, guess).last_login.status_code == 403
    sa.ok("PATCH", f"/users/{found[0]['id']}", json={"password": PASSWORD})
    assert api_hub.login(name, PASSWORD).last_login.status_code == 200
    bad = api_hub.api("POST", "/users", json={"usernames": ["tilde~user"]})
    assert bad.status_code == 400 and "not a valid Backend.AI user name" in bad.text
    assert api_hub.api("GET", "/users/tilde~user").status_code == 404
