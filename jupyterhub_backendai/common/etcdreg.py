"""The cluster's etcd: key layout, and an agent's registration under a lease.

Key layout under the cluster's prefix (default ``/backendai``; docs/cluster.md):

- ``<prefix>/nodes/agents/<agent id>``: JSON ``{"id", "addr", "resource_group",
  "available_slots", "architecture", "backend", "version", "devices", "images"}``,
  written by the agent under a lease of ``ttl`` seconds that it keeps alive; the
  key disappears when the agent stops or, once it died, when the lease expires.
- ``<prefix>/config/storage-proxies/<name>``: JSON ``{"url": "https://...:6021"}``
  (optionally ``"tls"``, or the deprecated ``"token"``): a storage proxy daemon the
  managers use for vfolder hosts ``<name>:<volume>``.
- ``<prefix>/config/manager/<setting>``: a JSON value for one of the manager's
  cluster-wide settings (``BackendAIManager`` traits tagged ``cluster=True``, such
  as ``agent_lost_timeout`` or ``default_vfolder_host``), the same for every hub of
  the cluster; it overrides the hub's own configuration while the key exists.
- ``<prefix>/config/container-registries/<name>``: JSON ``{"url", "project", "username",
  "password", "ca_cert", "pull_policy"}``: a container registry of the image catalogue
  (manager/registries.py), written by the admin API or by hand; every hub mirrors it
  into the record.

etcd restarted (with or without its data): the agent's next refresh fails or finds
its lease gone, and it registers again with a new lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable

from .tasks import stop_task

log = logging.getLogger(__name__)

AGENTS = "/nodes/agents/"
STORAGE_PROXIES = "/config/storage-proxies/"
SETTINGS = "/config/manager/"
REGISTRIES = "/config/container-registries/"


def etcd_client(url: str):
    """An ``aetcd.Client`` for ``http://host:port`` (or ``host:port``)."""
    import aetcd

    parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parsed.scheme != "http" or not parsed.hostname:
        raise ValueError(f"etcd endpoint must be http://host:port, not {url!r}")
    return aetcd.Client(host=parsed.hostname, port=parsed.port or 2379, timeout=5)


def agent_key(prefix: str, agent_id: str) -> bytes:
    return f"{prefix.rstrip('/')}{AGENTS}{agent_id}".encode()


class AgentRegistration:
    """Keep ``<prefix>/nodes/agents/<id>`` in etcd while the agent lives."""

    def __init__(self, url: str, prefix: str, agent_id: str,
                 describe: Callable[[], Awaitable[dict]], ttl: float = 10.0):
        self.url = url
        self.key = agent_key(prefix, agent_id)
        self.describe = describe
        self.ttl = max(int(round(ttl)), 2)
        self._task: asyncio.Task | None = None
        self._client = None
        self._lease = None
        self.registrations = 0  # how many times the key was (re)written under a new lease

    async def _register(self) -> None:
        if self._client is not None:
            try:
                await self._client.close()
            except Exception:
                pass
        self._client = etcd_client(self.url)
        await self._client.connect()
        self._lease = await self._client.lease(self.ttl)
        await self._client.put(self.key, json.dumps(await self.describe()).encode(), lease=self._lease)
        self.registrations += 1
        log.info("registered in etcd as %s (lease %s, %s s)", self.key.decode(), self._lease.id, self.ttl)

    async def update(self) -> None:
        """Write the description again under the current lease (it changed: a move to
        another resource group); without a lease the next registration writes it."""
        if self._client is not None and self._lease is not None:
            await self._client.put(self.key, json.dumps(await self.describe()).encode(),
                                   lease=self._lease)

    async def _alive(self) -> bool:
        """Refresh the lease; False when it is gone (etcd lost it, or it expired)."""
        resp = await self._lease.refresh()
        ttl = getattr(resp[0] if isinstance(resp, list | tuple) else resp, "TTL", 0)
        return ttl > 0

    async def _loop(self) -> None:
        failures = 0
        while True:
            try:
                if self._lease is None or not await self._alive():
                    await self._register()
                failures = 0
                await asyncio.sleep(self.ttl / 3)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures += 1
                if failures == 1:
                    log.warning("etcd registration failed (%s); retrying", e)
                self._lease = None
                await asyncio.sleep(min(0.2 * failures, 1.0))

    async def start(self) -> None:
        try:
            await self._register()
        except Exception as e:  # etcd down at start: the loop keeps trying
            log.warning("etcd registration failed (%s); retrying", e)
            self._lease = None
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        await stop_task(self._task)
        if self._client is not None:
            try:
                if self._lease is not None:
                    await self._lease.revoke()  # the key goes at once
            except Exception:
                pass
            try:
                await self._client.close()
            except Exception:
                pass
