"""The run ends by holding the Docker engine against what it held at the start.

Every engine object the suite makes carries this run's token (``services.RUN``): agent ids
(containers and session networks are labelled with theirs), installation ids (label
``ai.backend.installation``: ``services.INSTALLATION_PREFIX`` starts every test hub's), image tags
(``services.image_tag``). What is still there at the end with the token is a leftover of
this run, and fails it; objects another suite on the same engine made meanwhile are not
this run's and are left alone (reported only). Called once, by the xdist controller (or
the single process of a serial run), after every worker has finished.
"""

from __future__ import annotations

import glob
import shutil
import subprocess

from .services import AGENT_NETWORK, RUN

# (kind, docker command, format): one line per object, the id first.
_LISTS = (
    ("container", ["ps", "-a"], '{{.ID}}\t{{.Names}}\t{{.Image}}\t{{.Label "ai.backend.agent-id"}}'
     '\t{{.Label "ai.backend.installation"}}'),
    ("network", ["network", "ls"], '{{.ID}}\t{{.Name}}\t{{.Label "ai.backend.agent-id"}}'
     '\t{{.Label "ai.backend.installation"}}'),
    ("volume", ["volume", "ls"], '{{.Name}}\t{{.Label "ai.backend.agent-id"}}'
     '\t{{.Label "ai.backend.installation"}}'),
    ("image", ["images", "-a"], "{{.ID}}\t{{.Repository}}:{{.Tag}}"),
)


def snapshot() -> dict[str, str] | None:
    """``"<kind> <id>" -> description`` of everything on the engine; None without one."""
    if shutil.which("docker") is None:
        return None
    objects: dict[str, str] = {}
    for kind, cmd, fmt in _LISTS:
        r = subprocess.run(["docker", *cmd, "--format", fmt], capture_output=True, text=True,
                           timeout=60)
        if r.returncode != 0:
            return None
        for line in r.stdout.splitlines():
            if line.strip():
                oid, _, desc = line.partition("\t")
                objects[f"{kind} {oid}"] = desc.replace("\t", " ")
    return objects


def leftovers(before: dict[str, str] | None) -> tuple[list[str], list[str]]:
    """(this run's objects still on the engine, other objects that appeared meanwhile)."""
    after = snapshot()
    if after is None:
        return [], []
    ours = sorted(f"{k} {d}" for k, d in after.items() if RUN in d)
    others = sorted(f"{k} {d}" for k, d in after.items()
                    if before is not None and k not in before and RUN not in d)
    return ours, others


def remove_free_port_claims() -> None:
    """Removes the host claim files (agent/hostclaims.py: ports and GPUs) nobody holds:
    those the agents of hubs a test killed left (a killed agent's lock ends with it, its
    file stays), each taken and given back as an agent would. A claim another suite's
    agent holds now cannot be taken and is left alone."""
    from jupyterhub_backendai.agent.hostclaims import HostClaims

    for kind in ("port", "gpu"):
        claims = HostClaims(kind)
        head, tail = claims.path("*").split("*")
        for path in glob.glob(claims.path("*")):
            key = path[len(head):len(path) - len(tail)]
            if key and claims.take(key):
                claims.give_back(key)


def remove_agent_network() -> None:
    """Removes this run's agent network (services.AGENT_NETWORK), which every agent of the
    run shared and none removes (as an installation's agents leave theirs): once every
    worker has finished, nothing of this run is on it. Called before :func:`leftovers`,
    which reports it if it is still there."""
    if shutil.which("docker") is not None:
        subprocess.run(["docker", "network", "rm", AGENT_NETWORK], capture_output=True,
                       timeout=60)
