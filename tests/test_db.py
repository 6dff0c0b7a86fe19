"""The database seam: read-only sessions on SQLite neither wait for nor block a writer."""

from __future__ import annotations

import datetime as dt
import threading

from sqlalchemy import select

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
