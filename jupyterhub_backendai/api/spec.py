"""The OpenAPI 3.1 document of the admin API, built from one table of routes.

``openapi.yaml`` beside this module is the contract: the hub serves it at
``/hub/api/backendai/openapi.json``, request bodies are validated against its
schemas, and the tests fuzz the running hub against it. It is generated from
this module so that paths, parameters and schemas cannot drift apart::

    python -m jupyterhub_backendai.api.spec --write

and a test fails when the committed file differs from what this module builds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

from ..common.slots import MIG_PROFILE_WORDS, MIG_SLOT_PATTERN, SLOT_NAME_PATTERN, SLOT_NAMES_WORDS
from ..common.types import (
    SessionStatus,
    UserRole,
    UserStatus,
    VFolderOwnership,
    VFolderPermission,
    VFolderStatus,
)
from ..manager.admin import KNOWN_SCHEDULERS
from ..manager.vfolders import MAX_PATH, USAGE_MODES

PATH = os.path.join(os.path.dirname(__file__), "openapi.yaml")
PREFIX = "/hub/api/backendai"
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
INT32 = 2**31 - 1
INT64 = 2**63 - 1

# -- schema pieces ---------------------------------------------------------------


def _str(max_len: int = 64, **kw) -> dict:
    return {"type": "string", "maxLength": max_len, **kw}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def _int(lo: int = 0, hi: int = INT32) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


NAME = {"type": "string", "minLength": 1, "maxLength": 64,
        "pattern": "^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$"}
ID = _str(32)
TIME = {"type": "string", "format": "date-time"}
BOOL = {"type": "boolean"}
TEXT = _str(512)
AMOUNT = {"anyOf": [_str(32), {"type": "number"}]}
# Slot names (cpu, mem, cuda.device, cuda.mig-<profile>); x-message: the pattern in words.
SLOT_NAME = {"type": "string", "pattern": SLOT_NAME_PATTERN,
             "x-message": "slot names must be " + SLOT_NAMES_WORDS}
RESOURCE_NAME = {"type": "string",
                 "pattern": "^(?:cpu|mem|gpu|" + MIG_SLOT_PATTERN[1:-1] + ")$",
                 "x-message": "resources are cpu, mem, gpu or cuda.mig-<profile> (" +
                              MIG_PROFILE_WORDS + ")"}
SLOTS_IN = {
    "type": "object",
    "description": "Resource slots: cpu (cores), mem (bytes, or a size such as 4g), "
                   "cuda.device (GPUs), cuda.mig-<profile> (MIG instances of that profile, "
                   "e.g. cuda.mig-1g.10gb; whole numbers). Amounts as decimal strings or "
                   "numbers.",
    "propertyNames": SLOT_NAME,
    "additionalProperties": AMOUNT,
}
SLOTS_OUT = {"type": "object", "additionalProperties": {"type": "string"},
             "description": "Resource slots as exact decimal strings."}
VFOLDER_HOSTS = {"type": "object", "maxProperties": 64,
                 "additionalProperties": {"type": "array", "maxItems": 32, "items": _str(64)}}
STRINGS = {"type": "array", "maxItems": 256, "items": _str(64)}
IDS = {"type": "array", "maxItems": 500, "items": ID}
# One '.' may come first: such folders are mounted into every session of their owner.
VFOLDER_NAME = {"type": "string", "minLength": 1, "maxLength": 64,
                "pattern": "^\\.?[A-Za-z0-9][A-Za-z0-9._-]*$"}
FILE_PATH = {"type": "string", "minLength": 1, "maxLength": MAX_PATH,
             "description": "relative to the folder's root; no '..'"}


def _obj(props: dict, required=(), *, closed: bool = True) -> dict:
    out = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    return out


def _out(props: dict) -> dict:
    """A response object: every listed property is always present."""
    return {"type": "object", "properties": props, "required": list(props)}


DOMAIN_W = {
    "description": TEXT, "is_active": BOOL, "total_resource_slots": SLOTS_IN,
    "allowed_vfolder_hosts": VFOLDER_HOSTS, "allowed_docker_registries": STRINGS,
}
PROJECT_W = {
    "name": NAME, "description": TEXT, "is_active": BOOL, "total_resource_slots": SLOTS_IN,
    "allowed_vfolder_hosts": VFOLDER_HOSTS, "resource_policy": _nullable(_str(64)),
}
USER_W = {
    "email": _str(128, minLength=3), "password": _str(72, minLength=8),
    "full_name": _str(128), "status": {"enum": list(UserStatus)}, "role": {"enum": list(UserRole)},
    "domain_name": _str(64), "resource_policy": _nullable(_str(64)),
    "need_password_change": BOOL,
    "allowed_client_ip": _nullable({"type": "array", "maxItems": 64, "items": _str(64)}),
    "project_ids": IDS,
}
KEYPAIR_W = {"is_active": BOOL, "rate_limit": _int(), "resource_policy": _str(64),
             "is_admin": BOOL}
KP_POLICY_W = {
    "total_resource_slots": SLOTS_IN,
    "default_for_unspecified": {"enum": ["UNLIMITED", "LIMITED"]},
    "max_concurrent_sessions": _int(), "max_containers_per_session": _int(),
    "max_session_lifetime": _int(), "idle_timeout": _int(), "max_priority": _int(0, 100),
    "max_pending_session_count": _nullable(_int()),
    "max_pending_session_resource_slots": _nullable(SLOTS_IN),
    "allowed_vfolder_hosts": VFOLDER_HOSTS,
}
QUOTA_POLICY_W = {"max_vfolder_count": _int(), "max_quota_scope_size": _int(0, INT64)}
GROUP_W = {
    "description": TEXT, "is_active": BOOL, "is_public": BOOL,
    "scheduler": {"enum": list(KNOWN_SCHEDULERS)},
    "scheduler_opts": {"type": "object", "maxProperties": 32},
    "allowed_domains": STRINGS, "allowed_projects": IDS,
    "allowed_keypairs": {"type": "array", "maxItems": 500, "items": _str(20)},
}

SCHEMAS: dict[str, dict] = {
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details; every error has this body.",
        "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                       "status": {"type": "integer"}, "detail": {"type": "string"}},
        "required": ["type", "title", "status", "detail"],
    },
    "Domain": _out({
        "name": {"type": "string"}, "description": {"type": "string"}, "is_active": BOOL,
        "total_resource_slots": SLOTS_OUT, "allowed_vfolder_hosts": {"type": "object"},
        "allowed_docker_registries": {"type": "array", "items": {"type": "string"}},
        "created_at": TIME,
    }),
    "DomainCreate": _obj({"name": NAME, **DOMAIN_W}, ["name"]),
    "DomainUpdate": _obj(DOMAIN_W),
    "Project": _out({
        "id": {"type": "string"}, "name": {"type": "string"}, "domain_name": {"type": "string"},
        "description": {"type": "string"}, "is_active": BOOL, "total_resource_slots": SLOTS_OUT,
        "allowed_vfolder_hosts": {"type": "object"},
        "resource_policy": {"type": ["string", "null"]}, "created_at": TIME,
    }),
    "ProjectCreate": _obj({**PROJECT_W, "domain_name": _str(64)}, ["name"]),
    "ProjectUpdate": _obj(PROJECT_W),
    "MembersAdd": _obj({"user_ids": {**IDS, "minItems": 1}}, ["user_ids"]),
    "MembersChanged": _out({
        "project_id": {"type": "string"}, "group": {"type": "string"},
        "added": {"type": "array", "items": {"type": "string"},
                  "description": "usernames that became members"},
        "user_ids": {"type": "array", "items": {"type": "string"}},
    }),
    "User": _out({
        "id": {"type": "string"}, "email": {"type": "string"}, "username": {"type": "string"},
        "full_name": {"type": "string"}, "status": {"enum": list(UserStatus)},
        "role": {"enum": list(UserRole)}, "domain_name": {"type": "string"},
        "resource_policy": {"type": ["string", "null"]}, "need_password_change": BOOL,
        "allowed_client_ip": {"type": ["array", "null"], "items": {"type": "string"}},
        "project_ids": {"type": "array", "items": {"type": "string"}}, "created_at": TIME,
    }),
    "UserCreate": _obj({**USER_W, "username": {**_str(64), "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$"}},
                       ["email", "password"]),
    "UserCreated": {"allOf": [_ref("User"), _out({"keypair": _out({
        "access_key": {"type": "string"}, "secret_key": {"type": "string"}})})]},
    "UserUpdate": _obj(USER_W),
    "Keypair": _out({
        "access_key": {"type": "string"}, "user_id": {"type": "string"}, "is_active": BOOL,
        "is_admin": BOOL, "is_default": BOOL, "rate_limit": {"type": "integer"},
        "num_queries": {"type": "integer"}, "last_used": {"type": ["string", "null"]},
        "resource_policy": {"type": "string"}, "created_at": TIME,
    }),
    "KeypairCreate": _obj({"user_id": ID, **KEYPAIR_W}),
    "KeypairCreated": {"allOf": [_ref("Keypair"), _out({"secret_key": {
        "type": "string", "description": "shown in this response only"}})]},
    "KeypairUpdate": _obj({**KEYPAIR_W, "is_default": BOOL}),
    "KeypairResourcePolicy": _out({
        "name": {"type": "string"}, "total_resource_slots": SLOTS_OUT,
        "default_for_unspecified": {"type": "string"},
        **{k: {"type": "integer"} for k in ("max_concurrent_sessions", "max_containers_per_session",
                                            "max_session_lifetime", "idle_timeout", "max_priority")},
        "max_pending_session_count": {"type": ["integer", "null"]},
        "max_pending_session_resource_slots": {"anyOf": [SLOTS_OUT, {"type": "null"}]},
        "allowed_vfolder_hosts": {"type": "object"}, "created_at": TIME,
    }),
    "KeypairResourcePolicyCreate": _obj({"name": NAME, **KP_POLICY_W}, ["name"]),
    "KeypairResourcePolicyUpdate": _obj(KP_POLICY_W),
    "QuotaPolicy": _out({
        "name": {"type": "string"}, "max_vfolder_count": {"type": "integer"},
        "max_quota_scope_size": {"type": "integer"}, "created_at": TIME,
    }),
    "QuotaPolicyCreate": _obj({"name": NAME, **QUOTA_POLICY_W}, ["name"]),
    "QuotaPolicyUpdate": _obj(QUOTA_POLICY_W),
    "ResourceGroup": _out({
        "name": {"type": "string"}, "description": {"type": "string"}, "is_active": BOOL,
        "is_public": BOOL, "scheduler": {"type": "string"}, "scheduler_opts": {"type": "object"},
        **{k: {"type": "array", "items": {"type": "string"}}
           for k in ("allowed_domains", "allowed_projects", "allowed_keypairs")},
        "created_at": TIME,
    }),
    "ResourceGroupCreate": _obj({"name": NAME, **GROUP_W}, ["name"]),
    "ResourceGroupUpdate": _obj(GROUP_W),
    "Agent": _out({
        "id": {"type": "string"}, "status": {"type": "string"},
        "resource_group": {"type": "string"}, "addr": {"type": "string"},
        "architecture": {"type": "string"}, "backend": {"type": "string"},
        "available_slots": SLOTS_OUT, "occupied_slots": SLOTS_OUT, "schedulable": BOOL,
        "version": {"type": "string"}, "first_contact": TIME, "last_heartbeat": TIME,
    }),
    "Kernel": _out({
        "id": {"type": "string"}, "cluster_role": {"type": "string"},
        "cluster_idx": {"type": "integer"}, "cluster_hostname": {"type": "string"},
        "agent_id": {"type": ["string", "null"]}, "status": {"type": "string"},
        "exit_code": {"type": ["integer", "null"]},
    }),
    "Session": _out({
        "id": {"type": "string"}, "name": {"type": "string"}, "type": {"type": "string"},
        "user_id": {"type": "string"}, "access_key": {"type": "string"},
        "domain_name": {"type": "string"}, "project_id": {"type": ["string", "null"]},
        "resource_group": {"type": "string"}, "image": {"type": "string"},
        "cluster_size": {"type": "integer"}, "cluster_mode": {"type": "string"},
        "priority": {"type": "integer"}, "requested_slots": SLOTS_OUT,
        "status": {"enum": list(SessionStatus)}, "status_info": {"type": "string"},
        "result": {"type": "string"}, "startup_command": {"type": ["string", "null"]},
        "batch_timeout": {"type": ["integer", "null"]}, "starts_at": {"type": ["string", "null"]},
        "architecture": {"type": ["string", "null"]},
        "designated_agents": {"type": "array", "items": {"type": "string"}},
        "dependencies": {"type": "array", "items": {"type": "string"}},
        "created_at": TIME, "terminated_at": {"type": ["string", "null"]},
        "kernels": {"type": "array", "items": _ref("Kernel")},
        "vfolder_mounts": {"type": "array", "items": _out({
            "id": {"type": "string"}, "name": {"type": "string"}, "host": {"type": "string"},
            "permission": {"type": "string"}, "target": {"type": "string"}})},
    }),
    "SessionCreate": _obj({
        "name": NAME,
        "image": _str(512, minLength=1),
        "resources": {**_obj({"cpu": AMOUNT, "mem": AMOUNT, "gpu": AMOUNT}, closed=False),
                      "propertyNames": RESOURCE_NAME, "additionalProperties": AMOUNT,
                      "description": "cpu (cores), mem (a size such as 4g), gpu (whole "
                                     "GPUs), cuda.mig-<profile> (whole MIG instances of "
                                     "that profile, e.g. cuda.mig-1g.10gb)"},
        "resource_group": _str(64),
        "type": {"enum": ["batch"], "description":
                 "API sessions are batch sessions; interactive sessions are JupyterHub servers."},
        "project": _str(64, description="project id or name in the caller's domain"),
        "cluster_size": _int(1, 16),
        "cluster_mode": {"enum": ["single-node", "multi-node"]},
        "priority": _int(0, 100),
        "startup_command": _str(8192, minLength=1),
        "batch_timeout": _nullable(_int(1)),
        "starts_at": _nullable(TIME),
        "dependencies": {"type": "array", "maxItems": 64, "items": ID},
        "mounts": {"type": "array", "maxItems": 64, "items": _str(64, minLength=1),
                   "description": "vfolders (names or ids) mounted at /home/work/<name>"},
    }, ["name", "image", "startup_command"]),
    "SessionLogs": _out({
        "session_id": {"type": "string"}, "status": {"type": "string"},
        "kernels": {"type": "array", "items": _out({
            "id": {"type": "string"}, "cluster_hostname": {"type": "string"},
            "logs": {"type": ["string", "null"]}})},
    }),
    "SessionServicePorts": _out({
        "session_id": {"type": "string"}, "status": {"type": "string"},
        "server_url": {"type": ["string", "null"], "description":
                       "the session's Jupyter server (null: a batch session serves nothing)"},
        "adhoc_url_template": {"type": ["string", "null"], "description":
                               "any other port: replace {port} (jupyter-server-proxy)"},
        "service_ports": {"type": "array", "items": {
            "type": "object", "required": ["name", "protocol", "container_port", "url"],
            "properties": {
                "name": {"type": "string"}, "protocol": {"type": "string"},
                "container_port": {"type": "integer"},
                "url": {"type": ["string", "null"],
                        "description": "where the app answers, behind the hub's login "
                                       "(null: not an HTTP port)"},
                "host": {"type": "string", "description": "tcp ports the agent published "
                         "(sshd, sftp; opt-in per resource group): the node's address"},
                "port": {"type": "integer", "description": "tcp ports: the host port"}}}},
    }),
    "SessionSSHKey": _out({
        "session_id": {"type": "string"},
        "access_key": {"type": "string", "description": "the keypair the key derives from"},
        "user": {"type": "string"}, "host": {"type": "string"}, "port": {"type": "integer"},
        "public_key": {"type": "string"},
        "private_key": {"type": "string", "description": "OpenSSH format, unencrypted"},
    }),
    "Whoami": _out({
        "user": _ref("User"), "role": {"enum": list(UserRole)}, "domain": _ref("Domain"),
        "projects": {"type": "array", "items": _ref("Project")},
        "keypair": {"type": ["string", "null"],
                    "description": "access key that signed the request, if any"},
    }),
    "SchedulerStatus": {"type": "object",
                        "description": "per resource group: the queue and what the scheduler did"},
    "VFolder": _out({
        "id": {"type": "string"}, "name": {"type": "string"}, "host": {"type": "string"},
        "quota_scope_id": {"type": "string"},
        "ownership_type": {"enum": list(VFolderOwnership)},
        "user_id": {"type": ["string", "null"]}, "project_id": {"type": ["string", "null"]},
        "domain_name": {"type": "string"}, "creator": {"type": "string"},
        "usage_mode": {"type": "string"},
        "permission": {"enum": list(VFolderPermission),
                       "description": "the owner's (user folder) or every member's (project)"},
        "status": {"enum": list(VFolderStatus)},
        "my_permission": {"anyOf": [{"enum": list(VFolderPermission)}, {"type": "null"}],
                          "description": "what the caller may do with the files (null: nothing)"},
        "created_at": TIME,
    }),
    "VFolderCreate": _obj({
        "name": VFOLDER_NAME,
        "host": _str(128, minLength=1, description="<storage proxy>:<volume>; default: the "
                     "hub's default_vfolder_host"),
        "project": _str(64, minLength=1, description="project id or name (in the caller's "
                        "domain): a project folder (domain admins)"),
        "permission": {"enum": list(VFolderPermission),
                       "description": "project folders only: what every member may do"},
        "usage_mode": {"enum": list(USAGE_MODES)},
    }, ["name"]),
    "VFolderUpdate": _obj({
        "name": VFOLDER_NAME,
        "permission": {"enum": list(VFolderPermission), "description": "project folders only"},
        "usage_mode": {"enum": list(USAGE_MODES)},
    }),
    "VFolderShare": _out({
        "vfolder_id": {"type": "string"}, "user_id": {"type": "string"},
        "email": {"type": ["string", "null"]}, "permission": {"enum": list(VFolderPermission)},
        "created_at": TIME,
    }),
    "VFolderShareCreate": _obj({
        "email": _str(128, minLength=3, description="a user of the folder's domain"),
        "permission": {"enum": list(VFolderPermission)},
    }, ["email"]),
    "VFolderShareUpdate": _obj({"permission": {"enum": list(VFolderPermission)}},
                               ["permission"]),
    "VFolderInvitation": _out({
        "id": {"type": "string"}, "vfolder_id": {"type": "string"},
        "vfolder_name": {"type": ["string", "null"]},
        "inviter": {"type": ["string", "null"]}, "inviter_id": {"type": "string"},
        "invitee": {"type": ["string", "null"]}, "invitee_id": {"type": "string"},
        "permission": {"enum": list(VFolderPermission)},
        "state": {"enum": ["pending", "accepted", "rejected", "canceled"]},
        "created_at": TIME, "modified_at": {"anyOf": [TIME, {"type": "null"}]},
    }),
    "VFolderInvitationCreate": _obj({
        "email": _str(128, minLength=3, description="a user of the folder's domain"),
        "permission": {"enum": list(VFolderPermission)},
    }, ["email"]),
    "VFolderFiles": _out({
        "path": {"type": "string"},
        "items": {"type": "array", "items": _out({
            "name": {"type": "string"}, "type": {"enum": ["file", "dir", "symlink", "other"]},
            "size": {"type": "integer"},
            "mtime": {"type": "number", "description": "seconds since the epoch"}})},
    }),
    "VFolderMkdir": _obj({"path": FILE_PATH, "parents": {
        **BOOL, "description": "also the missing directories above it, and an existing "
        "directory is no error (mkdir -p)"}}, ["path"]),
    "VFolderRename": _obj({"path": FILE_PATH,
                           "new_path": {**FILE_PATH, "description": "where it goes, relative "
                                        "to the folder's root"}}, ["path", "new_path"]),
    "VFolderFileDone": _out({"path": {"type": "string"}, "size": {"type": "integer"}}),
    "VFolderPath": _out({"path": {"type": "string"}}),
    "VFolderHosts": _out({
        "default": {"type": "string"},
        "allowed": {"type": "array", "items": {"type": "string"},
                    "description": "hosts where the caller has at least one permission"},
        "hosts": {"type": "object", "additionalProperties": _out({
            "permissions": {"type": "array", "items": {"type": "string"}},
            "volume": {"type": "object"}})},
    }),
}


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
PATTERN_WORDS = {
    "^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$":
        "must be 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter or digit",
    "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$":
        "must be 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter or digit",
    "^\\.?[A-Za-z0-9][A-Za-z0-9._-]*$":
        "must be 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter or digit "
        "or with one '.' before it (a folder mounted into every session of its owner)",
    "^[a-z0-9][a-z0-9._-]{0,63}$":
        "must be 1 to 64 lower-case letters, digits, '.', '_' or '-', beginning with a "
        "letter or digit",
}

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
            "schemas": _with_words(SCHEMAS),
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
