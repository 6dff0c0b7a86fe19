"""What ``backendai-admin``'s bootstrap commands ask of the record (cli.py).

They run where no hub (and so no manager) runs: a fresh install, an image build, a
restore, or when nobody can log in any more. :func:`check_database` says whether a
database URL holds a migrated database without creating anything; :class:`..operations.Record`
opens one (migrating it, as the hub does when it starts) and runs the manager's named
operations (manager/ops.py) on it in the calling thread::

    with Record(url) as record:
        record.ops.bootstrap_domain("lab")

each in the transaction it declares. The operations here return plain data; the
command shapes its output.
"""

from __future__ import annotations

import os

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from ..common.errors import InvalidRequest, NotFound
from ..models.db import (
    VERSION_TABLE,
    alembic_config,
)
from . import tenancy
from .ops import writes


class NoDatabase(Exception):
    """There is no migrated database where the command looked."""


def shown_url(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a malformed URL is shown as given
        return url


def check_database(url: str, source: str = "--db") -> None:
    """Refuse (NoDatabase) unless ``url`` holds a database migrated to this version.

    Nothing is created: an SQLite file that does not exist is not opened.
    """
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    hint = ("run `backendai-admin db-upgrade` there first, or point at the hub's database "
            "with --db, BACKENDAI_DB_URL or BACKENDAI_STATE_DIR")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise NoDatabase(f"{url!r} (from {source}) is not a database URL") from None
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database or ""
        if not path or path == ":memory:" or "mode=memory" in url:
            raise NoDatabase(f"{url} (from {source}) is an in-memory database: it holds nothing")
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise NoDatabase(f"no database at {path} (from {source}: {url}); {hint}")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    except SQLAlchemyError as e:
        raise NoDatabase(f"cannot open the database {shown_url(url)} (from {source}): "
                         f"{str(e.orig if hasattr(e, 'orig') and e.orig else e).strip()}; "
                         f"{hint}") from None
    finally:
        engine.dispose()
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    if current is None:
        raise NoDatabase(f"the database {shown_url(url)} (from {source}) is not a migrated "
                         f"Backend.AI database (no schema version); {hint}")
    if current != head:
        raise NoDatabase(f"the database {shown_url(url)} (from {source}) is at schema version "
                         f"{current}, this version needs {head}: run `backendai-admin "
                         "db-upgrade` (the hub does so when it starts)")


def make_sqlite_dir(url: str) -> None:
    """The directory of an SQLite file database (mode 0700), before it is created."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        os.makedirs(os.path.dirname(os.path.abspath(parsed.database)), mode=0o700,
                    exist_ok=True)


def sqlite_path(db_url: str) -> str | None:
    """The absolute path of a SQLite database file (None: not SQLite, or in memory)."""
    if not db_url.startswith("sqlite"):
        return None
    path = make_url(db_url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return os.path.abspath(path)


def _user(db, login: str):
    user = tenancy.find_user(db, login)
    if user is None:
        raise NotFound(f"no user with email or username {login!r}")
    return user


@writes
def bootstrap_superadmin(db, email: str, password: str) -> dict | None:
    """A superadmin with ``email`` (username ``admin`` while nobody has it) and a
    keypair; None when a user with that email or username exists (nothing changes)."""
    if tenancy.find_user(db, email) is not None:
        return None
    user, kp, secret = tenancy.create_user(
        db, email=email, password=password, role="superadmin",
        username="admin" if tenancy.find_user(db, "admin") is None else None)
    return {"username": user.username, "access_key": kp.access_key, "secret_key": secret}


@writes
def bootstrap_domain(db, name: str) -> str:
    """A new domain; its name."""
    return tenancy.create_domain(db, name).name


@writes
def bootstrap_project(db, domain: str, name: str) -> dict:
    """A new project of ``domain``: its name, id and domain."""
    pj = tenancy.create_project(db, domain, name)
    return {"name": pj.name, "id": pj.id, "domain": pj.domain_name}


@writes
def bootstrap_user(db, *, email: str, password: str, username: str | None, role: str,
                   domain: str, status: str, projects: list[str] | None) -> dict:
    """A new user with its main keypair: username, email, access and secret key."""
    user, kp, secret = tenancy.create_user(
        db, email=email, password=password, username=username, role=role, domain=domain,
        status=status, projects=projects)
    return {"username": user.username, "email": user.email, "access_key": kp.access_key,
            "secret_key": secret}


@writes
def bootstrap_keypair(db, login: str) -> dict:
    """A new keypair of the user ``login`` (email or username): access and secret key."""
    kp, secret = tenancy.create_keypair(db, _user(db, login))
    return {"access_key": kp.access_key, "secret_key": secret}


@writes
def bootstrap_reset_password(db, login: str, password: str) -> dict:
    """Give the user ``login`` (email or username) the password ``password``: their
    email and username."""
    user = _user(db, login)
    if len(password) < 8:
        raise InvalidRequest("the password must be at least 8 characters")
    if len(password.encode()) > 72:
        raise InvalidRequest("the password must be at most 72 bytes (bcrypt's limit)")
    user.password = tenancy.hash_password(password)
    return {"email": user.email, "username": user.username}
