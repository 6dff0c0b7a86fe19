"""Backend.AI's REST routes (the 23.09 client's), as thin handlers over the manager.

Each handler names the session or folder the way Backend.AI's clients do (by name
or id, dashed or hex), finds it through the caller's view (the operations
``resolve_session`` and ``resolve_folder`` of :mod:`...manager.compatviews`), and then
calls the same service the admin API calls. The route table is the package's
(:func:`.routes`). Errors leave in Backend.AI's problem+json shape
(``type: https://api.backend.ai/probs/...``, ``title``, ``msg``), which the
client prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import time
import uuid
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
from tornado import web
from tornado.iostream import StreamClosedError

from ...common.errors import (
    BackendAIError,
    Conflict,
    InvalidRequest,
    NotFound,
    StorageQuotaExceeded,
    Unauthorized,
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
from ...common.types import ALIVE_STATUSES, SessionStatus
from ...manager import vfolders
from ...manager.compatviews import as_hex as _as_hex
from ...storageproxy import transfer
from ...storageproxy.client import InProcessStorageClient
from .. import models, spec
from . import gql
from .base import CompatBase

# The API version announced in version negotiation: the 23.09 client's own (v7.20230615),
# so it uses the routes and GraphQL fields implemented here.
API_VERSION = "v7.20230615"
MANAGER_VERSION = "23.09.10"
# Longest a create waits for its session to start when the client names no maxWaitSeconds
# (Backend.AI waits without limit); past it the answer is TIMEOUT (the session stays queued).
DEFAULT_MAX_WAIT = 300
# Paths one mkdir or delete-files names: each is a storage operation (20,000 took 4 s).
MAX_PATHS = 1000


# -- version, announcement, GraphQL --------------------------------------------------------


class RootHandler(CompatBase):
    """``GET /``: version negotiation (no authentication, as in Backend.AI)."""

    auth_required = False

    def check_xsrf_cookie(self):
        return None

    async def get(self):
        self.reply({"version": API_VERSION, "manager": MANAGER_VERSION})


class AnnouncementHandler(CompatBase):
    async def get(self):
        self.reply({"enabled": False, "message": ""})

    async def post(self):  # `admin announcement update/delete`
        raise NotOffered(REFUSALS["announcement"])


class GQLHandler(CompatBase):
    async def post(self):
        body = self.json_body()
        query, variables = body.get("query"), body.get("variables") or {}
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequest("query: a GraphQL query string is required")
        if not isinstance(variables, dict):
            raise InvalidRequest("variables must be an object")
        self.reply(await gql.execute(self.manager, self.principal, query, variables, hub=self))


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
        body = self.json_body()
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
                self.reply({"sessionId": gql.dashed(reused), "sessionName": request.name,
                            "status": gql.bai_status(sess["status"]), "servicePorts": [],
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
            status = gql.bai_status(sess["status"])
        self.reply({"sessionId": gql.dashed(sid), "sessionName": request.name,
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
    seen = {"status": "PENDING", "started": False}

    async def until():
        async for sess in manager.watch(sid):
            seen["status"] = sess.status
            if sess.status == SessionStatus.RUNNING:
                seen["started"] = True
                return
            if sess.status not in ALIVE_STATUSES:
                seen["started"] = any(k.exit_code is not None for k in sess.kernels)
                return

    try:
        async with asyncio.timeout(limit):
            await until()
    except TimeoutError:
        return "TIMEOUT"
    return "RUNNING" if seen["started"] else gql.bai_status(seen["status"])


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

    async def _hub_server(self, sid: str):
        """(user, server name, spawner) of the JupyterHub server that is the interactive
        session ``sid``, or None."""
        sess = await self.manager.ops.get_session(self.principal, sid)
        if sess["type"] != "interactive":
            return None
        username = await self.manager.ops.username_of(sess["user_id"])
        user = self.find_user(username)
        if user is None:
            return None
        for name, spawner in list(user.spawners.items()):
            if getattr(spawner, "session_id", None) == sid and (spawner.active or spawner.ready):
                return user, name, spawner
        return None

    async def _stop_hub_server(self, sid: str) -> bool:
        """An interactive session that is a JupyterHub server is stopped through the hub."""
        found = await self._hub_server(sid)
        if found is None:
            return False
        await self.stop_single_user(found[0], found[1])
        return True

    async def patch(self, ref):
        """``session restart``: an interactive session (a JupyterHub server) is stopped and
        started again under its name with the same options (image, resources, folders,
        environment); its kernel state is gone, its folders keep their files, and it gets
        a new session id. A batch session runs its command once: refused, saying what to
        use instead."""
        sid = await self.manager.ops.resolve_session(self.principal, ref)
        await self.manager.ops.check_session_destroy(self.principal, sid)
        sess = await self.manager.ops.get_session(self.principal, sid)
        if sess["type"] != "interactive":
            raise Conflict(f"session {sess['name']!r} is a batch session, which runs its "
                           "command once and is not restarted: create a new batch session "
                           "with the same options (`session create --type batch ...`)")
        found = await self._hub_server(sid)
        if found is None or sess["status"] != SessionStatus.RUNNING:
            raise Conflict(f"session {sess['name']!r} is {sess['status']}, not a running "
                           "server: only a running session is restarted (start it with "
                           "`session create` or from the hub)")
        user, name, spawner = found
        options = dict(spawner.user_options or {})
        await self.stop_single_user(user, name)
        await self.spawn_single_user(user, name, name, options=options)
        spawner = user.spawners[name]  # (JupyterHub's, after the start: not the stopped one's)
        deadline = time.monotonic() + 60
        while spawner.session_id in (None, sid):
            if not (spawner.pending or spawner.ready) or time.monotonic() > deadline:
                raise Conflict(f"the JupyterHub server {name!r} did not start again; see the "
                               "hub")
            await asyncio.sleep(0.1)
        status = await wait_started(self.manager, spawner.session_id, 0)
        if status != "RUNNING":
            raise Conflict(f"session {name!r} was stopped but did not start again: {status}")
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
    ended. Events are Backend.AI's names (``session_enqueued`` ... ``session_terminated``,
    ``kernel_*`` for the main kernel); their data carries ``sessionId``, ``sessionName``,
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
                data = {"sessionId": gql.dashed(sess.id), "sessionName": sess.name,
                        "ownerAccessKey": sess.access_key, "reason": sess.status_info or "",
                        "status": gql.bai_status(st)}
                if ev.startswith("kernel_") and main is not None:
                    data["kernelId"] = gql.dashed(main.id)
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


class ResourceSlotsHandler(CompatBase):
    """``GET /config/resource-slots`` (``admin resource query-slots``): the slots the
    agents offer, each with its unit."""

    async def get(self):
        self.reply(await self.manager.ops.bai_resource_slots())


class VFolderTypesHandler(CompatBase):
    """``GET /config/vfolder-types`` and ``/folders/_/allowed_types``: user and group
    (project) folders."""

    async def get(self):
        self.reply(["user", "group"])


class ScalingGroupsHandler(CompatBase):
    """``GET /scaling-groups?group=`` (the SDK's ``ScalingGroup.list_available``): the
    resource groups the caller may use for that project."""

    async def get(self):
        group = self.get_query_argument("group", None) or self.json_body().get("group")
        if not isinstance(group, str) or not group:
            raise InvalidRequest("group: the project's name or id is required")
        names = await self.manager.ops.bai_usable_scaling_groups(self.principal, group)
        self.reply({"scaling_groups": [{"name": n} for n in names]})


# -- virtual folders -----------------------------------------------------------------------


class FoldersHandler(CompatBase):
    async def get(self):
        page = await self.manager.ops.list_folders(self.principal, {}, 0, spec.MAX_LIMIT)
        out = []
        for item in page["items"]:
            out.append(await self.manager.ops.folder_rest(self.principal, item["id"]))
        self.reply(out)

    async def post(self):
        body = self.json_body()
        if body.get("unmanaged_path"):
            raise InvalidRequest("unmanaged folders are not supported by this server")
        # (every folder may be cloned by whoever may read it: `cloneable` is always true)
        if str(body.get("quota") or "0") not in ("0", "0.0"):
            raise InvalidRequest("per-folder quotas are not supported here; the quota scope's "
                                 "limit (max_quota_scope_size) applies")
        create = {"name": body.get("name")}
        if body.get("host"):
            create["host"] = body["host"]
        if body.get("usage_mode") and body["usage_mode"] != "general":
            create["usage_mode"] = body["usage_mode"]
        if body.get("group"):
            create["project"] = str(body["group"])
        # `-p ro`: a project folder's members' permission, a user folder's owner's
        create["permission"] = body.get("permission") or "rw"
        if not isinstance(create["name"], str) or not create["name"]:
            raise InvalidRequest("name: required field missing")
        out = await vfolders.create(self.manager, self.principal, create)
        self.reply(await self.manager.ops.folder_rest(self.principal, out["id"]), 201)


    async def delete(self):
        """26.09's delete: ``DELETE /folders {"id"}`` moves the folder to the trash."""
        fid = await self.manager.ops.resolve_folder(self.principal, _body_id(self))
        await self.manager.ops.move_to_trash(self.principal, fid)
        self.set_status(204)
        self.finish()


def _body_id(handler: CompatBase) -> str:
    ref = handler.json_body().get("id")
    if not isinstance(ref, str) or not ref:
        raise InvalidRequest("id: the folder's id is required")
    return ref


class FolderTrashHandler(CompatBase):
    """26.09's trash: ``POST /folders/restore-from-trash-bin``, ``/folders/purge`` and
    ``/folders/delete-from-trash-bin`` (both delete a trashed folder for good), ``{"id"}``."""

    def initialize(self, action: str):
        self.action = action

    async def post(self):
        fid = await self.manager.ops.resolve_folder(self.principal, _body_id(self))
        if self.action == "restore":
            await self.manager.ops.restore_from_trash(self.principal, fid)
        else:
            await vfolders.delete(self.manager, self.principal, fid, trashed=True)
        self.set_status(204)
        self.finish()


class FolderRenameHandler(CompatBase):
    """``vfolder rename OLD NEW``: ``POST /folders/{ref}/rename {"new_name"}``."""

    async def post(self, ref):
        name = self.json_body().get("new_name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("new_name: the folder's new name is required")
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        await self.manager.ops.update_folder(self.principal, fid, {"name": name})
        self.set_status(201)
        self.finish()


class FolderRenameFileHandler(CompatBase):
    """``vfolder rename-file NAME PATH NEW_NAME``: the entry keeps its directory."""

    async def post(self, ref):
        body = self.json_body()
        path = vfolders.check_path(body.get("target_path"), "target_path", allow_root=False)
        new_name = body.get("new_name")
        if not isinstance(new_name, str) or not new_name or "/" in new_name or new_name in (
                ".", ".."):
            raise InvalidRequest("new_name: a file name (no '/') is required")
        parent = path.rpartition("/")[0]
        dst = vfolders.check_path(f"{parent}/{new_name}" if parent else new_name, "new_name",
                                  allow_root=False)
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "write")
        await vfolders.rename(self.manager, where, path, dst)
        self.reply({})


class FolderMoveFileHandler(CompatBase):
    """``vfolder mv NAME SRC DST``: DST names the new path, or an existing directory to
    move SRC into (as ``mv`` does); an existing file is not replaced (409)."""

    async def post(self, ref):
        body = self.json_body()
        src = vfolders.check_path(body.get("src"), "src", allow_root=False)
        dst = vfolders.check_path(body.get("dst"), "dst")
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "write")
        base = src.rpartition("/")[2]
        if dst == "":
            dst = base
        else:
            try:
                listing = await vfolders.list_files(self.manager, where, dst)
            except BackendAIError:
                listing = None  # not a directory (or not there): DST is the new path
            if listing is not None:
                dst = f"{dst}/{base}"
        if dst == src:
            raise InvalidRequest(f"src and dst are the same path {src!r}")
        await vfolders.rename(self.manager, where, src, dst)
        self.reply({})


class FolderUpdateOptionsHandler(CompatBase):
    """``vfolder update-options NAME -p PERM --set-cloneable B``: the owner's (or an
    admin's) change of the folder's own permission; every folder is cloneable here."""

    async def post(self, ref):
        body = self.json_body()
        perm, cloneable = body.get("permission"), body.get("cloneable")
        if cloneable is not None and cloneable is not True:
            raise InvalidRequest("cloneable: every folder here may be cloned by whoever may "
                                 "read it; it cannot be turned off (use a share's permission "
                                 "to decide who reads it)")
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        if perm is not None:
            await self.manager.ops.update_folder(self.principal, fid, {"permission": perm})
        self.reply({})


class FolderInviteHandler(CompatBase):
    """``vfolder invite NAME EMAIL... -p PERM``: ``{"perm", "user_ids"}`` ->
    ``{"invited_ids"}`` (the emails invited; each invitee accepts or declines)."""

    async def post(self, ref):
        body = self.json_body()
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        made = await self.manager.ops.invite(self.principal, fid,
                                             body.get("user_ids"), body.get("perm", "rw"))
        self.reply({"invited_ids": [i["invitee"] for i in made]}, 201)


class FolderShareHandler(CompatBase):
    """``vfolder share NAME EMAIL... -p PERM``: ``{"permission", "emails"}`` ->
    ``{"shared_emails"}`` (at once: a project folder's members, or a user folder's)."""

    async def post(self, ref):
        body = self.json_body()
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        emails = await self.manager.ops.share_with(self.principal, fid,
                                                   body.get("emails"), body.get("permission", "rw"))
        self.reply({"shared_emails": emails}, 201)


class FolderUnshareHandler(CompatBase):
    """``vfolder unshare NAME EMAIL...``: ``DELETE {"emails"}`` -> ``{"unshared_emails"}``."""

    async def delete(self, ref):
        body = self.json_body()
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        emails = await self.manager.ops.unshare_with(self.principal, fid, body.get("emails"))
        self.reply({"unshared_emails": emails})


class FolderLeaveHandler(CompatBase):
    """``vfolder leave NAME``: the caller leaves a user folder shared with them."""

    async def post(self, ref):
        body = self.json_body()
        who = body.get("shared_user_uuid") or self.principal.user_id
        who = _as_hex(str(who)) or str(who)
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        await self.manager.ops.remove_share(self.principal, fid, who)
        self.reply({})


def _invitation_bai(inv: dict) -> dict:
    return {"id": inv["id"], "inviter": inv["inviter"], "invitee": inv["invitee"],
            "perm": inv["permission"], "state": inv["state"], "created_at": inv["created_at"],
            "modified_at": inv["modified_at"], "vfolder_id": gql.dashed(inv["vfolder_id"]),
            "vfolder_name": inv["vfolder_name"]}


class InvitationsHandler(CompatBase):
    """``vfolder invitations``: list (``GET .../list``), ``POST .../accept`` and
    ``DELETE .../delete`` ``{"inv_id"}`` (the invitee declines; the inviter withdraws)."""

    def initialize(self, action: str):
        self.action = action

    async def get(self):
        if self.action != "list":
            raise web.HTTPError(405)
        items = await self.manager.ops.list_invitations(self.principal)
        self.reply({"invitations": [_invitation_bai(i) for i in items]})

    def _inv_id(self) -> str:
        inv_id = self.json_body().get("inv_id")
        if not isinstance(inv_id, str) or not inv_id:
            raise InvalidRequest("inv_id: the invitation's id is required")
        return _as_hex(inv_id) or inv_id

    async def post(self):
        if self.action != "accept":
            raise web.HTTPError(405)
        await self.manager.ops.accept_invitation(self.principal, self._inv_id())
        self.reply({"msg": "accepted"})

    async def delete(self):
        if self.action != "delete":
            raise web.HTTPError(405)
        await self.manager.ops.decline_invitation(self.principal, self._inv_id())
        self.reply({"msg": "rejected"})


class FolderIdHandler(CompatBase):
    """``GET /folders/_/id`` ``{"name"}``: the id of a folder named so (26.09 looks every
    folder up this way before it calls the folder's routes by id)."""

    async def get(self):
        body = self.json_body()
        name = body.get("name") or self.get_query_argument("name", None)
        if not isinstance(name, str) or not name:
            raise InvalidRequest("name: the folder's name is required")
        fid = await self.manager.ops.resolve_folder(self.principal, name)
        self.reply({"id": str(uuid.UUID(fid))})


class FolderCloneHandler(CompatBase):
    """``vfolder clone NAME TARGET_NAME TARGET_HOST``: ``POST /folders/{ref}/clone
    {"target_name", "target_host", "usage_mode", "permission"}``. Done when answered (a
    snapshot on btrfs, a copy on vfs), so the answer carries no ``bgtask_id`` and the
    client reports completion at once."""

    async def post(self, ref):
        body = self.json_body()
        name = body.get("target_name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("target_name: the new folder's name is required")
        clone = {"name": name}
        if body.get("target_host"):
            clone["host"] = body["target_host"]
        if body.get("usage_mode") and body["usage_mode"] != "general":
            clone["usage_mode"] = body["usage_mode"]
        if body.get("permission") not in (None, "", "rw"):
            clone["permission"] = body["permission"]
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        out = await vfolders.clone(self.manager, self.principal, fid, clone)
        self.reply(await self.manager.ops.folder_rest(self.principal, out["id"]), 201)


class FolderHostsHandler(CompatBase):
    async def get(self):
        view = await vfolders.hosts(self.manager, self.principal)
        self.reply({"default": view["default"], "allowed": view["allowed"]})


class FolderHandler(CompatBase):
    async def get(self, ref):
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        self.reply(await self.manager.ops.folder_rest(self.principal, fid))

    async def delete(self, ref):
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        await vfolders.delete(self.manager, self.principal, fid)
        self.set_status(204)
        self.finish()


class FolderFilesHandler(CompatBase):
    async def get(self, ref):
        body = self.json_body()
        path = self.get_query_argument("path", None) or body.get("path") or ""
        path = vfolders.check_path("" if path in (".", "/") else str(path))
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "list")
        listing = await vfolders.list_files(self.manager, where, path)
        files = []
        for item in listing["items"]:
            mode = {"dir": "drwxr-xr-x", "file": "-rw-r--r--", "symlink": "lrwxrwxrwx"}.get(
                item["type"], "?---------")
            mtime = item.get("mtime")
            if isinstance(mtime, str):
                try:
                    mtime = dt.datetime.fromisoformat(mtime).timestamp()
                except ValueError:
                    mtime = 0
            files.append({"filename": item["name"], "size": item.get("size") or 0,
                          "mtime": mtime or 0, "mode": mode, "type": item["type"]})
        # 23.09 parses "files" as a JSON string; 26.09 reads "items" (ISO "modified").
        items = [{"name": f["filename"], "size": f["size"], "mode": f["mode"], "type": f["type"],
                  "modified": dt.datetime.fromtimestamp(f["mtime"], dt.UTC).isoformat()}
                 for f in files]
        self.reply({"files": json.dumps(files), "items": items, "folder_path": path})


class FolderMkdirHandler(CompatBase):
    async def post(self, ref):
        body = self.json_body()
        paths = body.get("path")
        paths = paths if isinstance(paths, list) else [paths]
        if len(paths) > MAX_PATHS:
            raise InvalidRequest(f"path: at most {MAX_PATHS} directories at a time")
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "write")
        for raw in paths:
            path = vfolders.check_path(raw, allow_root=False)
            try:
                await vfolders.mkdir(self.manager, where, path, parents=bool(body.get("parents")))
            except Conflict:
                if not body.get("exist_ok"):
                    raise
        # {success, failed}: what 26.09 prints (23.09 ignores it).
        self.reply({"results": {"success": [{"item": p, "msg": None} for p in paths],
                                "failed": []}}, 201)


class FolderDeleteFilesHandler(CompatBase):
    async def delete(self, ref):
        body = self.json_body()
        files = body.get("files")
        if not isinstance(files, list) or not files:
            raise InvalidRequest("files: a list of paths is required")
        if len(files) > MAX_PATHS:
            raise InvalidRequest(f"files: at most {MAX_PATHS} paths at a time")
        paths = [vfolders.check_path(str(f), allow_root=False) for f in files]
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "delete")
        for path in paths:
            await vfolders.delete_files(self.manager, where, path, bool(body.get("recursive")))
        self.reply({})


def _transfer_base(handler: CompatBase, host: str) -> tuple[str, str]:
    """(URL prefix of the storage proxy's /upload and /download for ``host``, volume).

    The in-hub proxy is served under the hub's API prefix (``.../storage``, the URL
    the request came to); a ``backendai-storage-proxy`` daemon at the ``client_url``
    of its ``c.BackendAIManager.storage_proxies`` entry (its ``client_port``)."""
    manager = handler.manager
    client, volume = manager.storage.resolve(host)
    proxy = host.split(":", 1)[0]
    if isinstance(client, InProcessStorageClient):
        path = handler.request.path
        prefix = path[: path.rindex("/folders/")]
        return f"{handler.request.protocol}://{handler.request.host}{prefix}/storage", volume
    conf = getattr(manager, "storage_proxies", {}).get(proxy) or {}
    url = conf.get("client_url")
    if not url:
        raise NotSupported(
            f"storage proxy {proxy!r} has no client_url in c.BackendAIManager.storage_proxies, "
            "so clients cannot reach it for direct transfers")
    return url.rstrip("/"), volume


def _tokens(handler) -> transfer.TransferTokens:
    return transfer.TransferTokens.instance(config=handler.settings.get("config"))


class FolderRequestUploadHandler(CompatBase):
    """A token and URL for one tus upload straight to the folder's storage proxy."""

    async def post(self, ref):
        body = self.json_body()
        path = vfolders.check_path(str(body.get("path") or ""), allow_root=False)
        size = body.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidRequest("size: the file's size in bytes (an integer >= 0) is required")
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "upload")
        base, volume = _transfer_base(self, where["host"])
        storage = self.manager.storage
        limit = where.get("quota_bytes") or None
        await storage.set_quota_scope(where["host"], where["quota_scope_id"], limit)
        if limit is not None:
            used = (await storage.scope_usage(where["host"], where["quota_scope_id"]))["used_bytes"]
            if used + size > limit:
                raise StorageQuotaExceeded(
                    f"vfolder {where['name']!r}: its quota scope is limited to {limit} bytes "
                    f"and {used} are used; {path!r} needs {size}")
        if size == 0:  # tus clients send no PATCH for an empty file
            async def nothing():
                return
                yield b""

            await vfolders.upload(self.manager, where, path, nothing())
        token = _tokens(self).sign(
            transfer.upload_claims(volume, where["quota_scope_id"], where["id"], path, size,
                                   self.principal.user_id))
        self.reply({"token": token, "url": base + "/upload"})


class FolderRequestDownloadHandler(CompatBase):
    async def post(self, ref):
        body = self.json_body()
        path = vfolders.check_path(str(body.get("path") or ""), allow_root=False)
        fid = await self.manager.ops.resolve_folder(self.principal, ref)
        where = await self.manager.ops.file_access(self.principal, fid, "download")
        base, volume = _transfer_base(self, where["host"])
        token = _tokens(self).sign(
            transfer.download_claims(volume, where["quota_scope_id"], where["id"], path,
                                     self.principal.user_id))
        self.reply({"token": token, "url": base + "/download"})


async def _local_grants(handler, claims: dict) -> None:
    """The in-hub proxy asks the record itself: does the token's user still have the
    access it was issued for (active, the folder ready and theirs to read or write)?"""
    await _manager_of(handler).ops.transfer_grant(claims["user"], claims.get("folder"),
                                                  claims["op"])


class TransferGrantHandler(transfer.TransferHandler):
    """``POST .../storage/grant?token=``: a storage proxy daemon asks whether the access
    a transfer token (signed by this hub) was issued for still holds: 204, or 403 with
    the reason. The token is the only credential: the answer tells its holder nothing
    they could not learn by using it."""

    def initialize(self):
        super().initialize(volume=None)  # (no volume: it moves no bytes)

    async def post(self):
        try:
            claims = self.tokens.check(self.token(), None)
            if not isinstance(claims.get("user"), str):
                raise Unauthorized("the transfer token names no user; request a new one")
            await _local_grants(self, claims)
        except BackendAIError as e:
            return self.problem(e)
        self.set_status(204)
        self.finish()


def _manager_of(handler):
    from ...manager.core import BackendAIManager

    auth = handler.settings.get("authenticator")
    return getattr(auth, "manager", None) or BackendAIManager.instance(
        config=handler.settings.get("config"))


def _local_volume(handler, name):
    """The in-hub proxy's volume ``name`` (for the transfer routes)."""
    client = _manager_of(handler).storage.clients.get("local")
    if not isinstance(client, InProcessStorageClient):
        raise NotFound("this hub runs no storage proxy of its own")
    return client.volume(name)


class NotSupported(BackendAIError):
    status_code = 501
    title = "Not implemented"


class NotOffered(BackendAIError):
    status_code = 400
    title = "Not offered by this server"


#: Routes Backend.AI's clients call that this hub does not offer, each with what to use
#: instead (docs/backendai-compat.md): (pattern, key of REFUSALS).
_HOME = "your home folder (.home, mounted at /home/work in every session)"
REFUSALS = {
    "app-proxy": (
        "Backend.AI's HTTP app proxy is not offered here: `backend.ai app SESSION APP` "
        "forwards a local port through the TCP proxy (/stream/session/{id}/tcpproxy), or "
        "open a session's apps through the hub at /user/<you>/<session>/ "
        "(docs/service-ports.md)"),
    "ssh": (
        "`ssh`/`scp` through the app proxy are not offered here: use the SSH port of a "
        "session in a resource group with SSH (its address and key: the session's page in "
        "the hub, docs/service-ports.md), or JupyterLab's terminal"),
    "pty": ("a terminal over the API (`run --terminal`) is not offered here: use "
            "JupyterLab's terminal at /user/<you>/<session>/"),
    "session-files": (
        "files of a running session are not listed or downloaded through the API here: "
        "keep them in a vfolder mounted in the session and use `vfolder ls` / `vfolder "
        "download`, or JupyterLab's file browser"),
    "commit": ("`session commit` is not offered here yet: build the image, push it to a "
               "configured registry and rescan it (`backend.ai admin image rescan`, "
               "docs/images.md)"),
    "template": ("session templates are not offered here: use the hub's presets (the spawn "
                 "form) or `session create` with the options"),
    "dotfile": (f"dotfiles are not offered here: put them in {_HOME}, which every session "
                "of yours mounts"),
    "server-logs": ("the server's error log is the hub's own log (its operator's), not "
                    "served through the API: a session's output is `session logs`"),
    "task-logs": ("background task logs are not kept here (no task runs in the background): "
                  "a session's output is `session logs`"),
    "interrupt": ("interrupting a kernel through the API is not offered here: `run` stops "
                  "with Ctrl-C; JupyterLab's kernel menu interrupts"),
    "complete": "code completion through the API is not offered here: use JupyterLab",
    "start-service": ("starting a service through the API is not offered here: the "
                      "session's apps are served by its Jupyter server, at "
                      "/user/<you>/<session>/proxy/<port>/"),
    "abusing-report": "abuse reports are not kept here",
    "dependency-graph": ("the dependency graph is not offered here: `session info` shows a "
                         "session's dependencies"),
    "etcd": ("the managers' shared settings are the hub's configuration (jupyterhub_config.py; "
             "etcd in cluster mode, docs/cluster.md), not changed through this API"),
    "manager": ("the manager's status and freezing are not offered here: the scheduler's "
                "state is the admin API's GET /hub/api/backendai/scheduler (docs/api.md)"),
    "license": "there is no license to show: this platform is open source",
    "watcher": ("agent watchers are not offered here: agents are services their operator "
                "runs (docs/cluster.md)"),
    "usage": ("usage statistics are not offered through this API: the hub's Prometheus "
              "metrics (/hub/metrics) and the admin API's session list (docs/api.md)"),
    "presets": ("resource presets are the presets of the hub's spawn form, not "
                "served through this API: `session create -r` names the resources"),
    "registries": ("image registries are configured through the admin API "
                   "(/hub/api/backendai/container-registries, docs/images.md); `admin image "
                   "list / rescan / alias / dealias` work here"),
    "admin-vfolder": ("this view of the storage is not offered here: the admin API's "
                      "/vfolder-hosts and /vfolders (docs/api.md)"),
    "services": "model serving (services, endpoints) is not offered here",
    "image-import": "images are not imported through this API",
    "password": ("passwords are changed on the hub's page /hub/backendai/password (or by an "
                 "admin: `admin user update -p`)"),
    "login": ("this hub takes keypair-signed requests: use BACKEND_ENDPOINT_TYPE=api with an "
              "access and a secret key; browsers log in at /hub/login"),
    "announcement": ("announcements are not offered here: the hub's own announcement "
                     "(c.JupyterHub.template_vars) is shown on its pages"),
}


class RefusedHandler(CompatBase):
    """A route Backend.AI's clients call that this hub does not offer: 400 with what to use
    instead (never a bare 404), for every method, after authentication."""

    def initialize(self, what: str):
        self.what = what

    async def _refuse(self, *args):
        what = self.what
        if what == "session-files":
            try:
                files = self.json_body().get("files")
            except BackendAIError:
                files = None
            if files == ["id_container"]:  # what `ssh`/`scp` fetch first
                what = "ssh"
        raise NotOffered(REFUSALS[what])

    get = post = put = patch = delete = head = _refuse
