"""The part of Backend.AI's GraphQL schema (``POST /admin/gql``) the 23.09 CLI's
session and folder commands use: ``keypair``, ``compute_session``,
``compute_session_list``, ``vfolder_list``; the admin commands' queries, and their
mutations for domains (add, update, delete = deactivate, purge), groups (projects: add,
update, delete = deactivate, purge, add-users, remove-users), users (add, update,
delete = status deleted, purge), keypairs (add, update, activate, deactivate, delete),
keypair resource policies and scaling groups (resource groups; add, update, delete,
associate with and dissociate from domains, groups and keypairs). Parsed, validated and
executed by graphql-core (the pinned 3.3); every root field is resolved by the manager's
named operations (``manager.ops``: :mod:`...manager.compatviews`, :mod:`...manager.admin`,
:mod:`...manager.apiviews`), one transaction each, with the same access filters as the
REST API (what a caller sees here is what ``GET /sessions`` and ``GET /vfolders`` show
them); nothing here touches the database. A mutation checks its input by the REST API's
request models first, then makes one write. Mutations that JupyterHub mirrors (groups,
admin flags, deactivations, deleted accounts) go through ``api/hubsync.py``, as the
REST handlers do: the record in the operation's transaction, the hub's part after it
committed. Fields the client parses as JSON strings (slots, status data) are sent as
JSON strings.
"""

from __future__ import annotations

import json
import logging
import uuid
from inspect import isawaitable

from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    OperationDefinitionNode,
    Visitor,
    parse,
    validate,
    visit,
)
from graphql import execute as execute_document

from ...common.errors import BackendAIError, Conflict, InvalidRequest
from ...manager import access, vfolders
from ...manager.compatviews import ALL, agent_item, bai_status, dashed, session_item
from .. import hubsync, models
from ..base import _check_text
from ..base import validate as validate_body
from . import images as compat_images
from .gql_schema import SCHEMA

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
# (ALL: the unpaginated lists (domains, groups, ...) hold at most this many)
MAX_TRIES = 20  # reads of a resource group's associations changed under the mutation
# What one request may ask (Backend.AI's clients send one root field and well under 200
# fields). Each root field is database work: without these bounds one request of
# thousands of aliases (``a1: users {...} a2: users {...} ...``) held a database thread
# for a minute, and a few of them stopped every other tenant's API calls.
MAX_QUERY_CHARS = 32 * 1024
MAX_ROOT_FIELDS = 10
MAX_FIELDS = 1000  # field selections, fragments expanded
log = logging.getLogger("JupyterHub")


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
    """Resolvers; each asks the manager's named operations (``manager.ops``, mostly
    :mod:`...manager.compatviews` and :mod:`...manager.admin`), one transaction each."""

    def __init__(self, manager, p: access.Principal, volumes: dict | None = None):
        self.ops, self.p = manager.ops, p
        self.manager = manager
        self.volumes = volumes or {}
        # what JupyterHub must do once the mutations committed (hubsync.apply), from
        # the mutations that succeeded; _pending: the running mutation's
        self.changes: list[hubsync.HubChange] = []
        self._pending: list[hubsync.HubChange] = []

    async def keypair(self, info, access_key=None, domain_name=None):
        ak = access_key or self.p.access_key
        if ak is None:
            return None
        return await _call(self.ops.bai_keypair(self.p, ak))

    # -- admin: the same services and rules as the admin REST API (manager/admin.py) --

    async def domain(self, info, name=None):
        return _domain_item(await _call(self.ops.get_domain(self.p, name or self.p.domain)))

    async def domains(self, info, is_active=None):
        f = {} if is_active is None else {"is_active": is_active}
        return [_domain_item(d) for d in await _all(self.ops.list_domains, self.p, f)]

    async def group(self, info, id, domain_name=None):
        return _group_item(await _call(self.ops.get_project(self.p, _hex(id, "group id"))))

    async def groups(self, info, domain_name=None, is_active=None, name=None):
        f = {k: v for k, v in (("domain", domain_name), ("is_active", is_active),
                               ("name", name)) if v is not None}
        return [_group_item(g) for g in await _all(self.ops.list_projects, self.p, f)]

    async def groups_by_name(self, info, name, domain_name=None):
        found = await self.groups(info, domain_name=domain_name, name=name)
        if not found:
            raise GraphQLError(f"no group (project) {name!r}")
        return found

    async def user(self, info, email=None, domain_name=None):
        if email is None:
            return await _call(self.ops.bai_user(self.p, self.p.user_id))
        rows = await _all(self.ops.bai_users, self.p, {"email": email})
        if not rows:
            raise GraphQLError(f"no user {email!r}")
        return rows[0]

    async def user_from_uuid(self, info, user_id=None, domain_name=None):
        uid = _hex(user_id, "user id") if user_id else self.p.user_id
        return await _call(self.ops.bai_user(self.p, uid))

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

    async def users(self, info, domain_name=None, group_id=None, is_active=None, status=None):
        f = self._user_filters(domain_name, group_id, is_active, status)
        return await _all(self.ops.bai_users, self.p, f)

    async def user_list(self, info, limit, offset, filter=None, order=None, domain_name=None,
                        group_id=None, is_active=None, status=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        f = self._user_filters(domain_name, group_id, is_active, status)
        page = await _call(self.ops.bai_users(self.p, f, offset, limit))
        return {"items": page["items"], "total_count": page["total"]}

    async def keypairs(self, info, domain_name=None, email=None, is_active=None):
        return await _all(self.ops.bai_keypairs, self.p, email, is_active)

    async def keypair_list(self, info, limit, offset, filter=None, order=None,
                           domain_name=None, email=None, is_active=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        page = await _call(self.ops.bai_keypairs(self.p, email, is_active, offset, limit))
        return {"items": page["items"], "total_count": page["total"]}

    async def keypair_resource_policy(self, info, name=None):
        return _policy_item(await _call(self.ops.bai_keypair_resource_policy(self.p, name)))

    async def keypair_resource_policies(self, info):
        return [_policy_item(r) for r in await _all(self.ops.list_policies, self.p, "keypair", {})]

    async def scaling_group(self, info, name=None):
        return _rg_item(await _call(self.ops.get_resource_group(self.p, name or "")))

    async def scaling_groups(self, info, name=None, is_active=None):
        f = {} if is_active is None else {"is_active": is_active}
        rows = await _all(self.ops.list_resource_groups, self.p, f)
        return [_rg_item(g) for g in rows if name is None or g["name"] == name]

    async def _volumes(self) -> list[dict]:
        hosts = await _call(self.ops.bai_storage_volumes(self.p, self.volumes))
        return [_volume_item(h, v) for h, v in hosts.items()
                if self.p.is_superadmin or v["permissions"]]

    async def storage_volume(self, info, id=None):
        for v in await self._volumes():
            if v["id"] == id:
                return v
        raise GraphQLError(f"no storage volume {id!r} (hosts are proxy:volume)")

    async def storage_volume_list(self, info, limit, offset, filter=None, order=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        vols = await self._volumes()
        return {"items": vols[offset:offset + limit], "total_count": len(vols)}

    async def compute_session(self, info, id):
        return await _call(self.ops.bai_compute_session(self.p, _hex(id, "session id")))

    async def compute_session_list(self, info, limit, offset, status=None, access_key=None,
                                   filter=None, order=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        wanted = None
        if status:
            wanted = []
            for name in status.split(","):
                name = name.strip().upper()
                if name not in _STATUS_IN:
                    raise GraphQLError(f"unknown session status {name!r}")
                wanted += _STATUS_IN[name]
        return await _call(self.ops.bai_compute_session_list(self.p, wanted, access_key,
                                                             offset, limit))

    async def agent_list(self, info, limit, offset, status=None, scaling_group=None,
                         filter=None, order=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        return await _call(self.ops.bai_agents(self.p, status, scaling_group, offset, limit))

    async def agent(self, info, agent_id):
        return agent_item(await _call(self.ops.get_agent(self.p, agent_id)))

    async def vfolder_list(self, info, limit, offset, group_id=None, filter=None, order=None):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        pid = _hex(group_id, "group id") if group_id else None
        return await _call(self.ops.bai_vfolder_list(self.p, pid, offset, limit))

    async def _vfolder_kind(self, kind, limit, offset, filter, order):
        _page_args(limit, offset)
        _unsupported(filter=filter, order=order)
        return await _call(self.ops.bai_vfolder_list(self.p, None, offset, limit, kind))

    async def vfolder_own_list(self, info, limit, offset, filter=None, order=None):
        return await self._vfolder_kind("own", limit, offset, filter, order)

    async def vfolder_invited_list(self, info, limit, offset, filter=None, order=None):
        return await self._vfolder_kind("invited", limit, offset, filter, order)

    async def vfolder_project_list(self, info, limit, offset, filter=None, order=None):
        return await self._vfolder_kind("project", limit, offset, filter, order)

    # -- admin mutations: the admin REST API's services, each in one transaction (a
    # refusal leaves nothing behind); answered as Backend.AI does, {ok, msg, <object>} --

    async def _mutate(self, fn, *args) -> dict:
        """``fn(*args)``: a coroutine function that checks the request and ends with at
        most one operation that writes, so a refusal leaves nothing behind."""
        self._pending = []
        try:
            out = {"ok": True, "msg": "success", **(await fn(*args) or {})}
        except BackendAIError as e:
            return {"ok": False, "msg": e.detail}
        except GraphQLError as e:
            return {"ok": False, "msg": e.message}
        self.changes += [c for c in self._pending if c]
        return out

    async def _hub(self, op, *args):
        """An operation of ``manager/apiviews.py`` that answers ``(result, HubChange)``: its
        result; its hub change is made if the mutation stands."""
        out, change = await op(self.p, *args)
        self._pending.append(change)
        return out

    @staticmethod
    def _domain_body(props: dict, schema: str, group: bool = False) -> dict:
        """A domain's (``group``: a project's) fields as the API takes them."""
        body = {k: v for k, v in props.items() if v is not None}
        if body.pop("integration_id", None):
            raise GraphQLError("integration_id: not supported by this server")
        if group and str(body.pop("type", "GENERAL")).upper() != "GENERAL":
            raise GraphQLError("type: only GENERAL groups (projects) here")
        return _checked(_parse_json_fields(body, "total_resource_slots",
                                           "allowed_vfolder_hosts"), schema)

    async def create_domain(self, info, name, props):
        async def run():
            body = self._domain_body({**props, "name": name}, "DomainCreate")
            return {"domain": _domain_item(await self.ops.create_domain(self.p, body))}
        return await self._mutate(run)

    async def modify_domain(self, info, name, props):
        async def run():
            if props.get("name") not in (None, name):
                raise GraphQLError("name: domains cannot be renamed on this server (the name "
                                   "keys its users, projects and folders): create a domain "
                                   "with the new name and move users to it (`admin user "
                                   "update EMAIL -d DOMAIN`)")
            body = self._domain_body({k: v for k, v in props.items() if k != "name"},
                                     "DomainUpdate")
            # (is_active false: its sessions and its users' hub access end, as in REST)
            return {"domain": _domain_item(await self._hub(self.ops.update_domain, name,
                                                           body))}
        return await self._mutate(run)

    async def delete_domain(self, info, name):
        # Backend.AI's delete_domain deactivates (``purge`` deletes)
        async def run():
            await self._hub(self.ops.update_domain, name, {"is_active": False})
        return await self._mutate(run)

    async def purge_domain(self, info, name):
        return await self._mutate(self.ops.delete_domain, self.p, name)

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

    async def create_keypair_resource_policy(self, info, name, props):
        async def run():
            body = self._policy_body({**props, "name": name}, "KeypairResourcePolicyCreate")
            return {"resource_policy": _policy_item(
                await self.ops.create_policy(self.p, "keypair", body))}
        return await self._mutate(run)

    async def modify_keypair_resource_policy(self, info, name, props):
        async def run():
            await self.ops.update_policy(
                self.p, "keypair", name,
                self._policy_body(dict(props), "KeypairResourcePolicyUpdate"))
        return await self._mutate(run)

    async def delete_keypair_resource_policy(self, info, name):
        return await self._mutate(self.ops.delete_policy, self.p, "keypair", name)

    @staticmethod
    def _rg_body(props: dict, schema: str) -> dict:
        body = {k: v for k, v in props.items() if v is not None}
        # Agents join a resource group by their own configuration ("static"); sessions'
        # apps are proxied by the hub, not a wsproxy; containers use their own networks.
        if body.pop("driver", "static") != "static":
            raise GraphQLError("driver: only 'static' here: agents join a resource group by "
                               "their own configuration (Backend.AI's other drivers, such as "
                               "cloud auto-scaling, are not offered)")
        if body.pop("driver_opts", "{}") not in ("{}", ""):
            raise GraphQLError("driver_opts: the static driver takes none; use "
                               "scheduler_opts for the scheduler's options")
        if body.pop("use_host_network", False):
            raise GraphQLError("use_host_network: not supported by this server")
        for k in ("wsproxy_addr", "wsproxy_api_token"):
            if body.pop(k, ""):
                raise GraphQLError(f"{k}: no wsproxy here (the hub proxies sessions' apps)")
        return _checked(_parse_json_fields(body, "scheduler_opts"), schema)

    async def create_scaling_group(self, info, name, props):
        async def run():
            body = self._rg_body({**props, "name": name}, "ResourceGroupCreate")
            return {"scaling_group": _rg_item(await self.ops.create_resource_group(self.p,
                                                                                   body))}
        return await self._mutate(run)

    async def modify_scaling_group(self, info, name, props):
        async def run():
            await self.ops.update_resource_group(
                self.p, name, self._rg_body(dict(props), "ResourceGroupUpdate"))
        return await self._mutate(run)

    async def delete_scaling_group(self, info, name):
        return await self._mutate(self.ops.delete_resource_group, self.p, name)

    async def _user_by_email(self, email: str) -> dict:
        rows = (await _call(self.ops.list_users(self.p, {"email": email}, 0, 1)))["items"]
        if not rows:
            raise GraphQLError(f"no user {email!r}")
        return rows[0]

    def _user_body(self, props: dict, schema: str) -> dict:
        # (a container id sent as null unsets it: 26.09's `--unset-cuid`)
        props = {k: v for k, v in props.items() if v is not None or k in _CONTAINER_IDS}
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

    async def create_user(self, info, email, props):
        async def run():
            body = self._user_body({**props, "email": email}, "UserCreate")
            return {"user": await self.ops.bai_create_user(self.p, body)}
        return await self._mutate(run)

    async def modify_user(self, info, email, props):
        async def run():
            user = await self._user_by_email(email)
            if props.get("username") is not None or props.get("main_access_key") is not None:
                raise GraphQLError("username, main_access_key: change them through the REST "
                                   "API (PATCH /keypairs/{access_key} is_default)")
            body = self._user_body(dict(props), "UserUpdate")
            # status, role, domain and groups: the hub follows (hubsync), as in REST
            return {"user": await self._hub(self.ops.bai_modify_user, user["id"], body)}
        return await self._mutate(run)

    async def delete_user(self, info, email):
        # Backend.AI's delete_user keeps the account with status "deleted" (purge deletes):
        # its sessions and hub access end, as with PATCH /users/{id} {"status": "deleted"}
        async def run():
            body = _checked({"status": "deleted"}, "UserUpdate")
            await self._hub(self.ops.update_user, (await self._user_by_email(email))["id"],
                            body)
        return await self._mutate(run)

    async def purge_user(self, info, email, props=None):
        # DELETE /users/{id}: refused while the user has folders (purge_shared_vfolders or
        # not: delete or hand them over first) or live sessions; the hub account goes too.
        # 26.09's delegate_endpoint_ownership: there are no model-serving endpoints here,
        # so there is nothing to hand over either way.
        async def run():
            await self._hub(self.ops.delete_user, (await self._user_by_email(email))["id"])
        return await self._mutate(run)

    # -- groups (projects); their JupyterHub groups follow (hubsync) --

    async def create_group(self, info, name, props):
        async def run():
            body = self._domain_body({**props, "name": name}, "ProjectCreate", group=True)
            return {"group": _group_item(await self._hub(self.ops.create_project, body))}
        return await self._mutate(run)

    async def modify_group(self, info, gid, props):
        async def run():
            pid = _hex(gid, "group id")
            props_ = dict(props)
            mode = props_.pop("user_update_mode", None)
            uids = props_.pop("user_uuids", None)
            if props_.get("domain_name") is not None:
                if props_.pop("domain_name") != (await _call(self.ops.get_project(
                        self.p, pid)))["domain_name"]:
                    raise GraphQLError("domain_name: groups (projects) cannot move to "
                                       "another domain")
            body = self._domain_body(props_, "ProjectUpdate", group=True)
            members = None
            if uids is not None or mode is not None:
                if mode not in ("add", "remove"):
                    raise GraphQLError(f"user_update_mode: 'add' or 'remove', not {mode!r}")
                ids = [_hex(u, "user id") for u in uids or []]
                if mode == "add":
                    ids = _checked({"user_ids": ids}, "MembersAdd")["user_ids"]
                elif not ids:
                    raise GraphQLError("user_uuids: which users")
                members = (mode, ids)
            # (is_active false: the project's sessions end, as in REST)
            group, changes = await self.ops.bai_modify_group(self.p, pid, body, members)
            self._pending += changes
            return {"group": _group_item(group)}
        return await self._mutate(run)

    async def delete_group(self, info, gid):
        # Backend.AI's delete_group deactivates (``purge`` deletes): its sessions end
        async def run():
            await self._hub(self.ops.update_project, _hex(gid, "group id"),
                            {"is_active": False})
        return await self._mutate(run)

    async def purge_group(self, info, gid):
        async def run():
            await self._hub(self.ops.delete_project, _hex(gid, "group id"))
        return await self._mutate(run)

    # -- scaling groups' associations: a resource group's allowed_domains,
    # allowed_projects and allowed_keypairs (PATCH /resource-groups/{name}) --

    async def _associate(self, name: str, field: str, key: str, add: bool) -> None:
        what = {"allowed_domains": "domain", "allowed_projects": "group (project)",
                "allowed_keypairs": "keypair"}[field]
        for _ in range(MAX_TRIES):
            g = await _call(self.ops.get_resource_group(self.p, name))
            now = list(g[field] or [])
            if add == (key in now):
                raise GraphQLError(f"scaling group {name!r} is {'already' if add else 'not'} "
                                   f"associated with {what} {key!r}")
            new = now + [key] if add else [k for k in now if k != key]
            new = _checked({field: new}, "ResourceGroupUpdate")[field]
            # (written only if nobody changed the list since it was read; else read again)
            if await self.ops.bai_set_association(self.p, name, field, now, new):
                return
        raise Conflict(f"scaling group {name!r} keeps changing; try again")

    async def associate_scaling_group_with_domain(self, info, scaling_group, domain):
        return await self._mutate(self._associate, scaling_group, "allowed_domains", domain,
                                  True)

    async def disassociate_scaling_group_with_domain(self, info, scaling_group, domain):
        return await self._mutate(self._associate, scaling_group, "allowed_domains", domain,
                                  False)

    async def disassociate_all_scaling_groups_with_domain(self, info, domain):
        # (a domain the caller can see)
        return await self._mutate(self.ops.bai_dissociate_all, self.p, "allowed_domains",
                                  domain)

    async def associate_scaling_group_with_user_group(self, info, scaling_group, user_group):
        return await self._mutate(lambda: self._associate(
            scaling_group, "allowed_projects", _hex(user_group, "group id"), True))

    async def disassociate_scaling_group_with_user_group(self, info, scaling_group, user_group):
        return await self._mutate(lambda: self._associate(
            scaling_group, "allowed_projects", _hex(user_group, "group id"), False))

    async def disassociate_all_scaling_groups_with_group(self, info, user_group):
        return await self._mutate(lambda: self.ops.bai_dissociate_all(
            self.p, "allowed_projects", _hex(user_group, "group id")))

    async def associate_scaling_group_with_keypair(self, info, scaling_group, access_key):
        return await self._mutate(self._associate, scaling_group, "allowed_keypairs",
                                  access_key, True)

    async def disassociate_scaling_group_with_keypair(self, info, scaling_group, access_key):
        return await self._mutate(self._associate, scaling_group, "allowed_keypairs",
                                  access_key, False)

    async def create_keypair(self, info, user_id, props):
        async def run():
            owner = await self._user_by_email(user_id)
            body = {k: v for k, v in props.items() if v is not None}
            if body.pop("concurrency_limit", None) is not None:
                raise GraphQLError("concurrency_limit: set it in the keypair resource policy")
            if body.get("is_admin") is False:
                del body["is_admin"]  # the CLI always sends it; only True is a request
            body = _checked({**body, "user_id": owner["id"]}, "KeypairCreate")
            return {"keypair": await self.ops.bai_create_keypair(self.p, body)}
        return await self._mutate(run)

    async def modify_keypair(self, info, access_key, props):
        async def run():
            body = {k: v for k, v in props.items() if v is not None}
            if body.pop("concurrency_limit", None) is not None:
                raise GraphQLError("concurrency_limit: set it in the keypair resource policy")
            await self.ops.update_keypair(self.p, access_key, _checked(body, "KeypairUpdate"))
        return await self._mutate(run)

    async def delete_keypair(self, info, access_key):
        return await self._mutate(self.ops.delete_keypair, self.p, access_key)

    # -- images (issue 25: api/compat/images.py) --

    async def images(self, info, is_installed=None, is_operation=None, image_filters=None):
        return await _call(compat_images.list_images(self.manager, self.p, is_installed))

    async def rescan_images(self, info, registry=None, project=None):
        async def run():
            return {"task_id": await compat_images.start_rescan(self.manager, self.p, registry)}
        return await self._mutate(run)

    async def alias_image(self, info, alias, target, architecture=None):
        return await self._mutate(self.ops.alias_image, self.p, alias, target)

    async def dealias_image(self, info, alias, architecture=None):
        return await self._mutate(self.ops.dealias_image, self.p, alias)


def _parse_json_fields(body: dict, *fields: str) -> dict:
    """The mutation inputs the client sends as JSON strings, parsed in place."""
    for k in fields:
        if k in body:
            try:
                body[k] = json.loads(body[k])
            except ValueError:
                raise GraphQLError(f"{k}: not JSON: {body[k]!r}") from None
    return body


_CONTAINER_IDS = ("container_uid", "container_main_gid", "container_gids")


def _checked(body: dict, schema_name: str) -> dict:
    """``body`` checked by the REST API's request model (``base.validate``: the same
    check and words as the REST endpoint); a field this server does not keep is named."""
    unknown = sorted(set(body) - set(models.model(schema_name).model_fields))
    if unknown:
        raise GraphQLError(f"{', '.join(unknown)}: not supported by this server")
    try:
        return validate_body(schema_name, body)
    except InvalidRequest as e:
        raise GraphQLError(e.detail) from None


async def _call(operation):
    """An operation's answer; its refusal (not found, forbidden, ...) is a GraphQL error
    in its words."""
    try:
        return await operation
    except BackendAIError as e:
        raise GraphQLError(e.detail) from None


async def _all(op, *args) -> list:
    return (await _call(op(*args, 0, ALL)))["items"]


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
    (``hubsync.apply``) after their transactions committed."""

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
    volumes = await vfolders._volumes(manager) if "storage_volume" in query else {}
    # Each root field asks the manager's named operations, one transaction each
    # (mutations one after another, as GraphQL runs them).
    root = Root(manager, p, volumes)
    result = execute_document(SCHEMA, doc, root_value=root, variable_values=variables or {},
                              field_resolver=_field_resolver)
    if isawaitable(result):
        result = await result
    changes = root.changes
    if changes and hub is None:
        raise RuntimeError("mutations JupyterHub mirrors need the request's handler")
    for change in changes:
        await hubsync.apply(hub, change)
    return _answer(result)


__all__ = ["execute", "dashed", "bai_status", "session_item", "SCHEMA"]
