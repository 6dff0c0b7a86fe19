"""Issue 29: a keypair resource policy's ``max_lifetime_extension`` (what an owner may add
to a session's lifetime in all) through ``backendai-admin`` and Backend.AI's GraphQL."""

from __future__ import annotations

import json

import pytest

from jupyterhub_backendai import cli

from .test_signing import hub_for, signed


@pytest.fixture(scope="module")
def hub(request, tmp_path_factory):
    yield from hub_for(request, tmp_path_factory, "sqlite")


def _cli(hub, capsys, *argv: str) -> tuple[int, str]:
    ak, sk = hub.admin_keys
    capsys.readouterr()
    rc = cli.main(["--endpoint", hub.base + "/", "--access-key", ak, f"--secret-key={sk}", *argv])
    out, err = capsys.readouterr()
    return rc, out if rc == 0 else err


def test_the_cli_sets_lists_and_refuses_a_bad_extension(hub, capsys):
    rc, out = _cli(hub, capsys, "keypair-resource-policies", "create", "name=ext1",
                   "max_session_lifetime:=3600", "max_lifetime_extension:=1800")
    assert rc == 0, out
    rc, out = _cli(hub, capsys, "keypair-resource-policies", "list")
    assert rc == 0, out
    head, *rows = out.splitlines()
    at = head.index("MAX LIFETIME EXTENSION")
    row = next(r for r in rows if r.split()[:1] == ["ext1"])
    assert row[at:].split()[:1] == ["1800"], out
    rc, out = _cli(hub, capsys, "keypair-resource-policies", "update", "ext1",
                   "max_lifetime_extension:=-5")
    assert rc != 0 and "max_lifetime_extension" in out, out
    rc, out = _cli(hub, capsys, "--json", "keypair-resource-policies", "get", "ext1")
    assert rc == 0 and json.loads(out)["max_lifetime_extension"] == 1800, out
    with pytest.raises(SystemExit) as e:
        cli.main(["keypair-resource-policies", "create", "--help"])
    assert e.value.code == 0
    assert "max_lifetime_extension: integer >= 0" in capsys.readouterr().out


def test_graphql_reads_and_modifies_the_extension(hub):
    ak, sk = hub.admin_keys

    def gql(query: str, variables: dict) -> dict:
        r = signed(hub, "POST", "/admin/gql", ak, sk,
                   json={"query": query, "variables": variables})
        assert r.status_code == 200, r.text
        return r.json()

    made = gql("mutation($n: String!, $p: CreateKeyPairResourcePolicyInput!) {"
               " create_keypair_resource_policy(name: $n, props: $p) {"
               "  ok msg resource_policy { name max_lifetime_extension } } }",
               {"n": "ext2", "p": {"total_resource_slots": "{}", "max_session_lifetime": 600,
                                   "max_concurrent_sessions": 1, "max_containers_per_session": 1,
                                   "idle_timeout": 0, "allowed_vfolder_hosts": "{}",
                                   "max_lifetime_extension": 300}})
    assert made["data"]["create_keypair_resource_policy"] == {
        "ok": True, "msg": "success",
        "resource_policy": {"name": "ext2", "max_lifetime_extension": 300}}, made
    changed = gql("mutation($n: String!, $p: ModifyKeyPairResourcePolicyInput!) {"
                  " modify_keypair_resource_policy(name: $n, props: $p) { ok msg } }",
                  {"n": "ext2", "p": {"max_lifetime_extension": 900}})
    assert changed["data"]["modify_keypair_resource_policy"]["ok"] is True, changed
    refused = gql("mutation($n: String!, $p: ModifyKeyPairResourcePolicyInput!) {"
                  " modify_keypair_resource_policy(name: $n, props: $p) { ok msg } }",
                  {"n": "ext2", "p": {"max_lifetime_extension": -1}})
    out = refused["data"]["modify_keypair_resource_policy"] if refused.get("data") else None
    assert (out and out["ok"] is False and "max_lifetime_extension" in out["msg"]) or \
        "max_lifetime_extension" in json.dumps(refused.get("errors")), refused
    got = gql("query($n: String) { keypair_resource_policy(name: $n) {"
              " name max_lifetime_extension max_session_lifetime } }", {"n": "ext2"})
    assert got["data"]["keypair_resource_policy"] == {
        "name": "ext2", "max_lifetime_extension": 900, "max_session_lifetime": 600}, got
