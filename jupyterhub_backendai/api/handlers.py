"""The admin API's endpoints: thin handlers over :mod:`jupyterhub_backendai.manager.admin`.

A handler parses the request (``self.query``/``self.body`` check it against the
OpenAPI document), runs one manager function in one transaction, and writes
the result. Side effects outside our record (JupyterHub groups and admin
flags, session start and stop) happen only after that transaction committed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import urllib.parse

from tornado import web

from ..common.errors import BackendAIError, InvalidRequest
from ..common.session_request import SessionRequest, resources
from ..common.types import SessionStatus
from ..manager import admin, vfolders
from . import hubsync, spec
from .base import APIBase, document


def _filters(path: str) -> dict:
    for method, p, *_rest in spec.ROUTES:
        if p == path and method == "get" and _rest[2] is not None:
            return _rest[2]
    raise KeyError(path)


class WhoamiHandler(APIBase):
    async def get(self):
        self.query()
        self.reply(await self.manager.db_read(admin.whoami, self.principal))


class OpenAPIHandler(APIBase):
    auth_required = False

    def check_xsrf_cookie(self):
        return None

    async def get(self):
        self.query()
        self.reply(document())


# -- domains -------------------------------------------------------------------


class DomainsHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/domains"))
        self.reply(await self.manager.db_read(admin.list_domains, self.principal, f, o, n))

    async def post(self):
        self.query()
        body = self.body("DomainCreate")
        self.reply(await self.manager.db(admin.create_domain, self.principal, body), 201)


class DomainHandler(APIBase):
    async def get(self, name):
        self.query()
        self.reply(await self.manager.db_read(admin.get_domain, self.principal, name))

    async def patch(self, name):
        self.query()
        body = self.body("DomainUpdate")
        out, change = await self.manager.db(hubsync.update_domain, self.principal, name, body)
        await hubsync.apply(self, change)
        self.reply(out)

    async def delete(self, name):
        self.query()
        await self.manager.db(admin.delete_domain, self.principal, name)
        self.reply(None, 204)


# -- projects ------------------------------------------------------------------


class ProjectsHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/projects"))
        self.reply(await self.manager.db_read(admin.list_projects, self.principal, f, o, n))

    async def post(self):
        self.query()
        body = self.body("ProjectCreate")
        out, change = await self.manager.db(hubsync.create_project, self.principal, body)
        await hubsync.apply(self, change)
        self.reply(out, 201)


class ProjectHandler(APIBase):
    async def get(self, pid):
        self.query()
        self.reply(await self.manager.db_read(admin.get_project, self.principal, pid))

    async def patch(self, pid):
        self.query()
        body = self.body("ProjectUpdate")
        out, change = await self.manager.db(hubsync.update_project, self.principal, pid, body)
        await hubsync.apply(self, change)
        self.reply(out)

    async def delete(self, pid):
        self.query()
        _, change = await self.manager.db(hubsync.delete_project, self.principal, pid)
        await hubsync.apply(self, change)
        self.reply(None, 204)


class MembersHandler(APIBase):
    async def get(self, pid):
        _, o, n = self.query(_filters("/projects/{id}/members"))
        self.reply(await self.manager.db_read(admin.list_members, self.principal, pid, o, n))

    async def post(self, pid):
        self.query()
        body = self.body("MembersAdd")
        out, change = await self.manager.db(hubsync.add_members, self.principal, pid,
                                            body["user_ids"])
        await hubsync.apply(self, change)
        self.reply(out)


class MemberHandler(APIBase):
    async def delete(self, pid, uid):
        self.query()
        _, change = await self.manager.db(hubsync.remove_members, self.principal, pid, [uid])
        await hubsync.apply(self, change)
        self.reply(None, 204)


# -- users ---------------------------------------------------------------------


class UsersHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/users"))
        self.reply(await self.manager.db_read(admin.list_users, self.principal, f, o, n))

    async def post(self):
        self.query()
        body = self.body("UserCreate")
        out = await self.manager.db(admin.create_user, self.principal, body)
        self.reply(out, 201)


class UserHandler(APIBase):
    async def get(self, uid):
        self.query()
        self.reply(await self.manager.db_read(admin.get_user, self.principal, uid))

    async def patch(self, uid):
        self.query()
        body = self.body("UserUpdate")
        out, change = await self.manager.db(hubsync.update_user, self.principal, uid, body)
        await hubsync.apply(self, change)
        self.reply(out)

    async def delete(self, uid):
        self.query()
        # (the hub's account goes too: hubsync.delete_user)
        _, change = await self.manager.db(hubsync.delete_user, self.principal, uid)
        await hubsync.apply(self, change)
        self.reply(None, 204)


# -- keypairs ------------------------------------------------------------------


class KeypairsHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/keypairs"))
        self.reply(await self.manager.db_read(admin.list_keypairs, self.principal, f, o, n))

    async def post(self):
        self.query()
        body = self.body("KeypairCreate")
        self.reply(await self.manager.db(admin.create_keypair, self.principal, body), 201)


class KeypairHandler(APIBase):
    async def get(self, ak):
        self.query()
        self.reply(await self.manager.db_read(admin.get_keypair, self.principal, ak))

    async def patch(self, ak):
        self.query()
        body = self.body("KeypairUpdate")
        self.reply(await self.manager.db(admin.update_keypair, self.principal, ak, body))

    async def delete(self, ak):
        self.query()
        await self.manager.db(admin.delete_keypair, self.principal, ak)
        self.reply(None, 204)


# -- resource policies -----------------------------------------------------------


class PoliciesHandler(APIBase):
    def initialize(self, kind: str):
        self.kind = kind

    async def get(self):
        f, o, n = self.query(_filters(f"/{self.kind}-resource-policies"))
        self.reply(await self.manager.db_read(admin.list_policies, self.principal, self.kind, f, o, n))

    async def post(self):
        self.query()
        body = self.body("KeypairResourcePolicyCreate" if self.kind == "keypair"
                         else "QuotaPolicyCreate")
        self.reply(await self.manager.db(admin.create_policy, self.principal, self.kind, body), 201)


class PolicyHandler(APIBase):
    def initialize(self, kind: str):
        self.kind = kind

    async def get(self, name):
        self.query()
        self.reply(await self.manager.db_read(admin.get_policy, self.principal, self.kind, name))

    async def patch(self, name):
        self.query()
        body = self.body("KeypairResourcePolicyUpdate" if self.kind == "keypair"
                         else "QuotaPolicyUpdate")
        self.reply(await self.manager.db(admin.update_policy, self.principal, self.kind, name, body))

    async def delete(self, name):
        self.query()
        await self.manager.db(admin.delete_policy, self.principal, self.kind, name)
        self.reply(None, 204)


# -- resource groups, agents, scheduler ----------------------------------------------


class ResourceGroupsHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/resource-groups"))
        self.reply(await self.manager.db_read(admin.list_resource_groups, self.principal, f, o, n))

    async def post(self):
        self.query()
        body = self.body("ResourceGroupCreate")
        self.reply(await self.manager.db(admin.create_resource_group, self.principal, body), 201)


class ResourceGroupHandler(APIBase):
    async def get(self, name):
        self.query()
        self.reply(await self.manager.db_read(admin.get_resource_group, self.principal, name))

    async def patch(self, name):
        self.query()
        body = self.body("ResourceGroupUpdate")
        self.reply(await self.manager.db(admin.update_resource_group, self.principal, name, body))

    async def delete(self, name):
        self.query()
        await self.manager.db(admin.delete_resource_group, self.principal, name)
        self.reply(None, 204)


class AgentsHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/agents"))
        self.reply(await self.manager.db_read(admin.list_agents, self.principal, f, o, n))


class AgentHandler(APIBase):
    async def get(self, aid):
        self.query()
        self.reply(await self.manager.db_read(admin.get_agent, self.principal, aid))


class SchedulerHandler(APIBase):
    async def get(self):
        self.query()
        visible = await self.manager.db_read(admin.scheduler_view, self.principal)
        status = await self.manager.scheduler_status()
        if visible is not None and isinstance(status, dict):
            groups = await self.manager.db(
                lambda s: set(s.scalars(admin.select(admin.ResourceGroup.name))))
            status = {k: v for k, v in status.items() if k not in groups or k in visible}
        self.reply(json.loads(json.dumps(status, default=str)))


# -- sessions ------------------------------------------------------------------


def _parse_time(field: str, value: str | None) -> dt.datetime | None:
    if value is None:
        return None
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"{field}: {value!r} is not an ISO 8601 date-time") from None
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


class SessionsHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/sessions"))
        self.reply(await self.manager.session_lists.page(self.principal, f, o, n))

    async def post(self):
        self.query()
        body = self.body("SessionCreate")
        group = body.get("resource_group", "default")
        await self.manager.db(admin.check_session_create, self.principal, group)
        image, slots = resources({"image": body["image"], **body.get("resources", {})})
        request = SessionRequest(
            image=image,
            slots=slots,
            resource_group=group,
            session_type=body.get("type", "batch"),
            project=body.get("project"),
            cluster_size=body.get("cluster_size", 1),
            cluster_mode=body.get("cluster_mode", "single-node"),
            priority=body.get("priority"),
            startup_command=body["startup_command"],
            batch_timeout=body.get("batch_timeout"),
            starts_at=_parse_time("starts_at", body.get("starts_at")),
            dependencies=body.get("dependencies", []),
            mounts=body.get("mounts", []),
        )
        sid = await self.manager.enqueue(request, username=self.principal.username,
                                         name=body["name"], environ={}, service_prefix="/")
        self.reply(await self.manager.db_read(admin.get_session, self.principal, sid), 201)


class SessionHandler(APIBase):
    async def get(self, sid):
        self.query()
        self.reply(await self.manager.db_read(admin.get_session, self.principal, sid))

    async def delete(self, sid):
        self.query()
        await self.manager.db(admin.check_session_destroy, self.principal, sid)
        await self.manager.destroy_session(sid)
        self.reply(None, 204)


class SessionLogsHandler(APIBase):
    async def get(self, sid):
        self.query()
        out = await self.manager.db_read(admin.session_logs, self.principal, sid)
        # Kept logs are written when a kernel ends; while it runs, ask its agent.
        if out["status"] in (SessionStatus.RUNNING, SessionStatus.TERMINATING):
            for idx, k in enumerate(out["kernels"]):
                k["logs"] = await self.manager.session_logs(sid, kernel_idx=idx)
        self.reply(out)


def _service_ports(db, p, sid: str) -> dict:
    """What :class:`SessionServicePortsHandler` needs from the record (visibility as for
    ``GET /sessions/{id}``)."""
    from ..models import User

    s = admin._get_session(db, p, sid)
    owner = db.get(User, s.user_id)
    main = next((k for k in s.kernels if k.cluster_role == "main"), None)
    return {
        "session_id": s.id,
        "status": s.status,
        "type": s.session_type,
        "username": owner.username if owner else None,
        "service_prefix": s.service_prefix,
        "ports": list(main.service_ports or []) if main is not None else [],
        "host": main.kernel_host if main is not None else None,
    }


class SessionServicePortsHandler(APIBase):
    """``GET /sessions/{id}/service-ports``: the apps of a session's Jupyter server (the
    image's ``ai.backend.service-ports``) with the URLs they answer at, behind the hub's
    login: ``<server>/<name>/`` through jupyter-server-proxy in the kernel; the first
    port is the Jupyter server itself. On the user's own origin in subdomain mode."""

    async def get(self, sid):
        self.query()
        rec = await self.manager.db_read(_service_ports, self.principal, sid)
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


def _ssh_key(db, p, sid: str) -> dict:
    """Issue 12: the key of a session's published sshd, for its owner only (others who
    may see the session, admins included, get 403; the rest 404 as for the session)."""
    from ..common.errors import Forbidden, NotFound
    from ..manager import sshkeys
    from ..models import Keypair

    s = admin._get_session(db, p, sid)
    if s.user_id != p.user_id:
        raise Forbidden("only the session's owner gets its SSH key")
    main = next((k for k in s.kernels if k.cluster_role == "main"), None)
    sshd = next((sp for sp in (main.service_ports or []) if sp.get("name") == "sshd"
                 and sp.get("host_port")), None) if main is not None else None
    kp = db.get(Keypair, s.access_key)
    if sshd is None or kp is None:
        raise NotFound(f"session {sid} has no SSH port (its resource group "
                       f"{s.resource_group!r} does not offer SSH, or it is not running)")
    return {
        "session_id": s.id, "access_key": kp.access_key, "user": sshkeys.SSH_USER,
        "host": main.kernel_host, "port": sshd["host_port"],
        "public_key": sshkeys.public_key(kp.secret_key, kp.access_key),
        "private_key": sshkeys.private_key(kp.secret_key),
    }


class SessionSSHKeyHandler(APIBase):
    """``GET /sessions/{id}/ssh-key``: the private key (OpenSSH format) that logs in to
    the session's sshd as ``work``, derived from the session's keypair
    (manager/sshkeys.py), with where the sshd listens. The owner only, and with a token
    only if it has the write scope (a shell is more than reading)."""

    grants_shell = True

    async def get(self, sid):
        self.query()
        self.set_header("Cache-Control", "no-store")
        self.reply(await self.manager.db_read(_ssh_key, self.principal, sid))


# -- vfolders ------------------------------------------------------------------


def _params(method: str, path: str) -> dict:
    return spec.PARAMS[(method, path)]


class VFolderHostsHandler(APIBase):
    async def get(self):
        self.query()
        self.reply(await vfolders.hosts(self.manager, self.principal))


class VFoldersHandler(APIBase):
    async def get(self):
        f, o, n = self.query(_filters("/vfolders"))
        self.reply(await self.manager.db_read(vfolders.list_folders, self.principal, f, o, n))

    async def post(self):
        self.query()
        body = self.body("VFolderCreate")
        self.reply(await vfolders.create(self.manager, self.principal, body), 201)


class VFolderHandler(APIBase):
    async def get(self, fid):
        self.query()
        self.reply(await self.manager.db_read(vfolders.get_folder, self.principal, fid))

    async def patch(self, fid):
        self.query()
        body = self.body("VFolderUpdate")
        self.reply(await self.manager.db(vfolders.update_folder, self.principal, fid, body))

    async def delete(self, fid):
        self.query()
        await vfolders.delete(self.manager, self.principal, fid)
        self.reply(None, 204)


class VFolderSharesHandler(APIBase):
    async def get(self, fid):
        _, o, n = self.query(_filters("/vfolders/{id}/shares"))
        self.reply(await self.manager.db_read(vfolders.list_shares, self.principal, fid, o, n))

    async def post(self, fid):
        self.query()
        body = self.body("VFolderShareCreate")
        self.reply(await self.manager.db(vfolders.add_share, self.principal, fid, body), 201)


class VFolderShareHandler(APIBase):
    async def patch(self, fid, who):
        self.query()
        body = self.body("VFolderShareUpdate")
        # (tornado has already unquoted the path's segments)
        self.reply(await self.manager.db(vfolders.update_share, self.principal, fid, who, body))

    async def delete(self, fid, who):
        self.query()
        await self.manager.db(vfolders.remove_share, self.principal, fid, who)
        self.reply(None, 204)


class VFolderFilesHandler(APIBase):
    async def get(self, fid):
        q, _, _ = self.query(params=_params("get", "/vfolders/{id}/files"))
        path = vfolders.check_path(q.get("path", ""))
        where = await self.manager.db_read(vfolders.file_access, self.principal, fid, "list")
        self.reply(await vfolders.list_files(self.manager, where, path))

    async def delete(self, fid):
        q, _, _ = self.query(params=_params("delete", "/vfolders/{id}/files"))
        path = vfolders.check_path(q["path"], allow_root=False)
        where = await self.manager.db_read(vfolders.file_access, self.principal, fid, "delete")
        await vfolders.delete_files(self.manager, where, path, q.get("recursive", False))
        self.reply(None, 204)


class VFolderMkdirHandler(APIBase):
    async def post(self, fid):
        self.query()
        body = self.body("VFolderMkdir")
        path = vfolders.check_path(body["path"], allow_root=False)
        where = await self.manager.db_read(vfolders.file_access, self.principal, fid, "write")
        await vfolders.mkdir(self.manager, where, path, parents=body.get("parents", False))
        self.reply({"path": path}, 201)


class VFolderRenameHandler(APIBase):
    async def post(self, fid):
        self.query()
        body = self.body("VFolderRename")
        src = vfolders.check_path(body["path"], allow_root=False)
        dst = vfolders.check_path(body["new_path"], "new_path", allow_root=False)
        where = await self.manager.db_read(vfolders.file_access, self.principal, fid, "write")
        await vfolders.rename(self.manager, where, src, dst)
        self.reply({"path": dst})


# Largest upload accepted in one request; the quota scope's limit applies as well.
MAX_UPLOAD = 64 * 2**30
_END = object()


@web.stream_request_body
class VFolderUploadHandler(APIBase):
    """``PUT`` streams the request body to the storage as it arrives: nothing is
    buffered whole, and a write the storage refuses (quota, permission) leaves no
    file (the storage writes to a temporary name and renames at the end)."""

    _queue: asyncio.Queue | None = None
    _task: asyncio.Task | None = None
    _refused: Exception | None = None

    async def prepare(self):
        # A refusal is answered after the body is read: answering first would make the
        # hub drop the connection, and the proxy in front may already be reusing it.
        if self.request.method != "PUT":
            await super().prepare()
            return
        try:
            await self._start()
        except (BackendAIError, web.HTTPError) as e:
            self._refused = e

    async def _start(self):
        await super().prepare()
        q, _, _ = self.query(params=_params("put", "/vfolders/{id}/upload"))
        self._path = vfolders.check_path(q["path"], allow_root=False)
        where = await self.manager.db_read(vfolders.file_access, self.principal,
                                           self.path_args[0], "upload")
        self.request.connection.set_max_body_size(MAX_UPLOAD)
        self._queue = asyncio.Queue(maxsize=8)

        async def chunks():
            while True:
                chunk = await self._queue.get()
                if chunk is _END:
                    return
                yield chunk

        self._task = asyncio.ensure_future(
            vfolders.upload(self.manager, where, self._path, chunks()))

    async def data_received(self, chunk: bytes):
        if self._task is None or self._task.done():
            return  # refused already: the rest of the body is read and dropped
        put = asyncio.ensure_future(self._queue.put(chunk))
        await asyncio.wait([put, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()

    async def put(self, fid):
        if self._refused is not None:
            raise self._refused
        if not self._task.done():
            put = asyncio.ensure_future(self._queue.put(_END))
            await asyncio.wait([put, self._task], return_when=asyncio.FIRST_COMPLETED)
        size = await self._task
        self.reply({"path": self._path, "size": size}, 201)

    def on_connection_close(self):
        # The client went away mid-body: the storage drops what it had started.
        if self._task is not None and not self._task.done():
            self._task.cancel()
        super().on_connection_close()


class VFolderDownloadHandler(APIBase):
    async def get(self, fid):
        q, _, _ = self.query(params=_params("get", "/vfolders/{id}/download"))
        path = vfolders.check_path(q["path"], allow_root=False)
        where = await self.manager.db_read(vfolders.file_access, self.principal, fid, "download")
        size, chunks = await vfolders.download(self.manager, where, path)
        name = path.rsplit("/", 1)[-1]
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Length", str(size))
        self.set_header("Content-Disposition",
                        f"attachment; filename*=UTF-8''{urllib.parse.quote(name)}")
        try:
            async for chunk in chunks:
                self.write(chunk)
                await self.flush()  # raises when the client went away
        finally:
            await chunks.aclose()  # the storage's open file, whatever happened
        self.finish()


SEG = r"([^/]+)"


def routes() -> list[tuple]:
    """(pattern, handler, kwargs) relative to the hub prefix (JupyterHub adds ``/hub``)."""
    base = spec.PREFIX.removeprefix("/hub")
    table = [
        ("/whoami", WhoamiHandler),
        ("/openapi.json", OpenAPIHandler),
        ("/domains", DomainsHandler),
        (f"/domains/{SEG}", DomainHandler),
        ("/projects", ProjectsHandler),
        (f"/projects/{SEG}", ProjectHandler),
        (f"/projects/{SEG}/members", MembersHandler),
        (f"/projects/{SEG}/members/{SEG}", MemberHandler),
        ("/users", UsersHandler),
        (f"/users/{SEG}", UserHandler),
        ("/keypairs", KeypairsHandler),
        (f"/keypairs/{SEG}", KeypairHandler),
    ]
    for kind in spec.POLICY_KINDS:
        table += [(f"/{kind}-resource-policies", PoliciesHandler, {"kind": kind}),
                  (f"/{kind}-resource-policies/{SEG}", PolicyHandler, {"kind": kind})]
    table += [
        ("/resource-groups", ResourceGroupsHandler),
        (f"/resource-groups/{SEG}", ResourceGroupHandler),
        ("/agents", AgentsHandler),
        (f"/agents/{SEG}", AgentHandler),
        ("/scheduler", SchedulerHandler),
        ("/sessions", SessionsHandler),
        (f"/sessions/{SEG}", SessionHandler),
        (f"/sessions/{SEG}/logs", SessionLogsHandler),
        (f"/sessions/{SEG}/service-ports", SessionServicePortsHandler),
        (f"/sessions/{SEG}/ssh-key", SessionSSHKeyHandler),
        ("/vfolder-hosts", VFolderHostsHandler),
        ("/vfolders", VFoldersHandler),
        (f"/vfolders/{SEG}", VFolderHandler),
        (f"/vfolders/{SEG}/shares", VFolderSharesHandler),
        (f"/vfolders/{SEG}/shares/{SEG}", VFolderShareHandler),
        (f"/vfolders/{SEG}/files", VFolderFilesHandler),
        (f"/vfolders/{SEG}/upload", VFolderUploadHandler),
        (f"/vfolders/{SEG}/download", VFolderDownloadHandler),
        (f"/vfolders/{SEG}/mkdir", VFolderMkdirHandler),
        (f"/vfolders/{SEG}/rename", VFolderRenameHandler),
    ]
    out = []
    for row in table:
        pattern, handler, *kw = row
        out.append((base + pattern, handler, *(kw or [])))
    from .base import NotFoundHandler

    out.append((base + r"(?:/.*)?", NotFoundHandler))
    return out


__all__ = ["routes", "BackendAIError"]
