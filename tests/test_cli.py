"""``backendai-admin`` as an API client of a running hub (signed requests), and its bootstrap part.

API commands are run in-process through ``main(argv)`` (fast) and, once, as the
installed ``backendai-admin`` program configured from the environment.
"""

from __future__ import annotations

import json
import os
import re
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
                       "--db", "sqlite:////nonexistent/dir/never.sqlite", "--json", *argv])
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
    assert rc == 1 and re.search(r"\b404\b", err)
    rc, err = admin("users", "list", "--role", "emperor")
    assert rc == 1 and re.search(r"\b400\b", err) and "role" in err
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
    r = subprocess.run([exe, "--json", "whoami"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["user"]["role"] == "superadmin"
    # Options after the command work as well as before it.
    r = subprocess.run([exe, "domains", "get", "default", "--json", "--endpoint", hub.base + "/hub/api/backendai"],
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
        rc = cli.main(["--db", db, "--json", *argv])
        out, err = capsys.readouterr()
        return rc, (json.loads(out) if rc == 0 else err)

    assert run("db-upgrade") == (0, {"upgraded": True, "database": db, "from": "--db"})
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
    assert rc == cli.EXIT_API_ERROR and re.search(r"\b403\b", err) and "ro" in err
    rc, err = admin("vfolders", "download", f["id"], "nope.bin", "-o", str(tmp_path / "n"),
                    keys=peer_keys)
    assert rc == cli.EXIT_API_ERROR and re.search(r"\b404\b", err) and not (tmp_path / "n").exists()
    assert not (tmp_path / "n.part").exists()
    assert admin.ok("vfolders", "shares", "results", keys=keys)["items"][0]["user_id"] == peer["id"]
    admin.ok("vfolders", "unshare", "results", peer["email"], keys=keys)
    rc, err = admin("vfolders", "get", f["id"], keys=peer_keys)
    assert rc == cli.EXIT_API_ERROR and re.search(r"\b404\b", err)

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


# -- issue 9: the hub's database, names or ids, reset-password, --help ----------------


def _admin_exe(*argv, env, cwd):
    exe = os.path.join(os.path.dirname(sys.executable), "backendai-admin")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BACKENDAI_")}
    return subprocess.run([exe, *argv], env={**clean, **env}, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def _domains(db_url: str) -> set[str]:
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as c:
            return {r[0] for r in c.execute(text("select name from domains"))}
    finally:
        engine.dispose()


def test_bootstrap_finds_the_hubs_database_and_never_makes_a_stray_one(tmp_path):
    state, elsewhere, empty = tmp_path / "state", tmp_path / "elsewhere", tmp_path / "empty"
    for d in (elsewhere, empty):
        d.mkdir()
    env = {"BACKENDAI_STATE_DIR": str(state)}
    hub_db = f"sqlite:///{state}/backendai.sqlite"

    # No database yet where the hub keeps it: refused, naming the path, nothing made.
    r = _admin_exe("create-domain", "lab", env=env, cwd=elsewhere)
    assert r.returncode == cli.EXIT_USAGE
    assert r.stderr == (
        f"backendai-admin: no database at {state}/backendai.sqlite (from BACKENDAI_STATE_DIR: "
        f"{hub_db}); run `backendai-admin db-upgrade` there first, or point at the hub's "
        "database with --db, BACKENDAI_DB_URL or BACKENDAI_STATE_DIR\n")
    assert not state.exists() and os.listdir(elsewhere) == []

    # db-upgrade makes it there; the other commands then use it, from any directory.
    r = _admin_exe("db-upgrade", "--json", env=env, cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"upgraded": True, "database": hub_db,
                                    "from": "BACKENDAI_STATE_DIR"}
    r = _admin_exe("create-domain", "lab", env=env, cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert "lab" in _domains(hub_db)
    assert os.listdir(elsewhere) == []

    # BACKENDAI_DB_URL wins over the state directory, --db over both.
    other = f"sqlite:///{tmp_path}/other.sqlite"
    r = _admin_exe("create-domain", "lab2", env={**env, "BACKENDAI_DB_URL": other}, cwd=elsewhere)
    assert r.returncode == cli.EXIT_USAGE
    assert f"no database at {tmp_path}/other.sqlite (from BACKENDAI_DB_URL" in r.stderr
    assert not os.path.exists(f"{tmp_path}/other.sqlite")
    r = _admin_exe("--db", hub_db, "create-domain", "lab3",
                   env={**env, "BACKENDAI_DB_URL": other}, cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert {"lab", "lab3"} <= _domains(hub_db)

    # Nothing set at all: the default ./backendai-state, which is not there: refused.
    for argv in (("create-user", "--email", "x@example.com", "--password", "x-pass-123"),
                 ("create-superadmin",), ("reset-password", "admin"),
                 ("create-keypair", "--email", "admin")):
        r = _admin_exe(*argv, env={}, cwd=empty)
        assert r.returncode == cli.EXIT_USAGE, (argv, r.stdout)
        assert r.stderr.startswith(f"backendai-admin: no database at {empty}/backendai-state/"
                                   "backendai.sqlite (from the default state directory "
                                   "./backendai-state"), argv
        assert os.listdir(empty) == [], argv

    # A file that is not a migrated database is left as it is.
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"")
    r = _admin_exe("--db", f"sqlite:///{junk}", "create-domain", "x", env={}, cwd=empty)
    assert r.returncode == cli.EXIT_USAGE
    assert "is not a migrated Backend.AI database (no schema version)" in r.stderr
    assert junk.read_bytes() == b""


def test_the_launcher_and_the_cli_agree_on_the_database(tmp_path):
    env = {"BACKENDAI_STATE_DIR": str(tmp_path / "s")}
    assert cli.find_db(None, env) == (f"sqlite:///{tmp_path}/s/backendai.sqlite",
                                      "BACKENDAI_STATE_DIR")
    assert cli.hub_db_url(env) == f"sqlite:///{tmp_path}/s/backendai.sqlite"
    assert cli.hub_db_url({**env, "BACKENDAI_DB_URL": "postgresql://h/db"}) == "postgresql://h/db"
    assert cli.hub_db_url({}) == "sqlite:///" + os.path.abspath("backendai-state/backendai.sqlite")


def test_reset_password_then_log_in_with_it(hub, capsys):
    name = "r" + uuid.uuid4().hex[:8]
    Admin(hub, capsys).ok("users", "create", f"email={name}@example.com", "password=old-pass-123",
                          f"username={name}")

    def reset(*argv):
        capsys.readouterr()
        rc = cli.main(["--db", hub.db_url, "--json", "reset-password", *argv])
        out, err = capsys.readouterr()
        return rc, (json.loads(out) if rc == 0 else err.strip())

    rc, out = reset(name)  # by username; the password is generated and shown once
    assert rc == 0 and set(out) == {"email", "username", "password_reset", "password"}
    assert (out["email"], out["username"]) == (f"{name}@example.com", name)
    generated = out["password"]
    assert len(generated) >= 12
    assert hub.login(f"{name}@example.com", generated).last_login.url.endswith("/hub/spawn")
    assert hub.login(name, "old-pass-123").last_login.url.endswith("/hub/login")

    rc, out = reset(f"{name}@example.com", "--password", "chosen-pass-1")  # by email
    assert rc == 0 and out == {"email": f"{name}@example.com", "username": name,
                               "password_reset": True}
    assert hub.login(name, "chosen-pass-1").last_login.url.endswith("/hub/spawn")
    assert hub.login(name, generated).last_login.url.endswith("/hub/login")

    assert reset("nobody-" + name) == (cli.EXIT_USAGE, "backendai-admin: no user with email or "
                                       f"username 'nobody-{name}'")
    assert reset(name, "--password", "short") == (
        cli.EXIT_USAGE, "backendai-admin: the password must be at least 8 characters")
    assert hub.login(name, "chosen-pass-1").last_login.url.endswith("/hub/spawn")


def test_every_command_takes_names_or_ids(admin):
    tag = uuid.uuid4().hex[:6]
    d1, d2, rs = f"n1{tag}", f"n2{tag}", f"research{tag}"
    projects = {}
    for dom in (d1, d2):
        admin.ok("domains", "create", f"name={dom}")
        projects[dom] = admin.ok("projects", "create", f"name={rs}", f"domain_name={dom}")["id"]
    # project_ids by DOMAIN/NAME in a create's fields.
    carol = admin.ok("users", "create", f"email=carol{tag}@example.com", "password=carol-pass-1",
                     f"username=carol{tag}", f"domain_name={d1}",
                     f'project_ids:=["{d1}/{rs}"]')
    assert carol["project_ids"] == [projects[d1]]
    dave = admin.ok("users", "create", f"email=dave{tag}@example.com", "password=dave-pass-12",
                    f"username=dave{tag}", f"domain_name={d1}")

    # The project by a name that two domains have: refused, saying how to name it.
    rc, err = admin("projects", "add-members", rs, f"dave{tag}")
    assert rc == cli.EXIT_API_ERROR
    assert err == (f"backendai-admin: 400 Ambiguous: 2 projects named '{rs}' are visible to "
                   f"this keypair; name one as DOMAIN/NAME (domains: {d1}/{rs}, {d2}/{rs}) or "
                   "give its id")
    # By DOMAIN/NAME, users by username, email or id alike.
    out = admin.ok("projects", "add-members", f"{d1}/{rs}", f"dave{tag}")
    assert out["project_id"] == projects[d1] and out["added"] == [f"dave{tag}"]
    members = admin.ok("projects", "members", f"{d1}/{rs}")
    assert sorted(m["id"] for m in members["items"]) == sorted([carol["id"], dave["id"]])
    assert admin.ok("projects", "get", f"{d2}/{rs}")["id"] == projects[d2]
    assert admin.ok("projects", "get", projects[d2])["domain_name"] == d2
    admin.ok("projects", "remove-members", f"{d1}/{rs}", f"dave{tag}@example.com")
    assert admin.ok("projects", "members", projects[d1])["total"] == 1
    assert admin.ok("users", "get", f"dave{tag}")["id"] == dave["id"]
    assert admin.ok("users", "update", f"dave{tag}", "full_name=Dave")["full_name"] == "Dave"
    assert admin.ok("users", "list", "--project", f"{d1}/{rs}")["total"] == 1
    kps = admin.ok("keypairs", "list", "--user-id", f"carol{tag}")
    assert [k["user_id"] for k in kps["items"]] == [carol["id"]]
    kp = admin.ok("keypairs", "create", f"user_id=dave{tag}@example.com")
    assert kp["user_id"] == dave["id"]
    # A unique name needs no domain.
    admin.ok("projects", "create", f"name=solo{tag}", f"domain_name={d2}")
    assert admin.ok("projects", "get", f"solo{tag}")["domain_name"] == d2
    # Names that match nothing: a 404 that says what was looked for.
    rc, err = admin("projects", "get", f"{d1}/nothing")
    assert (rc, err) == (cli.EXIT_API_ERROR, "backendai-admin: 404 Not found: no projects "
                         f"named 'nothing' in domain '{d1}' visible to this keypair")
    rc, err = admin("users", "get", f"ghost{tag}")
    assert (rc, err) == (cli.EXIT_API_ERROR, "backendai-admin: 404 Not found: no users with "
                         f"username 'ghost{tag}' visible to this keypair")


def _help(capsys, *argv) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_help_lists_each_commands_fields_from_the_api_schema(capsys):
    out = _help(capsys, "users", "create")
    assert "fields (schema UserCreate of the API;" in out
    assert "  email (required): string of 3 to 128 characters\n" in out
    assert "  password (required): string of 8 to 72 characters\n" in out
    assert "  role: one of superadmin, admin, user, monitor\n" in out
    assert "  project_ids: list of string of at most 32 characters (at most 500)\n" in out
    assert "      what the user may do: superadmin (everything)" in out
    out = _help(capsys, "keypair-resource-policies", "update")
    assert "fields (schema KeypairResourcePolicyUpdate of the API;" in out
    assert "  max_concurrent_sessions: integer >= 0\n" in out
    assert "  max_priority: integer from 0 to 100\n" in out
    # Every create and update lists exactly the properties of the schema the API validates
    # its body against.
    path = os.path.join(os.path.dirname(cli.__file__), "api", "openapi.yaml")
    with open(path) as f:
        doc = yaml.safe_load(f)
    for entity, actions in cli.ACTIONS.items():
        for action in {"create", "update"} & set(actions):
            out = _help(capsys, entity, action)
            name = out.split("fields (schema ", 1)[1].split(" ", 1)[0]
            props = doc["components"]["schemas"][name]["properties"]
            listed = [line.split(":")[0].split(" (")[0].strip() for line in
                      out.split("fields (schema ", 1)[1].splitlines()[1:]
                      if line.startswith("  ") and not line.startswith("      ")
                      and not line.startswith("  (")]
            assert listed == list(props), (entity, action)
    # Bootstrap commands say their types too.
    out = " ".join(_help(capsys, "reset-password").split())  # whatever the terminal's width
    assert "EMAIL_OR_USERNAME string: the user, by email or username" in out
    assert "--password PASSWORD string, 8 to 72 bytes (default: generated, printed once)" in out


def test_api_client_signs_the_body_hash():
    """The project's own CLI always signs its body (X-BackendAI-Content-SHA256), so its
    captured headers cannot be reused with another body. A local HTTP server records
    what the client sends; the hub's side of the check is in test_attacks_api.py."""
    import hashlib
    import http.server
    import threading

    from jupyterhub_backendai.adminclient import ApiClient
    from jupyterhub_backendai.common import signing

    seen = {}

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.update(headers=dict(self.headers), body=body)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = ApiClient(f"http://127.0.0.1:{srv.server_port}", "AKTEST", "s3cret")
        client.request("POST", "users", body={"email": "x@example.com"})
    finally:
        srv.shutdown()
    headers = {k.lower(): v for k, v in seen["headers"].items()}
    assert headers["x-backendai-content-sha256"] == hashlib.sha256(seen["body"]).hexdigest()
    # The hash is part of what was signed: the request verifies with it, not with another.
    path = "/hub/api/backendai/users"
    signing.verify_request("POST", path, headers, "s3cret", body=seen["body"])
    from jupyterhub_backendai.common.errors import Unauthorized

    with pytest.raises(Unauthorized):
        signing.verify_request("POST", path, headers, "s3cret", body=b'{"email": "y@example.com"}')


# -- issue 29: output for people, names in --filter, plain --help ---------------------


def test_tables_for_people_json_for_scripts_and_filters_by_name(admin, hub, capsys):
    tag = uuid.uuid4().hex[:6]
    u = admin.ok("users", "create", f"email=people{tag}@example.com", "password=people-pass-1",
                 f"username=people{tag}")

    def people(*argv):
        capsys.readouterr()
        ak, sk = hub.admin_keys
        rc = cli.main(["--endpoint", hub.base + "/", "--access-key", ak, f"--secret-key={sk}",
                       *argv])
        out, err = capsys.readouterr()
        return rc, out, err

    # A list: a table with a header, the user's row, how many of how many; no JSON.
    rc, out, err = people("users", "list", "--email", f"people{tag}@example.com")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "USERNAME", "EMAIL", "ROLE", "DOMAIN", "NAME", "STATUS"]
    assert lines[1].split() == [u["id"], f"people{tag}", f"people{tag}@example.com", "user",
                                "default", "active"]
    assert lines[2] == "(1 of 1)"
    assert "{" not in out
    # One item: field and value, booleans in words, times to the minute.
    rc, out, err = people("domains", "get", "default")
    assert rc == 0, err
    fields = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in out.splitlines()
              if len(line.split(None, 1)) == 2}
    assert fields["name"] == "default" and fields["is_active"] == "yes"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", fields["created_at"]), fields
    # --json anywhere: the API's JSON as it came.
    rc, out, err = people("domains", "get", "default", "--json")
    assert rc == 0 and json.loads(out)["name"] == "default"
    rc, out, err = people("--json", "domains", "get", "default")
    assert rc == 0 and json.loads(out)["is_active"] is True
    # --filter user_id= takes a name as --user-id does; a name of nobody is an error.
    admin.ok("keypairs", "create", f"user_id=people{tag}")
    rc, out, err = people("keypairs", "list", "--filter", f"user_id=people{tag}", "--json")
    assert rc == 0, err
    keys = json.loads(out)["items"]
    assert len(keys) == 2 and {k["user_id"] for k in keys} == {u["id"]}
    rc, out, err = people("keypairs", "list", "--filter", f"user_id=nobody{tag}")
    assert (rc, out) == (cli.EXIT_API_ERROR, "")
    assert err.strip() == (f"backendai-admin: 404 Not found: no users with username "
                           f"'nobody{tag}' visible to this keypair")
    rc, out, err = people("sessions", "list", "--filter", f"user_id=nobody{tag}@example.com")
    assert rc == cli.EXIT_API_ERROR and "no users with email" in err
    # Usage for people: a table of hours (manager/usage.py; tests/test_usage.py checks them).
    rc, out, err = people("usage", "--group-by", "domain", "--start", "2020-01-01")
    assert rc == 0, err
    assert out.splitlines()[0].split() == ["NAME", "SESSIONS", "HOURS", "CPU", "HOURS", "MEM",
                                           "GIB", "HOURS", "GPU", "HOURS", "USED", "CPU",
                                           "HOURS", "USED", "MEM", "GIB", "HOURS"]
    assert out.splitlines()[-1].split()[0] == "Total"
    rc, out, err = people("usage", "--start", "soon")
    assert rc == cli.EXIT_API_ERROR and "start: 'soon' is not a date or time" in err


def test_help_is_plain_text(capsys):
    out = _help(capsys)
    assert "``" not in out and "**" not in out
    assert "- Bootstrap (db-upgrade, create-superadmin," in out
    assert "--json" in out
    assert "--json" in _help(capsys, "users", "list")
