"""How the manager reaches storage proxies: one interface, two implementations.

- :class:`InProcessStorageClient`: the embedded default; the hub serves its own
  volumes directly (no daemon, no HTTP; blocking file work runs in threads).
- :class:`HTTPStorageClient`: a ``backendai-storage-proxy`` daemon (cluster mode),
  streaming uploads and downloads both ways; its errors come back as the same
  :class:`BackendAIError` classes with the same status codes.

A vfolder host is ``"<proxy>:<volume>"``; :class:`StorageRegistry` maps it to the
client of that proxy and the volume name.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator

import aiohttp

from ..common.errors import BackendAIError, InvalidRequest, NotFound
from ..common.httpbase import ERRORS as _ERRORS
from ..common.httpbase import NodeClient, TLSFiles
from .backends import make_volumes
from .files import CHUNK_SIZE
from .volumes import VFSVolume


class StorageClient:
    """Operations of one storage proxy on its volumes. Every method may raise a
    :class:`BackendAIError` (4xx for what the caller got wrong: 400 bad id or path,
    404 no such volume/folder/file, 409 exists or not empty, 413 over the quota).

    Paths inside a folder are relative POSIX paths (``""`` is the folder itself);
    symbolic links are listed but never followed."""

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

    async def folder_usage(self, volume: str, quota_scope_id: str, folder_id: str) -> dict:
        """``{"used_bytes", "file_count"}`` of a folder (404 when it does not exist)."""
        raise NotImplementedError

    async def folders_usage(self, volume: str, folders: list[tuple[str, str]]
                            ) -> list[dict | None]:
        """:meth:`folder_usage` of each ``(quota_scope_id, folder_id)`` in one request (on
        btrfs one read of the quota tree), in order; None for a folder that does not exist."""
        raise NotImplementedError

    async def scope_usage(self, volume: str, quota_scope_id: str) -> dict:
        """``{"used_bytes", "file_count"}`` of every folder of a quota scope."""
        raise NotImplementedError

    async def set_quota_scope(self, volume: str, quota_scope_id: str, limit_bytes: int | None) -> None:
        """Bound the bytes of a quota scope (None: unbounded)."""
        raise NotImplementedError

    async def quota_scope(self, volume: str, quota_scope_id: str) -> dict:
        """``{"limit_bytes", "used_bytes"}``."""
        raise NotImplementedError

    async def set_folder_quota(self, volume: str, quota_scope_id: str, folder_id: str,
                               limit_bytes: int | None) -> None:
        """Bound the bytes of one folder (None: only its scope's limit); btrfs sets its
        qgroup's limit, vfs checks uploads. 404 no such folder."""
        raise NotImplementedError

    async def folder_quota(self, volume: str, quota_scope_id: str, folder_id: str) -> dict:
        """``{"limit_bytes", "used_bytes"}`` of one folder."""
        raise NotImplementedError

    async def clone_folder(self, volume: str, quota_scope_id: str, folder_id: str,
                           target_scope_id: str, target_folder_id: str) -> None:
        """Make a new folder a copy of a folder of the same volume (vfs: a copy; btrfs:
        a snapshot), with the source's own limit. 404 no source, 409 the target exists,
        413 the target scope's quota."""
        raise NotImplementedError

    async def list_files(self, volume: str, quota_scope_id: str, folder_id: str, path: str = "") -> list[dict]:
        """Entries ``{name, type: file|dir|symlink|other, size, mtime}`` by name."""
        raise NotImplementedError

    async def mkdir(self, volume: str, quota_scope_id: str, folder_id: str, path: str, parents: bool = False) -> None:
        raise NotImplementedError

    async def rename(self, volume: str, quota_scope_id: str, folder_id: str, path: str, new_path: str) -> None:
        """Within one folder; an existing destination is a 409."""
        raise NotImplementedError

    async def delete(self, volume: str, quota_scope_id: str, folder_id: str, path: str, recursive: bool = False) -> None:
        raise NotImplementedError

    async def upload(self, volume: str, quota_scope_id: str, folder_id: str, path: str,
                     chunks: AsyncIterable[bytes]) -> dict:
        """Write a file from ``chunks``, all or nothing: ``{"path", "size"}``. A failure
        (quota, an error raised by ``chunks``, a broken connection) leaves the previous
        file, if any, as it was and no partial file behind."""
        raise NotImplementedError

    async def download(self, volume: str, quota_scope_id: str, folder_id: str, path: str
                       ) -> tuple[int, AsyncIterator[bytes]]:
        """(size, chunks) of a file. Consume the chunks or ``aclose()`` them: they hold
        the file (or the connection) open."""
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

    async def folder_usage(self, volume, quota_scope_id, folder_id):
        return await asyncio.to_thread(self.volume(volume).folder_usage, quota_scope_id, folder_id)

    async def folders_usage(self, volume, folders):
        return await asyncio.to_thread(self.volume(volume).folders_usage,
                                       [(str(s), str(f)) for s, f in folders])

    async def scope_usage(self, volume, quota_scope_id):
        return await asyncio.to_thread(self.volume(volume).scope_usage, quota_scope_id)

    async def set_quota_scope(self, volume, quota_scope_id, limit_bytes):
        await asyncio.to_thread(self.volume(volume).set_quota_scope, quota_scope_id, limit_bytes)

    async def quota_scope(self, volume, quota_scope_id):
        return await asyncio.to_thread(self.volume(volume).quota_scope, quota_scope_id)

    async def set_folder_quota(self, volume, quota_scope_id, folder_id, limit_bytes):
        await asyncio.to_thread(self.volume(volume).set_folder_quota, quota_scope_id,
                                folder_id, limit_bytes)

    async def folder_quota(self, volume, quota_scope_id, folder_id):
        return await asyncio.to_thread(self.volume(volume).folder_quota, quota_scope_id,
                                       folder_id)

    async def clone_folder(self, volume, quota_scope_id, folder_id, target_scope_id,
                           target_folder_id):
        await asyncio.to_thread(self.volume(volume).clone_folder, quota_scope_id, folder_id,
                                target_scope_id, target_folder_id)

    async def list_files(self, volume, quota_scope_id, folder_id, path=""):
        return await asyncio.to_thread(
            self.volume(volume).list_files, quota_scope_id, folder_id, path
        )

    async def mkdir(self, volume, quota_scope_id, folder_id, path, parents=False):
        await asyncio.to_thread(
            self.volume(volume).mkdir, quota_scope_id, folder_id, path, bool(parents)
        )

    async def rename(self, volume, quota_scope_id, folder_id, path, new_path):
        await asyncio.to_thread(
            self.volume(volume).rename, quota_scope_id, folder_id, path, new_path
        )

    async def delete(self, volume, quota_scope_id, folder_id, path, recursive=False):
        await asyncio.to_thread(
            self.volume(volume).delete, quota_scope_id, folder_id, path, bool(recursive)
        )

    async def upload(self, volume, quota_scope_id, folder_id, path, chunks):
        up = await asyncio.to_thread(
            self.volume(volume).begin_upload, quota_scope_id, folder_id, path
        )
        try:
            buf: list[bytes] = []
            size = 0
            async for chunk in chunks:
                buf.append(chunk)
                size += len(chunk)
                if size >= CHUNK_SIZE:  # one thread hop per MiB, not per network chunk
                    await asyncio.to_thread(up.write, b"".join(buf))
                    buf, size = [], 0
            if buf:
                await asyncio.to_thread(up.write, b"".join(buf))
            return await asyncio.to_thread(up.commit)
        finally:
            up.abort()  # no-op after commit; waits for a write still running in a thread

    async def download(self, volume, quota_scope_id, folder_id, path):
        size, chunks = await asyncio.to_thread(
            self.volume(volume).download, quota_scope_id, folder_id, path
        )

        async def gen():
            try:
                while chunk := await asyncio.to_thread(chunks.read):
                    yield chunk
            finally:
                chunks.close()

        return size, gen()


ERRORS = _ERRORS  # the error classes by name (common/httpbase.py)


def _q(segment: str) -> str:
    """One URL path segment: ``/`` and everything else unsafe percent-encoded, so that
    a bad id reaches the daemon's checks as it is (and gets their 400)."""
    return urllib.parse.quote(str(segment), safe=":")


class HTTPStorageClient(StorageClient):
    """A ``backendai-storage-proxy`` daemon's API (JSON, problem+json errors; see
    docs/storage.md) through the hub's one node client (``common/httpbase.py``):
    mutual TLS with ``tls`` (a :class:`TLSFiles`), else the deprecated shared
    ``token``. One keep-alive connection pool per client."""

    def __init__(self, url: str, token: str = "", timeout: float = 300, tls: TLSFiles | None = None):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.node = NodeClient(self.url, tls=tls, token=token, timeout=timeout, what="storage proxy")

    def _http(self) -> aiohttp.ClientSession:
        return self.node.session()

    def _folder(self, volume, quota_scope_id, folder_id) -> str:
        return f"/v1/volumes/{_q(volume)}/folders/{_q(quota_scope_id)}/{_q(folder_id)}"

    def _scope(self, volume, quota_scope_id) -> str:
        return f"/v1/volumes/{_q(volume)}/quota-scopes/{_q(quota_scope_id)}"

    async def _raise_for(self, resp: aiohttp.ClientResponse) -> None:
        await self.node.raise_for(resp)

    def _unreachable(self, e: Exception) -> BackendAIError:
        return self.node.unreachable(e)

    async def _call(self, method: str, path: str, *, params=None, body=None):
        return await self.node.call(method, path, params=params, body=body)

    async def volumes(self):
        return (await self._call("GET", "/v1/volumes"))["volumes"]

    async def create_folder(self, volume, quota_scope_id, folder_id):
        await self._call("PUT", self._folder(volume, quota_scope_id, folder_id))

    async def delete_folder(self, volume, quota_scope_id, folder_id):
        await self._call("DELETE", self._folder(volume, quota_scope_id, folder_id))

    async def mount_path(self, volume, quota_scope_id, folder_id):
        return (await self._call("GET", self._folder(volume, quota_scope_id, folder_id)))["path"]

    async def folder_usage(self, volume, quota_scope_id, folder_id):
        return await self._call("GET", self._folder(volume, quota_scope_id, folder_id) + "/usage")

    async def folders_usage(self, volume, folders):
        body = {"folders": [{"quota_scope_id": s, "folder_id": f} for s, f in folders]}
        return (await self._call("POST", f"/v1/volumes/{_q(volume)}/folders-usage",
                                 body=body))["items"]

    async def clone_folder(self, volume, quota_scope_id, folder_id, target_scope_id,
                           target_folder_id):
        await self._call("POST", self._folder(volume, quota_scope_id, folder_id) + "/clone",
                         body={"target_scope": target_scope_id, "target_folder": target_folder_id})

    async def scope_usage(self, volume, quota_scope_id):
        return await self._call("GET", self._scope(volume, quota_scope_id) + "/usage")

    async def set_quota_scope(self, volume, quota_scope_id, limit_bytes):
        await self._call("PUT", self._scope(volume, quota_scope_id), body={"limit_bytes": limit_bytes})

    async def quota_scope(self, volume, quota_scope_id):
        return await self._call("GET", self._scope(volume, quota_scope_id))

    async def set_folder_quota(self, volume, quota_scope_id, folder_id, limit_bytes):
        await self._call("PUT", self._folder(volume, quota_scope_id, folder_id) + "/quota",
                         body={"limit_bytes": limit_bytes})

    async def folder_quota(self, volume, quota_scope_id, folder_id):
        return await self._call("GET", self._folder(volume, quota_scope_id, folder_id) + "/quota")

    async def list_files(self, volume, quota_scope_id, folder_id, path=""):
        base = self._folder(volume, quota_scope_id, folder_id)
        return (await self._call("GET", base + "/files", params={"path": path}))["entries"]

    async def mkdir(self, volume, quota_scope_id, folder_id, path, parents=False):
        base = self._folder(volume, quota_scope_id, folder_id)
        await self._call("POST", base + "/mkdir", body={"path": path, "parents": parents})

    async def rename(self, volume, quota_scope_id, folder_id, path, new_path):
        base = self._folder(volume, quota_scope_id, folder_id)
        await self._call("POST", base + "/rename", body={"path": path, "new_path": new_path})

    async def delete(self, volume, quota_scope_id, folder_id, path, recursive=False):
        base = self._folder(volume, quota_scope_id, folder_id)
        params = {"path": path, "recursive": "1" if recursive else "0"}
        await self._call("DELETE", base + "/files", params=params)

    async def upload(self, volume, quota_scope_id, folder_id, path, chunks):
        url = self.url + self._folder(volume, quota_scope_id, folder_id) + "/content"
        if not isinstance(path, str):
            raise InvalidRequest(f"a path must be a string, not {type(path).__name__}")

        source_error: Exception | None = None

        async def body():
            nonlocal source_error
            try:
                async for chunk in chunks:
                    yield chunk
            except Exception as e:
                source_error = e
                raise

        try:
            async with self._http().put(url, params={"path": path}, data=body()) as resp:
                await self._raise_for(resp)
                return await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError) as e:
            if source_error is not None:
                # the caller's chunks failed: the same error as in the hub (the daemon
                # sees the request break off and drops the temp file)
                raise source_error from None
            raise self._unreachable(e) from None

    async def download(self, volume, quota_scope_id, folder_id, path):
        url = self.url + self._folder(volume, quota_scope_id, folder_id) + "/content"
        try:
            resp = await self._http().get(url, params={"path": path})
        except (TimeoutError, aiohttp.ClientError) as e:
            raise self._unreachable(e) from None
        try:
            await self._raise_for(resp)
            size = int(resp.headers["Content-Length"])
        except BaseException:
            resp.release()
            raise

        async def gen():
            try:
                async for chunk in resp.content.iter_chunked(CHUNK_SIZE):
                    yield chunk
            except (TimeoutError, aiohttp.ClientError) as e:
                raise self._unreachable(e) from None
            finally:
                resp.release()

        return size, gen()

    async def close(self):
        await self.node.close()


def split_host(host: str) -> tuple[str, str]:
    """``"local:volume1"`` -> ``("local", "volume1")``."""
    if not isinstance(host, str) or host.count(":") != 1 or "" in host.split(":"):
        raise InvalidRequest(f"vfolder host must be '<proxy>:<volume>', not {host!r}")
    proxy, volume = host.split(":")
    return proxy, volume


class StorageRegistry:
    """The storage proxies the manager knows, by name. Every operation takes a host
    ``"<proxy>:<volume>"`` and passes the rest through to that proxy's client."""

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

    async def clone_folder(self, host: str, quota_scope_id: str, folder_id: str,
                           target_scope_id: str, target_folder_id: str) -> None:
        client, volume = self.resolve(host)
        await client.clone_folder(volume, quota_scope_id, folder_id, target_scope_id,
                                  target_folder_id)

    async def folder_usage(self, host: str, quota_scope_id: str, folder_id: str) -> dict:
        client, volume = self.resolve(host)
        return await client.folder_usage(volume, quota_scope_id, folder_id)

    async def folders_usage(self, host: str, folders: list[tuple[str, str]]) -> list[dict | None]:
        client, volume = self.resolve(host)
        return await client.folders_usage(volume, folders)

    async def set_folder_quota(self, host: str, quota_scope_id: str, folder_id: str,
                               limit_bytes: int | None) -> None:
        client, volume = self.resolve(host)
        await client.set_folder_quota(volume, quota_scope_id, folder_id, limit_bytes)

    async def folder_quota(self, host: str, quota_scope_id: str, folder_id: str) -> dict:
        client, volume = self.resolve(host)
        return await client.folder_quota(volume, quota_scope_id, folder_id)

    async def scope_usage(self, host: str, quota_scope_id: str) -> dict:
        client, volume = self.resolve(host)
        return await client.scope_usage(volume, quota_scope_id)

    async def set_quota_scope(self, host: str, quota_scope_id: str, limit_bytes: int | None) -> None:
        client, volume = self.resolve(host)
        await client.set_quota_scope(volume, quota_scope_id, limit_bytes)

    async def quota_scope(self, host: str, quota_scope_id: str) -> dict:
        client, volume = self.resolve(host)
        return await client.quota_scope(volume, quota_scope_id)

    async def list_files(self, host: str, quota_scope_id: str, folder_id: str, path: str = "") -> list[dict]:
        client, volume = self.resolve(host)
        return await client.list_files(volume, quota_scope_id, folder_id, path)

    async def mkdir(self, host: str, quota_scope_id: str, folder_id: str, path: str, parents: bool = False) -> None:
        client, volume = self.resolve(host)
        await client.mkdir(volume, quota_scope_id, folder_id, path, parents)

    async def rename(self, host: str, quota_scope_id: str, folder_id: str, path: str, new_path: str) -> None:
        client, volume = self.resolve(host)
        await client.rename(volume, quota_scope_id, folder_id, path, new_path)

    async def delete(self, host: str, quota_scope_id: str, folder_id: str, path: str, recursive: bool = False) -> None:
        client, volume = self.resolve(host)
        await client.delete(volume, quota_scope_id, folder_id, path, recursive)

    async def upload(self, host: str, quota_scope_id: str, folder_id: str, path: str,
                     chunks: AsyncIterable[bytes]) -> dict:
        client, volume = self.resolve(host)
        return await client.upload(volume, quota_scope_id, folder_id, path, chunks)

    async def download(self, host: str, quota_scope_id: str, folder_id: str, path: str
                       ) -> tuple[int, AsyncIterator[bytes]]:
        client, volume = self.resolve(host)
        return await client.download(volume, quota_scope_id, folder_id, path)

    async def close(self) -> None:
        for c in self.clients.values():
            await c.close()


def make_storage_registry(proxies: dict, local_volumes: dict, tls: TLSFiles | None = None) -> StorageRegistry:
    """Clients for the configured daemons, plus the in-hub proxy "local" serving
    ``local_volumes`` unless a daemon of that name is configured. ``tls``: the
    hub's certificate for https:// proxies (an entry's own "tls" overrides it)."""
    clients: dict[str, StorageClient] = {}
    for name, conf in proxies.items():
        if not conf.get("url"):
            raise ValueError(f"storage proxy {name!r} needs a url")
        node_tls = TLSFiles.from_config(conf.get("tls")) or (
            tls if conf["url"].startswith("https:") else None
        )
        if node_tls is None and not conf.get("token"):
            raise ValueError(
                f"storage proxy {name!r} needs an https:// url and the hub's cluster TLS "
                "(c.BackendAIManager.cluster_tls), or (deprecated) a token"
            )
        clients[name] = HTTPStorageClient(conf["url"], conf.get("token", ""), tls=node_tls)
    if "local" not in clients:
        clients["local"] = InProcessStorageClient(make_volumes(local_volumes))
    return StorageRegistry(clients)


__all__ = [
    "HTTPStorageClient",
    "make_storage_registry",
    "InProcessStorageClient",
    "StorageClient",
    "StorageRegistry",
    "split_host",
]
