"""Backend.AI's session routes (``session create``, ``info``, ``rm``, ``logs``,
``status-history``, ``rename``, ``restart``, ``events``/``watch``) as thin handlers over
the manager: a session is named as the clients name it (by name or id, dashed or hex)
and found through the caller's view (``resolve_session`` of
:mod:`...manager.compatviews`), then the admin API's services act on it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import time
from typing import Annotated

from pydantic import (
    AliasChoices,
    AliasPath,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    model_validator,
)
from tornado.iostream import StreamClosedError

from ...common.errors import (
    Conflict,
    InvalidRequest,
)
from ...common.session_request import (
    MAX_CLUSTER_SIZE,
    ClusterMode,
    SessionRequest,
    SessionRequestError,
    SessionType,
    as_validator,
    check_environ,
    enum_choice,
    human_slots,
    refusal,
)
from ...common.slots import MIG_PREFIX, ResourceSlot
from ...common.types import SessionStatus
from ...manager.compatviews import bai_status, dashed
from .. import models
from ..restart import hub_server, restart
from .base import CompatBase

# Longest a create waits for its session to start when the client names no maxWaitSeconds
# (Backend.AI waits without limit); past it the answer is TIMEOUT (the session stays queued).
DEFAULT_MAX_WAIT = 300


# -- sessions ----------------------------------------------------------------------------


def _resources(config: dict) -> dict:
    """Backend.AI's resource slots (``cpu``, ``mem``, ``cuda.device``,
    ``cuda.mig-<profile>``) as our request."""
    out = {}
    for k, v in (config.get("resources") or {}).items():
        if k in ("cpu", "mem"):
            out[k] = v
        elif k in ("cuda.device", "cuda.shares", "gpu"):
            out["gpu"] = v
        elif k.startswith(MIG_PREFIX):
            out[k] = v  # a MIG instance of that profile (docs/gpus.md); checked there
        else:
            raise InvalidRequest(f"resources: slot {k!r} is not offered here (cpu, mem, "
                                 "cuda.device, cuda.mig-<profile>)")
    return out


def _kind(field: str, kinds, *, missing=None, then=None):
    """A field of Backend.AI's body that must be of ``kinds``; null or empty: ``missing``;
    ``then``: what reads the value further."""

    def check(value):
        if value is not None and not isinstance(value, kinds):
            raise SessionRequestError(f"{field}: wrong type")
        if not value:
            return missing
        return then(value) if then else value

    return BeforeValidator(as_validator(check))


def _bounded(field: str, top: int, *, missing: int = 0):
    """A whole number from 0 to ``top``; 0 or null: ``missing``."""

    def check(value):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 0 <= value <= top):
            raise SessionRequestError(
                f"{field} must be a whole number from 0 to {top}, not {value!r}")
        return value or missing

    return BeforeValidator(as_validator(check))


def _texts(field: str, words: str, most: int | None = None, more: str = ""):
    def check(value):
        if value is None:
            return ()
        if not isinstance(value, list):
            raise SessionRequestError(f"{field}: wrong type")
        if not all(isinstance(v, str) for v in value):
            raise SessionRequestError(f"{field}: {words}")
        if most is not None and len(value) > most:  # (each is looked up; the admin API's bound)
            raise SessionRequestError(f"{field}: {more}")
        return tuple(value)

    return BeforeValidator(as_validator(check))


def _name(value):
    if value is not None and not isinstance(value, str):
        raise SessionRequestError("name: wrong type")
    if not value:
        raise SessionRequestError("name: required field missing")
    if not re.fullmatch(models.NAME_PATTERN.strip("^$"), value):  # (as the admin API's)
        raise SessionRequestError(f"name: {models.PATTERN_WORDS[models.NAME_PATTERN]}")
    return value


def _image(value):
    if value is not None and not isinstance(value, str):
        raise SessionRequestError("image: wrong type")
    if not value:
        raise SessionRequestError("image: required field missing")
    if len(value) > 512:
        raise SessionRequestError("image: must be at most 512 characters long")
    return value


def _type(value):
    if not isinstance(value, str):
        raise SessionRequestError("type: wrong type")
    if value not in ("batch", "interactive"):
        raise SessionRequestError(f"type must be batch or interactive, not {value!r} "
                                  "(inference sessions are not offered here)")
    return SessionType(value)


def _slots(value):
    if value is not None and not isinstance(value, dict):
        raise SessionRequestError("config.resources: wrong type")
    return human_slots(_resources({"resources": value}))


def _starts_at(value):
    if value is not None and not isinstance(value, str):
        raise SessionRequestError("starts_at: wrong type")
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        raise SessionRequestError(f"starts_at: {value!r} is not an ISO 8601 date-time "
                                  "(relative times such as '10m' are not supported)") from None


def _command(value, info: ValidationInfo):
    if value is not None and not isinstance(value, str):
        raise SessionRequestError("startupCommand: wrong type")
    # An interactive session is a Jupyter server: a command sent along is not run.
    return value if info.data.get("session_type") == SessionType.BATCH else None


#: What Backend.AI's create body may ask for that this hub does not do.
_UNSUPPORTED = ("mount_map", "preopen_ports", "agentList", "resource_opts")


class BackendAISessionCreate(SessionRequest):
    """Backend.AI's ``POST /session`` body read as the one :class:`SessionRequest`:
    the client's names are this model's aliases (``config.resources`` in Backend.AI's
    slot names, ``config.scalingGroup``, ``group``, ``clusterSize``, ``sessionName``,
    ...), each field's type checked with the client's field named; what the request
    rules say (common/session_request.py) is the same as on every other path. Keys
    this hub does not read are ignored, as Backend.AI's clients send more."""

    model_config = ConfigDict(extra="ignore")

    image: Annotated[str, BeforeValidator(as_validator(_image))] = Field(
        None, validate_default=True, validation_alias=AliasChoices("image", "lang"))
    slots: Annotated[ResourceSlot, PlainValidator(as_validator(_slots))] = Field(
        default_factory=lambda: human_slots({}),
        validation_alias=AliasPath("config", "resources"))
    session_type: Annotated[SessionType, BeforeValidator(as_validator(_type))] = Field(
        SessionType.INTERACTIVE, validation_alias=AliasChoices("type", "sessionType"))
    resource_group: Annotated[str, _kind("config.scalingGroup", str, missing="default")] = Field(
        "default", validation_alias=AliasPath("config", "scalingGroup"))
    project: Annotated[str | None, _kind("group", str)] = Field(
        None, validation_alias=AliasChoices("group", "groupName", "group_name"))
    cluster_size: Annotated[int, _bounded("clusterSize", MAX_CLUSTER_SIZE, missing=1)] = Field(
        1, validation_alias=AliasChoices("clusterSize", "cluster_size"))
    cluster_mode: Annotated[ClusterMode, _kind(
        "clusterMode", str, missing=ClusterMode.SINGLE_NODE,
        then=lambda v: enum_choice(ClusterMode, "cluster_mode", v))] = Field(ClusterMode.SINGLE_NODE, validation_alias=AliasChoices("clusterMode", "cluster_mode"))
    startup_command: Annotated[str | None, BeforeValidator(as_validator(_command))] = Field(
        None, validation_alias=AliasChoices("startupCommand", "startup_command"))
    starts_at: Annotated[dt.datetime | None, BeforeValidator(as_validator(_starts_at))] = Field(
        None, validation_alias=AliasChoices("starts_at", "startsAt"))
    dependencies: Annotated[tuple[str, ...], _texts(
        "dependencies", "a list of session names or ids", 64, "at most 64 sessions")] = ()
    mounts: Annotated[tuple[str, ...], _texts(
        "config.mounts", "a list of vfolder names or ids")] = Field(
        (), validation_alias=AliasPath("config", "mounts"))
    name: Annotated[str, BeforeValidator(as_validator(_name))] = Field(
        None, validate_default=True,
        validation_alias=AliasChoices("name", "sessionName", "clientSessionToken"))
    enqueue_only: Annotated[bool, _kind("enqueueOnly", bool, missing=False)] = Field(
        False, validation_alias=AliasChoices("enqueueOnly", "enqueue_only"))
    reuse_if_exists: Annotated[bool, _kind("reuseIfExists", bool, missing=False)] = Field(
        True, validation_alias=AliasChoices("reuseIfExists", "reuse"))
    max_wait_seconds: Annotated[int, _bounded("maxWaitSeconds", 24 * 3600)] = Field(
        0, validation_alias=AliasChoices("maxWaitSeconds", "max_wait_seconds"))

    @model_validator(mode="before")
    @classmethod
    def _backendai_body(cls, body):
        """Only the keys aliased above are read (a client's ``priority`` or
        ``architecture`` is not this hub's to take); ``config`` is an object; what
        this hub does not do is refused by name."""
        if not isinstance(body, dict):
            return body
        config = body.get("config")
        if config is not None and not isinstance(config, dict):
            raise refusal("config: wrong type")
        for key in _UNSUPPORTED:
            if (config or {}).get(key):
                raise refusal(f"config.{key} is not supported by this server")
        if body.get("bootstrap_script"):
            raise refusal("bootstrap_script is not supported by this server")
        return {k: v for k, v in body.items() if k in _BACKENDAI_KEYS}


#: The top-level keys of Backend.AI's body that the model reads (its aliases' first steps).
_BACKENDAI_KEYS = frozenset(
    choice if isinstance(choice, str) else choice.path[0]
    for f in BackendAISessionCreate.model_fields.values() if f.validation_alias is not None
    for choice in (f.validation_alias.choices if isinstance(f.validation_alias, AliasChoices)
                   else [f.validation_alias])
) | {"dependencies"}


class SessionCreateHandler(CompatBase):
    async def post(self):
        await self.create(self.json_body())

    async def create(self, body: dict) -> None:
        # The one request, parsed once from Backend.AI's names (BackendAISessionCreate).
        request = BackendAISessionCreate.parse(body)
        # `run -e`/`session create -e`: the session's own variables (the platform's win)
        config = body.get("config") if isinstance(body.get("config"), dict) else {}
        environ = check_environ(config.get("environ") or None, "config.environ")
        group = request.resource_group
        await self.manager.ops.check_session_create(self.principal, group)
        deps = []
        for ref in request.dependencies:
            deps.append(await self.manager.ops.resolve_session(self.principal, str(ref)))
        if request.reuse_if_exists:
            reused = await self._existing(request.name)
            if reused is not None:  # Backend.AI's reuse (what `run` relies on): 200, created False
                sess = await self.manager.ops.get_session(self.principal, reused)
                self.reply({"sessionId": dashed(reused), "sessionName": request.name,
                            "status": bai_status(sess["status"]), "servicePorts": [],
                            "created": False})
                return
        if request.session_type == SessionType.INTERACTIVE:
            sid = await self._interactive(request, body.get("config") or {}, environ)
        else:
            # The references resolved to ids: the same request, its dependencies by id.
            sid = await self.manager.enqueue(
                request.as_request(dependencies=deps), username=self.principal.username,
                name=request.name, environ=environ, service_prefix="/")
        status = "PENDING"
        if not request.enqueue_only:
            status = await self._wait(sid, request.max_wait_seconds)
        else:
            sess = await self.manager.ops.get_session(self.principal, sid)
            status = bai_status(sess["status"])
        self.reply({"sessionId": dashed(sid), "sessionName": request.name,
                    "status": status, "servicePorts": [], "created": True}, 201)

    async def _existing(self, name: str) -> str | None:
        """The caller's live session named ``name`` (a JupyterHub server of that name, or
        a queued/running session), or None."""
        user = self.find_user(self.principal.username)
        spawner = user.spawners.get(name) if user is not None else None
        if spawner is not None and spawner.active and getattr(spawner, "session_id", None):
            return spawner.session_id
        return await self.manager.ops.live_session_named(self.principal.user_id, name)

    async def _interactive(self, request: BackendAISessionCreate, config: dict,
                           environ: dict) -> str:
        """An interactive session is a JupyterHub named server of the key's owner (started
        through the hub, so it is visible and usable in JupyterHub): the request becomes
        the server's user_options (resources as the client sent them, so the spawner's
        defaults fill what it did not), which the spawner reads into the same model."""
        if request.resource_group != "default":
            raise InvalidRequest("interactive sessions run in the hub's resource group; "
                                 "scalingGroup cannot be chosen for them")
        user = self.find_user(self.principal.username)
        if user is None:
            user = self.user_from_username(self.principal.username)
        name = request.name
        if not self.allow_named_servers:
            raise InvalidRequest("interactive sessions are JupyterHub named servers, which "
                                 "this hub does not allow (c.JupyterHub.allow_named_servers)")
        await self._check_named_server_request(user, name, name)
        spawner = user.get_or_create_spawner(name, name, replace_failed=True)
        if spawner.active or spawner.pending:
            raise Conflict(f"session {name!r} already exists (a running JupyterHub server)")
        options = {"image": request.image, **_resources(config)}
        if request.project:
            options["project"] = request.project
        if request.mounts:
            options["mounts"] = list(request.mounts)
        if environ:
            options["environ"] = environ  # (the spawner checks and applies it: get_env)
        if request.cluster_size != 1:
            options["cluster_size"] = request.cluster_size
        await self.spawn_single_user(user, name, name, options=options)
        spawner = user.spawners[name]
        deadline = time.monotonic() + 60
        while spawner.session_id is None:
            if not (spawner.pending or spawner.ready) or time.monotonic() > deadline:
                raise Conflict(f"the JupyterHub server {name!r} did not start; see the hub")
            await asyncio.sleep(0.1)
        return spawner.session_id

    async def _wait(self, sid: str, max_wait: int) -> str:
        return await wait_started(self.manager, sid, max_wait)


async def wait_started(manager, sid: str, max_wait: int) -> str:
    """Wait until the session started (RUNNING, or already ended after it started),
    ended without starting, or ``max_wait`` seconds passed (TIMEOUT)."""
    limit = max_wait if max_wait > 0 else DEFAULT_MAX_WAIT
    try:
        async with asyncio.timeout(limit):
            sess = await manager.wait_for(sid, {SessionStatus.RUNNING, SessionStatus.TERMINATING})
    except TimeoutError:
        return "TIMEOUT"
    if sess is None:  # (gone from the record: as an ended one that did not start)
        return bai_status(SessionStatus.TERMINATED)
    if sess.status == SessionStatus.RUNNING or any(k.exit_code is not None for k in sess.kernels):
        return "RUNNING"
    return bai_status(sess.status)


class SessionHandler(CompatBase):
    async def get(self, ref):
        sid = await self.manager.ops.resolve_session(self.principal, ref)
        item = await self.manager.ops.bai_session(self.principal, sid)
        self.reply(item)

    async def delete(self, ref):
        sid = await self.manager.ops.resolve_session(self.principal, ref)
        await self.manager.ops.check_session_destroy(self.principal, sid)
        if not await self._stop_hub_server(sid):
            await self.manager.destroy_session(sid)
        self.reply({"stats": {}})

    async def _stop_hub_server(self, sid: str) -> bool:
        """An interactive session that is a JupyterHub server is stopped through the hub."""
        found = await hub_server(self, sid)
        if found is None:
            return False
        await self.stop_single_user(found[0], found[1])
        return True

    async def patch(self, ref):
        """``session restart``: stopped and started again under its name with the same
        options (image, resources, folders, environment, command: :mod:`...restart`);
        its kernel state is gone, its folders keep their files, and it gets a new
        session id. A batch session runs its command again."""
        sid = await self.manager.ops.resolve_session(self.principal, ref)
        await self.manager.ops.check_session_destroy(self.principal, sid)
        sess = await self.manager.ops.get_session(self.principal, sid)
        status = await wait_started(self.manager, await restart(self, sid), 0)
        if status != "RUNNING":
            raise Conflict(f"session {sess['name']!r} was stopped but did not start again: "
                           f"{status}")
        self.set_status(204)
        self.finish()


class SessionStatusHistoryHandler(CompatBase):
    """``session status-history``: ``{"result": {status: time}}``."""

    async def get(self, ref):
        sid = await self.manager.ops.resolve_session(self.principal, ref)
        self.reply({"result": await self.manager.ops.bai_status_history(self.principal, sid)})


class SessionRenameHandler(CompatBase):
    """``session rename SESSION NEW``: ``POST /session/{ref}/rename?name=NEW``."""

    async def post(self, ref):
        name = self.get_query_argument("name", None) or self.json_body().get("name")
        try:
            name = _name(name)
        except SessionRequestError as e:
            raise InvalidRequest(e.detail) from None
        sid = await self.manager.ops.resolve_session(self.principal, ref)
        await self.manager.ops.rename_session(self.principal, sid, name)
        self.set_status(204)
        self.finish()


def _session_events(sess) -> list[tuple[str, SessionStatus]]:
    """Backend.AI's lifecycle events for the statuses the session went through, oldest
    first: ``[(event name, status), ...]``."""
    history = sess.status_history or {}
    passed = sorted((SessionStatus(k) for k in history if k in SessionStatus.__members__),
                    key=lambda st: str(history[st.value]))
    if sess.status not in passed:
        passed.append(SessionStatus(sess.status))
    out = []
    for st in passed:
        for ev in _EVENTS_OF.get(st) or _end_events(sess, st):
            out.append((ev, st))
    return out


_EVENTS_OF = {
    SessionStatus.PENDING: ("session_enqueued",),
    SessionStatus.SCHEDULED: ("session_scheduled",),
    SessionStatus.PREPARING: ("session_preparing", "kernel_preparing"),
    SessionStatus.CREATING: ("kernel_creating",),
    SessionStatus.RUNNING: ("kernel_started", "session_started"),
    SessionStatus.TERMINATING: ("session_terminating", "kernel_terminating"),
    SessionStatus.CANCELLED: ("kernel_cancelled", "session_cancelled"),
}


def _end_events(sess, st: SessionStatus) -> tuple[str, ...]:
    if st == SessionStatus.ERROR or (sess.session_type == "batch" and sess.result == "FAILURE"):
        return ("kernel_terminated", "session_failure", "session_terminated")
    if sess.session_type == "batch":
        return ("kernel_terminated", "session_success", "session_terminated")
    return ("kernel_terminated", "session_terminated")


class SessionEventsHandler(CompatBase):
    """``session events`` / ``watch``: ``GET /events/session?sessionId=|sessionName=&scope=``,
    server-sent events from the record's transitions (the same watch as the spawner's
    progress): first the statuses already passed, then each change, until the session
    ended; then ``server_close``, the client's sign not to reconnect. Events are
    Backend.AI's names (``session_enqueued`` ... ``session_terminated``, ``kernel_*`` for
    the main kernel); their data carries ``sessionId``, ``sessionName``,
    ``ownerAccessKey``, ``reason`` and ``exitCode``."""

    async def get(self):
        ref = self.get_query_argument("sessionId", None) or self.get_query_argument(
            "sessionName", None) or self.get_query_argument("name", None)
        if not ref:
            raise InvalidRequest("sessionId or sessionName: which session's events")
        scope = self.get_query_argument("scope", "*")
        if scope not in ("*", "session", "kernel"):
            raise InvalidRequest(f"scope must be *, session or kernel, not {scope!r}")
        sid = await self.manager.ops.resolve_session(self.principal, ref)
        await self.manager.ops.get_session(self.principal, sid)  # (the caller may see it)
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        sent: set[str] = set()
        async with contextlib.aclosing(self.manager.watch(sid)) as changes:
            if not await self._stream(changes, scope, sent):
                return
        # The session ended: the stream ends, and says so. Backend.AI's client reconnects
        # to a stream that closed without ``server_close`` (after its retry time, with
        # the same signed request, which the replay check then refused with a 401).
        self.write("event: server_close\ndata: {}\n\n")
        self.finish()

    async def _stream(self, changes, scope: str, sent: set[str]) -> bool:
        """Send the events of each change; False if the client went away."""
        async for sess in changes:
            main = next((k for k in sess.kernels if k.cluster_role == "main"),
                        sess.kernels[0] if sess.kernels else None)
            for ev, st in _session_events(sess):
                if ev in sent or (scope != "*" and not ev.startswith(scope)):
                    continue
                sent.add(ev)
                data = {"sessionId": dashed(sess.id), "sessionName": sess.name,
                        "ownerAccessKey": sess.access_key, "reason": sess.status_info or "",
                        "status": bai_status(st)}
                if ev.startswith("kernel_") and main is not None:
                    data["kernelId"] = dashed(main.id)
                if st in (SessionStatus.TERMINATED, SessionStatus.ERROR):
                    code = main.exit_code if main is not None else None
                    data["exitCode"] = code if code is not None else (
                        1 if ev == "session_failure" else 0)
                self.write(f"event: {ev}\ndata: {json.dumps(data)}\n\n")
            try:
                await self.flush()
            except StreamClosedError:
                return False
        return True


class SessionLogsHandler(CompatBase):
    async def get(self, ref):
        sid = await self.manager.ops.resolve_session(self.principal, ref)
        out = await self.manager.ops.session_logs(self.principal, sid)
        if out["status"] in (SessionStatus.RUNNING, SessionStatus.TERMINATING):
            logs = await self.manager.session_logs(sid, kernel_idx=0)
        else:
            logs = (out["kernels"][0]["logs"] if out["kernels"] else "") or ""
        self.reply({"result": {"logs": logs}})
