"""The admin API's base handler: who is calling, what they sent, and how errors look.

Served by the hub process (``BackendAIAuthenticator.get_handlers``), so it
inherits JupyterHub's token and cookie authentication, its XSRF rules for
cookies and its scopes. On top of that it accepts Backend.AI keypair
signatures (``Authorization: BackendAI ...``, checked by :mod:`.keypair_auth`).

Everything it refuses is refused here, before a handler runs: missing
credentials (401), tokens without the ``custom:backendai:read``/``write``
scope (403), inactive accounts or domains (403), unknown query parameters,
malformed JSON, wrong types and unknown fields (400, naming the field). Every
error leaves as ``application/problem+json``.
"""

from __future__ import annotations

import json
import re
import sys
from http.client import responses

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from jsonschema.validators import extend
from jupyterhub import orm, roles
from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from ..common.errors import BackendAIError, Forbidden, InvalidRequest, NotFound, Unauthorized
from ..manager import access
from ..manager.core import BackendAIManager
from . import spec

READ_SCOPE = "custom:backendai:read"
WRITE_SCOPE = "custom:backendai:write"
PROBLEM = "application/problem+json"
# Query parameters JupyterHub itself reads (XSRF token for cookie clients).
HUB_PARAMS = {"_xsrf"}
_UINT = re.compile(r"^[0-9]{1,10}$")

# JSON Schema's "integer" accepts 5.0; ours does not (columns are integers).
_Validator = extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _c, v: isinstance(v, int) and not isinstance(v, bool)
    ),
)
_DOC: dict | None = None


def document() -> dict:
    """The OpenAPI document as committed (loaded once per process)."""
    global _DOC
    if _DOC is None:
        _DOC = spec.load_document()
    return _DOC


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _check_text(value, path: str = "") -> None:
    """Strings a database cannot store (NUL, lone surrogates) are bad input, not a crash."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidRequest(f"{path or 'body'}: NUL characters are not allowed")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(f"{path or 'body'}: invalid unicode (lone surrogate)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, path)
            _check_text(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_text(v, f"{path}[{i}]")


class APIBase(APIHandler):
    """Authenticates the caller into ``self.principal`` before any method runs."""

    #: False for the few public endpoints (the OpenAPI document).
    auth_required = True
    principal: access.Principal

    @property
    def manager(self) -> BackendAIManager:
        auth = self.authenticator
        if hasattr(auth, "manager"):
            return auth.manager
        return BackendAIManager.instance(config=self.config)

    def get_content_type(self):
        return "application/json"

    @property
    def signed(self) -> bool:
        return self.request.headers.get("Authorization", "").startswith("BackendAI ")

    def check_xsrf_cookie(self):
        if self.signed:
            # A signature is not ambient authority: no cross-site forgery possible.
            return None
        return super().check_xsrf_cookie()

    async def prepare(self):
        await super().prepare()
        for value in list(self.path_args) + list(self.path_kwargs.values()):
            if "\x00" in value or len(value) > 64:
                raise NotFound(f"no such object {value[:64]!r}")
        if not self.auth_required:
            return
        await self.manager.ready()
        method = self.request.method.upper()
        if self.signed:
            from . import keypair_auth

            who = await keypair_auth.authenticate(self.manager, self)
            # keypair_auth refused inactive users and domains (from its short-lived cache,
            # emptied by any change made through this hub): no second load of the user.
            self.principal = access.Principal(
                user_id=who.user_id, username=who.username, email=who.email, role=who.role,
                domain=who.domain_name, project_ids=who.project_ids, access_key=who.access_key,
            )
            return
        user = self.current_user
        if user is None:
            raise Unauthorized(
                "no credentials: send 'Authorization: token <JupyterHub API token>', "
                "a Backend.AI keypair signature, or log in"
            )
        needed = READ_SCOPE if method in ("GET", "HEAD", "OPTIONS") else WRITE_SCOPE
        if needed not in self.expanded_scopes:
            raise Forbidden(f"these credentials lack the scope {needed!r}")
        self.principal = await self.manager.db_read(access.load_principal, username=user.name)

    # -- errors ------------------------------------------------------------------

    def _handle_request_exception(self, e):
        # Our errors carry their own status and a message meant for the caller (an agent's
        # failure included); let tornado report them as such.
        if isinstance(e, BackendAIError) and not self._finished:
            if self._headers_written:
                return super()._handle_request_exception(e)
            if e.status_code >= 500:
                self.log.error("%s %s failed: %s", self.request.method, self.request.path, e.detail)
            self.send_error(e.status_code, exc_info=sys.exc_info())
            return
        return super()._handle_request_exception(e)

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        title = responses.get(status_code, "Error")
        detail = title
        if isinstance(exc, BackendAIError):
            title, detail = exc.title, exc.detail
        elif isinstance(exc, web.HTTPError):
            detail = exc.log_message or exc.reason or title
            if exc.args and exc.log_message and exc.args[1:]:
                try:
                    detail = exc.log_message % exc.args[1:]
                except TypeError:
                    pass
        elif status_code >= 500:
            detail = "internal error; the hub's log has the details"
        for source in (getattr(exc, "headers", None), getattr(self, "sticky_headers", None)):
            for k, v in (source or {}).items():
                self.set_header(k, v)
        self.set_header("Content-Type", PROBLEM)
        self.clear_header("Content-Length")
        self.finish(json.dumps({"type": "about:blank", "title": title,
                                "status": status_code, "detail": str(detail)}))

    # -- input -------------------------------------------------------------------

    def body(self, schema_name: str) -> dict:
        """The JSON body, checked against the document's schema ``schema_name``."""
        raw = self.request.body
        if not raw or not raw.strip():
            raise InvalidRequest("a JSON object body is required")
        try:
            data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError) as e:
            raise InvalidRequest(f"malformed JSON body: {e}") from None
        if not isinstance(data, dict):
            raise InvalidRequest("the body must be a JSON object")
        _check_text(data)
        schema = document()["components"]["schemas"][schema_name]
        props = schema.get("properties", {})
        unknown = sorted(set(data) - set(props))
        if unknown and schema.get("additionalProperties") is False:
            raise InvalidRequest(
                f"unknown field(s): {', '.join(map(repr, unknown))} "
                f"(allowed: {', '.join(props)})"
            )
        for name in schema.get("required", []):
            if name not in data:
                raise InvalidRequest(f"{name}: required field missing")
        err = best_match(_Validator(schema).iter_errors(data))
        if err is not None:
            where = ".".join(str(x) for x in err.absolute_path) or "body"
            raise InvalidRequest(f"{where}: {err.message}")
        return data

    def query(self, filters: dict | None = None,
              params: dict[str, tuple[dict, bool]] | None = None) -> tuple[dict, int, int]:
        """(filters, offset, limit) from the query string; unknown or bad parameters are 400.

        ``filters`` make a paginated list's parameters; ``params`` (name -> (schema,
        required)) those of an operation that is not a list.
        """
        allowed = dict(filters or {})
        allowed.update({k: v for k, (v, _req) in (params or {}).items()})
        paged = filters is not None
        out: dict = {}
        offset, limit = 0, spec.DEFAULT_LIMIT
        for name, values in self.request.query_arguments.items():
            if name in HUB_PARAMS:
                continue
            if name not in allowed and not (paged and name in ("offset", "limit")):
                known = (["offset", "limit"] if paged else []) + list(allowed)
                raise InvalidRequest(
                    f"unknown query parameter {name!r}"
                    + (f" (known: {', '.join(known)})" if known else " (this endpoint takes none)")
                )
            if len(values) != 1:
                raise InvalidRequest(f"query parameter {name!r} given more than once")
            try:
                value = values[0].decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequest(f"query parameter {name!r} is not UTF-8") from None
            _check_text(value, name)
            if name in ("offset", "limit"):
                if not _UINT.match(value):
                    raise InvalidRequest(f"{name} must be a non-negative integer, not {value!r}")
                n = int(value)
                if name == "offset":
                    if n > spec.INT32:
                        raise InvalidRequest(f"offset must be at most {spec.INT32}")
                    offset = n
                else:
                    if not 1 <= n <= spec.MAX_LIMIT:
                        raise InvalidRequest(f"limit must be between 1 and {spec.MAX_LIMIT}")
                    limit = n
                continue
            schema = allowed[name]
            if schema.get("type") == "boolean":
                if value not in ("true", "false"):
                    raise InvalidRequest(f"{name} must be true or false, not {value!r}")
                out[name] = value == "true"
            elif "enum" in schema:
                if value not in schema["enum"]:
                    raise InvalidRequest(
                        f"{name} must be one of {', '.join(schema['enum'])}, not {value!r}")
                out[name] = value
            else:
                if len(value) > schema.get("maxLength", 128):
                    raise InvalidRequest(f"{name} is too long")
                if len(value) < schema.get("minLength", 0):
                    raise InvalidRequest(f"{name} must not be empty")
                out[name] = value
        for name, (_schema, required) in (params or {}).items():
            if required and name not in out:
                raise InvalidRequest(f"query parameter {name!r} is required")
        return out, offset, limit

    # -- output ------------------------------------------------------------------

    def reply(self, data, status: int = 200) -> None:
        self.set_status(status)
        if status == 204:
            self.finish()
            return
        self.finish(json.dumps(data))

    # -- mirroring into JupyterHub ----------------------------------------------------

    def hub_groups(self, *, add: dict[str, list[str]] | None = None,
                   remove: dict[str, list[str]] | None = None,
                   rename: tuple[str, str] | None = None, delete: str | None = None) -> None:
        """Keep JupyterHub groups in step with projects (members must be hub users already;
        the others join at their next login through ``manage_groups``)."""
        try:
            if rename and rename[0] != rename[1]:
                g = orm.Group.find(self.db, rename[0])
                if g is not None and orm.Group.find(self.db, rename[1]) is None:
                    g.name = rename[1]
            if delete:
                g = orm.Group.find(self.db, delete)
                if g is not None:
                    self.db.delete(g)
            for group, names in (add or {}).items():
                g = orm.Group.find(self.db, group)
                if g is None:
                    g = orm.Group(name=group)
                    self.db.add(g)
                for name in names:
                    u = orm.User.find(self.db, name)
                    if u is not None and g not in u.groups:
                        u.groups.append(g)
            for group, names in (remove or {}).items():
                g = orm.Group.find(self.db, group)
                for name in names:
                    u = orm.User.find(self.db, name)
                    if g is not None and u is not None and g in u.groups:
                        u.groups.remove(g)
            self.db.commit()
        except Exception:
            self.db.rollback()
            self.log.exception("could not mirror a project change into JupyterHub groups")

    def hub_admin(self, username: str, is_admin: bool) -> None:
        """Superadmins are JupyterHub admins; follow role changes made through the API."""
        try:
            u = orm.User.find(self.db, username)
            if u is not None and bool(u.admin) != is_admin:
                u.admin = is_admin
                roles.assign_default_roles(self.db, entity=u)
                self.db.commit()
        except Exception:
            self.db.rollback()
            self.log.exception("could not mirror a role change into JupyterHub")


class NotFoundHandler(APIBase):
    """Anything under the prefix that is not an endpoint: a problem+json 404."""

    auth_required = False

    async def prepare(self):
        await super().prepare()
        raise NotFound(f"no endpoint {self.request.path!r}; see {spec.PREFIX}/openapi.json")
