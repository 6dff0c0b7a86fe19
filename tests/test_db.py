"""The database seam: read-only sessions on SQLite neither wait for nor block a writer."""

from __future__ import annotations

import datetime as dt
import threading
import warnings

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
