"""The admin API's endpoints: thin handlers over :mod:`jupyterhub_backendai.manager.admin`.

A handler parses the request (``self.query`` checks it against the filters its route
declares at the bottom of this module, ``self.body`` by the request model of
:mod:`.models`), runs one named manager operation (``await self.manager.ops.<name>``:
:mod:`...manager.admin`, :mod:`...manager.vfolders`, :mod:`...manager.apiviews`) in one
transaction, and writes the result. Side effects outside our record (JupyterHub groups and admin
flags, session start and stop) happen only after that transaction committed.
"""

from __future__ import annotations

import datetime as dt
import json

from ..common.errors import BackendAIError, Forbidden, InvalidRequest
from ..common.types import SessionStatus, UserRole, UserStatus
from ..manager import images, vfolders
from ..manager.usage import parse_period
from . import hubsync, models, restart, spec
from .base import APIBase, document
from .spec import Op, Route, route


def _filters(path: str) -> dict:
    """The query filters declared for the list ``GET path`` (:data:`ROUTES`)."""
    return spec.find(ROUTES, "get", path).filters


def _params(method: str, path: str) -> dict:
    """The query parameters declared for ``method path`` (:data:`ROUTES`)."""
    return spec.find(ROUTES, method, path).params


class _Kind(APIBase):
    """The operations of one kind of object: ``ops.<verb>_<item>``. Those named in
    ``synced`` answer (result, change) and the change is mirrored in JupyterHub
    (:mod:`.hubsync`) after their commit."""

    item = model = ""
    synced: frozenset[str] = frozenset()

    async def run(self, verb: str, *args):
        out = await getattr(self.manager.ops, f"{verb}_{self.item}")(self.principal, *args)
        if verb in self.synced:
            out, change = out
            await hubsync.apply(self, change)
        return out


class _Items(_Kind):
    """A kind's collection: GET lists it (``ops.list_<items>``, with the filters its route
    declares), POST creates one (201, the body ``<model>Create``)."""

    path = items = ""

    async def get(self):
        f, o, n = self.query(_filters(self.path))
        self.reply(await getattr(self.manager.ops, f"list_{self.items}")(self.principal, f, o, n))

    async def post(self):
        self.query()
        self.reply(await self.run("create", self.body(f"{self.model}Create")), 201)


class _Item(_Kind):
    """One of a kind, by its key: GET, PATCH (``<model>Update``), DELETE (204)."""

    async def get(self, key):
        self.query()
        self.reply(await self.run("get", key))

    async def patch(self, key):
        self.query()
        self.reply(await self.run("update", key, self.body(f"{self.model}Update")))

    async def delete(self, key):
        self.query()
        await self.run("delete", key)
        self.reply(None, 204)


class WhoamiHandler(APIBase):
    async def get(self):
        self.query()
        self.reply(await self.manager.ops.whoami(self.principal))


class LoginThrottlesHandler(APIBase):
    """Forget the failed logins an address or an account collected (superadmins): the
    command that ends a throttle at once (``manager/login.py``)."""

    async def delete(self):
        q, _, _ = self.query(params=_params("delete", "/login-throttles"))
        if not self.principal.is_superadmin:
            raise Forbidden("you may not clear login throttles (superadmins may)")
        if not q:
            raise InvalidRequest("name what to clear: address=<client address>, "
                                 "login=<email or username>, or both")
        guard = self.authenticator.login_guard
        key = None
        if "login" in q:
            found = await self.manager.ops.login_record(q["login"])
            key = guard.account_key(q["login"], found and found["id"])
        guard.clear(address=q.get("address"), key=key)
        self.log.info("login throttle cleared by %s: %s", self.principal.username, q)
        self.reply(None, 204)


class OpenAPIHandler(APIBase):
    auth_required = False

    def check_xsrf_cookie(self):
        return None

    async def get(self):
        self.query()
        self.reply(document())


# -- domains -------------------------------------------------------------------


class DomainsHandler(_Items):
    path, items, item, model = "/domains", "domains", "domain", "Domain"


class DomainHandler(_Item):
    item, model, synced = "domain", "Domain", frozenset({"update"})


# -- projects ------------------------------------------------------------------


class ProjectsHandler(_Items):
    path, items, item, model = "/projects", "projects", "project", "Project"
    synced = frozenset({"create"})


class ProjectHandler(_Item):
    item, model, synced = "project", "Project", frozenset({"update", "delete"})


class MembersHandler(APIBase):
    async def get(self, pid):
        _, o, n = self.query(_filters("/projects/{id}/members"))
        self.reply(await self.manager.ops.list_members(self.principal, pid, o, n))

    async def post(self, pid):
        self.query()
        body = self.body("MembersAdd")
        out, change = await self.manager.ops.add_members(self.principal, pid, body["user_ids"])
        await hubsync.apply(self, change)
        self.reply(out)


class MemberHandler(APIBase):
    async def delete(self, pid, uid):
        self.query()
        _, change = await self.manager.ops.remove_members(self.principal, pid, [uid])
        await hubsync.apply(self, change)
        self.reply(None, 204)


# -- users ---------------------------------------------------------------------


class UsersHandler(_Items):
    path, items, item, model = "/users", "users", "user", "User"


class UserHandler(_Item):
    # (a deletion takes the hub's account too: hubsync.delete_user)
    item, model, synced = "user", "User", frozenset({"update", "delete"})


# -- keypairs ------------------------------------------------------------------


class KeypairsHandler(_Items):
    path, items, item, model = "/keypairs", "keypairs", "keypair", "Keypair"


class KeypairHandler(_Item):
    item, model = "keypair", "Keypair"


# -- resource policies -----------------------------------------------------------


class PoliciesHandler(APIBase):
    def initialize(self, kind: str):
        self.kind = kind

    async def get(self):
        f, o, n = self.query(_filters(f"/{self.kind}-resource-policies"))
        self.reply(await self.manager.ops.list_policies(self.principal, self.kind, f, o, n))

    async def post(self):
        self.query()
        body = self.body("KeypairResourcePolicyCreate" if self.kind == "keypair"
                         else "QuotaPolicyCreate")
        self.reply(await self.manager.ops.create_policy(self.principal, self.kind, body), 201)


class PolicyHandler(APIBase):
    def initialize(self, kind: str):
        self.kind = kind

    async def get(self, name):
        self.query()
        self.reply(await self.manager.ops.get_policy(self.principal, self.kind, name))

    async def patch(self, name):
        self.query()
        body = self.body("KeypairResourcePolicyUpdate" if self.kind == "keypair"
                         else "QuotaPolicyUpdate")
        out = await self.manager.ops.update_policy(self.principal, self.kind, name, body)
        if self.kind in ("user", "project"):  # a btrfs volume enforces it from now on
            await vfolders.push_quota_limits(self.manager, self.kind, name)
        self.reply(out)

    async def delete(self, name):
        self.query()
        await self.manager.ops.delete_policy(self.principal, self.kind, name)
        self.reply(None, 204)


# -- resource groups, agents, scheduler ----------------------------------------------


class ResourceGroupsHandler(_Items):
    path, items, item = "/resource-groups", "resource_groups", "resource_group"
    model = "ResourceGroup"


class ResourceGroupHandler(_Item):
    item, model = "resource_group", "ResourceGroup"


class ResourcePresetsHandler(_Items):
    path, items, item = "/resource-presets", "resource_presets", "resource_preset"
    model = "ResourcePreset"


class ResourcePresetHandler(_Item):
    item, model = "resource_preset", "ResourcePreset"


class UsageHandler(APIBase):
    """Usage accounting from the record (manager/usage.py): the caller's own sessions,
    or an admin's scope."""

    async def get(self):
        q, _, _ = self.query(params=_params("get", "/usage"))
        start, end = usage_period(q.get("start"), q.get("end"))
        self.reply(await self.manager.ops.usage_report(
            self.principal, start, end, q.get("group_by") or "user"))


def usage_period(start: str | None, end: str | None):
    """(start, end) of a usage request, checked (a 400 in words otherwise)."""
    return parse_period(start, end, dt.datetime.now(dt.UTC))


class AgentsHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/agents"))
        self.reply(await self.manager.ops.list_agents(self.principal, f, o, n))


class AgentHandler(APIBase):
    async def get(self, aid):
        self.query()
        self.reply(await self.manager.ops.get_agent(self.principal, aid))

    async def patch(self, aid):
        self.query()
        body = self.body("AgentUpdate")
        if body.get("resource_group") is not None:
            await self.manager.agents.move(self.principal, aid, body["resource_group"])
        out = await self.manager.ops.update_agent(self.principal, aid, body)
        self.manager.wake()  # back in service: waiting sessions may fit there now
        self.reply(out)

    async def delete(self, aid):
        self.query()
        await self.manager.ops.delete_agent(self.principal, aid)
        self.reply(None, 204)


class SchedulerHandler(APIBase):
    async def get(self):
        self.query()
        visible = await self.manager.ops.scheduler_view(self.principal)
        status = await self.manager.scheduler_status()
        if visible is not None and isinstance(status, dict):
            groups = set(await self.manager.ops.resource_group_names())
            status = {k: v for k, v in status.items() if k not in groups or k in visible}
        self.reply(json.loads(json.dumps(status, default=str)))


# -- images (issue 25: manager/images.py) --------------------------------------------


class RegistriesHandler(APIBase):
    async def get(self):
        _, o, n = self.query(_filters("/container-registries"))
        items = await self.manager.registries.list(self.principal)
        self.reply({"items": items[o:o + n], "total": len(items), "offset": o, "limit": n})

    async def post(self):
        self.query()
        body = self.body("ContainerRegistryCreate")
        self.reply(await self.manager.registries.create(self.principal, body), 201)


class RegistryHandler(APIBase):
    """One registry, through its owner ``manager.registries`` (etcd in cluster mode)."""

    async def get(self, name):
        self.query()
        self.reply(await self.manager.registries.get(self.principal, name))

    async def patch(self, name):
        self.query()
        body = self.body("ContainerRegistryUpdate")
        self.reply(await self.manager.registries.update(self.principal, name, body))

    async def delete(self, name):
        self.query()
        await self.manager.registries.delete(self.principal, name)
        self.reply(None, 204)


class RegistryRescanHandler(APIBase):
    async def post(self, name):
        self.query()
        self.reply(await self.manager.registries.rescan(self.principal, name))


class ImagesHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/images"))
        self.reply(await self.manager.ops.list_images_page(self.principal, f, o, n))


class ImageHandler(APIBase):
    async def get(self, name):
        self.query()
        self.reply(await self.manager.ops.get_image(self.principal, name))

    async def patch(self, name):
        self.query()
        body = self.body("ImageUpdate")
        self.reply(await self.manager.ops.update_image(self.principal, name, body))


class ImageAliasesHandler(APIBase):
    async def post(self, name):
        self.query()
        body = self.body("ImageAliasCreate")
        self.reply(await self.manager.ops.alias_image(self.principal, body["alias"], name), 201)


class ImageAliasHandler(APIBase):
    async def delete(self, alias):
        self.query()
        await self.manager.ops.dealias_image(self.principal, alias)
        self.reply(None, 204)


# -- sessions ------------------------------------------------------------------


class SessionsHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/sessions"))
        self.reply(await self.manager.session_lists.page(self.principal, f, o, n))

    async def post(self):
        self.query()
        # One typed request, parsed once (models.SessionCreate is a SessionRequest) and
        # handed on as it is: the caller's right to the group here, the record's checks
        # in the manager.
        request = self.parsed_body("SessionCreate")
        await self.manager.ops.check_session_create(self.principal, request.resource_group)
        sid = await self.manager.enqueue(request, username=self.principal.username,
                                         name=request.name, environ={}, service_prefix="/")
        self.reply(await self.manager.ops.get_session(self.principal, sid), 201)


class SessionHandler(APIBase):
    async def get(self, sid):
        self.query()
        self.reply(await self.manager.ops.get_session(self.principal, sid))

    async def delete(self, sid):
        self.query()
        await self.manager.ops.check_session_destroy(self.principal, sid)
        await self.manager.destroy_session(sid)
        self.reply(None, 204)


class SessionLogsHandler(APIBase):
    async def get(self, sid):
        self.query()
        out = await self.manager.ops.session_logs(self.principal, sid)
        # Kept logs are written when a kernel ends; while it runs, ask its agent.
        if out["status"] in (SessionStatus.RUNNING, SessionStatus.TERMINATING):
            for idx, k in enumerate(out["kernels"]):
                k["logs"] = await self.manager.session_logs(sid, kernel_idx=idx)
        self.reply(out)


class SessionServicePortsHandler(APIBase):
    """``GET /sessions/{id}/service-ports``: the apps of a session's Jupyter server (the
    image's ``ai.backend.service-ports``) with the URLs they answer at, behind the hub's
    login: ``<server>/<name>/`` through jupyter-server-proxy in the kernel; the first
    port is the Jupyter server itself. On the user's own origin in subdomain mode."""

    async def get(self, sid):
        self.query()
        rec = await self.manager.ops.session_service_ports(self.principal, sid)
        server_url = None
        if rec["type"] != "batch" and rec["username"]:
            origin = f"{self.request.protocol}://{self.request.host}"
            if self.subdomain_host:
                orm_user = self.find_user(rec["username"])
                if orm_user is not None:
                    origin = self.users[orm_user].host
            server_url = origin + rec["service_prefix"]
        ports = []
        for idx, sp in enumerate(rec["ports"]):
            url = None
            if server_url and sp.get("protocol") == "http":
                url = server_url if idx == 0 else f"{server_url}{sp['name']}/"
            entry = {"name": sp.get("name"), "protocol": sp.get("protocol"),
                     "container_port": sp.get("container_port"), "url": url}
            if sp.get("protocol") == "tcp" and sp.get("host_port"):
                # Issue 12: a non-HTTP port the agent published (sshd, sftp): no hub
                # in front, straight to the node (docs/service-ports.md).
                entry.update(host=rec["host"], port=sp["host_port"])
            ports.append(entry)
        self.reply({
            "session_id": rec["session_id"],
            "status": rec["status"],
            "server_url": server_url,
            "adhoc_url_template": server_url + "proxy/{port}/" if server_url else None,
            "service_ports": ports,
        })


class SessionLifetimeHandler(APIBase):
    """``GET /sessions/{id}/lifetime``: when the session ends by itself (its keypair
    policy's lifetime, with what was added, and idle timeout)."""

    async def get(self, sid):
        self.query()
        self.reply(await self.manager.ops.session_lifetime(self.principal, sid))


class SessionExtendHandler(APIBase):
    """``POST /sessions/{id}/extend``: the lifetime's end later, within the policy."""

    async def post(self, sid):
        self.query()
        body = self.body("SessionExtend")
        self.reply(await self.manager.ops.extend_lifetime(self.principal, sid, body["seconds"]))


class SessionRestartHandler(APIBase):
    """``POST /sessions/{id}/restart``: stopped and started again under its name with the
    same options (a JupyterHub server through the hub; any other session, batch too, by
    the manager: api/restart.py); answers with the new session once it started."""

    async def post(self, sid):
        self.query()
        await self.manager.ops.check_session_destroy(self.principal, sid)
        new = await restart.restart(self, sid)
        self.reply(await self.manager.ops.get_session(self.principal, new), 201)


class SessionCommitHandler(APIBase):
    """``POST /sessions/{id}/commit``: the running session written to an image, pushed to
    a registry and catalogued for its owner (issue 27; manager/images.py)."""

    async def post(self, sid):
        self.query()
        body = self.body("SessionCommit")
        self.reply(await images.commit_session(self.manager, self.principal, sid,
                                               body.get("name")), 201)


class SessionSSHKeyHandler(APIBase):
    """``GET /sessions/{id}/ssh-key``: the private key (OpenSSH format) that logs in to
    the session's sshd as ``work``, derived from the session's keypair
    (manager/sshkeys.py), with where the sshd listens. The owner only, and with a token
    only if it has the write scope (a shell is more than reading)."""

    grants_shell = True

    async def get(self, sid):
        self.query()
        self.set_header("Cache-Control", "no-store")
        self.reply(await self.manager.ops.session_ssh_key(self.principal, sid))


# -- the routes: each declared once, with its operations ------------------------------
#
# The tornado URL list (:func:`routes`) and the OpenAPI document's paths
# (:func:`.document.build_document`) are both made from this table.

F_BOOL, F_STR, enum = spec.F_BOOL, spec.F_STR, spec.enum
PATH_PARAM = {"path": (spec.FILE_PATH, True)}
ROUTES: list[Route] = [
    route("/whoami", WhoamiHandler,
          get=Op("whoami", "The caller: user, role, domain, projects, keypair",
                 response=models.Whoami)),
    route("/domains", DomainsHandler,
          get=Op("listDomains", "Domains the caller sees", filters={"is_active": F_BOOL},
                 response=models.Domain),
          post=Op("createDomain", "Create a domain (superadmin)", body=models.DomainCreate,
                  status=201, response=models.Domain)),
    route("/domains/{name}", DomainHandler,
          get=Op("getDomain", "One domain", response=models.Domain),
          patch=Op("updateDomain", "Change a domain (superadmin)", body=models.DomainUpdate,
                   response=models.Domain),
          delete=Op("deleteDomain", "Delete an empty domain (superadmin)", status=204)),
    route("/projects", ProjectsHandler,
          get=Op("listProjects", "Projects the caller sees",
                 filters={"domain": F_STR, "name": F_STR, "is_active": F_BOOL},
                 response=models.Project),
          post=Op("createProject", "Create a project", body=models.ProjectCreate, status=201,
                  response=models.Project)),
    route("/projects/{id}", ProjectHandler,
          get=Op("getProject", "One project", response=models.Project),
          patch=Op("updateProject", "Change a project", body=models.ProjectUpdate,
                   response=models.Project),
          delete=Op("deleteProject", "Delete a project without sessions", status=204)),
    route("/projects/{id}/members", MembersHandler,
          get=Op("listProjectMembers", "Members of a project", filters={},
                 response=models.User),
          post=Op("addProjectMembers", "Add users of the project's domain",
                  body=models.MembersAdd, response=models.MembersChanged)),
    route("/projects/{id}/members/{user_id}", MemberHandler,
          delete=Op("removeProjectMember", "Remove a member", status=204)),
    route("/users", UsersHandler,
          get=Op("listUsers", "Users the caller sees",
                 filters={"domain": F_STR, "role": enum(UserRole), "status": enum(UserStatus),
                          "project": F_STR, "email": F_STR},
                 response=models.User),
          post=Op("createUser", "Create a user and its default keypair",
                  body=models.UserCreate, status=201, response=models.UserCreated)),
    route("/users/{id}", UserHandler,
          get=Op("getUser", "One user", response=models.User),
          patch=Op("updateUser", "Change a user", body=models.UserUpdate, response=models.User),
          delete=Op("deleteUser", "Delete a user without sessions", status=204)),
    route("/keypairs", KeypairsHandler,
          get=Op("listKeypairs", "Keypairs the caller sees (never their secret keys)",
                 filters={"user_id": F_STR, "is_active": F_BOOL}, response=models.Keypair),
          post=Op("createKeypair", "Create a keypair; the secret key is shown once",
                  body=models.KeypairCreate, status=201, response=models.KeypairCreated)),
    route("/keypairs/{access_key}", KeypairHandler,
          get=Op("getKeypair", "One keypair", response=models.Keypair),
          patch=Op("updateKeypair", "Change or deactivate a keypair",
                   body=models.KeypairUpdate, response=models.Keypair),
          delete=Op("deleteKeypair", "Delete a keypair without sessions", status=204)),
]
for _kind, _schema in spec.POLICY_KINDS.items():
    _Op, _model = _kind.capitalize() + "ResourcePolicy", getattr(models, _schema)
    ROUTES += [
        route(f"/{_kind}-resource-policies", PoliciesHandler, {"kind": _kind},
              get=Op(f"list{_Op}s", f"{_kind.capitalize()} resource policies", filters={},
                     response=_model),
              post=Op(f"create{_Op}", f"Create a {_kind} resource policy (superadmin)",
                      body=getattr(models, _schema + "Create"), status=201, response=_model)),
        route(f"/{_kind}-resource-policies/{{name}}", PolicyHandler, {"kind": _kind},
              get=Op(f"get{_Op}", f"One {_kind} resource policy", response=_model),
              patch=Op(f"update{_Op}", f"Change a {_kind} resource policy",
                       body=getattr(models, _schema + "Update"), response=_model),
              delete=Op(f"delete{_Op}", f"Delete an unused {_kind} resource policy",
                        status=204)),
    ]
ROUTES += [
    route("/resource-groups", ResourceGroupsHandler,
          get=Op("listResourceGroups", "Resource groups the caller may use",
                 filters={"is_active": F_BOOL}, response=models.ResourceGroup),
          post=Op("createResourceGroup", "Create a resource group (superadmin)",
                  body=models.ResourceGroupCreate, status=201, response=models.ResourceGroup)),
    route("/resource-groups/{name}", ResourceGroupHandler,
          get=Op("getResourceGroup", "One resource group", response=models.ResourceGroup),
          patch=Op("updateResourceGroup", "Change a resource group",
                   body=models.ResourceGroupUpdate, response=models.ResourceGroup),
          delete=Op("deleteResourceGroup", "Delete a resource group without agents or sessions",
                    status=204)),
    route("/resource-presets", ResourcePresetsHandler,
          get=Op("listResourcePresets", "Resource presets of the resource groups the caller may "
                 "use (those of every group, and of the one named)",
                 filters={"resource_group": F_STR}, response=models.ResourcePreset),
          post=Op("createResourcePreset", "Create a resource preset (superadmin)",
                  body=models.ResourcePresetCreate, status=201, response=models.ResourcePreset)),
    route("/resource-presets/{name}", ResourcePresetHandler,
          get=Op("getResourcePreset", "One resource preset", response=models.ResourcePreset),
          patch=Op("updateResourcePreset", "Change a resource preset (superadmin)",
                   body=models.ResourcePresetUpdate, response=models.ResourcePreset),
          delete=Op("deleteResourcePreset", "Delete a resource preset (superadmin)",
                    status=204)),
    route("/usage", UsageHandler,
          get=Op("getUsage", "Core-, GiB- and GPU-hours of the sessions the caller may see "
                 "(their own; an admin's domain; a superadmin's all), per user, project, "
                 "domain or resource group, for a period (default: this month so far); "
                 "sessions that span the period's edges count only inside it",
                 params={"start": (F_STR, False), "end": (F_STR, False),
                         "group_by": (enum(("user", "project", "domain", "resource_group")),
                                      False)},
                 response=models.UsageReport)),
    route("/agents", AgentsHandler,
          get=Op("listAgents", "Agents of the resource groups the caller may use",
                 filters={"resource_group": F_STR, "status": F_STR}, response=models.Agent)),
    route("/agents/{id}", AgentHandler,
          get=Op("getAgent", "One agent", response=models.Agent),
          patch=Op("updateAgent", "Decommission an agent (schedulable false: no new sessions) "
                   "or return it to service; move it to another resource group (superadmin)",
                   body=models.AgentUpdate,
                   response=models.Agent),
          delete=Op("deleteAgent", "Remove a gone agent (not ALIVE, no live sessions) from the "
                    "record (superadmin)", status=204)),
    route("/container-registries", RegistriesHandler,
          get=Op("listContainerRegistries", "Container registries (superadmins; never their "
                 "passwords)", filters={}, response=models.ContainerRegistry),
          post=Op("createContainerRegistry", "Add a container registry (superadmin)",
                  body=models.ContainerRegistryCreate, status=201,
                  response=models.ContainerRegistry)),
    route("/container-registries/{name}", RegistryHandler,
          get=Op("getContainerRegistry", "One container registry",
                 response=models.ContainerRegistry),
          patch=Op("updateContainerRegistry", "Change a container registry",
                   body=models.ContainerRegistryUpdate, response=models.ContainerRegistry),
          delete=Op("deleteContainerRegistry", "Remove a container registry and its images",
                    status=204)),
    route("/container-registries/{name}/rescan", RegistryRescanHandler,
          post=Op("rescanContainerRegistry", "Read a registry's labelled images into the "
                  "catalogue (name 'local': the agents' own images)",
                  response=models.ImageRescan)),
    route("/images", ImagesHandler,
          get=Op("listImages", "The image catalogue (hidden images: admins)",
                 filters={"hidden": F_BOOL, "source": F_STR}, response=models.Image)),
    route("/images/{name}", ImageHandler,
          get=Op("getImage", "One catalogued image, by name or alias (URL-encoded)",
                 response=models.Image),
          patch=Op("updateImage", "Hide or show, describe, mark the default (superadmin)",
                   body=models.ImageUpdate, response=models.Image)),
    route("/images/{name}/aliases", ImageAliasesHandler,
          post=Op("aliasImage", "Give an image an alias (superadmin)",
                  body=models.ImageAliasCreate, status=201, response=models.Image)),
    route("/image-aliases/{alias}", ImageAliasHandler,
          delete=Op("dealiasImage", "Remove an image alias (superadmin)", status=204)),
    route("/sessions", SessionsHandler,
          get=Op("listSessions", "Sessions the caller sees",
                 filters={"status": enum(SessionStatus), "user_id": F_STR, "project_id": F_STR,
                          "type": enum(["interactive", "batch"])},
                 response=models.Session),
          post=Op("createSession", "Queue a batch session for the caller",
                  body=models.SessionCreate, status=201, response=models.Session)),
    route("/sessions/{id}", SessionHandler,
          get=Op("getSession", "One session", response=models.Session),
          delete=Op("deleteSession", "Stop a session and free its slots", status=204)),
    route("/sessions/{id}/logs", SessionLogsHandler,
          get=Op("getSessionLogs", "Output of a session's kernels",
                 response=models.SessionLogs)),
    route("/sessions/{id}/service-ports", SessionServicePortsHandler,
          get=Op("getSessionServicePorts", "A session's service ports (apps) with their URLs",
                 response=models.SessionServicePorts)),
    route("/sessions/{id}/lifetime", SessionLifetimeHandler,
          get=Op("getSessionLifetime", "When a session ends by itself (lifetime, idle timeout)",
                 response=models.SessionLifetime)),
    route("/sessions/{id}/extend", SessionExtendHandler,
          post=Op("extendSession", "Extend a running session's lifetime within its policy",
                  body=models.SessionExtend, response=models.SessionLifetime)),
    route("/sessions/{id}/restart", SessionRestartHandler,
          post=Op("restartSession", "Stop a session and start it again under its name with "
                  "the same options; the new session", response=models.Session, status=201)),
    route("/sessions/{id}/commit", SessionCommitHandler,
          post=Op("commitSession", "Write a running session to an image in a registry, "
                  "catalogued for its owner", body=models.SessionCommit,
                  response=models.Image, status=201)),
    route("/sessions/{id}/ssh-key", SessionSSHKeyHandler,
          get=Op("getSessionSSHKey",
                 "The owner's key to the session's sshd (resource groups with SSH)",
                 response=models.SessionSSHKey)),
    route("/scheduler", SchedulerHandler,
          get=Op("schedulerStatus", "What the scheduler is doing (admins)",
                 response=models.SchedulerStatus)),
    route("/login-throttles", LoginThrottlesHandler,
          delete=Op("clearLoginThrottles",
                    "Forget the failed logins of a client address and/or an account (superadmin)",
                    params={"address": (F_STR, False), "login": (F_STR, False)}, status=204)),
    route("/openapi.json", OpenAPIHandler,
          get=Op("openapi", "The OpenAPI document", public=True, tag="meta",
                 response={"type": "object"})),
]


__all__ = ["ROUTES", "BackendAIError"]
