"""An installation's identity, and the lock that keeps one hub per state directory.

An installation is one state directory (the hub's ``BACKENDAI_STATE_DIR``, or an agent
daemon's ``Agent.state_dir``). Its identity is made once, at random, and kept there in
``installation-id`` (mode 0600). It gives the installation's agent a default id of its
own (``i-<hostname>-<first 8 of the id>``) and labels every container and network the
agent makes (``ai.backend.installation``); an agent touches nothing on the engine that
carries another installation's label (docs/security.md, "Installations apart").

A state directory that a hub used before installations had identities (a JupyterHub
cookie secret or database is there, no ``installation-id``) keeps its agent's old
default id ``i-<hostname>``: the identity file records it (``agent-id i-<hostname>``),
so that the record's agent row and the kernels running under that id carry on after
the upgrade.

Two hubs on one state directory would share its databases and its agent's
containers; :func:`hold_state` refuses the second (``fcntl.flock`` on ``hub.lock``,
held for the life of the process, the holder's pid written in it).
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import socket
import tempfile
from dataclasses import dataclass

IDENTITY_FILE = "installation-id"
LOCK_FILE = "hub.lock"
#: The label every container and network an agent makes carries.
LABEL = "ai.backend.installation"
#: A prefix for a new installation's id (letters, digits, '-'; the test suite puts its
#: run token there so that its engine objects are found as its own). Empty by default.
PREFIX_ENV = "BACKENDAI_INSTALLATION_PREFIX"
_RANDOM_HEX = 32
_ID_RE = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9-]{0,47})?[0-9a-f]{32}")
# What a hub leaves in its state directory once it has run (JupyterHub makes both at
# its first start), and the local backend's kernels of an agent daemon's state.
_LEGACY_MARKERS = ("jupyterhub_cookie_secret", "local-kernels")
_LEGACY_DATABASES = ("jupyterhub.sqlite",)


class InstallationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Installation:
    id: str
    path: str
    #: The default agent id this installation keeps (one that existed before
    #: identities: ``i-<hostname>``); None: derived from the id.
    agent_id: str | None = None

    @property
    def short(self) -> str:
        return short_id(self.id)

    def default_agent_id(self, hostname: str | None = None) -> str:
        return self.agent_id or derived_agent_id(self.id, hostname)


def short_id(installation_id: str) -> str:
    """The id less the last 24 of its random hex: the prefix, if any, and 8 hex digits."""
    if len(installation_id) > _RANDOM_HEX:
        return installation_id[: len(installation_id) - (_RANDOM_HEX - 8)]
    return installation_id[:8]


def derived_agent_id(installation_id: str, hostname: str | None = None) -> str:
    return f"i-{hostname or socket.gethostname()}-{short_id(installation_id)}"


def legacy_agent_id(hostname: str | None = None) -> str:
    """The default agent id before installations had identities."""
    return "i-" + (hostname or socket.gethostname())


def new_id(prefix: str | None = None) -> str:
    prefix = os.environ.get(PREFIX_ENV, "") if prefix is None else prefix
    if prefix and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,39}", prefix):
        raise InstallationError(f"{PREFIX_ENV} {prefix!r}: letters, digits and '-' only, "
                                "at most 40")
    return prefix + secrets.token_hex(_RANDOM_HEX // 2)


def _used_before(state: str) -> bool:
    """Whether a hub (or an agent's local kernels) used this state directory already."""
    if any(os.path.exists(os.path.join(state, m)) for m in _LEGACY_MARKERS):
        return True
    for db in _LEGACY_DATABASES:
        try:
            if os.path.getsize(os.path.join(state, db)) > 0:
                return True
        except OSError:
            pass
    return False


def read(state: str) -> Installation | None:
    path = os.path.join(os.path.abspath(state), IDENTITY_FILE)
    try:
        with open(path) as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
    except FileNotFoundError:
        return None
    if not lines or not _ID_RE.fullmatch(lines[0]):
        raise InstallationError(f"{path} does not hold an installation id: restore it from a "
                                "backup (the agent's containers carry it) or remove the file "
                                "to make a new installation")
    agent_id = None
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        if key == "agent-id" and value.strip():
            agent_id = value.strip()
    return Installation(lines[0], path, agent_id)


def ensure(state: str) -> Installation:
    """The installation of state directory ``state``: read, or made once (0600; the
    directory 0700 when it is new). A directory a hub used before identities existed
    keeps the old default agent id in its new identity file."""
    state = os.path.abspath(state)
    found = read(state)
    if found is not None:
        return found
    os.makedirs(state, mode=0o700, exist_ok=True)
    text = new_id() + "\n"
    if _used_before(state):
        text += f"agent-id {legacy_agent_id()}\n"
    path = os.path.join(state, IDENTITY_FILE)
    fd, tmp = tempfile.mkstemp(prefix=".installation-id.", dir=state)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
        os.close(fd)
        try:
            os.link(tmp, path)  # never replaces one made meanwhile
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return read(state)


class StateLocked(InstallationError):
    def __init__(self, state: str, pid: str):
        self.state, self.pid = state, pid
        who = f"pid {pid}" if pid else "a process whose pid it does not say yet"
        super().__init__(
            f"another hub ({who}) runs on the state directory {state} (it holds "
            f"{os.path.join(state, LOCK_FILE)}). Two hubs on one state directory would share "
            "its databases, cookie secret and agent, and remove each other's sessions: stop "
            "that hub, or give this one a state directory of its own (BACKENDAI_STATE_DIR) "
            "and its own ports (README, the several-hubs row)")


_HELD: dict[str, int] = {}


def hold_state(state: str) -> int:
    """Take the state directory's lock for the life of this process (idempotent in a
    process); raise :class:`StateLocked`, naming the holder's pid, when another process
    holds it. The descriptor is close-on-exec: no child (the proxy, a local kernel)
    keeps it after the hub ends."""
    state = os.path.abspath(state)
    if state in _HELD:
        return _HELD[state]
    os.makedirs(state, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(state, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
        finally:
            os.close(fd)
        raise StateLocked(state, pid) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[state] = fd
    return fd


def release_state(state: str) -> None:
    fd = _HELD.pop(os.path.abspath(state), None)
    if fd is not None:
        os.close(fd)
