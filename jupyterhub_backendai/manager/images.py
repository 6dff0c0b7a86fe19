"""Kernel images: the catalogue, a session committed to an image, and the pull at a
session's start (issue 25).

The catalogue holds every labelled image (``ai.backend.kernelspec``) a rescan of a
registry found (manager/registries.py has the registries and their rescans;
:func:`record_scan` writes what one found). The pseudo-registry ``local`` is what the
agents' engines hold already (images built or loaded by hand).

With ``c.BackendAIManager.image_catalogue`` on, only catalogued images that are not
hidden can be started (:func:`resolve_image`); an alias names a catalogued image.
"""

from __future__ import annotations

import asyncio
import logging
import re

from sqlalchemy import delete, or_, select, update

from ..common.errors import Conflict, InvalidRequest, NotFound
from ..common.tasks import wait_set
from ..models import Agent, ContainerRegistry, Image, ImageAlias, Kernel, Session, User
from ..models.base import utcnow
from . import access, responses
from .access import Principal
from .ops import reads, writes
from .registries import LOCAL, PULL_POLICIES, docker_auth, registry_host, registry_secrets

__all__ = ["LOCAL", "PULL_POLICIES", "docker_auth", "registry_host"]

log = logging.getLogger(__name__)

# -- the answers ----------------------------------------------------------------------


def min_slots(labels: dict) -> dict[str, str]:
    prefix = "ai.backend.resource.min."
    return {k[len(prefix):]: str(v) for k, v in labels.items() if k.startswith(prefix)}


GPU_SLOT_PREFIXES = ("cuda.", "rocm.")


def needs_gpu(labels: dict) -> bool:
    """Whether an image is a GPU image: it names accelerators (Backend.AI's
    ``ai.backend.accelerators``, e.g. ``cuda``) or a minimum of a GPU slot above zero."""
    if str(labels.get("ai.backend.accelerators") or "").strip():
        return True
    for slot, amount in min_slots(labels).items():
        if slot.startswith(GPU_SLOT_PREFIXES):
            try:
                if float(amount) > 0:
                    return True
            except ValueError:
                continue
    return False


def _image_body(img: Image, aliases: list[str]) -> dict:
    return responses.Image.body({
        "name": img.name, "source": img.source, "repo": img.repo, "tag": img.tag,
        "digest": img.digest, "architecture": img.architecture, "size_bytes": img.size_bytes,
        "labels": img.labels or {}, "aliases": sorted(aliases),
        "description": img.description, "hidden": img.hidden, "is_default": img.is_default,
        "pull_policy": img.pull_policy, "min_slots": min_slots(img.labels or {}),
        "scanned_at": img.scanned_at, "owner_id": img.owner_id,
    })


def _visible_to(q, p: Principal | None, user_id: str | None = None):
    """Only the installation's images and the caller's own committed ones (superadmins:
    every one); ``user_id``: for a caller known by id only (the spawner's user)."""
    if p is not None and p.is_superadmin:
        return q
    me = p.user_id if p is not None else user_id
    return q.where(or_(Image.owner_id.is_(None), Image.owner_id == me))


# -- the catalogue ----------------------------------------------------------------------


def _aliases(db) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in db.scalars(select(ImageAlias)):
        out.setdefault(a.image, []).append(a.alias)
    return out


@reads
def list_catalogue(db, p: Principal | None, include_hidden: bool = False,
                   username: str | None = None) -> list[dict]:
    """The catalogue, the default first, then by name. Hidden images only for admins who
    ask (``include_hidden``); committed images only for their owner (``p``, or the user
    ``username`` where there is no principal) and superadmins."""
    if include_hidden and p is not None:
        access.require(p.is_superadmin or p.is_domain_admin, "see hidden images")
    user_id = (db.scalar(select(User.id).where(User.username == username))
               if p is None and username else None)
    q = _visible_to(select(Image), p, user_id)
    if not include_hidden:
        q = q.where(Image.hidden.is_(False))
    aliases = _aliases(db)
    rows = sorted(db.scalars(q), key=lambda i: (not i.is_default, i.name))
    return [_image_body(i, aliases.get(i.name, [])) for i in rows]


@reads
def catalogue_index(db) -> dict[str, dict]:
    """Every catalogued name with whether it is hidden and whose it is (the spawner's
    filter of what the agents hold)."""
    return {n: {"hidden": h, "owner_id": o}
            for n, h, o in db.execute(select(Image.name, Image.hidden, Image.owner_id))}


@reads
def list_images_page(db, p: Principal, filters: dict, offset: int, limit: int) -> dict:
    """The admin API's page of the catalogue (``hidden``: admins only; ``source``)."""
    admin = p.is_superadmin or p.is_domain_admin
    q = _visible_to(select(Image), p)
    if filters.get("hidden") is not None:
        access.require(admin or not filters["hidden"], "see hidden images")
        q = q.where(Image.hidden.is_(filters["hidden"]))
    elif not admin:
        q = q.where(Image.hidden.is_(False))
    if "source" in filters:
        q = q.where(Image.source == filters["source"])
    rows = list(db.scalars(q.order_by(Image.is_default.desc(), Image.name)))
    aliases = _aliases(db)
    items = [_image_body(i, aliases.get(i.name, [])) for i in rows[offset:offset + limit]]
    return {"items": items, "total": len(rows), "offset": offset, "limit": limit}


def _find(db, ref: str) -> Image | None:
    img = db.get(Image, ref)
    if img is None:
        a = db.get(ImageAlias, ref)
        if a is not None:
            img = db.get(Image, a.image)
    return img


@reads
def get_image(db, p: Principal, ref: str) -> dict:
    img = _find(db, ref)
    if img is None or (img.hidden and not (p.is_superadmin or p.is_domain_admin)) or (
            img.owner_id not in (None, p.user_id) and not p.is_superadmin):
        raise NotFound(f"no image {ref!r} in the catalogue")
    return _image_body(img, _aliases(db).get(img.name, []))


@reads
def resolve_image(db, ref: str) -> dict | None:
    """The catalogue's entry for ``ref`` (a name or an alias): its name, source, labels,
    hidden flag; None when not catalogued."""
    img = _find(db, ref)
    if img is None:
        return None
    return {"name": img.name, "source": img.source, "labels": dict(img.labels or {}),
            "hidden": img.hidden, "digest": img.digest, "architecture": img.architecture,
            "pull_policy": img.pull_policy, "owner_id": img.owner_id}


@reads
def image_refusal(db, ref: str, username: str) -> str | None:
    """Why user ``username`` may not start image ``ref`` (another user's committed
    image), in words; None when they may."""
    img = _find(db, ref)
    if img is None or img.owner_id is None:
        return None
    if db.scalar(select(User.id).where(User.username == username)) == img.owner_id:
        return None
    return f"image {ref!r} is another user's committed session: only its owner starts it"


@writes
def update_image(db, p: Principal, ref: str, body: dict) -> dict:
    """Hide or show, describe, mark the default (one at a time: the others lose it), set
    its pull policy (``registry``: its registry's again)."""
    access.require(p.is_superadmin, "change images")
    img = _find(db, ref)
    if img is None:
        raise NotFound(f"no image {ref!r} in the catalogue")
    if body.get("is_default") and (body.get("hidden") or (img.hidden and
                                                          body.get("hidden") is not False)):
        raise InvalidRequest("a hidden image cannot be the default")
    if body.get("hidden") and img.is_default and body.get("is_default") is not True:
        img.is_default = False
    if body.get("description") is not None:
        img.description = body["description"]
    pol = body.get("pull_policy")
    if pol is not None:
        if pol not in PULL_POLICIES + ("registry",):
            raise InvalidRequest(f"pull_policy: {pol!r} is not one of "
                                 f"{', '.join(PULL_POLICIES)}, registry")
        img.pull_policy = None if pol == "registry" else pol
    if body.get("hidden") is not None:
        img.hidden = body["hidden"]
    if body.get("is_default") is not None:
        if body["is_default"]:
            for other in db.scalars(select(Image).where(Image.is_default.is_(True))):
                other.is_default = False
        img.is_default = body["is_default"]
    db.flush()
    return _image_body(img, _aliases(db).get(img.name, []))


@writes
def alias_image(db, p: Principal, alias: str, ref: str) -> dict:
    access.require(p.is_superadmin, "alias images")
    if not alias or len(alias) > 256 or any(c.isspace() for c in alias):
        raise InvalidRequest(f"alias: {alias!r} is not an alias (no spaces, at most 256)")
    img = _find(db, ref)
    if img is None:
        raise NotFound(f"no image {ref!r} in the catalogue")
    if db.get(Image, alias) is not None:
        raise Conflict(f"{alias!r} is an image's name already")
    known = db.get(ImageAlias, alias)
    if known is not None:
        raise Conflict(f"alias {alias!r} names {known.image} already")
    db.add(ImageAlias(alias=alias, image=img.name))
    db.flush()
    return _image_body(img, _aliases(db).get(img.name, []))


@writes
def dealias_image(db, p: Principal, alias: str) -> None:
    access.require(p.is_superadmin, "remove image aliases")
    a = db.get(ImageAlias, alias)
    if a is None:
        raise NotFound(f"no image alias {alias!r}")
    db.delete(a)


@writes
def record_scan(db, source: str, found: list[dict]) -> dict:
    """Record what a rescan of ``source`` found (dicts: name, repo, tag, digest,
    architecture, size_bytes, labels); images of that source no longer found go (with
    their aliases). Admin choices (hidden, description, default) stay with a name.

    A name already catalogued from another source keeps it (the first wins), but for
    one: a registry's image that was catalogued as an agent's own (``local``: an engine
    held a copy before the registry was added) becomes the registry's. The registry is
    where an agent lacking it pulls it from; left ``local``, such an agent was told it
    is "not available" however often it was asked (found by the Swarm tests, whose
    second engine lacked what the first had pulled)."""
    if source != LOCAL and db.get(ContainerRegistry, source, with_for_update=True) is None:
        raise NotFound(f"container registry {source!r} was removed while it was rescanned")
    now = utcnow()
    known = {i.name: i for i in db.scalars(select(Image).where(Image.source == source))}
    added = updated = 0
    for f in found:
        img = known.pop(f["name"], None)
        if img is None:
            img = db.get(Image, f["name"])  # the same reference from another source?
            if img is None:
                img = Image(name=f["name"], source=source, description="", hidden=False,
                            is_default=False)
                db.add(img)
                added += 1
            elif source != LOCAL and img.source == LOCAL:
                img.source = source  # an agent's copy of this registry's image: now its
                updated += 1
            else:
                continue  # the first source wins
        elif img.digest != f.get("digest", "") or img.labels != f.get("labels", {}):
            updated += 1
        img.repo, img.tag = f["repo"], f["tag"]
        img.digest = f.get("digest", "")
        img.architecture = f.get("architecture") or "x86_64"
        img.size_bytes = int(f.get("size_bytes") or 0)
        img.labels = f.get("labels", {})
        img.scanned_at = now
    gone = list(known)
    if gone:
        db.execute(delete(ImageAlias).where(ImageAlias.image.in_(gone)))
        db.execute(delete(Image).where(Image.name.in_(gone)))
    if source != LOCAL:
        r = db.get(ContainerRegistry, source)
        if r is not None:
            r.last_scan = now
    return responses.ImageRescan.body({"registry": source, "found": len(found), "added": added,
                              "updated": updated, "removed": len(gone)})


@reads
def has_local_images(db) -> bool:
    """Whether any image of the agents' own (source ``local``) is catalogued."""
    return db.scalar(select(Image.name).where(Image.source == LOCAL).limit(1)) is not None


@writes
def settle_default(db, name: str) -> bool:
    """Make catalogued, visible ``name`` the default when no image is; whether it did."""
    if db.scalar(select(Image.name).where(Image.is_default.is_(True)).limit(1)) is not None:
        return False
    img = db.get(Image, name)
    if img is None or img.hidden or img.owner_id is not None:
        return False
    img.is_default = True
    return True


@reads
def default_image(db) -> str | None:
    return db.scalar(select(Image.name).where(Image.is_default.is_(True),
                                              Image.hidden.is_(False)))


# -- a session committed to an image (issue 27: ``session commit``) --------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")[:64] or "session"


@reads
def commit_plan(db, p: Principal, sid: str, name: str | None, registry: str | None) -> dict:
    """What committing session ``sid`` needs, checked: the caller may manage it, it runs,
    its main kernel is placed; the registry to push to (``registry``, the configured
    ``commit_registry``, else the registry the session's image came from), and the new
    image's reference ``<host>/<project>/<owner>/<name>:<UTC time>``."""
    s = db.get(Session, sid)
    if s is None or not access.can_see_session(p, s):
        raise NotFound(f"no session {sid}")
    owner = db.get(User, s.user_id)
    access.require(access.can_manage_session(p, s, owner), f"commit session {s.name!r}")
    if s.status != "RUNNING":
        raise Conflict(f"session {s.name!r} is {s.status}: only a running session is "
                       "committed to an image")
    k = db.scalar(select(Kernel).where(Kernel.session_id == sid, Kernel.cluster_role == "main"))
    if k is None or not k.agent_id:
        raise Conflict(f"session {s.name!r} has no placed main kernel")
    if registry is None:
        src = _find(db, s.image)
        registry = src.source if src is not None and src.source != LOCAL else None
    if registry is None:
        raise InvalidRequest(
            f"no registry to push session {s.name!r}'s image to: its image is no "
            "registry's, and c.BackendAIManager.commit_registry names none (docs/images.md)")
    reg = registry_secrets(db, registry)  # NotFound for an unknown one
    repo = "/".join(x for x in (reg["project"].strip("/"), _slug(owner.username),
                                _slug(name or s.name)) if x)
    tag = utcnow().strftime("%Y%m%d-%H%M%S")
    agent = db.get(Agent, k.agent_id)
    return {"session": s.name, "kernel_id": k.id, "agent_id": k.agent_id,
            "agent_addr": agent.addr if agent is not None else "", "registry": reg,
            "ref": f"{registry_host(reg['url'])}/{repo}:{tag}", "repo": repo, "tag": tag,
            "owner_id": owner.id, "owner": owner.username}


@writes
def record_commit(db, plan: dict, digest: str, labels: dict) -> dict:
    """The committed image in the catalogue, its owner's."""
    img = db.get(Image, plan["ref"]) or Image(name=plan["ref"], hidden=False,
                                              is_default=False)
    img.source, img.repo, img.tag = plan["registry"]["name"], plan["repo"], plan["tag"]
    img.digest, img.labels, img.owner_id = digest, labels, plan["owner_id"]
    img.description = f"session {plan['session']} of {plan['owner']}, committed"
    img.scanned_at = utcnow()
    db.merge(img)
    db.flush()
    return _image_body(db.get(Image, plan["ref"]), [])


async def commit_session(mgr, p: Principal, sid: str, name: str | None = None) -> dict:
    """Write session ``sid``'s main kernel to an image, push it to the registry
    (:func:`commit_plan`) and catalogue it for the session's owner; the catalogue's entry.
    Only a kernel on an agent with containers (Docker) can be committed."""
    plan = await mgr.ops.commit_plan(p, sid, name, mgr.commit_registry or None)
    client = mgr.agents.client(plan["agent_id"], plan["agent_addr"])
    done = await client.commit_kernel(plan["kernel_id"], plan["ref"],
                                      docker_auth(plan["registry"]))
    info = await client.image_info(plan["ref"])
    labels = dict((info or {}).get("labels") or {})
    labels["ai.backend.committed-from"] = sid
    return await mgr.ops.record_commit(plan, done.get("digest", ""), labels)


# -- the pull, at a session's start ---------------------------------------------------


def _note_pull(s, sid: str, info: str) -> bool:
    """Say a PREPARING session's pull progress in its status_info (no status change)."""
    from ..common.types import SessionStatus

    res = s.execute(update(Session).where(Session.id == sid,
                                          Session.status == SessionStatus.PREPARING)
                    .values(status_info=info))
    return bool(res.rowcount)


async def ensure_on_agents(mgr, sid: str, image: str, clients: dict) -> None:
    """Before a session's kernels are created: every agent of ``clients`` (id -> client)
    holds ``image``. A catalogued image of a registry is pulled where missing, with the
    registry's credentials and pull policy, its progress in the session's status_info
    ("pulling <image>: 42% (...)"); anything else is checked as before (image_info)."""
    from ..agent.backends.pull import describe

    entry = await mgr.ops.resolve_image(image)
    if entry is None or entry["source"] == LOCAL:
        await asyncio.gather(*(c.image_info(image) for c in clients.values()))
        return
    reg = await mgr.ops.registry_secrets(entry["source"])
    auth = docker_auth(reg)
    # Progress goes to the record at most every 0.2 s, by one writer in order; the last
    # one (100%) is written before the session moves on, never after its next step.
    state: dict = {"last": None, "writer": None, "pulled": False}
    wake = asyncio.Event()

    def on_progress(p: dict) -> None:
        state["last"] = describe(p)
        if state["writer"] is None or state["writer"].done():
            state["writer"] = asyncio.get_running_loop().create_task(flush())

    async def flush() -> None:
        while state["last"] is not None:
            info, state["last"] = state["last"], None
            if await mgr.db(_note_pull, sid, info):
                mgr.changed(sid)
            if not state["pulled"]:
                await wait_set(wake, 0.2)

    policy = entry.get("pull_policy") or reg["pull_policy"]
    # One agent: it makes the session's network while it pulls (not an overlay's).
    prepare = sid if len(clients) == 1 else None
    try:
        await asyncio.gather(*(c.pull_image(image, auth, policy, on_progress,
                                            session_id=prepare)
                               for c in clients.values()))
    finally:
        state["pulled"] = True
        wake.set()
    if state["writer"] is not None:
        try:
            await state["writer"]
        except Exception:  # the progress is a courtesy: never what fails a start
            log.warning("session %s: its pull's progress was not recorded", sid, exc_info=True)
    await asyncio.gather(*(c.image_info(image) for c in clients.values()))
