"""One session request, validated once.

Every way of starting a session builds a :class:`SessionRequest`: the spawn form and
JupyterHub's ``user_options`` (:meth:`SessionRequest.from_options`, through the
spawner), the admin REST API (:class:`..api.handlers.SessionsHandler`), the Backend.AI
client API and fixtures (the manager's ``enqueue`` keywords, which build one). Building
it checks the *form* of everything (types, ranges, the enums, the human units of
cpu/mem/gpu) and raises one error, :class:`SessionRequestError` (a 400), whose
message names the field in plain words. What depends on the record (the image exists,
some agent could ever fit it, the quota, the folders) is checked by the manager
(``BackendAIManager.check_request``), once per request: a request it has checked is
not checked again by ``enqueue``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal, InvalidOperation
from enum import StrEnum

from .errors import InvalidRequest
from .slots import (
    CPU,
    CUDA,
    MEM,
    MIG_PREFIX,
    ResourceSlot,
    format_bytes,
    is_known_slot,
    is_mig_slot,
    parse_decimal,
    parse_size,
    unknown_slot_words,
)


class SessionRequestError(InvalidRequest):
    """A malformed session request (400); the message says which field and why."""


class SessionType(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class ClusterMode(StrEnum):
    SINGLE_NODE = "single-node"
    MULTI_NODE = "multi-node"


#: Options of the form and of ``user_options`` (besides ``preset``, handled before).
OPTION_KEYS = ("image", "cpu", "mem", "gpu", "cluster_size", "cluster_mode", "project", "mounts")
MIN_MEM = 64 * 2**20
# Kernels in one session, as the admin API's schema bounds them: the admission and
# placement checks work per kernel, so an unbounded number (10**12 through the spawn
# form or the Backend.AI routes) held the hub's event loop for days.
MAX_CLUSTER_SIZE = 16


def whole_number(name: str, value, *, minimum: int | None = None, maximum: int | None = None,
                 text: bool = False) -> int:
    """``value`` as an int: a whole number and not a bool (True is an int in Python),
    within ``minimum``..``maximum``; ``text``: a form field's digits too ("3"). The one
    place this is checked."""
    if minimum is not None and maximum is not None:
        what = f"a whole number from {minimum} to {maximum}"
    elif minimum is not None:
        what = f"a whole number >= {minimum}"
    else:
        what = "a whole number"
    if text and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if (not isinstance(value, int) or isinstance(value, bool)
            or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)):
        raise SessionRequestError(f"{name} must be {what}, not {value!r}")
    return value


def _choice(enum: type[StrEnum], name: str, value) -> StrEnum:
    try:
        return enum(value)
    except ValueError:
        raise SessionRequestError(
            f"{name} must be one of {', '.join(m.value for m in enum)}, not {value!r}") from None


def resources(options: dict) -> tuple[str, ResourceSlot]:
    """``image``, ``cpu`` (cores), ``mem`` (a size: 512m, 2g, 1.5 GiB), ``gpu`` (whole
    devices) and ``cuda.mig-<profile>`` (whole MIG instances of that profile, e.g.
    ``cuda.mig-1g.10gb``) as (image, slots per kernel). Missing cpu/mem/gpu: 1 core,
    1 GiB, none."""
    image = options.get("image")
    if not isinstance(image, str) or not image.strip():
        raise SessionRequestError("image is required")
    try:
        cpu = parse_decimal("cpu", options.get("cpu", 1))
        gpu = parse_decimal("gpu", options.get("gpu", 0))
    except InvalidRequest as e:
        raise SessionRequestError(e.detail) from None
    try:
        mem = parse_size(options.get("mem", "1g"))
    except InvalidRequest:
        raise SessionRequestError(
            f"mem must be a size like 512m, 2g or 1.5 GiB, not {options.get('mem')!r}") from None
    if cpu <= 0:
        raise SessionRequestError(f"cpu must be positive, not {cpu}")
    try:
        hundredths = cpu.quantize(Decimal("0.01"))
    except InvalidOperation:  # (more digits than Decimal keeps: 1e30 was a 500)
        raise SessionRequestError(f"cpu {cpu} is more cores than any machine has") from None
    if cpu != hundredths:
        raise SessionRequestError("cpu takes at most two decimal places")
    if mem < MIN_MEM:
        raise SessionRequestError(f"mem must be at least 64m (64 MiB), not {format_bytes(mem)}")
    if gpu < 0 or gpu != gpu.to_integral_value():
        raise SessionRequestError(f"gpu must be a whole number >= 0, not {gpu}")
    slots = ResourceSlot({CPU: cpu, MEM: mem})
    if gpu:
        slots[CUDA] = gpu
    for key in sorted(k for k in options if isinstance(k, str) and k.startswith(MIG_PREFIX)):
        if not is_mig_slot(key):
            raise SessionRequestError(unknown_slot_words(key))
        n = mig_count(key, options[key])
        if n:
            slots[key] = Decimal(n)
    return image.strip(), slots


def mig_count(slot: str, value) -> int:
    """A ``cuda.mig-<profile>`` amount: a whole number of MIG instances (text digits too)."""
    try:
        d = parse_decimal(slot, value)
    except InvalidRequest:
        d = None
    if d is None or d < 0 or d != d.to_integral_value():
        raise SessionRequestError(
            f"{slot} must be a whole number of MIG instances (0 or more), not {value!r}")
    return int(d)


def _ids(name: str, values) -> tuple[str, ...]:
    if isinstance(values, str) or not all(isinstance(v, str) and v for v in values):
        raise SessionRequestError(f"{name} must be a list of ids")
    return tuple(values)


@dataclasses.dataclass(frozen=True, eq=False)
class SessionRequest:
    """What a session is asked to be; constructing one validates it (or raises
    :class:`SessionRequestError`). ``slots`` are per kernel; the session has
    ``cluster_size`` kernels. ``project``: a project id or name of the user's (None:
    their first). ``mounts``: folder names or ids, at ``/home/work/<name>``."""

    image: str
    slots: ResourceSlot
    session_type: SessionType = SessionType.INTERACTIVE
    resource_group: str = "default"
    project: str | None = None
    cluster_size: int = 1
    cluster_mode: ClusterMode = ClusterMode.SINGLE_NODE
    priority: int | None = None
    startup_command: str | None = None
    batch_timeout: int | None = None
    starts_at: dt.datetime | None = None
    dependencies: tuple[str, ...] = ()
    designated_agents: tuple[str, ...] = ()
    architecture: str | None = None
    mounts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        def put(field: str, value) -> None:
            object.__setattr__(self, field, value)

        if not isinstance(self.image, str) or not self.image.strip():
            raise SessionRequestError("image is required")
        put("image", self.image.strip())
        if not isinstance(self.slots, dict):
            raise SessionRequestError("slots must be an object of slot names and amounts")
        for key in self.slots:
            if not is_known_slot(key):
                raise SessionRequestError(f"slots: {unknown_slot_words(key)}")
            if is_mig_slot(key):
                mig_count(key, self.slots[key])
        put("slots", ResourceSlot(self.slots))
        put("session_type", _choice(SessionType, "session_type", self.session_type))
        put("cluster_mode", _choice(ClusterMode, "cluster_mode", self.cluster_mode))
        put("cluster_size", whole_number("cluster_size", self.cluster_size, minimum=1))
        if self.cluster_size > MAX_CLUSTER_SIZE:
            raise SessionRequestError(
                f"cluster_size must be at most {MAX_CLUSTER_SIZE}, not {self.cluster_size}")
        if not isinstance(self.resource_group, str) or not self.resource_group:
            raise SessionRequestError("resource_group must be a name")
        if self.project is not None and (not isinstance(self.project, str) or not self.project):
            raise SessionRequestError("project must be a project's name or id")
        if self.priority is not None:
            whole_number("priority", self.priority, minimum=0, maximum=100)
        if self.session_type == SessionType.BATCH:
            if not isinstance(self.startup_command, str) or not self.startup_command.strip():
                raise SessionRequestError("a batch session needs a startup_command")
        elif self.startup_command is not None:
            raise SessionRequestError(
                "startup_command is for batch sessions (session_type='batch') only")
        if self.batch_timeout is not None:
            if self.session_type != SessionType.BATCH:
                raise SessionRequestError(
                    "batch_timeout is for batch sessions (session_type='batch') only")
            try:
                whole_number("batch_timeout", self.batch_timeout, minimum=1)
            except SessionRequestError:
                raise SessionRequestError(f"batch_timeout must be a whole number of seconds > 0, "
                                          f"not {self.batch_timeout!r}") from None
        starts_at = self.starts_at
        if isinstance(starts_at, str):
            try:
                starts_at = dt.datetime.fromisoformat(starts_at)
            except ValueError:
                raise SessionRequestError(
                    f"starts_at must be an ISO 8601 time, not {starts_at!r}") from None
        if starts_at is not None:
            if not isinstance(starts_at, dt.datetime):
                raise SessionRequestError(f"starts_at must be a time, not {starts_at!r}")
            if starts_at.tzinfo is None or starts_at.utcoffset() is None:
                raise SessionRequestError(
                    "starts_at needs a time zone (e.g. 2030-01-01T09:00:00+00:00)")
        put("starts_at", starts_at)
        put("dependencies", _ids("dependencies", self.dependencies))
        if len(set(self.dependencies)) != len(self.dependencies):
            raise SessionRequestError("dependencies lists a session twice")
        put("designated_agents", _ids("designated_agents", self.designated_agents))
        if self.architecture is not None and (
                not isinstance(self.architecture, str) or not self.architecture.strip()):
            raise SessionRequestError(
                f"architecture must be a name such as x86_64, not {self.architecture!r}")
        if isinstance(self.mounts, str) or not all(isinstance(m, str) for m in self.mounts):
            raise SessionRequestError("mounts must be a list of vfolder names or ids")
        put("mounts", tuple(m.strip() for m in self.mounts if m.strip()))

    @property
    def kernels(self) -> int:
        return self.cluster_size

    @classmethod
    def from_options(cls, options: dict, **fields) -> SessionRequest:
        """From the spawn form's fields or JupyterHub's ``user_options`` (after the
        preset was applied): text or JSON values for :data:`OPTION_KEYS`; ``fields``:
        what the caller fixes (resource_group, ...)."""
        if not isinstance(options, dict):
            raise SessionRequestError("user_options must be an object")
        unknown = sorted(k for k in set(options) - set(OPTION_KEYS) - {"resource_group"}
                         if not (isinstance(k, str) and k.startswith(MIG_PREFIX)))
        if unknown:
            raise SessionRequestError(f"unknown option(s): {', '.join(unknown)}")
        image, slots = resources(options)
        mounts = options.get("mounts") or ()
        return cls(
            image=image, slots=slots,
            cluster_size=whole_number("cluster_size", options.get("cluster_size", 1), minimum=1,
                                      text=True),
            cluster_mode=options.get("cluster_mode") or ClusterMode.SINGLE_NODE,
            project=options.get("project") or None,
            mounts=mounts if isinstance(mounts, str) else tuple(mounts),
            **fields,
        )
