"""The user's pages (sessions, folders, keys) and the admin console under ``/hub/backendai/``.

Every page reads through the manager's named operations (:mod:`..manager.pageviews`),
made of the same functions and access rules as the admin REST API
(:mod:`..manager.admin`, :mod:`..manager.vfolders`, :mod:`..manager.access`), with the
caller's :class:`~..manager.access.Principal` loaded as the API loads it: a page never
shows a row the API would hide from the same person. Pages change nothing themselves:
their buttons call the REST API from the browser with the login cookie (the API takes
cookie-authenticated changes only from pages under ``<base_url>hub/``, which these are),
so a change made from a page passes exactly the API's checks.
"""

from __future__ import annotations

import datetime as dt
import time

from jupyterhub.handlers import BaseHandler
from markupsafe import Markup, escape
from tornado import web

from ..agent.stats import live_stats
from ..api import spec
from ..common.errors import BackendAIError
from ..common.slots import format_bytes, format_slots, parse_size
from ..common.types import ALIVE_STATUSES, SessionStatus, UserRole
from ..manager import access, vffiles, vfolders
from ..manager.core import BackendAIManager
from ..manager.pageviews import SESSION_ROWS
from ..manager.usage import FIGURES, GROUP_BY, parse_period
from . import nav, usage

ADMIN_SECTIONS = (
    ("domains", "Domains"),
    ("projects", "Projects"),
    ("users", "Users"),
    ("keypairs", "Keypairs"),
    ("policies", "Resource policies"),
    ("resource-groups", "Resource groups"),
    ("presets", "Presets"),
    ("warm-pools", "Warm pools"),
    ("agents", "Agents"),
    ("environments", "Environments"),
    ("sessions", "Sessions"),
    ("queue", "Queue"),
    ("usage", "Usage"),
    ("plots", "Use over time"),
)


# -- human units ----------------------------------------------------------------------


def human_slots(slots: dict | None) -> str:
    """``{"cpu": "2", "mem": "1073741824"}`` as ``2 cores, 1 GiB memory``; nothing: '-'."""
    if not slots:
        return "-"
    try:
        return format_slots(slots)
    except (ValueError, ArithmeticError, BackendAIError):  # an image's label, as it is
        return ", ".join(f"{k} {v}" for k, v in sorted(slots.items()))


def human_duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``3 h 5 min``, ``2 d 4 h``; None: '-'."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    m = s // 60
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def mem_text(value) -> str:
    """A memory amount for an edit field: in human units when they read back exactly
    (``8 GiB``), else the bytes; nothing: ''."""
    if value in (None, ""):
        return ""
    n = int(value)
    words = format_bytes(n)
    try:
        return words if parse_size(words) == n else str(n)
    except (ValueError, BackendAIError):
        return str(n)


def _utc(value: str | dt.datetime | None) -> dt.datetime | None:
    if value in (None, ""):
        return None
    t = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def when(value: str | dt.datetime | None, empty: str = "-") -> Markup:
    """A moment as people read it: ``<time>`` with the minute in UTC as its text (the
    page's script, page.html, rewrites it in the reader's own time zone), the exact
    UTC time, microseconds and all, in ``datetime`` and in the ``title`` shown on
    hover. Nothing: ``empty``."""
    try:
        t = _utc(value)
    except (TypeError, ValueError):
        return Markup(escape(str(value)))
    if t is None:
        return Markup(escape(empty))
    return Markup('<time class="backendai-time" datetime="{0}" title="{1}">{2} UTC</time>'
                  ).format(t.isoformat().replace("+00:00", "Z"), exact_utc(t),
                           t.strftime("%Y-%m-%d %H:%M"))


def exact_utc(t: dt.datetime) -> str:
    """``2026-11-28 05:32:08.123456 UTC`` (fractions only where there are some)."""
    return t.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".") + " UTC"


def _since(iso: str | dt.datetime | None, now: dt.datetime) -> float | None:
    if iso is None:
        return None
    t = dt.datetime.fromisoformat(iso) if isinstance(iso, str) else iso
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return (now - t).total_seconds()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# -- base -----------------------------------------------------------------------------


class PageBase(BaseHandler):
    """Loads the caller's principal as the API does; refusals become JupyterHub's error
    page with the API's words (403 for what the role may not do, 404 for what it may not
    see)."""

    principal: access.Principal

    @property
    def manager(self) -> BackendAIManager:
        return BackendAIManager.of(self)

    async def read(self, operation: str, *args, **kw):
        """Run the manager's read ``operation`` (manager/ops.py); refusals as pages."""
        try:
            return await getattr(self.manager.ops, operation)(*args, **kw)
        except BackendAIError as e:
            raise web.HTTPError(e.status_code, "%s", e.detail) from None

    async def load_principal(self) -> access.Principal:
        await self.manager.ready()
        self.principal = await self.read("load_principal", username=self.current_user.name)
        nav.remember(self.principal.username, self.principal.role)
        return self.principal

    def require_admin(self) -> None:
        """The console is for superadmins and domain admins (the roles that change things
        across users); users and monitors get a 403 saying so."""
        p = self.principal
        if not (p.is_superadmin or p.is_domain_admin):
            raise web.HTTPError(
                403, "%s", f"The admin console is for superadmins and domain admins; your role "
                f"is {p.role}.")

    def server_origin(self, username: str) -> str:
        """Where ``username``'s servers answer: '' (this origin) unless the hub runs in
        subdomain mode, then the user's own host (as the API's service-ports answer)."""
        if not self.subdomain_host or not username:
            return ""
        orm_user = self.find_user(username)
        return self.users[orm_user].host if orm_user is not None else ""

    async def page(self, template: str, **ns) -> None:
        p = self.principal
        html = await self.render_template(
            template, principal=p, api=spec.PREFIX + "/", human_slots=human_slots,
            human_duration=human_duration, format_bytes=format_bytes, mem_text=mem_text,
            when=when, figure=_figure, **ns)
        self.finish(html)


# -- My sessions --------------------------------------------------------------------


def service_links(ports: list[dict], server_url: str | None) -> list[dict]:
    """A session's apps as the API's ``service-ports`` answer gives them: an HTTP port
    is a link below the session's server (the first port is the server itself, the
    others ``<server>/<name>/`` through jupyter-server-proxy); a TCP port the agent
    published (sshd, sftp) is its host and port, no link (docs/service-ports.md)."""
    out = []
    for idx, sp in enumerate(ports):
        name, proto = sp.get("name") or f"port {sp.get('container_port')}", sp.get("protocol")
        if proto == "http" and server_url:
            out.append({"name": name, "url": server_url if idx == 0 else f"{server_url}{name}/"})
        elif proto == "tcp" and sp.get("host_port"):
            out.append({"name": name, "address": f"{sp.get('host') or 'the agent'}:"
                                                 f"{sp['host_port']}"})
    return out


def server_name(r: dict) -> str | None:
    """The JupyterHub server a session is ('' the default one), from where it is served
    (``/user/<name>/`` or ``/user/<name>/<server>/``); None: not a JupyterHub server."""
    parts = (r.get("service_prefix") or "").strip("/").split("/")
    if len(parts) < 2 or parts[0] != "user" or r.get("type") == "batch":
        return None
    return parts[2] if len(parts) > 2 else ""


def ended_view(r: dict) -> dict | None:
    """A finished session in words: when it ended, how long it ran (from RUNNING; it
    may never have run), and why (the record's status_info, else its result)."""
    if r["status"] in ALIVE_STATUSES:
        return None
    end, since = _utc(r.get("terminated_at")), _utc(r.get("running_since"))
    ran = (end - since).total_seconds() if end and since else None
    codes = [k.get("exit_code") for k in r.get("kernels") or [] if k.get("exit_code") is not None]
    reason = r.get("status_info") or {"SUCCESS": "finished", "FAILURE": "failed"}.get(
        r.get("result"), r["status"].lower())
    if codes and r.get("type") == "batch":
        reason += f" (exit code {', '.join(str(c) for c in codes)})"
    return {"at": r.get("terminated_at"), "ran": human_duration(ran) if ran is not None
            else "did not run", "reason": reason}


def ends_view(r: dict, p: access.Principal) -> dict | None:
    """A running session's ends (manager/lifetimes.py) for the countdowns, and whether
    the caller may extend it (and by how much more)."""
    e = r.get("ends")
    if not e or not (e["lifetime_ends"] or e["idle_ends"]):
        return None
    return {**e, "extension_left_text": human_duration(e["extension_left"]),
            "may_extend": bool(e["lifetime_ends"]) and e["extension_left"] > 0
            and p.role != UserRole.MONITOR}


def _session_view(rows: list[dict], p: access.Principal, now: dt.datetime,
                  origin=lambda username: "") -> list[dict]:
    """Rows in human units; ``origin(username)`` is where that user's servers answer
    ('' on the hub's own origin; the user's host in subdomain mode)."""
    out = []
    for r in rows:
        alive = r["status"] in ALIVE_STATUSES
        running_server = (r["status"] == SessionStatus.RUNNING
                          and r["service_prefix"].startswith("/user/"))
        out.append({
            "server": server_name(r),
            "ended": ended_view(r),
            "countdowns": ends_view(r, p),
            **r,
            # JupyterHub's default server (its name is '', the session's "_default")
            "display_name": ("default server" if r["name"] == "_default"
                             and (r.get("service_prefix") or "").startswith("/user/")
                             else r["name"]),
            "resources": human_slots(r["requested_slots"])
            + (f" x {r['cluster_size']}" if r["cluster_size"] > 1 else ""),
            "age": human_duration(_since(r["created_at"], now)),
            "created": exact_utc(_utc(r["created_at"])) if r["created_at"] else "",
            "idle": (human_duration(_since(r["last_activity"], now))
                     if r["last_activity"] and r["status"] == SessionStatus.RUNNING else "-"),
            "alive": alive,
            "open_url": origin(r["username"]) + r["service_prefix"] if running_server else "",
            "apps": service_links(r.get("service_ports") or [], origin(r["username"])
                                  + r["service_prefix"] if running_server else None),
        })
    return out


class SessionsPage(PageBase):
    @web.authenticated
    async def get(self):
        p = await self.load_principal()
        data = await self.read("console_sessions", p, {"user_id": p.user_id})
        sessions = _session_view(data["items"], p, _now(), self.server_origin)
        kernels = await self.read("own_running_kernels", p)
        stats = await live_stats(self.manager, sorted({k["agent_id"] for ks in kernels.values()
                                                       for k in ks}))
        t = time.time()
        for s in sessions:
            s["usage"] = own_usage(kernels[s["id"]], stats, t) if s["id"] in kernels else None
            # Restart: the caller's own running session, stopped and started again with
            # the options it was started with (a JupyterHub server through the hub, which
            # keeps them; any other through the API: api/restart.py).
            s["may_restart"] = (s["status"] == SessionStatus.RUNNING
                                and s["username"] == p.username)
        await self.page("backendai/sessions.html", sessions=sessions,
                        total=data["total"], shown=SESSION_ROWS)


def own_usage(kernels: list[dict], stats: dict[str, dict], now: float) -> dict:
    """A session's own live use from its agents' statistics (agent/stats.py, as the
    Agents page reads them): CPU (cores busy of the cores it asked for), memory in use
    of its kernels' limits, and, where it holds GPUs, their utilisation and memory."""
    cores = busy = 0.0
    mem = limit = 0
    cpu_known, samples, ts = False, 0, []
    gpus = []
    ids = {k["id"] for k in kernels}
    for k in kernels:
        st = stats.get(k["agent_id"]) or {}
        cores += float(k["slots"].get("cpu") or 0)
        for d in st.get("gpus") or []:
            if isinstance(d, dict) and d.get("kernel_id") in ids and d not in gpus:
                gpus.append(d)
        ks = (st.get("kernels") or {}).get(k["id"])
        if ks is None:
            continue
        samples += 1
        ts.append(float(st.get("ts") or now))
        if ks.get("cpu_pct") is not None:
            cpu_known = True
            busy += float(ks["cpu_pct"]) / 100
        mem += int(ks.get("mem_bytes") or 0)
        limit += int(ks.get("mem_limit_bytes") or k["slots"].get("mem") or 0)
    out: dict = {"sampled": samples > 0, "kernels": len(kernels),
                 "age": human_duration(now - min(ts)) if ts else None}
    if samples:
        out["cpu"] = (f"{busy:.2f} of {cores:g} core{'' if cores == 1 else 's'}" if cpu_known
                      else "measuring")
        out["cpu_percent"] = min(100, round(100 * busy / cores)) if cpu_known and cores else 0
        out["mem"] = f"{format_bytes(mem)} of {format_bytes(limit)}" if limit else \
            f"{format_bytes(mem)} (no limit)"
        out["mem_percent"] = min(100, round(100 * mem / limit)) if limit else 0
    out["gpus"] = gpu_rows(gpus, {})
    for g, d in zip(out["gpus"], gpus, strict=True):
        g["held"] = ""
        used, total = d.get("mem_used_bytes"), d.get("mem_total_bytes")
        g["mem_percent"] = round(100 * int(used) / int(total)) if used is not None and total else 0
    return out


class SessionLogsPage(PageBase):
    @web.authenticated
    async def get(self, sid):
        p = await self.load_principal()
        out = await self.read("session_logs", p, sid)
        if out["status"] in (SessionStatus.RUNNING, SessionStatus.TERMINATING):
            for idx, k in enumerate(out["kernels"]):
                try:
                    k["logs"] = await self.manager.session_logs(sid, kernel_idx=idx)
                except BackendAIError as e:
                    k["logs"] = f"(the agent did not give the logs: {e.detail})"
        session = await self.read("get_session", p, sid)
        await self.page("backendai/logs.html", session=session, logs=out)


# -- My folders ---------------------------------------------------------------------


class FoldersPage(PageBase):
    @web.authenticated
    async def get(self):
        p = await self.load_principal()
        data = await self.read("console_folders", p)
        try:
            hosts = await vfolders.hosts(self.manager, p)
        except BackendAIError as e:
            hosts = {"default": self.manager.default_vfolder_host, "allowed": [],
                     "error": e.detail}
        await self.page("backendai/folders.html", folders=data["items"],
                        projects=data["projects"], hosts=hosts)


class FolderPage(PageBase):
    @web.authenticated
    async def get(self, fid):
        p = await self.load_principal()
        path = self.get_query_argument("path", "")
        try:
            path = vfolders.check_path(path)
        except BackendAIError as e:
            raise web.HTTPError(e.status_code, "%s", e.detail) from None
        folder = await self.read("console_folder", p, fid)
        where = await self.read("file_access", p, fid, "list")
        try:
            listing = await vffiles.list_files(self.manager, where, path)
        except BackendAIError as e:
            raise web.HTTPError(e.status_code, "%s", e.detail) from None
        items = sorted(listing["items"], key=lambda e: (e.get("type") != "dir", e["name"]))
        in_trash = path == TRASH or path.startswith(TRASH + "/")
        trash_count = None
        for e in items:
            e["full"] = f"{path}/{e['name']}" if path else e["name"]
            e["size_text"] = format_bytes(e["size"]) if e.get("type") == "file" else ""
            e["modified"] = (dt.datetime.fromtimestamp(float(e["mtime"]), dt.UTC)
                             if e.get("mtime") else None)
            # In the trash: where it came from (the name is that path, encoded).
            e["origin"] = trash_origin(e["name"]) if path == TRASH else None
        if not path and any(e["name"] == TRASH for e in items):
            trash = await vffiles.list_files(self.manager, where, TRASH)
            trash_count = len(trash["items"])
            items = [e for e in items if e["name"] != TRASH]
        try:
            usage = await self.manager.storage.folder_usage(where["host"],
                                                            where["quota_scope_id"], where["id"])
            n = usage["file_count"]  # (None on btrfs: it counts no files)
            size = (f"{format_bytes(int(usage['used_bytes']))}"
                    + (f" in {int(n)} file{'' if n == 1 else 's'}" if n is not None else "")
                    + (f" of its limit {format_bytes(folder['max_size_bytes'])}"
                       if folder.get("max_size_bytes") else ""))
        except Exception:  # the storage cannot tell now: the page still lists the files
            size = None
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        writable = folder["my_permission"] in ("rw", "wd") and p.role != UserRole.MONITOR
        deletes = p.role != UserRole.MONITOR and (
            folder["my_permission"] == "wd" or (folder["ownership_type"] == "user"
                                                and folder["manage"]))
        await self.page("backendai/folder.html", folder=folder, path=path, parent=parent,
                        items=items, writable=writable, deletes=deletes, in_trash=in_trash,
                        trash=TRASH, trash_count=trash_count, size=size)


#: Where "Move to trash" puts a file on the folder page: a directory of the folder, each
#: entry named after the path it came from (encoded, with when it was moved), so that
#: "Restore" puts it back; kernels see it as any directory.
TRASH = ".trash"


def trash_origin(name: str) -> str | None:
    """The path a trash entry came from: ``<encoded path>~<ms>`` (folder.html's script)."""
    from urllib.parse import unquote

    encoded, sep, stamp = name.rpartition("~")
    if not sep or not stamp.isdigit() or not encoded:
        return None
    return unquote(encoded)


# -- My keys ----------------------------------------------------------------------------


class KeysPage(PageBase):
    @web.authenticated
    async def get(self):
        p = await self.load_principal()
        data = await self.read("console_keys", p)
        await self.page("backendai/keys.html", keys=data["items"])


# -- My dotfiles (issue 27) ---------------------------------------------------------------


class DotfilesPage(PageBase):
    @web.authenticated
    async def get(self):
        p = await self.load_principal()
        data = await self.read("console_dotfiles", p)
        await self.page("backendai/dotfiles.html", **data)


# -- admin console --------------------------------------------------------------------


def _percent(v) -> str:
    return "-" if v is None else f"{float(v):g}%"


def live_view(stats: dict | None, sessions: dict[str, dict], now: float) -> dict | None:
    """An agent's live statistics in words: the kernels' CPU (cores busy, from each
    kernel's percent of one core), memory in use against their limits, and per kernel
    of a session the caller may see its CPU, memory and GPU utilisation (the mean of
    its GPUs, as NVML gives it). Kernels of sessions the caller may not see count in
    the totals only."""
    if not stats:
        return None
    kernels = stats.get("kernels") or {}
    busy = sum(float(k.get("cpu_pct") or 0) for k in kernels.values()) / 100
    mem = sum(int(k.get("mem_bytes") or 0) for k in kernels.values())
    # The kernels' limits together, when every one has a limit.
    limits = [int(k.get("mem_limit_bytes") or 0) for k in kernels.values()]
    limit = sum(limits) if limits and all(limits) else 0
    cores = float((stats.get("available_slots") or {}).get("cpu") or 0)
    rows = []
    for kid, k in sorted(kernels.items(), key=lambda kv: (sessions.get(kv[0]) or {}).get(
            "session", "~")):
        who = sessions.get(kid)
        if who is None:
            continue
        rows.append({**who, "kernel": kid, "cpu": _percent(k.get("cpu_pct")),
                     "mem": format_bytes(int(k.get("mem_bytes") or 0)),
                     "mem_limit": (format_bytes(int(k["mem_limit_bytes"]))
                                   if k.get("mem_limit_bytes") else "no limit"),
                     "gpu": _percent(k.get("gpu_util_pct"))})
    return {
        "age": human_duration(now - float(stats.get("ts") or now)),
        "cpu": f"{busy:.2f} of {cores:g} cores busy" if cores else f"{busy:.2f} cores busy",
        "mem": f"{format_bytes(mem)} in use" + (f" of {format_bytes(limit)} allowed"
                                                  if limit else ""),
        "kernels": len(kernels),
        "rows": rows,
        "hidden": len(kernels) - len(rows),
        "gpus": (gpus := gpu_rows(stats.get("gpus") or [], sessions)),
        "gpus_hidden": sum(1 for g in gpus if g["hidden"]),
    }


def gpu_rows(gpus: list[dict], sessions: dict[str, dict]) -> list[dict]:
    """Each GPU and MIG instance of an agent's sample in words: utilisation, memory in
    use of its total, and who holds it. A holder is named only when the caller may
    see its session; otherwise the row says so without naming it."""
    rows = []
    for d in gpus:
        if not isinstance(d, dict):
            continue
        kid = d.get("kernel_id")
        who = sessions.get(kid) if kid else None
        if not kid:
            held = "free"
        elif who is None:
            held = "a session outside your view"
        else:
            held = f"{who['session']} ({who['user']})"
        used, total = d.get("mem_used_bytes"), d.get("mem_total_bytes")
        if used is not None and total:
            mem = f"{format_bytes(int(used))} of {format_bytes(int(total))}"
        elif total:
            mem = f"? of {format_bytes(int(total))}"
        else:
            mem = "-"
        parent = d.get("parent_index")
        rows.append({
            "index": str(d.get("index")) if parent is None else f"{parent}:{d.get('index')}",
            "mig": parent is not None, "name": d.get("name") or "", "uuid": d.get("uuid") or "",
            "util": _percent(d.get("util_pct")) if d.get("util_pct") is not None
            else (d.get("note") or "-"),
            "mem": mem, "held": held, "kernel": kid if who else "",
            "session": who["session"] if who else "", "hidden": bool(kid) and who is None,
        })
    return rows


def _agent_view(a: dict, live: dict | None = None) -> dict:
    avail, used = a.get("available_slots") or {}, a.get("occupied_slots") or {}
    rows = []
    for key in sorted(set(avail) | set(used), key=lambda k: ("cpu", "mem", "cuda.device").index(k)
                      if k in ("cpu", "mem", "cuda.device") else 9):
        total, taken = float(avail.get(key, 0)), float(used.get(key, 0))
        elsewhere = (a.get("away_slots") or {}).get(key)
        rows.append({"slot": key, "used": human_slots({key: used.get(key, 0)}),
                     "total": human_slots({key: avail.get(key, 0)}),
                     "percent": round(100 * taken / total) if total else 0,
                     "away": human_slots({key: elsewhere}) if elsewhere else ""})
    return {**a, "use": rows, "live": live}


class AdminPage(PageBase):
    @web.authenticated
    async def get(self, section=None):
        p = await self.load_principal()
        self.require_admin()
        section = section or "users"
        if section not in dict(ADMIN_SECTIONS):
            raise web.HTTPError(404, "%s", f"There is no console page {section!r}.")
        filters = {}
        if section == "sessions":
            for key in ("status", "type"):
                value = self.get_query_argument(key, "")
                if value:
                    filters[key] = value
            if filters.get("status") and filters["status"] not in list(SessionStatus):
                raise web.HTTPError(400, "%s", f"status must be one of "
                                    f"{', '.join(SessionStatus)}, not {filters['status']!r}")
            if filters.get("type") and filters["type"] not in ("interactive", "batch",
                                                                   "inference"):
                raise web.HTTPError(400, "%s", "type must be interactive, batch or inference")
        data = await self.read("console_section", p, section, filters)
        now = _now()
        if "sessions" in data:
            data["sessions"] = _session_view(data["sessions"], p, now, self.server_origin)
        if "agents" in data:
            stats = await live_stats(self.manager, [a["id"] for a in data["agents"]])
            kids = {kid for st in stats.values() for kid in (st.get("kernels") or {})}
            kids |= {g["kernel_id"] for st in stats.values() for g in (st.get("gpus") or [])
                     if isinstance(g, dict) and g.get("kernel_id")}
            names = await self.read("console_kernel_sessions", p, kids)
            t = time.time()
            data["agents"] = [_agent_view(a, live_view(stats.get(a["id"]), names, t))
                              for a in data["agents"]]
        if section == "queue":
            status = await self.manager.scheduler_status()
            visible = data.pop("visible")
            queues = []
            for name, st in sorted(status.items()):
                if visible is not None and name not in visible:
                    continue
                waiting = [s for s in _session_view(data["pending"], p, now)
                           if s["resource_group"] == name]
                queues.append({"name": name, "stats": st, "sessions": waiting,
                               "oldest": human_duration(st.get("oldest_wait_s") or 0)})
            data["queues"] = queues
        if section == "environments":  # a rescan running or ended on this hub
            for r in data["registries"]:
                r["rescan"] = self.manager.registries.progress(r["name"])
            data["local_rescan"] = self.manager.registries.progress("local")
        if section == "usage":
            data.update(await self.usage_view(p))
        if section == "plots":
            series = usage.start(self.manager)
            charts = usage.charts(list(series.samples), data.pop("visible_agents"),
                                  data.pop("visible_projects"), data.pop("visible_groups"))
            data["plots"] = [usage.line_chart(c) for c in charts]
            data["samples"] = len(series.samples)
            data["interval"] = series.interval
        await self.page("backendai/admin.html", section=section, sections=ADMIN_SECTIONS,
                        filters=filters, statuses=list(SessionStatus), **data)

    async def usage_view(self, p: access.Principal) -> dict:
        """The usage page's form and, for a good request, its report (manager/usage.py);
        a bad one: the reason beside the form, status 400."""
        form = {k: self.get_query_argument(k, "") for k in ("start", "end", "group_by")}
        out = {"usage_form": form, "group_by_choices": GROUP_BY, "report": None,
               "usage_error": None}
        try:
            start, end = parse_period(form["start"] or None, form["end"] or None, _now())
            out["report"] = await self.manager.ops.usage_report(
                p, start, end, form["group_by"] or "user")
        except BackendAIError as e:
            self.set_status(e.status_code)
            out["usage_error"] = e.detail
        return out


def _figure(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


class UsageCSV(PageBase):
    """The usage page's report as CSV (one row per key, the figures unrounded by the
    page): ``admin/usage.csv?start=...&end=...&group_by=...``."""

    @web.authenticated
    async def get(self):
        import csv
        import io

        p = await self.load_principal()
        self.require_admin()
        q = {k: self.get_query_argument(k, "") or None for k in ("start", "end", "group_by")}
        try:
            start, end = parse_period(q["start"], q["end"], _now())
        except BackendAIError as e:
            raise web.HTTPError(e.status_code, "%s", e.detail) from None
        report = await self.read("usage_report", p, start, end, q["group_by"] or "user")
        buf = io.StringIO()
        w = csv.writer(buf)
        figures = list(FIGURES)
        w.writerow([report["group_by"], "key", "sessions", *figures])
        for r in report["items"]:
            w.writerow([r["name"], r["key"], r["sessions"], *(r[f] for f in figures)])
        name = f"usage-{report['group_by']}-{start:%Y%m%d}-{end:%Y%m%d}.csv"
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        self.finish(buf.getvalue())
