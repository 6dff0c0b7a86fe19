"""``backend.ai admin etcd get / set / delete`` for container registries (issue 25).

Backend.AI's clients configure registries by writing the manager's etcd:
``config/docker/registry/<host>`` holds the registry's address, and
``config/docker/registry/<host>/<field>`` its ``username``, ``password``, ``project`` and
``type`` (``<host>`` URL-quoted, ``127.0.0.1%3A5000``). ``POST /config/get|set|delete``
here takes exactly those keys and turns them into operations of the hub's registries
(``manager.registries``: the record, or etcd in cluster mode, in this hub's own layout),
so that the commands an operator knows work:

    backend.ai admin etcd set config/docker/registry/cr.example.org https://cr.example.org
    backend.ai admin etcd set config/docker/registry/cr.example.org/username puller
    backend.ai admin etcd set config/docker/registry/cr.example.org \\
        '{"": "https://cr.example.org", "username": "puller", "password": "...", "project": "lab"}'
    backend.ai admin etcd get config/docker/registry --prefix
    backend.ai admin etcd delete config/docker/registry/cr.example.org --prefix

The registry's name is its host (``cr.example.org``, ``127.0.0.1:5000``). Superadmins
only. A password is written, never read back (``get`` answers null for it). Every
other key is refused in words: the rest of the cluster's configuration is the hub's
own (docs/cluster.md).
"""

from __future__ import annotations

import urllib.parse

from ...common.errors import Forbidden, InvalidRequest, NotFound
from .base import CompatBase

ROOT = "config/docker/registry"
FIELDS = {"username": "username", "password": "password", "project": "project"}
TYPES = ("docker", "harbor", "harbor2")  # each speaks the registry HTTP API v2
REFUSED = ("only the container registries' keys are served here (config/docker/registry/"
           "<host>[/username|password|project|type]): the rest of the cluster's "
           "configuration is the hub's own (jupyterhub_config.py; etcd in cluster mode, "
           "docs/cluster.md)")


def parse_key(key) -> tuple[str | None, str | None]:
    """``(host, field)`` of a registry key (host None: the whole set; field None: the
    address); InvalidRequest for any other key."""
    if not isinstance(key, str):
        raise InvalidRequest("key: a string")
    parts = key.strip("/").split("/")
    if parts[:3] != ROOT.split("/"):
        raise InvalidRequest(REFUSED)
    rest = parts[3:]
    if not rest or rest == [""]:
        return None, None
    host = urllib.parse.unquote(rest[0])
    if len(rest) == 1:
        return host, None
    if len(rest) == 2 and (rest[1] in FIELDS or rest[1] == "type"):
        return host, rest[1]
    raise InvalidRequest(f"{key!r}: a registry has the keys username, password, project, type")


def _fields(value: dict) -> dict:
    """Backend.AI's registry object (``{"": url, "username", ...}``) as this hub's fields."""
    body = {}
    for k, v in value.items():
        if not isinstance(v, str):
            raise InvalidRequest(f"{k or 'the address'}: a string")
        if k == "":
            body["url"] = v
        elif k in FIELDS:
            body[FIELDS[k]] = v
        elif k == "type":
            _check_type(v)
        else:
            raise InvalidRequest(f"{k!r}: a registry has the keys username, password, "
                                 "project, type")
    return body


def _check_type(kind: str) -> None:
    if kind not in TYPES:
        raise InvalidRequest(f"type: {kind!r} is not one of {', '.join(TYPES)} (each is "
                             "read over the registry HTTP API v2)")


def _project(body: dict) -> dict:
    if "," in (body.get("project") or ""):
        raise InvalidRequest("project: one project per registry here (Backend.AI's list "
                             "of several is not taken: add the registry once per project)")
    return body


def _as_backendai(r: dict) -> dict:
    return {"": r["url"], "type": "docker", "username": r["username"],
            "password": None, "project": r["project"]}


class EtcdConfigHandler(CompatBase):
    """``POST /config/get``, ``/config/set``, ``/config/delete``."""

    def initialize(self, action: str):
        self.action = action

    async def post(self):
        p = self.principal
        if not p.is_superadmin:
            raise Forbidden("only superadmins read or change the cluster's configuration")
        body = self.json_body()
        host, field = parse_key(body.get("key"))
        regs = self.manager.registries
        if self.action == "get":
            self.reply({"result": await self._get(regs, host, field, bool(body.get("prefix")))})
            return
        if host is None:
            raise InvalidRequest(f"name the registry: {ROOT}/<host>")
        if self.action == "set":
            await self._set(regs, host, field, body.get("value"))
        else:
            await self._delete(regs, host, field)
        self.reply({"result": "ok"})

    async def _get(self, regs, host, field, prefix):
        p = self.principal
        if host is None:
            if not prefix:
                return None
            return {urllib.parse.quote(r["name"], safe=""): _as_backendai(r)
                    for r in await regs.list(p)}
        try:
            r = _as_backendai(await regs.get(p, host))
        except NotFound:
            return None
        if field is not None:
            return r[field]
        return r if prefix else r[""]

    async def _set(self, regs, host, field, value):
        p = self.principal
        if isinstance(value, dict):
            if field is not None:
                raise InvalidRequest("an object sets a whole registry: its key is "
                                     f"{ROOT}/<host>")
            body = _project(_fields(value))
        elif isinstance(value, str):
            if field == "type":
                _check_type(value)
                return
            body = _project({FIELDS[field] if field else "url": value})
        else:
            raise InvalidRequest("value: a string, or an object for a whole registry")
        try:
            await regs.update(p, host, body)
        except NotFound:
            if "url" not in body:
                raise NotFound(f"no container registry {host!r}: set its address first "
                               f"({ROOT}/{urllib.parse.quote(host, safe='')})") from None
            await regs.create(p, {**body, "name": host})

    async def _delete(self, regs, host, field):
        p = self.principal
        if field is None:
            await regs.delete(p, host)
        elif field != "type":
            await regs.update(p, host, {FIELDS[field]: ""})


__all__ = ["EtcdConfigHandler"]
