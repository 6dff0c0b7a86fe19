"""Container registries: where their configuration lives, and their rescans (issue 25).

**Where.** Embedded (no ``c.BackendAICluster.etcd_url``), the record's
``container_registries`` table is their home. In cluster mode etcd is, as in Backend.AI:
``<prefix>/config/container-registries/<name>``, JSON ``{"url", "project", "username",
"password", "ca_cert", "pull_policy"}`` (common/etcdreg.py). The admin API writes there
(a new registry only where no key is, in one etcd transaction: two hubs cannot both
create one name), and every hub follows the prefix (manager/discovery.py) and mirrors
each registry into the record (:func:`store_registry`), where the catalogue's images
name it as their source and its last scan is kept. A registry gone from etcd goes from
the record with its images; at each full read of the prefix, a registry the record has
and etcd has not is removed (etcd decides). The mirror holds the password too (a pull or
a rescan reads it there, on whichever hub it runs): etcd and the database both hold the
installation's secrets. No answer carries a password (``has_password``) and nothing
here logs one.

**Rescans.** :meth:`Registries.rescan` lists a registry's repositories and tags over the
registry HTTP API v2 (:func:`scan_registry`), reads each image's config blob for its
labels and records every image that declares ``ai.backend.kernelspec`` (images.py
``record_scan``); ``local`` is what the agents' engines hold (:func:`scan_local`). A hub
runs one rescan per registry at a time: a second request for a registry being rescanned
waits for the same one. Its progress (images read of those listed) is in the answers
of ``GET /container-registries[/{name}]`` (``rescan``) and on the console's
Environments page, which follows it while the Rescan button waits. Progress is this
hub's: another hub of the cluster answers the last rescan it ran itself.
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import time
from collections.abc import Callable

import aiohttp
from sqlalchemy import delete, select

from ..common.errors import BackendAIError, Conflict, InvalidRequest, NotFound
from ..models import ContainerRegistry, Image, ImageAlias
from ..models.base import utcnow
from . import access, responses
from .access import Principal
from .ops import reads, writes

LOCAL = "local"
KERNELSPEC = "ai.backend.kernelspec"
PULL_POLICIES = ("digest", "tag", "none")
MANIFEST_TYPES = ", ".join((
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
))
# A name, or a host as Backend.AI names registries ("cr.example.org", "127.0.0.1:5000").
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._:-]{0,63}$")


class RegistryError(BackendAIError):
    """The registry refused or failed a rescan (its reason in the detail)."""

    status_code = 502
    title = "Registry error"



# -- the record (the home of registries embedded; etcd's mirror in cluster mode) --------


def _registry_body(r: ContainerRegistry) -> dict:
    return responses.ContainerRegistry.body({
        "name": r.name, "url": r.url, "project": r.project, "username": r.username,
        "has_password": bool(r.password), "has_ca_cert": bool(r.ca_cert),
        "pull_policy": r.pull_policy, "last_scan": r.last_scan, "created_at": r.created_at,
    })


REGISTRY_FIELDS = ("url", "project", "username", "password", "ca_cert", "pull_policy")


def _check_registry(body: dict) -> None:
    url = body.get("url")
    if url is not None and not re.match(r"^https?://[^/\s]+/?$", url):
        raise InvalidRequest(f"url: {url!r} is not a registry address (https://host[:port])")
    pol = body.get("pull_policy")
    if pol is not None and pol not in PULL_POLICIES:
        raise InvalidRequest(f"pull_policy: {pol!r} is not one of {', '.join(PULL_POLICIES)}")
    proj = body.get("project")
    if proj and not re.match(r"^[a-z0-9]+(?:[._/-][a-z0-9]+)*$", proj):
        raise InvalidRequest(f"project: {proj!r} is not a registry namespace")
    ca = body.get("ca_cert")
    if ca and "-----BEGIN CERTIFICATE-----" not in ca:
        raise InvalidRequest("ca_cert: not a PEM certificate")


def _registry(db, name: str) -> ContainerRegistry:
    r = db.get(ContainerRegistry, name)
    if r is None:
        raise NotFound(f"no container registry {name!r}")
    return r


@reads
def list_registries(db, p: Principal) -> list[dict]:
    access.require(p.is_superadmin, "list container registries")
    return [_registry_body(r) for r in db.scalars(select(ContainerRegistry)
                                                  .order_by(ContainerRegistry.name))]


@reads
def get_registry(db, p: Principal, name: str) -> dict:
    access.require(p.is_superadmin, "see container registries")
    return _registry_body(_registry(db, name))




def new_registry(body: dict) -> tuple[str, dict]:
    """A new registry's name and settings from a create request, checked."""
    name = body.get("name") or ""
    if not _NAME.match(name) or name == LOCAL:
        raise InvalidRequest(f"name: {name!r} is not a registry name (letters, digits, . _ - :; "
                             f"not {LOCAL!r}, the agents' own images)")
    if not body.get("url"):
        raise InvalidRequest("url: required field missing")
    _check_registry(body)
    conf = {"url": "", "project": "", "username": "", "password": "", "ca_cert": "",
            "pull_policy": "tag"}
    return name, _merged(conf, body)


def _merged(conf: dict, body: dict) -> dict:
    out = dict(conf)
    for k in REGISTRY_FIELDS:
        if body.get(k) is not None:
            out[k] = body[k].rstrip("/") if k == "url" else body[k]
    return out


def _conf_of(r: ContainerRegistry) -> dict:
    return {k: getattr(r, k) or "" for k in REGISTRY_FIELDS}


@writes
def store_registry(db, name: str, body: dict, mode: str) -> None:
    """Write registry ``name``'s settings to the record: ``create`` (Conflict where it
    is), ``update`` (the fields given; NotFound where it is not) or ``mirror`` (etcd's
    whole settings, inserted or replaced: every hub of a cluster does it, at once)."""
    if mode == "mirror":
        if db.bind.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        db.execute(insert(ContainerRegistry)
                   .values(name=name, created_at=utcnow(), **body)
                   .on_conflict_do_update(index_elements=["name"], set_=body))
        return
    r = db.get(ContainerRegistry, name, with_for_update=True)
    if mode == "create":
        if r is not None:
            raise Conflict(f"container registry {name!r} exists")
        db.add(ContainerRegistry(name=name, **body))
    else:
        if r is None:
            raise NotFound(f"no container registry {name!r}")
        for k, v in _merged(_conf_of(r), body).items():
            setattr(r, k, v)
    db.flush()


@writes
def drop_registry(db, name: str) -> bool:
    """Registry ``name`` and its images (their aliases with them) gone from the record;
    whether it was there."""
    r = db.get(ContainerRegistry, name, with_for_update=True)
    names = list(db.scalars(select(Image.name).where(Image.source == name)))
    if names:
        db.execute(delete(ImageAlias).where(ImageAlias.image.in_(names)))
        db.execute(delete(Image).where(Image.name.in_(names)))
    if r is None:
        return False
    db.delete(r)
    return True


@reads
def registry_names(db) -> list[str]:
    return list(db.scalars(select(ContainerRegistry.name)))


@reads
def registry_secrets(db, name: str) -> dict:
    """What a rescan or a pull needs of a registry, secrets included (never an answer of
    the API: the manager's own use)."""
    if name == LOCAL:
        return {"name": LOCAL, "url": "", "project": "", "username": "", "password": "",
                "ca_cert": "", "pull_policy": "none"}
    r = _registry(db, name)
    return {"name": r.name, "url": r.url, "project": r.project, "username": r.username,
            "password": r.password, "ca_cert": r.ca_cert, "pull_policy": r.pull_policy}



# -- the rescan -------------------------------------------------------------------------


def registry_host(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


def basic_auth(reg: dict) -> dict[str, str]:
    if not reg.get("username"):
        return {}
    raw = f"{reg['username']}:{reg.get('password', '')}".encode()
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


def docker_auth(reg: dict) -> dict | None:
    """The credentials an engine's pull takes (aiodocker's ``auth``), or None."""
    if not reg.get("username"):
        return None
    return {"username": reg["username"], "password": reg.get("password", ""),
            "serveraddress": registry_host(reg["url"])}


def _ssl(reg: dict):
    if not reg["url"].startswith("https:"):
        return False
    if reg.get("ca_cert"):
        return ssl.create_default_context(cadata=reg["ca_cert"])
    return ssl.create_default_context()


def _next_link(resp) -> str | None:
    link = resp.headers.get("Link", "")
    m = re.match(r'<([^>]+)>;\s*rel="next"', link)
    return m.group(1) if m else None


async def _get_json(http: aiohttp.ClientSession, url: str, headers: dict, what: str):
    async with http.get(url, headers=headers) as resp:
        if resp.status == 401:
            raise RegistryError(f"the registry refused the credentials ({what}): "
                                "wrong username or password")
        if resp.status == 404:
            return None, resp
        if resp.status >= 400:
            text = (await resp.text())[:300]
            raise RegistryError(f"the registry answered {resp.status} to {what}: {text}")
        return await resp.json(content_type=None), resp


Progress = Callable[[int, int], None]  # (images read, images listed)


def _ignore(done: int, total: int) -> None:
    pass


async def scan_registry(reg: dict, concurrency: int = 16,
                        progress: Progress = _ignore) -> list[dict]:
    """Every labelled image (``ai.backend.kernelspec``) of ``reg``'s project: the
    registry HTTP API v2 (catalogue, tags, manifests, config blobs); ``progress`` is told
    how many of the tags listed were read, as they are."""
    base = reg["url"].rstrip("/")
    host = registry_host(base)
    auth = basic_auth(reg)
    prefix = (reg.get("project") or "").strip("/")
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    conn = aiohttp.TCPConnector(ssl=_ssl(reg), limit=concurrency)
    found: list[dict] = []
    sem = asyncio.Semaphore(concurrency)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=conn) as http:
            repos: list[str] = []
            url: str | None = f"{base}/v2/_catalog?n=1000"
            while url:
                data, resp = await _get_json(http, url, auth, "the catalogue")
                repos += (data or {}).get("repositories") or []
                nxt = _next_link(resp)
                url = (base + nxt if nxt and nxt.startswith("/") else nxt)
            if prefix:
                repos = [r for r in repos if r == prefix or r.startswith(prefix + "/")]

            async def tags_of(repo: str) -> list[str]:
                async with sem:
                    data, _ = await _get_json(http, f"{base}/v2/{repo}/tags/list", auth,
                                              f"the tags of {repo}")
                return (data or {}).get("tags") or []

            async def image(repo: str, tag: str) -> dict | None:
                async with sem:
                    headers = {**auth, "Accept": MANIFEST_TYPES}
                    async with http.get(f"{base}/v2/{repo}/manifests/{tag}",
                                        headers=headers) as resp:
                        if resp.status == 404:
                            return None
                        if resp.status >= 400:
                            raise RegistryError(f"the registry answered {resp.status} to the "
                                                f"manifest of {repo}:{tag}")
                        digest = resp.headers.get("Docker-Content-Digest", "")
                        manifest = await resp.json(content_type=None)
                    if "manifests" in manifest:  # a list: take the amd64/linux one
                        chosen = next((m for m in manifest["manifests"]
                                       if (m.get("platform") or {}).get("architecture")
                                       in ("amd64", "x86_64")), None)
                        if chosen is None:
                            return None
                        async with http.get(f"{base}/v2/{repo}/manifests/{chosen['digest']}",
                                            headers=headers) as resp:
                            manifest = await resp.json(content_type=None)
                    cfg = (manifest.get("config") or {}).get("digest")
                    if not cfg:
                        return None
                    blob, _ = await _get_json(http, f"{base}/v2/{repo}/blobs/{cfg}", auth,
                                              f"the config of {repo}:{tag}")
                size = sum(int(layer.get("size") or 0) for layer in manifest.get("layers") or [])
                labels = ((blob or {}).get("config") or {}).get("Labels") or {}
                if KERNELSPEC not in labels:
                    return None
                arch = (blob or {}).get("architecture") or "amd64"
                return {"name": f"{host}/{repo}:{tag}", "repo": repo, "tag": tag,
                        "digest": digest, "size_bytes": size, "labels": dict(labels),
                        "architecture": "x86_64" if arch == "amd64" else arch}

            tag_lists = await asyncio.gather(*(tags_of(r) for r in repos))
            pairs = [(r, t) for r, tags in zip(repos, tag_lists, strict=True) for t in tags]
            read = 0
            progress(0, len(pairs))

            async def counted(repo: str, tag: str) -> dict | None:
                nonlocal read
                got = await image(repo, tag)
                read += 1
                progress(read, len(pairs))
                return got

            for got in await asyncio.gather(*(counted(r, t) for r, t in pairs)):
                if got is not None:
                    found.append(got)
    except aiohttp.ClientError as e:
        raise RegistryError(f"registry {reg['name']!r} at {base} cannot be reached: "
                            f"{e.__class__.__name__}: {e}") from None
    return sorted(found, key=lambda f: f["name"])


async def scan_local(mgr, progress: Progress = _ignore) -> list[dict]:
    """The labelled images the agents' engines hold (the source ``local``); ``progress``
    counts the agents asked."""
    clients = [c for group in await mgr.ops.resource_group_names()
               for c in await mgr.agents.clients(group)]
    seen: dict[str, dict] = {}
    progress(0, len(clients))
    for n, c in enumerate(clients, 1):
        try:
            images = await c.list_images()
        except BackendAIError:
            images = []
        for i in images:
            repo, _, tag = i["name"].rpartition(":")
            if not repo or "/" in tag:
                repo, tag = i["name"], "latest"
            seen.setdefault(i["name"], {"name": i["name"], "repo": repo, "tag": tag,
                                        "labels": dict(i.get("labels") or {})})
        progress(n, len(clients))
    return sorted(seen.values(), key=lambda f: f["name"])


# -- the registries, as the API and the console change them ----------------------------


class Registries:
    """``manager.registries``: the registries' one owner. Reads come from the record (in
    cluster mode etcd's mirror); writes go to etcd in cluster mode, then to the record.
    Each answer carries the registry's rescan progress on this hub."""

    def __init__(self, manager) -> None:
        self.manager = manager
        self._scans: dict[str, dict] = {}  # registry -> its last or running rescan
        self._tasks: dict[str, asyncio.Task] = {}  # registry -> its running rescan
        self.local_known = False  # the catalogue holds local images (catalogue_local_first)
        self._local_found_none = -1e9  # when a first catalogue found none (monotonic)

    @property
    def _etcd(self):
        """The cluster's etcd (manager/discovery.py), or None embedded."""
        cluster = self.manager.cluster
        return cluster if cluster.etcd_url else None

    def _with_progress(self, body: dict) -> dict:
        scan = self._scans.get(body["name"])
        return {**body, "rescan": responses.RescanProgress.body(scan) if scan else None}

    async def list(self, p: Principal) -> list[dict]:
        return [self._with_progress(r) for r in await self.manager.ops.list_registries(p)]

    async def get(self, p: Principal, name: str) -> dict:
        return self._with_progress(await self.manager.ops.get_registry(p, name))

    async def create(self, p: Principal, body: dict) -> dict:
        access.require(p.is_superadmin, "add container registries")
        name, conf = new_registry(body)
        etcd = self._etcd
        if etcd is not None:
            if not await etcd.put_registry(name, conf, create=True):
                raise Conflict(f"container registry {name!r} exists")
            await self.manager.ops.store_registry(name, conf, "mirror")
        else:
            await self.manager.ops.store_registry(name, conf, "create")
        return await self.get(p, name)

    async def update(self, p: Principal, name: str, body: dict) -> dict:
        access.require(p.is_superadmin, "change container registries")
        _check_registry(body)
        etcd = self._etcd
        if etcd is not None:
            # (the whole checked again: a value put by hand may lack or add fields)
            conf = await etcd.update_registry(
                name, lambda old: new_registry({**_merged(old, body), "name": name})[1])
            if conf is None:
                raise NotFound(f"no container registry {name!r}")
            await self.manager.ops.store_registry(name, conf, "mirror")
        else:
            await self.manager.ops.store_registry(name, body, "update")
        return await self.get(p, name)

    async def delete(self, p: Principal, name: str) -> None:
        """The registry and its images (their aliases with them)."""
        access.require(p.is_superadmin, "delete container registries")
        etcd = self._etcd
        gone = await etcd.delete_registry(name) if etcd is not None else False
        if not await self.manager.ops.drop_registry(name) and not gone:
            raise NotFound(f"no container registry {name!r}")
        self._scans.pop(name, None)

    # -- rescans ------------------------------------------------------------------------

    def progress(self, name: str) -> dict | None:
        scan = self._scans.get(name)
        return dict(scan) if scan else None

    async def rescan(self, p: Principal, name: str) -> dict:
        """Rescan registry ``name`` (``local``: the agents' engines) into the catalogue;
        what it found. A rescan of ``name`` running already is waited for, not repeated."""
        access.require(p.is_superadmin, "rescan container registries")
        # A caller that goes (a closed connection) leaves the rescan running for others.
        return await asyncio.shield(self._task(name))

    def _task(self, name: str) -> asyncio.Task:
        """The running rescan of ``name``, started when none runs (no await before it is
        known: a request at once joins it)."""
        task = self._tasks.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._run(name))
            self._tasks[name] = task
            task.add_done_callback(self._done)
        return task

    async def catalogue_local_first(self, joined: bool = False) -> None:
        """The catalogue's first local images: while it holds none, what the agents'
        engines hold is catalogued (a rescan of ``local``, shared with one running), and
        ``BackendAIManager.first_default_image`` becomes the default if nothing is. A
        fresh install's kernel image starts without an admin's rescan; an image built on
        a node later waits for one (docs/images.md). Once local images are catalogued
        this is a no-op, also when an admin hides or a rescan removes them later. While
        the agents hold none, a request tries again 10 s after the last try at the
        earliest; an agent that ``joined`` at once."""
        if self.local_known:
            return
        ops = self.manager.ops
        if not await ops.has_local_images():
            running = self._tasks.get(LOCAL)
            if running is None and not joined and \
                    time.monotonic() < self._local_found_none + 10:
                return  # (a registry-only installation: not at every spawn form)
            try:
                await asyncio.shield(running or self._task(LOCAL))
            except Exception as e:  # (no agent answered: the next request tries again)
                self.manager.log.warning("the first catalogue of the agents' images "
                                         "failed: %s", e)
                return
            if not await ops.has_local_images():
                self._local_found_none = time.monotonic()
                return  # no agent holds a labelled image yet
            default = self.manager.first_default_image
            if default and await ops.settle_default(default):
                self.manager.log.info("image %s is the default (the first in the catalogue "
                                      "of the agents' images)", default)
        self.local_known = True

    def _done(self, task: asyncio.Task) -> None:
        for name, t in list(self._tasks.items()):
            if t is task:
                del self._tasks[name]
        if not task.cancelled():
            task.exception()  # retrieved: the waiters, if any are left, raise it

    async def _run(self, name: str) -> dict:
        reg = None if name == LOCAL else await self.manager.ops.registry_secrets(name)
        scan = {"state": "running", "done": 0, "total": 0, "words": "listing images",
                "started_at": utcnow(), "finished_at": None, "error": None}
        self._scans[name] = scan
        what = "agents asked" if reg is None else "images read"

        def progress(done: int, total: int) -> None:
            scan["done"], scan["total"] = done, total
            scan["words"] = f"{done} of {total} {what}"

        try:
            found = await (scan_local(self.manager, progress) if reg is None
                           else scan_registry(reg, progress=progress))
            result = await self.manager.ops.record_scan(name, found)
        except BaseException as e:
            scan["state"], scan["finished_at"] = "failed", utcnow()
            scan["error"] = e.detail if isinstance(e, BackendAIError) else \
                f"{type(e).__name__}: {e}"
            scan["words"] = f"failed: {scan['error']}"
            raise
        scan["state"], scan["finished_at"] = "done", utcnow()
        scan["words"] = (f"{result['found']} images ({result['added']} new, "
                         f"{result['updated']} changed, {result['removed']} gone)")
        return result
