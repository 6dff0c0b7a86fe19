"""What the spawner asks of the record (operations, see manager/ops.py): the resource
groups a user may use and what the form shows of them, and where a session runs."""

from __future__ import annotations

from sqlalchemy import select

from ..common.slots import CPU, CUDA, MEM, format_slots, is_mig_slot
from ..models import Agent, Kernel, ResourceGroup, ResourcePreset, Session
from . import access, pageviews, tenancy
from .ops import reads


@reads
def group_facts(s, resource_group: str) -> dict:
    """What the form shows of a resource group: free room on its largest live agent (in
    human units), whether it has GPUs, whether any agent is on the local backend."""
    best = None
    gpu = local = False
    for a in s.scalars(select(Agent).where(Agent.resource_group == resource_group, Agent.status == "ALIVE")):
        gpu = gpu or bool(a.available_slots.get(CUDA, 0))
        local = local or a.backend == "local"
        free = a.available_slots - a.occupied_slots
        if best is None or (free.get(CPU, 0), free.get(MEM, 0)) > (best.get(CPU, 0), best.get(MEM, 0)):
            best = free
    if best is None:
        text = "no agent is running in this resource group"
    else:
        shown = {CPU: best.get(CPU, 0), MEM: best.get(MEM, 0)}
        if gpu:
            shown[CUDA] = best.get(CUDA, 0)
        text = format_slots(shown)
    return {"free": text, "gpu": gpu, "local": local}


@reads
def form_presets(s) -> list[dict]:
    """The record's resource presets in the shape of ``c.BackendAISpawner.presets``
    (pages/presets.py): slug and display name the preset's name, offered in its resource
    group (or every one), fixing its resources (cpu, mem in bytes, GPUs, MIG instances);
    the image is the form's default one. ``source`` says where it came from."""
    out = []
    for row in s.scalars(select(ResourcePreset).order_by(ResourcePreset.name)):
        slots = row.resource_slots or {}
        opts = {}
        if slots.get(CPU):
            opts["cpu"] = str(slots[CPU])
        if slots.get(MEM):
            opts["mem"] = str(int(slots[MEM]))
        if slots.get(CUDA):
            opts["gpu"] = str(slots[CUDA])
        opts.update({k: str(v) for k, v in slots.items() if is_mig_slot(k) and v})
        out.append({"slug": row.name, "display_name": row.name,
                    "description": row.description or "",
                    "resource_groups": [row.resource_group] if row.resource_group else [],
                    "user_options": opts, "source": "database"})
    return out


@reads
def usable_groups(s, username: str) -> list[str]:
    """The active resource groups ``username`` may start sessions in: the API's rule
    (manager/access.py ``usable_group_names``: public, or allowed for the user's domain,
    one of their projects or keypairs)."""
    names = access.usable_group_names(s, access.load_principal(s, username=username))
    return sorted(g.name for g in s.scalars(select(ResourceGroup).where(ResourceGroup.is_active))
                  if names is None or g.name in names)


@reads
def group_refusal(s, username: str, group: str) -> tuple[int, str] | None:
    """Why ``username`` may not start a session in ``group`` (status, words), or None."""
    usable = usable_groups(s, username)
    if group in usable:
        return None
    yours = f"(yours: {', '.join(usable) or 'none'})"
    rg = s.get(ResourceGroup, group)
    if rg is None:
        return 400, f"there is no resource group {group!r} {yours}"
    if not rg.is_active:
        return 400, f"resource group {group!r} is not active {yours}"
    return 403, f"you may not use resource group {group!r} {yours}"


@reads
def spawn_facts(s, username: str, group: str) -> dict:
    """What the spawner checks a request of ``username`` in ``group`` against, read in
    one transaction (four before, each a hop to a worker thread and a wait for the
    hub's loop in a rush of starts): ``refusal`` (:func:`group_refusal`), ``presets``
    (:func:`form_presets`), ``projects`` (the user's active projects, sorted) and
    ``quota`` (pageviews.quota_left)."""
    return {
        "refusal": group_refusal(s, username, group),
        "presets": form_presets(s),
        "projects": tenancy.active_project_names(s, username),
        "quota": pageviews.quota_left(s, username),
    }


@reads
def session_is_local(s, session_id: str) -> bool:
    """Whether a kernel of the session runs on an agent of the local backend."""
    backends = s.scalars(
        select(Agent.backend).join(Kernel, Kernel.agent_id == Agent.id).where(Kernel.session_id == session_id)
    ).all()
    if not backends:  # not placed yet: the agents it may land on
        sess = s.get(Session, session_id)
        if sess is not None:
            backends = s.scalars(select(Agent.backend).where(
                Agent.resource_group == sess.resource_group, Agent.status == "ALIVE")).all()
    return "local" in backends
