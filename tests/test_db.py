"""The database seam: read-only sessions on SQLite neither wait for nor block a writer."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
import warnings

import pytest
from sqlalchemy import select, text

from jupyterhub_backendai.models import Domain
from jupyterhub_backendai.models.db import make_engine, make_read_sessionmaker, upgrade


def test_sqlite_reads_do_not_wait_for_a_writer(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/db.sqlite")
    upgrade(engine)
    reader = make_read_sessionmaker(engine)
    writer_started, reader_done = threading.Event(), threading.Event()
    seen: list[list[str]] = []
    waited: list[bool] = []

    def write():
        with engine.begin() as conn:  # BEGIN IMMEDIATE: holds the write lock
            conn.execute(Domain.__table__.insert().values(
                name="d1", description="", is_active=True, total_resource_slots={},
                allowed_vfolder_hosts={}, allowed_docker_registries=[],
                created_at=dt.datetime.now(dt.UTC)))
            writer_started.set()
            # Commit only after the reader finished: it must not have waited for us.
            waited.append(not reader_done.wait(10))

    t = threading.Thread(target=write)
    t.start()
    assert writer_started.wait(10)
    with reader() as s:
        seen.append(list(s.scalars(select(Domain.name))))
    reader_done.set()
    t.join()
    assert waited == [False], "the read waited for the writer's lock"
    # The snapshot the reader saw predates the uncommitted insert.
    assert seen == [[]]
    with reader() as s:
        assert list(s.scalars(select(Domain.name))) == ["d1"]
    engine.dispose()


def test_sqlite_commits_without_an_fsync_each_and_a_killed_writer_keeps_them(tmp_path):
    """WAL with synchronous=NORMAL (docs/architecture.md "Seams"): what a process
    committed before it was killed is there for the next one, what it had not committed
    is not, and the file is sound."""
    import subprocess
    import sys

    path = tmp_path / "db.sqlite"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    engine.dispose()
    writer = f"""
import datetime as dt, os, signal
from jupyterhub_backendai.models import Domain
from jupyterhub_backendai.models.db import make_engine
engine = make_engine("sqlite:///{path}")
def row(name):
    return Domain.__table__.insert().values(
        name=name, description="", is_active=True, total_resource_slots={{}},
        allowed_vfolder_hosts={{}}, allowed_docker_registries=[],
        created_at=dt.datetime.now(dt.UTC))
for i in range(20):
    with engine.begin() as conn:
        conn.execute(row(f"kept{{i}}"))
conn = engine.connect()
conn.begin()
conn.execute(row("uncommitted"))
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", writer], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    engine = make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        names = sorted(conn.execute(select(Domain.name)).scalars())
    engine.dispose()
    assert names == sorted(f"kept{i}" for i in range(20))


def test_the_migrations_build_the_models_schema(db_url):
    """Upgrading an empty database to head gives exactly the tables, columns, indexes and
    constraints the models declare (alembic's autogenerate comparison finds nothing to
    do): a model changed without its migration fails here, on SQLite and PostgreSQL."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from jupyterhub_backendai.models.base import Base
    from jupyterhub_backendai.models.db import VERSION_TABLE

    engine = make_engine(db_url)
    try:
        upgrade(engine)
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={
                "compare_type": True, "version_table": VERSION_TABLE})
            with warnings.catch_warnings():  # SQLite: expression indexes are not compared
                warnings.simplefilter("ignore")
                diff = compare_metadata(ctx, Base.metadata)
            # So look for the one expression index by name, in the catalogue.
            catalogue = ("SELECT name FROM sqlite_master WHERE type = 'index'"
                         if engine.dialect.name == "sqlite"
                         else "SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")
            indexes = set(conn.execute(text(catalogue)).scalars())
    finally:
        engine.dispose()
    assert diff == [], diff
    assert "ix_users_email_lower" in indexes and "ix_sessions_access_key" not in indexes


def test_a_postgresql_deadlock_is_run_again(postgres):
    """Two transactions that lock two rows in opposite order: PostgreSQL aborts one
    (deadlock_detected, 40P01), as it did between ``enqueue``'s foreign-key check on a
    dependency's row and another writer of that row. ``in_transaction`` (under
    ``Manager.db`` and ``Record.write``) runs the aborted one again, so both commit."""
    from jupyterhub_backendai.models.db import in_transaction, make_sessionmaker

    engine = make_engine(postgres.new_database("deadlock_" + uuid.uuid4().hex[:8]))
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE pair (id int PRIMARY KEY, v int NOT NULL)"))
            conn.execute(text("INSERT INTO pair VALUES (1, 0), (2, 0)"))
        maker = make_sessionmaker(engine)
        both_hold_one = threading.Barrier(2, timeout=20)
        runs = {"a": 0, "b": 0}
        results, errors = {}, []

        def locker(name, first, second):
            def fn(s):
                runs[name] += 1
                s.execute(text("UPDATE pair SET v = v + 1 WHERE id = :i"), {"i": first})
                if runs[name] == 1:
                    both_hold_one.wait()  # each holds its first row: the cycle
                s.execute(text("UPDATE pair SET v = v + 1 WHERE id = :i"), {"i": second})
                return name

            try:
                results[name] = in_transaction(maker, fn)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=locker, args=("a", 1, 2)),
                   threading.Thread(target=locker, args=("b", 2, 1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert results == {"a": "a", "b": "b"}
        # At least one was aborted by the server and ran again (a retry may meet the other
        # once more); each committed once.
        assert min(runs.values()) >= 1 and max(runs.values()) >= 2, runs
        with engine.connect() as conn:
            assert dict(conn.execute(text("SELECT id, v FROM pair")).all()) == {1: 2, 2: 2}
    finally:
        engine.dispose()


def test_an_ordinary_database_error_is_not_run_again(postgres):
    """Only the server's "try again" errors are retried: a broken constraint is the
    caller's, raised at once after one run, with nothing committed."""
    from sqlalchemy.exc import IntegrityError

    from jupyterhub_backendai.models.db import in_transaction, make_sessionmaker

    engine = make_engine(postgres.new_database("noretry_" + uuid.uuid4().hex[:8]))
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE one (id int PRIMARY KEY)"))
        runs = []

        def fn(s):
            runs.append(1)
            s.execute(text("INSERT INTO one VALUES (1)"))
            s.execute(text("INSERT INTO one VALUES (1)"))

        with pytest.raises(IntegrityError):
            in_transaction(make_sessionmaker(engine), fn)
        assert runs == [1]
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM one")) == 0
    finally:
        engine.dispose()


def _domain(name: str):
    return Domain.__table__.insert().values(
        name=name, description="", is_active=True, total_resource_slots={},
        allowed_vfolder_hosts={}, allowed_docker_registries=[],
        created_at=dt.datetime.now(dt.UTC))


def test_sqlite_writers_of_this_process_wait_for_each_other_not_in_the_busy_handler(
        tmp_path, monkeypatch):
    """Writers of one process take turns on a lock: the next starts when the last
    commits or rolls back, across engines on the same file. SQLite's busy handler is
    not asked: with its timeout at 0 (it would refuse at once, "database is locked")
    a writer that meets another still gets its turn. A writer of another process is
    still waited for by SQLite itself."""
    import subprocess
    import sys

    from jupyterhub_backendai.models import db as dbmod

    path = tmp_path / "db.sqlite"
    url = f"sqlite:///{path}"
    upgrade(url)
    no_busy_wait = {"connect_args": {"check_same_thread": False, "timeout": 0}}
    first, second = make_engine(url, **no_busy_wait), make_engine(url, **no_busy_wait)
    holding, errors, order = threading.Event(), [], []

    def hold(engine, name, fail=False):
        try:
            with engine.begin() as conn:
                conn.execute(_domain(name))
                holding.set()
                threading.Event().wait(0.3)
                order.append(name)
                if fail:
                    raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        except Exception as e:
            errors.append(e)

    def write(engine, name):
        try:
            with engine.begin() as conn:
                order.append(name)
                conn.execute(_domain(name))
        except Exception as e:
            errors.append(e)

    for holder_fails in (False, True):
        holding.clear()
        order.clear()
        t = threading.Thread(target=hold, args=(first, f"held{holder_fails}", holder_fails))
        t.start()
        assert holding.wait(10)
        others = [threading.Thread(target=write, args=(e, f"w{holder_fails}{i}"))
                  for i, e in enumerate((first, second, second))]
        for o in others:
            o.start()
        for o in [t, *others]:
            o.join(20)
        assert errors == []
        # Each writer began only once the holder had committed (or rolled back).
        assert order[0] == f"held{holder_fails}" and len(order) == 4
    with make_read_sessionmaker(first)() as s:
        names = set(s.scalars(select(Domain.name)))
    assert names == {"heldFalse", "wFalse0", "wFalse1", "wFalse2",
                     "wTrue0", "wTrue1", "wTrue2"}
    # A failed BEGIN (a writer of another process holds the file) gives the turn back.
    monkeypatch.setattr(dbmod, "SQLITE_BUSY_TIMEOUT_S", 1)
    other = subprocess.Popen([sys.executable, "-c", f"""
import sqlite3, sys, time
c = sqlite3.connect({str(path)!r}, isolation_level=None)
c.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
c.execute("ROLLBACK")
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        write(first, "refused")
        assert len(errors) == 1 and "locked" in str(errors[0])
        errors.clear()
    finally:
        other.stdin.write("\n")
        other.stdin.flush()
        other.wait(10)
    write(second, "after")
    assert errors == []
    first.dispose()
    second.dispose()
