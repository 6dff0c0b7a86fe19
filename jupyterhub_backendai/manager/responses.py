"""The response bodies of the admin API, built from the record.

One pydantic model per body, read from the ORM row it shows
(``Model.model_validate(row, from_attributes=True)``, or :meth:`Response.body` for the
JSON the API sends). Where a field is derived, the model says how, once:

- slots as ``{name: exact decimal string}`` (:data:`SlotsOut`), datetimes as
  ``datetime.isoformat()`` strings (:data:`Time`, ``+00:00``, never pydantic's ``Z``),
  JSON columns that may hold null as ``{}``/``[]``;
- fields named differently on the row (``Session.type`` is ``session_type``,
  ``User.project_ids`` are the ids of ``projects``) through a second validation alias,
  so the schema keeps the API's name;
- what the record adds from other rows (a folder's ``my_permission``, a share's
  ``email``) is given with the row: ``Model.body(With(row, email=...))``.

These are the OpenAPI document's component schemas too: ``api/models.py`` re-exports
them in place, next to the request models, and builds the document from both. They
live here, below the front ends, because the manager builds the bodies (it may not
import ``api/``) and because they read the record's attribute names, which are the
manager's business; ``common/`` is shared with the agent and the storage proxy,
which serve none of these.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter

from ..common.slots import ResourceSlot
from ..common.types import (
    SessionStatus,
    UserRole,
    UserStatus,
    VFolderOwnership,
    VFolderPermission,
    VFolderStatus,
)


def literal_of(values) -> Any:
    """``Literal`` of the string values of an enum (or of a tuple of strings)."""
    return Literal[tuple(str(getattr(v, "value", v)) for v in values)]


class With:
    """A row seen with some more attributes: what a body adds from other rows or from
    the caller (``With(folder, my_permission="rw")``)."""

    __slots__ = ("_row", "_more")

    def __init__(self, row: Any, **more: Any) -> None:
        self._row = row
        self._more = more

    def __getattr__(self, name: str) -> Any:
        more = self._more
        return more[name] if name in more else getattr(self._row, name)


# -- derived fields ------------------------------------------------------------------


def _iso(v):
    return v.isoformat() if isinstance(v, dt.datetime) else v


def _slots(v):
    return None if v is None else ResourceSlot(v).to_json()


def _ids(v):
    return sorted(getattr(x, "id", x) for x in v)


def _or_dict(v):
    return {} if v is None else v


def _or_list(v):
    return [] if v is None else v


def _also(name: str, row_name: str) -> Any:
    """The field ``name``, read from the row's ``row_name`` (the schema says ``name``)."""
    return Field(validation_alias=AliasChoices(name, row_name))


Time = Annotated[str, BeforeValidator(_iso), Field(json_schema_extra={"format": "date-time"})]
TimeOrNone = Annotated[str, BeforeValidator(_iso)] | None  # (no format in the document)
SlotsOut = Annotated[dict[str, str], BeforeValidator(_slots),
                     Field(description="Resource slots as exact decimal strings.")]
Object = Annotated[dict[str, Any], BeforeValidator(_or_dict)]
StrList = Annotated[list[str], BeforeValidator(_or_list)]
Ids = Annotated[list[str], BeforeValidator(_ids)]
Permission = literal_of(VFolderPermission)
#: A folder in the trash (:mod:`.vfolders`): a status of the record beside VFolderStatus's.
TRASHED = "delete-pending"


_LISTS: dict[type, TypeAdapter] = {}  # a list of each body, built when first asked


class Response(BaseModel):
    """A response body: every field is always present."""

    model_config = ConfigDict(regex_engine="python-re", from_attributes=True)

    @classmethod
    def body(cls, row: Any) -> dict:
        """The JSON the API sends for ``row`` (an ORM row, a :class:`With`, a dict)."""
        return cls.model_validate(row, from_attributes=True).model_dump(mode="json")

    @classmethod
    def bodies(cls, rows: Iterable) -> list[dict]:
        """:meth:`body` of each row: a list validated and dumped at once (a page, a
        user's sessions for :mod:`.session_lists`)."""
        adapter = _LISTS.get(cls)
        if adapter is None:
            adapter = _LISTS[cls] = TypeAdapter(list[cls])
        return adapter.dump_python(adapter.validate_python(list(rows), from_attributes=True),
                                   mode="json")


# -- domains, projects, users, keypairs ------------------------------------------------


class Domain(Response):
    name: str
    description: str
    is_active: bool
    total_resource_slots: SlotsOut
    allowed_vfolder_hosts: Object
    allowed_docker_registries: StrList
    created_at: Time


class Project(Response):
    id: str
    name: str
    domain_name: str
    description: str
    is_active: bool
    total_resource_slots: SlotsOut
    allowed_vfolder_hosts: Object
    resource_policy: str | None
    created_at: Time


class MembersChanged(Response):
    project_id: str
    group: str
    added: Annotated[StrList, Field(description="usernames that became members")]
    user_ids: StrList


class User(Response):
    id: str
    email: str
    username: str
    full_name: str
    status: literal_of(UserStatus)
    role: literal_of(UserRole)
    domain_name: str
    resource_policy: str | None
    need_password_change: bool
    allowed_client_ip: list[str] | None
    project_ids: Annotated[Ids, _also("project_ids", "projects")]
    created_at: Time
    container_uid: int | None = None
    container_main_gid: int | None = None
    container_gids: list[int] | None = None


class NewKeypair(Response):
    access_key: str
    secret_key: str


class UserCreated(User):
    keypair: NewKeypair


class Keypair(Response):
    access_key: str
    user_id: str
    is_active: bool
    is_admin: bool
    is_default: bool
    rate_limit: int
    num_queries: int
    last_used: TimeOrNone
    resource_policy: str
    created_at: Time


class KeypairCreated(Keypair):
    secret_key: Annotated[str, Field(description="shown in this response only")]


# -- resource policies, resource groups, agents -----------------------------------------


class KeypairResourcePolicy(Response):
    name: str
    total_resource_slots: SlotsOut
    default_for_unspecified: str
    max_concurrent_sessions: int
    max_containers_per_session: int
    max_session_lifetime: int
    idle_timeout: int
    max_lifetime_extension: int = 0
    max_priority: int
    max_pending_session_count: int | None
    max_pending_session_resource_slots: SlotsOut | None
    allowed_vfolder_hosts: Object
    max_pids_per_kernel: int | None = None
    max_tmp_size: int | None = None
    created_at: Time


class QuotaPolicy(Response):
    name: str
    max_vfolder_count: int
    max_quota_scope_size: int
    created_at: Time


class ResourceGroup(Response):
    name: str
    description: str
    is_active: bool
    is_public: bool
    scheduler: str
    scheduler_opts: Object
    allowed_domains: StrList
    allowed_projects: StrList
    allowed_keypairs: StrList
    created_at: Time


class ResourcePreset(Response):
    name: str
    description: str
    resource_slots: SlotsOut
    resource_group: Annotated[str | None, Field(
        description="offered only in this resource group; null: in every group")]
    created_at: Time


class UsageFigures(Response):
    sessions: Annotated[int, Field(description="sessions that ran inside the period")]
    hours: Annotated[float, Field(description="their running hours inside the period")]
    cpu_hours: Annotated[float, Field(description="allocated cores x running hours")]
    mem_gib_hours: Annotated[float, Field(description="allocated GiB of memory x running hours")]
    gpu_hours: Annotated[float, Field(description="allocated GPUs (and MIG instances) x "
                                                  "running hours")]
    sampled_hours: Annotated[float, Field(description="hours of the kernels' running time "
                                                      "whose live use was sampled")]
    used_cpu_hours: Annotated[float, Field(description="cores in use x sampled hours (the "
                                                       "kernels' CPU time)")]
    used_mem_gib_hours: Annotated[float, Field(description="GiB of memory in use x sampled "
                                                           "hours")]
    used_gpu_hours: Annotated[float, Field(description="GPUs busy (utilisation x GPUs held) "
                                                       "x sampled hours")]


class UsageRow(UsageFigures):
    key: Annotated[str, Field(description="the user's or project's id, the domain's or "
                                          "resource group's name")]
    name: Annotated[str, Field(description="the key in words (a project as DOMAIN/NAME)")]


class UsageReport(Response):
    start: Time
    end: Time
    group_by: str
    items: list[UsageRow]
    total: UsageFigures


class Agent(Response):
    id: str
    status: str
    resource_group: str
    addr: str
    architecture: str
    backend: str
    available_slots: SlotsOut
    occupied_slots: SlotsOut
    away_slots: Annotated[dict[str, str], BeforeValidator(lambda v: _slots(v) or {}), Field(
        description="Its GPUs that another agent of the same host (another installation's "
                    "kernels) holds now, as its last heartbeat said; the scheduler counts "
                    "them as taken.")]
    schedulable: bool
    version: str
    first_contact: Time
    last_heartbeat: Time


# -- sessions ------------------------------------------------------------------------


class Kernel(Response):
    id: str
    cluster_role: str
    cluster_idx: int
    cluster_hostname: str
    agent_id: str | None
    status: str
    exit_code: int | None


class VFolderMount(Response):
    id: str
    name: str
    host: str
    permission: str
    target: str


class Session(Response):
    id: str
    name: str
    type: Annotated[str, _also("type", "session_type")]
    user_id: str
    access_key: str
    domain_name: str
    project_id: str | None
    resource_group: str
    image: str
    cluster_size: int
    cluster_mode: str
    priority: int
    requested_slots: SlotsOut
    status: literal_of(SessionStatus)
    status_info: str
    result: str
    startup_command: str | None
    batch_timeout: int | None
    starts_at: TimeOrNone
    architecture: str | None
    designated_agents: StrList
    dependencies: Ids
    created_at: Time
    terminated_at: TimeOrNone
    kernels: list[Kernel]
    vfolder_mounts: Annotated[list[VFolderMount], BeforeValidator(_or_list)]


class KernelLogs(Response):
    id: str
    cluster_hostname: str
    logs: str | None


class SessionLogs(Response):
    session_id: Annotated[str, _also("session_id", "id")]
    status: str
    kernels: list[KernelLogs]


class SessionLifetime(Response):
    """When a session ends by itself (issue 29, manager/lifetimes.py)."""

    session_id: str
    status: str
    running_since: Annotated[TimeOrNone, Field(description="when it began to run")]
    lifetime: Annotated[int, Field(description="its keypair policy's max_session_lifetime "
                                               "(seconds; 0: none)")]
    extension: Annotated[int, Field(description="seconds added to the lifetime so far")]
    extension_left: Annotated[int, Field(description="seconds that may still be added")]
    lifetime_ends: Annotated[TimeOrNone, Field(description="when the lifetime ends (null: "
                                                           "no limit, or not running)")]
    idle_timeout: Annotated[int, Field(description="seconds without activity before it is "
                                                   "stopped (0: never)")]
    idle_ends: Annotated[TimeOrNone, Field(description="when it is stopped if nothing happens "
                                                       "before (null: never, or not running)")]


class SessionSSHKey(Response):
    session_id: str
    access_key: Annotated[str, Field(description="the keypair the key derives from")]
    user: str
    host: str
    port: int
    public_key: str
    private_key: Annotated[str, Field(description="OpenSSH format, unencrypted")]


class Whoami(Response):
    user: User
    role: literal_of(UserRole)
    domain: Domain
    projects: list[Project]
    keypair: Annotated[str | None, Field(description="access key that signed the request, "
                                                     "if any")]


# -- virtual folders -----------------------------------------------------------------


class VFolder(Response):
    id: str
    name: str
    host: str
    quota_scope_id: str
    ownership_type: literal_of(VFolderOwnership)
    user_id: str | None
    project_id: str | None
    domain_name: str
    creator: str
    usage_mode: str
    permission: Annotated[Permission, Field(
        description="the owner's (user folder) or every member's (project)")]
    status: literal_of((*VFolderStatus, TRASHED))
    my_permission: Annotated[Permission | None, Field(
        description="what the caller may do with the files (null: nothing)")]
    max_size_bytes: Annotated[int | None, Field(
        description="the folder's own size limit in bytes (null: only its quota scope's)")]
    used_bytes: Annotated[int | None, Field(
        description="bytes the storage counts in the folder (a folder's own view; in a "
        "listing only where it is cheap, on btrfs volumes; null where it was not read or "
        "the storage did not answer)")] = None
    created_at: Time


class VFolderShare(Response):
    vfolder_id: str
    user_id: str
    email: str | None
    permission: Permission
    created_at: Time


class VFolderInvitation(Response):
    id: str
    vfolder_id: str
    vfolder_name: str | None
    inviter: str | None
    inviter_id: str
    invitee: str | None
    invitee_id: str
    permission: Permission
    state: Literal["pending", "accepted", "rejected", "canceled"]
    created_at: Time
    modified_at: Time | None


class VFolderHost(Response):
    permissions: list[str]
    volume: dict[str, Any]


class VFolderHosts(Response):
    default: str
    allowed: Annotated[list[str], Field(description="hosts where the caller has at least one "
                                                    "permission")]
    hosts: dict[str, VFolderHost]


# -- images (issue 25: manager/images.py) ------------------------------------------


class RescanProgress(Response):
    """A registry's rescan as the hub answering knows it (manager/registries.py):
    running (``done`` of ``total`` images read; ``total`` 0 while the repositories and
    tags are listed), done (``result``) or failed (``error``)."""

    state: Literal["running", "done", "failed"]
    done: int
    total: int
    words: str
    started_at: Time
    finished_at: Time | None = None
    error: str | None = None


class ContainerRegistry(Response):
    """A container registry (issue 25); never its password: ``has_password``.
    ``rescan``: its last or current rescan on this hub (none since it started: null)."""

    name: str
    url: str
    project: str
    username: str
    has_password: bool
    has_ca_cert: bool
    pull_policy: str
    last_scan: Time | None = None
    created_at: Time
    rescan: RescanProgress | None = None


class Image(Response):
    """An image of the catalogue (issue 25)."""

    name: str
    source: str
    repo: str
    tag: str
    digest: str
    architecture: str
    size_bytes: int
    labels: Object
    aliases: list[str]
    description: str
    hidden: bool
    is_default: bool
    pull_policy: str | None = None  # null: the registry's
    min_slots: dict[str, str]
    scanned_at: Time
    owner_id: Annotated[str | None, Field(
        description="the user whose session was committed to this image (listed and "
        "started for them only); null: the installation's")] = None


class ImageRescan(Response):
    """What a rescan of a registry found."""

    registry: str
    found: int
    added: int
    updated: int
    removed: int
