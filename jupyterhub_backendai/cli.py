"""``backendai-admin``: the platform's admin command line.

Two kinds of commands:

- **Bootstrap** (``db-upgrade``, ``create-superadmin``, ``create-domain``,
  ``create-project``, ``create-user``, ``create-keypair``, ``fixture populate``):
  direct database operations (``--db``) for before any hub runs: a fresh
  install, an image build (Binder's postBuild), a restore.
- **API client** (``whoami``, ``domains``, ``projects``, ``users``, ``keypairs``,
  the resource policies, ``resource-groups``, ``agents``, ``sessions``,
  ``scheduler``, ``api``): HTTP requests to a running hub's admin API, signed
  with a keypair (Backend.AI's HMAC-SHA256 request signing). They go through
  the same permission checks as any other API client; this is not a second
  path into the database. Options or environment: ``--endpoint``
  (``BACKENDAI_ENDPOINT``, the hub's URL), ``--access-key``
  (``BACKENDAI_ACCESS_KEY``), ``--secret-key`` (``BACKENDAI_SECRET_KEY``).

Output is JSON on stdout. Errors go to stderr as ``backendai-admin: <status>
<title>: <detail>`` (the API's problem document) with a non-zero exit status.
Fields for create/update are given as ``key=value`` (a string) or
``key:=<json>`` (a number, boolean, list, object), or whole with ``--data``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .common import signing
from .common.errors import BackendAIError

API_PREFIX = "hub/api/backendai"
EXIT_API_ERROR = 1
EXIT_USAGE = 2


# -- bootstrap: direct database operations --------------------------------------------


def _session(url: str):
    from .manager import tenancy
    from .models.db import make_engine, make_sessionmaker, upgrade

    engine = make_engine(url)
    upgrade(engine)
    sm = make_sessionmaker(engine)
    with sm.begin() as s:
        tenancy.ensure_defaults(s)
    return sm


def create_superadmin(url: str, email: str, password: str | None, *, exist_ok: bool = True) -> dict:
    """Create the first superadmin; returns what to show the operator (password only if generated)."""
    from .manager import tenancy

    sm = _session(url)
    generated = password is None
    password = password or secrets.token_urlsafe(12)
    with sm.begin() as s:
        existing = tenancy.find_user(s, email)
        if existing is not None:
            if not exist_ok:
                raise SystemExit(f"user {email} exists")
            return {"email": email, "created": False}
        user, kp, secret = tenancy.create_user(
            s, email=email, password=password, role="superadmin", username="admin"
            if tenancy.find_user(s, "admin") is None else None,
        )
        out = {"email": email, "username": user.username, "created": True,
               "access_key": kp.access_key, "secret_key": secret}
        if generated:
            out["password"] = password
        return out


def _bootstrap(args: argparse.Namespace) -> Any:
    from .manager import tenancy

    if args.cmd == "create-superadmin":
        return create_superadmin(args.db, args.email, args.password)
    if args.cmd == "fixture":
        from .manager.fixtures import populate_file, storage_from

        volumes = {}
        for pair in args.storage_volume or ():
            name, eq, path = pair.partition("=")
            if not eq or not name or not path:
                raise _UsageError(f"--storage-volume {pair!r}: expected NAME=PATH")
            volumes[name] = os.path.abspath(path)
        storage, host = storage_from(volumes, args.config)
        return populate_file(args.db, args.file, storage, args.default_vfolder_host or host)
    sm = _session(args.db)
    with sm.begin() as s:
        if args.cmd == "db-upgrade":
            return {"upgraded": True}
        if args.cmd == "create-domain":
            return {"domain": tenancy.create_domain(s, args.name).name}
        if args.cmd == "create-project":
            pj = tenancy.create_project(s, args.domain, args.name)
            return {"project": pj.name, "id": pj.id, "domain": pj.domain_name}
        if args.cmd == "create-user":
            user, kp, secret = tenancy.create_user(
                s, email=args.email, password=args.password, username=args.username,
                role=args.role, domain=args.domain, status=args.status,
                projects=args.projects,
            )
            return {"username": user.username, "email": user.email,
                    "access_key": kp.access_key, "secret_key": secret}
        if args.cmd == "create-keypair":
            user = tenancy.find_user(s, args.email)
            if user is None:
                raise SystemExit(f"no user {args.email}")
            kp, secret = tenancy.create_keypair(s, user)
            return {"access_key": kp.access_key, "secret_key": secret}
    raise AssertionError(args.cmd)


BOOTSTRAP = {"db-upgrade", "create-superadmin", "create-domain", "create-project",
             "create-user", "create-keypair", "fixture"}


# -- the API client ------------------------------------------------------------------


class ApiError(Exception):
    """The API answered with an error (its problem document) or could not be reached."""

    def __init__(self, status: int | None, title: str, detail: str = "") -> None:
        super().__init__(f"{status or ''} {title}: {detail}".strip())
        self.status = status
        self.title = title
        self.detail = detail


class ApiClient:
    """Signed requests to the hub's admin API, with the standard library only."""

    def __init__(self, endpoint: str, access_key: str, secret_key: str,
                 timeout: float = 60.0) -> None:
        self.base = api_base(endpoint)
        self.access_key = access_key
        self.secret_key = secret_key
        self.timeout = timeout

    def url(self, path: str, query: dict | None = None) -> str:
        url = self.base + "/" + path.lstrip("/")
        params = [(k, str(v).lower() if isinstance(v, bool) else str(v))
                  for k, v in (query or {}).items() if v is not None]
        if params:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode(params)
        return url

    def _send(self, method: str, path: str, query: dict | None, data: Any,
              content_type: str, sink: Any = None) -> bytes:
        """One signed request; the response body (or, with ``sink``, written to it)."""
        url = self.url(path, query)
        headers = signing.sign_request(method, url, self.access_key, self.secret_key,
                                       content_type=content_type)
        # Send exactly the host[:port] that was signed.
        headers["Host"] = urllib.parse.urlsplit(url).netloc
        headers["Accept"] = "application/json"
        if hasattr(data, "read"):  # a file, streamed
            headers["Content-Length"] = str(os.fstat(data.fileno()).st_size)
        req = urllib.request.Request(url, data=data, method=method.upper(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                if sink is None:
                    return resp.read()
                while chunk := resp.read(1 << 20):
                    sink.write(chunk)
                return b""
        except urllib.error.HTTPError as e:
            raise _problem(e) from None
        except urllib.error.URLError as e:
            raise ApiError(None, f"cannot reach {self.base}", str(e.reason)) from None
        except (TimeoutError, ConnectionError) as e:
            raise ApiError(None, f"cannot reach {self.base}", str(e)) from None

    def upload(self, path: str, query: dict, file: Any) -> Any:
        """PUT a file's bytes (streamed from the open binary ``file``)."""
        return json.loads(self._send("PUT", path, query, file, "application/octet-stream"))

    def download(self, path: str, query: dict, sink: Any) -> None:
        """GET bytes into the writable binary ``sink``."""
        self._send("GET", path, query, None, signing.DEFAULT_CONTENT_TYPE, sink)

    def request(self, method: str, path: str, *, query: dict | None = None,
                body: Any = None) -> Any:
        """Send one request; returns the decoded JSON body (None for an empty one)."""
        data = None if body is None else json.dumps(body).encode()
        raw = self._send(method, path, query, data, signing.DEFAULT_CONTENT_TYPE)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def list_all(self, path: str, query: dict | None = None, page: int = 100) -> dict:
        """Every item of a paginated list, following ``offset``/``limit``."""
        items: list = []
        offset = 0
        while True:
            got = self.request("GET", path, query={**(query or {}), "offset": offset, "limit": page})
            items.extend(got["items"])
            offset += len(got["items"])
            if not got["items"] or offset >= got["total"]:
                return {"items": items, "total": got["total"], "offset": 0, "limit": len(items)}


def api_base(endpoint: str) -> str:
    """The API's URL from the hub's URL (``http://host:8000/`` -> ``.../hub/api/backendai``)."""
    endpoint = endpoint.strip().rstrip("/")
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ApiError(None, "bad endpoint", f"{endpoint!r} is not an http(s) URL of the hub")
    if endpoint.endswith("/" + API_PREFIX):
        return endpoint
    return endpoint + "/" + API_PREFIX


def _problem(e: urllib.error.HTTPError) -> ApiError:
    raw = e.read()
    title, detail = e.reason or "error", ""
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict):
            title = doc.get("title") or title
            detail = doc.get("detail") or doc.get("message") or ""
    except ValueError:
        detail = raw.decode(errors="replace").strip()[:500]
    return ApiError(e.code, str(title), str(detail))


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
    "agents": ("/agents", "id"),
    "sessions": ("/sessions", "id"),
    "vfolders": ("/vfolders", "id"),
}
# What the API lets one do with each entity (agents are read-only; sessions are created
# and deleted, not changed); tests/test_cli.py checks this table against the document.
ACTIONS: dict[str, tuple[str, ...]] = {
    name: ("list", "get", "create", "update", "delete") for name in ENTITIES
}
ACTIONS["agents"] = ("list", "get")
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


def _list_query(args: argparse.Namespace) -> dict:
    query: dict = {"offset": args.offset, "limit": args.limit}
    for name in FILTERS[args.cmd]:
        value = getattr(args, name, None)
        if value is not None:
            query[name] = value
    for pair in args.filter or ():
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ApiError(None, "bad filter", f"{pair!r}: expected key=value")
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
    if cmd == "api":
        body = parse_fields(args.fields, args.data) if (args.fields or args.data) else None
        query = dict(p.split("=", 1) for p in args.query or () if "=" in p)
        return client.request(args.method, args.path, query=query or None, body=body)
    path, _ident = ENTITIES[cmd]
    action = args.action
    if action == "list":
        query = _list_query(args)
        if args.all:
            query.pop("offset", None)
            query.pop("limit", None)
            return client.list_all(path, query)
        return client.request("GET", path, query=query)
    ident = _resolve(client, cmd, args.id) if hasattr(args, "id") else ""
    if action == "get":
        return client.request("GET", f"{path}/{ident}")
    if action == "create":
        return client.request("POST", path, body=parse_fields(args.fields, args.data))
    if action == "update":
        return client.request("PATCH", f"{path}/{ident}", body=parse_fields(args.fields, args.data))
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
        return {"project_id": args.id, "removed": users}
    if action == "logs":
        return client.request("GET", f"{path}/{ident}/logs")
    if cmd == "vfolders":
        return _vfolder_action(client, args, f"{path}/{ident}")
    raise AssertionError(action)


def _vfolder_action(client: ApiClient, args: argparse.Namespace, base: str) -> Any:
    action = args.action
    if action == "shares":
        return client.request("GET", f"{base}/shares",
                              query={"offset": args.offset, "limit": args.limit})
    if action == "share":
        return client.request("POST", f"{base}/shares",
                              body={"email": args.email, "permission": args.permission})
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
    if action == "mkdir":
        return client.request("POST", f"{base}/mkdir",
                              body={"path": args.remote, "parents": args.parents})
    if action == "rename":
        return client.request("POST", f"{base}/rename",
                              body={"path": args.remote, "new_path": args.new_path})
    if action == "rm":
        client.request("DELETE", f"{base}/files",
                       query={"path": args.remote, "recursive": args.recursive})
        return {"vfolder": args.id, "deleted": args.remote}
    raise AssertionError(action)


class _Done(Exception):
    """The command wrote its output itself (bytes to stdout)."""


def _resolve(client: ApiClient, entity: str, ident: str) -> str:
    """The path segment for ``ident``; a user may also be named by email (looked up)."""
    if entity == "users" and "@" in ident:
        found = client.request("GET", "/users", query={"email": ident, "limit": 2})["items"]
        if len(found) != 1:
            raise ApiError(404, "Not found", f"no user with email {ident!r} visible to this keypair")
        return _quote(found[0]["id"])
    if entity == "vfolders" and not re.fullmatch(r"[0-9a-f]{32}", ident):
        found = client.request("GET", "/vfolders", query={"name": ident, "limit": 3})["items"]
        if len(found) != 1:
            raise ApiError(404 if not found else 400, "Not found" if not found else "Ambiguous",
                           f"{len(found) or 'no'} vfolders named {ident!r} visible to this "
                           "keypair" + ("; use the id" if found else ""))
        return found[0]["id"]
    return _quote(ident)


class _UsageError(Exception):
    pass


# -- the parser ----------------------------------------------------------------------


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


def _fields_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fields", nargs="*", metavar="FIELD",
                        help="key=value (string) or key:=json (number, boolean, list, object)")
    parser.add_argument("--data", help="the whole body as a JSON object, or @file.json")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="backendai-admin", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--db",
        default=os.environ.get("BACKENDAI_DB_URL", "sqlite:///backendai.sqlite"),
        help="database URL for bootstrap commands (env BACKENDAI_DB_URL)",
    )
    _api_options(p, suppress=False)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    # Bootstrap (database).
    sub.add_parser("db-upgrade", help="[bootstrap] create or migrate the schema")
    sa = sub.add_parser("create-superadmin", help="[bootstrap] create the first superadmin")
    sa.add_argument("--email", default=os.environ.get("BACKENDAI_ADMIN_EMAIL", "admin@example.com"))
    sa.add_argument("--password", default=os.environ.get("BACKENDAI_ADMIN_PASSWORD"))
    d = sub.add_parser("create-domain", help="[bootstrap] create a domain")
    d.add_argument("name")
    pr = sub.add_parser("create-project", help="[bootstrap] create a project in a domain")
    pr.add_argument("name")
    pr.add_argument("--domain", default="default")
    u = sub.add_parser("create-user", help="[bootstrap] create a user with a default keypair")
    u.add_argument("--email", required=True)
    u.add_argument("--password", required=True)
    u.add_argument("--username")
    u.add_argument("--role", default="user")
    u.add_argument("--domain", default="default")
    u.add_argument("--status", default="active")
    u.add_argument("--project", action="append", dest="projects")
    k = sub.add_parser("create-keypair", help="[bootstrap] create another keypair for a user")
    k.add_argument("--email", required=True)
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
    raw = api_cmd("api", "any request: METHOD PATH [FIELD ...]")
    raw.add_argument("method", type=str.upper,
                     choices=["GET", "POST", "PUT", "PATCH", "DELETE"])
    raw.add_argument("path", help="path under the API prefix, e.g. /users")
    raw.add_argument("-q", "--query", action="append", metavar="KEY=VALUE",
                     help="query parameter (repeatable)")
    _fields_options(raw)

    for name, (_path, ident) in ENTITIES.items():
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
        by = ident + (" or email" if name == "users" else "")
        for act, text in (("get", "show one"), ("delete", "delete one")):
            if act not in offered:
                continue
            a = acts.add_parser(act, help=f"{text} (by {by})")
            _api_options(a, suppress=True)
            a.add_argument("id", metavar=ident.upper().replace(" ", "_"))
        if "create" in offered:
            c = acts.add_parser("create", help="create one from fields")
            _api_options(c, suppress=True)
            _fields_options(c)
        if "update" in offered:
            up = acts.add_parser("update", help="change fields of one")
            _api_options(up, suppress=True)
            up.add_argument("id", metavar=ident.upper().replace(" ", "_"))
            _fields_options(up)
        if name == "projects":
            m = acts.add_parser("members", help="list a project's members")
            _api_options(m, suppress=True)
            m.add_argument("id", metavar="PROJECT_ID")
            m.add_argument("--offset", type=int, default=0)
            m.add_argument("--limit", type=int, default=100)
            for act in ("add-members", "remove-members"):
                a = acts.add_parser(act, help=f"{act.split('-')[0]} users (by id or email)")
                _api_options(a, suppress=True)
                a.add_argument("id", metavar="PROJECT_ID")
                a.add_argument("users", nargs="+", metavar="USER")
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
    print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
