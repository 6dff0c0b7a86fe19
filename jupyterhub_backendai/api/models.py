"""The admin API's typed contract: request and response bodies as pydantic models.

One class per body. From these follow, with nothing written twice:

- validation of request bodies (:func:`validate`, used by ``APIBase.body`` and by the
  GraphQL mutations of :mod:`.compat.gql`), with errors in plain words (a pattern is
  said in words, never quoted; types as "a string", "a whole number");
- the component schemas of the OpenAPI 3.1 document (:func:`component_schemas`, read by
  :mod:`.spec`).

The response models live in :mod:`..manager.responses` (the manager builds the bodies
from the record with them, and may not import ``api/``); they are named here, each in
its place among the requests, so that the registry and the document keep one order.

Request models forbid unknown fields (``additionalProperties: false``) and are strict:
a whole number is never a bool or ``5.0``, a string is never a number. Optional fields
that are not nullable default to ``None`` without accepting ``null``; the handlers get
the body as sent (only the fields the caller gave).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    ValidationError,
    WithJsonSchema,
    WrapValidator,
    model_validator,
)
from pydantic.json_schema import models_json_schema
from pydantic_core import PydanticCustomError

from ..common.errors import InvalidRequest
from ..common.session_request import (
    ERROR_TYPE,
    ClusterMode,
    SessionRequest,
    SessionRequestError,
    SessionType,
    as_validator,
    human_slots,
)
from ..common.slots import (
    MIG_PROFILE_WORDS,
    MIG_SLOT_PATTERN,
    SLOT_NAME_PATTERN,
    SLOT_NAMES_WORDS,
    ResourceSlot,
)
from ..common.types import UserRole, UserStatus
from ..manager import responses
from ..manager.capacity import KNOWN_SCHEDULERS
from ..manager.responses import Response
from ..manager.vfolders import MAX_PATH, USAGE_MODES

INT32 = 2**31 - 1
INT64 = 2**63 - 1
MAX_LIMIT = 500
REF = "#/components/schemas/{model}"


_enum = responses.literal_of

# -- the words for patterns: errors and the CLI's --help say these, never a regex --------

NAME_PATTERN = "^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$"
USERNAME_PATTERN = "^[a-z0-9][a-z0-9._-]{0,63}$"
VFOLDER_NAME_PATTERN = "^\\.?[A-Za-z0-9][A-Za-z0-9._-]*$"
RESOURCE_PATTERN = "^(?:cpu|mem|gpu|" + MIG_SLOT_PATTERN[1:-1] + ")$"

PATTERN_WORDS = {
    NAME_PATTERN:
        "must be 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter or digit",
    "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$":
        "must be 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter or digit",
    VFOLDER_NAME_PATTERN:
        "must be 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter or digit "
        "or with one '.' before it (a folder mounted into every session of its owner)",
    USERNAME_PATTERN:
        "must be 1 to 64 lower-case letters, digits, '.', '_' or '-', beginning with a "
        "letter or digit",
    # Slot names (cpu, mem, cuda.device, cuda.mig-<profile>) and a session's resources.
    SLOT_NAME_PATTERN: "slot names must be " + SLOT_NAMES_WORDS,
    RESOURCE_PATTERN: "resources are cpu, mem, gpu or cuda.mig-<profile> (" +
                      MIG_PROFILE_WORDS + ")",
}

# -- field types --------------------------------------------------------------------


def Str(max_len: int = 64, min_len: int | None = None, **kw) -> Any:
    return Annotated[str, Field(max_length=max_len, min_length=min_len, **kw)]


def Int(lo: int = 0, hi: int = INT32) -> Any:
    return Annotated[int, Field(ge=lo, le=hi)]


def _pattern(pattern: str, **kw) -> Any:
    return Annotated[str, Field(pattern=pattern, json_schema_extra={
        "x-message": PATTERN_WORDS[pattern]}, **kw)]


Name = Annotated[str, Field(min_length=1, max_length=64, pattern=NAME_PATTERN)]
Id = Str(32)
Time = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
Text = Str(512)
Amount = Annotated[str, Field(max_length=32)] | float
_AMOUNT_SCHEMA = {"anyOf": [{"type": "string", "maxLength": 32}, {"type": "number"}]}
SlotName = _pattern(SLOT_NAME_PATTERN)
ResourceName = _pattern(RESOURCE_PATTERN)
SlotsIn = Annotated[dict[SlotName, Amount], WithJsonSchema({
    "type": "object",
    "description": "Resource slots: cpu (cores), mem (bytes, or a size such as 4g), "
                   "cuda.device (GPUs), cuda.mig-<profile> (MIG instances of that profile, "
                   "e.g. cuda.mig-1g.10gb; whole numbers). Amounts as decimal strings or "
                   "numbers.",
    "propertyNames": {"type": "string", "pattern": SLOT_NAME_PATTERN,
                      "x-message": PATTERN_WORDS[SLOT_NAME_PATTERN]},
    "additionalProperties": _AMOUNT_SCHEMA,
})]
VFolderHostsIn = Annotated[dict[str, Annotated[list[Str(64)], Field(max_length=32)]],
                           Field(max_length=64)]
Strings = Annotated[list[Str(64)], Field(max_length=256)]
Ids = Annotated[list[Id], Field(max_length=500)]
VFolderName = Annotated[str, Field(min_length=1, max_length=64, pattern=VFOLDER_NAME_PATTERN)]
FilePath = Annotated[str, Field(min_length=1, max_length=MAX_PATH,
                                description="relative to the folder's root; no '..'")]
Object = dict[str, Any]
StrList = list[str]
Permission = responses.Permission


class Request(BaseModel):
    """A request body: unknown fields refused, types strict."""

    model_config = ConfigDict(extra="forbid", strict=True, regex_engine="python-re")


class Problem(Response):
    """RFC 9457 problem details; every error has this body."""

    type: str
    title: str
    status: int
    detail: str


# -- domains -------------------------------------------------------------------------


Domain = responses.Domain


class _Named(Request):
    """A created object's name, first in the requests that inherit it (not a schema)."""

    name: Name


class DomainUpdate(Request):
    description: Text = None
    is_active: bool = None
    total_resource_slots: SlotsIn = None
    allowed_vfolder_hosts: VFolderHostsIn = None
    allowed_docker_registries: Strings = None


class DomainCreate(DomainUpdate, _Named):
    """A new domain: its name, and the fields of DomainUpdate."""


# -- projects ------------------------------------------------------------------------


Project = responses.Project


class ProjectUpdate(Request):
    name: Name = None
    description: Text = None
    is_active: bool = None
    total_resource_slots: SlotsIn = None
    allowed_vfolder_hosts: VFolderHostsIn = None
    resource_policy: Str(64) | None = None


class ProjectCreate(ProjectUpdate):
    name: Name
    domain_name: Str(64) = None
    member_ids: Annotated[list[Id], Field(
        max_length=500, description="users of the project's domain who join it at once "
                                    "(in the same transaction: all or nothing)")] = None


class MembersAdd(Request):
    user_ids: Annotated[list[Id], Field(min_length=1, max_length=500)]


MembersChanged = responses.MembersChanged


# -- users ---------------------------------------------------------------------------


User = responses.User


class UserUpdate(Request):
    email: Str(128, 3) = None
    password: Str(72, 8) = None
    full_name: Str(128) = None
    status: _enum(UserStatus) = None
    role: _enum(UserRole) = None
    domain_name: Str(64) = None
    resource_policy: Str(64) | None = None
    need_password_change: bool = None
    allowed_client_ip: Annotated[list[Str(64)], Field(max_length=64)] | None = None
    project_ids: Ids = None
    # Backend.AI 26.09's: the ids of the user's kernels' processes (superadmins; null:
    # the image's kernel user). Stored, not yet applied by the agents.
    container_uid: Annotated[Int(1), Field(
        description="uid of the user's kernel processes (superadmins set it; null: the "
        "image's kernel user)")] | None = None
    container_main_gid: Annotated[Int(1), Field(
        description="their primary gid (superadmins)")] | None = None
    container_gids: Annotated[list[Int(1)], Field(
        max_length=64, description="their supplementary gids (superadmins)")] | None = None


class UserCreate(UserUpdate):
    email: Str(128, 3)
    password: Str(72, 8)
    username: Annotated[str, Field(max_length=64, pattern=USERNAME_PATTERN)] = None


NewKeypair = responses.NewKeypair
UserCreated = responses.UserCreated


# -- keypairs ------------------------------------------------------------------------


Keypair = responses.Keypair


class KeypairCreate(Request):
    user_id: Id = None
    is_active: bool = None
    rate_limit: Int() = None
    resource_policy: Str(64) = None
    is_admin: bool = None


KeypairCreated = responses.KeypairCreated


class KeypairUpdate(Request):
    is_active: bool = None
    rate_limit: Int() = None
    resource_policy: Str(64) = None
    is_admin: bool = None
    is_default: bool = None


# -- resource policies ----------------------------------------------------------------


KeypairResourcePolicy = responses.KeypairResourcePolicy


class KeypairResourcePolicyUpdate(Request):
    total_resource_slots: SlotsIn = None
    default_for_unspecified: Literal["UNLIMITED", "LIMITED"] = None
    max_concurrent_sessions: Int() = None
    max_containers_per_session: Int() = None
    max_session_lifetime: Int() = None
    idle_timeout: Int() = None
    max_lifetime_extension: Int() = None
    max_priority: Int(0, 100) = None
    max_pending_session_count: Int() | None = None
    max_pending_session_resource_slots: SlotsIn | None = None
    allowed_vfolder_hosts: VFolderHostsIn = None
    max_pids_per_kernel: Annotated[Int(32, 4_194_304) | None, Field(
        description="processes and threads one kernel may run; null: the agent's default")] = None
    max_tmp_size: Annotated[Int(1 << 20, INT64) | None, Field(
        description="bytes of each kernel's /tmp and /var/tmp (tmpfs, counted in its "
                    "memory); null: the agent's default")] = None


class KeypairResourcePolicyCreate(KeypairResourcePolicyUpdate, _Named):
    """A new keypair resource policy: its name, and the fields of KeypairResourcePolicyUpdate."""


QuotaPolicy = responses.QuotaPolicy


class QuotaPolicyUpdate(Request):
    max_vfolder_count: Int() = None
    max_quota_scope_size: Int(0, INT64) = None


class QuotaPolicyCreate(QuotaPolicyUpdate, _Named):
    """A new user or project resource policy: its name, and the fields of QuotaPolicyUpdate."""


# -- resource groups and agents -------------------------------------------------------


ResourceGroup = responses.ResourceGroup


class ResourceGroupUpdate(Request):
    description: Text = None
    is_active: bool = None
    is_public: bool = None
    scheduler: _enum(KNOWN_SCHEDULERS) = None
    scheduler_opts: Annotated[Object, Field(max_length=32)] = None
    allowed_domains: Strings = None
    allowed_projects: Ids = None
    allowed_keypairs: Annotated[list[Str(20)], Field(max_length=500)] = None


class ResourceGroupCreate(ResourceGroupUpdate, _Named):
    """A new resource group: its name, and the fields of ResourceGroupUpdate."""


ResourcePreset = responses.ResourcePreset


class ResourcePresetUpdate(Request):
    description: Text = None
    resource_slots: SlotsIn = None
    resource_group: Annotated[Str(64) | None, Field(
        description="offered only in this resource group; null: in every group")] = None


class ResourcePresetCreate(ResourcePresetUpdate):
    """A new resource preset: its name (what a request names: {"preset": "<name>"}), and
    the fields of ResourcePresetUpdate."""

    name: _pattern(USERNAME_PATTERN, max_length=64)
    resource_slots: SlotsIn


Agent = responses.Agent


class AgentUpdate(Request):
    schedulable: Annotated[bool, Field(
        description="false: decommissioned, the scheduler places no new session there (its "
                    "sessions run on); true: back in service")] = None
    resource_group: Str(64, 1, description=(
        "move a live agent without kernels to this resource group: the agent is told and "
        "keeps it across restarts, over its configuration's")) = None
UsageReport = responses.UsageReport


# -- images (issue 25) ---------------------------------------------------------------


ContainerRegistry = responses.ContainerRegistry
Image = responses.Image
ImageRescan = responses.ImageRescan


class ContainerRegistryUpdate(Request):
    """A registry's settings; ``password`` is kept as a secret (never answered)."""

    url: Str(512) = None
    project: Str(128) = None
    username: Str(128) = None
    password: Str(512) = None
    ca_cert: Str(16384) = None
    pull_policy: _enum(("digest", "tag", "none")) = None


class ContainerRegistryCreate(ContainerRegistryUpdate, _Named):
    """A new container registry: its name, ``url``, and the fields of ContainerRegistryUpdate."""


class ImageUpdate(Request):
    """``pull_policy``: this image's own (``registry``: its registry's again)."""

    description: Text = None
    hidden: bool = None
    is_default: bool = None
    pull_policy: _enum(("digest", "tag", "none", "registry")) = None


class ImageAliasCreate(Request):
    alias: Str(256)


# -- sessions ------------------------------------------------------------------------


Kernel = responses.Kernel
VFolderMount = responses.VFolderMount
Session = responses.Session


Resources = Annotated[dict[ResourceName, Amount], WithJsonSchema({
    "type": "object",
    "properties": {"cpu": _AMOUNT_SCHEMA, "mem": _AMOUNT_SCHEMA, "gpu": _AMOUNT_SCHEMA},
    "propertyNames": {"type": "string", "pattern": RESOURCE_PATTERN,
                      "x-message": PATTERN_WORDS[RESOURCE_PATTERN]},
    "additionalProperties": _AMOUNT_SCHEMA,
    "description": "cpu (cores), mem (a size such as 4g), gpu (whole GPUs), "
                   "cuda.mig-<profile> (whole MIG instances of that profile, e.g. "
                   "cuda.mig-1g.10gb)",
})]


def _rest_slots(resources, handler) -> ResourceSlot:
    """The body's ``resources`` checked by their schema, then read as sent (a whole
    number stays one: 1 GPU, not 1.0) into the slots of one kernel."""
    handler(resources)
    return as_validator(human_slots)(resources)


def _rest_time(value: str) -> dt.datetime:
    """The admin API's ``starts_at``: ISO 8601, a time without a zone taken as UTC."""
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise SessionRequestError(f"starts_at: {value!r} is not an ISO 8601 date-time") from None
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


#: The admin API's names of a session request, in the document's order.
SESSION_CREATE_FIELDS = ("name", "image", "resources", "resource_group", "type", "project",
                         "cluster_size", "cluster_mode", "priority", "startup_command",
                         "batch_timeout", "starts_at", "dependencies", "mounts")


def _session_create_schema(schema: dict) -> None:
    """The wire's fields in the wire's order; the request's fields the API does not take
    (designated agents, architecture) left out, and no defaults (said in words)."""
    props = schema["properties"]
    schema.pop("description", None)
    schema["properties"] = {k: {n: v for n, v in props[k].items() if n != "default"}
                            for k in SESSION_CREATE_FIELDS}
    schema["required"] = [k for k in SESSION_CREATE_FIELDS if k in schema.get("required", ())]


class SessionCreate(SessionRequest, Request):
    """The admin API's body of a new (batch) session: the one :class:`SessionRequest`
    read strictly from the wire's names (``resources`` in people's units, ``type``),
    with the session's name; the handler hands this instance to the manager."""

    model_config = ConfigDict(extra="forbid", strict=True, regex_engine="python-re",
                              json_schema_extra=_session_create_schema)

    image: Str(512, 1)
    slots: Annotated[Resources, WrapValidator(_rest_slots)] = Field(
        default_factory=lambda: human_slots({}), alias="resources")
    session_type: Annotated[Literal["batch"], AfterValidator(SessionType), Field(
        description=("API sessions are batch sessions; interactive sessions are JupyterHub "
                     "servers."))] = Field(SessionType.BATCH, alias="type")
    resource_group: Str(64) = "default"
    project: Str(64, description="project id or name in the caller's domain") = None
    cluster_size: Int(1, 16) = 1
    cluster_mode: Annotated[Literal["single-node", "multi-node"],
                            AfterValidator(ClusterMode)] = ClusterMode.SINGLE_NODE
    priority: Int(0, 100) = None
    startup_command: Str(8192, 1)
    batch_timeout: Int(1) | None = None
    starts_at: Annotated[Time, AfterValidator(as_validator(_rest_time))] | None = None
    dependencies: Annotated[list[Id], Field(max_length=64)] = ()
    mounts: Annotated[list[Str(64, 1)], Field(
        max_length=64, description="vfolders (names or ids) mounted at /home/work/<name>")] = ()
    name: Name

    #: The body's fields in the document's order (the model's: the request's, then name).
    wire_fields: ClassVar[tuple[str, ...]] = SESSION_CREATE_FIELDS
    # pydantic's own constructor: a ValidationError, said in the API's words by parse().
    __init__ = BaseModel.__init__

    @model_validator(mode="before")
    @classmethod
    def _only_the_wire(cls, data):
        """The request's fields the admin API does not take are unknown here."""
        if isinstance(data, dict) and set(data) - set(SESSION_CREATE_FIELDS):
            raise PydanticCustomError("extra_forbidden", "Extra inputs are not permitted")
        return data


KernelLogs = responses.KernelLogs
SessionLogs = responses.SessionLogs


class ServicePort(Response):
    """One service port; host and port only for tcp ports the agent published."""

    name: str
    protocol: str
    container_port: int
    url: Annotated[str | None, Field(description="where the app answers, behind the hub's "
                                                 "login (null: not an HTTP port)")]
    host: Annotated[str, Field(description="tcp ports the agent published (sshd, sftp; "
                                           "opt-in per resource group): the node's address")] = None
    port: Annotated[int, Field(description="tcp ports: the host port")] = None


class SessionServicePorts(Response):
    session_id: str
    status: str
    server_url: Annotated[str | None, Field(description=(
        "the session's Jupyter server (null: a batch session serves nothing)"))]
    adhoc_url_template: Annotated[str | None, Field(description=(
        "any other port: replace {port} (jupyter-server-proxy)"))]
    service_ports: list[ServicePort]


SessionSSHKey = responses.SessionSSHKey
SessionLifetime = responses.SessionLifetime


class SessionExtend(Request):
    seconds: Annotated[Int(1), Field(description="seconds to add to the session's lifetime "
                                                 "(within its keypair policy's "
                                                 "max_lifetime_extension)")]


class SessionCommit(Request):
    name: Annotated[Str(64, 1), Field(description="the new image's name under the registry's "
                                                  "project and the owner's name (default: "
                                                  "the session's name)")] = None
Whoami = responses.Whoami


class SchedulerStatus(RootModel[Object]):
    """per resource group: the queue and what the scheduler did"""


# -- virtual folders -----------------------------------------------------------------


VFolder = responses.VFolder


class VFolderCreate(Request):
    name: VFolderName
    host: Str(128, 1, description="<storage proxy>:<volume>; default: the hub's "
              "default_vfolder_host") = None
    project: Str(64, 1, description="project id or name (in the caller's domain): a project "
                 "folder (domain admins)") = None
    permission: Annotated[Permission, Field(
        description="what every member of a project folder may do, or what the owner "
        "of a user folder may do with its files (default rw)")] = None
    usage_mode: _enum(USAGE_MODES) = None
    max_size_bytes: Annotated[int, Field(ge=1, le=2**63 - 1, description=(
        "the folder's own size limit in bytes, at most its quota scope's (the owner's "
        "resource policy's max_quota_scope_size); default: none, only the scope's "
        "applies"))] = None


class VFolderClone(Request):
    name: VFolderName
    project: Str(64, 1, description="project id or name: the clone is a folder of that "
                 "project (domain admins); default: the caller's own") = None
    permission: Annotated[Permission, Field(
        description="a project clone's members' permission (default rw)")] = None
    usage_mode: _enum(USAGE_MODES) = None


class VFolderUpdate(Request):
    name: VFolderName = None
    permission: Annotated[Permission, Field(
        description="a project folder's members', a user folder's owner's")] = None
    usage_mode: _enum(USAGE_MODES) = None
    max_size_bytes: Annotated[int | None, Field(ge=1, le=2**63 - 1, description=(
        "the folder's own size limit in bytes, at most its quota scope's; null removes "
        "it (only the scope's applies). Applied on the storage at once; a limit below "
        "what the folder holds stops further writes"))] = None


VFolderShare = responses.VFolderShare


class VFolderShareCreate(Request):
    email: Str(128, 3, description="a user of the folder's domain")
    permission: Permission = None


class VFolderShareUpdate(Request):
    permission: Permission


VFolderInvitation = responses.VFolderInvitation


class VFolderInvitationCreate(Request):
    email: Str(128, 3, description="a user of the folder's domain")
    permission: Permission = None


class VFolderFile(Response):
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mtime: Annotated[float, Field(description="seconds since the epoch")]


class VFolderFiles(Response):
    path: str
    items: list[VFolderFile]


class VFolderMkdir(Request):
    path: FilePath
    parents: Annotated[bool, Field(description=(
        "also the missing directories above it, and an existing directory is no error "
        "(mkdir -p)"))] = None


class VFolderRename(Request):
    path: FilePath
    new_path: Annotated[str, Field(min_length=1, max_length=MAX_PATH, description=(
        "where it goes, relative to the folder's root"))]


class VFolderFileDone(Response):
    path: str
    size: int


class VFolderPath(Response):
    path: str


VFolderHost = responses.VFolderHost


VFolderHosts = responses.VFolderHosts


# -- warm pools (issue 30, manager/warmpool.py) -----------------------------------------


class WarmPoolSet(Request):
    """How many kernels of an image and a resource preset a resource group keeps started
    and unassigned; 0 removes the pool (its kernels go at the next round)."""

    resource_group: Str(64, 1)
    image: Annotated[Str(256, 1), Field(description="the image as sessions name it")]
    preset: Annotated[Str(64, 1), Field(description="a resource preset without GPUs")]
    size: Annotated[int, Field(ge=0, le=100, description="kernels kept warm; 0: none")]


class WarmPool(Response):
    resource_group: str
    image: str
    preset: str
    size: int
    ready: int = Field(description="pooled kernels started and unassigned now")
    hits: int = Field(description="starts that took a pooled kernel (this hub process)")
    misses: int = Field(description="matching starts that found none ready (this hub process)")
    status_info: str = Field(description="why the pool is not full; empty when it is")


# -- the registry ----------------------------------------------------------------------

#: Every body of the API by its schema name (the OpenAPI component's name).
SCHEMAS: dict[str, type[BaseModel]] = {
    name: obj for name, obj in dict(globals()).items()
    if isinstance(obj, type) and issubclass(obj, (BaseModel, RootModel))
    and obj.__module__ in (__name__, responses.__name__) and name.isidentifier() and not name.startswith("_")
    and obj not in (Request, Response)
}


def model(name: str) -> type[BaseModel]:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise KeyError(f"no schema {name!r} in the API's models") from None


def _clean(schema, *, in_properties: bool = False):
    """pydantic's JSON Schema without its generated titles and ``default: null``."""
    if isinstance(schema, list):
        return [_clean(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    if in_properties:
        return {k: _clean(v) for k, v in schema.items()}
    out = {}
    for key in sorted(schema, key=lambda k: (_ORDER.index(k) if k in _ORDER else len(_ORDER))):
        value = schema[key]
        if key == "title" or (key == "default" and value is None):
            continue
        if key == "const":  # a single choice is a choice: said as an enum
            key, value = "enum", [value]
        out[key] = _clean(value, in_properties=key in ("properties", "$defs"))
    return out


# The order of keywords in the document (readability only).
_ORDER = ["$ref", "type", "description", "enum", "anyOf", "format", "minLength", "maxLength",
          "pattern", "x-message", "minimum", "maximum", "minItems", "maxItems", "items",
          "maxProperties", "properties", "required", "propertyNames", "additionalProperties"]


def component_schemas() -> dict[str, dict]:
    """The OpenAPI document's ``components.schemas``: one per model, in declaration order."""
    _, top = models_json_schema([(m, "validation") for m in SCHEMAS.values()],
                                ref_template=REF)
    defs = _clean(top.get("$defs", {}), in_properties=True)
    ordered = {name: defs[name] for name in SCHEMAS if name in defs}
    ordered.update({k: v for k, v in defs.items() if k not in ordered})
    for name, m in SCHEMAS.items():
        s = ordered[name]
        if issubclass(m, Response) and s.get("type") == "object":
            # Every listed property of a response is present (optional ones are said so).
            s["required"] = [k for k, f in m.model_fields.items() if f.is_required()]
    return json.loads(json.dumps(ordered))


# -- validation in words ---------------------------------------------------------------

_TYPE_WORDS = {
    "string_type": "a string", "int_type": "a whole number", "float_type": "a number",
    "bool_type": "true or false", "dict_type": "an object", "model_type": "an object",
    "model_attributes_type": "an object", "list_type": "a list", "none_required": "null",
    "int_from_float": "a whole number",
}
# Tags pydantic puts into an error's location for the members of a union.
_UNION_TAGS = re.compile(r"^(str|constrained-str|float|int|bool|none|list\[.*\]|dict\[.*\]|"
                         r"literal\[.*\]|function-.*)$")


def _where(loc) -> str:
    loc = list(loc)
    if "[key]" in loc:  # a bad key of an object: said of the object (as JSON Schema does)
        loc = loc[:max(0, loc.index("[key]") - 1)]
    parts = [str(x) for x in loc if not _UNION_TAGS.match(str(x))]
    return ".".join(parts) or "body"


def _words(err: dict) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    value = err.get("input")
    if kind == "string_pattern_mismatch":
        return PATTERN_WORDS.get(ctx.get("pattern"), "is not in the accepted form")
    if kind in _TYPE_WORDS:
        return "must be " + _TYPE_WORDS[kind]
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters long"
    if kind == "string_too_short":
        n = ctx["min_length"]
        return "must not be empty" if n == 1 else f"must be at least {n} characters long"
    if kind in ("literal_error", "enum"):
        choices = re.findall(r"'((?:[^'\\]|\\.)*)'", str(ctx.get("expected", "")))
        return f"{value!r} is not one of {choices!r}"
    if kind == "greater_than_equal":
        return f"{value!r} is less than the minimum of {ctx['ge']}"
    if kind == "less_than_equal":
        return f"{value!r} is greater than the maximum of {ctx['le']}"
    if kind in ("too_short", "too_long"):
        what = "entries" if ctx.get("field_type") == "Dictionary" else "items"
        if kind == "too_short":
            n = ctx["min_length"]
            return "must not be empty" if n == 1 else f"must have at least {n} {what}"
        return f"must have at most {ctx['max_length']} {what}"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field missing"
    return str(err.get("msg", "is not valid"))


def error_words(exc: ValidationError, order: tuple[str, ...] = ()) -> str:
    """A pydantic error as one sentence for the caller: ``<field>: <words>``. Errors of
    the members of a union (a string or a number) are said together. A rule of the
    session request (:data:`ERROR_TYPE`) says its own sentence. ``order``: the fields'
    order, first error first (by default pydantic's)."""
    errors = exc.errors(include_url=False)
    if order:
        errors.sort(key=lambda e: order.index(e["loc"][0]) if e["loc"] and e["loc"][0] in order
                    else len(order))
    first = errors[0]
    if first["type"] == ERROR_TYPE:
        return first["ctx"]["detail"]
    where = _where(first["loc"])
    same = [e for e in errors if _where(e["loc"]) == where]
    kinds = [e["type"] for e in same]
    if len(same) > 1 and all(k in _TYPE_WORDS for k in kinds):
        words = "must be " + " or ".join(dict.fromkeys(_TYPE_WORDS[k] for k in kinds))
    else:
        words = _words(first)
    return f"{where}: {words}"


def _wire_fields(m: type[BaseModel]) -> dict[str, Any]:
    """A request model's fields by the names the body uses (aliases), in its order."""
    fields = {f.alias or n: f for n, f in m.model_fields.items()}
    order = getattr(m, "wire_fields", None) or tuple(fields)
    return {k: fields[k] for k in order}


def parse(schema_name: str, data: dict) -> BaseModel:
    """``data`` (a JSON object) as the request model ``schema_name``, or
    :class:`InvalidRequest` (400) in plain words. Unknown fields are named first, then
    missing required ones, then the first wrong value."""
    m = model(schema_name)
    fields = _wire_fields(m)
    if m.model_config.get("extra") == "forbid":
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise InvalidRequest(f"unknown field(s): {', '.join(map(repr, unknown))} "
                                 f"(allowed: {', '.join(fields)})")
    for name, f in fields.items():
        if f.is_required() and name not in data:
            raise InvalidRequest(f"{name}: required field missing")
    try:
        return m.model_validate(data)
    except ValidationError as e:
        raise InvalidRequest(error_words(e, tuple(fields))) from None


def check(schema_name: str, data: dict) -> dict:
    """``data`` checked by the request model ``schema_name`` (:func:`parse`): the data
    as given (for the bodies whose handlers read the fields as sent)."""
    parse(schema_name, data)
    return data
