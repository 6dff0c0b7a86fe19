"""Where the manager's named operations are found (:mod:`.ops`), and the two façades
that run them: :class:`Operations` (``manager.ops``, async, each in a worker thread)
and :class:`Record` (``backendai-admin``'s bootstrap commands, in the calling thread,
where no hub runs).

Every module that declares operations is imported here, by name, so the whole set is
in sight of any reader (no module is loaded by a computed name).
"""

from __future__ import annotations

from typing import Any

from ..models.db import (
    in_transaction,
    make_engine,
    make_read_sessionmaker,
    make_sessionmaker,
    upgrade,
)
from . import (  # noqa: F401  (each declares operations with @reads / @writes)
    access,
    accounts,
    admin,
    apiviews,
    capacity,
    cliviews,
    compatviews,
    images,
    keypairs,
    lifetimes,
    pageviews,
    registries,
    spawnviews,
    templates,
    tenancy,
    usage,
    vfolders,
    vfshares,
    warmpool,
)
from .ops import lookup


class Operations:
    """Every declared operation as a method of its runner: ``manager.ops`` (awaitable,
    in the manager's worker threads) or a :class:`Record`'s ``ops`` (in this thread)."""

    def __init__(self, manager: Any) -> None:
        # The runner: the manager's (db, db_read) or a Record's (write, read).
        self._write, self._read = (manager.db, manager.db_read) if hasattr(manager, "db") \
            else (manager.write, manager.read)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        fn, write = lookup(name)  # an unknown name is refused here, in words
        run = self._write if write else self._read

        def operation(*args, **kw):
            return run(fn, *args, **kw)

        operation.__name__ = operation.__qualname__ = name
        operation.__doc__ = fn.__doc__
        setattr(self, name, operation)  # found once per runner
        return operation


class Record:
    """The database at ``url``, migrated (so it may be created) with the defaults in
    place; ``record.ops.<name>(...)`` runs a named operation in this thread. Close it
    (or use it as a context manager) to let go of its connections."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        try:
            upgrade(self.engine)
            self._sm = make_sessionmaker(self.engine)
            self._sm_read = make_read_sessionmaker(self.engine)
            with self._sm.begin() as s:
                tenancy.ensure_defaults(s)
        except BaseException:
            self.engine.dispose()
            raise
        self.ops = Operations(self)

    def write(self, fn, *args, **kw):
        """Run ``fn(db, ...)`` in one transaction, in this thread (run again when the
        database aborted it as a deadlock: :func:`.db.in_transaction`)."""
        return in_transaction(self._sm, fn, *args, **kw)

    def read(self, fn, *args, **kw):
        """Run ``fn(db, ...)`` in a read-only transaction, in this thread."""
        with self._sm_read() as s:
            return fn(s, *args, **kw)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Record:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
