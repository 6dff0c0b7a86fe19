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

import datetime as dt
import functools
import re
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Annotated, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

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


#: A session's own environment variables (Backend.AI's ``config.environ``, ``run -e``):
#: bounds, and the prefixes the platform's own variables use (theirs win; refused by name).
MAX_ENVIRON = 64
MAX_ENVIRON_VALUE = 4096
RESERVED_ENV_PREFIXES = ("BACKENDAI_", "JUPYTERHUB_", "JPY_")
# What steers how a session's Jupyter server starts, besides the platform's own: its
# configuration and extensions come from the image only (issue 22 row 3), so none of it
# comes from the user's environment either. A batch session runs the user's own command:
# there these are the user's business.
SERVER_ENV_PREFIXES = ("JUPYTER", "IPYTHON", "PYTHON", "LD_", "XDG_")
SERVER_ENV_NAMES = frozenset({"PATH", "HOME", "SHELL", "USER", "LOGNAME", "ENV", "BASH_ENV"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def check_environ(value, field: str = "environ", server: bool = False) -> dict[str, str]:
    """A session's environment variables, checked: ``{NAME: value}`` with names of
    letters, digits and '_' (not a digit first), text values, none of the platform's
    own (``BACKENDAI_``, ``JUPYTERHUB_``, ``JPY_``); {} for none. ``server``: the
    session serves Jupyter (a JupyterHub server), so nothing that steers how that server
    starts either (``SERVER_ENV_PREFIXES``, ``SERVER_ENV_NAMES``)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SessionRequestError(f"{field} must be an object of NAME: value")
    if len(value) > MAX_ENVIRON:
        raise SessionRequestError(f"{field}: at most {MAX_ENVIRON} variables")
    out = {}
    for name, v in value.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise SessionRequestError(
                f"{field}: {name!r} is not a variable name (letters, digits and '_', not "
                "beginning with a digit, at most 128)")
        if name.upper().startswith(RESERVED_ENV_PREFIXES):
            raise SessionRequestError(
                f"{field}: {name!r} is the platform's own ({', '.join(RESERVED_ENV_PREFIXES)}"
                "...): choose another name")
        if server and (name.upper().startswith(SERVER_ENV_PREFIXES)
                       or name.upper() in SERVER_ENV_NAMES):
            raise SessionRequestError(
                f"{field}: {name!r} would change how the session's Jupyter server starts, "
                "which takes its setup from the image only; set it in a terminal or a "
                "notebook of the session instead (a batch session may set it)")
        if not isinstance(v, str) or "\0" in v or len(v) > MAX_ENVIRON_VALUE:
            raise SessionRequestError(
                f"{field}: the value of {name!r} must be text of at most "
                f"{MAX_ENVIRON_VALUE} characters")
        out[name] = v
    return out


#: Options of the form and of ``user_options`` (besides ``preset``, handled before).
OPTION_KEYS = ("image", "cpu", "mem", "gpu", "cluster_size", "cluster_mode", "project", "mounts")
MIN_MEM = 64 * 2**20
# Kernels in one session, as the admin API's schema bounds them: the admission and
# placement checks work per kernel, so an unbounded number (10**12 through the spawn
# form or the Backend.AI routes) held the hub's event loop for days.
MAX_CLUSTER_SIZE = 16
#: The type of a pydantic error line that carries a rule's words unchanged.
ERROR_TYPE = "session_request"


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


def enum_choice(enum: type[StrEnum], name: str, value) -> StrEnum:
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
    return image.strip(), human_slots(options)


def human_slots(options: dict) -> ResourceSlot:
    """``cpu``, ``mem``, ``gpu`` and ``cuda.mig-<profile>`` in people's units (the form's,
    the admin API's ``resources``) as the slots of one kernel (see :func:`resources`)."""
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
    return slots


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
    if not isinstance(values, list | tuple) or not all(isinstance(v, str) and v for v in values):
        raise SessionRequestError(f"{name} must be a list of ids")
    return tuple(values)


def as_validator(check):
    """``check`` (raising :class:`SessionRequestError`) as a pydantic validator: the
    error becomes a line of the ValidationError of type :data:`ERROR_TYPE`, carrying the
    words unchanged (:func:`request_error` turns it back)."""

    @functools.wraps(check)
    def validator(*args):
        try:
            return check(*args)
        except InvalidRequest as e:  # (SessionRequestError, and the slot parsers' errors)
            raise refusal(e.detail) from None

    return validator


def request_error(exc: ValidationError) -> Exception:
    """A ValidationError of a request model as the one error a caller gets: the
    :class:`SessionRequestError` a rule raised (its words unchanged); pydantic's own
    complaint about a field named; a missing or unknown keyword a TypeError (a
    programmer's mistake, as a wrong argument is)."""
    errors = exc.errors(include_url=False)
    for err in errors:
        if err["type"] == ERROR_TYPE:
            return SessionRequestError(err["ctx"]["detail"])
    first = errors[0]
    where = ".".join(str(x) for x in first["loc"]) or "request"
    if first["type"] == "missing" and where == "image":
        return SessionRequestError("image is required")
    if first["type"] in ("missing", "extra_forbidden"):
        return TypeError(f"{exc.title}: {first['msg'].lower()}: {where}")
    return SessionRequestError(f"{where}: {first['msg']}")


# -- the fields' checks (the lenient forms: Python values, enqueue's keywords, the form) ----


def _image(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SessionRequestError("image is required")
    return value.strip()


def _slots(value) -> ResourceSlot:
    if not isinstance(value, dict):
        raise SessionRequestError("slots must be an object of slot names and amounts")
    for key in value:
        if not is_known_slot(key):
            raise SessionRequestError(f"slots: {unknown_slot_words(key)}")
        if is_mig_slot(key):
            mig_count(key, value[key])
    try:
        return ResourceSlot(value)
    except (InvalidOperation, TypeError, ValueError):
        raise SessionRequestError(
            "slots must be an object of slot names and amounts") from None


def _resource_group(value) -> str:
    if not isinstance(value, str) or not value:
        raise SessionRequestError("resource_group must be a name")
    return value


def _project(value) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise SessionRequestError("project must be a project's name or id")
    return value


def _priority(value) -> int | None:
    return None if value is None else whole_number("priority", value, minimum=0, maximum=100)


def _startup_command(value, info: ValidationInfo) -> str | None:
    if value is not None and not isinstance(value, str):
        batch = info.data.get("session_type") == SessionType.BATCH
        raise SessionRequestError(
            "a batch session needs a startup_command" if batch else
            "startup_command is for batch sessions (session_type='batch') only")
    return value


def _batch_timeout(value) -> int | None:
    if value is None:
        return None
    try:
        return whole_number("batch_timeout", value, minimum=1)
    except SessionRequestError:
        raise SessionRequestError(
            f"batch_timeout must be a whole number of seconds > 0, not {value!r}") from None


def _starts_at(value) -> dt.datetime | None:
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise SessionRequestError(
                f"starts_at must be an ISO 8601 time, not {value!r}") from None
    if value is not None and not isinstance(value, dt.datetime):
        raise SessionRequestError(f"starts_at must be a time, not {value!r}")
    return value


def _architecture(value) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise SessionRequestError(
            f"architecture must be a name such as x86_64, not {value!r}")
    return value


def _mounts(value) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple) or not all(
            isinstance(m, str) for m in value):
        raise SessionRequestError("mounts must be a list of vfolder names or ids")
    return tuple(value)


def _is_text(words: str, *, none: bool = False):
    """A lenient form's type check of a text field whose rule (below) says the rest."""

    def check(value):
        if not (isinstance(value, str) or (none and value is None)):
            raise SessionRequestError(words)
        return value

    return check


def refusal(detail: str) -> PydanticCustomError:
    """A rule's refusal inside a validator: pydantic keeps ``detail`` as it is."""
    return PydanticCustomError(ERROR_TYPE, "{detail}", {"detail": detail})


def _lenient(check) -> BeforeValidator:
    return BeforeValidator(as_validator(check))


Slots = Annotated[ResourceSlot, PlainValidator(as_validator(_slots)), WithJsonSchema({
    "type": "object", "additionalProperties": {"type": "string"},
    "description": "slot name -> amount per kernel"})]


class SessionRequest(BaseModel):
    """What a session is asked to be; building one validates it (or raises
    :class:`SessionRequestError`). ``slots`` are per kernel; the session has
    ``cluster_size`` kernels. ``project``: a project id or name of the user's (None:
    their first). ``mounts``: folder names or ids, at ``/home/work/<name>``.

    The fields' annotations here are the lenient forms (Python values, enqueue's
    keywords); the rules every form obeys are the validators below, which the wire
    forms (the admin API's ``SessionCreate``, Backend.AI's create body) inherit with
    stricter annotations of their own."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True,
                              regex_engine="python-re")

    image: Annotated[str, _lenient(_is_text("image is required"))]
    slots: Slots
    session_type: Annotated[SessionType, _lenient(
        lambda v: enum_choice(SessionType, "session_type", v))] = SessionType.INTERACTIVE
    resource_group: Annotated[str, _lenient(_is_text("resource_group must be a name"))] = "default"
    project: Annotated[str | None, _lenient(_is_text("project must be a project's name or id",
                                                     none=True))] = None
    cluster_size: Annotated[int, _lenient(
        lambda v: whole_number("cluster_size", v, minimum=1))] = 1
    cluster_mode: Annotated[ClusterMode, _lenient(
        lambda v: enum_choice(ClusterMode, "cluster_mode", v))] = ClusterMode.SINGLE_NODE
    priority: Annotated[int | None, _lenient(_priority)] = None
    startup_command: Annotated[str | None, _lenient(_startup_command)] = None
    batch_timeout: Annotated[int | None, _lenient(_batch_timeout)] = None
    starts_at: Annotated[dt.datetime | None, _lenient(_starts_at)] = None
    dependencies: Annotated[tuple[str, ...], _lenient(lambda v: _ids("dependencies", v))] = ()
    designated_agents: Annotated[tuple[str, ...], _lenient(
        lambda v: _ids("designated_agents", v))] = ()
    architecture: Annotated[str | None, _lenient(_architecture)] = None
    mounts: Annotated[tuple[str, ...], _lenient(_mounts)] = ()

    def __init__(self, **data) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise request_error(e) from None

    @classmethod
    def parse(cls, data: dict) -> Self:
        """``data`` (a JSON object of this model's form) as a request, or the one
        :class:`SessionRequestError` in plain words."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise request_error(e) from None

    # -- the rules of every form (on the typed values) ---------------------------------

    @field_validator("image")
    @classmethod
    def _image_rule(cls, value: str) -> str:
        return as_validator(_image)(value)

    @field_validator("resource_group")
    @classmethod
    def _resource_group_rule(cls, value: str) -> str:
        return as_validator(_resource_group)(value)

    @field_validator("project")
    @classmethod
    def _project_rule(cls, value: str | None) -> str | None:
        return as_validator(_project)(value)

    @field_validator("cluster_size")
    @classmethod
    def _cluster_size_rule(cls, value: int) -> int:
        if value > MAX_CLUSTER_SIZE:
            raise refusal(f"cluster_size must be at most {MAX_CLUSTER_SIZE}, not {value}")
        return value

    @field_validator("starts_at")
    @classmethod
    def _starts_at_rule(cls, value: dt.datetime | None) -> dt.datetime | None:
        if value is not None and (value.tzinfo is None or value.utcoffset() is None):
            raise refusal("starts_at needs a time zone (e.g. 2030-01-01T09:00:00+00:00)")
        return value

    @field_validator("dependencies")
    @classmethod
    def _dependencies_rule(cls, value) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise refusal("dependencies lists a session twice")
        return tuple(value)

    @field_validator("mounts")
    @classmethod
    def _mounts_rule(cls, value) -> tuple[str, ...]:
        return tuple(m.strip() for m in value if m.strip())

    @model_validator(mode="after")
    def _batch_rules(self) -> Self:
        if self.session_type == SessionType.BATCH:
            if not isinstance(self.startup_command, str) or not self.startup_command.strip():
                raise refusal("a batch session needs a startup_command")
        elif self.startup_command is not None:
            raise refusal("startup_command is for batch sessions (session_type='batch') only")
        if self.batch_timeout is not None and self.session_type != SessionType.BATCH:
            raise refusal("batch_timeout is for batch sessions (session_type='batch') only")
        return self

    # -----------------------------------------------------------------------------------

    @property
    def kernels(self) -> int:
        return self.cluster_size

    def as_request(self, **changes) -> SessionRequest:
        """This request as a plain :class:`SessionRequest` (a wire form's extras, such as
        the session's name, left out), with ``changes`` checked like any field."""
        fields = {k: getattr(self, k) for k in SessionRequest.model_fields}
        return SessionRequest(**{**fields, **changes})

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
