"""Presets of the spawn form and the quota a user has left, for the spawner.

A preset is a named bundle of image, resources and folders, shaped like KubeSpawner's
``profile_list`` (``c.BackendAISpawner.presets``)::

    {"display_name": "Small Python", "slug": "small", "description": "1 core, 2 GiB",
     "default": True,
     "resource_groups": ["default"],      # offered only there (missing/empty: everywhere)
     "projects": ["teamproj"],           # only for sessions of these projects (idem)
     "user_options": {"image": "...", "cpu": "1", "mem": "2g", "gpu": 0,
                      "mounts": ["data"], "cluster_size": 1, "cluster_mode": "single-node"}}

The request a preset makes is its ``user_options`` over the spawner's defaults: a
request that names a preset may add folders and choose the project, nothing else.
``custom`` is the form's own choice (CPU, memory, GPUs typed by the user).
"""

from __future__ import annotations

import json
from decimal import Decimal

from ..common.errors import InvalidRequest
from ..common.slots import CPU, CUDA, KNOWN_SLOTS, MEM, format_slots, is_mig_slot, parse_size

CUSTOM = "custom"
PRESET_KEYS = {"display_name", "slug", "description", "default", "resource_groups", "projects",
               "user_options"}
#: What a preset may fix.
OPTION_KEYS = {"image", "cpu", "mem", "gpu", "mounts", "cluster_size", "cluster_mode", "project"}
#: What a request naming a preset may not set (the preset fixes them).
FIXED_KEYS = ("image", "cpu", "mem", "gpu", "cluster_size", "cluster_mode")
_SLUG_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def check_presets(value) -> list[dict]:
    """The configured presets, checked; ValueError in plain words otherwise."""
    value = _from_json(value)
    if not isinstance(value, list):
        raise ValueError("presets must be a list of dicts")
    value = [_from_json(p) for p in value]
    if len(value) == 1 and isinstance(value[0], list):  # the whole list as one JSON text
        value = value[0]
    seen: set[str] = set()
    defaults = 0
    for i, p in enumerate(value):
        where = f"preset {i + 1}"
        if not isinstance(p, dict):
            raise ValueError(f"{where} must be a dict, not {type(p).__name__}")
        unknown = set(p) - PRESET_KEYS
        if unknown:
            raise ValueError(f"{where} has unknown key(s): {', '.join(sorted(unknown))}")
        slug = p.get("slug")
        if not isinstance(slug, str) or not slug or not set(slug) <= _SLUG_CHARS:
            raise ValueError(f"{where} needs a slug of lower-case letters, digits, '-', '_' or '.'")
        if slug == CUSTOM:
            raise ValueError(f"{where}: the slug {CUSTOM!r} is the form's own custom choice")
        if slug in seen:
            raise ValueError(f"two presets have the slug {slug!r}")
        seen.add(slug)
        if not isinstance(p.get("display_name"), str) or not p["display_name"].strip():
            raise ValueError(f"preset {slug!r} needs a display_name")
        for key in ("resource_groups", "projects"):
            v = p.get(key, [])
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"preset {slug!r}: {key} must be a list of names")
        opts = p.get("user_options", {})
        if not isinstance(opts, dict):
            raise ValueError(f"preset {slug!r}: user_options must be a dict")
        unknown = {k for k in set(opts) - OPTION_KEYS if not is_mig_slot(k)}  # cuda.mig-<profile>
        if unknown:
            raise ValueError(f"preset {slug!r}: unknown user_options key(s): "
                             f"{', '.join(sorted(unknown))}")
        mounts = opts.get("mounts", [])
        if not isinstance(mounts, list) or not all(isinstance(x, str) for x in mounts):
            raise ValueError(f"preset {slug!r}: user_options mounts must be a list of folder names")
        defaults += bool(p.get("default"))
    if defaults > 1:
        raise ValueError("at most one preset may be the default")
    return value


def _from_json(v):
    """Command-line config gives text: ``--BackendAISpawner.presets='[{...}]'``."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            raise ValueError(f"presets: not JSON: {v[:80]!r}") from None
    return v


def offered(presets: list[dict], resource_group: str, projects: list[str]) -> list[dict]:
    """The presets offered in ``resource_group`` to a member of ``projects``."""
    out = []
    for p in presets:
        groups = p.get("resource_groups") or []
        if groups and resource_group not in groups:
            continue
        only = p.get("projects") or []
        if only and not set(only) & set(projects):
            continue
        out.append(p)
    return out


def default_slug(presets: list[dict], allow_custom: bool) -> str:
    """The choice preselected in the form (and taken by a request that names none)."""
    for p in presets:
        if p.get("default"):
            return p["slug"]
    if allow_custom or not presets:
        return CUSTOM
    return presets[0]["slug"]


def resolve(presets: list[dict], slug, resource_group: str, projects: list[str],
            user_options: dict) -> tuple[dict, dict]:
    """The request of preset ``slug``: (options over the spawner's defaults, preset).
    InvalidRequest in plain words for a preset that does not exist, one not offered to
    this user, group or project, or a request that also sets what the preset fixes."""
    if not isinstance(slug, str):
        raise InvalidRequest(f"preset must be the name (slug) of a preset, not {slug!r}")
    known = {p["slug"]: p for p in presets}
    if slug not in known:
        names = ", ".join(sorted(known)) or "none"
        raise InvalidRequest(f"there is no preset {slug!r} (the presets here: {names})")
    preset = known[slug]
    if preset not in offered(presets, resource_group, projects):
        raise InvalidRequest(f"preset {slug!r} is not offered to you in resource group "
                             f"{resource_group!r}")
    clash = [k for k in FIXED_KEYS if user_options.get(k) not in (None, "")]
    if clash:
        raise InvalidRequest(
            f"preset {slug!r} fixes the image and resources; leave out {', '.join(clash)} "
            f"or choose custom resources")
    fixed = dict(preset.get("user_options") or {})
    opts = {k: v for k, v in fixed.items() if k not in ("mounts", "project")}
    only = preset.get("projects") or []
    project = user_options.get("project") or fixed.get("project")
    if fixed.get("project") and project != fixed["project"]:
        raise InvalidRequest(f"preset {slug!r} runs in project {fixed['project']!r}, "
                             f"not {project!r}")
    if project is None and only:
        project = next(p for p in only if p in projects)
    if only and project not in only:
        raise InvalidRequest(f"preset {slug!r} is for project(s) {', '.join(only)}, "
                             f"not {project!r}")
    if project is not None:
        opts["project"] = project
    mounts = list(fixed.get("mounts") or [])
    for m in user_options.get("mounts") or []:
        if m not in mounts:
            mounts.append(m)
    opts["mounts"] = mounts
    return opts, preset


def summary(preset: dict, defaults: dict) -> str:
    """``image, 1 core, 2 GiB memory; folders: data`` for the form."""
    o = {**defaults, **(preset.get("user_options") or {})}
    slots = {CPU: o.get("cpu", 1)}
    try:
        slots[MEM] = parse_size(o.get("mem", "1g"))
    except InvalidRequest:
        slots.pop(MEM, None)
    if o.get("gpu"):
        slots[CUDA] = o["gpu"]
    text = f"{o.get('image') or 'default image'}, {format_slots(slots)}"
    if int(o.get("cluster_size") or 1) > 1:
        text += f" x {o['cluster_size']} kernels"
    if o.get("mounts"):
        text += "; folders: " + ", ".join(o["mounts"])
    return text


# -- the quota left (manager/pageviews.py ``quota_left`` reads it) -----------------


def quota_words(q: dict, gpu: bool) -> str:
    """``1.5 cores, 2 GiB memory left (no limit on GPUs); 1 of 3 sessions in use``."""
    slots = (CPU, MEM, CUDA) if gpu else (CPU, MEM)
    limited = {s: q["left"][s] for s in slots if q["left"][s] is not None}
    free = [{CPU: "cores", MEM: "memory", CUDA: "GPUs"}[s] for s in slots
            if q["left"][s] is None]
    text = f"{format_slots(limited)} left" if limited else "no limit on resources"
    if limited and free:
        text += f" (no limit on {' or '.join(free)})"
    if q.get("sessions"):
        n, m = q["sessions"]
        text += f"; {n} of {m} session{'' if m == 1 else 's'} in use"
    return text


def quota_excess(q: dict, slots: dict, cluster_size: int) -> str | None:
    """Why a request can never fit the user's quota limits (not what is left now: a
    request within the limits waits for room), or None."""
    for slot in KNOWN_SLOTS:
        need = Decimal(slots.get(slot, 0)) * cluster_size
        lim = q["limit"].get(slot)
        if need > 0 and lim is not None and need > lim:
            return (f"this session asks for {format_slots({slot: need})} and your quota "
                    f"allows {format_slots({slot: lim}) if lim else 'none'} in total")
    return None
