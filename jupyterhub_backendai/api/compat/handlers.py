"""Backend.AI's REST routes (the 23.09 client's), as thin handlers over the manager:
here version negotiation, GraphQL, the configuration reads and the refusals; sessions
in :mod:`.sessions`, folders in :mod:`.folders`, ``run`` in :mod:`.execute`, the app
proxy in :mod:`.appproxy`.

Each handler names the session or folder the way Backend.AI's clients do (by name
or id, dashed or hex), finds it through the caller's view (the operations
``resolve_session`` and ``resolve_folder`` of :mod:`...manager.compatviews`), and then
calls the same service the admin API calls. The route table is the package's
(:func:`.routes`). Errors leave in Backend.AI's problem+json shape
(``type: https://api.backend.ai/probs/...``, ``title``, ``msg``), which the
client prints.
"""

from __future__ import annotations

from ...common.errors import (
    BackendAIError,
    InvalidRequest,
)
from .base import CompatBase

# The API version announced in version negotiation: the 23.09 client's own (v7.20230615),
# so it uses the routes and GraphQL fields implemented here.
API_VERSION = "v7.20230615"
MANAGER_VERSION = "23.09.10"


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
        # (GraphQL and the schema load at the first query, not at every hub start:
        # graphql-core's import and the schema's build were 7 % of a hub's start)
        from . import gql

        body = self.json_body()
        query, variables = body.get("query"), body.get("variables") or {}
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequest("query: a GraphQL query string is required")
        if not isinstance(variables, dict):
            raise InvalidRequest("variables must be an object")
        self.reply(await gql.execute(self.manager, self.principal, query, variables, hub=self))


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
    "pty": ("a terminal over the API (`run --terminal`) is not offered here: use "
            "JupyterLab's terminal at /user/<you>/<session>/"),
    "session-files": ("this route is not offered here: `session download SESSION FILE...` "
                      "and `session ls SESSION [PATH]` read the files of your running "
                      "interactive session (under /home/work)"),
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
                   "(/hub/api/backendai/container-registries, docs/images.md) or with `admin "
                   "etcd set config/docker/registry/<host>`; `admin image list / rescan / "
                   "alias / dealias` work here"),
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
        raise NotOffered(REFUSALS[self.what])

    get = post = put = patch = delete = head = _refuse
