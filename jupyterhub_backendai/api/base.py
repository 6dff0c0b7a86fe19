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
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator
from jsonschema.validators import extend
from jupyterhub import orm, roles
from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from ..common.errors import (
    BackendAIError,
    Forbidden,
    InvalidRequest,
    NotFound,
    Unauthorized,
    outage,
)
from ..manager import access
from ..manager.core import BackendAIManager
from . import models, spec

READ_SCOPE = "custom:backendai:read"
WRITE_SCOPE = "custom:backendai:write"
PROBLEM = "application/problem+json"
# Query parameters JupyterHub itself reads (XSRF token for cookie clients).
HUB_PARAMS = {"_xsrf"}
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# Bounds of a JSON body: bytes, and nesting of arrays and objects.
MAX_JSON_BYTES = 1 << 20
MAX_JSON_DEPTH = 32
_UINT = re.compile(r"^[0-9]{1,10}$")

# For callers that check a JSON Schema of the document itself (request bodies are checked
# by the models, :func:`validate`): JSON Schema's "integer" accepts 5.0; ours does not.
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


def _depth(value) -> int:
    """Nesting depth of arrays and objects (iterative: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d)
        if d > MAX_JSON_DEPTH:
            return d
        stack.extend((x, d + 1) for x in v)
    return deepest


def parse_json_body(raw: bytes) -> object:
    """A request body as JSON, within :data:`MAX_JSON_BYTES` and :data:`MAX_JSON_DEPTH`;
    anything else is an :class:`InvalidRequest` (400) in plain words."""
    if len(raw) > MAX_JSON_BYTES:
        raise InvalidRequest(
            f"the body is {len(raw)} bytes; a JSON body may have at most {MAX_JSON_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        data = None
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidRequest(f"malformed JSON body: {e}") from None
    else:
        if _depth(data) <= MAX_JSON_DEPTH:
            return data
    raise InvalidRequest(
        f"the JSON body is nested too deeply: at most {MAX_JSON_DEPTH} levels of "
        "arrays and objects are accepted")


# Plain words for the formats of the API's schemas (patterns carry their own x-message).
_FORMAT_WORDS = {
    "date-time": "must be a date and time such as 2026-01-31T12:00:00Z",
    "date": "must be a date such as 2026-01-31",
    "email": "must be an email address",
    "uri": "must be a URL",
}


def schema_error_words(err) -> str:
    """A jsonschema error as a sentence for the caller: a pattern or format is described
    (from the schema's ``x-message``, the table of formats, or its ``description``), never quoted."""
    schema = err.schema if isinstance(err.schema, dict) else {}
    if err.validator in ("pattern", "format"):
        words = schema.get("x-message")
        if not words and err.validator == "format":
            words = _FORMAT_WORDS.get(str(err.validator_value))
        if not words and schema.get("description"):
            words = f"must be {schema['description']}"
        return words or "is not in the accepted form"
    if err.validator == "type":
        wanted = err.validator_value
        names = {"string": "a string", "integer": "a whole number", "number": "a number",
                 "boolean": "true or false", "object": "an object", "array": "a list",
                 "null": "null"}
        if isinstance(wanted, list):
            return "must be " + " or ".join(names.get(w, w) for w in wanted)
        return "must be " + names.get(wanted, str(wanted))
    if err.validator == "maxLength":
        return f"must be at most {err.validator_value} characters long"
    if err.validator == "minLength":
        return ("must not be empty" if err.validator_value == 1
                else f"must be at least {err.validator_value} characters long")
    return err.message


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


def validate(schema_name: str, data: dict) -> dict:
    """``data`` (a JSON object) checked by the request model ``schema_name`` of
    :mod:`.models`, the same check as ``APIBase.body``: strings a database cannot store,
    unknown fields, missing required ones, then types and bounds. Returns ``data`` as
    given; raises :class:`InvalidRequest` with ``<field>: <plain words>``."""
    _check_text(data)
    return models.check(schema_name, data)


class APIBase(APIHandler):
    """Authenticates the caller into ``self.principal`` before any method runs."""

    #: False for the few public endpoints (the OpenAPI document).
    auth_required = True
    #: True where even a GET lets the caller run code in a session (its SSH key, the
    #: execute websocket): a JupyterHub token then needs the write scope, not read.
    grants_shell = False
    principal: access.Principal

    @property
    def manager(self) -> BackendAIManager:
        return BackendAIManager.of(self)

    def get_content_type(self):
        return "application/json"

    @property
    def signed(self) -> bool:
        return self.request.headers.get("Authorization", "").startswith("BackendAI ")

    def check_hub_page_origin(self) -> None:
        """A change authenticated by the login cookie must come from the hub's own pages.

        Servers may share the hub's origin (no ``subdomain_host``): a page a user serves
        from their server is then same-origin with the hub, can read the ``_xsrf``
        cookie and send it. So beyond JupyterHub's XSRF check: a browser that sends
        Fetch metadata must say ``Sec-Fetch-Site: same-origin``, and its ``Referer``
        must be a page under ``<base_url>hub/`` (not ``/user/...``) on this host. A
        browser cannot forge either header. Clients that send neither (scripts with a
        session cookie, old browsers) are left to the XSRF check.
        """
        headers = self.request.headers
        site = headers.get("Sec-Fetch-Site")
        referer = headers.get("Referer")
        if site is not None and site != "same-origin":
            raise Forbidden(
                f"a change made with the login cookie must come from the hub's own pages; "
                f"this request came from a {site} page")
        if site is None and referer is None:
            return
        hub_pages = self.hub.base_url
        if referer is None:
            raise Forbidden(
                "a change made with the login cookie must come from the hub's own pages "
                f"(under {hub_pages}); this request names no page (no Referer)")
        ref = urlsplit(referer)
        if ref.netloc != self.request.host or not (ref.path or "/").startswith(hub_pages):
            raise Forbidden(
                "a change made with the login cookie must come from the hub's own pages "
                f"(under {hub_pages}); this request came from {ref.path or '/'!r}"
                + ("" if ref.netloc == self.request.host else f" on {ref.netloc!r}")
                + ". Use an API token or a keypair for other clients")

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
        if user is None and getattr(self, "_backendai_outage", None) is not None:
            # The credentials could not be checked (the database is away): not a 401,
            # which would make clients drop credentials that are still good.
            raise self._backendai_outage
        if user is None:
            raise Unauthorized(
                "no credentials: send 'Authorization: token <JupyterHub API token>', "
                "a Backend.AI keypair signature, or log in"
            )
        if method not in SAFE_METHODS and not getattr(self, "_token_authenticated", False):
            self.check_hub_page_origin()
        from . import keypair_auth

        # allowed_client_ip, and the rate limit of the user's main keypair.
        await keypair_auth.authenticate_hub_user(self.manager, self, user.name)
        needed = READ_SCOPE if method in SAFE_METHODS and not self.grants_shell else WRITE_SCOPE
        if needed not in self.expanded_scopes:
            raise Forbidden(f"these credentials lack the scope {needed!r}")
        self.principal = await self.manager.ops.load_principal(username=user.name)

    # -- errors ------------------------------------------------------------------

    def _handle_request_exception(self, e):
        # Our errors carry their own status and a message meant for the caller (an agent's
        # failure included); let tornado report them as such. The database not answering
        # is a 503 with Retry-After, never a 500.
        down = outage(e)
        if down is not None and not self._finished and not self._headers_written:
            self.log.warning("%s %s: %s (%s)", self.request.method, self.request.path,
                             down.detail, e)
            self.send_error(503, exc_info=(type(down), down, None))
            return
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
        self.finish(json.dumps(self.problem(status_code, title, str(detail))))

    def problem(self, status_code: int, title: str, detail: str) -> dict:
        """The error's body (RFC 9457 problem details): the admin API's shape."""
        return {"type": "about:blank", "title": title, "status": status_code, "detail": detail}

    # -- input -------------------------------------------------------------------

    def body(self, schema_name: str) -> dict:
        """The JSON body, checked by the request model ``schema_name`` (:mod:`.models`):
        the fields as sent, or a 400 naming the field in plain words."""
        return validate(schema_name, self._json_object())

    def parsed_body(self, schema_name: str):
        """The JSON body parsed into the request model ``schema_name`` (the same checks
        as :meth:`body`): the instance, for a handler that hands it on as it is."""
        data = self._json_object()
        _check_text(data)
        return models.parse(schema_name, data)

    def _json_object(self) -> dict:
        raw = self.request.body
        if not raw or not raw.strip():
            raise InvalidRequest("a JSON object body is required")
        data = parse_json_body(raw)
        if not isinstance(data, dict):
            raise InvalidRequest("the body must be a JSON object")
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
