"""Claims on a host's shared things, taken by every agent of the host (:class:`HostClaims`).

Two installations on one host each run an agent, and each agent keeps its own books of
what its kernels hold. What the host has only once (a port on the loopback, a GPU) can
then be handed out by both: each agent checks, finds it free, and hands it out, and
the two kernels meet at start (a server that cannot bind) or, for a GPU, never notice
(two users' work on one device, each told it has it alone). So an agent claims each
such thing host-wide for as long as one of its kernels has it: an ``flock`` on a file
named after the thing in the temporary directory, which every agent of the host takes
before it hands the thing out, removed when the claim ends (a lock taken on a file no
longer at its path counts as not taken). The lock goes with the process that held it,
so a killed agent's claims end with it; its files stay, empty and unlocked, until the
next claim of the same thing takes and removes them.

The file is opened read-only (``flock`` needs no write access: agents of other users
take it too); one that cannot be opened is logged once and the thing handed out on this
agent's books alone, as before claims. Agents that do not share a temporary directory
(services with a private ``/tmp``) do not see each other's claims, as with
:mod:`.backends.enginelock`.

Kinds: ``port`` (:mod:`.portclaims`) and ``gpu`` (GPUs and MIG instances by UUID,
:mod:`.resources.gpu_alloc`).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import tempfile

log = logging.getLogger(__name__)

FILE = "backendai-{kind}-{key}.lock"  # one per claimed thing, in the temporary directory
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def claim_path(kind: str, key: int | str, directory: str | None = None) -> str:
    """The file whose ``flock`` claims ``key`` of ``kind`` (``*`` as key: a glob)."""
    key = str(key)
    if key != "*":
        key = _UNSAFE.sub("_", key)
    return os.path.join(directory or tempfile.gettempdir(), FILE.format(kind=kind, key=key))


class HostClaims:
    """The claims of one agent on things of one ``kind``: key -> the descriptor whose
    lock claims it (None: the claim file could not be opened; the thing is this agent's
    on its books alone). ``directory``: where the host's agents meet (default: the
    temporary directory)."""

    def __init__(self, kind: str, directory: str | None = None) -> None:
        self.kind = kind
        self.directory = directory
        self._held: dict[str, int | None] = {}
        self._warned = False

    def path(self, key: int | str) -> str:
        return claim_path(self.kind, key, self.directory)

    def take(self, key: int | str) -> bool:
        """Claim ``key``; False when another agent (of any process) holds it."""
        key = str(key)
        if key in self._held:
            return True
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if not self._warned:
                self._warned = True
                log.warning("host %s claims not taken (%s: %s): agents of other "
                            "installations on this host may hand out the same %s",
                            self.kind, path, e.strerror, self.kind)
            self._held[key] = None
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
        self._held[key] = fd
        return True

    def held_elsewhere(self, keys) -> set[str]:
        """Of ``keys``, those another agent holds now (another process's lock on the
        claim file, or another claims object's), read from the kernel's lock table
        (``/proc/locks``) without taking any lock: reading never makes another agent's
        claim fail. Empty where the table cannot be read."""
        wanted: dict[tuple[int, int, int], str] = {}
        for key in map(str, keys):
            if key in self._held:
                continue
            try:
                st = os.stat(self.path(key), follow_symlinks=False)
            except OSError:
                continue  # no file: nobody claims it
            wanted[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = key
        if not wanted:
            return set()
        try:
            with open("/proc/locks", encoding="ascii", errors="replace") as f:
                table = f.read()
        except OSError:
            return set()
        # btrfs gives a file's subvolume an anonymous device of its own in stat, where the
        # lock table names the filesystem's (anonymous too, major 0): there the inode
        # alone decides.
        anonymous = {ino: key for (major, _minor, ino), key in wanted.items() if major == 0}
        held = set()
        for line in table.splitlines():
            # "1: FLOCK  ADVISORY  WRITE 4242 08:01:123456 0 EOF"; a waiter's line has
            # "->" after the number and holds nothing.
            parts = line.split()
            if len(parts) < 6 or parts[1] != "FLOCK":
                continue
            try:
                major, minor, ino = parts[5].split(":")
                where = (int(major, 16), int(minor, 16), int(ino))
            except ValueError:
                continue
            if where in wanted:
                held.add(wanted[where])
            elif where[0] == 0 and where[2] in anonymous:
                held.add(anonymous[where[2]])
        return held

    def give_back(self, *keys: int | str) -> None:
        for key in map(str, keys):
            if key not in self._held:
                continue
            fd = self._held.pop(key)
            if fd is None:
                continue
            try:  # removed while still locked (a host keeps no file per thing it ever used)
                os.unlink(self.path(key))
            except OSError:
                pass  # (another user's file in a sticky /tmp: it stays, harmless)
            os.close(fd)  # and with it the lock

    def give_back_all(self) -> None:
        self.give_back(*list(self._held))
