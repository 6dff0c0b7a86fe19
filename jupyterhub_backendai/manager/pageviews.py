"""What the hub's pages ask of the record (operations, see manager/ops.py).

The pages under ``/hub/backendai/`` (pages/console.py), the navigation bar's console
link (pages/nav.py), the spawn form's quota (pages/presets.py, through the spawner) and
the console's use samples (pages/usage.py) read the record only through the functions
here. Each returns plain data: which rows the caller may see and what they may change
there, in the API's own shapes (:mod:`.admin`, :mod:`.vfolders`, with the rules of
:mod:`.access`); units in words and HTML stay in the pages.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from types import SimpleNamespace
from urllib.parse import quote

from sqlalchemy import select

from ..common.slots import CPU, CUDA, KNOWN_SLOTS, MEM
from ..common.times import parse_utc
from ..common.types import AgentStatus, SessionStatus
from ..models import Agent, Kernel, Keypair, Project, Session, User
from . import (
    access,
    admin,
    capacity,
    images,
    lifetimes,
    registries,
    templates,
    tenancy,
    vfolders,
    vfshares,
    warmpool,
)
from .ops import reads
from .scheduler.snapshot import load_limits, load_policies, load_usage
from .scheduler.state import slot_limit

#: Newest sessions shown on "My sessions" and in the console.
SESSION_ROWS = 200
#: Rows of a console list: one page of the API at its largest (api/spec.py MAX_LIMIT).
MAX_ROWS = 500

# -- the navigation bar -----------------------------------------------------------------


@reads
def console_role(db, username: str) -> str | None:
    """``username``'s Backend.AI role (None: no such user): one indexed row."""
    return db.scalar(select(User.role).where(User.username == username))


def console_role_now(manager, username: str) -> str | None:
    """:func:`console_role` for a caller that cannot wait (JupyterHub calls its template
    variables while it renders, error pages included): run here, in a read-only
    transaction that neither waits for nor blocks writers (WAL on SQLite)."""
    with manager.sm_read() as s:
        return console_role(s, username)


# -- My sessions --------------------------------------------------------------------


@reads
def console_sessions(db, p: access.Principal, filters: dict, n: int = SESSION_ROWS) -> dict:
    """The newest ``n`` sessions ``p`` may see (the API's list, newest first), with the
    idle time, service address and owner the API's rows do not carry, and for a running
    interactive session its apps (``service_ports``, each with the main kernel's
    ``host``: what the API's ``GET /sessions/{id}/service-ports`` answers from); when it
    began to run (``running_since``) and, running, when it ends by itself (``ends``:
    :func:`.lifetimes.ends_of`, what ``GET /sessions/{id}/lifetime`` answers)."""
    total = admin.list_sessions(db, p, filters, 0, 1)["total"]
    page = admin.list_sessions(db, p, filters, max(0, total - n), n)
    rows = list(reversed(page["items"]))
    ids = [r["id"] for r in rows]
    extra = {}
    if ids:
        for sid, last, prefix, uid, history in db.execute(
                select(Session.id, Session.last_activity, Session.service_prefix, Session.user_id,
                       Session.status_history)
                .where(access.session_filter(p), Session.id.in_(ids))):
            extra[sid] = (last, prefix, uid, (history or {}).get(SessionStatus.RUNNING))
        names = dict(db.execute(select(User.id, User.username).where(
            User.id.in_({e[2] for e in extra.values()}))).all())
    else:
        names = {}
    apps = _main_kernel_ports(db, p, [r["id"] for r in rows
                                      if r["status"] == SessionStatus.RUNNING
                                      and r["type"] != "batch"])
    ends = lifetimes.session_ends(db, p, [r["id"] for r in rows
                                          if r["status"] == SessionStatus.RUNNING])
    for r in rows:
        last, prefix, uid, since = extra.get(r["id"], (None, "/", r["user_id"], None))
        r["last_activity"] = last
        r["service_prefix"] = prefix or "/"
        r["username"] = names.get(uid, "")
        r["service_ports"] = apps.get(r["id"], [])
        r["running_since"] = since
        r["ends"] = ends.get(r["id"])
    return {"items": rows, "total": total}


@reads
def own_running_kernels(db, p: access.Principal) -> dict[str, list[dict]]:
    """The caller's own RUNNING sessions' kernels (id, agent, the slots each asked for),
    by session id: what "My sessions" looks up in the agents' live statistics. Only
    the caller's own, whatever their role (an admin reads others' on the Agents page)."""
    out: dict[str, list[dict]] = {}
    for sid, kid, agent, slots in db.execute(
            select(Session.id, Kernel.id, Kernel.agent_id, Kernel.requested_slots)
            .join(Kernel, Kernel.session_id == Session.id)
            .where(Session.user_id == p.user_id, Session.status == SessionStatus.RUNNING,
                   Kernel.agent_id.is_not(None))
            .order_by(Kernel.cluster_idx)):
        out.setdefault(sid, []).append({"id": kid, "agent_id": agent,
                                        "slots": dict(slots or {})})
    return out


def _main_kernel_ports(db, p: access.Principal, sids: list[str]) -> dict[str, list[dict]]:
    """Session id -> its main kernel's service ports, each with the kernel's host."""
    if not sids:
        return {}
    out: dict[str, list[dict]] = {}
    for sid, ports, host in db.execute(
            select(Kernel.session_id, Kernel.service_ports, Kernel.kernel_host)
            .join(Session, Kernel.session_id == Session.id)
            .where(Kernel.session_id.in_(sids), Kernel.cluster_role == "main",
                   access.session_filter(p))
            .order_by(Kernel.cluster_idx)):
        if sid not in out:
            out[sid] = [{**sp, "host": host} for sp in ports or []]
    return out


# -- My folders and keys ------------------------------------------------------------------


@reads
def console_folders(db, p: access.Principal) -> dict:
    """The folders whose files the caller may use (the API's list, limited to those with
    a permission for the caller: an admin's list of the whole domain is the console's),
    each with its owner in words and whether the caller may manage it; and the caller's
    projects as (id, name), by name."""
    page = vfolders.list_folders(db, p, {}, 0, MAX_ROWS)
    rows = [f for f in page["items"] if f["my_permission"]]
    projects = {pid: db.get(Project, pid) for pid in {f["project_id"] for f in rows} if pid}
    for f in rows:
        pr = projects.get(f["project_id"])
        f["owner"] = f"project {pr.name}" if pr is not None else (
            "you" if f["user_id"] == p.user_id else "shared with you")
        f["manage"] = vfolders.can_manage_folder(p, db.get(vfolders.VFolder, f["id"]))
    user = db.get(User, p.user_id)
    my_projects = sorted(((pr.id, pr.name) for pr in user.projects), key=lambda x: x[1])
    return {"items": rows, "projects": my_projects}


@reads
def console_folder(db, p: access.Principal, fid: str) -> dict:
    """A folder as the API shows it, whether the caller may manage it, and its shares
    (a user folder the caller manages)."""
    f = vfolders.get_folder(db, p, fid)
    f["manage"] = vfolders.can_manage_folder(p, db.get(vfolders.VFolder, fid))
    f["shares"] = (vfshares.list_shares(db, p, fid, 0, MAX_ROWS)["items"]
                   if f["ownership_type"] == "user" and f["manage"] else [])
    return f


@reads
def console_keys(db, p: access.Principal) -> dict:
    """The caller's own keypairs."""
    page = admin.list_keypairs(db, p, {"user_id": p.user_id}, 0, MAX_ROWS)
    return {"items": page["items"]}


@reads
def console_dotfiles(db, p: access.Principal) -> dict:
    """The dotfiles the caller may change, per owner (their own; for admins, their
    domain's and its projects'), and the session templates they see (issue 27)."""
    scopes = [{"scope": "user", "label": "yours", "ref": {},
               "items": templates.dotfile_list(db, p, "user")}]
    domains = ([d["name"] for d in _all(admin.list_domains, db, p)["items"]]
               if p.is_superadmin else [p.domain] if p.is_domain_admin else [])
    for d in domains:
        scopes.append({"scope": "domain", "label": f"domain {d}", "ref": {"domain": d},
                       "items": templates.dotfile_list(db, p, "domain", domain=d)})
        for pr in _all(admin.list_projects, db, p, filters={"domain": d})["items"]:
            ref = {"group": pr["id"], "domain": d}
            scopes.append({"scope": "group", "label": f"project {d}/{pr['name']}", "ref": ref,
                           "items": templates.dotfile_list(db, p, "group", **ref)})
    return {"scopes": scopes, "templates": templates.template_list(db, p)}


# -- the admin console ----------------------------------------------------------------


def _all(fn, db, p, *args, filters=None):
    return fn(db, p, *args, filters or {}, 0, MAX_ROWS)


def _policy_names(db, p: access.Principal, kind: str) -> list[str]:
    return [r["name"] for r in _all(capacity.list_policies, db, p, kind)["items"]]


@reads
def console_section(db, p: access.Principal, section: str, filters: dict) -> dict:
    """What a console page shows, and per row what the caller may change there: each
    ``may_*`` is asked of :mod:`.access`, the rules the API itself applies when the
    page's buttons call it (a button shown is a change the API will accept from this
    role; its other checks, such as "not your own role", answer in words)."""
    out: dict = {}
    installation = access.may_change_installation(p)
    if section == "domains":
        out["domains"] = _all(admin.list_domains, db, p)["items"]
        for d in out["domains"]:
            d["may_edit"] = installation
            d["may_delete"] = installation and d["name"] != capacity.DEFAULT
    elif section == "projects":
        projects = _all(admin.list_projects, db, p)["items"]
        users = _all(admin.list_users, db, p)["items"]
        for pr in projects:
            members = admin.list_members(db, p, pr["id"], 0, MAX_ROWS)["items"]
            pr["member_rows"] = [{"id": m["id"], "name": m.get("username") or m.get("email")}
                                 for m in members]
            pr["members"] = [m["name"] for m in pr["member_rows"]]
            row = db.get(Project, pr["id"])
            pr["can_set_limits"] = access.may_set_limits_of_project(p, row)
            pr["may_edit"] = pr["may_delete"] = access.can_manage_domain_objects(
                p, pr["domain_name"])
            ids = {m["id"] for m in members}
            pr["candidates"] = [u for u in users
                                if u["domain_name"] == pr["domain_name"] and u["id"] not in ids]
        out["projects"] = projects
        out["domains"] = [d["name"] for d in _all(admin.list_domains, db, p)["items"]
                          if access.can_manage_domain_objects(p, d["name"])]
        out["users"] = [{"id": u["id"], "username": u["username"], "domain": u["domain_name"]}
                        for u in users]
    elif section == "users":
        out["users"] = _all(admin.list_users, db, p)["items"]
        for u in out["users"]:
            row = db.get(User, u["id"])
            u["self"] = u["id"] == p.user_id
            u["may_edit"] = access.can_manage_user(p, row)
            u["may_delete"] = u["may_edit"] and not u["self"]
            u["may_set_limits"] = access.may_set_limits_of_user(p, row)
        out["domains"] = [d["name"] for d in _all(admin.list_domains, db, p)["items"]]
        out["projects"] = _all(admin.list_projects, db, p)["items"]
        out["user_policies"] = _policy_names(db, p, "user")
    elif section == "keypairs":
        keys = _all(admin.list_keypairs, db, p)["items"]
        names = dict(db.execute(select(User.id, User.username).where(
            User.id.in_({k["user_id"] for k in keys}))).all())
        for k in keys:
            k["username"] = names.get(k["user_id"], "")
            row = db.get(Keypair, k["access_key"])
            k["may_edit"] = access.can_manage_keypair(p, row)
            k["may_set_limits"] = access.may_set_limits_of_user(p, row.user)
            k["may_delete"] = k["may_edit"] and not k["is_default"]
        out["keypairs"] = keys
        out["keypair_policies"] = _policy_names(db, p, "keypair")
    elif section == "policies":
        out["policies"] = {kind: _all(capacity.list_policies, db, p, kind)["items"]
                           for kind in capacity.POLICIES}
        for rows in out["policies"].values():
            for r in rows:
                r["may_edit"] = installation
                r["may_delete"] = installation and r["name"] != capacity.DEFAULT
    elif section == "resource-groups":
        from .scheduler.options import AGENT_SELECTORS, SchedulerOptions

        out["groups"] = _all(capacity.list_resource_groups, db, p)["items"]
        agents = _all(capacity.list_agents, db, p)["items"] if (
            p.is_superadmin or p.reads_domain) else []
        defaults = SchedulerOptions()
        for g in out["groups"]:
            g["may_edit"] = installation
            g["may_delete"] = installation and g["name"] != capacity.DEFAULT
            g["agents"] = [a for a in agents if a["resource_group"] == g["name"]]
            opts = SchedulerOptions.lenient(g["scheduler_opts"])
            g["opts_text"] = "; ".join(
                f"{k.replace('_', ' ')} {', '.join(v) if isinstance(v, tuple) else v}"
                for k, v in ((k, getattr(opts, k)) for k in (
                    "agent_selector", "pending_timeout", "starvation_threshold",
                    "max_reservations", "resource_priority", "retry_backoff"))
                if v != getattr(defaults, k))
        out["schedulers"] = sorted(capacity.KNOWN_SCHEDULERS)
        out["selectors"] = list(AGENT_SELECTORS)
    elif section == "presets":
        out["presets"] = _all(capacity.list_resource_presets, db, p)["items"]
        for r in out["presets"]:
            r["may_edit"] = r["may_delete"] = installation
        out["group_names"] = [g["name"] for g in _all(capacity.list_resource_groups, db, p)["items"]]
    elif section == "warm-pools":  # issue 30: superadmins set them; other admins are told so
        out["pools"] = (warmpool.list_warm_pools(db, p, 0, MAX_ROWS)["items"]
                        if p.is_superadmin else [])
        out["group_names"] = [g["name"] for g in _all(capacity.list_resource_groups, db, p)["items"]]
        out["preset_names"] = [r["name"] for r in _all(capacity.list_resource_presets, db, p)["items"]]
        out["image_names"] = [i["name"] for i in images.list_catalogue(db, p)]
    elif section == "agents":
        out["agents"] = _all(capacity.list_agents, db, p)["items"]
        out["group_names"] = [g["name"] for g in _all(capacity.list_resource_groups, db, p)["items"]]
    elif section == "environments":  # issue 25: registries (superadmins) and the catalogue
        out["registries"] = registries.list_registries(db, p) if p.is_superadmin else []
        out["images"] = images.list_catalogue(db, p, True)
        for i in out["images"]:
            i["path"] = "images/" + quote(i["name"], safe="")
            i["may_edit"] = p.is_superadmin
    elif section == "sessions":
        data = console_sessions(db, p, filters)
        out["sessions"], out["total"] = data["items"], data["total"]
    elif section == "queue":
        out["visible"] = admin.scheduler_view(db, p)
        out["pending"] = console_sessions(db, p, {"status": SessionStatus.PENDING})["items"]
    elif section == "plots":
        out["visible_agents"] = {a["id"] for a in _all(capacity.list_agents, db, p)["items"]}
        out["visible_projects"] = {r["id"] for r in _all(admin.list_projects, db, p)["items"]}
        out["visible_groups"] = admin.scheduler_view(db, p)
    return out


@reads
def console_kernel_sessions(db, p: access.Principal, kernel_ids: set[str]) -> dict[str, dict]:
    """Kernel id -> its session's name and owner, for the sessions ``p`` may see."""
    if not kernel_ids:
        return {}
    rows = db.execute(
        select(Kernel.id, Session.name, Session.id, User.username)
        .join(Session, Kernel.session_id == Session.id).join(User, Session.user_id == User.id)
        .where(Kernel.id.in_(kernel_ids), access.session_filter(p))).all()
    return {kid: {"session": name, "session_id": sid, "user": user}
            for kid, name, sid, user in rows}


# -- the spawn form's quota -----------------------------------------------------------


@reads
def quota_left(db, username: str) -> dict:
    """What ``username`` may still start, per project of theirs (None: no project), from
    the scheduler's own reads (placed kernels' slots, the keypair, user, project and
    domain limits): ``{project: {"left": {slot: Decimal|None}, "limit": {...},
    "sessions": (n, max)}}``; None per slot is no limit."""
    user = db.scalar(select(User).where(User.username == username))
    if user is None:
        return {}
    kp = tenancy.default_keypair(db, user)
    usage = load_usage(db, "")
    project_limits, _names, domain_limits = load_limits(db)
    levels = []  # (used, limit_of(slot)) for every level that applies to any project
    sessions = None
    dfu = "UNLIMITED"
    if kp is not None:
        policies, user_policies = load_policies(
            db, [SimpleNamespace(user_id=user.id, access_key=kp.access_key)])
        pol = policies[kp.access_key]
        dfu = pol.default_for_unspecified
        levels.append((usage.keypair.get(kp.access_key) or {},
                       lambda s, pol=pol: slot_limit(pol.total_resource_slots, s,
                                                    pol.default_for_unspecified)))
        for up in user_policies.get(user.id, []):
            levels.append((usage.user.get(user.id) or {},
                           lambda s, up=up: slot_limit(up.total_resource_slots, s,
                                                      up.default_for_unspecified)))
        sessions = (usage.sessions_per_keypair.get(kp.access_key, 0),
                    pol.max_concurrent_sessions)
    levels.append((usage.domain.get(user.domain_name) or {},
                   lambda s: slot_limit(domain_limits.get(user.domain_name), s, dfu)))
    projects = [p for p in user.projects if p.is_active] or [None]
    out = {}
    for proj in projects:
        lv = list(levels)
        if isinstance(proj, Project):
            lv.append((usage.project.get(proj.id) or {},
                       lambda s, pid=proj.id: slot_limit(project_limits.get(pid), s, dfu)))
        left, limit = {}, {}
        for slot in KNOWN_SLOTS:
            lefts, lims = [], []
            for used, limit_of in lv:
                lim = limit_of(slot)
                if lim is None:
                    continue
                lims.append(lim)
                lefts.append(max(Decimal(0), lim - Decimal(used.get(slot, 0))))
            left[slot] = min(lefts) if lefts else None
            limit[slot] = min(lims) if lims else None
        out[proj.name if proj is not None else None] = {
            "left": left, "limit": limit, "sessions": sessions}
    return out


# -- the console's use samples --------------------------------------------------------

_GIB = Decimal(2**30)


def _f(v) -> float:
    return float(v or 0)


@reads
def read_sample(db, now: dt.datetime, since: dt.datetime | None, window: float) -> dict:
    """One sample: per agent and per project slots in use, per group queue and waits."""
    agents = {}
    for a in db.scalars(select(Agent).where(Agent.status != AgentStatus.TERMINATED)):
        used, cap = a.occupied_slots or {}, a.available_slots or {}
        agents[a.id] = {"cpu": _f(used.get(CPU)), "mem": _f(used.get(MEM)) / float(_GIB),
                        "gpu": _f(used.get(CUDA)), "cpu_total": _f(cap.get(CPU)),
                        "gpu_total": _f(cap.get(CUDA)), "resource_group": a.resource_group}
    usage = load_usage(db, "")
    names = dict(db.execute(select(Project.id, Project.name)).all())
    projects = {}
    for pid, slots in usage.project.items():
        projects[pid] = {"name": names.get(pid, pid), "cpu": _f(slots.get(CPU)),
                         "mem": _f(slots.get(MEM)) / float(_GIB), "gpu": _f(slots.get(CUDA))}
    queues: dict[str, dict] = {}
    for rg, created in db.execute(select(Session.resource_group, Session.created_at).where(
            Session.status == SessionStatus.PENDING)):
        q = queues.setdefault(rg, {"pending": 0, "oldest": 0.0, "waits": []})
        q["pending"] += 1
        q["oldest"] = max(q["oldest"], _age(now, created))
    # Waits of the sessions placed since the last sample (PENDING -> SCHEDULED).
    if since is not None:
        start = now - dt.timedelta(seconds=window)
        for rg, created, history in db.execute(
                select(Session.resource_group, Session.created_at, Session.status_history).where(
                    Session.created_at >= start,
                    Session.status != SessionStatus.PENDING)):
            at = parse_utc((history or {}).get("SCHEDULED"))
            if at is not None and since < at <= now:
                q = queues.setdefault(rg, {"pending": 0, "oldest": 0.0, "waits": []})
                q["waits"].append(_age(at, created))
    for q in queues.values():
        waits = q.pop("waits")
        q["mean_wait"] = sum(waits) / len(waits) if waits else None
    return {"agents": agents, "projects": projects, "queues": queues}


def _age(now: dt.datetime, created) -> float:
    if created is None:
        return 0.0
    if created.tzinfo is None:
        created = created.replace(tzinfo=dt.UTC)
    return max(0.0, (now - created).total_seconds())
