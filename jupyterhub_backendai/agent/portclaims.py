"""Host ports that the agents of one host have handed out to kernels.

An agent hands a kernel the first ports of its range that nothing listens on, and the
kernel's server binds them seconds later (a local process when it has imported Jupyter,
docker-proxy when the container starts). Another installation on this host, its agent on
the same default range, checks the same ports in between and finds them free too: one
of the two servers then fails to bind ("kernel exited with code 1"), as two Binder demos
started together did. So an agent claims each port it hands out, for as long as its
kernel has it: an ``flock`` on a file of that port in the temporary directory, which
every agent of the host tries before it looks at the port, removed when the claim ends
(a lock taken on a file no longer at its path counts as not taken). The lock goes with
the process that held it, so a killed agent's claims end with it (what its kernels
still bind, the check for a listener sees); its files stay, empty and unlocked, until
the next claim of their port takes and removes them (at most one per port of a range,
like the 64 files of :mod:`.backends.enginelock`).

The file is opened read-only (``flock`` needs no write access: agents of other users
take it too); one that cannot be opened is logged once and the port checked as before,
by a listener only. Agents that do not share a temporary directory (services with a
private ``/tmp``) do not see each other's claims, as with :mod:`.backends.enginelock`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import tempfile

log = logging.getLogger(__name__)


FILE = "backendai-port-{}.lock"  # one per port, in the temporary directory


def claim_path(port: int | str) -> str:
    return os.path.join(tempfile.gettempdir(), FILE.format(port))


class PortClaims:
    """The claims of one agent: port -> the descriptor whose lock claims it."""

    def __init__(self) -> None:
        self._held: dict[int, int | None] = {}
        self._warned = False

    def take(self, port: int) -> bool:
        """Claim ``port``; False when another agent (of any process) holds it."""
        if port in self._held:
            return True
        path = claim_path(port)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if not self._warned:
                self._warned = True
                log.warning("host port claims not taken (%s: %s): agents of other "
                            "installations on this host starting kernels at the same moment "
                            "may choose the same port", path, e.strerror)
            self._held[port] = None
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The holder before removed the file as it let go (give_back): this lock is on
            # a file no longer at the path, where another agent may lock a new one.
            same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.ENOENT):
                return False
            raise
        if not same:
            os.close(fd)
            return False
        self._held[port] = fd
        return True

    def give_back(self, *ports: int) -> None:
        for port in ports:
            fd = self._held.pop(port, None)
            if fd is None:
                continue
            try:  # removed while still locked (a host keeps no file per port it ever used)
                os.unlink(claim_path(port))
            except OSError:
                pass  # (another user's file in a sticky /tmp: it stays, harmless)
            os.close(fd)  # and with it the lock

    def give_back_all(self) -> None:
        self.give_back(*self._held)
