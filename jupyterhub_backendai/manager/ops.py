"""The manager's named operations: what the hub's front ends ask of the record.

An operation is a plain function whose first argument is a database session, declared
where it lives with :func:`reads` (a read-only transaction: on SQLite it neither waits
for nor blocks writers) or :func:`writes` (one transaction, committed when the function
returns, rolled back when it raises). The spawner, the authenticator and the pages call
them by name on the manager's façade::

    groups = await manager.ops.usable_groups(username)

and never hand the manager a function of their own to run (``manager.db(fn)`` stays
the tool of the manager and its lifecycle). The kind of transaction travels with the
function, so no caller runs a write in a read-only transaction or has to know which
one an operation needs; the operations are found by name in one place.
"""

from __future__ import annotations

from collections.abc import Callable

_REGISTRY: dict[str, tuple[Callable, bool]] = {}


def _register(fn: Callable, write: bool) -> Callable:
    name = fn.__name__
    known = _REGISTRY.get(name)
    if known is not None and known[0] is not fn:
        raise RuntimeError(f"two operations are named {name!r}: {known[0].__module__} and "
                           f"{fn.__module__}")
    _REGISTRY[name] = (fn, write)
    return fn


def reads(fn: Callable) -> Callable:
    """Declare ``fn(db, ...)`` an operation that only reads."""
    return _register(fn, False)


def writes(fn: Callable) -> Callable:
    """Declare ``fn(db, ...)`` an operation that writes (one transaction)."""
    return _register(fn, True)


def lookup(name: str) -> tuple[Callable, bool]:
    """The operation ``name`` and whether it writes. The modules that declare operations
    are imported by :mod:`.operations` (statically: every dependency in sight)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise AttributeError(f"the manager has no operation {name!r} "
                             "(declare it with @reads or @writes)") from None
