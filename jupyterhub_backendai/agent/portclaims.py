"""The host ports of an agent's kernels (:class:`HostPorts`), claimed host-wide.

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
import socket
import tempfile

from ..common.errors import AgentError

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


class HostPorts:
    """The host ports of one agent's kernels: a kernel's are its range's first ports that
    no kernel of this agent has, no agent of this host has claimed (:class:`PortClaims`:
    another installation, its agent on the same default range, whose kernel has not
    bound them yet) and nothing listens on now; claimed until the kernel is released.
    A server of another kind on a port (not an agent's) is told apart by the spawner's
    readiness check (spawner.py, ``_wait_http``)."""

    def __init__(self) -> None:
        #: kernel id -> its host ports
        self.of: dict[str, list[int]] = {}
        self._claims = PortClaims()

    @property
    def used(self) -> set[int]:
        return {p for ports in self.of.values() for p in ports}

    def take(self, kernel_id: str, n: int, port_range: tuple[int, int],
             bind_host: str) -> list[int]:
        lo, hi = port_range
        used = self.used
        got: list[int] = []
        for port in range(lo, hi + 1):
            if len(got) == n:
                break
            if port in used or not self._claims.take(port):
                continue
            if not _port_free(bind_host, port):
                self._claims.give_back(port)
                continue
            got.append(port)
        if len(got) < n:
            self._claims.give_back(*got)
            raise AgentError(f"no free host port left in {lo}-{hi}")
        self.of[kernel_id] = got
        return got

    def adopt(self, kernel_id: str, ports: list[int]) -> None:
        """A kernel found running at the agent's start: its ports, claimed again where
        that can be (what the kernel binds, the check for a listener sees anyway)."""
        self.of[kernel_id] = ports
        for p in ports:
            self._claims.take(p)

    def release(self, kernel_id: str) -> None:
        self._claims.give_back(*self.of.pop(kernel_id, []))

    def release_all(self) -> None:
        """The claims given back (the agent stops); its kernels' ports stay recorded."""
        self._claims.give_back_all()


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
