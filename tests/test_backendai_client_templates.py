"""Backend.AI's session templates (``session-template``, ``create-from-template``; both
CLIs) and dotfiles (``dotfile``; the 23.09 CLI, 26.09 has no such command) against a
running hub (Docker backend): stored in the record, visible and changeable by whom
Backend.AI lets, and a session made from a template runs with its options and finds
the user's, project's and domain's dotfiles in its home folder (issue 27)."""

from __future__ import annotations

import json
import os
import re
import uuid

import pytest
import yaml

from .api_world import new_user, superadmin
from .conftest import shutdown_hub
from .hub import Hub
from .test_backendai_client import BAI, CLI, CLI26, wait_dead


@pytest.fixture(scope="module")
def hub(tmp_path_factory, docker_image):
    for cli in (CLI, CLI26):
        assert os.access(cli, os.X_OK), (
            f"{cli} is missing: run scripts/install-backendai-clients.sh")
    url = f"sqlite:///{tmp_path_factory.mktemp('baitpl')}/backendai.sqlite"
    hub = Hub(db_url=url, backend="docker").start()
    yield hub
    shutdown_hub(hub)


@pytest.fixture(scope="module")
def people(hub, tmp_path_factory):
    """alice and bob (23.09 CLI) in project "team" (and default); carol (26.09 CLI) only
    in default; root, a superadmin."""
    sa = superadmin(hub)
    x = uuid.uuid4().hex[:6]
    team = sa.ok("POST", "/projects", json={"name": f"team-{x}", "domain_name": "default"})
    default = [p for p in sa.ok("GET", "/projects")["items"] if p["name"] == "default"][0]
    out = {"team": team}
    for name, cli, projects in (("alice", CLI, [team["id"], default["id"]]),
                                ("bob", CLI26, [team["id"], default["id"]]),
                                ("carol", CLI26, [default["id"]])):
        u = new_user(sa, name=f"{name}-{x}", projects=projects)
        out[name] = BAI(hub, u, str(tmp_path_factory.mktemp(name)), cli=cli)
    root = new_user(sa, role="superadmin", name=f"root-{x}")
    out["root"] = BAI(hub, root, str(tmp_path_factory.mktemp("root")))
    return out


def _template(name: str, image: str, command: str) -> str:
    return yaml.safe_dump([{"name": name, "template": {
        "api_version": "6", "kind": "taskTemplate",
        "metadata": {"name": name, "tag": "test"},
        "spec": {"session_type": "batch",
                 "kernel": {"image": image, "environ": {"TPL_VAR": "from-template"},
                            "run": {"startup_command": command}},
                 "resources": {"cpu": "0.5", "mem": "512m"}}}}])


def _records(hub, table: str) -> int:
    import sqlalchemy as sa

    eng = sa.create_engine(hub.db_url)
    try:
        with eng.connect() as c:
            return c.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()
    finally:
        eng.dispose()


def test_session_templates_both_clients(hub, people, tmp_path):
    """create (from a YAML file), list, get (YAML and JSON), update, delete; a project's
    members see a template of that project, only its owner (or an admin) changes it, a
    user outside sees nothing of it; a batch session from it runs with its image,
    command, environment and resources; bad templates: the reason, nothing stored."""
    alice, bob, carol, root, team = (people[k] for k in ("alice", "bob", "carol", "root",
                                                         "team"))
    name = f"tpl-{uuid.uuid4().hex[:6]}"
    path = tmp_path / "tpl.yaml"
    path.write_text(_template(name, hub.image, "echo tpl-says $TPL_VAR; nproc"))
    out = alice("session-template", "create", "-f", str(path), "-g", team["name"])
    m = re.search(r"Task template ([0-9a-f]{32}) created and ready", out)
    assert m, out
    tid = m.group(1)
    # listed for its owner and a member of its project (26.09), not for carol
    out = alice("session-template", "list")
    assert name in out and tid in out, out
    out = bob("session-template", "list")
    assert name in out and tid in out, out
    out = carol("session-template", "list")
    assert tid not in out, out
    # get: YAML by default, JSON on request; the 26.09 client too
    got = yaml.safe_load(alice("session-template", "get", tid))
    assert got["spec"]["kernel"]["image"] == hub.image and got["metadata"]["name"] == name
    got = json.loads(bob("session-template", "get", tid, "-f", "json"))
    assert got["spec"]["kernel"]["environ"] == {"TPL_VAR": "from-template"}
    out = carol("session-template", "get", tid, rc=1)
    assert re.search(r"\b404\b", out) and "no session template" in out, out
    # only its owner changes it: bob (a member) and carol are refused, nothing changes
    path.write_text(_template(name, hub.image, "echo changed"))
    out = bob("session-template", "update", tid, "-f", str(path), rc=1)
    assert re.search(r"\b403\b", out), out
    out = carol("session-template", "delete", tid, "-f", rc=1)
    assert re.search(r"\b404\b", out), out
    assert "$TPL_VAR" in alice("session-template", "get", tid)
    # a session from it (23.09): the template's options, the request's name and type
    out = alice("session", "create-from-template", tid, "--name", f"{name}-s", "--type",
                "batch")
    assert f"Session ID {name}-s is created and ready." in out, out
    [sid] = [x["id"] for x in superadmin(hub).ok(
        "GET", "/sessions", params={"user_id": alice.user["id"]})["items"]
        if x["name"] == f"{name}-s"]
    s = wait_dead(hub, sid)
    assert (s["status"], s["image"].split("/")[-1], s["name"]) == (
        "TERMINATED", hub.image.split("/")[-1], f"{name}-s"), s
    assert s["requested_slots"]["cpu"] == "0.5", s
    logs = alice("session", "logs", sid)
    assert "tpl-says from-template" in logs, logs
    # carol cannot start from a template she cannot see (the 23.09 client: 26.09's
    # create-from-template fails in its own code before it sends anything, a TypeError
    # on `attach_network`)
    carol23 = BAI(hub, carol.user, str(tmp_path), cli=CLI)
    out = carol23("session", "create-from-template", tid, "--name", f"{name}-c", "--type",
                  "batch", rc=1)
    assert re.search(r"\b404\b", out) and "no session template" in out, out
    out = carol("session", "create-from-template", tid, "--name", f"{name}-c", "--type",
                "batch", rc=1)
    assert "unexpected keyword argument 'attach_network'" in out, out
    # bad templates: the reason (400), nothing stored
    before = _records(hub, "session_templates")
    for bad, words in (("kind: other\n", "only taskTemplate"),
                       ("- name: x\n  template: {spec: {kernel: {}}}\n",
                        "spec.kernel.image is required"),
                       ("[: not yaml", "neither JSON nor YAML")):
        path.write_text(bad)
        out = alice("session-template", "create", "-f", str(path), rc=1)
        assert re.search(r"\b400\b", out) and words in out, out
    assert _records(hub, "session_templates") == before
    # update and delete by the owner; the 26.09 client's delete by a superadmin
    path.write_text(_template(name, hub.image, "echo changed"))
    out = alice("session-template", "update", tid, "-f", str(path))
    assert f"Task template {tid} updated" in out, out
    assert "echo changed" in alice("session-template", "get", tid)
    out = alice("session-template", "delete", tid, "-f")
    assert f"Task template {tid} deleted" in out, out
    assert tid not in alice("session-template", "list")
    out = root("session-template", "create", "-f", str(path))
    tid2 = re.search(r"Task template ([0-9a-f]{32}) created", out).group(1)
    root26 = BAI(hub, root.user, str(tmp_path), cli=CLI26)
    assert tid2 in root26("session-template", "list", "-a")
    root26("session-template", "delete", tid2, "-f")
    assert _records(hub, "session_templates") == before - 1


def test_dotfiles_are_written_into_new_sessions(hub, people, tmp_path):
    """`dotfile create/list/get/update/delete` (23.09) for the user, a project (admins)
    and the domain (admins); a new session finds them in its home folder with their
    permissions, the user's winning over the project's over the domain's; a user cannot
    change a project's or domain's dotfiles, nor read another project's; bad paths and
    permissions: the reason, nothing stored."""
    alice, carol, root, team = (people[k] for k in ("alice", "carol", "root", "team"))
    home = tmp_path
    (home / "rc").write_text("alias ll='ls -l'  # alice\n")
    out = alice("dotfile", "create", ".alicerc", "-f", str(home / "rc"), "--perm", "600")
    assert "Dotfile .alicerc created and ready" in out, out
    (home / "g").write_text("team-dotfile\n")
    root("dotfile", "create", "conf/team.txt", "-f", str(home / "g"), "--perm", "644",
         "-g", team["name"], "-d", "default")
    (home / "d").write_text("domain-dotfile\n")
    root("dotfile", "create", "domain.txt", "-f", str(home / "d"), "-d", "default")
    (home / "shadow").write_text("from-the-domain\n")
    root("dotfile", "create", ".alicerc2", "-f", str(home / "shadow"), "-d", "default")
    (home / "mine").write_text("from-alice\n")
    alice("dotfile", "create", ".alicerc2", "-f", str(home / "mine"))
    out = alice("dotfile", "list")
    assert ".alicerc" in out and "600" in out, out
    out = alice("dotfile", "get", ".alicerc")
    assert "alias ll='ls -l'  # alice" in out, out
    out = alice("dotfile", "list", "-g", team["id"])
    assert "conf/team.txt" in out, out
    # refusals: a user changing the project's or the domain's, carol reading the team's
    out = alice("dotfile", "create", "x.txt", "-f", str(home / "g"), "-d", "default", rc=1)
    assert re.search(r"\b403\b", out), out
    out = alice("dotfile", "delete", "conf/team.txt", "-g", team["id"], "-f", rc=1)
    assert re.search(r"\b403\b", out), out
    out = BAI(hub, carol.user, str(home), cli=CLI)("dotfile", "list", "-g", team["id"], rc=1)
    assert re.search(r"\b404\b", out), out
    before = _records(hub, "dotfiles")
    for path, perm, words in (("../escape", "644", "not a relative path"),
                              ("/etc/passwd", "644", "relative to the home folder"),
                              (".ssh/authorized_keys", "644", "reserved for the platform"),
                              ("ok.txt", "999", "three octal digits")):
        out = alice("dotfile", "create", path, "-f", str(home / "g"), "--perm", perm, rc=1)
        assert re.search(r"\b400\b", out) and words in out, (path, out)
    out = alice("dotfile", "create", ".alicerc", "-f", str(home / "g"), rc=1)
    assert re.search(r"\b409\b", out), out
    assert _records(hub, "dotfiles") == before
    (home / "rc").write_text("export FROM_DOTFILE=updated\n")
    alice("dotfile", "update", ".alicerc", "-f", str(home / "rc"), "--perm", "640")
    # a new session in the team project: all of them, in its home folder
    probe = ("cd /home/work; cat .alicerc .alicerc2 conf/team.txt domain.txt; "
             "stat -c '%n %a %u' .alicerc conf/team.txt domain.txt")
    out = alice("session", "create", "--type", "batch", "--name", f"dot-{uuid.uuid4().hex[:6]}",
                "-r", "cpu=0.5", "-r", "mem=512m", "-g", team["name"],
                "--startup-command", probe, hub.image)
    m = re.search(r"Session ID ([0-9a-f-]{36}) is created and ready\.", out)
    assert m, out
    assert wait_dead(hub, uuid.UUID(m.group(1)).hex)["status"] == "TERMINATED"
    logs = alice("session", "logs", m.group(1))
    assert ("export FROM_DOTFILE=updated\nfrom-alice\nteam-dotfile\ndomain-dotfile\n"
            in logs), logs
    assert ".alicerc 640 1000\nconf/team.txt 644 1000\ndomain.txt 755 1000" in logs, logs
    # delete: gone from the list and from the record
    out = alice("dotfile", "delete", ".alicerc", "-f")
    assert ".alicerc" not in alice("dotfile", "list").replace(".alicerc2", ""), out
    assert _records(hub, "dotfiles") == before - 1
