"""The OpenAPI 3.1 document of the admin API, built from the typed contract.

``openapi.yaml`` beside this module is the contract as served: the hub serves it at
``/hub/api/backendai/openapi.json`` and the tests fuzz the running hub against it. It is
generated, never written by hand::

    python -m jupyterhub_backendai.api.spec --write

Its component schemas are the pydantic models of :mod:`.models` (which also validate the
request bodies, so the document and the validation cannot differ); its paths are the
declared operations; a test fails when the committed file differs from what this module
builds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

from ..common.types import SessionStatus, UserRole, UserStatus, VFolderOwnership, VFolderStatus
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


# -- routes ----------------------------------------------------------------------
#
# One row per operation: (method, path, operationId, summary, filters or None,
# request schema or None, success status, response schema or None). A list
# operation is one with filters (a dict, possibly empty): it is paginated.

F_BOOL = {"type": "boolean"}
F_STR = _str(128)
POLICY_KINDS = {"keypair": "KeypairResourcePolicy", "user": "QuotaPolicy",
                "project": "QuotaPolicy"}

ROUTES: list[tuple] = [
    ("get", "/whoami", "whoami", "The caller: user, role, domain, projects, keypair", None, None,
     200, "Whoami"),
    ("get", "/domains", "listDomains", "Domains the caller sees", {"is_active": F_BOOL}, None,
     200, "Domain"),
    ("post", "/domains", "createDomain", "Create a domain (superadmin)", None, "DomainCreate",
     201, "Domain"),
    ("get", "/domains/{name}", "getDomain", "One domain", None, None, 200, "Domain"),
    ("patch", "/domains/{name}", "updateDomain", "Change a domain (superadmin)", None,
     "DomainUpdate", 200, "Domain"),
    ("delete", "/domains/{name}", "deleteDomain", "Delete an empty domain (superadmin)", None,
     None, 204, None),
    ("get", "/projects", "listProjects", "Projects the caller sees",
     {"domain": F_STR, "name": F_STR, "is_active": F_BOOL}, None, 200, "Project"),
    ("post", "/projects", "createProject", "Create a project", None, "ProjectCreate", 201,
     "Project"),
    ("get", "/projects/{id}", "getProject", "One project", None, None, 200, "Project"),
    ("patch", "/projects/{id}", "updateProject", "Change a project", None, "ProjectUpdate", 200,
     "Project"),
    ("delete", "/projects/{id}", "deleteProject", "Delete a project without sessions", None, None,
     204, None),
    ("get", "/projects/{id}/members", "listProjectMembers", "Members of a project", {}, None, 200,
     "User"),
    ("post", "/projects/{id}/members", "addProjectMembers", "Add users of the project's domain",
     None, "MembersAdd", 200, "MembersChanged"),
    ("delete", "/projects/{id}/members/{user_id}", "removeProjectMember", "Remove a member",
     None, None, 204, None),
    ("get", "/users", "listUsers", "Users the caller sees",
     {"domain": F_STR, "role": {"enum": list(UserRole)}, "status": {"enum": list(UserStatus)},
      "project": F_STR, "email": F_STR}, None, 200, "User"),
    ("post", "/users", "createUser", "Create a user and its default keypair", None, "UserCreate",
     201, "UserCreated"),
    ("get", "/users/{id}", "getUser", "One user", None, None, 200, "User"),
    ("patch", "/users/{id}", "updateUser", "Change a user", None, "UserUpdate", 200, "User"),
    ("delete", "/users/{id}", "deleteUser", "Delete a user without sessions", None, None, 204,
     None),
    ("get", "/keypairs", "listKeypairs", "Keypairs the caller sees (never their secret keys)",
     {"user_id": F_STR, "is_active": F_BOOL}, None, 200, "Keypair"),
    ("post", "/keypairs", "createKeypair", "Create a keypair; the secret key is shown once",
     None, "KeypairCreate", 201, "KeypairCreated"),
    ("get", "/keypairs/{access_key}", "getKeypair", "One keypair", None, None, 200, "Keypair"),
    ("patch", "/keypairs/{access_key}", "updateKeypair", "Change or deactivate a keypair", None,
     "KeypairUpdate", 200, "Keypair"),
    ("delete", "/keypairs/{access_key}", "deleteKeypair", "Delete a keypair without sessions",
     None, None, 204, None),
]
for _kind, _schema in POLICY_KINDS.items():
    _base = f"/{_kind}-resource-policies"
    _Op = _kind.capitalize() + "ResourcePolicy"
    _create = "KeypairResourcePolicyCreate" if _kind == "keypair" else "QuotaPolicyCreate"
    _update = "KeypairResourcePolicyUpdate" if _kind == "keypair" else "QuotaPolicyUpdate"
    ROUTES += [
        ("get", _base, f"list{_Op}s", f"{_kind.capitalize()} resource policies", {}, None, 200,
         _schema),
        ("post", _base, f"create{_Op}", f"Create a {_kind} resource policy (superadmin)", None,
         _create, 201, _schema),
        ("get", _base + "/{name}", f"get{_Op}", f"One {_kind} resource policy", None, None, 200,
         _schema),
        ("patch", _base + "/{name}", f"update{_Op}", f"Change a {_kind} resource policy", None,
         _update, 200, _schema),
        ("delete", _base + "/{name}", f"delete{_Op}", f"Delete an unused {_kind} resource policy",
         None, None, 204, None),
    ]
ROUTES += [
    ("get", "/resource-groups", "listResourceGroups", "Resource groups the caller may use",
     {"is_active": F_BOOL}, None, 200, "ResourceGroup"),
    ("post", "/resource-groups", "createResourceGroup", "Create a resource group (superadmin)",
     None, "ResourceGroupCreate", 201, "ResourceGroup"),
    ("get", "/resource-groups/{name}", "getResourceGroup", "One resource group", None, None, 200,
     "ResourceGroup"),
    ("patch", "/resource-groups/{name}", "updateResourceGroup", "Change a resource group", None,
     "ResourceGroupUpdate", 200, "ResourceGroup"),
    ("delete", "/resource-groups/{name}", "deleteResourceGroup",
     "Delete a resource group without agents or sessions", None, None, 204, None),
    ("get", "/agents", "listAgents", "Agents of the resource groups the caller may use",
     {"resource_group": F_STR, "status": F_STR}, None, 200, "Agent"),
    ("get", "/agents/{id}", "getAgent", "One agent", None, None, 200, "Agent"),
    ("get", "/sessions", "listSessions", "Sessions the caller sees",
     {"status": {"enum": list(SessionStatus)}, "user_id": F_STR, "project_id": F_STR,
      "type": {"enum": ["interactive", "batch"]}}, None, 200, "Session"),
    ("post", "/sessions", "createSession", "Queue a batch session for the caller", None,
     "SessionCreate", 201, "Session"),
    ("get", "/sessions/{id}", "getSession", "One session", None, None, 200, "Session"),
    ("delete", "/sessions/{id}", "deleteSession", "Stop a session and free its slots", None, None,
     204, None),
    ("get", "/sessions/{id}/logs", "getSessionLogs", "Output of a session's kernels", None, None,
     200, "SessionLogs"),
    ("get", "/sessions/{id}/service-ports", "getSessionServicePorts",
     "A session's service ports (apps) with their URLs", None, None, 200, "SessionServicePorts"),
    ("get", "/sessions/{id}/ssh-key", "getSessionSSHKey",
     "The owner's key to the session's sshd (resource groups with SSH)", None, None, 200,
     "SessionSSHKey"),
    ("get", "/scheduler", "schedulerStatus", "What the scheduler is doing (admins)", None, None,
     200, "SchedulerStatus"),
    ("get", "/vfolder-hosts", "listVFolderHosts", "Storage hosts the caller may use, and for what",
     None, None, 200, "VFolderHosts"),
    ("get", "/vfolders", "listVFolders",
     "Folders the caller sees: own, shared with them, their projects' (admins: the domain's)",
     {"name": F_STR, "host": F_STR, "ownership_type": {"enum": list(VFolderOwnership)},
      "project_id": F_STR, "user_id": F_STR, "status": {"enum": list(VFolderStatus)}},
     None, 200, "VFolder"),
    ("post", "/vfolders", "createVFolder", "Create a user folder, or a project folder (admins)",
     None, "VFolderCreate", 201, "VFolder"),
    ("get", "/vfolders/{id}", "getVFolder", "One folder", None, None, 200, "VFolder"),
    ("patch", "/vfolders/{id}", "updateVFolder", "Rename a folder or change a project folder's "
     "permission", None, "VFolderUpdate", 200, "VFolder"),
    ("delete", "/vfolders/{id}", "deleteVFolder", "Delete a folder and its files (not while a "
     "live session mounts it)", None, None, 204, None),
    ("get", "/vfolders/{id}/shares", "listVFolderShares", "Users a folder is shared with", {},
     None, 200, "VFolderShare"),
    ("post", "/vfolders/{id}/shares", "shareVFolder", "Share a user folder with a user of its "
     "domain (owner)", None, "VFolderShareCreate", 201, "VFolderShare"),
    ("patch", "/vfolders/{id}/shares/{user}", "updateVFolderShare", "Change a share's permission",
     None, "VFolderShareUpdate", 200, "VFolderShare"),
    ("delete", "/vfolders/{id}/shares/{user}", "unshareVFolder",
     "Unshare (owner), or leave a folder shared with you", None, None, 204, None),
    ("get", "/vfolders/{id}/files", "listVFolderFiles", "Entries of a directory in a folder",
     None, None, 200, "VFolderFiles"),
    ("delete", "/vfolders/{id}/files", "deleteVFolderFiles", "Delete a file or directory (wd)",
     None, None, 204, None),
    ("put", "/vfolders/{id}/upload", "uploadVFolderFile", "Write a file (the request body, "
     "streamed; rw or wd)", None, None, 201, "VFolderFileDone"),
    ("get", "/vfolders/{id}/download", "downloadVFolderFile", "Read a file (streamed)", None,
     None, 200, None),
    ("post", "/vfolders/{id}/mkdir", "mkdirVFolder", "Make a directory (rw or wd)", None,
     "VFolderMkdir", 201, "VFolderPath"),
    ("post", "/vfolders/{id}/rename", "renameVFolderFile", "Move or rename a file or directory "
     "(rw or wd)", None, "VFolderRename", 200, "VFolderPath"),
    ("post", "/vfolders/{id}/invitations", "inviteToVFolder", "Invite a user of its domain to "
     "a user folder (owner); the folder is shared once they accept", None,
     "VFolderInvitationCreate", 201, "VFolderInvitation"),
    ("get", "/vfolder-invitations", "listVFolderInvitations",
     "The caller's pending invitations (received)", {}, None, 200, "VFolderInvitation"),
    ("post", "/vfolder-invitations/{id}/accept", "acceptVFolderInvitation",
     "Accept an invitation (the invitee): the folder is shared with its permission", None,
     None, 200, "VFolderInvitation"),
    ("post", "/vfolder-invitations/{id}/decline", "declineVFolderInvitation",
     "Decline an invitation (the invitee), or withdraw it (the inviter)", None, None, 200,
     "VFolderInvitation"),
]
# Query parameters of operations that are not lists: (method, path) -> {name: (schema, required)}.
PARAMS: dict[tuple[str, str], dict[str, tuple[dict, bool]]] = {
    ("get", "/vfolders/{id}/files"): {"path": (_str(MAX_PATH), False)},
    ("delete", "/vfolders/{id}/files"): {"path": (FILE_PATH, True), "recursive": (BOOL, False)},
    ("put", "/vfolders/{id}/upload"): {"path": (FILE_PATH, True)},
    ("get", "/vfolders/{id}/download"): {"path": (FILE_PATH, True)},
}
# Operations whose request or success response is a byte stream, not JSON.
RAW_BODY = {("put", "/vfolders/{id}/upload")}
RAW_RESPONSE = {("get", "/vfolders/{id}/download")}
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


def _with_words(schema, field: str | None = None):
    """A copy of ``schema`` with ``x-message`` on every pattern and a description on
    every named property (shared pieces such as NAME are copied, never changed)."""
    if isinstance(schema, list):
        return [_with_words(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: _with_words(sub, name) for name, sub in value.items()}
        else:
            out[key] = _with_words(value)
    if "pattern" in out and "x-message" not in out and out["pattern"] in PATTERN_WORDS:
        out["x-message"] = PATTERN_WORDS[out["pattern"]]
    if field is not None and "description" not in out and "$ref" not in out \
            and field in FIELD_DESCRIPTIONS:
        out["description"] = FIELD_DESCRIPTIONS[field]
    return out


def build_document() -> dict:
    paths: dict[str, dict] = {}
    for method, path, op_id, summary, filters, body, status, resp in ROUTES:
        params = _path_params(path)
        if filters is not None:
            params += [_param("offset", _int(0, INT32)),
                       _param("limit", _int(1, MAX_LIMIT))]
            params += [_param(k, v) for k, v in filters.items()]
        params += [_param(k, v, required=req) for k, (v, req) in PARAMS.get((method, path), {}).items()]
        op: dict = {"operationId": op_id, "summary": summary,
                    "tags": [path.split("/")[1]]}
        if params:
            op["parameters"] = params
        if body:
            op["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": _ref(body)}}}
        if (method, path) in RAW_BODY:
            op["requestBody"] = {"required": True, "content": {
                "application/octet-stream": {"schema": BINARY}}}
        responses: dict = {}
        if (method, path) in RAW_RESPONSE:
            responses[str(status)] = {"description": "The file's bytes", "content": {
                "application/octet-stream": {"schema": BINARY}}}
        elif resp is None:
            responses[str(status)] = {"description": "Done"}
        else:
            schema = _page_schema(resp) if filters is not None else _ref(resp)
            responses[str(status)] = {"description": "OK",
                                      "content": {"application/json": {"schema": schema}}}
        for code in ERRORS:
            responses[str(code)] = {"$ref": f"#/components/responses/E{code}"}
        op["responses"] = responses
        paths.setdefault(path, {})[method] = op
    paths["/openapi.json"] = {"get": {
        "operationId": "openapi", "summary": "This document", "tags": ["meta"], "security": [],
        "responses": {"200": {"description": "The OpenAPI document",
                              "content": {"application/json": {"schema": {"type": "object"}}}}},
    }}
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "jupyterhub-backendai admin API",
            "version": "1.0.0",
            "description": "Tenancy (domains, projects, users, keypairs, resource policies), "
                           "resource groups, agents, sessions and virtual folders of a "
                           "jupyterhub-backendai hub. "
                           "See docs/api.md.",
        },
        "servers": [{"url": PREFIX, "description": "on a hub whose base_url is /"}],
        "security": [{"jupyterhubToken": []}, {"backendaiSignature": []}, {"hubCookie": []}],
        "paths": paths,
        "components": {
            "schemas": _with_words(models.component_schemas()),
            "responses": {
                f"E{code}": {"description": text, "content": {
                    "application/problem+json": {"schema": _ref("Problem")}}}
                for code, text in ERRORS.items()
            },
            "securitySchemes": {
                "jupyterhubToken": {"type": "apiKey", "in": "header", "name": "Authorization",
                                    "description": "Authorization: token <JupyterHub API token> "
                                    "(needs the custom:backendai:read / :write scopes)"},
                "backendaiSignature": {"type": "apiKey", "in": "header", "name": "Authorization",
                                       "description": "Authorization: BackendAI "
                                       "signMethod=HMAC-SHA256, credential=<access key>:<signature>"},
                "hubCookie": {"type": "apiKey", "in": "cookie", "name": "jupyterhub-session-id",
                              "description": "The browser's hub login (XSRF rules apply)"},
            },
        },
    }
    # Plain data only: no shared objects (YAML aliases), enums as their strings.
    return json.loads(json.dumps(doc))


def dump(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)


def load_document() -> dict:
    with open(PATH, encoding="utf-8") as f:
        return yaml.safe_load(f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write or check the admin API's openapi.yaml.")
    ap.add_argument("--write", action="store_true", help=f"write {PATH}")
    args = ap.parse_args(argv)
    text = dump(build_document())
    if args.write:
        with open(PATH, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
