"""The part of Backend.AI's GraphQL schema (``POST /admin/gql``) the 23.09 CLI's
session and folder commands use: ``keypair``, ``compute_session``,
``compute_session_list``, ``vfolder_list``; the admin commands' queries, and their
mutations for domains (add, update, delete = deactivate, purge), groups (projects: add,
update, delete = deactivate, purge, add-users, remove-users), users (add, update,
delete = status deleted, purge), keypairs (add, update, activate, deactivate, delete),
keypair resource policies and scaling groups (resource groups; add, update, delete,
associate with and dissociate from domains, groups and keypairs). Parsed, validated and
executed by graphql-core (the pinned 3.3); every field is resolved from the same manager
functions and access filters as the REST API (what a caller sees here is what
``GET /sessions`` and ``GET /vfolders`` show them). Mutations that JupyterHub mirrors
(groups, admin flags, deactivations, deleted accounts) go through ``api/hubsync.py``,
as the REST handlers do: the record in the request's transaction, the hub's part after
it committed. Fields the client parses as JSON strings (slots, status data) are sent as
JSON strings.
"""

from __future__ import annotations

import json
import logging
import uuid

from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    OperationDefinitionNode,
    OperationType,
    Visitor,
    build_schema,
    execute_sync,
    parse,
    validate,
    visit,
)
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from ...common.errors import BackendAIError, InvalidRequest
from ...common.types import SessionStatus
from ...manager import access, admin, vfolders
from ...models import Keypair, Session, VFolder
from .. import hubsync
from ..base import _check_text

SDL = """
scalar UUID

type KeyPair {
  user_id: String
  access_key: String
  secret_key: String
  is_active: Boolean
  is_admin: Boolean
  resource_policy: String
  rate_limit: Int
  created_at: String
  modified_at: String
  last_used: String
  concurrency_used: Int
  num_queries: Int
  projects: [String]
  user_info: UserInfo
}

type Dependency { id: UUID name: String status: String }

type Container {
  id: UUID
  cluster_role: String
  cluster_idx: Int
  cluster_hostname: String
  session_id: UUID
  image: String
  registry: String
  status: String
  status_info: String
  status_data: String
  status_changed: String
  agent: String
  container_id: String
  resource_opts: String
  occupied_slots: String
  preopen_ports: [Int]
  live_stat: String
  last_stat: String
}

type ComputeSession {
  id: UUID
  main_kernel_id: UUID
  tag: String
  name: String
  type: String
  image: String
  registry: String
  cluster_template: String
  cluster_mode: String
  cluster_size: Int
  domain_name: String
  group_name: String
  group_id: UUID
  agent_ids: [String]
  user_email: String
  user_id: UUID
  access_key: String
  created_user_email: String
  created_user_id: UUID
  status: String
  status_info: String
  status_data: String
  status_changed: String
  created_at: String
  terminated_at: String
  starts_at: String
  scheduled_at: String
  startup_command: String
  result: String
  resource_opts: String
  scaling_group: String
  service_ports: String
  mounts: [String]
  occupying_slots: String
  containers: [Container]
  dependencies: [Dependency]
  abusing_reports: [String]
  idle_checks: String
}

type ComputeSessionList { items: [ComputeSession]! total_count: Int! }

type VirtualFolder {
  id: UUID
  host: String
  quota_scope_id: String
  name: String
  user: UUID
  user_email: String
  group: UUID
  group_name: String
  creator: String
  domain_name: String
  unmanaged_path: String
  usage_mode: String
  permission: String
  ownership_type: String
  max_files: Int
  max_size: Float
  created_at: String
  last_used: String
  num_files: Int
  cur_size: Float
  cloneable: Boolean
  status: String
}

type VirtualFolderList { items: [VirtualFolder]! total_count: Int! }

type Domain {
  name: String
  description: String
  is_active: Boolean
  created_at: String
  modified_at: String
  total_resource_slots: String
  allowed_vfolder_hosts: String
  allowed_docker_registries: [String]
  integration_id: String
}

type Group {
  id: UUID
  name: String
  description: String
  is_active: Boolean
  created_at: String
  modified_at: String
  domain_name: String
  total_resource_slots: String
  allowed_vfolder_hosts: String
  integration_id: String
  resource_policy: String
}

type UserGroup { id: UUID name: String }

type User {
  id: ID
  uuid: UUID
  username: String
  email: String
  full_name: String
  description: String
  need_password_change: Boolean
  status: String
  status_info: String
  is_active: Boolean
  created_at: String
  modified_at: String
  domain_name: String
  role: String
  resource_policy: String
  groups: [UserGroup]
  allowed_client_ip: [String]
  totp_activated: Boolean
  sudo_session_enabled: Boolean
  main_access_key: String
}

type UserList { items: [User]! total_count: Int! }

type UserInfo { email: String full_name: String }

type KeyPairList { items: [KeyPair]! total_count: Int! }

type KeyPairResourcePolicy {
  name: String
  created_at: String
  default_for_unspecified: String
  total_resource_slots: String
  max_session_lifetime: Int
  max_concurrent_sessions: Int
  max_containers_per_session: Int
  idle_timeout: Int
  max_vfolder_count: Int
  max_vfolder_size: Float
  max_quota_scope_size: Float
  allowed_vfolder_hosts: String
  max_pending_session_count: Int
  max_pending_session_resource_slots: String
  max_concurrent_sftp_sessions: Int
}

type ScalingGroup {
  name: String
  description: String
  is_active: Boolean
  is_public: Boolean
  created_at: String
  wsproxy_addr: String
  wsproxy_api_token: String
  driver: String
  driver_opts: String
  scheduler: String
  scheduler_opts: String
  use_host_network: Boolean
}

type StorageVolume {
  id: String
  backend: String
  fsprefix: String
  path: String
  capabilities: [String]
  hardware_metadata: String
  performance_metric: String
  usage: String
}

type StorageVolumeList { items: [StorageVolume]! total_count: Int! }

input UserInput {
  username: String
  password: String!
  need_password_change: Boolean
  full_name: String
  description: String
  is_active: Boolean
  status: String
  domain_name: String!
  role: String
  allowed_client_ip: [String]
  totp_activated: Boolean
  resource_policy: String
  sudo_session_enabled: Boolean
  group_ids: [String]
}

input ModifyUserInput {
  username: String
  password: String
  need_password_change: Boolean
  full_name: String
  description: String
  is_active: Boolean
  status: String
  domain_name: String
  role: String
  allowed_client_ip: [String]
  totp_activated: Boolean
  resource_policy: String
  sudo_session_enabled: Boolean
  group_ids: [String]
  main_access_key: String
}

input KeyPairInput {
  is_active: Boolean
  is_admin: Boolean
  resource_policy: String
  concurrency_limit: Int
  rate_limit: Int
}

input ModifyKeyPairInput {
  is_active: Boolean
  is_admin: Boolean
  resource_policy: String
  concurrency_limit: Int
  rate_limit: Int
}

input DomainInput {
  description: String
  is_active: Boolean
  total_resource_slots: String
  allowed_vfolder_hosts: String
  allowed_docker_registries: [String]
  integration_id: String
}

input ModifyDomainInput {
  name: String
  description: String
  is_active: Boolean
  total_resource_slots: String
  allowed_vfolder_hosts: String
  allowed_docker_registries: [String]
  integration_id: String
}

input GroupInput {
  type: String
  description: String
  is_active: Boolean
  domain_name: String!
  total_resource_slots: String
  allowed_vfolder_hosts: String
  integration_id: String
  resource_policy: String
}

input ModifyGroupInput {
  name: String
  description: String
  is_active: Boolean
  domain_name: String
  total_resource_slots: String
  user_update_mode: String
  user_uuids: [String]
  allowed_vfolder_hosts: String
  integration_id: String
  resource_policy: String
}

input PurgeUserInput { purge_shared_vfolders: Boolean }

type CreateGroup { ok: Boolean msg: String group: Group }
type ModifyGroup { ok: Boolean msg: String group: Group }
type CreateDomain { ok: Boolean msg: String domain: Domain }
type ModifyDomain { ok: Boolean msg: String domain: Domain }
input CreateKeyPairResourcePolicyInput {
  default_for_unspecified: String
  total_resource_slots: String
  max_session_lifetime: Int
  max_concurrent_sessions: Int
  max_concurrent_sftp_sessions: Int
  max_containers_per_session: Int
  idle_timeout: Int
  allowed_vfolder_hosts: String
  max_vfolder_count: Int
  max_vfolder_size: Float
  max_quota_scope_size: Float
  max_pending_session_count: Int
  max_pending_session_resource_slots: String
}

input ModifyKeyPairResourcePolicyInput {
  default_for_unspecified: String
  total_resource_slots: String
  max_session_lifetime: Int
  max_concurrent_sessions: Int
  max_concurrent_sftp_sessions: Int
  max_containers_per_session: Int
  idle_timeout: Int
  allowed_vfolder_hosts: String
  max_vfolder_count: Int
  max_vfolder_size: Float
  max_quota_scope_size: Float
  max_pending_session_count: Int
  max_pending_session_resource_slots: String
}

type CreateKeyPairResourcePolicy {
  ok: Boolean msg: String resource_policy: KeyPairResourcePolicy
}
input CreateScalingGroupInput {
  description: String
  is_active: Boolean
  is_public: Boolean
  driver: String
  driver_opts: String
  scheduler: String
  scheduler_opts: String
  use_host_network: Boolean
  wsproxy_addr: String
  wsproxy_api_token: String
}

input ModifyScalingGroupInput {
  description: String
  is_active: Boolean
  is_public: Boolean
  driver: String
  driver_opts: String
  scheduler: String
  scheduler_opts: String
  use_host_network: Boolean
  wsproxy_addr: String
  wsproxy_api_token: String
}

type CreateScalingGroup { ok: Boolean msg: String scaling_group: ScalingGroup }
type CreateUser { ok: Boolean msg: String user: User }
type ModifyUser { ok: Boolean msg: String user: User }
type CreateKeyPair { ok: Boolean msg: String keypair: KeyPair }
type MutationResult { ok: Boolean msg: String }

type Mutation {
  create_domain(name: String!, props: DomainInput!): CreateDomain
  modify_domain(name: String!, props: ModifyDomainInput!): ModifyDomain
  delete_domain(name: String!): MutationResult
  purge_domain(name: String!): MutationResult
  create_keypair_resource_policy(name: String!, props: CreateKeyPairResourcePolicyInput!):
    CreateKeyPairResourcePolicy
  modify_keypair_resource_policy(name: String!, props: ModifyKeyPairResourcePolicyInput!):
    MutationResult
  delete_keypair_resource_policy(name: String!): MutationResult
  create_scaling_group(name: String!, props: CreateScalingGroupInput!): CreateScalingGroup
  modify_scaling_group(name: String!, props: ModifyScalingGroupInput!): MutationResult
  delete_scaling_group(name: String!): MutationResult
  create_group(name: String!, props: GroupInput!): CreateGroup
  modify_group(gid: UUID!, props: ModifyGroupInput!): ModifyGroup
  delete_group(gid: UUID!): MutationResult
  purge_group(gid: UUID!): MutationResult
  create_user(email: String!, props: UserInput!): CreateUser
  modify_user(email: String!, props: ModifyUserInput!): ModifyUser
  delete_user(email: String!): MutationResult
  purge_user(email: String!, props: PurgeUserInput): MutationResult
  associate_scaling_group_with_domain(scaling_group: String!, domain: String!): MutationResult
  disassociate_scaling_group_with_domain(scaling_group: String!, domain: String!):
    MutationResult
  disassociate_all_scaling_groups_with_domain(domain: String!): MutationResult
  associate_scaling_group_with_user_group(scaling_group: String!, user_group: UUID!):
    MutationResult
  # (the 23.09 client declares this one's $user_group a String!)
  disassociate_scaling_group_with_user_group(scaling_group: String!, user_group: String!):
    MutationResult
  disassociate_all_scaling_groups_with_group(user_group: UUID!): MutationResult
  associate_scaling_group_with_keypair(scaling_group: String!, access_key: String!):
    MutationResult
  disassociate_scaling_group_with_keypair(scaling_group: String!, access_key: String!):
    MutationResult
  create_keypair(user_id: String!, props: KeyPairInput!): CreateKeyPair
  modify_keypair(access_key: String!, props: ModifyKeyPairInput!): MutationResult
  delete_keypair(access_key: String!): MutationResult
}

type Query {
  domain(name: String): Domain
  domains(is_active: Boolean): [Domain]
  group(id: UUID!, domain_name: String): Group
  groups(domain_name: String, is_active: Boolean): [Group]
  groups_by_name(name: String!, domain_name: String): [Group]
  user(domain_name: String, email: String): User
  user_from_uuid(domain_name: String, user_id: ID): User
  users(domain_name: String, group_id: UUID, is_active: Boolean, status: String): [User]
  user_list(limit: Int!, offset: Int!, filter: String, order: String, domain_name: String,
            group_id: UUID, is_active: Boolean, status: String): UserList
  keypairs(domain_name: String, email: String, is_active: Boolean): [KeyPair]
  keypair_list(limit: Int!, offset: Int!, filter: String, order: String, domain_name: String,
               email: String, is_active: Boolean): KeyPairList
  keypair_resource_policy(name: String): KeyPairResourcePolicy
  keypair_resource_policies: [KeyPairResourcePolicy]
  scaling_group(name: String): ScalingGroup
  scaling_groups(name: String, is_active: Boolean): [ScalingGroup]
  storage_volume(id: String): StorageVolume
  storage_volume_list(limit: Int!, offset: Int!, filter: String, order: String): StorageVolumeList
  keypair(domain_name: String, access_key: String): KeyPair
  compute_session(id: UUID!): ComputeSession
  compute_session_list(limit: Int!, offset: Int!, status: String, access_key: String,
                       filter: String, order: String): ComputeSessionList
  vfolder_list(limit: Int!, offset: Int!, group_id: UUID, filter: String,
               order: String): VirtualFolderList
}
"""

SCHEMA = build_schema(SDL)
# Backend.AI's status names that this platform has (PULLING and RESTARTING it has not;
# its CREATING is Backend.AI's PREPARING).
_STATUS_IN = {
    "PENDING": ["PENDING"], "SCHEDULED": ["SCHEDULED"], "PULLING": [],
    "PREPARING": ["PREPARING", "CREATING"], "RUNNING": ["RUNNING"], "RESTARTING": [],
    "RUNNING_DEGRADED": [], "TERMINATING": ["TERMINATING"], "TERMINATED": ["TERMINATED"],
    "ERROR": ["ERROR"], "CANCELLED": ["CANCELLED"],
    # Newer clients' (24.03+, 26.09) statuses: CREATING is ours; the others never occur.
    "PREPARED": [], "CREATING": ["CREATING"], "DEPRIORITIZING": [],
}
MAX_PAGE = 100
ALL = 10_000  # the unpaginated lists (domains, groups, ...): at most this many
# What one request may ask (Backend.AI's clients send one root field and well under 200
# fields). Each root field is database work: without these bounds one request of
# thousands of aliases (``a1: users {...} a2: users {...} ...``) held a database thread
# for a minute, and a few of them stopped every other tenant's API calls.
MAX_QUERY_CHARS = 32 * 1024
MAX_ROOT_FIELDS = 10
MAX_FIELDS = 1000  # field selections, fragments expanded
log = logging.getLogger("JupyterHub")


def dashed(hex_id: str | None) -> str | None:
    """Our 32-hex ids as Backend.AI's dashed UUIDs (what its clients parse)."""
    if not hex_id:
        return None
    try:
        return str(uuid.UUID(hex_id))
    except ValueError:
        return hex_id


def bai_status(status: str) -> str:
    return "PREPARING" if status == SessionStatus.CREATING else status


def _slots_json(slots: dict | None) -> str:
    return json.dumps({k: str(v) for k, v in (slots or {}).items()})


def session_item(db, s: Session) -> dict:
    """A session in the shape of Backend.AI's ``ComputeSession`` node."""
    from ...models import Project, User

    out = admin.session_out(s)
    owner = db.get(User, s.user_id)
    proj = db.get(Project, s.project_id) if s.project_id else None
    slots = {k: str(v) for k, v in (out["requested_slots"] or {}).items()}
    n = max(1, int(s.cluster_size or 1))
    total = {}
    for k, v in slots.items():
        try:
            total[k] = str(type(v)(v) if n == 1 else float(v) * n)
        except (TypeError, ValueError):
            total[k] = v
    kernels = out["kernels"]
    main = next((k for k in kernels if k["cluster_role"] in ("main", None)), kernels[0] if kernels
                else None)
    return {
        "id": dashed(s.id), "main_kernel_id": dashed(main["id"]) if main else None,
        "tag": None, "name": s.name, "type": s.session_type.upper(), "image": s.image,
        "registry": None, "cluster_template": None, "cluster_mode": s.cluster_mode,
        "cluster_size": s.cluster_size, "domain_name": s.domain_name,
        "group_name": proj.name if proj else None, "group_id": dashed(s.project_id),
        "agent_ids": sorted({k["agent_id"] for k in kernels if k["agent_id"]}),
        "user_email": owner.email if owner else None, "user_id": dashed(s.user_id),
        "access_key": s.access_key, "created_user_email": owner.email if owner else None,
        "created_user_id": dashed(s.user_id), "status": bai_status(s.status),
        "status_info": s.status_info, "status_data": "{}",
        "status_changed": out["terminated_at"] or out["created_at"],
        "created_at": out["created_at"], "terminated_at": out["terminated_at"],
        "starts_at": out["starts_at"], "scheduled_at": None,
        "startup_command": s.startup_command, "result": s.result, "resource_opts": "{}",
        "scaling_group": s.resource_group, "service_ports": "[]",
        "mounts": [m["name"] for m in out["vfolder_mounts"]],
        "occupying_slots": json.dumps(total), "abusing_reports": [], "idle_checks": "{}",
        "dependencies": [{"id": dashed(d.id), "name": d.name, "status": bai_status(d.status)}
                         for d in s.dependencies],
        "containers": [{
            "id": dashed(k["id"]), "cluster_role": k["cluster_role"],
            "cluster_idx": k["cluster_idx"], "cluster_hostname": k["cluster_hostname"],
            "session_id": dashed(s.id), "image": s.image, "registry": None,
            "status": bai_status(k["status"]), "status_info": None, "status_data": "{}",
            "status_changed": None, "agent": k["agent_id"], "container_id": None,
            "resource_opts": "{}", "occupied_slots": json.dumps(slots), "preopen_ports": [],
            "live_stat": None, "last_stat": None,
        } for k in kernels],
    }


def folder_item(db, p, f: VFolder) -> dict:
    from ...models import Project, User

    out = vfolders.vfolder_out(db, f, p)
    owner = db.get(User, f.user_id) if f.user_id else None
    proj = db.get(Project, f.project_id) if f.project_id else None
    return {
        "id": dashed(f.id), "host": f.host, "quota_scope_id": f.quota_scope_id, "name": f.name,
        "user": dashed(f.user_id), "user_email": owner.email if owner else None,
        "group": dashed(f.project_id), "group_name": proj.name if proj else None,
        "creator": f.creator, "domain_name": f.domain_name, "unmanaged_path": None,
        "usage_mode": f.usage_mode, "permission": out["my_permission"] or f.permission,
        "ownership_type": "group" if f.ownership_type == "project" else f.ownership_type,
        "max_files": 0, "max_size": 0,
        "created_at": out["created_at"], "last_used": None, "num_files": None, "cur_size": None,
        "cloneable": False, "status": f.status,
    }


def _page_args(limit: int, offset: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise GraphQLError(f"limit must be between 1 and {MAX_PAGE}")
    if offset < 0:
        raise GraphQLError("offset must not be negative")


def _unsupported(**kw) -> None:
    for name, value in kw.items():
        if value:
            raise GraphQLError(f"{name} expressions are not supported by this server")


def _hex(value: str, what: str) -> str:
    try:
        return uuid.UUID(str(value)).hex
    except ValueError:
        raise GraphQLError(f"{what} {value!r} is not a UUID") from None


class Root:
    """Resolvers; each runs in the caller's database transaction (``db``)."""

    def __init__(self, db, p: access.Principal):
        self.db, self.p = db, p
        # what JupyterHub must do once the transaction committed (hubsync.apply), from
        # the mutations that succeeded; _pending: the running mutation's
        self.changes: list[hubsync.HubChange] = []
        self._pending: list[hubsync.HubChange] = []

    def keypair(self, info, access_key=None, domain_name=None):
        ak = access_key or self.p.access_key
        if ak is None:
            return None
        return _keypair_item(self.db, _call(admin._get_keypair, self.db, self.p, ak))

    # -- admin: the same services and rules as the admin REST API (manager/admin.py) --

    def domain(self, info, name=None):
        return _domain_item(_call(admin.get_domain, self.db, self.p, name or self.p.domain))

    def domains(self, info, is_active=None):
        f = {} if is_active is None else {"is_active": is_active}
        return [_domain_item(d) for d in _all(admin.list_domains, self.db, self.p, f)]

    def group(self, info, id, domain_name=None):
        return _group_item(_call(admin.get_project, self.db, self.p, _hex(id, "group id")))

    def groups(self, info, domain_name=None, is_active=None, name=None):
        f = {k: v for k, v in (("domain", domain_name), ("is_active", is_active),
                               ("name", name)) if v is not None}
        return [_group_item(g) for g in _all(admin.list_projects, self.db, self.p, f)]

    def groups_by_name(self, info, name, domain_name=None):
        found = self.groups(info, domain_name=domain_name, name=name)
        if not found:
            raise GraphQLError(f"no group (project) {name!r}")
        return found

    def user(self, info, email=None, domain_name=None):
        if email is None:
            return _user_item(self.db, _call(admin.get_user, self.db, self.p, self.p.user_id))
        rows = _all(admin.list_users, self.db, self.p, {"email": email})
        if not rows:
            raise GraphQLError(f"no user {email!r}")
        return _user_item(self.db, rows[0])

    def user_from_uuid(self, info, user_id=None, domain_name=None):
        uid = _hex(user_id, "user id") if user_id else self.p.user_id
        return _user_item(self.db, _call(admin.get_user, self.db, self.p, uid))

    def _user_filters(self, domain_name, group_id, is_active, status):
        f = {}
        if domain_name:
            f["domain"] = domain_name
        if group_id:
            f["project"] = _hex(group_id, "group id")
        if status:
            f["status"] = status.lower()
        elif is_active is not None:
            f["status"] = "active" if is_active else "inactive"
        return f

    def users(self, info, domain_name=None, group_id=None, is_active=None, status=None):
        f = self._user_filters(domain_name, group_id, is_active, status)
        return [_user_item(self.db, u) for u in _all(admin.list_users, self.db, self.p, f)]

    def user_list(self, info, limit, offset, filter=None, order=None, domain_name=None,
                  group_id=None, is_active=None, status=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        f = self._user_filters(domain_name, group_id, is_active, status)
        page = _call(admin.list_users, self.db, self.p, f, offset, limit)
        return {"items": [_user_item(self.db, u) for u in page["items"]],
                "total_count": page["total"]}

    def _keypair_filters(self, email, is_active):
        f = {} if is_active is None else {"is_active": is_active}
        if email:
            users = _all(admin.list_users, self.db, self.p, {"email": email})
            if not users:
                raise GraphQLError(f"no user {email!r}")
            f["user_id"] = users[0]["id"]
        return f

    def keypairs(self, info, domain_name=None, email=None, is_active=None):
        f = self._keypair_filters(email, is_active)
        return [_keypair_item(self.db, self.db.get(Keypair, k["access_key"]))
                for k in _all(admin.list_keypairs, self.db, self.p, f)]

    def keypair_list(self, info, limit, offset, filter=None, order=None, domain_name=None,
                     email=None, is_active=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        page = _call(admin.list_keypairs, self.db, self.p,
                     self._keypair_filters(email, is_active), offset, limit)
        return {"items": [_keypair_item(self.db, self.db.get(Keypair, k["access_key"]))
                          for k in page["items"]], "total_count": page["total"]}

    def keypair_resource_policy(self, info, name=None):
        if name is None:
            kp = self.db.get(Keypair, self.p.access_key) if self.p.access_key else None
            if kp is None:
                raise GraphQLError("name: which keypair resource policy")
            name = kp.resource_policy
        return _policy_item(_call(admin.get_policy, self.db, self.p, "keypair", name))

    def keypair_resource_policies(self, info):
        return [_policy_item(r) for r in _all(admin.list_policies, self.db, self.p, "keypair", {})]

    def scaling_group(self, info, name=None):
        return _rg_item(_call(admin.get_resource_group, self.db, self.p, name or ""))

    def scaling_groups(self, info, name=None, is_active=None):
        f = {} if is_active is None else {"is_active": is_active}
        rows = _all(admin.list_resource_groups, self.db, self.p, f)
        return [_rg_item(g) for g in rows if name is None or g["name"] == name]

    def _volumes(self) -> list[dict]:
        view = vfolders.host_view(self.db, self.p, self.volumes, "")
        return [_volume_item(h, v) for h, v in view["hosts"].items()
                if self.p.is_superadmin or v["permissions"]]

    def storage_volume(self, info, id=None):
        for v in self._volumes():
            if v["id"] == id:
                return v
        raise GraphQLError(f"no storage volume {id!r} (hosts are proxy:volume)")

    def storage_volume_list(self, info, limit, offset, filter=None, order=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        vols = self._volumes()
        return {"items": vols[offset:offset + limit], "total_count": len(vols)}

    def compute_session(self, info, id):
        s = self.db.get(Session, _hex(id, "session id"))
        if s is None or not access.can_see_session(self.p, s):
            return None
        return session_item(self.db, s)

    def compute_session_list(self, info, limit, offset, status=None, access_key=None,
                             filter=None, order=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        stmt = (select(Session).where(access.session_filter(self.p))
                .options(selectinload(Session.kernels), selectinload(Session.dependencies)))
        if status:
            wanted = []
            for name in status.split(","):
                name = name.strip().upper()
                if name not in _STATUS_IN:
                    raise GraphQLError(f"unknown session status {name!r}")
                wanted += _STATUS_IN[name]
            stmt = stmt.where(Session.status.in_(wanted))
        if access_key:
            stmt = stmt.where(Session.access_key == access_key)
        from sqlalchemy import func

        total = self.db.scalar(select(func.count()).select_from(stmt.subquery()))
        rows = self.db.scalars(stmt.order_by(Session.created_at.desc(), Session.id)
                               .offset(offset).limit(limit)).unique().all()
        return {"items": [session_item(self.db, s) for s in rows], "total_count": total}

    def vfolder_list(self, info, limit, offset, group_id=None, filter=None, order=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        stmt = select(VFolder).where(vfolders.folder_filter(self.p))
        if group_id:
            stmt = stmt.where(VFolder.project_id == _hex(group_id, "group id"))
        from sqlalchemy import func

        total = self.db.scalar(select(func.count()).select_from(stmt.subquery()))
        rows = self.db.scalars(stmt.order_by(VFolder.name, VFolder.id)
                               .offset(offset).limit(limit)).all()
        return {"items": [folder_item(self.db, self.p, f) for f in rows], "total_count": total}


    # -- admin mutations: the admin REST API's services, in a savepoint each (a refusal
    # leaves nothing behind); answered as Backend.AI does, {ok, msg, <object>} --

    def _mutate(self, fn, *args) -> dict:
        self._pending = []
        try:
            with self.db.begin_nested():
                out = {"ok": True, "msg": "success", **(fn(*args) or {})}
        except BackendAIError as e:
            return {"ok": False, "msg": e.detail}
        except GraphQLError as e:
            return {"ok": False, "msg": e.message}
        self.changes += [c for c in self._pending if c]
        return out

    def _hub(self, fn, *args):
        """A ``hubsync`` service: its result; its hub change is made if the mutation stands."""
        out, change = fn(self.db, self.p, *args)
        self._pending.append(change)
        return out

    @staticmethod
    def _domain_body(props: dict, schema: str) -> dict:
        body = {k: v for k, v in props.items() if v is not None}
        if body.pop("integration_id", None):
            raise GraphQLError("integration_id: not supported by this server")
        return _checked(_parse_json_fields(body, "total_resource_slots",
                                           "allowed_vfolder_hosts"), schema)

    def create_domain(self, info, name, props):
        def run():
            body = self._domain_body({**props, "name": name}, "DomainCreate")
            return {"domain": _domain_item(admin.create_domain(self.db, self.p, body))}
        return self._mutate(run)

    def modify_domain(self, info, name, props):
        def run():
            if props.get("name") not in (None, name):
                raise GraphQLError("name: domains cannot be renamed on this server")
            body = self._domain_body({k: v for k, v in props.items() if k != "name"},
                                     "DomainUpdate")
            # (is_active false: its sessions and its users' hub access end, as in REST)
            return {"domain": _domain_item(self._hub(hubsync.update_domain, name, body))}
        return self._mutate(run)

    def delete_domain(self, info, name):
        # Backend.AI's delete_domain deactivates (``purge`` deletes)
        return self._mutate(lambda: self._hub(hubsync.update_domain, name,
                                              {"is_active": False}) and None)

    def purge_domain(self, info, name):
        return self._mutate(admin.delete_domain, self.db, self.p, name)

    @staticmethod
    def _policy_body(props: dict, schema: str) -> dict:
        body = {k: v for k, v in props.items() if v is not None}
        # no SFTP sessions here (the CLI always sends its default); folder limits are the
        # user's and project's resource policies (quota scopes)
        body.pop("max_concurrent_sftp_sessions", None)
        for k in ("max_vfolder_count", "max_vfolder_size", "max_quota_scope_size"):
            if body.pop(k, None):
                raise GraphQLError(f"{k}: set it in a user or project resource policy here")
        return _checked(_parse_json_fields(body, "total_resource_slots", "allowed_vfolder_hosts",
                                           "max_pending_session_resource_slots"), schema)

    def create_keypair_resource_policy(self, info, name, props):
        def run():
            body = self._policy_body({**props, "name": name}, "KeypairResourcePolicyCreate")
            return {"resource_policy": _policy_item(
                admin.create_policy(self.db, self.p, "keypair", body))}
        return self._mutate(run)

    def modify_keypair_resource_policy(self, info, name, props):
        def run():
            admin.update_policy(self.db, self.p, "keypair", name,
                                self._policy_body(dict(props), "KeypairResourcePolicyUpdate"))
        return self._mutate(run)

    def delete_keypair_resource_policy(self, info, name):
        return self._mutate(admin.delete_policy, self.db, self.p, "keypair", name)

    @staticmethod
    def _rg_body(props: dict, schema: str) -> dict:
        body = {k: v for k, v in props.items() if v is not None}
        # Agents join a resource group by their own configuration ("static"); sessions'
        # apps are proxied by the hub, not a wsproxy; containers use their own networks.
        if body.pop("driver", "static") != "static":
            raise GraphQLError("driver: only 'static' here (agents name their resource group)")
        if body.pop("driver_opts", "{}") not in ("{}", ""):
            raise GraphQLError("driver_opts: not supported by this server")
        if body.pop("use_host_network", False):
            raise GraphQLError("use_host_network: not supported by this server")
        for k in ("wsproxy_addr", "wsproxy_api_token"):
            if body.pop(k, ""):
                raise GraphQLError(f"{k}: no wsproxy here (the hub proxies sessions' apps)")
        return _checked(_parse_json_fields(body, "scheduler_opts"), schema)

    def create_scaling_group(self, info, name, props):
        def run():
            body = self._rg_body({**props, "name": name}, "ResourceGroupCreate")
            return {"scaling_group": _rg_item(admin.create_resource_group(self.db, self.p,
                                                                          body))}
        return self._mutate(run)

    def modify_scaling_group(self, info, name, props):
        def run():
            admin.update_resource_group(self.db, self.p, name,
                                        self._rg_body(dict(props), "ResourceGroupUpdate"))
        return self._mutate(run)

    def delete_scaling_group(self, info, name):
        return self._mutate(admin.delete_resource_group, self.db, self.p, name)

    def _user_by_email(self, email: str) -> dict:
        rows = _call(admin.list_users, self.db, self.p, {"email": email}, 0, 1)["items"]
        if not rows:
            raise GraphQLError(f"no user {email!r}")
        return rows[0]

    def _user_body(self, props: dict, schema: str) -> dict:
        props = {k: v for k, v in props.items() if v is not None}
        if not props.get("username", True):
            del props["username"]  # the CLI's default: none given (from the email)
        for k, off in (("totp_activated", False), ("sudo_session_enabled", False)):
            if props.pop(k, off) != off:
                raise GraphQLError(f"{k}: not supported by this server")
        if props.pop("description", ""):
            raise GraphQLError("description: users have no description on this server")
        if "is_active" in props:
            active = props.pop("is_active")
            props.setdefault("status", "active" if active else "inactive")
        if "group_ids" in props:
            props["project_ids"] = [_hex(g, "group id") for g in props.pop("group_ids")]
        return _checked(props, schema)

    def create_user(self, info, email, props):
        def run():
            body = self._user_body({**props, "email": email}, "UserCreate")
            return {"user": _user_item(self.db, admin.create_user(self.db, self.p, body))}
        return self._mutate(run)

    def modify_user(self, info, email, props):
        def run():
            user = self._user_by_email(email)
            if props.get("username") is not None or props.get("main_access_key") is not None:
                raise GraphQLError("username, main_access_key: change them through the REST "
                                   "API (PATCH /keypairs/{access_key} is_default)")
            body = self._user_body(dict(props), "UserUpdate")
            # status, role, domain and groups: the hub follows (hubsync), as in REST
            return {"user": _user_item(self.db, self._hub(hubsync.update_user, user["id"],
                                                          body))}
        return self._mutate(run)

    def delete_user(self, info, email):
        # Backend.AI's delete_user keeps the account with status "deleted" (purge deletes):
        # its sessions and hub access end, as with PATCH /users/{id} {"status": "deleted"}
        def run():
            body = _checked({"status": "deleted"}, "UserUpdate")
            self._hub(hubsync.update_user, self._user_by_email(email)["id"], body)
        return self._mutate(run)

    def purge_user(self, info, email, props=None):
        # DELETE /users/{id}: refused while the user has folders (purge_shared_vfolders or
        # not: delete or hand them over first) or live sessions; the hub account goes too
        return self._mutate(lambda: self._hub(hubsync.delete_user,
                                              self._user_by_email(email)["id"]) and None)

    # -- groups (projects); their JupyterHub groups follow (hubsync) --

    @staticmethod
    def _group_body(props: dict, schema: str) -> dict:
        body = {k: v for k, v in props.items() if v is not None}
        if body.pop("integration_id", None):
            raise GraphQLError("integration_id: not supported by this server")
        if str(body.pop("type", "GENERAL")).upper() != "GENERAL":
            raise GraphQLError("type: only GENERAL groups (projects) here")
        return _checked(_parse_json_fields(body, "total_resource_slots",
                                           "allowed_vfolder_hosts"), schema)

    def create_group(self, info, name, props):
        def run():
            body = self._group_body({**props, "name": name}, "ProjectCreate")
            return {"group": _group_item(self._hub(hubsync.create_project, body))}
        return self._mutate(run)

    def modify_group(self, info, gid, props):
        def run():
            pid = _hex(gid, "group id")
            props_ = dict(props)
            mode = props_.pop("user_update_mode", None)
            uids = props_.pop("user_uuids", None)
            if props_.get("domain_name") is not None:
                if props_.pop("domain_name") != _call(admin.get_project, self.db, self.p,
                                                      pid)["domain_name"]:
                    raise GraphQLError("domain_name: groups (projects) cannot move to "
                                       "another domain")
            body = self._group_body(props_, "ProjectUpdate")
            if body:  # (is_active false: the project's sessions end, as in REST)
                self._hub(hubsync.update_project, pid, body)
            if uids is not None or mode is not None:
                if mode not in ("add", "remove"):
                    raise GraphQLError(f"user_update_mode: 'add' or 'remove', not {mode!r}")
                ids = [_hex(u, "user id") for u in uids or []]
                if mode == "add":
                    self._hub(hubsync.add_members, pid, _checked({"user_ids": ids},
                                                                 "MembersAdd")["user_ids"])
                else:
                    if not ids:
                        raise GraphQLError("user_uuids: which users")
                    self._hub(hubsync.remove_members, pid, ids)
            return {"group": _group_item(admin.get_project(self.db, self.p, pid))}
        return self._mutate(run)

    def delete_group(self, info, gid):
        # Backend.AI's delete_group deactivates (``purge`` deletes): its sessions end
        return self._mutate(lambda: self._hub(hubsync.update_project, _hex(gid, "group id"),
                                              {"is_active": False}) and None)

    def purge_group(self, info, gid):
        return self._mutate(lambda: self._hub(hubsync.delete_project, _hex(gid, "group id")))

    # -- scaling groups' associations: a resource group's allowed_domains,
    # allowed_projects and allowed_keypairs (PATCH /resource-groups/{name}) --

    def _associate(self, name: str, field: str, key: str, add: bool) -> None:
        g = _call(admin.get_resource_group, self.db, self.p, name)
        now = list(g[field] or [])
        what = {"allowed_domains": "domain", "allowed_projects": "group (project)",
                "allowed_keypairs": "keypair"}[field]
        if add == (key in now):
            raise GraphQLError(f"scaling group {name!r} is {'already' if add else 'not'} "
                               f"associated with {what} {key!r}")
        new = now + [key] if add else [k for k in now if k != key]
        admin.update_resource_group(self.db, self.p, name,
                                    _checked({field: new}, "ResourceGroupUpdate"))

    def _dissociate_all(self, field: str, key: str) -> None:
        access.require(access.may_change_installation(self.p), "change resource groups")
        for g in _all(admin.list_resource_groups, self.db, self.p, {}):
            if key in (g[field] or []):
                self._associate(g["name"], field, key, False)

    def associate_scaling_group_with_domain(self, info, scaling_group, domain):
        return self._mutate(self._associate, scaling_group, "allowed_domains", domain, True)

    def disassociate_scaling_group_with_domain(self, info, scaling_group, domain):
        return self._mutate(self._associate, scaling_group, "allowed_domains", domain, False)

    def disassociate_all_scaling_groups_with_domain(self, info, domain):
        def run():
            admin.get_domain(self.db, self.p, domain)  # (one the caller can see)
            self._dissociate_all("allowed_domains", domain)
        return self._mutate(run)

    def associate_scaling_group_with_user_group(self, info, scaling_group, user_group):
        return self._mutate(lambda: self._associate(
            scaling_group, "allowed_projects", _hex(user_group, "group id"), True))

    def disassociate_scaling_group_with_user_group(self, info, scaling_group, user_group):
        return self._mutate(lambda: self._associate(
            scaling_group, "allowed_projects", _hex(user_group, "group id"), False))

    def disassociate_all_scaling_groups_with_group(self, info, user_group):
        return self._mutate(lambda: self._dissociate_all("allowed_projects",
                                                         _hex(user_group, "group id")))

    def associate_scaling_group_with_keypair(self, info, scaling_group, access_key):
        return self._mutate(self._associate, scaling_group, "allowed_keypairs", access_key,
                            True)

    def disassociate_scaling_group_with_keypair(self, info, scaling_group, access_key):
        return self._mutate(self._associate, scaling_group, "allowed_keypairs", access_key,
                            False)

    def create_keypair(self, info, user_id, props):
        def run():
            owner = self._user_by_email(user_id)
            body = {k: v for k, v in props.items() if v is not None}
            if body.pop("concurrency_limit", None) is not None:
                raise GraphQLError("concurrency_limit: set it in the keypair resource policy")
            if body.get("is_admin") is False:
                del body["is_admin"]  # the CLI always sends it; only True is a request
            body = _checked({**body, "user_id": owner["id"]}, "KeypairCreate")
            out = admin.create_keypair(self.db, self.p, body)
            item = _keypair_item(self.db, self.db.get(Keypair, out["access_key"]))
            return {"keypair": {**item, "secret_key": out["secret_key"]}}
        return self._mutate(run)

    def modify_keypair(self, info, access_key, props):
        def run():
            body = {k: v for k, v in props.items() if v is not None}
            if body.pop("concurrency_limit", None) is not None:
                raise GraphQLError("concurrency_limit: set it in the keypair resource policy")
            admin.update_keypair(self.db, self.p, access_key, _checked(body, "KeypairUpdate"))
        return self._mutate(run)

    def delete_keypair(self, info, access_key):
        return self._mutate(admin.delete_keypair, self.db, self.p, access_key)


def _parse_json_fields(body: dict, *fields: str) -> dict:
    """The mutation inputs the client sends as JSON strings, parsed in place."""
    for k in fields:
        if k in body:
            try:
                body[k] = json.loads(body[k])
            except ValueError:
                raise GraphQLError(f"{k}: not JSON: {body[k]!r}") from None
    return body


def _checked(body: dict, schema_name: str) -> dict:
    """``body`` checked by the REST API's request model (``base.validate``: the same
    check and words as the REST endpoint); a field this server does not keep is named."""
    from ...common.errors import InvalidRequest
    from ..base import validate
    from ..models import model

    unknown = sorted(set(body) - set(model(schema_name).model_fields))
    if unknown:
        raise GraphQLError(f"{', '.join(unknown)}: not supported by this server")
    try:
        return validate(schema_name, body)
    except InvalidRequest as e:
        raise GraphQLError(e.detail) from None


def _call(fn, *args):
    """A service call; its refusal (not found, forbidden, ...) is a GraphQL error in its words."""
    try:
        return fn(*args)
    except BackendAIError as e:
        raise GraphQLError(e.detail) from None


def _all(fn, *args) -> list:
    return _call(fn, *args, 0, ALL)["items"]


def _json(v) -> str:
    return json.dumps(v if v is not None else {})


def _domain_item(d: dict) -> dict:
    return {**d, "total_resource_slots": _json(d["total_resource_slots"]),
            "allowed_vfolder_hosts": _json(d["allowed_vfolder_hosts"]), "modified_at": None,
            "integration_id": None}


def _group_item(g: dict) -> dict:
    return {**g, "id": dashed(g["id"]), "total_resource_slots": _json(g["total_resource_slots"]),
            "allowed_vfolder_hosts": _json(g["allowed_vfolder_hosts"]), "modified_at": None,
            "integration_id": None}


def _user_item(db, u: dict) -> dict:
    from ...models import Project, User

    row = db.get(User, u["id"])
    main = admin.main_keypair(row) if row is not None else None
    groups = [db.get(Project, pid) for pid in u["project_ids"]]
    return {**u, "id": dashed(u["id"]), "uuid": dashed(u["id"]), "description": None,
            "status_info": None, "is_active": u["status"] == "active", "modified_at": None,
            "groups": [{"id": dashed(g.id), "name": g.name} for g in groups if g is not None],
            "totp_activated": False, "sudo_session_enabled": False,
            "main_access_key": main.access_key if main is not None else None}


def _keypair_item(db, kp) -> dict:
    from sqlalchemy import func

    from ...models import User

    owner = db.get(User, kp.user_id)
    live = db.scalar(select(func.count()).select_from(Session).where(
        Session.access_key == kp.access_key, Session.alive_marker.is_not(None)))
    return {"user_id": owner.email if owner else dashed(kp.user_id),
            "access_key": kp.access_key, "secret_key": None, "is_active": kp.is_active,
            "is_admin": bool(kp.is_admin), "resource_policy": kp.resource_policy,
            "rate_limit": kp.rate_limit, "num_queries": kp.num_queries,
            "created_at": kp.created_at.isoformat() if kp.created_at else None,
            "last_used": kp.last_used.isoformat() if kp.last_used else None,
            "modified_at": None, "concurrency_used": live,
            "projects": sorted(p.name for p in owner.projects) if owner else [],
            "user_info": {"email": owner.email if owner else None,
                          "full_name": owner.full_name if owner else None}}


def _policy_item(r: dict) -> dict:
    # Folder count and size limits are the user's and project's resource policies here
    # (quota scopes), not the keypair's: 0, Backend.AI's "no limit".
    return {**r, "total_resource_slots": _json(r["total_resource_slots"]),
            "allowed_vfolder_hosts": _json(r["allowed_vfolder_hosts"]),
            "max_pending_session_resource_slots": (
                None if r["max_pending_session_resource_slots"] is None
                else _json(r["max_pending_session_resource_slots"])),
            "max_concurrent_sftp_sessions": 0,  # no SFTP sessions here
            "max_vfolder_count": 0, "max_vfolder_size": 0, "max_quota_scope_size": 0}


def _rg_item(g: dict) -> dict:
    return {**g, "scheduler_opts": _json(g["scheduler_opts"]), "driver": "static",
            "driver_opts": "{}", "wsproxy_addr": None, "wsproxy_api_token": None,
            "use_host_network": False}


def _volume_item(host: str, v: dict) -> dict:
    vol = v["volume"]
    return {"id": host, "backend": vol.get("backend"), "fsprefix": "", "path": vol.get("path"),
            "capabilities": sorted(vol.get("capabilities") or ["vfolder", "quota"]),
            "hardware_metadata": "{}", "performance_metric": "{}", "usage": "{}"}


def _field_resolver(source, info, **args):
    if isinstance(source, Root):
        return getattr(source, info.field_name)(info, **args)
    if isinstance(source, dict):
        return source.get(info.field_name)
    return getattr(source, info.field_name, None)


class _Strings(Visitor):
    """The query's string literals: none a database cannot store (NUL, lone surrogates)."""

    def enter_string_value(self, node, *_args):
        _check_text(node.value, "query")


def check_cost(doc) -> None:
    """Refuse (400) a document that asks more than one request may: more than
    :data:`MAX_ROOT_FIELDS` root fields in an operation or :data:`MAX_FIELDS` field
    selections, fragments expanded. Walks iteratively and stops at the bound, so neither
    fragment cycles nor fragments spread exponentially make the walk itself costly."""
    frags = {d.name.value: d for d in doc.definitions if isinstance(d, FragmentDefinitionNode)}
    fields = steps = 0
    for op in doc.definitions:
        if not isinstance(op, OperationDefinitionNode):
            continue
        roots = 0
        stack = [(sel, True, ()) for sel in op.selection_set.selections]
        while stack:
            sel, at_root, path = stack.pop()
            steps += 1
            if steps > 4 * MAX_FIELDS:
                fields = MAX_FIELDS + 1
            elif isinstance(sel, FieldNode):
                fields += 1
                roots += at_root
                if sel.selection_set is not None:
                    stack += [(s, False, path) for s in sel.selection_set.selections]
            elif isinstance(sel, InlineFragmentNode):
                stack += [(s, at_root, path) for s in sel.selection_set.selections]
            elif isinstance(sel, FragmentSpreadNode):
                frag = frags.get(sel.name.value)
                if frag is not None and sel.name.value not in path:  # (cycles: validation)
                    stack += [(s, at_root, path + (sel.name.value,))
                              for s in frag.selection_set.selections]
            if fields > MAX_FIELDS:
                raise InvalidRequest(
                    f"the query selects more than {MAX_FIELDS} fields (fragments expanded); "
                    "split it into smaller queries")
            if roots > MAX_ROOT_FIELDS:
                raise InvalidRequest(
                    f"the query asks more than {MAX_ROOT_FIELDS} top-level fields (aliases "
                    "included); split it into smaller queries")


def _answer(result) -> dict:
    """The response; an error that is not a refusal in words (a bug, a database error)
    is logged with its traceback and answered without its text, which could show SQL,
    parameters or paths."""
    out: dict = {"data": result.data}
    if result.errors:
        errors = []
        for e in result.errors:
            orig = e.original_error
            if orig is not None and not isinstance(orig, GraphQLError | BackendAIError):
                log.error("GraphQL field %s failed", ".".join(map(str, e.path or [])),
                          exc_info=orig)
                e = GraphQLError("internal error; the hub's log has the details",
                                 e.nodes, path=e.path)
            errors.append(e.formatted)
        out["errors"] = errors
    return out


async def execute(manager, p: access.Principal, query: str, variables: dict | None,
                  hub=None) -> dict:
    """Run one query for ``p``; answers ``{"data": ..., "errors": [...]}`` as GraphQL does.
    A document over the bounds (:data:`MAX_QUERY_CHARS`, :func:`check_cost`) or with
    text a database cannot store is an :class:`InvalidRequest` (400) before any work.

    ``hub``: the request's handler, which makes the JupyterHub side of the mutations
    (``hubsync.apply``) after their transaction committed."""

    if len(query) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"the query has {len(query)} characters; at most "
                             f"{MAX_QUERY_CHARS} are accepted")
    _check_text(query, "query")
    _check_text(variables or {}, "variables")
    try:
        doc = parse(query)
    except GraphQLError as e:
        return {"data": None, "errors": [e.formatted]}
    visit(doc, _Strings())
    check_cost(doc)
    errors = validate(SCHEMA, doc)
    if errors:
        return {"data": None, "errors": [e.formatted for e in errors]}
    mutation = any(getattr(d, "operation", None) == OperationType.MUTATION
                   for d in doc.definitions)
    volumes = await vfolders._volumes(manager) if "storage_volume" in query else {}

    def run(db):
        root = Root(db, p)
        root.volumes = volumes
        return execute_sync(SCHEMA, doc, root_value=root, variable_values=variables or {},
                            field_resolver=_field_resolver), root.changes

    result, changes = await (manager.db if mutation else manager.db_read)(run)
    if changes and hub is None:
        raise RuntimeError("mutations JupyterHub mirrors need the request's handler")
    for change in changes:
        await hubsync.apply(hub, change)
    return _answer(result)


__all__ = ["execute", "dashed", "bai_status", "session_item", "SCHEMA"]
