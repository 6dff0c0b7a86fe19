"""Backend.AI's image commands (issue 25): ``backend.ai admin image list / rescan / alias /
dealias`` of the 23.09 and 26.09 clients.

``images`` (GraphQL) lists the catalogue (manager/images.py): every caller sees the
visible images, superadmins the hidden ones too. ``rescan_images`` starts a rescan of a
registry (or of all, without one) as a background task of this hub and answers its
id; ``GET /events/background-task?task_id=`` streams its end as Backend.AI's
``bgtask_done`` / ``bgtask_failed`` events. The tasks live in this
hub's memory (a client asks the hub that started its task; an hour later it is
forgotten).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from tornado.iostream import StreamClosedError

from ...common.errors import BackendAIError, InvalidRequest, NotFound
from ...manager import images
from .base import CompatBase

TASK_TTL = 3600.0
# A background task's event stream ends no sooner than this after its headers (seconds):
# see BackgroundTaskEventsHandler.
_END_NO_SOONER = 0.3
# task id -> {"owner", "started", "task", "result"|"error"}
_TASKS: dict[str, dict] = {}


def image_item(i: dict) -> dict:
    host = i["name"][: -len(i["repo"]) - len(i["tag"]) - 2] if i["source"] != "local" else ""
    return {
        "id": i["name"], "name": i["repo"], "humanized_name": i["description"] or i["repo"],
        "namespace": i["repo"].rsplit("/", 1)[0] if "/" in i["repo"] else "",
        "base_image_name": i["repo"].rsplit("/", 1)[-1],
        "registry": host or i["source"], "architecture": i["architecture"], "tag": i["tag"],
        "digest": i["digest"], "size_bytes": float(i["size_bytes"]), "aliases": i["aliases"],
        "labels": [{"key": k, "value": str(v)} for k, v in sorted(i["labels"].items())],
        "hidden": i["hidden"], "is_default": i["is_default"],
        "description": i["description"], "installed": i["source"] == "local",
        "resource_limits": [{"key": k, "min": v, "max": None}
                            for k, v in sorted(i["min_slots"].items())],
    }


async def list_images(manager, p, is_installed=None) -> list[dict]:
    include_hidden = p.is_superadmin
    items = await manager.ops.list_catalogue(p, include_hidden)
    if is_installed is not None:
        items = [i for i in items if (i["source"] == "local") == is_installed]
    return [image_item(i) for i in items]


def _forget_old() -> None:
    now = time.monotonic()
    for tid in [t for t, v in _TASKS.items() if now - v["started"] > TASK_TTL]:
        _TASKS.pop(tid, None)


async def start_rescan(manager, p, registry: str | None) -> str:
    """Begin the rescan of ``registry`` (every configured one, and ``local``, when None)
    as a background task; its id."""
    if not p.is_superadmin:
        raise InvalidRequest("only superadmins rescan image registries")
    names = [registry] if registry else [
        r["name"] for r in await manager.registries.list(p)] + [images.LOCAL]
    if registry and registry != images.LOCAL:
        await manager.registries.get(p, registry)  # (unknown: a refusal now, not later)

    async def run(entry):
        for name in names:
            out = await manager.registries.rescan(p, name)
            entry["done"] += 1
            entry["messages"].append(
                f"{name}: {out['found']} images ({out['added']} new, {out['updated']} changed, "
                f"{out['removed']} gone)")
        return entry["messages"]

    return start_task(p, run, len(names))


def start_task(p, run, total: int = 1) -> str:
    """``run(entry)`` as a background task of this hub, owned by ``p``; its id (what
    ``GET /events/background-task`` follows). ``run`` appends its words to
    ``entry["messages"]``."""
    _forget_old()
    tid = str(uuid.uuid4())
    entry = {"owner": p.user_id, "started": time.monotonic(), "total": total,
             "done": 0, "messages": []}
    entry["task"] = asyncio.get_running_loop().create_task(run(entry))
    entry["task"].add_done_callback(lambda t: t.cancelled() or t.exception())
    _TASKS[tid] = entry
    return tid


class SessionCommitHandler(CompatBase):
    """Issue 27: ``POST /session/{ref}/commit`` (both clients' ``session commit``) and
    ``POST /session/{ref}/imagify?image_name=`` (26.09's ``session convert-to-image``):
    the running session written to an image in a registry and catalogued for its owner
    (manager/images.py ``commit_session``), as a background task whose id is answered
    (``task_id``); what would refuse it (not yours, not running, no registry) is refused
    at once, in words."""

    async def post(self, ref):
        name = self.get_query_argument("image_name", None)
        if name is not None and not 1 <= len(name.strip()) <= 64:
            raise InvalidRequest("image_name: 1 to 64 characters")
        mgr, p = self.manager, self.principal
        sid = await mgr.ops.resolve_session(p, ref)
        plan = await mgr.ops.commit_plan(p, sid, name, mgr.commit_registry or None)

        async def run(entry):
            img = await images.commit_session(mgr, p, sid, name)
            entry["done"] = 1
            entry["messages"].append(f"session {plan['session']} committed as {img['name']}")
            return entry["messages"]

        tid = start_task(p, run)
        self.reply({"task_id": tid, "bgtask_id": tid})


class BackgroundTaskEventsHandler(CompatBase):
    """``GET /events/background-task?task_id=``: the task's progress, then its end."""

    async def get(self):
        tid = self.get_query_argument("task_id", None)
        if not tid:
            raise InvalidRequest("task_id: which background task")
        entry = _TASKS.get(tid)
        if entry is None or entry["owner"] != self.principal.user_id:
            raise NotFound(f"no background task {tid} on this hub")
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        task: asyncio.Task = entry["task"]
        # Only the end is sent: both clients' progress bar (on bgtask_updated) fails
        # without a terminal, and a registry's rescan takes seconds.
        loop = asyncio.get_running_loop()
        opened = loop.time()
        while True:
            self.write(": waiting\n\n")  # (an SSE comment: keeps the connection open)
            try:
                await self.flush()
            except StreamClosedError:
                return
            if task.done():
                break
            await asyncio.wait({task}, timeout=5)
        # The 23.09 CLI starts a spinner task on the stream's headers and cancels it at the
        # stream's end; when the end came in the same read as the headers (a task that had
        # ended before the client listened), the spinner was cancelled before it ever ran
        # and `admin image rescan` died of its CancelledError. The end comes no sooner than
        # one turn of the spinner (0.3 s) after the headers.
        await asyncio.sleep(max(0.0, opened + _END_NO_SOONER - loop.time()))
        err = task.exception() if not task.cancelled() else None
        if err is None:
            data = {"task_id": tid, "message": "; ".join(entry["messages"]) or "done"}
            self.write(f"event: bgtask_done\ndata: {json.dumps(data)}\n\n")
        else:
            words = err.detail if isinstance(err, BackendAIError) else \
                f"{type(err).__name__}: {err}"
            data = {"task_id": tid, "message": words}
            self.write(f"event: bgtask_failed\ndata: {json.dumps(data)}\n\n")
        # The end of the stream (the clients reconnect to a stream closed without it).
        self.write("event: server_close\ndata: {}\n\n")
        self.finish()
