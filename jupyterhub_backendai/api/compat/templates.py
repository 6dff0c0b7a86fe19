"""Backend.AI's session templates and dotfiles (issue 27): ``session-template``
(``/template/session``), ``create-from-template`` (``/session/_/create-from-template``)
and ``dotfile`` (``/user-config/dotfiles``, ``/group-config/dotfiles``,
``/domain-config/dotfiles``), as thin handlers over :mod:`...manager.templates`, where
the rules are (who sees and changes what, the checks, how a template fills a create)."""

from __future__ import annotations

import yaml

from ...common.errors import InvalidRequest
from ...manager.templates import apply_template
from .base import CompatBase
from .sessions import SessionCreateHandler


def _text(value, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{name}: wrong type")
    return value or None


class TemplatesHandler(CompatBase):
    """``POST /template/session`` (create: ``[{id, user}]``), ``GET`` (list; ``all``)."""

    async def post(self):
        body = self.json_body()
        self.reply(await self.manager.ops.template_create(
            self.principal, body.get("payload"),
            group=_text(body.get("group_name") or body.get("group"), "group_name"),
            domain=_text(body.get("domain_name") or body.get("domain"), "domain_name"),
            access_key=_text(body.get("owner_access_key"), "owner_access_key")))

    async def get(self):
        body = self.json_body()
        list_all = body.get("all", self.get_query_argument("all", "") in ("1", "true"))
        if not isinstance(list_all, bool):
            raise InvalidRequest("all: wrong type")
        self.reply(await self.manager.ops.template_list(self.principal, list_all))


class TemplateHandler(CompatBase):
    """``GET /template/session/{id}?format=yaml|json``, ``PUT`` (payload), ``DELETE``."""

    async def get(self, tid):
        fmt = self.get_query_argument("format", "yaml")
        if fmt not in ("yaml", "json"):
            raise InvalidRequest(f"format: {fmt!r} is yaml or json")
        tpl = await self.manager.ops.template_get(self.principal, tid)
        if fmt == "json":
            self.reply(tpl)
            return
        self.set_header("Content-Type", "text/yaml; charset=utf-8")
        self.finish(yaml.safe_dump(tpl, sort_keys=False))

    async def put(self, tid):
        body = self.json_body()
        self.reply(await self.manager.ops.template_update(self.principal, tid,
                                                          body.get("payload")))

    async def delete(self, tid):
        self.reply(await self.manager.ops.template_delete(self.principal, tid))


class CreateFromTemplateHandler(SessionCreateHandler):
    """``POST /session/_/create-from-template``: the create body filled from a template
    the caller can see (what the body names wins), then created as any create is."""

    async def post(self):
        body = self.json_body()
        tid = body.get("template_id")
        if not isinstance(tid, str) or not tid:
            raise InvalidRequest("template_id: the template's id is required")
        tpl = await self.manager.ops.template_get(self.principal, tid)
        await self.create(apply_template(tpl, body))


class DotfilesHandler(CompatBase):
    """``/user-config/dotfiles``, ``/group-config/dotfiles``, ``/domain-config/dotfiles``:
    POST creates, GET lists (or gets one: ``?path=``), PATCH updates, DELETE deletes
    (``?path=``). Its owner: the caller (or ``owner_access_key``'s user, for admins), the
    project ``group`` (id, or name in ``domain``), or the ``domain``."""

    def initialize(self, scope: str):
        self.scope = scope

    def _ref(self, src: dict) -> dict:
        if self.scope == "user":
            # (the 23.09 client's list sends "onwer_access_key", its own typo)
            key = src.get("owner_access_key") or src.get("onwer_access_key")
            return {"access_key": _text(key, "owner_access_key")}
        ref = {"domain": _text(src.get("domain"), "domain")}
        if self.scope == "group":
            ref["group"] = _text(src.get("group"), "group")
        return ref

    def _query(self) -> dict:
        return {k: self.get_query_argument(k) for k in self.request.query_arguments}

    async def _write(self, op):
        body = self.json_body()
        self.reply(await op(self.principal, self.scope, body.get("path"),
                            body.get("permission", "755"), body.get("data"), **self._ref(body)))

    async def post(self):
        await self._write(self.manager.ops.dotfile_create)

    async def get(self):
        q = {**self._query(), **self.json_body()}
        ops = self.manager.ops
        if q.get("path"):
            self.reply(await ops.dotfile_get(self.principal, self.scope, q["path"],
                                             **self._ref(q)))
        else:
            self.reply(await ops.dotfile_list(self.principal, self.scope, **self._ref(q)))

    async def patch(self):
        await self._write(self.manager.ops.dotfile_update)

    async def delete(self):
        q = {**self._query(), **self.json_body()}
        self.reply(await self.manager.ops.dotfile_delete(
            self.principal, self.scope, q.get("path"), **self._ref(q)))


__all__ = ["CreateFromTemplateHandler", "DotfilesHandler", "TemplateHandler",
           "TemplatesHandler"]
