"""The Docker backend's networks: the agent network (shared by the engine's agents and
installations, no kernel joins it: its gateway is the hub's address for kernels), one
bridge network per session (its subnet from ``Agent.session_subnets``), a Swarm overlay
network per multi-node session, and their removal once no kernel uses them.

:class:`DockerNetworks` is a part of :class:`~.docker.DockerBackend` (its ``docker``
client, ``agent_id``, ``network``, ``session_subnets`` and installation label)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import time
import weakref
import zlib
from datetime import datetime

from aiodocker.exceptions import DockerError

from ...common.errors import AgentError
from . import enginelock, netguard
from .labels import L_AGENT, L_NETWORK, L_SESSION

log = logging.getLogger(__name__)

# Docker's bridge options: no traffic between the containers of a network.
ICC_OPTION = "com.docker.network.bridge.enable_icc"
# multinode: how long a kernel that is not the main one waits for the session's overlay
# network.
OVERLAY_WAIT = 30.0
# Seconds a network made ahead of a session's kernels (prepare_session) waits for one.
PREPARED_TTL = 120.0


# Subnets being made into session networks right now, per event loop (shared by the
# agents of this process: they may share an engine). A subnet is reserved here, with no
# await between the check and the reservation, before Docker is asked for it: sessions
# starting together make their networks at once instead of one after the other (issue
# 30: a lock around the whole making serialised every start's 4 engine calls).
_RESERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _subnets(net: dict) -> list:
    """The subnets of an engine's network record (its IPAM configs; unparsable ones left
    out)."""
    out = []
    for cfg in (net.get("IPAM") or {}).get("Config") or []:
        try:
            out.append(ipaddress.ip_network(cfg.get("Subnet") or "", strict=False))
        except ValueError:
            continue
    return out


def subnets_of(nets: list[dict]) -> list:
    """The subnets of the engine's network records ``nets``."""
    return [subnet for net in nets for subnet in _subnets(net)]


def _reserved() -> set:
    return _RESERVED.setdefault(asyncio.get_running_loop(), set())


# Per event loop and session network name (bridge or overlay): the kernels of one
# session on agents of this process make their network one after the other (the
# engine's duplicate-name check is not atomic); other sessions' networks are made
# meanwhile.
_NAME_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def name_lock(name: str):
    locks = _NAME_LOCKS.setdefault(asyncio.get_running_loop(), {})
    entry = locks.setdefault(name, [asyncio.Lock(), 0])
    entry[1] += 1
    try:
        async with entry[0]:
            yield
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            locks.pop(name, None)


def _gone(e: DockerError) -> bool:
    """A Swarm network another agent removed a moment ago (the Swarm says so with a
    status other than 404)."""
    return bool(re.search(r"network \S+ not found", e.message or ""))


def _kernels_on(network: dict) -> list[str]:
    """The containers of this engine on a network, less the Swarm's load-balancer
    endpoint of an overlay network ("lb-<name>", no container; it goes with the network)."""
    return [k for k in network.get("Containers") or {} if not k.startswith("lb-")]


def _created_ns(created: str | None) -> int:
    """Nanoseconds since the epoch of an engine's ``Created`` (RFC 3339, fraction of
    up to nine digits with its zeros trimmed: not comparable as text)."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?",
                 created or "")
    if not m:
        return 0
    zone = m.group(3) or "Z"
    stamp = datetime.fromisoformat(m.group(1) + ("+00:00" if zone == "Z" else zone))
    return int(stamp.timestamp()) * 1_000_000_000 + int((m.group(2) or "0").ljust(9, "0")[:9])


class DockerNetworks:
    """The networks of :class:`~.docker.DockerBackend` (see the module)."""

    async def _ensure_network(self) -> str:
        info = await self._agent_network()
        if (info.get("Options") or {}).get(ICC_OPTION) != "false":
            log.warning(
                "docker network %s lets its containers reach each other (%s is not false); "
                "kernels no longer join it, but remove it (docker network rm %s) to have the "
                "agent make it again without", self.network, ICC_OPTION, self.network)
        self._agent_bridge = (info.get("Options") or {}).get(
            "com.docker.network.bridge.name") or f"br-{info['Id'][:12]}"
        configs = info.get("IPAM", {}).get("Config") or []
        for cfg in configs:
            if cfg.get("Gateway"):
                return cfg["Gateway"]
        raise AgentError(f"docker network {self.network} has no gateway")

    async def _agent_network(self) -> dict:
        """The agent network's record, made when missing.

        Every agent and installation on this engine shares it, and several may start at
        the same moment (a restart of the host, a test run's workers). The engine's check
        for a duplicate name is not atomic: two creates can both succeed, and from then on
        the name is ambiguous to every call that uses it. So agents of one host look it
        up and make it under one lock (:mod:`.enginelock`); twins made anyway (by agents
        of other hosts on a remote engine, or before this lock) are settled: every agent
        keeps the oldest (:meth:`_networks_named`) and removes the others (no kernel
        joins this network, so a twin is empty; one that is not stays, named in the
        log)."""
        tried: list[str] = []  # what each attempt saw: the failure says it
        for _ in range(3):
            async with enginelock.held(await self._engine_id(), self.network):
                found = await self._networks_named(self.network)
                if not found:
                    log.info("creating docker network %s", self.network)
                    # No kernel joins it (each session has a network of its own, see
                    # _session_network); it gives the hub's API an address on this host
                    # that every kernel reaches: its gateway. Containers that join it
                    # anyway (another tool's) cannot reach each other.
                    subnet = await self._agent_subnet()
                    try:
                        made = await self.docker.networks.create({
                            "Name": self.network,
                            "Driver": "bridge",
                            "CheckDuplicate": True,
                            # Shared by every agent and installation on this engine (no
                            # kernel joins it, none removes it): no installation label.
                            "Labels": {L_NETWORK: "agent"},
                            "Options": {ICC_OPTION: "false"},
                            "IPAM": {"Config": [subnet]},
                        })
                        tried.append(f"made as {made.id[:12]} in {subnet['Subnet']}, then "
                                     "not listed")
                    except DockerError as e:
                        # 409: an agent of another host made it first; an overlap: another
                        # tool's network took that subnet meanwhile (chosen again).
                        if e.status != 409 and "overlap" not in str(e.message).lower():
                            raise
                        tried.append(f"{subnet['Subnet']} refused: {e.message}")
                    continue  # listed again: an agent of another host may have made a twin
            keep = found[0]
            self._check_agent_subnet(keep)
            for twin in found[1:]:
                try:
                    await (await self.docker.networks.get(twin["Id"])).delete()
                    log.info("removed docker network %s (%s), a twin of %s made at the "
                             "same moment", self.network, twin["Id"][:12], keep["Id"][:12])
                except DockerError as e:
                    if e.status != 404:  # 404: the other agent removed it
                        log.warning("docker network %s has a twin (%s) that cannot be "
                                    "removed: %s", self.network, twin["Id"][:12], e.message)
            try:
                return await (await self.docker.networks.get(keep["Id"])).show()
            except DockerError as e:
                if e.status != 404:
                    raise
                tried.append(f"listed as {keep['Id'][:12]}, then gone")
        raise AgentError(f"docker network {self.network} could not be made in 3 attempts: "
                         + "; ".join(tried))

    async def _agent_subnet(self) -> dict:
        """The IPAM config (subnet, gateway) of a /24 for the agent network, in Docker's
        own default pools (172.17-31.0.0/16, then 192.168.0.0/16) but outside
        ``session_subnets`` and every network of the engine (the host's routes are not
        read: the engine may be remote). Left to Docker, the agent network took the next
        of its pools in turn, and once that was 172.30.0.0/16, the whole default session
        pool: no session got a network ("no free subnet"; a fresh-clone run, stop 33)."""
        used = [u for u in await self._used_subnets() if u.version == 4]
        if self.session_subnets.version == 4:
            used.append(self.session_subnets)
        pools = [ipaddress.ip_network(f"172.{i}.0.0/16") for i in range(17, 32)]
        pools.append(ipaddress.ip_network("192.168.0.0/16"))
        for pool_net in pools:
            for block in pool_net.subnets(new_prefix=24):
                if not any(block.overlaps(u) for u in used):
                    return {"Subnet": str(block), "Gateway": str(block.network_address + 1)}
        raise AgentError(f"no free /24 for docker network {self.network} in Docker's default "
                         f"pools outside Agent.session_subnets ({self.session_subnets})")

    def _check_agent_subnet(self, net: dict) -> None:
        """Says so when the agent network (made before its subnet was chosen, or by
        someone else) lies in ``session_subnets``: sessions cannot get those subnets."""
        for subnet in _subnets(net):
            if subnet.version == self.session_subnets.version \
                    and subnet.overlaps(self.session_subnets):
                log.warning(
                    "docker network %s has subnet %s, inside Agent.session_subnets (%s): "
                    "sessions cannot have those addresses. Stop this engine's agents, "
                    "remove the network (no kernel joins it) and start them again: it is "
                    "made again outside the pool", self.network, subnet, self.session_subnets)

    async def _guard_isolation(self) -> None:
        """The rules that keep session networks apart while networks come and go
        (:mod:`.netguard`), before the first session network exists."""
        if self.isolation_guard == "off":
            log.warning("Agent.isolation_guard is off: session networks are apart only by "
                        "Docker's own rules, which have windows while networks are made or "
                        "removed (docs/security.md)")
            return
        try:
            await netguard.install(str(self.session_subnets), self._agent_bridge)
        except netguard.GuardUnavailable as e:
            if self.isolation_guard == "required":
                raise AgentError(f"Agent.isolation_guard is required, but the rules that keep "
                                 f"session networks apart cannot be installed: {e}") from None
            log.warning("the rules that keep session networks apart while networks are made "
                        "or removed are not installed (%s); Docker's own rules have windows "
                        "then (docs/security.md)", e)
            return
        log.info("session networks of %s kept apart by the %s rules (mangle FORWARD)",
                 self.session_subnets, netguard.CHAIN)

    # -- one network per session ------------------------------------------------

    @staticmethod
    def session_network_name(session_id: str) -> str:
        return f"backendai-session-{session_id}"

    async def _used_subnets(self) -> list:
        return subnets_of(await self.docker.networks.list())

    async def _networks_named(self, name: str) -> list[dict]:
        """Networks of exactly this name, the oldest first (the engine's name filter
        matches parts of names, and its duplicate check is not atomic: agents making one
        at the same moment can make two). Every agent keeps the oldest: the one a first
        agent found alone and may already use; by id, twins would be ordered by chance."""
        nets = await self.docker.networks.list(filters={"name": [name]})
        return sorted((n for n in nets if n.get("Name") == name),
                      key=lambda n: (_created_ns(n.get("Created")), n["Id"]))

    async def _session_network(self, session_id: str) -> str:
        """The id of the network of a session's kernels (made by the first of them on
        this engine, whichever agent starts it): they reach each other by name,
        nothing else on it. Its subnet comes from ``session_subnets``."""
        name = self.session_network_name(session_id)
        async with name_lock(name), enginelock.held(await self._engine_id(), name):
            return await self._make_session_network(session_id, name)

    async def _engine_id(self) -> str:
        """The engine's own id (``docker info``), read once: names the locks of
        :mod:`.enginelock`."""
        if self._engine is None:
            self._engine = (await self.docker.system.info()).get("ID") or self.docker_url or ""
        return self._engine

    async def _make_session_network(self, session_id: str, name: str) -> str:
        found = await self._networks_named(name)
        if found:
            return found[0]["Id"]
        nets = await self.docker.networks.list()
        used = subnets_of(nets)
        pool_net, prefix = self.session_subnets, self.session_prefix
        count = 2 ** (prefix - pool_net.prefixlen)  # candidates, each made when tried
        size = 2 ** (pool_net.max_prefixlen - prefix)
        # Start where the session id points, so that agents sharing an engine rarely
        # try the same subnet at once; an overlap is answered by trying the next.
        start = zlib.crc32(session_id.encode()) % count
        last_error = "no free subnet"
        tries = 0
        reserved = _reserved()
        for i in range(count):
            subnet = ipaddress.ip_network(
                (int(pool_net.network_address) + ((start + i) % count) * size, prefix))
            if subnet in reserved or any(subnet.overlaps(u) for u in used):
                continue
            tries += 1
            reserved.add(subnet)
            try:
                try:
                    made = await self.docker.networks.create({
                        "Name": name,
                        "Driver": "bridge",
                        "CheckDuplicate": True,
                        "Labels": {
                            L_NETWORK: "session",
                            L_SESSION: session_id,
                            L_AGENT: self.agent_id,
                            **self._installation_label(),
                        },
                        "IPAM": {"Driver": "default", "Config": [{"Subnet": str(subnet)}]},
                    })
                except DockerError as e:
                    if e.status == 409:  # another agent of this engine made it just now
                        break
                    last_error = e.message
                    if "overlap" in (e.message or "").lower():
                        # A network made meanwhile (another agent's, another tool's
                        # with a subnet of Docker's choice): the next tries skip it.
                        nets = await self.docker.networks.list()
                        used = subnets_of(nets)
                    if tries >= 8:
                        raise AgentError(
                            f"docker could not make a network for session {session_id} in "
                            f"{self.session_subnets} (Agent.session_subnets): {last_error}"
                            + self._pool_takers(nets)) from None
                    continue
                # Another agent may have made one of the same name at the same moment:
                # all agents keep the oldest id, the others are removed.
                found = await self._networks_named(name)
                for extra in found[1:]:
                    if extra["Id"] == made.id:
                        try:
                            await made.delete()
                        except DockerError:
                            pass
                return found[0]["Id"] if found else made.id
            finally:
                reserved.discard(subnet)
        found = await self._networks_named(name)
        if found:
            return found[0]["Id"]
        raise AgentError(
            f"docker could not make a network for session {session_id} in "
            f"{self.session_subnets} (Agent.session_subnets): {last_error}"
            + self._pool_takers(nets))

    def _pool_takers(self, nets: list[dict]) -> str:
        """The networks other than session networks that hold addresses of
        ``session_subnets`` (a tool's network left to Docker's choice takes a whole
        default pool, as 172.30.0.0/16 is), said with the remedy; "" when none."""
        takers = [f"{n.get('Name')} ({subnet})" for n in nets
                  if (n.get("Labels") or {}).get(L_NETWORK) != "session"
                  for subnet in _subnets(n)
                  if subnet.version == self.session_subnets.version
                  and subnet.overlaps(self.session_subnets)]
        if not takers:
            return ""
        return (f"; the pool's addresses are held by {', '.join(takers)}: remove "
                f"{'it' if len(takers) == 1 else 'them'} or choose another "
                "Agent.session_subnets")

    async def _overlay_network(self, session_id: str, main: bool) -> str:
        """multinode: the Swarm overlay network of a session whose kernels run on more
        than one engine: attachable (plain containers join it, not only services),
        Docker's ``encrypted`` option when the operator asks (IPsec between the nodes).
        The main kernel's agent makes it; the others wait for it to appear (an agent's
        engine is a Swarm manager, where every Swarm network shows at once)."""
        name = self.session_network_name(session_id)
        if self.swarm_role != "manager":
            raise AgentError(
                "a multi-node session needs an overlay network, which only a Docker Swarm "
                "manager can make; this agent's engine is a Swarm worker (join it with the "
                "manager token, see docs/multinode.md)")
        if main:
            async with name_lock(name):
                found = await self._networks_named(name)
                if found:
                    return found[0]["Id"]
                try:
                    made = await self.docker.networks.create({
                        "Name": name,
                        "Driver": "overlay",
                        "Attachable": True,
                        "CheckDuplicate": True,
                        "Labels": {
                            L_NETWORK: "session",
                            L_SESSION: session_id,
                            L_AGENT: self.agent_id,
                            **self._installation_label(),
                        },
                        "Options": {"encrypted": ""} if self.overlay_encrypted else {},
                    })
                except DockerError as e:
                    raise AgentError(
                        f"docker could not make the overlay network of session {session_id}: "
                        f"{e.message}") from None
                return made.id
        deadline = time.monotonic() + OVERLAY_WAIT
        while True:
            found = await self._networks_named(name)
            if found:
                return found[0]["Id"]
            if time.monotonic() > deadline:
                raise AgentError(
                    f"the overlay network of session {session_id} did not appear within "
                    f"{OVERLAY_WAIT:g} s (the main kernel's agent makes it)")
            await asyncio.sleep(0.1)

    async def prepare_session(self, session_id: str) -> None:
        """Issue 25: make a session's network while its image is pulled (Agent.pull_image),
        which ``create_kernel`` then finds (a network takes as long to make as a small
        pull: the two overlap). If no kernel of the session comes within
        ``PREPARED_TTL`` seconds (its start failed elsewhere), the network goes again;
        a failure here is left to ``create_kernel``, which tries again and says why."""
        if self.use_host_network:
            return
        self._prepared.add(session_id)
        try:
            await self._session_network(session_id)
        except (DockerError, AgentError) as e:
            log.info("session %s: network not made ahead (%s); made at the kernel's start",
                     session_id, getattr(e, "message", None) or e)
        self._spawn(self._unprepare_later(session_id))

    async def unprepare_session(self, session_id: str) -> None:
        """The network :meth:`prepare_session` made, removed (no kernel of the session
        came: the pull failed); a session with a kernel here keeps it."""
        if session_id in self._prepared:
            self._prepared.discard(session_id)
            async with name_lock(self.session_network_name(session_id)):
                await self._remove_session_network(session_id)

    async def _unprepare_later(self, session_id: str) -> None:
        await asyncio.sleep(PREPARED_TTL)
        await self.unprepare_session(session_id)

    async def _remove_session_network(self, session_id: str) -> None:
        """Remove a session's network once no container is left on it (another
        agent's kernels of the same session may still use it: then it stays). An
        overlay network shows only this engine's containers: one that the Swarm says
        is still in use (by another engine's kernel, or a moment after this engine's
        last one left) is tried again in the background, and the last agent removes it."""
        for found in await self._networks_named(self.session_network_name(session_id)):
            try:
                net = await self.docker.networks.get(found["Id"])
                if _kernels_on(await net.show()):
                    continue
                await net.delete()
            except DockerError as e:
                if found.get("Driver") == "overlay" and e.status != 404 and "in use" in (e.message or ""):
                    self._spawn(self._remove_overlay_later(found["Id"], found["Name"]))
                elif e.status not in (403, 404, 409) and not _gone(e):  # in use, gone: nothing to do
                    log.warning("could not remove network %s: %s", found["Name"], e.message)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _remove_overlay_later(self, net_id: str, name: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            try:
                net = await self.docker.networks.get(net_id)
                if _kernels_on(await net.show()):
                    return  # a kernel of this engine joined it again: its agent removes it
                await net.delete()
                return
            except DockerError as e:
                if e.status == 404 or _gone(e):
                    return
                if "in use" not in (e.message or ""):
                    log.warning("could not remove network %s: %s", name, e.message)
                    return
        log.info("overlay network %s is still in use after %g s; the agent whose kernel "
                 "leaves it last removes it", name, timeout)

    async def _remove_idle_session_networks(self) -> None:
        """Networks of this agent's sessions that no container uses any more (left
        by an agent that stopped while removing them)."""
        nets = await self.docker.networks.list(
            filters={"label": [f"{L_NETWORK}=session", f"{L_AGENT}={self.agent_id}",
                               *self._installation_filter()]}
        )
        for net in nets:
            sid = (net.get("Labels") or {}).get(L_SESSION)
            if sid:
                await self._remove_session_network(sid)
