"""Sessions apart with no unguarded moment: one set of netfilter rules that exists
before any session network does and never changes with them.

Docker keeps sessions' bridge networks apart with rules of its own
(``DOCKER-ISOLATION-STAGE-1/2`` in the filter table) and the per-network
``-i br-X ! -o br-X -j ACCEPT`` in ``FORWARD``. Each time a network is created or
removed, Docker 20.10 re-arranges ``FORWARD``: it deletes its jumps to
``DOCKER-USER`` and ``DOCKER-ISOLATION-STAGE-1`` and inserts them again (libnetwork's
``EnsureJumpRule``). Between the two, a packet from one bridge to another meets the
ACCEPT rule first: measured here, a kernel probing another session's server every
0.05 s while four networks were created and removed 15 times connected 9 times in
40 s. Rules in ``DOCKER-USER`` share that window (their jump is re-inserted too).

The guard lives where Docker never writes: a chain of its own,
``BACKENDAI-ISOLATION``, jumped to from the **mangle** table's ``FORWARD`` (which
netfilter runs before the filter table's). It drops *routed* traffic that leaves a
session network for any other bridge, or enters one from another bridge; traffic
within one network is bridged, not routed (``physdev --physdev-is-bridged``), and
passes, so the kernels of one session still reach each other. It depends on no
network's name or number: a network being made or removed is covered from its first
packet. Kernels still reach the hub (the agent network's gateway is the host:
``INPUT``, not ``FORWARD``) and whatever the host routes to outside.

The rules are installed once per session pool (idempotent: checked with ``-C``
first) and left in place when the agent stops: another agent or installation on this
engine may rely on them, and they drop nothing but traffic between container
networks. ``Agent.isolation_guard``: ``auto`` installs them where this process can
(root, iptables, the engine's bridges in this network namespace) and warns where it
cannot; ``required`` refuses to start without them; ``off`` leaves Docker's own rules
alone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil

log = logging.getLogger(__name__)

CHAIN = "BACKENDAI-ISOLATION"
COMMENT = "jupyterhub-backendai: session networks apart"


class GuardUnavailable(Exception):
    """The rules cannot be installed here (the reason is the message)."""


async def _iptables(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "iptables", "-w", "5", "-t", "mangle", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode, out.decode(errors="replace").strip()


def rules(pool: str) -> list[list[str]]:
    """The rule bodies (after ``-A CHAIN``) that keep ``pool``'s networks apart."""
    routed = ["-m", "physdev", "!", "--physdev-is-bridged"]
    tail = ["-m", "comment", "--comment", COMMENT, "-j", "DROP"]
    out = []
    for bridges in ("br-+", "docker0"):
        out.append(["-s", pool, "-o", bridges, *routed, *tail])
        out.append(["-d", pool, "-i", bridges, *routed, *tail])
    return out


def bridge_visible(bridge: str) -> bool:
    return os.path.isdir(f"/sys/class/net/{bridge}")


async def install(pool: str, agent_bridge: str) -> None:
    """Install the guard for ``pool`` (idempotent). ``agent_bridge``: the interface of
    the agent's own network, to check that the engine's bridges live in this network
    namespace (a remote engine's rules would be written to the wrong host)."""
    if shutil.which("iptables") is None:
        raise GuardUnavailable("iptables is not installed")
    if os.geteuid() != 0:
        raise GuardUnavailable("the agent does not run as root")
    if not bridge_visible(agent_bridge):
        raise GuardUnavailable(
            f"the engine's bridge {agent_bridge} is not in this network namespace (a "
            f"remote or rootless engine): install the rules on the engine's host")
    code, out = await _iptables("-nL", CHAIN)
    if code != 0:
        code, out = await _iptables("-N", CHAIN)
        if code != 0 and "exists" not in out:
            raise GuardUnavailable(f"iptables -t mangle -N {CHAIN}: {out}")
    for body in rules(pool):
        if (await _iptables("-C", CHAIN, *body))[0] != 0:
            code, out = await _iptables("-A", CHAIN, *body)
            if code != 0:
                raise GuardUnavailable(f"iptables -t mangle -A {CHAIN}: {out}")
    if (await _iptables("-C", "FORWARD", "-j", CHAIN))[0] != 0:
        code, out = await _iptables("-I", "FORWARD", "1", "-j", CHAIN)
        if code != 0:
            raise GuardUnavailable(f"iptables -t mangle -I FORWARD: {out}")


async def installed(pool: str) -> bool:
    """Whether every rule of ``pool`` and the jump to the chain are in place."""
    if (await _iptables("-C", "FORWARD", "-j", CHAIN))[0] != 0:
        return False
    for body in rules(pool):
        if (await _iptables("-C", CHAIN, *body))[0] != 0:
            return False
    return True
