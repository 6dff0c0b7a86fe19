"""``backendai-admin``: the platform's admin command line.

Two kinds of commands:

- **Bootstrap** (``db-upgrade``, ``create-superadmin``, ``create-domain``,
  ``create-project``, ``create-user``, ``create-keypair``, ``reset-password``,
  ``fixture populate``): direct database operations for before any hub runs (a
  fresh install, an image build, a restore) or when nobody can log in any more.
  They use the hub's database, found as the hub finds it: ``--db``, else
  ``BACKENDAI_DB_URL``, else ``backendai.sqlite`` in ``BACKENDAI_STATE_DIR``
  (default ``./backendai-state``). Only ``db-upgrade`` creates or migrates a
  database; the others refuse, naming the place they looked, when there is no
  migrated database there.
- **API client** (``whoami``, ``domains``, ``projects``, ``users``, ``keypairs``,
  the resource policies, ``resource-groups``, ``agents``, ``sessions``,
  ``scheduler``, ``api``): HTTP requests to a running hub's admin API, signed
  with a keypair (Backend.AI's HMAC-SHA256 request signing). They go through
  the same permission checks as any other API client; this is not a second
  path into the database. Options or environment: ``--endpoint``
  (``BACKENDAI_ENDPOINT``, the hub's URL), ``--access-key``
  (``BACKENDAI_ACCESS_KEY``), ``--secret-key`` (``BACKENDAI_SECRET_KEY``).

Output on stdout is for people: a table for a list (its columns the ones that say
most, then how many of how many), field and value for one item, slots in human
units and times to the minute in UTC; ``--json`` (anywhere on the line) gives the
API's JSON as it came instead, for scripts. Errors go to stderr as
``backendai-admin: <status> <title>: <detail>`` (the API's problem document) with a
non-zero exit status.

Fields for create/update are given as ``key=value`` (a string) or
``key:=<json>`` (a number, boolean, list, object), or whole with ``--data``;
``<command> create --help`` lists them, from the API's own schema. Every
command takes names or ids alike: a project by id, name or ``DOMAIN/NAME``, a
user by id, email or username, a session or a vfolder by id or name; so do the
filters that take ids (``--user-id bob``, ``--filter user_id=bob``), and a name
that matches nothing is an error, not an empty list.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import urllib.parse
from typing import Any

from .adminclient import ApiClient, ApiError
from .clioutput import render
from .common.errors import BackendAIError

EXIT_API_ERROR = 1
EXIT_USAGE = 2


# -- bootstrap: direct database operations --------------------------------------------

DEFAULT_STATE_DIR = "backendai-state"


def state_dir(environ: Any = None) -> str:
    """The hub's state directory: ``BACKENDAI_STATE_DIR``, else ``./backendai-state``
    (absolute), as the packaged configuration and ``backendai-hub`` use it."""
    environ = os.environ if environ is None else environ
    return os.path.abspath(environ.get("BACKENDAI_STATE_DIR") or DEFAULT_STATE_DIR)


def hub_db_url(environ: Any = None) -> str:
    """The hub's database URL, by the packaged configuration's rule:
    ``BACKENDAI_DB_URL``, else ``sqlite:///<state dir>/backendai.sqlite``."""
    environ = os.environ if environ is None else environ
    return environ.get("BACKENDAI_DB_URL") or "sqlite:///" + os.path.join(
        state_dir(environ), "backendai.sqlite")


def find_db(given: str | None, environ: Any = None) -> tuple[str, str]:
    """(database URL, where it came from) for the bootstrap commands."""
    environ = os.environ if environ is None else environ
    if given:
        return given, "--db"
    if environ.get("BACKENDAI_DB_URL"):
        return environ["BACKENDAI_DB_URL"], "BACKENDAI_DB_URL"
    where = ("BACKENDAI_STATE_DIR" if environ.get("BACKENDAI_STATE_DIR")
             else f"the default state directory ./{DEFAULT_STATE_DIR}")
    return hub_db_url(environ), where


def create_superadmin(url: str, email: str, password: str | None, *, exist_ok: bool = True) -> dict:
    """Create the first superadmin; returns what to show the operator (password only if generated).

    Migrates (and so may create) the database: for ``backendai-hub``, which sets up
    the hub's own database; the ``create-superadmin`` command checks first.
    """
    from .manager.operations import Record

    generated = password is None
    password = password or secrets.token_urlsafe(12)
    with Record(url) as record:
        made = record.ops.bootstrap_superadmin(email, password)
    if made is None:
        if not exist_ok:
            raise SystemExit(f"user {email} exists")
        return {"email": email, "created": False}
    out = {"email": email, "username": made["username"], "created": True,
           "access_key": made["access_key"], "secret_key": made["secret_key"]}
    if generated:
        out["password"] = password
    return out


def reset_password(record, login: str, password: str | None) -> dict:
    """Give the user ``login`` (email or username) a new password; generated when None."""
    generated = password is None
    password = password or secrets.token_urlsafe(12)
    user = record.ops.bootstrap_reset_password(login, password)
    out = {"email": user["email"], "username": user["username"], "password_reset": True}
    if generated:
        out["password"] = password
    return out


def _bootstrap(args: argparse.Namespace) -> Any:
    """A bootstrap command on the database (manager/cliviews.py); no database there: a
    usage error naming where the command looked."""
    from .manager.cliviews import NoDatabase

    try:
        return _on_the_record(args)
    except NoDatabase as e:
        raise _UsageError(str(e)) from None


def _on_the_record(args: argparse.Namespace) -> Any:
    from .manager.cliviews import check_database, make_sqlite_dir, shown_url
    from .manager.operations import Record

    url, source = find_db(args.db)
    if args.cmd == "db-upgrade":
        make_sqlite_dir(url)
        Record(url).close()
        return {"upgraded": True, "database": shown_url(url), "from": source}
    check_database(url, source)
    if args.cmd == "create-superadmin":
        return create_superadmin(url, args.email, args.password)
    if args.cmd == "fixture":
        from .manager.fixtures import populate_file, storage_from

        volumes = {}
        for pair in args.storage_volume or ():
            name, eq, path = pair.partition("=")
            if not eq or not name or not path:
                raise _UsageError(f"--storage-volume {pair!r}: expected NAME=PATH")
            volumes[name] = os.path.abspath(path)
        storage, host = storage_from(volumes, args.config)
        return populate_file(url, args.file, storage, args.default_vfolder_host or host)
    with Record(url) as record:
        if args.cmd == "create-domain":
            return {"domain": record.ops.bootstrap_domain(args.name)}
        if args.cmd == "create-project":
            pj = record.ops.bootstrap_project(args.domain, args.name)
            return {"project": pj["name"], "id": pj["id"], "domain": pj["domain"]}
        if args.cmd == "create-user":
            return record.ops.bootstrap_user(
                email=args.email, password=args.password, username=args.username,
                role=args.role, domain=args.domain, status=args.status,
                projects=args.projects,
            )
        if args.cmd == "create-keypair":
            return record.ops.bootstrap_keypair(args.email)
        if args.cmd == "reset-password":
            return reset_password(record, args.user, args.password)
    raise AssertionError(args.cmd)


BOOTSTRAP = {"db-upgrade", "create-superadmin", "create-domain", "create-project",
             "create-user", "create-keypair", "reset-password", "fixture"}


# Entities of the API: command name -> (collection path, what identifies one item).
ENTITIES: dict[str, tuple[str, str]] = {
    "domains": ("/domains", "name"),
    "projects": ("/projects", "id"),
    "users": ("/users", "id"),
    "keypairs": ("/keypairs", "access key"),
    "keypair-resource-policies": ("/keypair-resource-policies", "name"),
    "user-resource-policies": ("/user-resource-policies", "name"),
    "project-resource-policies": ("/project-resource-policies", "name"),
    "resource-groups": ("/resource-groups", "name"),
    "resource-presets": ("/resource-presets", "name"),
    "agents": ("/agents", "id"),
    "sessions": ("/sessions", "id"),
    "vfolders": ("/vfolders", "id"),
}
# How a command names one item (a name is looked up with a list call: _resolve).
IDENTIFIED_BY = {
    "projects": "id, name, or DOMAIN/NAME where names repeat across domains",
    "users": "id, email or username",
    "sessions": "id or name",
    "vfolders": "id or name",
}
# What the API lets one do with each entity (agents are not created, only decommissioned
# or removed; sessions are created and deleted, not changed); tests/test_cli.py checks this table against the document.
ACTIONS: dict[str, tuple[str, ...]] = {
    name: ("list", "get", "create", "update", "delete") for name in ENTITIES
}
ACTIONS["agents"] = ("list", "get", "update", "delete")  # update: decommission
ACTIONS["sessions"] = ("list", "get", "create", "delete")
# Each list's filters (query parameters), offered as options; the OpenAPI document is
# the reference (tests/test_cli.py checks this table against it). Any other:
# --filter key=value.
FILTERS: dict[str, tuple[str, ...]] = {
    "domains": ("is_active",),
    "projects": ("domain", "name", "is_active"),
    "users": ("domain", "role", "status", "project", "email"),
    "keypairs": ("user_id", "is_active"),
    "keypair-resource-policies": (),
    "user-resource-policies": (),
    "project-resource-policies": (),
    "resource-groups": ("is_active",),
    "resource-presets": ("resource_group",),
    "agents": ("resource_group", "status"),
    "sessions": ("status", "user_id", "project_id", "type"),
    "vfolders": ("name", "host", "ownership_type", "project_id", "user_id", "status"),
}
# Folder commands beyond the entity's CRUD: action -> (help, positional arguments).
VFOLDER_ACTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "shares": ("users a folder is shared with", ("id",)),
    "share": ("share a user folder with a user of its domain", ("id", "email")),
    "unshare": ("unshare (or leave) a folder", ("id", "user")),
    "files": ("list a directory of a folder", ("id",)),
    "upload": ("upload a local file (streamed)", ("id", "local")),
    "download": ("download a file (streamed)", ("id", "remote")),
    "mkdir": ("make a directory", ("id", "remote")),
    "rename": ("move or rename a file or directory", ("id", "remote", "new_path")),
    "rm": ("delete a file or directory", ("id", "remote")),
}

def parse_fields(pairs: list[str], data: str | None) -> dict:
    """``key=value`` (string) and ``key:=json`` pairs, over an optional ``--data`` document."""
    body: dict = {}
    if data:
        text = data
        if data.startswith("@"):
            with open(data[1:]) as f:
                text = f.read()
        try:
            loaded = json.loads(text)
        except ValueError as e:
            raise ApiError(None, "bad --data", f"not JSON: {e}") from None
        if not isinstance(loaded, dict):
            raise ApiError(None, "bad --data", "must be a JSON object")
        body.update(loaded)
    for pair in pairs:
        if ":=" in pair and pair.index(":=") < pair.index("=") + 1:
            key, raw = pair.split(":=", 1)
            try:
                body[key] = json.loads(raw)
            except ValueError as e:
                raise ApiError(None, "bad field", f"{pair!r}: the value after ':=' must be JSON ({e})") from None
        elif "=" in pair:
            key, value = pair.split("=", 1)
            body[key] = value
        else:
            raise ApiError(None, "bad field", f"{pair!r}: expected key=value or key:=json")
        if not key:
            raise ApiError(None, "bad field", f"{pair!r}: empty field name")
    return body


def _quote(ident: str) -> str:
    return urllib.parse.quote(ident, safe="")


def _list_query(args: argparse.Namespace, client: ApiClient | None = None) -> dict:
    query: dict = {"offset": args.offset, "limit": args.limit}
    for name in FILTERS[args.cmd]:
        value = getattr(args, name, None)
        if value is not None:
            if client is not None and name in FILTER_ENTITY:
                value = _resolve(client, FILTER_ENTITY[name], value)
            query[name] = value
    for pair in args.filter or ():
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ApiError(None, "bad filter", f"{pair!r}: expected key=value")
        if client is not None and key in FILTER_ENTITY:
            # a name is looked up; one that names nothing is an error (_one), never a
            # filter that silently matches nothing
            value = _resolve(client, FILTER_ENTITY[key], value)
        query[key] = value
    return query


def _run_api(args: argparse.Namespace) -> Any:
    missing = [name for name, value in (("--endpoint / BACKENDAI_ENDPOINT", args.endpoint),
                                        ("--access-key / BACKENDAI_ACCESS_KEY", args.access_key),
                                        ("--secret-key / BACKENDAI_SECRET_KEY", args.secret_key))
               if not value]
    if missing:
        raise _UsageError("missing " + ", ".join(missing))
    client = ApiClient(args.endpoint, args.access_key, args.secret_key, timeout=args.timeout)
    cmd = args.cmd
    if cmd == "whoami":
        return client.request("GET", "/whoami")
    if cmd == "scheduler":
        return client.request("GET", "/scheduler")
    if cmd == "openapi":
        return client.request("GET", "/openapi.json")
    if cmd == "vfolder-hosts":
        return client.request("GET", "/vfolder-hosts")
    if cmd == "usage":
        return client.request("GET", "/usage", query={
            "start": args.start, "end": args.end, "group_by": args.group_by})
    if cmd == "api":
        body = parse_fields(args.fields, args.data) if (args.fields or args.data) else None
        query = dict(p.split("=", 1) for p in args.query or () if "=" in p)
        return client.request(args.method, args.path, query=query or None, body=body)
    path, _ident = ENTITIES[cmd]
    action = args.action
    if action == "list":
        query = _list_query(args, client)
        if args.all:
            query.pop("offset", None)
            query.pop("limit", None)
            return client.list_all(path, query)
        return client.request("GET", path, query=query)
    ident = _resolve(client, cmd, args.id) if hasattr(args, "id") else ""
    if action == "get":
        return client.request("GET", f"{path}/{ident}")
    if action == "create":
        return client.request("POST", path,
                              body=resolve_body(client, parse_fields(args.fields, args.data)))
    if action == "update":
        return client.request("PATCH", f"{path}/{ident}",
                              body=resolve_body(client, parse_fields(args.fields, args.data)))
    if action == "delete":
        client.request("DELETE", f"{path}/{ident}")
        return {"deleted": args.id}
    if action == "members":
        return client.request("GET", f"{path}/{ident}/members",
                              query={"offset": args.offset, "limit": args.limit})
    if action == "add-members":
        users = [_resolve(client, "users", u) for u in args.users]
        return client.request("POST", f"{path}/{ident}/members", body={"user_ids": users})
    if action == "remove-members":
        users = [_resolve(client, "users", u) for u in args.users]
        for uid in users:
            client.request("DELETE", f"{path}/{ident}/members/{uid}")
        return {"project_id": ident, "removed": users}
    if action == "logs":
        return client.request("GET", f"{path}/{ident}/logs")
    if cmd == "vfolders":
        return _vfolder_action(client, args, f"{path}/{ident}")
    raise AssertionError(action)


# A folder's actions that are one call: action -> (method, path under the folder,
# "query" or "body", {field: the argument that gives it}).
_FOLDER_CALLS = {
    "shares": ("GET", "shares", "query", {"offset": "offset", "limit": "limit"}),
    "share": ("POST", "shares", "body", {"email": "email", "permission": "permission"}),
    "mkdir": ("POST", "mkdir", "body", {"path": "remote", "parents": "parents"}),
    "rename": ("POST", "rename", "body", {"path": "remote", "new_path": "new_path"}),
}


def _vfolder_action(client: ApiClient, args: argparse.Namespace, base: str) -> Any:
    action = args.action
    if action in _FOLDER_CALLS:
        method, sub, where, fields = _FOLDER_CALLS[action]
        values = {k: getattr(args, a) for k, a in fields.items()}
        return client.request(method, f"{base}/{sub}", **{where: values})
    if action == "unshare":
        client.request("DELETE", f"{base}/shares/{_quote(args.user)}")
        return {"vfolder": args.id, "unshared": args.user}
    if action == "files":
        return client.request("GET", f"{base}/files", query={"path": args.path or None})
    if action == "upload":
        remote = args.path or os.path.basename(args.local)
        try:
            f = open(args.local, "rb")  # noqa: SIM115 - closed below, after the request
        except OSError as e:
            raise _UsageError(f"cannot read {args.local}: {e.strerror}") from None
        with f:
            return client.upload(f"{base}/upload", {"path": remote}, f)
    if action == "download":
        out = args.output or os.path.basename(args.remote.rstrip("/"))
        if out == "-":
            client.download(f"{base}/download", {"path": args.remote}, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            raise _Done()
        tmp = out + ".part"
        try:
            with open(tmp, "wb") as f:
                client.download(f"{base}/download", {"path": args.remote}, f)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return {"path": args.remote, "saved_to": out, "size": os.path.getsize(out)}
    if action == "rm":
        client.request("DELETE", f"{base}/files",
                       query={"path": args.remote, "recursive": args.recursive})
        return {"vfolder": args.id, "deleted": args.remote}
    raise AssertionError(action)


class _Done(Exception):
    """The command wrote its output itself (bytes to stdout)."""


ID_RE = re.compile(r"[0-9a-f]{32}")


def _one(entity: str, what: str, found: list, hint: str = "use the id") -> dict:
    if not found:
        raise ApiError(404, "Not found", f"no {entity} {what} visible to this keypair")
    if len(found) > 1:
        raise ApiError(400, "Ambiguous", f"{len(found)} {entity} {what} are visible to this "
                       f"keypair; {hint}")
    return found[0]


def _resolve(client: ApiClient, entity: str, ident: str) -> str:
    """The path segment for ``ident``: an id as it is, a name looked up with a list call
    (the API identifies projects, users, sessions and vfolders by id only)."""
    if entity in ("projects", "users", "sessions", "vfolders") and ID_RE.fullmatch(ident):
        return ident
    if entity == "projects":
        domain, slash, name = ident.rpartition("/")
        query = {"name": name, **({"domain": domain} if slash else {})}
        found = client.list_all("/projects", query)["items"]
        where = sorted({p["domain_name"] for p in found})
        return _one("projects", f"named {name!r}" + (f" in domain {domain!r}" if slash else ""),
                    found, "name one as DOMAIN/NAME (domains: " + ", ".join(
                        f"{d}/{name}" for d in where) + ") or give its id")["id"]
    if entity == "users":
        if "@" in ident:
            found = client.request("GET", "/users", query={"email": ident, "limit": 2})["items"]
            return _one("users", f"with email {ident!r}", found)["id"]
        found = [u for u in client.list_all("/users")["items"] if u["username"] == ident]
        return _one("users", f"with username {ident!r}", found)["id"]
    if entity == "sessions":
        found = [x for x in client.list_all("/sessions")["items"] if x["name"] == ident]
        return _one("sessions", f"named {ident!r}", found)["id"]
    if entity == "vfolders":
        found = client.request("GET", "/vfolders", query={"name": ident, "limit": 3})["items"]
        return _one("vfolders", f"named {ident!r}", found)["id"]
    return _quote(ident)


# List filters that take an id; given a name, it is looked up like a positional one.
FILTER_ENTITY = {"user_id": "users", "project_id": "projects", "project": "projects"}
# Body fields that take ids (one or a list), looked up the same way.
BODY_ENTITY = {"user_id": "users", "project_ids": "projects", "allowed_projects": "projects",
               "dependencies": "sessions"}


def resolve_body(client: ApiClient, body: dict) -> dict:
    """``body`` with names in id fields replaced by the ids they name."""
    out = dict(body)
    for key, entity in BODY_ENTITY.items():
        value = out.get(key)
        if isinstance(value, str):
            out[key] = _resolve(client, entity, value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[key] = [_resolve(client, entity, v) for v in value]
    return out


class _UsageError(Exception):
    pass


# -- the parser ----------------------------------------------------------------------


_DOC: dict | None = None


def _openapi() -> dict:
    """The API's OpenAPI document (the schemas its requests are validated against)."""
    global _DOC
    if _DOC is None:
        import yaml

        path = os.path.join(os.path.dirname(__file__), "api", "openapi.yaml")
        with open(path) as f:
            _DOC = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return _DOC


def type_text(schema: dict) -> str:
    """A schema in words: type, bounds, choices."""
    if "$ref" in schema:
        return type_text(_openapi()["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]])
    if "anyOf" in schema:
        return " or ".join(type_text(x) for x in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(str(x) for x in schema["enum"])
    t = schema.get("type")
    if isinstance(t, list):
        return " or ".join(type_text({**schema, "type": x}) for x in t)
    if t == "null":
        return "null"
    if t == "string":
        lo, hi = schema.get("minLength"), schema.get("maxLength")
        out = "string"
        if lo and hi:
            out += f" of {lo} to {hi} characters"
        elif hi:
            out += f" of at most {hi} characters"
        if "pattern" in schema:
            # The document says each pattern in words (x-message); never the regex.
            out += ": " + schema.get("x-message", "in the form the API documents")
        if "format" in schema:
            out += f" ({schema['format']})"
        return out
    if t in ("integer", "number"):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        out = t
        if lo is not None and hi is not None and hi < 2**31 - 1:
            out += f" from {lo} to {hi}"
        elif lo is not None:
            out += f" >= {lo}"
        return out
    if t == "boolean":
        return "boolean (true or false)"
    if t == "array":
        out = "list of " + (type_text(schema["items"]) if "items" in schema else "values")
        if "maxItems" in schema:
            out += f" (at most {schema['maxItems']})"
        return out
    if t == "object":
        if "properties" in schema:
            return "object with keys " + ", ".join(schema["properties"])
        if "propertyNames" in schema and "enum" in schema["propertyNames"]:
            return "object with keys from " + ", ".join(schema["propertyNames"]["enum"])
        return "object"
    return "any JSON value"


def request_schema(path: str, method: str) -> str | None:
    """The name of the schema that validates the body of ``method path``."""
    paths = _openapi()["paths"]
    if path.endswith("/{}"):  # one item of a collection, whatever its parameter's name
        base = path[:-3]
        path = next((p for p in paths if p.startswith(base + "/{")
                     and p.count("/") == base.count("/") + 1), path)
    op = paths.get(path, {}).get(method, {})
    ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    return ref["$ref"].rsplit("/", 1)[1] if ref and "$ref" in ref else None


def fields_help(schema_name: str) -> str:
    """The fields of a request body, from the API's schema: name, type, meaning."""
    schema = _openapi()["components"]["schemas"][schema_name]
    required = set(schema.get("required", ()))
    lines = [f"fields (schema {schema_name} of the API; FIELD is key=value for a string, "
             "key:=JSON for a number, boolean, list, object or null):"]
    for name, sub in schema.get("properties", {}).items():
        kind = type_text(sub)
        lines.append(f"  {name}{' (required)' if name in required else ''}: {kind}")
        meaning = sub.get("description")
        if meaning:
            lines.append(f"      {meaning}")
    if schema.get("additionalProperties") is False:
        lines.append("  (no other fields)")
    return "\n".join(lines) + "\n"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose help may end with a request body's fields."""

    body_schema: tuple[str, str] | None = None  # (path, method) in the OpenAPI document

    def format_help(self) -> str:
        text = super().format_help()
        if self.body_schema:
            name = request_schema(*self.body_schema)
            if name:
                text += "\n" + fields_help(name)
        return text



def _api_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Connection options; accepted before or after the command (``suppress`` on the latter)."""
    def default(env: str) -> Any:
        return argparse.SUPPRESS if suppress else os.environ.get(env)

    g = parser.add_argument_group("API connection")
    g.add_argument("--endpoint", default=default("BACKENDAI_ENDPOINT"),
                   help="the hub's URL, e.g. http://127.0.0.1:8000/ (env BACKENDAI_ENDPOINT)")
    g.add_argument("--access-key", default=default("BACKENDAI_ACCESS_KEY"),
                   help="keypair access key (env BACKENDAI_ACCESS_KEY)")
    g.add_argument("--secret-key", default=default("BACKENDAI_SECRET_KEY"),
                   help="keypair secret key (env BACKENDAI_SECRET_KEY)")
    g.add_argument("--timeout", type=float, default=argparse.SUPPRESS if suppress else 60.0,
                   help="seconds to wait for the hub (default 60)")


def _fields_options(parser: argparse.ArgumentParser, body: tuple[str, str] | None = None) -> None:
    parser.add_argument("fields", nargs="*", metavar="FIELD",
                        help="key=value (string) or key:=json (number, boolean, list, object)"
                        + ("; the fields are listed below" if body else ""))
    if body:
        parser.body_schema = body
    parser.add_argument("--data", help="the whole body as a JSON object, or @file.json")


def plain(text: str) -> str:
    """reST (``literal``, **strong**, bullets) as plain text, refilled, for ``--help``."""
    import textwrap

    out = []
    for block in text.replace("``", "").replace("**", "").strip().split("\n\n"):
        lines = block.split("\n")
        if lines[0].startswith("- "):
            items: list[str] = []
            for line in lines:
                if line.startswith("- ") or not items:
                    items.append(line.removeprefix("- "))
                else:
                    items[-1] += " " + line.strip()
            out.append("\n".join(textwrap.fill(i, 79, initial_indent="- ",
                                                subsequent_indent="  ") for i in items))
        else:
            out.append(textwrap.fill(" ".join(x.strip() for x in lines), 79))
    return "\n\n".join(out)


def _add_json_option(parser: argparse.ArgumentParser, top: bool = True) -> None:
    """``--json`` on ``parser`` and every parser below it (so it goes anywhere)."""
    if "--json" not in parser._option_string_actions:
        parser.add_argument("--json", action="store_true",
                            default=False if top else argparse.SUPPRESS,
                            help="print the JSON the command got, for scripts (default: "
                            "tables and words for people)")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_json_option(child, top=False)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="backendai-admin", description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--db", default=None, metavar="URL",
        help="the hub's database, for bootstrap commands (default: env BACKENDAI_DB_URL, "
        "else sqlite:///$BACKENDAI_STATE_DIR/backendai.sqlite, the state directory "
        "defaulting to ./backendai-state: where the hub keeps it)",
    )
    _api_options(p, suppress=False)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    # Bootstrap (database).
    sub.add_parser("db-upgrade", help="[bootstrap] create or migrate the schema (the only "
                   "command that creates a database)")
    sa = sub.add_parser("create-superadmin", help="[bootstrap] create the first superadmin")
    sa.add_argument("--email", default=os.environ.get("BACKENDAI_ADMIN_EMAIL", "admin@example.com"),
                    help="string: the superadmin's email, its login (env BACKENDAI_ADMIN_EMAIL)")
    sa.add_argument("--password", default=os.environ.get("BACKENDAI_ADMIN_PASSWORD"),
                    help="string, 8 to 72 bytes (env BACKENDAI_ADMIN_PASSWORD; default: "
                    "generated and printed once)")
    d = sub.add_parser("create-domain", help="[bootstrap] create a domain")
    d.add_argument("name", help="string: the domain's name (letters, digits, '.', '_', '-')")
    pr = sub.add_parser("create-project", help="[bootstrap] create a project in a domain")
    pr.add_argument("name", help="string: the project's name, unique in its domain")
    pr.add_argument("--domain", default="default", help="string: the domain (default: default)")
    u = sub.add_parser("create-user", help="[bootstrap] create a user with a default keypair")
    u.add_argument("--email", required=True, help="string: the user's email, a login")
    u.add_argument("--password", required=True, help="string, 8 to 72 bytes")
    u.add_argument("--username", help="string: lowercase letters, digits, '.', '_', '-' "
                   "(default: the email's part before '@'); the JupyterHub user's name, a login")
    u.add_argument("--role", default="user", choices=["superadmin", "admin", "user", "monitor"],
                   help="what the user may do (default: user)")
    u.add_argument("--domain", default="default", help="string: the user's domain (default: default)")
    u.add_argument("--status", default="active",
                   choices=["active", "inactive", "deleted", "before-verification"],
                   help="only active users log in (default: active)")
    u.add_argument("--project", action="append", dest="projects", metavar="NAME",
                   help="string: a project of the domain to join, by name (repeatable; "
                   "default: the domain's project 'default')")
    k = sub.add_parser("create-keypair", help="[bootstrap] create another keypair for a user")
    k.add_argument("--email", required=True, metavar="EMAIL_OR_USERNAME",
                   help="string: the user, by email or username")
    rp = sub.add_parser(
        "reset-password", help="[bootstrap] set a user's password (e.g. a lost superadmin's)",
        description="Set a new password for a user, directly in the hub's database: for when "
        "nobody who could change it can log in. Without --password one is generated and "
        "printed once.")
    rp.add_argument("user", metavar="EMAIL_OR_USERNAME", help="string: the user, by email or "
                    "username")
    rp.add_argument("--password", help="string, 8 to 72 bytes (default: generated, printed once)")
    fx = sub.add_parser("fixture", help="[bootstrap] load records from a JSON fixture")
    fx_sub = fx.add_subparsers(dest="fixture_cmd", required=True)
    fxp = fx_sub.add_parser(
        "populate", help="create the records of a fixture file",
        description="Create what a fixture file describes and the record lacks. Its vfolders "
        "are made on the storage volumes the hub will use: give them with --storage-volume "
        "(as in c.BackendAIManager.storage_volumes) or --config (the hub's configuration "
        "file); by default the hub's default, ./backendai-vfroot/volume1.")
    fxp.add_argument("file")
    fxp.add_argument("--storage-volume", action="append", metavar="NAME=PATH",
                     help="a vfs volume of the hub's storage proxy 'local' (repeatable)")
    fxp.add_argument("--config", metavar="FILE",
                     help="JupyterHub configuration file to read BackendAIManager.storage_volumes, "
                     "storage_proxies and default_vfolder_host from")
    fxp.add_argument("--default-vfolder-host", metavar="HOST",
                     help="host of vfolders that name none (default: local:volume1)")

    # API client.
    def api_cmd(name: str, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=f"[API] {help}")
        _api_options(sp, suppress=True)
        return sp

    api_cmd("whoami", "who the keypair belongs to")
    api_cmd("scheduler", "the scheduler's state")
    api_cmd("openapi", "the API's OpenAPI document")
    api_cmd("vfolder-hosts", "storage hosts the keypair may use for vfolders, and for what")
    us = api_cmd("usage", "core-, GiB- and GPU-hours of the sessions the keypair may see")
    us.add_argument("--start", help="ISO date or time, UTC (default: the month's start)")
    us.add_argument("--end", help="ISO date or time, UTC, not included (default: now)")
    us.add_argument("--group-by", dest="group_by",
                    choices=["user", "project", "domain", "resource_group"], default="user")
    raw = api_cmd("api", "any request: METHOD PATH [FIELD ...]")
    raw.add_argument("method", type=str.upper,
                     choices=["GET", "POST", "PUT", "PATCH", "DELETE"])
    raw.add_argument("path", help="path under the API prefix, e.g. /users")
    raw.add_argument("-q", "--query", action="append", metavar="KEY=VALUE",
                     help="query parameter (repeatable)")
    _fields_options(raw)

    for name, (path, ident) in ENTITIES.items():
        offered = ACTIONS[name]
        ep = api_cmd(name, f"{', '.join(offered)} {name}")
        acts = ep.add_subparsers(dest="action", required=True, metavar="ACTION")
        ls = acts.add_parser("list", help=f"list {name} (paginated)")
        _api_options(ls, suppress=True)
        ls.add_argument("--offset", type=int, default=0)
        ls.add_argument("--limit", type=int, default=100)
        ls.add_argument("--all", action="store_true", help="follow pages until the end")
        for f in FILTERS[name]:
            ls.add_argument("--" + f.replace("_", "-"), dest=f,
                            help=f"filter: {f}" + (" (true or false)" if f.startswith("is_") else ""))
        ls.add_argument("--filter", action="append", metavar="KEY=VALUE",
                        help="any other filter the API offers (repeatable)")
        by = IDENTIFIED_BY.get(name, ident)
        metavar = name.rstrip("s").upper().replace("-", "_")
        for act, text in (("get", "show one"), ("delete", "delete one")):
            if act not in offered:
                continue
            a = acts.add_parser(act, help=f"{text} (by {by})")
            _api_options(a, suppress=True)
            a.add_argument("id", metavar=metavar, help=f"the {name.rstrip('s')}: {by}")
        if "create" in offered:
            c = acts.add_parser("create", help="create one from fields (listed by --help)")
            _api_options(c, suppress=True)
            _fields_options(c, (path, "post"))
        if "update" in offered:
            up = acts.add_parser("update", help="change fields of one (listed by --help)")
            _api_options(up, suppress=True)
            up.add_argument("id", metavar=metavar, help=f"the {name.rstrip('s')}: {by}")
            _fields_options(up, (path + "/{}", "patch"))
        if name == "projects":
            m = acts.add_parser("members", help="list a project's members")
            _api_options(m, suppress=True)
            m.add_argument("id", metavar="PROJECT", help=f"the project: {by}")
            m.add_argument("--offset", type=int, default=0)
            m.add_argument("--limit", type=int, default=100)
            for act in ("add-members", "remove-members"):
                a = acts.add_parser(act, help=f"{act.split('-')[0]} users ({IDENTIFIED_BY['users']})")
                _api_options(a, suppress=True)
                a.add_argument("id", metavar="PROJECT", help=f"the project: {by}")
                a.add_argument("users", nargs="+", metavar="USER",
                               help=f"a user: {IDENTIFIED_BY['users']}")
        if name == "vfolders":
            for act, (text, positional) in VFOLDER_ACTIONS.items():
                a = acts.add_parser(act, help=text)
                _api_options(a, suppress=True)
                for arg in positional:
                    a.add_argument(arg, metavar={"id": "VFOLDER (id or name)", "remote": "PATH"}
                                   .get(arg, arg.upper()))
                if act == "shares":
                    a.add_argument("--offset", type=int, default=0)
                    a.add_argument("--limit", type=int, default=100)
                if act == "share":
                    a.add_argument("--permission", choices=["ro", "rw", "wd"], default="ro")
                if act == "files":
                    a.add_argument("path", nargs="?", default="", metavar="PATH")
                if act == "upload":
                    a.add_argument("--path", help="where in the folder (default: the file's name)")
                if act == "download":
                    a.add_argument("-o", "--output", help="local file (default: the file's name; "
                                   "- for stdout)")
                if act == "mkdir":
                    a.add_argument("-p", "--parents", action="store_true")
                if act == "rm":
                    a.add_argument("-r", "--recursive", action="store_true")
        if name == "sessions":
            lg = acts.add_parser("logs", help="a session's kernel logs")
            _api_options(lg, suppress=True)
            lg.add_argument("id", metavar="SESSION_ID")
    _add_json_option(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd in BOOTSTRAP:
            out = _bootstrap(args)
        else:
            out = _run_api(args)
    except _Done:
        return 0
    except BackendAIError as e:
        print(f"backendai-admin: {e.detail}", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as e:
        print(f"backendai-admin: {e}", file=sys.stderr)
        return EXIT_API_ERROR
    except _UsageError as e:
        print(f"backendai-admin: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        text = render(out, args.cmd)
        if text:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
