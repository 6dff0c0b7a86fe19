"""What the manager asks an agent to start: one kernel of a session, typed.

The manager builds a :class:`KernelSpec` (manager/lifecycle/start.py); it travels as
JSON (:meth:`KernelSpec.to_wire`, ``version`` first) to an agent in this process or
over HTTP, and the agent reads it back with :meth:`KernelSpec.from_wire`, which
refuses (400) a spec of another version or of the wrong shape before anything is
taken. Resource amounts stay :class:`ResourceSlot` (decimal strings on the wire)
until the agent turns them into the engine's integers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)

from .errors import InvalidRequest
from .slots import ResourceSlot

# The wire form's version: an agent refuses a spec of another version (a manager and
# agents of different releases say so plainly instead of misreading each other).
VERSION = 2


class ClusterSSH(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    private_key: str
    public_key: str


class KernelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    version: Literal[2] = VERSION
    kernel_id: str = Field(min_length=1)
    session_id: str = Field(min_length=1)
    owner: str = ""
    image: str = Field(min_length=1)
    slots: ResourceSlot
    environ: dict[str, str] = {}
    service_prefix: str = "/"
    kernel_type: Literal["interactive", "batch", "idle"] = "interactive"
    command: str | None = None
    cluster_hostname: str | None = None
    network_alias: str | None = None
    # {"source", "target", "mode"}: checked by the agent (agent/mountpoints.py check_mounts)
    mounts: tuple[dict, ...] = ()
    cluster_role: Literal["main", "sub"] = "main"
    cluster_agents: int = Field(1, ge=1)
    cluster_ssh: ClusterSSH | None = None
    ssh_public_key: str | None = None
    # Issue 24: the kernel's bounds from its owner's keypair resource policy (None: the
    # agent's own defaults, Agent.kernel_pids_limit / Agent.kernel_tmp_size).
    pids_limit: int | None = Field(None, ge=32)
    tmp_size: int | None = Field(None, ge=1 << 20)
    # Issue 27: Backend.AI 26.09's container ids of the owner (None: the image's user);
    # the Docker backend runs the kernel as container_uid:container_main_gid with
    # container_gids as its supplementary groups.
    container_uid: int | None = Field(None, ge=1)
    container_main_gid: int | None = Field(None, ge=1)
    container_gids: tuple[int, ...] = ()
    # Issue 27: Backend.AI's dotfiles of the owner, their project and domain
    # ({"path" under /home/work, "permission" in octal, "data"}), written into the
    # kernel's home folder before it starts (manager/templates.py session_dotfiles).
    dotfiles: tuple[dict, ...] = ()
    # Issue 30: a pooled kernel of this warm pool (its key), started with no user's
    # folder, environment or token, bound to a session later (agent/warmpool.py).
    pool: str | None = Field(None, max_length=400)
    # Issue 30: the other starts the manager drives on this kernel's agent now; a
    # starting kernel's CPU burst is shared with them (agent/backends/cpuburst.py).
    starts_beside: int = Field(0, ge=0)

    @field_validator("slots", mode="before")
    @classmethod
    def _slots(cls, v):
        if isinstance(v, ResourceSlot):
            return v
        if not isinstance(v, dict):
            raise ValueError("slots must be an object of slot names and amounts")
        try:
            return ResourceSlot.from_json(v)
        except (ValueError, ArithmeticError, TypeError) as e:
            raise ValueError(f"slots: {e}") from None

    @field_validator("mounts", mode="before")
    @classmethod
    def _mounts(cls, v):
        if v is None:
            return ()
        if not isinstance(v, (list, tuple)):
            raise ValueError("mounts must be a list")
        return v

    @field_serializer("slots")
    def _slots_out(self, v: ResourceSlot):
        return v.to_json()

    def to_wire(self) -> dict:
        """The JSON form sent to an agent."""
        return self.model_dump(mode="json")

    @classmethod
    def from_wire(cls, data) -> KernelSpec:
        """Read a spec sent by a manager; InvalidRequest (400) names what is wrong."""
        if isinstance(data, KernelSpec):
            return data
        if not isinstance(data, dict):
            raise InvalidRequest("a kernel spec is a JSON object")
        version = data.get("version")
        if version != VERSION:
            raise InvalidRequest(
                f"kernel spec version {version!r} is not understood by this agent (it reads "
                f"version {VERSION}): run the manager and agents of one release")
        try:
            spec = cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "spec"
            raise InvalidRequest(f"kernel spec: {where}: {first['msg']}") from None
        if spec.kernel_type == "batch" and not (spec.command or "").strip():
            raise InvalidRequest("a batch kernel needs a command")
        return spec
