"""Who drives a session's step: a manager process's claim.

A step is driven by the manager process that holds the session's claim
(``Session.owner`` and ``Session.lease_until``, renewed while the step runs). Taking
a claim is one conditional UPDATE that succeeds for one process only, on SQLite and
PostgreSQL alike (:func:`.record.claim`), so several hubs on one database never start a
session twice. A claim whose lease ran out, or whose owner was a process on this host
that no longer exists (a hub killed and restarted), is taken over at once.
"""

from __future__ import annotations

import os
import socket
import uuid

_HOST = socket.gethostname()
# Owner ids of the managers alive in this process (tests run several in one).
_LIVE_OWNERS: set[str] = set()


def new_owner_id() -> str:
    """A manager's name in claims: host, pid and a nonce; alive until :func:`owner_gone`."""
    owner = f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    _LIVE_OWNERS.add(owner)
    return owner


def owner_gone(owner: str) -> None:
    """The manager named ``owner`` stopped: its claims are taken over at once."""
    _LIVE_OWNERS.discard(owner)


def owner_is_dead(owner: str | None, me: str) -> bool:
    """Whether ``owner`` is a process of this host that no longer runs (or an earlier
    life of this pid): its claim needs no waiting for the lease."""
    if not owner or owner == me:
        return False
    try:
        host, pid, _ = owner.rsplit(":", 2)
        pid = int(pid)
    except ValueError:
        return False
    if host != _HOST:
        return False
    if pid == os.getpid():
        return owner not in _LIVE_OWNERS  # an earlier manager in this process (tests)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
