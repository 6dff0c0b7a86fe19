"""The vocabulary of the admin API's contract: routes and their operations (each
declared once, by the handlers), and the schema pieces they are described with.

``openapi.yaml`` beside this module is the contract as served: the hub serves it at
``/hub/api/backendai/openapi.json`` and the tests fuzz the running hub against it. It is
generated from the declared routes by :mod:`.document`, never written by hand::

    python -m jupyterhub_backendai.api.document --write

Its component schemas are the pydantic models of :mod:`.models` (which also validate the
request bodies, so the document and the validation cannot differ); its paths are the
declared operations; a test fails when the committed file differs from what is built.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import yaml

from ..manager.vfolders import MAX_PATH
from . import models

PATH = os.path.join(os.path.dirname(__file__), "openapi.yaml")
PREFIX = "/hub/api/backendai"
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
INT32 = 2**31 - 1
INT64 = 2**63 - 1

# -- schema pieces of parameters (bodies are the models of :mod:`.models`) -----------


def _str(max_len: int = 64, **kw) -> dict:
    return {"type": "string", "maxLength": max_len, **kw}


def _int(lo: int = 0, hi: int = INT32) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


BOOL = {"type": "boolean"}
FILE_PATH = {"type": "string", "minLength": 1, "maxLength": MAX_PATH,
             "description": "relative to the folder's root; no '..'"}


def _out(props: dict) -> dict:
    """A response object: every listed property is always present."""
    return {"type": "object", "properties": props, "required": list(props)}


def _page_schema(item: str) -> dict:
    return _out({"items": {"type": "array", "items": _ref(item)},
                 "total": {"type": "integer", "minimum": 0},
                 "offset": {"type": "integer", "minimum": 0},
                 "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}})


# -- operations: each route declared once ------------------------------------------
#
# A route is a path of the document with the tornado handler that serves it and the
# operations it has (one per HTTP method). The tornado URL list (:meth:`Route.rule`) and the
# document's paths (:func:`.document.build_document`) are both made from these declarations, so a
# route cannot be served without being documented, or documented without being served.


@dataclass(frozen=True)
class Op:
    """One operation: what the document says of it and what the handler checks."""

    op_id: str
    summary: str
    #: A paginated list's query filters (name -> JSON Schema); ``{}``: a list without any.
    filters: dict | None = None
    #: Query parameters of an operation that is not a list: name -> (schema, required).
    params: dict | None = None
    #: The request body's model (:mod:`.models`), validated by ``APIBase.body``.
    body: type | None = None
    status: int = 200
    #: The success response's model (of each item, for a list).
    response: type | None = None
    raw_body: bool = False
    raw_response: bool = False
    #: No credentials needed (the document itself); no error responses documented.
    public: bool = False
    tag: str | None = None


@dataclass(frozen=True)
class Route:
    path: str
    handler: type
    ops: dict
    kwargs: dict | None = None

    def rule(self, prefix: str) -> tuple:
        """(pattern, handler[, kwargs]) for tornado, under ``prefix``."""
        pattern = prefix + re.sub(r"\{[^/}]+\}", lambda _m: SEG, self.path)
        return (pattern, self.handler, self.kwargs) if self.kwargs else (pattern, self.handler)


SEG = r"([^/]+)"


def route(path: str, handler: type, kwargs: dict | None = None, **ops: Op) -> Route:
    """Declare ``path``, served by ``handler`` (with these ``initialize`` kwargs), and its
    operations by method: ``route("/domains", DomainsHandler, get=Op(...), post=Op(...))``."""
    return Route(path, handler, ops, kwargs)


def find(routes: list[Route], method: str, path: str) -> Op:
    """The declared operation ``method path`` (``KeyError`` if there is none)."""
    for r in routes:
        if r.path == path and method in r.ops:
            return r.ops[method]
    raise KeyError(f"{method.upper()} {path} is not declared")


def enum(values) -> dict:
    """A query parameter with these choices."""
    return {"enum": [str(getattr(v, "value", v)) for v in values]}


# Query parameter schemas of the list filters.
F_BOOL = {"type": "boolean"}
F_STR = _str(128)
#: The kinds of resource policies (keypair: limits of sessions; user, project: quotas).
POLICY_KINDS = {"keypair": "KeypairResourcePolicy", "user": "QuotaPolicy",
                "project": "QuotaPolicy"}
BINARY = {"type": "string", "format": "binary"}

ERRORS = {400: "Bad request: malformed JSON, wrong types, unknown fields or parameters",
          401: "No valid credentials", 403: "Not allowed for this caller",
          404: "No such object (or not visible to the caller)", 405: "Method not allowed",
          409: "Conflicts with the current state",
          412: "A limit of a resource policy is reached (e.g. max_vfolder_count)",
          413: "A storage quota scope would exceed its size limit", 429: "Rate limit exceeded"}


def _param(name: str, schema: dict, where: str = "query", required: bool = False) -> dict:
    return {"name": name, "in": where, "required": required, "schema": schema}


def _path_params(path: str) -> list[dict]:
    out = []
    for part in path.split("/"):
        if part.startswith("{"):
            name = part[1:-1]
            schema = _str(64, minLength=1) if name != "access_key" else _str(20, minLength=1)
            out.append(_param(name, schema, "path", True))
    return out


# -- words for people: the CLI's --help and the API's 400s read them from the document --

# Each pattern of the schemas said in words (``x-message``); errors never quote a regex.
PATTERN_WORDS = models.PATTERN_WORDS

# What a request field means, where its schema has no description of its own.
FIELD_DESCRIPTIONS: dict[str, str] = {
    "name": "the name (unique where it lives)",
    "description": "free text",
    "is_active": "false: deactivated (its users cannot log in or start sessions)",
    "email": "the user's email; a login name",
    "password": "the password to log in with",
    "username": "the JupyterHub user name; a login name (default: the email's part before '@')",
    "full_name": "the user's full name",
    "status": "only active users may log in",
    "role": "what the user may do: superadmin (everything), admin (its domain), user, "
            "monitor (read only)",
    "domain_name": "the domain it belongs to (default: the caller's)",
    "resource_policy": "the name of the resource policy that limits it",
    "need_password_change": "ask the user to change the password",
    "allowed_client_ip": "addresses or networks (CIDR) the user may log in from; null: any",
    "project_ids": "projects the user is a member of (ids; the CLI also takes names)",
    "allowed_vfolder_hosts": "storage hosts (proxy:volume) and what may be done on each",
    "allowed_docker_registries": "registries images may come from",
    "user_id": "the owner (a user's id; the CLI also takes an email or username; default: "
               "the caller)",
    "rate_limit": "signed requests allowed per 15 minutes",
    "is_admin": "the keypair may use admin endpoints (admins only)",
    "is_default": "the user's main keypair",
    "default_for_unspecified": "slots the policy does not name: UNLIMITED or LIMITED (zero)",
    "max_concurrent_sessions": "sessions running at once",
    "max_containers_per_session": "kernels (containers) in one session",
    "max_session_lifetime": "seconds a session may live (0: unlimited)",
    "idle_timeout": "seconds without activity before a session is stopped (0: never)",
    "max_lifetime_extension": "seconds an owner may add to a session's lifetime in all "
                              "(POST /sessions/{id}/extend; 0: none)",
    "max_priority": "the highest priority its sessions may ask for",
    "max_pending_session_count": "sessions waiting in the queue at once (null: unlimited)",
    "max_pending_session_resource_slots": "resources of waiting sessions at once (null: "
                                          "unlimited)",
    "max_vfolder_count": "folders (0: unlimited)",
    "max_quota_scope_size": "bytes of all folders of the scope (0: unlimited)",
    "is_public": "every domain may use it (else only allowed_domains/projects/keypairs)",
    "scheduler": "the order in which waiting sessions start",
    "scheduler_opts": "the scheduler's options",
    "allowed_domains": "domains that may use it (when not public)",
    "allowed_projects": "projects that may use it when not public (ids; the CLI also takes "
                        "names)",
    "allowed_keypairs": "access keys that may use it (when not public)",
    "image": "the kernel image",
    "resources": "what the session asks for: cpu (cores), mem (bytes or e.g. 1g), gpu",
    "resource_group": "where it runs (default: the default resource group)",
    "cluster_size": "kernels in the session",
    "cluster_mode": "single-node: all kernels on one agent; multi-node: spread",
    "priority": "higher starts first (up to the policy's max_priority)",
    "startup_command": "the command the batch session runs",
    "batch_timeout": "seconds before the batch command is stopped (null: none)",
    "starts_at": "do not start before this time (ISO 8601)",
    "dependencies": "sessions (ids) that must finish successfully first",
    "usage_mode": "what the folder holds",
    "permission": "ro (read), rw (read and write), wd (read, write, delete)",
    "total_resource_slots": "resources it may hold at once",
}


def load_document() -> dict:
    with open(PATH, encoding="utf-8") as f:
        return yaml.safe_load(f)
