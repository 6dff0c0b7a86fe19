"""Engine creation and schema migrations (alembic, with its own version table)."""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import sessionmaker

MIGRATIONS_DIR = os.path.join(os.path.dirname(__file__), "migrations")
VERSION_TABLE = "backendai_alembic_version"
# Execution option marking connections of read-only sessions (make_read_sessionmaker).
READ_ONLY = "backendai_read_only"
_upgrade_lock = threading.Lock()


def sqlite_wal(dbapi_conn) -> None:
    """WAL with synchronous=NORMAL on a new SQLite connection (docs/architecture.md
    "Seams"). In WAL mode NORMAL syncs the log at checkpoints, not at every commit: a
    commit is still atomic and the file never corrupt, but the last commits before an
    operating-system crash or a power loss (not a process crash) may be rolled back.
    SQLite's defaults made every commit wait for fsyncs: 3-4 ms here in WAL, 10-15 ms with
    the rollback journal JupyterHub's own database had, where each commit held the hub's
    event loop."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _sqlite_wal_on_connect(dbapi_conn, _record) -> None:
    if isinstance(dbapi_conn, sqlite3.Connection):
        sqlite_wal(dbapi_conn)


def sqlite_wal_everywhere() -> None:
    """Every SQLite database this process opens from now on, whoever's engine it is, runs
    as :func:`sqlite_wal` says: the packaged hub config calls this for JupyterHub's own
    database (``JupyterHub.db_url``), before JupyterHub opens it. Other databases are
    untouched."""
    if not event.contains(Engine, "connect", _sqlite_wal_on_connect):
        event.listen(Engine, "connect", _sqlite_wal_on_connect)


#: How long a SQLite writer waits for the write lock, in this process or another.
SQLITE_BUSY_TIMEOUT_S = 30
_writer_locks: dict[str, threading.Lock] = {}
_writer_locks_guard = threading.Lock()


def _writer_lock(database: str | None) -> threading.Lock | None:
    """The one in-process lock of the writers of the SQLite file ``database`` (every
    engine of this process on that file shares it); None for an in-memory database."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    key = os.path.realpath(database)
    with _writer_locks_guard:
        return _writer_locks.setdefault(key, threading.Lock())


class _SQLiteConnection(sqlite3.Connection):
    """A SQLite connection whose write transactions wait for each other in this process
    on a lock, not in SQLite's busy handler.

    SQLite's handler sleeps between its tries in growing steps (1, 2, 5, 10, 15, 20,
    25 ... 100 ms) whether or not the lock came free meanwhile: in a rush of five starts
    a record write that met another writer waited 85-131 ms for a lock that was free
    after a few (docs/benchmarks.md, issue 30's ninth round). Here the next
    writer of this process starts the moment the last one commits or rolls back; a
    writer of another process (a second hub on the same file, a command-line tool) is
    still waited for by the busy handler."""

    writer_lock: threading.Lock | None = None
    _holds = False

    def begin_write(self) -> None:
        """BEGIN IMMEDIATE, once this process's other writers of the file are done."""
        lock = self.writer_lock
        if lock is not None and not self._holds:
            if not lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_S):
                raise sqlite3.OperationalError("database is locked")
            self._holds = True
        try:
            self.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        if self._holds:
            self._holds = False
            self.writer_lock.release()

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self._release()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self._release()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._release()


def make_engine(url: str, **kw) -> Engine:
    if url.startswith("sqlite"):
        kw.setdefault("connect_args", {"check_same_thread": False,
                                       "timeout": SQLITE_BUSY_TIMEOUT_S})
        kw["connect_args"].setdefault("factory", _SQLiteConnection)
        engine = create_engine(url, **kw)
        writer_lock = _writer_lock(engine.url.database)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            # WAL lets readers (spawner polls) run beside the scheduler's writes.
            dbapi_conn.isolation_level = None
            if isinstance(dbapi_conn, _SQLiteConnection):
                dbapi_conn.writer_lock = writer_lock
            cur = dbapi_conn.cursor()
            sqlite_wal(dbapi_conn)
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):
            # BEGIN IMMEDIATE: a writer takes the lock up front, so read-then-write
            # transactions (allocation) cannot interleave. Read-only work (see
            # make_read_sessionmaker) begins a plain deferred transaction: under WAL it
            # reads a consistent snapshot without waiting for, or blocking, writers.
            dbapi_conn = conn.connection.dbapi_connection
            if conn.get_execution_options().get(READ_ONLY):
                conn.exec_driver_sql("BEGIN")
            elif isinstance(dbapi_conn, _SQLiteConnection):
                dbapi_conn.begin_write()
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    kw.setdefault("pool_pre_ping", True)
    kw.setdefault("pool_size", 10)
    kw.setdefault("max_overflow", 20)
    return create_engine(url, **kw)


def make_sessionmaker(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)


# PostgreSQL's "try the transaction again" errors: deadlock_detected (two transactions
# waiting on each other's row locks, e.g. a foreign key's FOR KEY SHARE on a row another
# transaction updates) and serialization_failure. The server rolled the transaction
# back; running it again is the documented remedy.
RETRY_SQLSTATES = frozenset({"40P01", "40001"})
TRANSACTION_ATTEMPTS = 5


def transient(error: BaseException) -> bool:
    """Whether ``error`` is a transaction the database aborted only to be run again."""
    if not isinstance(error, DBAPIError):
        return False
    return getattr(error.orig, "pgcode", None) in RETRY_SQLSTATES


def in_transaction(maker: sessionmaker, fn, *args, **kw):
    """Run ``fn(db_session, ...)`` in one transaction of ``maker``; return its result.

    A transaction the database aborted as a deadlock or serialization failure is run
    again from the start (at most :data:`TRANSACTION_ATTEMPTS` times, after a short
    random pause), so ``fn`` must do nothing but database work through its session: it
    may run more than once, and only the last run's changes are committed.
    """
    for attempt in range(1, TRANSACTION_ATTEMPTS + 1):
        try:
            with maker.begin() as s:
                return fn(s, *args, **kw)
        except DBAPIError as e:
            if attempt == TRANSACTION_ATTEMPTS or not transient(e):
                raise
        time.sleep(random.uniform(0.005, 0.05) * attempt)


def make_read_sessionmaker(engine: Engine) -> sessionmaker:
    """Sessions for work that only reads: on SQLite they do not take the write lock.

    Such a session must not write (on SQLite a write would have to upgrade a
    deferred transaction, which can fail at once under contention).
    """
    return sessionmaker(engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False)


def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS_DIR)
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine_or_url: Engine | str, revision: str = "head") -> None:
    """Bring the schema to ``revision``; safe to call on every start."""
    from alembic import command

    url = (
        engine_or_url
        if isinstance(engine_or_url, str)
        else engine_or_url.url.render_as_string(hide_password=False)
    )
    with _upgrade_lock:
        cfg = alembic_config(url)
        if not isinstance(engine_or_url, str):
            with engine_or_url.begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
        else:
            command.upgrade(cfg, revision)
