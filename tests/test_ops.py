"""The manager's façade of named operations (manager/ops.py, issue 11): a front end
calls ``manager.ops.<name>(...)``; the operation's own declaration decides its
transaction. Checked against a real manager and database: a write commits, a failing
write leaves nothing, a read cannot write, an unknown name is refused with words,
and the front ends (spawner, authenticator, pages) go through the façade."""

from __future__ import annotations

import asyncio
import pathlib
import re

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from jupyterhub_backendai.manager import accounts, operations, ops  # noqa: F401  (operations: every declaring module)
from jupyterhub_backendai.models import User

from .inproc import running_manager

PKG = pathlib.Path(ops.__file__).resolve().parent.parent


@ops.reads
def ops_sneaky_rename(db, username: str) -> None:
    db.scalar(select(User).where(User.username == username)).full_name = "changed in a read"
    db.flush()


def test_operations_run_in_the_transaction_they_declare(tmp_path):
    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/o.sqlite", tmp_path, "local") as mgr:
            assert await mgr.ops.add_hub_user("opsuser", "opsuser@example.org") is True
            assert await mgr.ops.add_hub_user("opsuser", "opsuser@example.org") is False
            view = await mgr.ops.hub_account("opsuser")
            assert view == {"name": "opsuser", "admin": False, "groups": ["default:default"]}

            # A failing write leaves nothing (rolled back), with the operation's words.
            with pytest.raises(ValueError, match="not a valid Backend.AI user name"):
                await mgr.ops.add_hub_user("Bad Name", "bad@example.org")
            assert await mgr.ops.login_record("bad@example.org") is None

            # A read runs read-only: what it changed is not kept. On SQLite its write
            # either happens in the read's snapshot and is rolled back, or is refused at
            # once when another writer (the manager's own loop, on a busy machine) has
            # committed since the snapshot began (SQLite cannot turn such a read into a
            # write: "database is locked" without waiting). Either way nothing is kept.
            try:
                await mgr.ops.ops_sneaky_rename("opsuser")
            except OperationalError as e:
                assert "database is locked" in str(e), e
            name = await mgr.db_read(lambda s: s.scalar(
                select(User.full_name).where(User.username == "opsuser")))
            assert name != "changed in a read"

            with pytest.raises(AttributeError, match="no operation 'drop_everything'"):
                await mgr.ops.drop_everything()

            # The password form's operation: hashing and the check in one transaction.
            rec = await mgr.ops.login_record("opsuser")
            assert rec["hash"] == accounts.NO_PASSWORD
            assert "wrong" in await mgr.ops.change_password("opsuser", "x", "new-pass-123")

    asyncio.run(run())


def test_two_operations_cannot_share_a_name():
    def hub_account(db):  # the name of an operation of manager/accounts.py
        return None

    ops.lookup("hub_account")
    with pytest.raises(RuntimeError, match="two operations are named 'hub_account'"):
        ops.reads(hub_account)


FRONT_ENDS = sorted(["spawner.py", "auth.py", "cli.py"] + [
    str(p.relative_to(PKG)) for d in ("api", "pages") for p in (PKG / d).rglob("*.py")])


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_front_ends_use_the_facade(front_end):
    """No function of a front end (the spawner, the authenticator, the API, the pages) is
    run by ``manager.db``/``db_read`` directly: they call named operations."""
    text = (PKG / front_end).read_text()
    assert not re.search(r"manager\.db(_read)?\(", text), front_end


def test_every_operation_is_found():
    """The modules manager/operations.py imports declare operations without clashes."""
    for name in ("list_sessions", "create_domain", "file_access", "update_user",
                 "resolve_folder", "console_section", "keypair_record", "quota_left",
                 "console_role", "read_sample", "bootstrap_domain"):
        fn, _write = ops.lookup(name)
        assert fn.__name__ == name


def test_the_console_lists_as_many_rows_as_one_api_page():
    """manager/pageviews.py may not import the API (the manager imports no front end),
    so it keeps its own copy of the API's largest page."""
    from jupyterhub_backendai.api import spec
    from jupyterhub_backendai.manager import pageviews

    assert pageviews.MAX_ROWS == spec.MAX_LIMIT
