"""Fixtures: real services (PostgreSQL, Redis, etcd, Docker, CHP), databases, hubs.

Every test that takes ``db_url`` runs twice: on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from jupyterhub_backendai.models.db import make_engine, make_sessionmaker, upgrade

from .hub import Hub
from .services import Etcd, Postgres, Redis

# Tests run as root here and keep hubs, agents and volumes in private temporary
# directories (0700) that an unprivileged kernel user cannot enter: local-backend
# kernels keep running as root in them (the agent logs UNSAFE). The tests of the
# safe default (kernels as uid 1000) turn this off for their own hubs
# (tests/test_attacks_agent.py).
os.environ.setdefault("BACKENDAI_UNSAFE_LOCAL_KERNELS_AS_ROOT", "1")


@pytest.fixture(scope="session")
def postgres():
    pg = Postgres()
    yield pg
    pg.stop()


@pytest.fixture(scope="session")
def redis_server():
    r = Redis()
    yield r
    r.stop()


@pytest.fixture(scope="session")
def etcd_server():
    e = Etcd()
    yield e
    e.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/backendai.sqlite"
    pg = request.getfixturevalue("postgres")
    return pg.new_database("t_" + uuid.uuid4().hex[:12])


@pytest.fixture
def sm(db_url):
    """A migrated, empty database with the default rows."""
    from jupyterhub_backendai.manager import tenancy

    engine = make_engine(db_url)
    upgrade(engine)
    maker = make_sessionmaker(engine)
    with maker.begin() as s:
        tenancy.ensure_defaults(s)
    yield maker
    engine.dispose()


def docker_available() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True
    ).returncode == 0


@pytest.fixture(scope="session")
def docker_image():
    """The kernel image, built by images/build.sh (scripts/test runs it first)."""
    if not docker_available():
        pytest.fail("Docker engine not running (scripts/test starts it)")
    from .hub import KERNEL_IMAGE

    r = subprocess.run(["docker", "image", "inspect", KERNEL_IMAGE], capture_output=True)
    if r.returncode != 0:
        pytest.fail(f"kernel image {KERNEL_IMAGE} missing: run images/build.sh")
    return KERNEL_IMAGE


def containers_of(agent_id: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=ai.backend.agent-id={agent_id}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    return out


def shutdown_hub(hub: Hub) -> None:
    """Stop every server of a test hub, then the hub; remove what its agent left behind
    (containers, session networks) and its directory."""
    from .inproc import remove_session_networks

    try:
        for u in hub.api("GET", "/users").json():
            for name in list(u.get("servers", {})):
                hub.stop_server(u["name"], name)
    except Exception:
        pass  # the hub may already be gone; the clean-up below still runs
    hub.close()
    left = containers_of(hub.agent_id)
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
    remove_session_networks(hub.agent_id)
    shutil.rmtree(hub.dir, ignore_errors=True)


@pytest.fixture
def make_hub(request):
    hubs: list[Hub] = []

    def make(**kw) -> Hub:
        hub = Hub(**kw).start()
        hubs.append(hub)
        return hub

    yield make
    for hub in hubs:
        if hub.proc and hub.proc.poll() is None:
            # Stop what the test left running, through the product.
            try:
                users = hub.api("GET", "/users").json()
                for u in users:
                    for name in list(u.get("servers", {})):
                        hub.stop_server(u["name"], name)
            except Exception:
                pass
        hub.close()
        if hub.backend == "docker":
            left = containers_of(hub.agent_id)
            if left:
                subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
            from .inproc import remove_session_networks

            remove_session_networks(hub.agent_id)
        else:
            state = os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels")
            _kill_local_kernels(state)
        shutil.rmtree(hub.dir, ignore_errors=True)


def _kill_local_kernels(state_dir: str) -> None:
    import json
    import signal

    if not os.path.isdir(state_dir):
        return
    for fn in os.listdir(state_dir):
        if fn.endswith(".json"):
            try:
                with open(os.path.join(state_dir, fn)) as f:
                    os.killpg(int(json.load(f)["container_id"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass


@pytest.fixture(params=["docker", "local"])
def backend(request):
    if request.param == "docker":
        request.getfixturevalue("docker_image")
    return request.param
