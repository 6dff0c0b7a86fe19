"""BackendAISpawner: each JupyterHub server is a Backend.AI compute session.

``start()`` enqueues a PENDING session; the manager's scheduler places it on an
agent, the agent starts the kernel, and ``start()`` returns the main kernel's
Jupyter server URL only once that server answers, so the hub's first readiness
check succeeds at once. ``progress()`` streams every state on the way. A request
that does not fit now waits PENDING (and says so) until capacity frees up or the
hub's ``start_timeout`` runs out, which stops and removes it.
"""

from __future__ import annotations

import asyncio
import html
import time

from jupyterhub.spawner import Spawner, SpawnException
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets import Integer, List, Unicode, default

from .common.errors import BackendAIError, InvalidRequest
from .common.slots import CPU, CUDA, MEM, format_size
from .common.types import DEAD_STATUSES, PROGRESS, SessionStatus
from .manager.core import BackendAIManager

_FORM = """
<div class="backendai-form">
  <div class="form-group mb-3">
    <label for="backendai-image" class="form-label">Image</label>
    <select class="form-select form-control" id="backendai-image" name="image">{image_options}</select>
  </div>
  <div class="row">
    <div class="form-group mb-3 col-sm-4">
      <label for="backendai-cpu" class="form-label">CPU cores</label>
      <input class="form-control" id="backendai-cpu" name="cpu" type="number" min="0.1" step="0.1" value="{cpu}">
    </div>
    <div class="form-group mb-3 col-sm-4">
      <label for="backendai-mem" class="form-label">Memory</label>
      <input class="form-control" id="backendai-mem" name="mem" type="text" value="{mem}" pattern="[0-9.]+[kmgtKMGT]?">
    </div>
    <div class="form-group mb-3 col-sm-4">
      <label for="backendai-gpu" class="form-label">GPUs</label>
      <input class="form-control" id="backendai-gpu" name="gpu" type="number" min="0" step="1" value="{gpu}">
    </div>
  </div>
  <div class="row">
    <div class="form-group mb-3 col-sm-4">
      <label for="backendai-cluster-size" class="form-label">Kernels (containers)</label>
      <input class="form-control" id="backendai-cluster-size" name="cluster_size" type="number" min="1" step="1" value="1">
    </div>
    <div class="form-group mb-3 col-sm-8">
      <label for="backendai-cluster-mode" class="form-label">Placement of the kernels</label>
      <select class="form-select form-control" id="backendai-cluster-mode" name="cluster_mode">
        <option value="single-node">all on one node</option>
        <option value="multi-node">one per node</option>
      </select>
    </div>
  </div>
  {project_field}
  {mounts_field}
  <p class="text-muted small">Free on the largest agent now: {free}</p>
</div>
"""

_MOUNTS_FIELD = """
  <fieldset class="form-group mb-3" id="backendai-mounts">
    <legend class="form-label fs-6">Virtual folders (mounted at /home/work/&lt;name&gt;)</legend>
    {boxes}
  </fieldset>
  <script>
  (function () {{
    // A project's folders can only be mounted in that project's sessions.
    var select = document.getElementById("backendai-project");
    if (!select) return;
    function sync() {{
      document.querySelectorAll("#backendai-mounts [data-project]").forEach(function (row) {{
        var other = row.dataset.project !== select.value;
        row.hidden = other;
        row.querySelector("input").disabled = other;
      }});
    }}
    select.addEventListener("change", sync);
    sync();
  }})();
  </script>
"""

_MOUNT_BOX = """
    <div class="form-check"{project_attr}>
      <input class="form-check-input" type="checkbox" name="mounts" value="{id}" id="backendai-mount-{id}">
      <label class="form-check-label" for="backendai-mount-{id}">{name} <span class="text-muted small">({owner}, {permission})</span></label>
    </div>"""

_PROJECT_FIELD = """
  <div class="form-group mb-3">
    <label for="backendai-project" class="form-label">Project</label>
    <select class="form-select form-control" id="backendai-project" name="project">{options}</select>
  </div>
"""


_PERMISSION_WORDS = {"ro": "read only", "rw": "read-write", "wd": "read-write-delete"}


class BackendAISpawner(Spawner):
    """Start each server as a compute session on the Backend.AI-style cluster."""

    images = List(
        Unicode(),
        help="""Images offered in the form, first is the default. Empty: every kernel
        image (label ``ai.backend.kernelspec``) that the agents have.""",
    ).tag(config=True)
    default_cpu = Unicode("1", help="CPU cores preselected in the form and used when unset.").tag(
        config=True
    )
    default_mem = Unicode("1g", help="Memory preselected in the form and used when unset.").tag(
        config=True
    )
    default_gpu = Integer(0, help="GPUs preselected in the form and used when unset.").tag(
        config=True
    )
    resource_group = Unicode(
        "default", help="Resource group (agent pool) that sessions are scheduled in."
    ).tag(config=True)
    ready_timeout = Integer(
        120, help="Seconds to wait for the started Jupyter server to answer HTTP."
    ).tag(config=True)

    session_id = None
    # The last activity time passed to the manager (see poll).
    _reported_activity = None
    _image = None
    _slots = None
    _project = None
    _mounts: list[str] = []
    _cluster = (1, "single-node")

    @property
    def manager(self) -> BackendAIManager:
        return BackendAIManager.instance(config=self.config)

    @property
    def session_name(self) -> str:
        # "_" cannot appear in JupyterHub server names, so the default server never clashes.
        return self.name or "_default"

    # -- the form ---------------------------------------------------------------

    @default("options_form")
    def _options_form_default(self):
        return self._render_form

    async def _image_choices(self) -> list[str]:
        if self.images:
            return list(self.images)
        return await self.manager.list_images(self.resource_group)

    async def _render_form(self, spawner) -> str:
        await self.manager.ready()
        images = await self._image_choices()
        opts = "".join(
            f'<option value="{html.escape(i)}">{html.escape(i)}</option>' for i in images
        )
        free = await self.manager.db(_largest_free, self.resource_group)
        projects = await self.manager.user_projects(self.user.name)
        project_field = ""
        if len(projects) > 1:  # one project needs no choice
            project_field = _PROJECT_FIELD.format(
                options="".join(
                    f'<option value="{html.escape(name)}">{html.escape(name)}</option>'
                    for name in projects
                )
            )
        folders = await self.manager.mountable_folders(self.user.name)
        mounts_field = ""
        if folders:
            mounts_field = _MOUNTS_FIELD.format(boxes="".join(
                _MOUNT_BOX.format(
                    id=html.escape(f["id"]),
                    name=html.escape(f["name"]),
                    owner=html.escape(f["owner"]),
                    permission=_PERMISSION_WORDS.get(f["permission"], html.escape(f["permission"])),
                    project_attr=(f' data-project="{html.escape(f["project"])}"'
                                  if f["project"] is not None and len(projects) > 1 else ""),
                )
                for f in folders
            ))
        return _FORM.format(
            image_options=opts,
            project_field=project_field,
            mounts_field=mounts_field,
            cpu=html.escape(self.default_cpu),
            mem=html.escape(self.default_mem),
            gpu=self.default_gpu,
            free=html.escape(free),
        )

    @default("options_from_form")
    def _options_from_form_default(self):
        return self._parse_form

    def _parse_form(self, formdata: dict) -> dict:
        opts = {}
        mounts = formdata.get("mounts")
        if mounts is not None:
            if not isinstance(mounts, list) or not all(isinstance(v, str) for v in mounts):
                raise web.HTTPError(400, "form field 'mounts' must be a list of vfolders")
            opts["mounts"] = [v.strip() for v in mounts if v.strip()]
        for key in ("image", "cpu", "mem", "gpu", "project", "cluster_size", "cluster_mode"):
            values = formdata.get(key)
            if values is None:
                continue
            if not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], str):
                raise web.HTTPError(400, f"form field {key!r} must have exactly one value")
            opts[key] = values[0].strip()
        return opts

    @default("apply_user_options")
    def _apply_user_options_default(self):
        return self._apply_options

    async def _apply_options(self, spawner, user_options: dict) -> None:
        """Validate the request before anything is created: a bad one gets a 400."""
        opts = {"cpu": self.default_cpu, "mem": self.default_mem, "gpu": self.default_gpu}
        if not isinstance(user_options, dict):
            raise web.HTTPError(400, "user_options must be an object")
        opts.update({k: v for k, v in user_options.items() if v not in (None, "")})
        if "image" not in opts:
            choices = await self._image_choices()
            if choices:
                opts["image"] = choices[0]
        await self.manager.ready()
        project = opts.pop("project", None)
        mounts = opts.pop("mounts", [])
        cluster_size = opts.pop("cluster_size", 1)
        cluster_mode = opts.pop("cluster_mode", "single-node")
        try:
            cluster_size = _whole_number("cluster_size", cluster_size)
            if cluster_size < 1:
                raise InvalidRequest(f"cluster_size must be at least 1, not {cluster_size}")
            if project is not None:
                projects = await self.manager.user_projects(self.user.name)
                if project not in projects:
                    raise InvalidRequest(
                        f"project {project!r} is not one of yours ({', '.join(projects) or 'none'})"
                    )
            image, slots = self.manager.parse_request(opts)
            if self.images and image not in self.images:
                raise InvalidRequest(f"image {image!r} is not offered here")
            if cluster_mode not in ("single-node", "multi-node"):
                raise InvalidRequest(
                    f"cluster_mode must be single-node or multi-node, not {cluster_mode!r}"
                )
            await self.manager.validate(
                image, slots, self.resource_group, cluster_size=cluster_size, cluster_mode=cluster_mode
            )
            # Names or ids of vfolders; enqueue checks them again when it creates the session.
            await self.manager.check_mounts(self.user.name, project, mounts)
        except BackendAIError as e:
            raise web.HTTPError(e.status_code, e.detail) from None
        self._image, self._slots, self._project = image, slots, project
        self._mounts = list(mounts)
        self._cluster = (cluster_size, cluster_mode)
        self.mem_limit = int(slots[MEM])
        self.cpu_limit = float(slots[CPU])

    # -- lifecycle ------------------------------------------------------------------

    def get_env(self):
        env = super().get_env()
        # The agent sets the address the server binds inside its kernel.
        env.pop("JUPYTERHUB_SERVICE_URL", None)
        env["BACKENDAI_SESSION_NAME"] = self.session_name
        return env

    async def start(self):
        await self.manager.ready()
        if self._slots is None:  # started without apply_user_options (older hubs)
            await self._apply_options(self, self.user_options or {})
        try:
            self.session_id = await self.manager.enqueue(
                username=self.user.name,
                name=self.session_name,
                image=self._image,
                slots=self._slots,
                environ=self.get_env(),
                service_prefix=self.server.base_url,
                resource_group=self.resource_group,
                project=self._project,
                cluster_size=self._cluster[0],
                cluster_mode=self._cluster[1],
                mounts=self._mounts,
            )
        except BackendAIError as e:
            raise SpawnException(e.detail, reason="invalid_request", status_code=e.status_code) from None
        sess = None
        async for sess in self.manager.watch(self.session_id):
            if sess.status == SessionStatus.RUNNING:
                break
        if sess is None or sess.status != SessionStatus.RUNNING:
            info = sess.status_info if sess else "session vanished"
            raise SpawnException(
                f"The session could not start: {info}", reason="session_failed", status_code=500
            )
        port = sess.kernels[0].service_ports[0]
        host = sess.kernels[0].kernel_host
        url = f"http://{host}:{port['host_port']}"
        await self._wait_http(url + self.server.base_url + "api")
        return url

    async def _wait_http(self, url: str) -> None:
        client = AsyncHTTPClient()
        deadline = time.monotonic() + self.ready_timeout
        delay = 0.02
        while True:
            try:
                await client.fetch(url, request_timeout=2, follow_redirects=False)
                return
            except HTTPClientError as e:
                # Any HTTP answer means the server is up; 599 is tornado's "no answer"
                # (docker's port proxy accepts and closes while nothing listens yet).
                if e.code != 599:
                    return
            except (OSError, TimeoutError):
                pass
            sess = await self.manager.get_session(self.session_id)
            if sess is None or sess.status in DEAD_STATUSES:
                raise SpawnException(
                    f"The session stopped while starting: {sess.status_info if sess else ''}",
                    reason="session_failed",
                    status_code=500,
                )
            if time.monotonic() > deadline:
                raise SpawnException(
                    f"The server in the session did not answer within {self.ready_timeout} s",
                    reason="timeout",
                    status_code=500,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    async def progress(self):
        """Stream the session's states; a page that connects late first sees the states
        already passed, then the live ones, each with the scheduler's reason (e.g. a
        quota exceeded) while PENDING."""
        while self.session_id is None:
            await asyncio.sleep(0.05)
        first = True
        async for sess in self.manager.watch(self.session_id):
            status = SessionStatus(sess.status)
            if first:
                first = False
                for past in _passed_states(status, sess.status_history or {}):
                    yield {"progress": PROGRESS[past], "message": past.value.lower()}
            if status in DEAD_STATUSES:
                yield {"progress": 100, "message": f"{status.value}: {sess.status_info}"}
                return
            msg = f"{status.value.lower()}: {sess.status_info}" if sess.status_info else status.value.lower()
            yield {"progress": PROGRESS.get(status, 0), "message": msg}
            if status == SessionStatus.RUNNING:
                return

    async def poll(self):
        if not self.session_id:
            return 0
        await self.manager.ready()
        sess = await self.manager.get_session(self.session_id)
        if sess is None:
            return 0
        if sess.status in DEAD_STATUSES:
            code = sess.kernels[0].exit_code if sess.kernels else None
            return code if code not in (None, 0) else 1
        await self._report_activity()
        return None

    async def _report_activity(self) -> None:
        """Tell the manager the newest activity the hub knows of this server (its
        activity reports and proxy traffic), for the keypair policy's idle_timeout.
        Only when it moved since the last report: most polls write nothing."""
        orm = self.orm_spawner
        last = getattr(orm, "last_activity", None) if orm is not None else None
        if last is None or (self._reported_activity is not None and last <= self._reported_activity):
            return
        try:
            await self.manager.record_activity(self.session_id, last)
        except Exception:
            # A missed report only delays the idle check; the next poll tries again.
            self.log.warning("could not record activity of session %s", self.session_id, exc_info=True)
            return
        self._reported_activity = last

    async def stop(self, now=False):
        if not self.session_id:
            return
        await self.manager.ready()
        await self.manager.destroy_session(self.session_id)

    def get_state(self):
        state = super().get_state()
        if self.session_id:
            state["session_id"] = self.session_id
        return state

    def load_state(self, state):
        super().load_state(state)
        self.session_id = state.get("session_id")

    def clear_state(self):
        super().clear_state()
        self.session_id = None
        self._reported_activity = None


def _whole_number(name: str, value) -> int:
    """A whole number from the form (text) or the API (number); InvalidRequest otherwise."""
    if isinstance(value, bool):
        raise InvalidRequest(f"{name} must be a whole number, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise InvalidRequest(f"{name} must be a whole number, not {value!r}")


def _passed_states(current: SessionStatus, history: dict) -> list[SessionStatus]:
    """States the session went through before ``current``, in the order of the way."""
    if current not in PROGRESS:
        return []
    return [
        st for st, pct in sorted(PROGRESS.items(), key=lambda x: x[1])
        if pct < PROGRESS[current] and st.value in history
    ]


def _largest_free(s, resource_group: str) -> str:
    from sqlalchemy import select

    from .models import Agent

    best = None
    for a in s.scalars(select(Agent).where(Agent.resource_group == resource_group, Agent.status == "ALIVE")):
        free = a.available_slots - a.occupied_slots
        if best is None or (free.get(CPU, 0), free.get(MEM, 0)) > (best.get(CPU, 0), best.get(MEM, 0)):
            best = free
    if best is None:
        return "no agent"
    parts = [f"{best.get(CPU, 0)} CPU", f"{format_size(best.get(MEM, 0))} memory"]
    if best.get(CUDA):
        parts.append(f"{best[CUDA]} GPU")
    return ", ".join(parts)
