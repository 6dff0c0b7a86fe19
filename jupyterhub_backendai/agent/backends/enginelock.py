"""A lock that the agents of one host hold while they make something of one name on one
Docker engine.

The engine checks a new network's name against those it has, but not atomically: two
agents creating one at the same moment can both succeed, and from then on the name is
ambiguous to every call that uses it (``2 matches found based on name``). Agents of one
host (installations side by side, a test run's workers, in-process agents) take this
lock around "look it up, else make it", so that the second finds the first's.

The lock is an ``flock`` on a file in the temporary directory named after the engine's
id and one of ``STRIPES`` stripes that the thing's name falls in (so that a host holds
a bounded number of these files however many sessions come and go, and two names
rarely wait for each other): an agent of another user can take it too (the file is opened
read-only; ``flock`` needs no write access), and a file that cannot be opened is logged
and the lock skipped. Agents that do not see one temporary directory (of different
hosts on one remote engine, or services with a private ``/tmp``) do not share it: the
caller settles twins that are made anyway (the oldest is kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import tempfile

log = logging.getLogger(__name__)

POLL = 0.02  # seconds between tries (making a network takes about 0.1 s)
STRIPES = 64


def lock_path(engine_id: str, name: str) -> str:
    stripe = int(hashlib.sha256(name.encode()).hexdigest(), 16) % STRIPES
    engine = hashlib.sha256(engine_id.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"backendai-engine-{engine}-{stripe}.lock")


@contextlib.asynccontextmanager
async def held(engine_id: str, name: str):
    """Hold the lock of ``name`` on engine ``engine_id`` (polled, so that a cancelled
    waiter leaves nothing behind)."""
    path = lock_path(engine_id, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        log.warning("lock %s for %s not taken (%s): agents starting at this moment may "
                    "make it twice, which they then settle", path, name, e.strerror)
        yield
        return
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            await asyncio.sleep(POLL)
        yield
    finally:
        os.close(fd)  # and with it the lock
