"""The part of Backend.AI's GraphQL schema (``POST /admin/gql``) the 23.09 CLI's
session and folder commands use: ``keypair``, ``compute_session``,
``compute_session_list``, ``vfolder_list``. Parsed, validated and executed by
graphql-core (the pinned 3.3); every field is resolved from the same manager
functions and access filters as the REST API (what a caller sees here is what
``GET /sessions`` and ``GET /vfolders`` show them). Fields the client parses as
JSON strings (slots, status data) are sent as JSON strings.
"""

from __future__ import annotations

import json
import uuid

from graphql import GraphQLError, build_schema, graphql_sync
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from ...common.types import SessionStatus
from ...manager import access, admin, vfolders
from ...models import Session, VFolder

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

type Query {
  keypair(access_key: String): KeyPair
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
        "ownership_type": f.ownership_type, "max_files": 0, "max_size": 0,
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

    def keypair(self, info, access_key=None):
        ak = access_key or self.p.access_key
        if ak is None:
            return None
        try:
            kp = admin._get_keypair(self.db, self.p, ak)
        except Exception as e:  # noqa: BLE001 - a refusal is a GraphQL error with its words
            raise GraphQLError(getattr(e, "detail", str(e))) from None
        return {"user_id": dashed(kp.user_id), "access_key": kp.access_key, "secret_key": None,
                "is_active": kp.is_active, "is_admin": bool(kp.is_admin),
                "resource_policy": kp.resource_policy, "rate_limit": kp.rate_limit}

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


def _field_resolver(source, info, **args):
    if isinstance(source, Root):
        return getattr(source, info.field_name)(info, **args)
    if isinstance(source, dict):
        return source.get(info.field_name)
    return getattr(source, info.field_name, None)


async def execute(manager, p: access.Principal, query: str, variables: dict | None) -> dict:
    """Run one query for ``p``; answers ``{"data": ..., "errors": [...]}`` as GraphQL does."""

    def run(db):
        return graphql_sync(SCHEMA, query, root_value=Root(db, p),
                            variable_values=variables or {}, field_resolver=_field_resolver)

    result = await manager.db_read(run)
    out: dict = {"data": result.data}
    if result.errors:
        out["errors"] = [e.formatted for e in result.errors]
    return out


__all__ = ["execute", "dashed", "bai_status", "session_item", "SCHEMA"]
