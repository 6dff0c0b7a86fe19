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
import copy
import os
import time
from urllib.parse import urlsplit

import aiohttp
from jupyterhub.spawner import Spawner, SpawnException
from traitlets import Bool, Integer, List, TraitError, Unicode, default, validate

from . import pages
from .common.errors import BackendAIError
from .common.session_request import SessionRequest, SessionRequestError, check_environ
from .common.slots import CPU, CUDA, MEM
from .common.types import DEAD_STATUSES, PROGRESS, SessionStatus
from .manager import images as _images
from .manager.core import BackendAIManager
from .pages import presets as _presets

# Jupyter configuration that turns JupyterLab's news plugin off (see jupyterlab_news).
JUPYTER_CONFIG_NO_NEWS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "share",
                                      "jupyter-config")

#: Seconds the first look at a starting server waits per other start in flight on its
#: agent, and at most (_wait_http).
READY_HOLD = 0.04
READY_HOLD_MAX = 0.25
_PERMISSION_WORDS = {"ro": "read only", "rw": "read-write", "wd": "read-write-delete"}
_FORM_FIELDS = ("preset", "image", "cpu", "mem", "gpu", "project", "cluster_size", "cluster_mode",
                "resource_group")

# What each user last submitted in the form, until the form is shown again: a refused
# submission re-renders the form (jupyterhub/handlers/pages.py SpawnHandler._post) with
# these values instead of the defaults. Keyed by user name, because JupyterHub renders
# the default server's form (user.spawner) even for a named server's refused POST.
_SUBMITTED: dict[str, dict] = {}


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
        "default",
        help="""Resource group (agent pool) preselected in the form and used when a request
        names none. The form (and ``user_options["resource_group"]``) may choose any
        other active group the user may use (public, or allowed for their domain, one
        of their projects or keypairs: the API's rule); others are refused.""",
    ).tag(config=True)
    ready_timeout = Integer(
        120, help="Seconds to wait for the started Jupyter server to answer HTTP."
    ).tag(config=True)
    home_folder = Unicode(
        ".home",
        help="""Name of each user's home folder: a vfolder of the user on the default
        vfolder host (c.BackendAIManager.default_vfolder_host), made at their first
        server start, mounted at /home/work itself so that notebooks, files and
        `pip install --user` packages survive stop and start. It counts like any
        other folder of the user (quota scope, max_vfolder_count of their resource
        policy, the host's create-vfolder and mount-in-session permissions); a user
        who may not have one gets a plain-words error at spawn. All servers of a
        user share it (the same directory: concurrent writes to one file, last
        writer wins). The default begins with '.', Backend.AI's mark of a folder
        mounted into every session: API (batch) sessions see it at
        /home/work/.home. Empty: no home folder; /home/work is then the image's and
        is lost at stop (the user's other '.'-folders are still mounted).""",
    ).tag(config=True)
    presets = List(
        help="""Named bundles of image, resources and folders offered in the spawn form,
        shaped like KubeSpawner's ``profile_list``: a list of dicts with
        ``display_name``, ``slug`` (the name a request uses: ``{"preset": "<slug>"}``),
        optional ``description``, ``default`` (preselected; a request that names no
        preset and sets no image or resources gets it), ``resource_groups`` and
        ``projects`` (offered only in these resource groups / for sessions of these
        projects; missing or empty: everywhere) and ``user_options`` (what the preset
        fixes: image, cpu, mem, gpu, cluster_size, cluster_mode, project, and mounts:
        folder names mounted besides those the user ticks). Checked again on the
        server: a slug that does not exist or is not offered to the user's project or
        resource group is refused with a 400. On the command line: JSON,
        ``--BackendAISpawner.presets='[{"slug": ...}]'``. See docs/pages.md.""",
    ).tag(config=True)
    jupyterlab_news = Bool(
        False,
        help="""Whether JupyterLab in a session asks to fetch Jupyter's news from the
        internet and checks for JupyterLab updates (its "Would you like to get notified
        about official Jupyter news?" popup). False: the plugin is off in every session.
        Passed in the session's environment: ``BACKENDAI_JUPYTERLAB_NEWS`` (0 or 1), read
        by the kernel image's server configuration; for local-process kernels, which run
        the hub's own Jupyter server, ``JUPYTER_CONFIG_PATH`` names the package's
        ``share/jupyter-config`` (its ``labconfig/page_config.json`` turns the plugin
        off); a path that does not exist in a container is ignored there.""",
    ).tag(config=True)
    presets_allow_custom = Bool(
        True,
        help="""Whether the form offers "Custom" (CPU, memory and GPUs typed by the user,
        within the quota and the resource group's agents) besides the presets. False:
        only presets (requests that set image or resources themselves are refused).""",
    ).tag(config=True)

    @validate("presets")
    def _check_presets(self, proposal):
        try:
            return _presets.check_presets(proposal["value"])
        except ValueError as e:
            raise TraitError(f"BackendAISpawner.presets: {e}") from None

    session_id = None
    # The last activity time passed to the manager (see poll).
    _reported_activity = None
    # Whether JupyterHub has taken this server over (its first poll() after start()).
    _handed_over = False
    _request = None  # the CheckedRequest of what apply_user_options built (enqueue's input)
    _form_checked = None  # (options, _check_options of them, when) of the last form
    _environ: dict = {}  # user_options' "environ" (Backend.AI's config.environ), checked

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

    async def _image_choices(self, resource_group: str | None = None) -> list[str]:
        """The images offered: ``images`` if configured; else the catalogue's visible
        images (issue 25; the default first; GPU images only where the group has GPUs),
        and, unless ``image_catalogue`` restricts starts to the catalogue, the labelled
        images the group's agents hold that are not hidden."""
        if self.images:
            return list(self.images)
        group = resource_group or self.resource_group
        await self.manager.registries.catalogue_local_first()
        entries = await self.manager.ops.list_catalogue(None, username=self.user.name)
        if not (await self.manager.ops.group_facts(group))["gpu"]:
            # GPU images only where the group has GPUs to give them.
            entries = [i for i in entries if not _images.needs_gpu(i["labels"])]
        catalogue = [i["name"] for i in entries]
        if self.manager.image_catalogue:
            return catalogue
        # What the agents hold, less what the catalogue hides or keeps for another user.
        index = await self.manager.ops.catalogue_index()
        hidden = {n for n, i in index.items()
                  if (i["hidden"] or i["owner_id"] is not None) and n not in catalogue}
        held = await self.manager.list_images(group)
        default = await self.manager.ops.default_image()
        return sorted((n for n in dict.fromkeys(catalogue + held) if n not in hidden),
                      key=lambda n: n != default)

    async def _image_labels(self) -> dict[str, str]:
        """What the form shows of each catalogued image: its aliases, description, name."""
        out = {}
        for i in await self.manager.ops.list_catalogue(None, username=self.user.name):
            words = ", ".join(i["aliases"])
            if i["description"]:
                words = f"{words} — {i['description']}" if words else i["description"]
            out[i["name"]] = f"{words} ({i['name']})" if words else i["name"]
        return out

    async def _groups(self) -> list[str]:
        """The active resource groups this user may use, the configured one first."""
        try:
            groups = await self.manager.ops.usable_groups(self.user.name)
        except BackendAIError:
            groups = []
        return sorted(groups or [self.resource_group], key=lambda g: (g != self.resource_group, g))

    def _named_group(self, user_options: dict) -> str:
        """The resource group a request names, else the configured one."""
        group = user_options.get("resource_group")
        if group in (None, ""):
            group = self.resource_group
        elif not isinstance(group, str):
            raise _user_error("resource_group must be the name of a resource group")
        return group.strip()

    async def _all_presets(self) -> list[dict]:
        """The configured presets (``presets``), then the record's resource presets (the
        console's and the API's, manager/spawnviews.py ``form_presets``); a configured
        slug hides a record's preset of the same name."""
        return self._with_configured(await self.manager.ops.form_presets())

    def _with_configured(self, record_presets: list[dict]) -> list[dict]:
        mine = list(self.presets)
        taken = {p["slug"] for p in mine}
        return mine + [p for p in record_presets if p["slug"] not in taken]

    async def _render_form(self, spawner) -> str:
        # A refused submission's values (shown once), else the defaults.
        chosen = _SUBMITTED.pop(self.user.name, None) or {}
        await self.manager.ready()
        groups = await self._groups()
        chosen_group = chosen.get("resource_group")
        if chosen_group not in groups:
            chosen_group = groups[0]
        # Images of every group offered (the chosen one's first); the server checks the
        # image against the chosen group's agents.
        images = []
        for g in [chosen_group] + [g for g in groups if g != chosen_group]:
            images += [i for i in await self._image_choices(g) if i not in images]
            if self.images:
                break
        facts = {g: await self.manager.ops.group_facts(g) for g in groups}
        group = {**facts[chosen_group], "gpu": any(f["gpu"] for f in facts.values())}
        projects = await self.manager.user_projects(self.user.name)
        folders = await self.manager.mountable_folders(self.user.name)
        quota = await self.manager.ops.quota_left(self.user.name)
        all_presets = await self._all_presets()
        offered = _presets.offered(all_presets, chosen_group, projects)
        # Presets of the other groups too, shown while their group is chosen (the script).
        every = [p for p in all_presets
                 if any(p in _presets.offered(all_presets, g, projects) for g in groups)]
        defaults = {"cpu": self.default_cpu, "mem": self.default_mem, "gpu": self.default_gpu,
                    "image": images[0] if images else ""}
        # The user's '.'-folders and the home folder go into every session: not a choice.
        always = [f for f in folders if f["project"] is None and f["owner"] == self.user.name
                  and f["name"].startswith(".")]
        home = self.home_folder or None
        return await pages.render(
            "backendai/spawn_form.html",
            images=images,
            image_labels=await self._image_labels(),
            chosen_image=chosen.get("image") or (await self.manager.ops.default_image()),
            cpu=chosen.get("cpu", self.default_cpu),
            mem=chosen.get("mem", self.default_mem),
            gpu=chosen.get("gpu", self.default_gpu),
            cluster_size=chosen.get("cluster_size", "1"),
            cluster_mode=chosen.get("cluster_mode", "single-node"),
            project=chosen.get("project"),
            mounts=set(chosen.get("mounts", ())),
            gpu_offered=group["gpu"],
            local_backend=group["local"],
            free=group["free"],
            projects=projects,
            folders=[f for f in folders if f not in always],
            always_mounted=always,
            home_folder=home,
            home_made=any(f["name"] == home for f in always),
            permission_words=_PERMISSION_WORDS,
            presets=[{**p, "summary": _presets.summary(p, defaults),
                      "groups": [g for g in groups if p in _presets.offered(
                          all_presets, g, projects)]} for p in every],
            groups=groups,
            chosen_group=chosen_group,
            group_facts=facts,
            allow_custom=self.presets_allow_custom or not every,
            chosen_preset=chosen.get("preset") or _presets.default_slug(
                offered, self.presets_allow_custom),
            quota={name: {"text": _presets.quota_words(q, group["gpu"]),
                          "cpu_max": q["limit"][CPU], "gpu_max": q["limit"][CUDA]}
                   for name, q in quota.items()},
        )

    @default("options_from_form")
    def _options_from_form_default(self):
        return self._parse_form

    async def _parse_form(self, formdata: dict) -> dict:
        """The form's options, checked here already: JupyterHub gives a start one second
        before it answers the form with the progress page (SpawnHandler
        ``_wrap_spawn_single_user``), so a refusal found later by ``apply_user_options``
        (a loaded hub, a slow database) showed there and not on the form with a 400."""
        opts = self._form_options(formdata)
        self._form_checked = (copy.deepcopy(opts), await self._check_options(opts),
                              time.monotonic())
        return opts

    def _form_options(self, formdata: dict) -> dict:
        # Kept for the form shown again if this submission is refused (see _SUBMITTED).
        _SUBMITTED[self.user.name] = {
            **{k: v[0] for k in _FORM_FIELDS
               if isinstance(v := formdata.get(k), list) and v and isinstance(v[0], str)},
            "mounts": [m for m in formdata.get("mounts") or () if isinstance(m, str)],
        }
        opts = {}
        mounts = formdata.get("mounts")
        if mounts is not None:
            if not isinstance(mounts, list) or not all(isinstance(v, str) for v in mounts):
                raise _user_error("form field 'mounts' must be a list of vfolders")
            opts["mounts"] = [v.strip() for v in mounts if v.strip()]
        for key in _FORM_FIELDS:
            values = formdata.get(key)
            if values is None:
                continue
            if not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], str):
                raise _user_error(f"form field {key!r} must have exactly one value")
            opts[key] = values[0].strip()
        # A browser without scripts submits the custom fields too: a preset fixes them.
        if opts.get("preset", _presets.CUSTOM) != _presets.CUSTOM:
            for key in _presets.FIXED_KEYS:
                opts.pop(key, None)
        return opts

    @default("apply_user_options")
    def _apply_user_options_default(self):
        return self._apply_options

    async def _apply_options(self, spawner, user_options: dict) -> None:
        """Validate the request before anything is created: a bad one gets a 400. What
        the form sent was checked by ``_parse_form`` already and is not checked again."""
        form, self._form_checked = self._form_checked, None
        # (only right after it: a check kept from a start JupyterHub refused, e.g. at its
        # concurrent spawn limit, would skip the quota for a later request of the API)
        if form is not None and form[0] == user_options and time.monotonic() - form[2] < 30:
            checked, environ, request = form[1]
        else:
            checked, environ, request = await self._check_options(user_options)
        self._request = checked  # start() enqueues it as checked: not looked up again
        self._environ = environ
        _SUBMITTED.pop(self.user.name, None)  # accepted: the next form starts from the defaults
        self.mem_limit = int(request.slots[MEM])
        self.cpu_limit = float(request.slots[CPU])

    async def _check_options(self, user_options: dict) -> tuple:
        """(the checked request, its environment, the request) of ``user_options``, or
        the 400 that says what is wrong with them."""
        opts = {"cpu": self.default_cpu, "mem": self.default_mem, "gpu": self.default_gpu}
        if not isinstance(user_options, dict):
            raise _user_error("user_options must be an object")
        # the session's own environment variables (Backend.AI's `run -e`), beside the request
        user_options = dict(user_options)
        try:
            environ = check_environ(user_options.pop("environ", None), server=True)
        except BackendAIError as e:
            raise _user_error(e.detail, status_code=e.status_code) from None
        group = self._named_group(user_options)
        await self.manager.ready()
        # What the request is checked against, in one read: the group's refusal (400 for
        # none such or inactive, 403 for not yours), the presets, the projects, the quota.
        try:
            facts = await self.manager.ops.spawn_facts(self.user.name, group)
        except BackendAIError as e:
            raise _user_error(e.detail, status_code=e.status_code) from None
        if facts["refusal"] is not None:
            raise _user_error(facts["refusal"][1], status_code=facts["refusal"][0])
        user_options = self._preset_options(
            user_options, group, self._with_configured(facts["presets"]), facts["projects"])
        opts.update({k: v for k, v in user_options.items()
                     if v not in (None, "") and k != "resource_group"})
        if "image" not in opts:
            choices = await self._image_choices(group)
            if choices:
                opts["image"] = choices[0]
        try:
            # The one session request, checked once: its form here, what depends on the
            # record by the manager (enqueue does not check it again).
            request = SessionRequest.from_options(opts, resource_group=group)
            projects = facts["projects"]
            if request.project is not None and request.project not in projects:
                raise SessionRequestError(
                    f"project {request.project!r} is not one of yours "
                    f"({', '.join(projects) or 'none'})")
            if self.images and request.image not in self.images:
                raise SessionRequestError(f"image {request.image!r} is not offered here")
            checked = await self.manager.check_request(request)
            # Names or ids of vfolders; enqueue resolves them when it creates the session.
            if request.mounts:
                await self.manager.check_mounts(self.user.name, request.project,
                                                list(request.mounts))
            # A request beyond the quota's limits would wait forever: refused now.
            quota = facts["quota"]
            q = quota.get(request.project) or next(iter(quota.values()), None)
            over = q and _presets.quota_excess(q, request.slots, request.cluster_size)
            if over:
                raise SessionRequestError(over)
        except BackendAIError as e:
            raise _user_error(e.detail, status_code=e.status_code) from None
        return checked, environ, request

    def _preset_options(self, user_options: dict, group: str, all_presets: list[dict],
                        projects: list[str]) -> dict:
        """The request with its preset (``{"preset": slug}``) applied: the preset's
        image, resources and folders; the default preset for a request that names none
        and sets no image or resources; ``custom`` or no presets: as given."""
        if not isinstance(user_options, dict):
            raise _user_error("user_options must be an object")
        opts = dict(user_options)
        slug = opts.pop("preset", None)
        if not all_presets:
            if slug not in (None, "", _presets.CUSTOM):
                raise _user_error(f"there is no preset {slug!r} (no presets are configured here)")
            return opts
        offered = _presets.offered(all_presets, group, projects)
        if slug in (None, ""):
            if any(opts.get(k) not in (None, "") for k in _presets.FIXED_KEYS):
                slug = _presets.CUSTOM
            else:
                slug = _presets.default_slug(offered, self.presets_allow_custom)
        if slug == _presets.CUSTOM:
            if not self.presets_allow_custom and offered:
                raise _user_error("custom resources are not offered here; choose a preset: "
                                  + ", ".join(p["slug"] for p in offered))
            return opts
        try:
            fixed, _ = _presets.resolve(all_presets, slug, group, projects, opts)
        except BackendAIError as e:
            raise _user_error(e.detail, status_code=e.status_code) from None
        return fixed

    # -- lifecycle ------------------------------------------------------------------

    def get_env(self):
        # the user's variables first: the hub's own (checked apart by name) win
        env = {**self._environ, **super().get_env()}
        # The agent sets the address the server binds inside its kernel.
        env.pop("JUPYTERHUB_SERVICE_URL", None)
        env["BACKENDAI_SESSION_NAME"] = self.session_name
        env["BACKENDAI_JUPYTERLAB_NEWS"] = "1" if self.jupyterlab_news else "0"
        if not self.jupyterlab_news:
            env["JUPYTER_CONFIG_PATH"] = JUPYTER_CONFIG_NO_NEWS
        return env

    def _start_budget(self) -> float:
        """Seconds start() may take: a little less than ``start_timeout``, so that a
        session still waiting (e.g. PENDING on a quota) fails with its reason before
        JupyterHub cancels start() and reports a bare timeout."""
        timeout = float(self.start_timeout)
        return timeout - min(10.0, max(1.0, timeout * 0.1))

    async def start(self):
        deadline = time.monotonic() + self._start_budget()
        await self.manager.ready()
        if self._request is None:  # started without apply_user_options (older hubs)
            await self._apply_options(self, self.user_options or {})
        # JupyterHub starts this server, so it knows no session of it: one left by a
        # start that a stopped hub never finished is ended first (else 409).
        await self.manager.end_abandoned(self.user.name, self.session_name)
        lease = self.manager.spawner_wait_lease
        try:
            self.session_id = await self.manager.enqueue(
                self._request,
                username=self.user.name,
                name=self.session_name,
                environ=self.get_env(),
                service_prefix=self.server.base_url,
                home_folder=self.home_folder or None,
                awaited_for=lease,
            )
        except BackendAIError as e:
            raise _user_error(e.detail, status_code=e.status_code) from None
        self._handed_over = False
        renewer = asyncio.ensure_future(self._renew_wait(self.session_id, lease))
        try:
            with self.manager.waiting_here(self.session_id):
                url = await self._until_ready(deadline)
        finally:
            renewer.cancel()
        # Until JupyterHub's first poll() the session counts as awaited (a hub killed
        # before it saved the server forgets it): long enough for that poll.
        await self.manager.await_session(self.session_id, lease + 2 * self.poll_interval + 30)
        return url

    async def _renew_wait(self, sid: str, lease: float) -> None:
        """Tell the manager, while start() runs, that JupyterHub still waits on ``sid``."""
        while True:
            await asyncio.sleep(max(lease / 3, 0.5))
            try:
                await self.manager.await_session(sid, lease)
            except Exception:
                self.log.warning("could not renew the wait on session %s", sid, exc_info=True)

    async def _until_ready(self, deadline: float) -> str:
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                sess = await self.manager.wait_for(self.session_id, {SessionStatus.RUNNING})
        except TimeoutError:
            sess = await self.manager.get_session(self.session_id)
            state = _state_words(sess) if sess is not None else "gone"
            raise _user_error(
                f"The server did not start within {self.start_timeout} s; its session is still "
                f"{state}",
                reason="timeout",
                status_code=500,
            ) from None
        if sess is None or sess.status != SessionStatus.RUNNING:
            info = sess.status_info if sess else "session vanished"
            raise _user_error(
                f"The session could not start: {info}", reason="session_failed", status_code=500
            )
        port = sess.kernels[0].service_ports[0]
        host = sess.kernels[0].kernel_host
        url = f"http://{host}:{port['host_port']}"
        agent_id = sess.kernels[0].agent_id
        with self.manager.answering(self.session_id, agent_id):
            await self._wait_http(url + self.server.base_url + "api", deadline, agent_id)
        return url

    async def _wait_http(self, url: str, start_deadline: float, agent_id: str = "") -> None:
        """Until the session's Jupyter server answers: 200 from its own ``{base_url}api``.

        Any other answer is another server on the port its kernel was given (a 404 once
        counted as "up", and JupyterHub sent the user to another installation's server):
        waited past, and named if it lasts. Agents of one host never hand out one port
        twice (agent/portclaims.py); a server that is no agent's, under the very same
        prefix, would still pass. The session's end
        wakes this at once (a manager event); the record is re-read only then, or every
        ``status_poll_interval``; a change that says its new status is read only when that
        is an end."""
        started = time.monotonic()
        ready_deadline = started + self.ready_timeout
        delay = 0.02
        # A server that starts beside others shares the CPU with them and answers no
        # sooner than they let it, while each look at it costs the hub and the engine's
        # port proxy CPU the servers need: the first look waits READY_HOLD per other start
        # of this process on the server's agent (none for a start alone; at most
        # READY_HOLD_MAX). In a rush of five pooled starts on two cores the looks before
        # any server could answer were a fifth of the hub's CPU.
        hold = min(READY_HOLD * self.manager.starts_beside(self.session_id, agent_id),
                   READY_HOLD_MAX)
        if hold > 0:
            await self.manager.wait_change(self.session_id, hold)  # (an end wakes it)
        checked = time.monotonic()
        read = True
        foreign: int | None = None  # the status another server answered with
        # aiohttp, the hub's one HTTP client stack of ours (aiodocker brings it anyway;
        # the agents' and storage proxies' clients use it too: common/httpbase.py).
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while True:
                try:
                    async with http.get(url, allow_redirects=False) as resp:
                        if resp.status == 200:
                            return
                        foreign = resp.status
                except (aiohttp.ClientError, OSError, TimeoutError):
                    # no answer yet (docker's port proxy accepts and closes while
                    # nothing listens)
                    pass
                if read or time.monotonic() - checked >= self.manager.status_poll_interval:
                    checked = time.monotonic()
                    sess = await self.manager.get_session(self.session_id)
                else:
                    sess = True
                if sess is None or (sess is not True and sess.status in DEAD_STATUSES):
                    raise _user_error(
                        f"The session stopped while starting: {sess.status_info if sess else 'gone'}",
                        reason="session_failed",
                        status_code=500,
                    )
                now = time.monotonic()
                if now > ready_deadline or now > start_deadline:
                    waited = self.ready_timeout if now > ready_deadline else self.start_timeout
                    if foreign is not None:
                        where = urlsplit(url)
                        message = (f"The session runs, but its port {where.port} answers as another "
                                   f"server (HTTP {foreign} at {where.path}), not its Jupyter "
                                   f"server, after {waited} s: another program on the agent's host "
                                   "holds it")
                    else:
                        message = ("The session runs, but the Jupyter server in it did not answer "
                                   f"within {waited} s")
                    raise _user_error(message, reason="timeout", status_code=500)
                changes = await self.manager.wait_change(self.session_id, delay)
                read = any(c is None or c in DEAD_STATUSES for c in changes)
                # Often while a server usually comes up (a pooled one in tenths of a
                # second, more in a rush): at 0.25 s steps from the start, one ready
                # after 0.45 s was seen only at 0.64 s. Then less often.
                delay = min(delay * 1.5, 0.05 if time.monotonic() - started < 3 else 0.25)

    async def app_address(self) -> str | None:
        """Where this server's kernel can be reached from the hub's host straight, its
        container's address on its session network, for the app front's fast path
        (:mod:`jupyterhub_backendai.appfront`). None where there is none: a kernel on
        another node, the host network, or the local backend."""
        if not self.session_id:
            return None
        return await self.manager.agents.app_address(self.session_id)

    async def progress(self):
        """Stream the session's states, each with the scheduler's reason while PENDING
        (e.g. a quota exceeded). A page that connects late first gets the states
        already passed (from the session's status_history), then the live ones."""
        while self.session_id is None:
            await asyncio.sleep(0.05)
        first = True
        shown: set[SessionStatus] = set()
        async for sess in self.manager.watch(self.session_id):
            status = SessionStatus(sess.status)
            if first:
                first = False
                if await self.manager.ops.session_is_local(self.session_id):
                    yield {"message": _UNISOLATED}
            # States passed before this page connected, or between two polls.
            for past in _passed_states(status, sess.status_history or {}):
                if past not in shown:
                    shown.add(past)
                    yield {"progress": PROGRESS[past], "message": past.value.lower()}
            shown.add(status)
            if status in DEAD_STATUSES:
                yield {"progress": 100, "message": _state_words(sess)}
                return
            yield {"progress": PROGRESS.get(status, 0), "message": _state_words(sess)}
            if status == SessionStatus.RUNNING:
                return

    async def poll(self):
        if not self.session_id:
            return 0
        await self.manager.ready()
        # One read answers every server's poll (manager/reflector.py).
        sess = await self.manager.reflector.state(self.session_id)
        if sess is None:
            return 0
        if sess.dead:
            self.manager.reflector.forget(self.session_id)
            code = sess.exit_code
            return code if code not in (None, 0) else 1
        if not self._handed_over and sess.awaited:
            # JupyterHub polls what it knows: the server is its own now.
            await self.manager.await_session(self.session_id, None)
        self._handed_over = True
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
        self.manager.reflector.forget(self.session_id)

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


_UNISOLATED = (
    "unisolated: for demos only (the local backend runs this server as a plain process on the "
    "hub's machine, without a container)"
)


def _user_error(message: str, *, reason: str = "invalid_request", status_code: int = 400) -> SpawnException:
    """A SpawnException whose text is exactly ``message`` wherever JupyterHub shows it:
    the form, the API's JSON, the progress stream's "Spawn failed: ..." and the
    spawn-pending page (they read ``jupyterhub_message``, else ``str(exc)``, which
    would be "400 SpawnException(reason=...): ...")."""
    e = SpawnException(message, reason=reason, status_code=status_code)
    e.jupyterhub_message = message
    return e


def _state_words(sess) -> str:
    """``pending: quota exceeded: ...``, or just ``running`` when the reason only repeats
    the state."""
    word = str(sess.status).lower()
    info = (sess.status_info or "").strip()
    if not info or info.lower() == word:
        return word
    return f"{word}: {info}"


def _passed_states(current: SessionStatus, history: dict) -> list[SessionStatus]:
    """States the session went through before ``current``, in the order of the way."""
    if current not in PROGRESS:
        return []
    return [
        st for st, pct in sorted(PROGRESS.items(), key=lambda x: x[1])
        if pct < PROGRESS[current] and st.value in history
    ]
