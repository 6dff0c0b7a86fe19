"""The host ports of an agent's kernels (:class:`HostPorts`), claimed host-wide.

An agent hands a kernel the first ports of its range that nothing listens on, and the
kernel's server binds them seconds later (a local process when it has imported Jupyter,
docker-proxy when the container starts). Another installation on this host, its agent on
the same default range, checks the same ports in between and finds them free too: one
of the two servers then fails to bind ("kernel exited with code 1"), as two Binder demos
started together did. So an agent claims each port it hands out, for as long as its
kernel has it (:mod:`.hostclaims`, kind ``port``), and every agent of the host tries
the claim before it looks at the port. What a killed agent's kernels still bind, the
check for a listener sees.
"""

from __future__ import annotations

import socket

from ..common.errors import AgentError
from .hostclaims import HostClaims
from .hostclaims import claim_path as _claim_path

KIND = "port"


def claim_path(port: int | str) -> str:
    return _claim_path(KIND, port)


class HostPorts:
    """The host ports of one agent's kernels: a kernel's are its range's first ports that
    no kernel of this agent has, no agent of this host has claimed (:class:`.hostclaims.HostClaims`:
    another installation, its agent on the same default range, whose kernel has not
    bound them yet) and nothing listens on now; claimed until the kernel is released.
    A server of another kind on a port (not an agent's) is told apart by the spawner's
    readiness check (spawner.py, ``_wait_http``)."""

    def __init__(self) -> None:
        #: kernel id -> its host ports
        self.of: dict[str, list[int]] = {}
        self._claims = HostClaims(KIND)

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
