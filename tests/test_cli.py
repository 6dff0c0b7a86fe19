"""``backendai-admin`` as an API client of a running hub (signed requests), and its bootstrap part.

API commands are run in-process through ``main(argv)`` (fast) and, once, as the
installed ``backendai-admin`` program configured from the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from jupyterhub_backendai import cli

from .test_signing import hub_for


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def hub(request, tmp_path_factory):
    yield from hub_for(request, tmp_path_factory, request.param)


class Admin:
    """Runs the CLI against the hub with one keypair; returns (exit status, JSON or stderr)."""

    def __init__(self, hub, capsys, keys=None):
        self.hub, self.capsys = hub, capsys
        self.ak, self.sk = keys or hub.admin_keys

    def __call__(self, *argv: str, keys=None):
        ak, sk = keys or (self.ak, self.sk)
        self.capsys.readouterr()
        rc = cli.main(["--endpoint", self.hub.base + "/", "--access-key", ak, f"--secret-key={sk}",
                       # A database the client must never touch (it is not a second path).
                       "--db", "sqlite:////nonexistent/dir/never.sqlite", *argv])
        out, err = self.capsys.readouterr()
        if rc == 0:
            return rc, json.loads(out)
        assert out == ""
        return rc, err.strip()

    def ok(self, *argv: str, keys=None):
        rc, out = self(*argv, keys=keys)
        assert rc == 0, out
        return out


@pytest.fixture
def admin(hub, capsys):
    return Admin(hub, capsys)


def test_tenancy_through_the_api(admin):
    dom = "d" + uuid.uuid4().hex[:8]
    assert admin.ok("domains", "create", f"name={dom}", "description=made by the CLI")["name"] == dom
    pj = admin.ok("projects", "create", "name=research", f"domain_name={dom}")
    assert (pj["name"], pj["domain_name"]) == ("research", dom)
    user = admin.ok("users", "create", f"email=carol@{dom}.example", "password=carol-pass-1",
                    "username=carol" + dom, f"domain_name={dom}", f"project_ids:=[\"{pj['id']}\"]")
    assert user["domain_name"] == dom and user["project_ids"] == [pj["id"]]
    first = user["keypair"]
    assert first["access_key"].startswith("AKIA") and len(first["secret_key"]) == 40
    kp = admin.ok("keypairs", "create", f"user_id={user['id']}", "rate_limit:=5000")
    assert kp["user_id"] == user["id"] and kp["rate_limit"] == 5000 and kp["secret_key"]

    # The new user's keys work for the CLI too.
    me = admin.ok("whoami", keys=(kp["access_key"], kp["secret_key"]))
    assert me["user"]["email"] == f"carol@{dom}.example"
    assert me["keypair"] == kp["access_key"]

    # Lists, filters, pagination.
    listed = admin.ok("users", "list", "--domain", dom)
    assert [u["id"] for u in listed["items"]] == [user["id"]] and listed["total"] == 1
    kps = admin.ok("keypairs", "list", "--user-id", user["id"], "--limit", "1")
    assert kps["total"] == 2 and len(kps["items"]) == 1 and kps["limit"] == 1
    every = admin.ok("keypairs", "list", "--user-id", user["id"], "--all")
    assert {k["access_key"] for k in every["items"]} == {first["access_key"], kp["access_key"]}
    assert all("secret_key" not in k for k in every["items"])
    members = admin.ok("projects", "members", pj["id"])
    assert [m["id"] for m in members["items"]] == [user["id"]]

    # Get and update by email, membership changes, deactivation.
    got = admin.ok("users", "get", f"carol@{dom}.example")
    assert got["id"] == user["id"]
    admin.ok("projects", "remove-members", pj["id"], f"carol@{dom}.example")
    assert admin.ok("projects", "members", pj["id"])["total"] == 0
    changed = admin.ok("projects", "add-members", pj["id"], user["id"])
    assert changed["user_ids"] == [user["id"]]
    assert admin.ok("users", "update", user["id"], "full_name=Carol C.")["full_name"] == "Carol C."
    off = admin.ok("keypairs", "update", kp["access_key"], "is_active:=false")
    assert off["is_active"] is False
    rc, err = admin("whoami", keys=(kp["access_key"], kp["secret_key"]))
    assert rc == cli.EXIT_API_ERROR
    assert err == f"backendai-admin: 401 Unauthorized: keypair {kp['access_key']} is inactive"

    # Delete: gone afterwards.
    assert admin.ok("keypairs", "delete", kp["access_key"]) == {"deleted": kp["access_key"]}
    rc, err = admin("keypairs", "get", kp["access_key"])
    assert rc == 1 and err.startswith("backendai-admin: 404 Not found")


def test_policies_and_resource_groups(admin):
    name = "p" + uuid.uuid4().hex[:8]
    pol = admin.ok("keypair-resource-policies", "create", f"name={name}",
                   "max_concurrent_sessions:=2", 'total_resource_slots:={"cpu": "4", "mem": "8g"}')
    assert pol["max_concurrent_sessions"] == 2
    assert admin.ok("keypair-resource-policies", "get", name)["name"] == name
    upd = admin.ok("keypair-resource-policies", "update", name, "idle_timeout:=600")
    assert upd["idle_timeout"] == 600
    names = [p["name"] for p in admin.ok("keypair-resource-policies", "list", "--all")["items"]]
    assert name in names and "default" in names
    admin.ok("keypair-resource-policies", "delete", name)
    assert admin("keypair-resource-policies", "get", name)[0] == 1

    rg = admin.ok("resource-groups", "create", f"name={name}", "is_public:=false")
    assert rg["is_public"] is False
    assert name in [g["name"] for g in admin.ok("resource-groups", "list", "--all")["items"]]
    admin.ok("resource-groups", "delete", name)
    assert admin.ok("agents", "list")["total"] >= 1  # the hub's embedded agent
    assert admin.ok("sessions", "list", "--status", "RUNNING")["items"] == []
    assert isinstance(admin.ok("scheduler"), dict)
    assert admin.ok("openapi")["openapi"].startswith("3.")
    assert admin.ok("api", "GET", "/domains", "-q", "is_active=true")["total"] >= 1


def test_errors_exit_non_zero_with_the_problem(admin, hub):
    dom = "e" + uuid.uuid4().hex[:8]
    admin.ok("domains", "create", f"name={dom}")
    rc, err = admin("domains", "create", f"name={dom}")
    assert rc == cli.EXIT_API_ERROR
    assert err.startswith("backendai-admin: 409 Conflict:") and dom in err
    rc, err = admin("domains", "create", f"name={dom}x", "colour=blue")
    assert rc == 1 and "400 Invalid request" in err and "'colour'" in err
    rc, err = admin("domains", "get", "no-such-domain")
    assert rc == 1 and "404" in err
    rc, err = admin("users", "list", "--role", "emperor")
    assert rc == 1 and "400" in err and "role" in err
    rc, err = admin("whoami", keys=(hub.admin_keys[0], "x" * 40))
    assert rc == 1 and "401 Unauthorized: signature mismatch" in err
    rc, err = admin("whoami", keys=("AKIAZZZZZZZZZZZZZZZZ", "x" * 40))
    assert rc == 1 and "unknown access key" in err
    rc, err = admin("users", "create", "email")
    assert rc == 1 and "expected key=value" in err
    rc, err = admin("users", "create", "project_ids:=[oops")
    assert rc == 1 and "must be JSON" in err
    # Nothing was left behind by the refused calls.
    assert admin("domains", "get", dom + "x")[0] == 1


def test_a_user_is_refused_what_only_admins_may_do(admin):
    name = "u" + uuid.uuid4().hex[:8]
    user = admin.ok("users", "create", f"email={name}@example.com", "password=user-pass-1",
                    f"username={name}")
    keys = (user["keypair"]["access_key"], user["keypair"]["secret_key"])
    rc, err = admin("domains", "create", f"name={name}", keys=keys)
    assert rc == 1 and err.startswith("backendai-admin: 403")
    assert admin("domains", "get", name)[0] == 1
    # ... but may manage their own keypairs.
    mine = admin.ok("keypairs", "create", keys=keys)
    assert mine["user_id"] == user["id"]


def test_unreachable_hub_and_missing_keys(capsys):
    rc = cli.main(["--endpoint", "http://127.0.0.1:9/", "--access-key", "AK", "--secret-key",
                   "SK", "whoami"])
    assert rc == cli.EXIT_API_ERROR
    assert "cannot reach http://127.0.0.1:9/hub/api/backendai" in capsys.readouterr().err
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKENDAI_")}
    r = subprocess.run([sys.executable, "-m", "jupyterhub_backendai.cli", "users", "list"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == cli.EXIT_USAGE
    assert "missing --endpoint / BACKENDAI_ENDPOINT" in r.stderr
    rc = cli.main(["--endpoint", "ftp://x/", "--access-key", "a", "--secret-key", "b", "whoami"])
    assert rc == 1 and "not an http(s) URL" in capsys.readouterr().err


def test_installed_program_reads_the_environment(hub):
    exe = os.path.join(os.path.dirname(sys.executable), "backendai-admin")
    env = dict(os.environ, BACKENDAI_ENDPOINT=hub.base, BACKENDAI_ACCESS_KEY=hub.admin_keys[0],
               BACKENDAI_SECRET_KEY=hub.admin_keys[1])
    r = subprocess.run([exe, "whoami"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["user"]["role"] == "superadmin"
    # Options after the command work as well as before it.
    r = subprocess.run([exe, "domains", "get", "default", "--endpoint", hub.base + "/hub/api/backendai"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["name"] == "default"


def test_filter_options_match_the_openapi_document():
    path = os.path.join(os.path.dirname(cli.__file__), "api", "openapi.yaml")
    with open(path) as f:
        doc = yaml.safe_load(f)
    for entity, (collection, _ident) in cli.ENTITIES.items():
        params = doc["paths"][collection]["get"]["parameters"]
        names = {p["name"] for p in params} - {"offset", "limit"}
        assert names == set(cli.FILTERS[entity]), entity


def test_actions_are_exactly_the_operations_of_the_openapi_document():
    path = os.path.join(os.path.dirname(cli.__file__), "api", "openapi.yaml")
    with open(path) as f:
        doc = yaml.safe_load(f)
    method = {"list": "get", "create": "post", "get": "get", "update": "patch",
              "delete": "delete"}
    for entity, (collection, _ident) in cli.ENTITIES.items():
        item = next(p for p in doc["paths"] if p.startswith(collection + "/{")
                    and p.count("/") == collection.count("/") + 1)
        offered = {a for a, m in method.items()
                   if m in doc["paths"][collection if a in ("list", "create") else item]}
        assert set(cli.ACTIONS[entity]) == offered, entity
        sub = cli.build_parser()._subparsers._group_actions[0].choices[entity]
        choices = set(sub._subparsers._group_actions[0].choices)
        assert offered <= choices, entity
        assert not ({"create", "update", "delete", "get"} - offered) & choices, entity


def test_bootstrap_commands_work_without_a_hub(tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/boot.sqlite"

    def run(*argv):
        capsys.readouterr()
        rc = cli.main(["--db", db, *argv])
        out, err = capsys.readouterr()
        return rc, (json.loads(out) if rc == 0 else err)

    assert run("db-upgrade") == (0, {"upgraded": True})
    assert run("create-domain", "lab")[1] == {"domain": "lab"}
    rc, out = run("create-project", "vision", "--domain", "lab")
    assert rc == 0 and out["domain"] == "lab"
    rc, out = run("create-user", "--email", "dan@lab.example", "--password", "dan-pass-12",
                  "--domain", "lab", "--project", "vision")
    assert rc == 0 and out["username"] == "dan" and out["secret_key"]
    rc, out = run("create-keypair", "--email", "dan@lab.example")
    assert rc == 0 and out["access_key"] != ""
    rc, err = run("create-domain", "lab")
    assert rc == cli.EXIT_USAGE and "exists" in err
    fixture = tmp_path / "fixture.json"
    fixture.write_text(json.dumps({"domains": [{"name": "fx"}],
                                   "projects": [{"name": "fxp", "domain": "fx"}]}))
    rc, out = run("fixture", "populate", str(fixture))
    assert rc == 0, out
    rc, err = run("create-project", "fxp", "--domain", "fx")
    assert rc == cli.EXIT_USAGE and "exists" in err


def test_batch_session_through_the_cli(admin, hub):
    name = "s" + uuid.uuid4().hex[:8]
    created = admin.ok("sessions", "create", f"name={name}", f"image={hub.image}",
                       "startup_command=echo hello-from-cli",
                       'resources:={"cpu": "0.1", "mem": "64m"}')
    assert created["name"] == name and created["type"] == "batch"
    sid = created["id"]
    deadline = time.monotonic() + 60
    while True:
        got = admin.ok("sessions", "get", sid)
        if got["status"] in ("TERMINATED", "ERROR", "CANCELLED") or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert got["status"] == "TERMINATED", got
    logs = admin.ok("sessions", "logs", sid)
    assert "hello-from-cli" in "".join(k["logs"] or "" for k in logs["kernels"])
    mine = admin.ok("sessions", "list", "--status", "TERMINATED", "--all")
    assert sid in [s["id"] for s in mine["items"]]


def test_vfolders_and_their_files_through_the_cli(admin, hub, tmp_path):
    """Folder CRUD, sharing and streamed file transfer, by folder name or id."""
    dom = "v" + uuid.uuid4().hex[:8]
    admin.ok("domains", "create", f"name={dom}",
             'allowed_vfolder_hosts:={"local:volume1": ["create-vfolder", "upload-file", '
             '"download-file", "invite-others", "mount-in-session"]}')
    owner = admin.ok("users", "create", f"email=o@{dom}.example", "password=owner-pass-1",
                     f"username=o{dom}", f"domain_name={dom}")
    peer = admin.ok("users", "create", f"email=p@{dom}.example", "password=peer-pass-12",
                    f"username=p{dom}", f"domain_name={dom}")
    keys = (owner["keypair"]["access_key"], owner["keypair"]["secret_key"])
    hosts = admin.ok("vfolder-hosts", keys=keys)
    assert "create-vfolder" in hosts["hosts"]["local:volume1"]["permissions"]
    f = admin.ok("vfolders", "create", "name=results", keys=keys)
    assert (f["name"], f["user_id"], f["status"]) == ("results", owner["id"], "ready")
    assert admin.ok("vfolders", "list", "--name", "results", keys=keys)["total"] == 1
    assert admin.ok("vfolders", "get", "results", keys=keys)["id"] == f["id"]  # by name

    blob = os.urandom(3 * 2**20 + 7)
    local = tmp_path / "blob.bin"
    local.write_bytes(blob)
    assert admin.ok("vfolders", "mkdir", "results", "in/side", "-p", keys=keys) == {
        "path": "in/side"}
    up = admin.ok("vfolders", "upload", f["id"], str(local), "--path", "in/side/b.bin", keys=keys)
    assert up == {"path": "in/side/b.bin", "size": len(blob)}
    ls = admin.ok("vfolders", "files", "results", "in/side", keys=keys)
    assert [(e["name"], e["size"]) for e in ls["items"]] == [("b.bin", len(blob))]
    out = tmp_path / "back.bin"
    got = admin.ok("vfolders", "download", "results", "in/side/b.bin", "-o", str(out), keys=keys)
    assert got["size"] == len(blob) and out.read_bytes() == blob

    share = admin.ok("vfolders", "share", "results", peer["email"], "--permission", "ro", keys=keys)
    assert (share["user_id"], share["permission"]) == (peer["id"], "ro")
    peer_keys = (peer["keypair"]["access_key"], peer["keypair"]["secret_key"])
    rc, err = admin("vfolders", "upload", f["id"], str(local), keys=peer_keys)
    assert rc == cli.EXIT_API_ERROR and "403" in err and "ro" in err
    rc, err = admin("vfolders", "download", f["id"], "nope.bin", "-o", str(tmp_path / "n"),
                    keys=peer_keys)
    assert rc == cli.EXIT_API_ERROR and "404" in err and not (tmp_path / "n").exists()
    assert not (tmp_path / "n.part").exists()
    assert admin.ok("vfolders", "shares", "results", keys=keys)["items"][0]["user_id"] == peer["id"]
    admin.ok("vfolders", "unshare", "results", peer["email"], keys=keys)
    rc, err = admin("vfolders", "get", f["id"], keys=peer_keys)
    assert rc == cli.EXIT_API_ERROR and "404" in err

    assert admin.ok("vfolders", "rename", "results", "in/side/b.bin", "top.bin", keys=keys) == {
        "path": "top.bin"}
    admin.ok("vfolders", "rm", "results", "in", "-r", keys=keys)
    assert [e["name"] for e in admin.ok("vfolders", "files", "results", keys=keys)["items"]] == [
        "top.bin"]
    assert admin.ok("vfolders", "delete", "results", keys=keys) == {"deleted": "results"}
    kind, sid = f["quota_scope_id"].split(":")
    assert not os.path.exists(os.path.join(hub.volume_path, kind, sid, f["id"]))
    rc, err = admin("vfolders", "get", "results", keys=keys)
    assert rc == cli.EXIT_API_ERROR and "no vfolders named 'results'" in err
