"""Backend.AI's official CLIs (23.9.10 and 26.9.6) against a running hub, issue 27's rows:
each test drives the CLI (both clients where both have the command) and then checks the
platform's state through the admin API, the volume or the session's own output.

The helpers are test_backendai_client's (the CLIs' venvs, the signed environment); this
module has its own hub (Docker backend, SQLite).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid

import pytest

from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .api_world import new_user, superadmin
from .conftest import shutdown_hub
from .hub import Hub
from .test_backendai_client import BAI, CLI, CLI26, RES, admin_api, wait_dead


@pytest.fixture(scope="module")
def hub(tmp_path_factory, docker_image):
    for cli in (CLI, CLI26):
        assert os.access(cli, os.X_OK), (
            f"{cli} is missing: run scripts/install-backendai-clients.sh")
    url = f"sqlite:///{tmp_path_factory.mktemp('baimore')}/backendai.sqlite"
    hub = Hub(db_url=url, backend="docker").start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    yield hub
    shutdown_hub(hub)
    hub.engine.dispose()


@pytest.fixture(scope="module")
def alice(hub, tmp_path_factory):
    u = new_user(superadmin(hub), name=f"alice-{uuid.uuid4().hex[:6]}")
    return BAI(hub, u, str(tmp_path_factory.mktemp("alice-home")))


@pytest.fixture(scope="module")
def bob26(hub, tmp_path_factory):
    u = new_user(superadmin(hub), name=f"bob-{uuid.uuid4().hex[:6]}")
    return BAI(hub, u, str(tmp_path_factory.mktemp("bob-home")), cli=CLI26)


@pytest.fixture(scope="module")
def root(hub, tmp_path_factory):
    u = new_user(superadmin(hub), role="superadmin", name=f"root-{uuid.uuid4().hex[:6]}")
    return BAI(hub, u, str(tmp_path_factory.mktemp("root-home")))


def folder(hub, name: str) -> dict:
    [f] = admin_api(hub, "GET", "/vfolders", params={"name": name})["items"]
    return f


def folder_path(hub, f: dict) -> str:
    return os.path.join(hub.volume_path, *f["quota_scope_id"].split(":"), f["id"])


def sdk_call(bai: BAI, expr: str, rc: int = 0) -> str:
    """``expr`` of the 23.09 SDK (``s``: a Session signed as ``bai``) in its venv; its value
    as JSON on the last line of the output (rc 0), or the output (the error's)."""
    py = os.path.join(os.path.dirname(CLI), "python")
    code = ("import json\nfrom ai.backend.client.session import Session\n"
            f"with Session() as s:\n    print(json.dumps({expr}))")
    p = subprocess.run([py, "-c", code], env=bai.env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == rc, p.stdout + p.stderr
    return p.stdout.strip().splitlines()[-1] if rc == 0 else p.stdout + p.stderr


def batch(bai: BAI, name: str, command: str, *extra: str) -> tuple[str, str]:
    """A batch session through the CLI; (its id, its output) once it ended."""
    out = bai("session", "create", "--type", "batch", "--name", name, *RES, *extra,
              "--startup-command", command, bai.hub.image)
    m = re.search(r"Session ID ([0-9a-f-]{36}) is created and ready\.", out)
    assert m, out
    sid = uuid.UUID(m.group(1)).hex
    s = wait_dead(bai.hub, sid)
    assert s["status"] in ("TERMINATED", "ERROR"), s
    return sid, bai("session", "logs", m.group(1))


def test_vfolder_create_permission_is_kept_and_enforced(hub, alice, bob26):
    """`vfolder create NAME -p ro`: the owner's own permission, kept on the folder and
    enforced on its owner: read-only when mounted, no upload or delete through the API."""
    x = uuid.uuid4().hex[:6]
    ro, wd = f"ro-{x}", f"wd-{x}"
    out = alice("vfolder", "create", ro, "local:volume1", "-p", "ro")
    assert f'Virtual folder "{ro}" is created.' in out
    f = folder(hub, ro)
    assert (f["permission"], f["user_id"]) == ("ro", alice.user["id"]), f
    out = alice("vfolder", "info", ro)
    assert "- Permission: ro" in out, out
    with open(os.path.join(folder_path(hub, f), "seed.txt"), "w") as fh:
        fh.write("seeded")
    # through the API: read yes, write and delete no
    home = alice.env["HOME"]
    with open(os.path.join(home, "up.txt"), "w") as fh:
        fh.write("up")
    out = alice("vfolder", "upload", "-b", home, ro, "up.txt", rc=1)
    assert "your permission on vfolder" in out and "is ro" in out, out
    out = alice("vfolder", "rm", ro, "seed.txt", answer="y\n", rc=1)
    assert "is ro; delete needs wd" in out, out
    out = alice("vfolder", "mkdir", ro, "sub", rc=1)
    assert "is ro" in out, out
    assert sorted(os.listdir(folder_path(hub, f))) == ["seed.txt"]
    dl = os.path.join(home, "dl")
    os.mkdir(dl)
    alice("vfolder", "download", "-b", dl, ro, "seed.txt")
    with open(os.path.join(dl, "seed.txt")) as fh:
        assert fh.read() == "seeded"
    # mounted: read-only in the session
    _, logs = batch(alice, f"rom-{x}", f"cat /home/work/{ro}/seed.txt; echo; "
                    f"touch /home/work/{ro}/new 2>&1 && echo WROTE || echo REFUSED",
                    "-m", ro)
    assert "seeded" in logs and "REFUSED" in logs and "WROTE" not in logs, logs
    assert "Read-only file system" in logs, logs
    assert sorted(os.listdir(folder_path(hub, f))) == ["seed.txt"]
    # wd through 26.09: the owner deletes; a bad permission: the reason, nothing made
    out = bob26("vfolder", "create", wd, "local:volume1", "-p", "wd")
    assert f'Virtual folder "{wd}" is created.' in out
    assert folder(hub, wd)["permission"] == "wd"
    out = alice("vfolder", "create", f"bad-{x}", "local:volume1", "-p", "rx", rc=1)
    assert "permission must be one of ro, rw, wd, not 'rx'" in out, out
    assert admin_api(hub, "GET", "/vfolders", params={"name": f"bad-{x}"})["total"] == 0
    # the default stays rw
    alice("vfolder", "create", f"rw-{x}", "local:volume1")
    assert folder(hub, f"rw-{x}")["permission"] == "rw"
    for name in (ro, wd, f"rw-{x}"):
        admin_api(hub, "DELETE", f"/vfolders/{folder(hub, name)['id']}")


def test_admin_keypair_list_is_newest_first(hub, root, tmp_path):
    """`admin keypair list`: newest first, as Backend.AI lists them (clients and scripts take
    the first row as the newest key), in both clients."""
    u = new_user(superadmin(hub), name=f"kpl-{uuid.uuid4().hex[:6]}")
    keys = [u["keypair"]["access_key"]]
    for _ in range(2):
        out = root("admin", "keypair", "add", u["email"], "default")
        keys.append(re.search(r"access_key\s+(\S+)\n", out).group(1))
    root26 = BAI(hub, root.user, str(tmp_path), cli=CLI26)
    for cli in (root, root26):
        out = cli("admin", "keypair", "list", "-u", u["email"])
        at = [out.index(k) for k in keys]
        assert at == sorted(at, reverse=True), (keys, out)
    # the admin API keeps its own order (oldest first)
    items = admin_api(hub, "GET", "/keypairs", params={"user_id": u["id"]})["items"]
    assert [k["access_key"] for k in items] == keys


def test_26_09_user_add_with_container_ids_and_purge(hub, root, alice, tmp_path):
    """26.09's `admin user add --cuid/--cgid/--cgids` (and `update --unset-cuid`): stored on
    the user and shown; `admin user purge` with 26.09's `delegate_endpoint_ownership` (no
    model-serving endpoints here: nothing to hand over). Superadmins only set the ids;
    bad ids: the reason, nothing made. (Kernels do not run with them yet: docs/backendai-compat.md.)"""
    sa = superadmin(hub)
    x = uuid.uuid4().hex[:6]
    root26 = BAI(hub, root.user, str(tmp_path), cli=CLI26)
    email = f"cid-{x}@example.com"
    out = root26("admin", "user", "add", "default", email, "pw-long-enough", "-u", f"cid-{x}",
                 "--cuid", "2001", "--cgid", "2002", "--cgids", "3001,3002")
    assert "ok" in out.lower() and "error" not in out.lower(), out
    [u] = sa.ok("GET", "/users", params={"email": email})["items"]
    assert (u["container_uid"], u["container_main_gid"], u["container_gids"]) == (
        2001, 2002, [3001, 3002]), u
    out = root26("admin", "user", "update", email, "--unset-cuid", "--cgids", "3003")
    u = sa.ok("GET", f"/users/{u['id']}")
    assert (u["container_uid"], u["container_main_gid"], u["container_gids"]) == (
        None, 2002, [3003]), (u, out)
    # the 23.09 client's add (no ids) still works; a user without ids keeps nulls
    out = root("admin", "user", "add", "default", f"plain-{x}@example.com", "pw-long-enough")
    [p] = sa.ok("GET", "/users", params={"email": f"plain-{x}@example.com"})["items"]
    assert (p["container_uid"], p["container_main_gid"], p["container_gids"]) == (
        None, None, None), p
    # bad ids, and a domain admin: the reason, nothing made or changed
    out = root26("admin", "user", "add", "default", f"bad-{x}@example.com", "pw-long-enough",
                 "--cuid", "-5", rc=1)
    assert "container_uid: -5 is less than the minimum of 1" in out, out
    dadmin = BAI(hub, new_user(sa, role="admin", name=f"dadm-{x}"), str(tmp_path), cli=CLI26)
    out = dadmin("admin", "user", "add", "default", f"bad2-{x}@example.com", "pw-long-enough",
                 "--cuid", "0", rc=1)
    assert "container_uid" in out, out
    out = dadmin("admin", "user", "add", "default", f"bad3-{x}@example.com", "pw-long-enough",
                 "--cuid", "4000", rc=1)
    assert "container_uid: only superadmins may set a user's container ids" in out, out
    # (26.09 sends each id it was not given as null: a domain admin's plain add works)
    dadmin("admin", "user", "add", "default", f"da-{x}@example.com", "pw-long-enough")
    assert len(sa.ok("GET", "/users", params={"email": f"da-{x}@example.com"})["items"]) == 1
    for bad in ("bad", "bad2", "bad3"):
        assert sa.ok("GET", "/users", params={"email": f"{bad}-{x}@example.com"})["items"] == []
    out = dadmin("admin", "user", "update", email, "--cuid", "4000", rc=1)
    assert "only superadmins may set" in out, out
    assert sa.ok("GET", f"/users/{u['id']}")["container_uid"] is None
    # purge (26.09 sends delegate_endpoint_ownership; with the flag too)
    out = root26("admin", "user", "purge", email, "--delegate-endpoint-ownership", answer="y\n")
    assert "error" not in out.lower(), out
    assert sa("GET", f"/users/{u['id']}").status_code == 404
    out = root26("admin", "user", "purge", f"plain-{x}@example.com", answer="y\n")
    assert sa("GET", f"/users/{p['id']}").status_code == 404, out


def test_26_09_container_ids_are_the_kernels_ids(hub, root, tmp_path):
    """A user's container ids (26.09's `admin user add --cuid --cgid --cgids`) are the ids
    their kernels run with (the Docker backend's container user and supplementary
    groups); a user without them runs as the image's user; changed ids apply to the next
    session."""
    sa = superadmin(hub)
    x = uuid.uuid4().hex[:6]
    root26 = BAI(hub, root.user, str(tmp_path), cli=CLI26)
    u = new_user(sa, name=f"ids-{x}")
    root26("admin", "user", "update", u["email"], "--cuid", "2001", "--cgid", "2002",
           "--cgids", "3001,3002")
    cli = BAI(hub, u, str(tmp_path))
    probe = "echo ids=$(id -u):$(id -g):$(id -G | tr ' ' ,)"
    _, logs = batch(cli, f"ids-{x}", probe)
    assert "ids=2001:2002:2002,3001,3002\n" in logs, logs
    # only a uid: the image's group; no ids: the image's user (work, 1000)
    sa.ok("PATCH", f"/users/{u['id']}", json={"container_main_gid": None,
                                              "container_gids": None})
    _, logs = batch(cli, f"ids2-{x}", probe)
    assert "ids=2001:1000:1000\n" in logs, logs
    plain = BAI(hub, new_user(sa, name=f"noids-{x}"), str(tmp_path))
    _, logs = batch(plain, f"ids3-{x}", probe)
    assert "ids=1000:1000:1000\n" in logs, logs


def test_vfolder_list_own_invited_project(hub, alice, bob26):
    """`vfolder list-own`, `list-invited` (both clients) and `list-project` (GraphQL's
    vfolder_own_list, vfolder_invited_list, vfolder_project_list): each only its kind."""
    sa = superadmin(hub)
    x = uuid.uuid4().hex[:6]
    mine, theirs, team = f"own-{x}", f"bobs-{x}", f"team-{x}"
    alice("vfolder", "create", mine, "local:volume1")
    bob26("vfolder", "create", theirs, "local:volume1")
    sa.ok("POST", "/vfolders", json={"name": team, "project": "default"})
    out = alice("vfolder", "share", mine, bob26.user["email"], "-p", "ro")
    assert bob26.user["email"] in out, out
    out = alice("vfolder", "list-own")
    assert mine in out and theirs not in out and team not in out, out
    out = bob26("vfolder", "list-own")
    assert theirs in out and mine not in out and team not in out, out
    out = bob26("vfolder", "list-invited")
    assert re.search(rf"{mine}\b.*\bro\b", out) and theirs not in out and team not in out, out
    out = alice("vfolder", "list-invited", rc=None)  # nothing shared with her
    assert mine not in out and theirs not in out and "rror" not in out, out
    for cli in (alice, bob26):
        out = cli("vfolder", "list-project")
        assert team in out and mine not in out and theirs not in out, out
    out = alice("vfolder", "list-own", "--filter", 'name == "x"', rc=1)
    assert "filter expressions are not supported by this server" in out, out
    for name in (mine, theirs, team):
        admin_api(hub, "DELETE", f"/vfolders/{folder(hub, name)['id']}")


def test_admin_agent_list_query_slots_and_usable_scaling_groups(hub, root, alice, tmp_path):
    """`admin agent list` (GraphQL agent_list; both clients), `admin resource query-slots`
    (GET /config/resource-slots) and the SDK's `ScalingGroup.list_available` (GET
    /scaling-groups?group=): what the record says, with the admin API's rules."""
    sa = superadmin(hub)
    [agent] = sa.ok("GET", "/agents")["items"]
    root26 = BAI(hub, root.user, str(tmp_path), cli=CLI26)
    for cli in (root, root26):
        out = cli("admin", "agent", "list")
        assert re.search(rf"{re.escape(agent['id'])}\s+ALIVE\s+{agent['architecture']}\s+"
                         r"default\b", out), out
    out = root("admin", "agent", "list", "-s", "LOST", rc=None)
    assert agent["id"] not in out, out
    for cli in (root, root26):
        out = cli("admin", "agent", "info", agent["id"])
        assert re.search(rf"ID\s+{re.escape(agent['id'])}\n", out) and "ALIVE" in out, out
    out = root("admin", "announcement", "get")
    assert "rror" not in out, out
    out = alice("admin", "agent", "list", rc=1)
    assert "you may not read agents" in out, out
    for cli in (alice, BAI(hub, alice.user, str(tmp_path), cli=CLI26)):
        out = cli("admin", "resource", "query-slots")
        assert "cpu (count)" in out and "mem (bytes)" in out, out
    # resource groups for a project: public ones, and a private one allowed for it
    x = uuid.uuid4().hex[:6]
    proj = sa.ok("POST", "/projects", json={"name": f"p-{x}", "domain_name": "default"})
    sa.ok("POST", f"/projects/{proj['id']}/members", 200, json={"user_ids": [alice.user["id"]]})
    sa.ok("POST", "/resource-groups", json={"name": f"priv-{x}", "is_public": False,
                                            "allowed_projects": [proj["id"]]})
    sa.ok("POST", "/resource-groups", json={"name": f"other-{x}", "is_public": False})
    # (the SDK's list_available prints the answer itself before returning it: the last line)
    mine, default = (json.loads(sdk_call(alice, f"s.ScalingGroup.list_available({g!r})"))
                     for g in (f"p-{x}", "default"))
    names = [g["name"] for g in mine]
    assert "default" in names and f"priv-{x}" in names and f"other-{x}" not in names, names
    assert f"priv-{x}" not in [g["name"] for g in default], default
    # a project she is not in: the reason (bob's project is not hers)
    other = sa.ok("POST", "/projects", json={"name": f"q-{x}", "domain_name": "default"})
    out = sdk_call(alice, f"s.ScalingGroup.list_available({other['id']!r})", rc=1)
    assert f"no group (project) {other['id']!r} of yours" in out, out


def test_vfolder_update_options_and_allowed_types(hub, alice, bob26):
    """`vfolder update-options -p` (both clients): the owner's own permission, enforced at
    once; `--set-cloneable false` refused with the reason; `vfolder list-allowed-types`."""
    x = uuid.uuid4().hex[:6]
    name = f"upd-{x}"
    alice("vfolder", "create", name, "local:volume1")
    out = alice("vfolder", "update-options", name, "-p", "ro")
    assert "Updated." in out, out
    assert folder(hub, name)["permission"] == "ro"
    home = alice.env["HOME"]
    with open(os.path.join(home, "u.txt"), "w") as fh:
        fh.write("u")
    out = alice("vfolder", "upload", "-b", home, name, "u.txt", rc=1)
    assert "is ro" in out, out
    out = alice("vfolder", "update-options", name, "--set-cloneable", "false", rc=1)
    assert "cloneable: every folder here may be cloned" in out, out
    out = alice("vfolder", "update-options", name, "-p", "all", rc=1)
    assert "permission must be one of ro, rw, wd, not 'all'" in out, out
    assert folder(hub, name)["permission"] == "ro"
    alice("vfolder", "update-options", name, "-p", "rw", "--set-cloneable", "true")
    assert folder(hub, name)["permission"] == "rw"
    alice("vfolder", "upload", "-b", home, name, "u.txt")
    # 26.09 (by id), on a folder of bob's; another's folder: the admin API's refusal
    theirs = f"upd26-{x}"
    bob26("vfolder", "create", theirs, "local:volume1")
    out = bob26("vfolder", "update-options", theirs, "-p", "wd")
    assert folder(hub, theirs)["permission"] == "wd", out
    for cli in (alice, bob26):
        out = cli("vfolder", "list-allowed-types")
        assert "['user', 'group']" in out, out
    for n in (name, theirs):
        admin_api(hub, "DELETE", f"/vfolders/{folder(hub, n)['id']}")


def test_run_and_create_with_environment_variables(hub, alice, bob26):
    """`run -e KEY=VALUE` (both clients) and `session create -e`: the variables reach the
    session's kernel (an interactive session's Jupyter kernel, a batch session's command);
    the platform's own names and bad names are refused with the reason, nothing made."""
    x = uuid.uuid4().hex[:6]
    name = f"env-{x}"
    code = "import os\nprint('GREETING=' + os.environ['GREETING'], 'N=' + os.environ['N'])"
    out = alice("run", "--rm", "--name", name, *RES, "-e", "GREETING=hello env",
                "-e", "N=42", "-c", code, hub.image)
    assert "GREETING=hello env N=42" in out and "(exit code = 0)" in out, out
    out = bob26("run", "--rm", "--name", f"env26-{x}", *RES, "-e", "GREETING=from 26",
                "-e", "N=7", "-c", code, hub.image)
    assert "GREETING=from 26 N=7" in out, out
    _, logs = batch(alice, f"envb-{x}", 'echo "batch sees $MY_VAR"', "-e", "MY_VAR=v1")
    assert "batch sees v1" in logs, logs
    before = admin_api(hub, "GET", "/sessions", params={"user_id": alice.user["id"]})["total"]
    # the platform's own variables: refused by name (the CLI exits 1 with the reason)
    out = alice("session", "create", "--type", "batch", "--name", f"envx-{x}", *RES,
                "-e", "JUPYTERHUB_API_TOKEN=stolen", "--startup-command", "true", hub.image,
                rc=1)
    assert "config.environ: 'JUPYTERHUB_API_TOKEN' is the platform's own" in out, out
    out = alice("session", "create", "--name", f"envy-{x}", *RES, "-e", "1BAD=x", hub.image,
                rc=1)
    assert "config.environ: '1BAD' is not a variable name" in out, out
    # `run` prints the same refusal; its exit code is the client's: both clients print a
    # failed create and return 0 (cli/session/execute.py _run), whatever the server says
    out = alice("run", "--name", f"envz-{x}", *RES, "-e", "BACKENDAI_KERNEL_ID=x", "-c",
                "print('never')", hub.image, rc=None)
    assert "'BACKENDAI_KERNEL_ID' is the platform's own" in out and "never" not in out, out
    assert admin_api(hub, "GET", "/sessions",
                     params={"user_id": alice.user["id"]})["total"] == before


def _sid_of(out: str) -> str:
    m = re.search(r"Session ID ([0-9a-f-]{36}) is created and ready\.", out)
    assert m, out
    return uuid.UUID(m.group(1)).hex


def test_session_events_watch_status_history_and_rename(hub, alice, bob26):
    """`session events` (26.09) and `watch` (23.09): server-sent events from the record's
    transitions, replayed from the status history and then followed until the end; watch
    exits with the batch command's exit code. `session status-history`; `session rename`
    of a batch session (an interactive one: refused, saying what to do)."""
    x = uuid.uuid4().hex[:6]
    name = f"ev-{x}"
    sid = _sid_of(alice("session", "create", "--type", "batch", "--name", name, *RES,
                        "--startup-command", "sleep 12; exit 3", hub.image))
    out = alice("watch", name, rc=3)  # follows the running session to its end
    for ev in ("session_enqueued", "session_scheduled", "session_preparing", "kernel_creating",
               "session_started", "session_failure"):
        assert ev in out, out
    assert out.index("session_enqueued") < out.index("session_started") < out.index(
        "session_failure"), out
    assert wait_dead(hub, sid)["status"] == "ERROR"
    out = bob26("session", "events", sid, rc=None)  # bob may not see it
    assert "session_enqueued" not in out and re.search(r"\b404\b", out), out
    out = alice("session", "events", name)  # ended: the whole way, replayed
    # and then the stream ends: the client does not reconnect (its retry, refused as a
    # replay of the signed request, ended the command with a 401)
    assert "server_close" in out and not re.search(r"\b401\b", out) and "replay" not in out, out
    lines = [ln for ln in out.splitlines() if ln.startswith(("session_", "kernel_"))]
    names = [ln.split()[0] for ln in lines]
    assert names == ["session_enqueued", "session_scheduled", "session_preparing",
                     "kernel_preparing", "kernel_creating", "kernel_started", "session_started",
                     "session_terminating", "kernel_terminating", "kernel_terminated",
                     "session_failure", "session_terminated"], out
    data = json.loads(lines[-2].split(None, 1)[1])
    assert (data["sessionId"], data["sessionName"], data["exitCode"]) == (
        str(uuid.UUID(sid)), name, 3), data
    out = alice("session", "events", "--scope", "kernel", name)
    assert "kernel_started" in out and "session_started" not in out, out
    out = alice("session", "status-history", name)
    assert "('preparing', '" in out and "('error', '" in out, out
    assert "('terminated', '" not in out, out  # (it ended ERROR)
    m = re.search(r"'seconds': (\d+)", out)
    assert m and int(m.group(1)) >= 12, out  # preparing until now
    # rename: a live batch session; the name's rules; a live name taken; interactive: refused
    b1 = _sid_of(bob26("session", "create", "--type", "batch", "--name", f"rn-{x}", *RES,
                       "--startup-command", "sleep 600", hub.image))
    b2 = _sid_of(bob26("session", "create", "--type", "batch", "--name", f"taken-{x}", *RES,
                       "--startup-command", "sleep 600", hub.image))
    out = bob26("session", "rename", f"rn-{x}", f"new-{x}")
    assert f"Session renamed to new-{x}." in out, out
    assert admin_api(hub, "GET", f"/sessions/{b1}")["name"] == f"new-{x}"
    out = bob26("session", "rename", f"new-{x}", f"taken-{x}", rc=1)
    assert f"a live session named 'taken-{x}' exists" in out, out
    out = bob26("session", "rename", f"new-{x}", "bad name!", rc=1)
    assert "name: must be 1 to 64 letters" in out, out
    out = alice("session", "rename", b1, f"mine-{x}", rc=1)  # not hers
    assert re.search(r"\b404\b", out), out
    assert admin_api(hub, "GET", f"/sessions/{b1}")["name"] == f"new-{x}"
    for s in (b1, b2):
        admin_api(hub, "DELETE", f"/sessions/{s}")
    iname = f"ri-{x}"
    isid = _sid_of(alice("session", "create", "--name", iname, *RES, hub.image))
    out = alice("session", "rename", iname, f"other-{x}", rc=1)
    assert "JupyterHub cannot rename a server" in out, out
    alice("session", "rm", iname)
    assert wait_dead(hub, isid)["status"] == "TERMINATED"


def test_session_restart(hub, alice, tmp_path):
    """`session restart`: an interactive session (a JupyterHub server) starts again under its
    name with the same resources and folders (a new session id); so does a running batch
    session, which runs its command again (never 404/405)."""
    x = uuid.uuid4().hex[:6]
    name, vf = f"rs-{x}", f"rsf-{x}"
    alice("vfolder", "create", vf, "local:volume1")
    old = _sid_of(alice("session", "create", "--name", name, "-r", "cpu=0.5", "-r", "mem=640m",
                        "-m", vf, hub.image))
    out = alice("session", "restart", name)
    assert "Done." in out, out
    assert wait_dead(hub, old)["status"] == "TERMINATED"
    live = [s for s in admin_api(hub, "GET", "/sessions", params={
        "user_id": alice.user["id"], "status": "RUNNING"})["items"] if s["name"].endswith(name)]
    assert len(live) == 1 and live[0]["id"] != old, live
    new = live[0]
    assert new["requested_slots"]["mem"] == str(640 * 2**20), new
    assert vf in [m["name"] for m in new["vfolder_mounts"]], new  # (and the home)
    assert hub.wait_ready(alice.user["username"], name)["ready"] is True
    b = _sid_of(alice("session", "create", "--type", "batch", "--name", f"rsb-{x}", *RES,
                      "--startup-command", "sleep 600", hub.image))
    assert admin_api(hub, "GET", f"/sessions/{b}")["status"] == "RUNNING"
    out = alice("session", "restart", f"rsb-{x}")
    assert "Done." in out, out
    old_b = admin_api(hub, "GET", f"/sessions/{b}")
    assert (old_b["status"], old_b["status_info"]) == ("TERMINATED", "restarted"), old_b
    again = [s for s in admin_api(hub, "GET", "/sessions", params={
        "user_id": alice.user["id"], "status": "RUNNING"})["items"]
        if s["name"].endswith(f"rsb-{x}")]
    assert len(again) == 1 and again[0]["startup_command"] == "sleep 600", again
    assert again[0]["requested_slots"] == old_b["requested_slots"]
    admin_api(hub, "DELETE", f"/sessions/{again[0]['id']}")
    alice("session", "rm", name)
    assert wait_dead(hub, new["id"])["status"] == "TERMINATED"
    admin_api(hub, "DELETE", f"/vfolders/{folder(hub, vf)['id']}")


def cli_run(bai: BAI, *args: str, timeout: float = 90) -> tuple[int, str]:
    """The CLI with a shorter limit than BAI's (a command that would wait forever, as the
    app proxy's listener, fails the test instead of holding it); (exit code, output)."""
    p = subprocess.run([bai.exe, *args], env=bai.env, capture_output=True, text=True,
                       timeout=timeout, input="y\n")
    return p.returncode, p.stdout + p.stderr


def test_refused_routes_name_what_to_use_instead(hub, alice, bob26, root):
    """What the clients call and this hub does not offer (ssh, a running
    session's files, commit, server and task logs, domain
    rename, scaling-group drivers, etcd, ...): a 4xx whose message names what to use
    instead, never a bare 404; nothing changes."""
    x = uuid.uuid4().hex[:6]
    name = f"rf-{x}"
    sid = _sid_of(alice("session", "create", "--type", "batch", "--name", name, *RES,
                        "--startup-command", "sleep 600", hub.image))
    cases = [
        (alice, ("app", name, "jupyter"), "has no apps to forward: apps are forwarded from"),
        (alice, ("ssh", name), "does not offer SSH"),
        (alice, ("session", "download", name, "a.txt"),
         "is a batch session: files are read in an interactive"),
        (alice, ("session", "ls", name), "is a batch session: files are read in an interactive"),
        (alice, ("session", "commit", name), "no registry to push session"),
        (alice, ("server-logs", "list"), "the server's error log is the hub's own log"),
        (alice, ("task-logs", str(uuid.uuid4())), "background task logs are not kept"),
        (root, ("admin", "etcd", "get", "x"), "only the container registries' keys are served"),
        (root, ("admin", "manager", "status"), "the manager's status and freezing"),
        (root, ("admin", "announcement", "update", "-m", "hi"), "announcements are not"),
        (root, ("admin", "domain", "update", "default", "--new-name", f"d-{x}"),
         "domains cannot be renamed"),
        (root, ("admin", "scaling-group", "add", f"sg-{x}", "--driver-opts", '{"a": 1}'),
         "driver_opts: the static driver takes none; use scheduler_opts"),
        (root, ("admin", "scaling-group", "add", f"sg-{x}", "--driver", "aws"),
         "driver: only 'static' here"),
    ]
    wrong = []
    for bai, args, words in cases:
        rc, out = cli_run(bai, *args)
        # (`apps` prints an error and exits 0: the clients' own code, cli/app.py). A 404
        # is a status of its own: a session id in the output may hold the digits "404".
        if words not in out or re.search(r"\b404\b", out) or (rc == 0 and args[0] != "apps"):
            wrong.append(f"{args}: rc {rc}\n{out[-800:]}")
    assert not wrong, "\n\n".join(wrong)
    # every refused route answers 400 in Backend.AI's shape, for every method
    sa = superadmin(hub)
    for method, path in (("GET", f"/stream/session/{name}/httpproxy"),
                         ("GET", "/folders/_/mounts"),
                         ("PATCH", "/services/x"), ("GET", "/logs/error")):
        r = alice.user["client"](method, path)
        assert r.status_code == 400 and " not " in r.json()["title"], (method, path, r.text)
        assert r.headers["Content-Type"] == "application/problem+json"
    assert sa.ok("GET", "/domains/default")["name"] == "default"
    assert sa("GET", f"/resource-groups/sg-{x}").status_code == 404
    admin_api(hub, "DELETE", f"/sessions/{sid}")


WALK = """
import json
import click
from ai.backend.cli.__main__ import main

def walk(cmd, path):
    if not isinstance(cmd, click.Group):
        return [" ".join(path)]
    out = []
    for name in sorted(cmd.commands):
        if not getattr(cmd.commands[name], "hidden", False):
            out += walk(cmd.commands[name], path + [name])
    return out

print(json.dumps(walk(main, [])))
"""


def test_compat_table_names_every_command():
    """docs/backendai-compat.md's table names every command the installed clients offer
    (their click command trees, walked in each client's own Python), with the right
    client columns and an answer of a known kind; no row names a command neither has."""
    offered = {}
    for label, cli in (("23.9.10", CLI), ("26.9.6", CLI26)):
        py = os.path.join(os.path.dirname(cli), "python")
        p = subprocess.run([py, "-c", WALK], capture_output=True, text=True, timeout=120,
                           env={"PATH": os.environ["PATH"], "HOME": "/nonexistent"})
        assert p.returncode == 0, p.stderr
        offered[label] = set(json.loads(p.stdout))
        assert len(offered[label]) > 100, offered[label]  # (the walk found the tree)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "backendai-compat.md")) as fh:
        doc = fh.read()
    section = doc[doc.index("## Every command of both clients"):]
    section = section[:section.index("\n## ")] if "\n## " in section else section
    rows = {}
    for line in section.splitlines():
        m = re.fullmatch(r"\| `([^`]+)` \| (yes|—) \| (yes|—) \| (.+) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2) == "yes", m.group(3) == "yes", m.group(4))
    every = offered["23.9.10"] | offered["26.9.6"]
    assert sorted(every - set(rows)) == [], "commands the table does not name"
    assert sorted(set(rows) - every) == [], "rows naming a command no client offers"
    wrong = [c for c, (in23, in26, _) in rows.items()
             if (in23, in26) != (c in offered["23.9.10"], c in offered["26.9.6"])]
    assert wrong == [], "rows with a wrong client column"
    kinds = ("works", "refused: ", "not offered (untested): ", "client only", "see ")
    assert [c for c, (_, _, here) in rows.items() if not here.startswith(kinds)] == []
