"""Agents pull the images they lack (issue 25).

One :class:`Puller` per agent. :meth:`Puller.ensure` makes an image present on the
agent's engine: present already (and the policy does not ask for a newer digest):
nothing to do; else one pull through aiodocker with the registry's credentials, shared
by every session of this agent that asks for the same image while it runs. Progress
(bytes and percent, summed over the layers from the engine's pull stream) goes to
every waiter's callback. A failed pull raises, with the registry's reason in plain
words, :class:`ImageNotInRegistry` (the tag or repository does not exist) or
:class:`PullRefused` (refused credentials, an untrusted certificate): answers that come
again, so the session's start is not retried; or :class:`AgentError` (an unreachable
registry, anything else): retried like any failed start. The engine keeps no image.

Pull policies (Backend.AI's ``auto_pull``): ``tag`` pulls when the reference is
missing; ``digest`` pulls every time (the engine fetches only what changed, so a newer
digest under the same tag arrives); ``none`` never pulls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiodocker.exceptions import DockerError

from ...common.errors import (
    AgentError,
    ImageNotFound,
    ImageNotInRegistry,
    InvalidRequest,
    PullRefused,
)

log = logging.getLogger(__name__)

POLICIES = ("digest", "tag", "none")
Progress = Callable[[dict], None]


@dataclass
class _Pull:
    ref: str
    listeners: list[Progress] = field(default_factory=list)
    layers: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (current, total)
    done_layers: set[str] = field(default_factory=set)
    last: dict | None = None
    task: asyncio.Task | None = None

    def progress(self) -> dict:
        current = sum(c for c, _ in self.layers.values())
        total = sum(t for _, t in self.layers.values())
        pct = int(current * 100 / total) if total else 0
        return {"image": self.ref, "current": current, "total": total, "percent": pct,
                "layers": len(self.layers | dict.fromkeys(self.done_layers, (0, 0))),
                "layers_done": len(self.done_layers)}

    def feed(self, ev: dict) -> bool:
        """Take one event of the pull stream; True when the figures moved."""
        lid, status = ev.get("id"), ev.get("status") or ""
        if not lid:
            return False
        detail = ev.get("progressDetail") or {}
        if status == "Downloading" and detail.get("total"):
            self.layers[lid] = (int(detail.get("current") or 0), int(detail["total"]))
            return True
        if status in ("Download complete", "Pull complete", "Already exists"):
            if lid in self.layers:
                _, total = self.layers[lid]
                self.layers[lid] = (total, total)
            self.done_layers.add(lid)
            return True
        return False

    def tell(self) -> None:
        self.last = self.progress()
        for fn in list(self.listeners):
            try:
                fn(self.last)
            except Exception:  # a waiter's callback never breaks the pull
                log.exception("pull progress callback failed")


def plain_reason(ref: str, message: str) -> tuple[type, str]:
    """The exception class and the words for a pull of ``ref`` the engine refused: the
    registry's refusals that would come again are :class:`PullRefused` (not retried)."""
    m = " ".join(str(message).split())
    low = m.lower()
    if "unauthorized" in low or "authentication required" in low or "no basic auth" in low \
            or "denied" in low:
        return PullRefused, (f"the registry refused the credentials for {ref} ({m}): check the "
                            "registry's username and password")
    if "manifest unknown" in low or "not found" in low or "name unknown" in low:
        return ImageNotInRegistry, f"image {ref} does not exist in its registry ({m})"
    if "certificate" in low or "x509" in low:
        return PullRefused, f"the engine does not trust the registry of {ref} ({m})"
    return AgentError, f"pulling {ref} failed: {m}"


class Puller:
    """The pulls of one agent (``agent.impl.docker``: its aiodocker client)."""

    def __init__(self, agent) -> None:
        self.agent = agent
        self._pulls: dict[str, _Pull] = {}
        self.pulls_started = 0  # how many engine pulls this agent began (shared ones once)

    def _docker(self):
        docker = getattr(self.agent.impl, "docker", None)
        if docker is None:
            raise InvalidRequest(f"agent {self.agent.agent_id} runs kernels as local processes "
                                 "and pulls no images")
        return docker

    async def present(self, ref: str) -> bool:
        try:
            await self._docker().images.inspect(ref)
            return True
        except DockerError as e:
            if e.status == 404:
                return False
            raise AgentError(f"docker could not inspect image {ref!r}: {e.message}") from None

    async def ensure(self, ref: str, auth: dict | None = None, policy: str = "tag",
                     on_progress: Progress | None = None) -> bool:
        """Make ``ref`` present; True when this call waited on a pull."""
        if policy not in POLICIES:
            raise InvalidRequest(f"pull policy {policy!r} is not one of {', '.join(POLICIES)}")
        if getattr(self.agent.impl, "docker", None) is None:
            return False  # the local backend: its one image is always there
        pull = self._pulls.get(ref)
        if pull is None:
            if policy != "digest" and await self.present(ref):
                return False
            if policy == "none":
                raise ImageNotFound(f"image {ref} is not on agent {self.agent.agent_id} and its "
                                    "pull policy is 'none'")
            pull = self._pulls.get(ref)  # another waiter may have begun it meanwhile
        if pull is None:
            pull = self._pulls[ref] = _Pull(ref)
            self.pulls_started += 1
            pull.task = asyncio.create_task(self._run(pull, auth))
            pull.task.add_done_callback(lambda _t, p=pull: self._forget(p))
        if on_progress is not None:
            pull.listeners.append(on_progress)
            if pull.last is not None:
                on_progress(pull.last)
        try:
            await asyncio.shield(pull.task)
        finally:
            if on_progress is not None and on_progress in pull.listeners:
                pull.listeners.remove(on_progress)
        return True

    def _forget(self, pull: _Pull) -> None:
        if self._pulls.get(pull.ref) is pull:
            del self._pulls[pull.ref]
        if pull.task is not None and not pull.task.cancelled():
            pull.task.exception()  # retrieved: the waiters raise it

    async def _run(self, pull: _Pull, auth: dict | None) -> None:
        docker = self._docker()
        started = time.monotonic()
        last_tell = 0.0
        try:
            async for ev in docker.images.pull(pull.ref, auth=auth, stream=True):
                if ev.get("error"):
                    cls, words = plain_reason(pull.ref, ev.get("error"))
                    raise cls(words)
                if pull.feed(ev):
                    now = time.monotonic()
                    if now - last_tell >= 0.25:
                        last_tell = now
                        pull.tell()
        except DockerError as e:
            cls, words = plain_reason(pull.ref, e.message)
            raise cls(words) from None
        if not await self.present(pull.ref):
            raise AgentError(f"pulling {pull.ref} ended without the image on the engine")
        if pull.layers:
            pull.layers = {k: (t, t) for k, (_, t) in pull.layers.items()}
        pull.tell()
        log.info("pulled %s in %.1f s", pull.ref, time.monotonic() - started)


def describe(p: dict) -> str:
    """``pulling <image>: 42% (12.3 of 29.1 MiB, 2 of 5 layers)``."""
    mib = 1024 * 1024
    if not p.get("total"):
        return f"pulling {p['image']}"
    return (f"pulling {p['image']}: {p['percent']}% ({p['current'] / mib:.1f} of "
            f"{p['total'] / mib:.1f} MiB, {p['layers_done']} of {p['layers']} layers)")
