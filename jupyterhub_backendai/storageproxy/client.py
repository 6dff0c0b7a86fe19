"""How the manager reaches storage proxies: one interface, two implementations.

- :class:`InProcessStorageClient`: the embedded default; the hub serves its own
  volumes directly (no daemon, no HTTP).
- :class:`HTTPStorageClient`: a ``backendai-storage-proxy`` daemon (cluster mode).

A vfolder host is ``"<proxy>:<volume>"``; :class:`StorageRegistry` maps it to the
client of that proxy and the volume name.
"""

from __future__ import annotations

import asyncio

from ..common.errors import InvalidRequest, NotFound
from .volumes import VFSVolume


class StorageClient:
    """Operations of one storage proxy on its volumes. Every method may raise a
    :class:`BackendAIError` (4xx for what the caller got wrong)."""

    async def volumes(self) -> list[dict]:
        raise NotImplementedError

    async def create_folder(self, volume: str, quota_scope_id: str, folder_id: str) -> None:
        """Idempotent."""
        raise NotImplementedError

    async def delete_folder(self, volume: str, quota_scope_id: str, folder_id: str) -> None:
        """Idempotent."""
        raise NotImplementedError

    async def mount_path(self, volume: str, quota_scope_id: str, folder_id: str) -> str:
        """The folder's path on the agents' hosts (what a kernel bind-mounts)."""
        raise NotImplementedError

    async def close(self) -> None:
        pass


class InProcessStorageClient(StorageClient):
    def __init__(self, volumes: dict[str, VFSVolume]):
        self._volumes = volumes

    def volume(self, name: str) -> VFSVolume:
        try:
            return self._volumes[name]
        except KeyError:
            raise NotFound(f"no volume {name!r} on this storage proxy") from None

    async def volumes(self) -> list[dict]:
        return [v.info() for v in self._volumes.values()]

    async def create_folder(self, volume, quota_scope_id, folder_id):
        await asyncio.to_thread(self.volume(volume).create_folder, quota_scope_id, folder_id)

    async def delete_folder(self, volume, quota_scope_id, folder_id):
        await asyncio.to_thread(self.volume(volume).delete_folder, quota_scope_id, folder_id)

    async def mount_path(self, volume, quota_scope_id, folder_id):
        return self.volume(volume).folder_path(quota_scope_id, folder_id)


class HTTPStorageClient(StorageClient):
    """A ``backendai-storage-proxy`` daemon's API (token-authenticated JSON)."""

    def __init__(self, url: str, token: str):
        self.url = url.rstrip("/")
        self.token = token


def split_host(host: str) -> tuple[str, str]:
    """``"local:volume1"`` -> ``("local", "volume1")``."""
    if not isinstance(host, str) or host.count(":") != 1 or "" in host.split(":"):
        raise InvalidRequest(f"vfolder host must be '<proxy>:<volume>', not {host!r}")
    proxy, volume = host.split(":")
    return proxy, volume


class StorageRegistry:
    """The storage proxies the manager knows, by name."""

    def __init__(self, clients: dict[str, StorageClient]):
        self.clients = clients

    def resolve(self, host: str) -> tuple[StorageClient, str]:
        proxy, volume = split_host(host)
        try:
            return self.clients[proxy], volume
        except KeyError:
            raise InvalidRequest(f"unknown storage proxy {proxy!r} in host {host!r}") from None

    async def hosts(self) -> list[str]:
        out = []
        for name, client in self.clients.items():
            out.extend(f"{name}:{v['name']}" for v in await client.volumes())
        return sorted(out)

    async def create_folder(self, host: str, quota_scope_id: str, folder_id: str) -> None:
        client, volume = self.resolve(host)
        await client.create_folder(volume, quota_scope_id, folder_id)

    async def delete_folder(self, host: str, quota_scope_id: str, folder_id: str) -> None:
        client, volume = self.resolve(host)
        await client.delete_folder(volume, quota_scope_id, folder_id)

    async def mount_path(self, host: str, quota_scope_id: str, folder_id: str) -> str:
        client, volume = self.resolve(host)
        return await client.mount_path(volume, quota_scope_id, folder_id)

    async def close(self) -> None:
        for c in self.clients.values():
            await c.close()


def make_storage_registry(proxies: dict, local_volumes: dict) -> StorageRegistry:
    """Clients for the configured daemons, plus the in-hub proxy "local" serving
    ``local_volumes`` unless a daemon of that name is configured."""
    clients: dict[str, StorageClient] = {}
    for name, conf in proxies.items():
        if not conf.get("url"):
            raise ValueError(f"storage proxy {name!r} needs a url")
        clients[name] = HTTPStorageClient(conf["url"], conf.get("token", ""))
    if "local" not in clients:
        volumes = {}
        for vname, conf in local_volumes.items():
            backend = conf.get("backend", "vfs")
            if backend != "vfs":
                raise ValueError(f"volume {vname!r}: unknown backend {backend!r} (only vfs)")
            volumes[vname] = VFSVolume(
                vname, conf["path"], conf.get("folder_uid", 1000), conf.get("folder_gid", 1000)
            )
        clients["local"] = InProcessStorageClient(volumes)
    return StorageRegistry(clients)


__all__ = [
    "HTTPStorageClient",
    "make_storage_registry",
    "InProcessStorageClient",
    "StorageClient",
    "StorageRegistry",
    "split_host",
]
