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
