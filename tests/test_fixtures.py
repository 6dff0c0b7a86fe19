"""Fixture documents: the record they describe is created once, exactly, or not at all."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from decimal import Decimal

import pytest
from sqlalchemy import func, select

from jupyterhub_backendai.manager import tenancy
from jupyterhub_backendai.manager.fixtures import FixtureError, populate, populate_file
from jupyterhub_backendai.models import (
    Domain,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ResourceGroup,
    User,
    UserResourcePolicy,
)
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "binder", "demo-fixture.json")

# A document with every kind, including references from later kinds to earlier ones.
FULL = {
    "domains": [{"name": "lab", "description": "a lab", "total_resource_slots": {"cpu": 8}}],
    "keypair_resource_policies": [
        {"name": "small", "total_resource_slots": {"cpu": "1.5", "mem": "2g"},
         "default_for_unspecified": "LIMITED", "max_concurrent_sessions": 2, "max_priority": 10},
    ],
    "user_resource_policies": [{"name": "folders", "max_vfolder_count": 3}],
    "project_resource_policies": [{"name": "proj", "max_quota_scope_size": 1024}],
    "projects": [{"name": "ml", "domain": "lab", "resource_policy": "proj",
                  "total_resource_slots": {"cuda.device": 2}}],
    "users": [
        {"email": "carol@lab.example", "password": "carol-pass-1", "domain": "lab",
         "projects": ["ml"], "keypair_resource_policy": "small", "resource_policy": "folders",
         "full_name": "Carol"},
    ],
    "keypairs": [
        {"user": "carol@lab.example", "access_key": "AKIATESTCAROL0000001",
         "secret_key": "carol-secret-key-0123456789", "resource_policy": "default",
         "rate_limit": 50},
    ],
    "resource_groups": [{"name": "gpu", "scheduler": "fifo", "allowed_domains": ["lab"]}],
}


def _counts(s) -> dict:
    return {
        m.__name__: s.scalar(select(func.count()).select_from(m))
        for m in (Domain, Project, User, Keypair, KeypairResourcePolicy, UserResourcePolicy,
                  ResourceGroup)
    }


def _session(db_url):
    engine = make_engine(db_url)
    return engine, make_sessionmaker(engine)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run where a default storage volume (./backendai-vfroot) may be made."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_demo_fixture_creates_the_demo_record(db_url, in_tmp):
    out = populate_file(db_url, DEMO)
    assert out["created"]["users"] == ["admin@demo.example", "alice@demo.example", "bob@demo.example"]
    engine, sm = _session(db_url)
    try:
        with sm() as s:
            policy = s.get(KeypairResourcePolicy, "demo")
            assert policy.total_resource_slots == {"cpu": Decimal(1)}
            for login in ("alice@demo.example", "bob@demo.example"):
                user = tenancy.find_user(s, login)
                assert user.domain_name == "demo"
                assert [p.name for p in user.projects] == ["demo-project"]
                kp = tenancy.default_keypair(s, user)
                assert kp.resource_policy == "demo" and kp.is_default and not kp.is_admin
                assert tenancy.check_password(login.split("@")[0] + "-demo-pass", user.password)
                assert user.password != login.split("@")[0] + "-demo-pass"
            admin = tenancy.find_user(s, "admin")
            assert admin.role == "superadmin" and admin.email == "admin@demo.example"
            assert tenancy.default_keypair(s, admin).is_admin
            assert tenancy.default_keypair(s, admin).resource_policy == "default"
    finally:
        engine.dispose()


def test_loading_twice_leaves_what_exists(db_url, in_tmp):
    populate_file(db_url, DEMO)
    engine, sm = _session(db_url)
    try:
        with sm.begin() as s:
            alice = tenancy.find_user(s, "alice@demo.example")
            # An operator's later changes must survive a second load.
            alice.password = tenancy.hash_password("changed-by-alice")
            s.get(KeypairResourcePolicy, "demo").max_concurrent_sessions = 9
            before = _counts(s)
            keys = sorted(s.scalars(select(Keypair.access_key)))
        out = populate_file(db_url, DEMO)
        assert not any(out["created"].values()), out
        assert out["existing"]["users"] == ["admin@demo.example", "alice@demo.example", "bob@demo.example"]
        with sm() as s:
            assert _counts(s) == before
            assert sorted(s.scalars(select(Keypair.access_key))) == keys
            alice = tenancy.find_user(s, "alice@demo.example")
            assert tenancy.check_password("changed-by-alice", alice.password)
            assert s.get(KeypairResourcePolicy, "demo").max_concurrent_sessions == 9
    finally:
        engine.dispose()


def test_every_kind_and_exact_amounts(sm, tmp_path):
    # Fractions from a file stay exact (JSON floats are read as Decimal).
    path = tmp_path / "full.json"
    doc = copy.deepcopy(FULL)
    doc["keypair_resource_policies"][0]["total_resource_slots"]["cpu"] = 0.1
    path.write_text(json.dumps(doc))
    with sm.begin() as s:
        out = populate(s, json.loads(path.read_text(), parse_float=Decimal))
    assert out["created"]["keypairs"] == ["AKIATESTCAROL0000001"]
    with sm() as s:
        assert s.get(KeypairResourcePolicy, "small").total_resource_slots == {
            "cpu": Decimal("0.1"), "mem": Decimal(2 * 2**30)}
        assert s.get(KeypairResourcePolicy, "small").default_for_unspecified == "LIMITED"
        proj = s.scalar(select(Project).where(Project.name == "ml"))
        assert proj.domain_name == "lab" and proj.resource_policy == "proj"
        assert proj.total_resource_slots == {"cuda.device": Decimal(2)}
        carol = tenancy.find_user(s, "carol")
        assert carol.resource_policy == "folders" and carol.full_name == "Carol"
        keys = {k.access_key: k for k in carol.keypairs}
        assert len(keys) == 2
        explicit = keys["AKIATESTCAROL0000001"]
        assert explicit.secret_key == "carol-secret-key-0123456789"
        assert explicit.rate_limit == 50 and not explicit.is_default
        assert tenancy.default_keypair(s, carol).resource_policy == "small"
        assert s.get(ResourceGroup, "gpu").allowed_domains == ["lab"]


BAD = [
    # (where to change the valid FULL document, the message it must give)
    (lambda d: d["users"][0].update(password="short"),
     "users[0] (carol@lab.example): password must be at least 8 characters"),
    (lambda d: d["users"][0].update(keypair_resource_policy="nope"),
     "users[0] (carol@lab.example): no keypair resource policy 'nope'"),
    (lambda d: d["users"][0].update(projects=["ml", "missing"]),
     "users[0] (carol@lab.example): no project 'missing' in domain 'lab'"),
    (lambda d: d["users"][0].update(role="emperor"),
     "users[0] (carol@lab.example): unknown role 'emperor'"),
    (lambda d: d["users"][0].update(pasword="typo"),
     "users[0] (carol@lab.example): unknown field(s) 'pasword'"),
    (lambda d: d["users"].append(dict(d["users"][0])),
     "users[1] (carol@lab.example): duplicate of users[0]"),
    (lambda d: d["keypairs"][0].update(user="nobody@lab.example"),
     "keypairs[0] (AKIATESTCAROL0000001): no user 'nobody@lab.example'"),
    (lambda d: d["keypairs"][0].update(access_key="AKIA-not/valid"),
     "keypairs[0] (AKIA-not/valid): access_key 'AKIA-not/valid' is not valid"),
    (lambda d: d["keypairs"][0].pop("secret_key"),
     "keypairs[0] (AKIATESTCAROL0000001): 'secret_key' is required"),
    (lambda d: d["keypair_resource_policies"][0]["total_resource_slots"].update(cpu="-1"),
     "keypair_resource_policies[0] (small): total_resource_slots slot 'cpu' must not be negative"),
    (lambda d: d["keypair_resource_policies"][0]["total_resource_slots"].update(mem="lots"),
     "keypair_resource_policies[0] (small): total_resource_slots slot 'mem': invalid size"),
    (lambda d: d["keypair_resource_policies"][0].update(max_concurrent_sessions=True),
     "keypair_resource_policies[0] (small): max_concurrent_sessions must be an integer"),
    (lambda d: d["projects"][0].update(domain="elsewhere"),
     "projects[0] (elsewhere/ml): no domain 'elsewhere'"),
    (lambda d: d["domains"][0].update(name="Bad Name"),
     "domains[0] (Bad Name): name 'Bad Name' is not a valid name"),
    (lambda d: d["resource_groups"][0].update(allowed_domains=["lab", "ghost"]),
     "resource_groups[0] (gpu): no domain 'ghost'"),
    (lambda d: d.update(scaling_groups=[]), "unknown section(s) 'scaling_groups'"),
    (lambda d: d.update(users={"email": "x"}), "'users' must be a list"),
    (lambda d: d["users"].__setitem__(0, "carol"), "users[0] must be an object"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_entry_is_named_and_nothing_is_created(sm, change, message):
    doc = copy.deepcopy(FULL)
    change(doc)
    with sm.begin() as s:
        before = _counts(s)
        with pytest.raises(FixtureError) as err:
            populate(s, doc)
        # populate() undid its own work (a savepoint): committing the caller's
        # transaction now must not keep a half-made record.
    assert message in err.value.detail, err.value.detail
    assert err.value.status_code == 400
    with sm() as s:
        assert _counts(s) == before
        assert s.get(Domain, "lab") is None


def test_bad_file_leaves_an_empty_database(db_url, tmp_path):
    # Everything before the bad entry is valid; the database stays as it was:
    # not even the default rows or the schema's first rows are committed.
    doc = copy.deepcopy(FULL)
    doc["resource_groups"][0]["allowed_domains"] = ["ghost"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(FixtureError, match=r"resource_groups\[0\] \(gpu\): no domain 'ghost'"):
        populate_file(db_url, str(path))
    engine, sm = _session(db_url)
    try:
        with sm() as s:
            assert set(_counts(s).values()) == {0}
    finally:
        engine.dispose()


def test_command_line(tmp_path):
    """``python -m jupyterhub_backendai.manager.fixtures``: JSON out, or the reason and 2."""
    db = f"sqlite:///{tmp_path}/cli.sqlite"
    cmd = [sys.executable, "-m", "jupyterhub_backendai.manager.fixtures", db]
    (tmp_path / "broken.json").write_text('{"users": [')
    r = subprocess.run([*cmd, str(tmp_path / "broken.json")], capture_output=True, text=True)
    assert r.returncode == 2
    assert "broken.json is not valid JSON" in r.stderr
    r = subprocess.run([*cmd, str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert r.returncode == 2 and "cannot read" in r.stderr and "missing.json" in r.stderr
    r = subprocess.run([*cmd, DEMO], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["created"]["keypair_resource_policies"] == ["demo"]


# -- vfolders -------------------------------------------------------------------------

VF_DOC = {
    "domains": [{"name": "lab"}],
    "projects": [{"name": "ml", "domain": "lab"}],
    "users": [
        {"email": "carol@lab.example", "password": "carol-pass-1", "domain": "lab",
         "projects": ["ml"]},
        {"email": "dan@lab.example", "password": "dan-pass-12", "domain": "lab", "projects": []},
    ],
    "vfolders": [
        {"name": "team", "project": "ml", "domain": "lab", "permission": "ro",
         "files": {"README.md": "# Team\n", "data/raw/x.csv": "a,b\n1,2\n"}},
        {"name": "carol-notes", "owner": "carol@lab.example",
         "shares": [{"email": "dan@lab.example", "permission": "rw"}],
         "files": {"todo.txt": "write tests\n"}},
    ],
}


def _storage(root):
    from jupyterhub_backendai.manager.fixtures import storage_from

    storage, _host = storage_from({"volume1": str(root)})
    return storage


def _dirs(root) -> list[str]:
    """Every file and directory under a volume, relative to it (quota files aside)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + [f for f in filenames if not f.startswith(".quota")]:
            out.append(os.path.relpath(os.path.join(dirpath, n), root))
    return sorted(out)


def test_vfolders_with_files_and_shares(sm, tmp_path):
    from jupyterhub_backendai.models import VFolder, VFolderPermissionRow

    root = tmp_path / "vol"
    with sm.begin() as s:
        out = populate(s, VF_DOC, _storage(root))
    assert len(out["created"]["vfolders"]) == 2
    with sm() as s:
        team = s.scalar(select(VFolder).where(VFolder.name == "team"))
        notes = s.scalar(select(VFolder).where(VFolder.name == "carol-notes"))
        ml = s.scalar(select(Project).where(Project.name == "ml"))
        carol = tenancy.find_user(s, "carol@lab.example")
        dan = tenancy.find_user(s, "dan@lab.example")
        assert (team.ownership_type, team.project_id, team.permission, team.status, team.host) == (
            "project", ml.id, "ro", "ready", "local:volume1")
        assert (notes.ownership_type, notes.user_id, notes.permission) == ("user", carol.id, "rw")
        share = s.get(VFolderPermissionRow, (notes.id, dan.id))
        assert share.permission == "rw"
        team_dir = root / "project" / ml.id / team.id
        notes_dir = root / "user" / carol.id / notes.id
    assert (team_dir / "README.md").read_text() == "# Team\n"
    assert (team_dir / "data" / "raw" / "x.csv").read_text() == "a,b\n1,2\n"
    assert (notes_dir / "todo.txt").read_text() == "write tests\n"
    # A second load leaves the folders and their files as they are.
    (notes_dir / "todo.txt").write_text("changed by carol")
    before = _dirs(root)
    with sm.begin() as s:
        again = populate(s, VF_DOC, _storage(root))
    assert again["created"]["vfolders"] == [] and len(again["existing"]["vfolders"]) == 2
    assert _dirs(root) == before
    assert (notes_dir / "todo.txt").read_text() == "changed by carol"


@pytest.mark.parametrize("change, message", [
    (lambda d: d["vfolders"][1].update(owner="nobody@lab.example"), "no user 'nobody@lab.example'"),
    (lambda d: d["vfolders"][1]["shares"].append({"email": "admin@example.com"}),
     "no user 'admin@example.com' in domain 'lab'"),
    (lambda d: d["vfolders"][0].update(files={"../escape": "x"}), "'..'"),
    (lambda d: d["vfolders"][0].update(host="nfs:volume1"), "unknown vfolder host 'nfs:volume1'"),
    (lambda d: d["vfolders"][0].update(owner="carol@lab.example"), "either 'owner'"),
    (lambda d: d["vfolders"][0].update(name="../x"), "invalid vfolder name"),
    (lambda d: d["vfolders"][0].update(shares=[{"email": "dan@lab.example"}]), "membership"),
    # The storage refuses: "a" is a file, so "a/b" cannot be made (after the first folder).
    (lambda d: d["vfolders"][1].update(files={"a": "x", "a/b": "y"}), "the storage refused"),
])
def test_bad_vfolder_leaves_nothing_in_the_record_or_on_the_storage(sm, tmp_path, change, message):
    from jupyterhub_backendai.models import VFolder

    doc = copy.deepcopy(VF_DOC)
    change(doc)
    root = tmp_path / "vol"
    storage = _storage(root)
    with sm.begin() as s:
        before = _counts(s)
        with pytest.raises(FixtureError) as err:
            populate(s, doc, storage)
    assert message in err.value.detail, err.value.detail
    with sm() as s:
        assert _counts(s) == before
        assert s.scalar(select(func.count()).select_from(VFolder)) == 0
    assert [d for d in _dirs(root) if d.count("/") >= 2] == []  # no folder directory


def test_vfolders_need_a_storage(sm):
    with sm.begin() as s, pytest.raises(FixtureError, match="need a storage"):
        populate(s, VF_DOC)


def test_cli_populates_folders_on_the_given_volume(tmp_path):
    """``backendai-admin fixture populate --storage-volume``: where the hub's volume is."""
    db = f"sqlite:///{tmp_path}/cli.sqlite"
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(VF_DOC))
    exe = os.path.join(os.path.dirname(sys.executable), "backendai-admin")
    for url in (db, f"sqlite:///{tmp_path}/cli2.sqlite"):  # only db-upgrade makes a database
        subprocess.run([exe, "--db", url, "db-upgrade"], check=True, capture_output=True)
    r = subprocess.run([exe, "--db", db, "fixture", "populate", str(doc), "--json", "--storage-volume",
                        f"volume1={tmp_path}/vol"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["created"]["vfolders"]) == 2
    f = next(x for x in out["folders"] if x["quota_scope_id"].startswith("project:"))
    kind, sid = f["quota_scope_id"].split(":")
    assert (tmp_path / "vol" / kind / sid / f["id"] / "README.md").read_text() == "# Team\n"
    # The hub's configuration file names the volume just as well.
    conf = tmp_path / "hub_config.py"
    conf.write_text("c = get_config()\n"
                    f"c.BackendAIManager.storage_volumes = {{'volume1': {{'path': '{tmp_path}/vol2'}}}}\n")
    db2 = f"sqlite:///{tmp_path}/cli2.sqlite"
    r = subprocess.run([exe, "--db", db2, "fixture", "populate", str(doc), "--config", str(conf)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len([d for d in _dirs(tmp_path / "vol2") if d.count("/") == 2]) == 2
    assert not (tmp_path / "backendai-vfroot").exists()
    r = subprocess.run([exe, "--db", db, "fixture", "populate", str(doc), "--storage-volume", "x"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "NAME=PATH" in r.stderr
