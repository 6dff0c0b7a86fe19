"""The admin API's operations on capacity: resource policies (keypair, user, project),
resource groups, resource presets and agents. As in :mod:`.admin`: each runs inside one
database transaction, takes the caller's :class:`~.access.Principal` first, and either
completes or raises a 4xx :class:`BackendAIError` with nothing half-done."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import func, or_, select

from ..common.errors import Conflict, InvalidRequest
from ..common.types import ALIVE_STATUSES, AgentStatus
from ..models import (
    Agent,
    Domain,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ProjectResourcePolicy,
    ResourceGroup,
    ResourcePreset,
    Session,
    User,
    UserResourcePolicy,
)
from . import access, crud, responses
from .access import Principal
from .ops import reads, writes

# Sequencers the scheduler knows by name (Backend.AI's): a resource group names one.
KNOWN_SCHEDULERS = ("fifo", "lifo", "drf")
DEFAULT = crud.DEFAULT


# -- resource policies -----------------------------------------------------------

POLICIES = {
    "keypair": (KeypairResourcePolicy, responses.KeypairResourcePolicy, "keypair resource policy",
                ("total_resource_slots", "default_for_unspecified", "max_concurrent_sessions",
                 "max_containers_per_session", "max_session_lifetime", "idle_timeout",
                 "max_lifetime_extension",
                 "max_priority", "max_pending_session_count",
                 "max_pending_session_resource_slots", "allowed_vfolder_hosts",
                 "max_pids_per_kernel", "max_tmp_size"),
                Keypair.resource_policy),
    "user": (UserResourcePolicy, responses.QuotaPolicy, "user resource policy",
             ("max_vfolder_count", "max_quota_scope_size"), User.resource_policy),
    "project": (ProjectResourcePolicy, responses.QuotaPolicy, "project resource policy",
                ("max_vfolder_count", "max_quota_scope_size"), Project.resource_policy),
}


def _policy_reader(p: Principal) -> None:
    access.require(p.is_superadmin or p.reads_domain, "read resource policies")


@reads
def list_policies(db, p: Principal, kind: str, filters: dict, offset: int, limit: int) -> dict:
    model, view, *_ = POLICIES[kind]
    _policy_reader(p)
    return crud.page(db, select(model), [model.name], offset, limit, view)


def _get_policy(db, p: Principal, kind: str, name: str):
    model, _, label, *_ = POLICIES[kind]
    _policy_reader(p)
    return crud.visible(db, model, name, label, lambda _row: True)


@reads
def get_policy(db, p: Principal, kind: str, name: str) -> dict:
    return POLICIES[kind][1].body(_get_policy(db, p, kind, name))


@writes
def create_policy(db, p: Principal, kind: str, body: dict) -> dict:
    model, view, label, fields, _ = POLICIES[kind]
    access.require(access.may_change_installation(p), f"create {label.removesuffix('policy')}policies")
    crud.check_name("name", body["name"])
    return view.body(crud.insert_named(db, model, label, body, fields))


@writes
def update_policy(db, p: Principal, kind: str, name: str, body: dict) -> dict:
    _, view, label, fields, _ = POLICIES[kind]
    access.require(access.may_change_installation(p), f"change the {label} {name!r}")
    return crud.updated(db, _get_policy(db, p, kind, name), body, fields, view)


@writes
def delete_policy(db, p: Principal, kind: str, name: str) -> None:
    _, _, label, _, ref = POLICIES[kind]
    access.require(access.may_change_installation(p), f"delete the {label} {name!r}")
    row = _get_policy(db, p, kind, name)
    crud.delete_unused(db, row, label, (ref,), f"{label} {name!r} is in use")


# -- resource groups -------------------------------------------------------------

GROUP_FIELDS = ("description", "is_active", "is_public", "scheduler", "scheduler_opts",
                "allowed_domains", "allowed_projects", "allowed_keypairs")


@reads
def list_resource_groups(db, p: Principal, filters: dict, offset: int, limit: int) -> dict:
    stmt = crud.filtered(select(ResourceGroup).where(access.resource_group_filter(db, p)),
                         filters, {"is_active": ResourceGroup.is_active})
    return crud.page(db, stmt, [ResourceGroup.name], offset, limit, responses.ResourceGroup)


def _get_group(db, p: Principal, name: str) -> ResourceGroup:
    return crud.visible(db, ResourceGroup, name, "resource group",
                        crud.in_usable_group(db, p, lambda g: g.name))


@reads
def get_resource_group(db, p: Principal, name: str) -> dict:
    return responses.ResourceGroup.body(_get_group(db, p, name))


def _check_group_body(db, body: dict) -> None:
    if "scheduler" in body and body["scheduler"] not in KNOWN_SCHEDULERS:
        raise InvalidRequest(
            f"scheduler: unknown {body['scheduler']!r} (known: {', '.join(KNOWN_SCHEDULERS)})")
    if "scheduler_opts" in body:
        from .scheduler.options import SchedulerOptions

        try:
            SchedulerOptions.from_json(body["scheduler_opts"])
        except InvalidRequest as e:
            raise InvalidRequest(f"scheduler_opts: {e.detail}") from None
    for field, model, label in (("allowed_domains", Domain, "domain"),
                                ("allowed_projects", Project, "project"),
                                ("allowed_keypairs", Keypair, "keypair")):
        for key in body.get(field, []):
            if db.get(model, key) is None:
                raise InvalidRequest(f"{field}: no {label} {key!r}")


@writes
def create_resource_group(db, p: Principal, body: dict) -> dict:
    access.require(access.may_change_installation(p), "create resource groups")
    crud.check_name("name", body["name"])
    _check_group_body(db, body)
    return responses.ResourceGroup.body(
        crud.insert_named(db, ResourceGroup, "resource group", body, GROUP_FIELDS))


@writes
def update_resource_group(db, p: Principal, name: str, body: dict) -> dict:
    g = _get_group(db, p, name)
    access.require(access.may_change_installation(p), "change resource groups")
    _check_group_body(db, body)
    return crud.updated(db, g, body, GROUP_FIELDS, responses.ResourceGroup)


@writes
def delete_resource_group(db, p: Principal, name: str) -> None:
    g = _get_group(db, p, name)
    access.require(access.may_change_installation(p), "delete resource groups")
    crud.delete_unused(db, g, "resource group", (Agent.resource_group, Session.resource_group),
                       f"resource group {name!r} has agents or sessions")


def usable_groups(db, p: Principal) -> set[str] | None:
    return access.usable_group_names(db, p)


# -- resource presets ------------------------------------------------------------
# Backend.AI's resource presets: named resource slots the spawn form offers as cards
# (beside c.BackendAISpawner.presets), each in every resource group or in one. Anyone
# logged in reads those of the groups they may use (the form shows them); superadmins
# change them (an installation's object, like resource groups).

PRESET_FIELDS = ("description", "resource_slots", "resource_group")
CUSTOM_PRESET = "custom"  # the form's own "Custom" choice: not a preset's name


def _preset_filter(db, p: Principal):
    names = access.usable_group_names(db, p)
    if names is None:
        return True
    return or_(ResourcePreset.resource_group.is_(None), ResourcePreset.resource_group.in_(names))


@reads
def list_resource_presets(db, p: Principal, filters: dict, offset: int, limit: int) -> dict:
    stmt = select(ResourcePreset).where(_preset_filter(db, p))
    if "resource_group" in filters:
        stmt = stmt.where(or_(ResourcePreset.resource_group.is_(None),
                              ResourcePreset.resource_group == filters["resource_group"]))
    return crud.page(db, stmt, [ResourcePreset.name], offset, limit, responses.ResourcePreset)


def _get_preset(db, p: Principal, name: str) -> ResourcePreset:
    return crud.visible(db, ResourcePreset, name, "resource preset",
                        crud.in_usable_group(db, p, lambda row: row.resource_group))


@reads
def get_resource_preset(db, p: Principal, name: str) -> dict:
    return responses.ResourcePreset.body(_get_preset(db, p, name))


def _check_preset_body(db, body: dict, creating: bool) -> None:
    if creating and body["name"] == CUSTOM_PRESET:
        raise InvalidRequest(f"name: {CUSTOM_PRESET!r} is the form's own choice of custom "
                             "resources; choose another name")
    if "resource_slots" in body:
        slots = crud.parse_slots("resource_slots", body["resource_slots"] or {})
        if not any(Decimal(v) > 0 for v in slots.values()):
            raise InvalidRequest("resource_slots: give at least one amount above zero "
                                 "(e.g. cpu 2, mem 4g)")
    if body.get("resource_group") is not None:
        crud.need(db, ResourceGroup, body["resource_group"], "resource_group", "resource group")


@writes
def create_resource_preset(db, p: Principal, body: dict) -> dict:
    access.require(access.may_change_installation(p), "create resource presets")
    _check_preset_body(db, body, creating=True)
    return responses.ResourcePreset.body(
        crud.insert_named(db, ResourcePreset, "resource preset", body, PRESET_FIELDS))


@writes
def update_resource_preset(db, p: Principal, name: str, body: dict) -> dict:
    row = _get_preset(db, p, name)
    access.require(access.may_change_installation(p), f"change the resource preset {name!r}")
    _check_preset_body(db, body, creating=False)
    return crud.updated(db, row, body, PRESET_FIELDS, responses.ResourcePreset)


@writes
def delete_resource_preset(db, p: Principal, name: str) -> None:
    row = _get_preset(db, p, name)
    access.require(access.may_change_installation(p), f"delete the resource preset {name!r}")
    db.delete(row)
    db.flush()


# -- agents --------------------------------------------------------------------


def _agent_reader(p: Principal) -> None:
    access.require(p.is_superadmin or p.reads_domain, "read agents")


@reads
def list_agents(db, p: Principal, filters: dict, offset: int, limit: int) -> dict:
    _agent_reader(p)
    stmt = crud.filtered(select(Agent).where(access.agent_filter(db, p)), filters,
                         {"resource_group": Agent.resource_group, "status": Agent.status})
    return crud.page(db, stmt, [Agent.id], offset, limit, responses.Agent)


def _get_agent(db, p: Principal, aid: str) -> Agent:
    _agent_reader(p)
    return crud.visible(db, Agent, aid, "agent", crud.in_usable_group(db, p, lambda a: a.resource_group))


@reads
def get_agent(db, p: Principal, aid: str) -> dict:
    return responses.Agent.body(_get_agent(db, p, aid))


def _live_kernels(db, aid: str) -> int:
    return db.scalar(select(func.count()).select_from(Kernel).join(
        Session, Kernel.session_id == Session.id).where(
        Kernel.agent_id == aid, Session.status.in_(list(ALIVE_STATUSES))))


def _movable(db, p: Principal, aid: str, group: str) -> Agent:
    a = _get_agent(db, p, aid)
    access.require(access.may_change_installation(p), f"change the agent {aid!r}")
    if db.get(ResourceGroup, group) is None:
        raise InvalidRequest(f"there is no resource group {group!r}")
    if a.resource_group == group:
        return a
    if a.status != AgentStatus.ALIVE:
        raise Conflict(f"agent {aid!r} is {a.status}: only a live agent is moved to another "
                       "resource group (it is told, and keeps the group across restarts)")
    live = _live_kernels(db, aid)
    if live:
        raise Conflict(f"agent {aid!r} holds {live} kernel{'' if live == 1 else 's'} of "
                       f"sessions in {a.resource_group!r}: decommission it (schedulable "
                       "false) and move it once they have ended")
    return a


@reads
def check_agent_move(db, p: Principal, aid: str, group: str) -> bool:
    """Whether agent ``aid`` may be moved to resource group ``group`` now (raises why
    not: the caller's role, a group that does not exist, an agent that is not alive or
    still holds kernels); False when it is in that group already."""
    return _movable(db, p, aid, group).resource_group != group


@writes
def update_agent(db, p: Principal, aid: str, body: dict) -> dict:
    """Decommission an agent (``schedulable: false``: the scheduler places no new
    session there; its sessions run on to their end) or return it to service; record
    its move to another resource group (``resource_group``, after the agent itself was
    told: :meth:`.reconcile.Agents.move`)."""
    a = _get_agent(db, p, aid)
    access.require(access.may_change_installation(p), f"change the agent {aid!r}")
    if "schedulable" in body:
        a.schedulable = bool(body["schedulable"])
    if body.get("resource_group") is not None:
        a = _movable(db, p, aid, body["resource_group"])
        a.resource_group = body["resource_group"]
    db.flush()
    return responses.Agent.body(a)


@writes
def delete_agent(db, p: Principal, aid: str) -> None:
    """Remove a gone agent from the record: one that is not ALIVE (LOST, TERMINATED) and
    holds no session that is still alive. Its ended kernels keep their rows, no longer
    naming it."""
    a = _get_agent(db, p, aid)
    access.require(access.may_change_installation(p), f"remove the agent {aid!r}")
    if a.status == AgentStatus.ALIVE:
        raise Conflict(f"agent {aid!r} is alive: decommission it (schedulable false) so that "
                       "it takes no new sessions, stop it when its sessions have ended, then "
                       "remove it")
    live = _live_kernels(db, aid)
    if live:
        raise Conflict(f"agent {aid!r} still holds {live} kernel{'' if live == 1 else 's'} of "
                       "sessions that have not ended")
    for k in db.scalars(select(Kernel).where(Kernel.agent_id == aid)):
        k.agent_id = None
    db.delete(a)
    db.flush()
