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
from .services import RUN, Etcd, Postgres, Redis

# Tests run as root here and keep hubs, agents and volumes in private temporary
# directories (0700) that an unprivileged kernel user cannot enter: local-backend
# kernels keep running as root in them (the agent logs UNSAFE). The tests of the
# safe default (kernels as uid 1000) turn this off for their own hubs
# (tests/test_attacks_agent.py).
os.environ.setdefault("BACKENDAI_UNSAFE_LOCAL_KERNELS_AS_ROOT", "1")


def _controller(config) -> bool:
    """The xdist controller, or the one process of a serial run (not a worker)."""
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    if _controller(config):
        from . import engine_check

        config._engine_before = engine_check.snapshot()


def pytest_runtest_logreport(report):
    """A failure is named in the log when it happens, not only in the summary at the
    end: a run stopped before its end (CI's limit, a person's ^C) still says what
    failed, and a long run can be read while it goes."""
    if report.failed and not hasattr(report, "_named_at_once"):
        report._named_at_once = True
        import sys

        sys.stdout.write(f"\n[failed] {report.nodeid} ({report.when})\n")
        sys.stdout.flush()


def pytest_report_header(config):
    n = getattr(config.option, "numprocesses", None)
    return f"workers: {n or 0} (0: serial); run token {RUN}"


# -- parallel runs (pytest-xdist, scripts/test) ---------------------------------------------
#
# A module's tests stay on one worker, so that its module fixtures (hubs, servers, clients)
# start once; except the modules in SPREAD, whose tests share no fixture above function
# scope: each of their tests goes to whichever worker is free. Work goes out heaviest
# first (WEIGHT), so that no long module starts last and holds the run up alone.
# WEIGHT: seconds each module took in a parallel run (scripts/test, 4 workers, 2 cores,
# 2026-11-27); a module not listed goes after these, in collection order.
WEIGHT = {
    "test_faults": 493, "test_backendai_client": 304, "test_service_ports": 201,
    "test_lifecycle": 184, "test_mounts": 135, "test_quota_e2e": 112, "test_binder": 99,
    "test_api_schema": 97, "test_soak": 89, "test_cli": 83, "test_auth": 81,
    "test_multikernel": 80, "test_api_isolation": 77, "test_install": 77, "test_fixtures": 75,
    "test_batch": 75, "test_lifetime": 73, "test_multinode_swarm": 70, "test_attack_monitor": 69,
    "test_e2e": 68, "test_ssh_port": 67, "test_vfolders_api": 66, "test_spawn_ux": 64,
    "test_home": 63, "test_attack_browser": 62,
    # measured alone (-n 0) when they were written
    "test_hub_host": 100, "test_execute_stream": 200, "test_attacks_agent": 120,
    "test_client_address": 110, "test_ssh_revoke": 90, "test_tus": 150,
    "test_session_tokens": 35, "test_reflector": 15,
    "test_kernel_bounds": 60, "test_bus_outage": 25, "test_bus_auth": 10, "test_btrfs": 35,
    "test_backendai_client_more": 235, "test_browser_rough": 45,
    "test_resource_presets": 25, "test_usage": 60, "test_images": 150, "test_images_cli": 30,
    "test_browser_sessions": 200, "test_browser_folders": 45, "test_browser_groups": 60,
    "test_warm_pool": 180, "test_usage_sampled": 50, "test_vfolders_limit": 40,
    "test_backendai_client_apps": 150, "test_backendai_client_templates": 180,
    "test_backendai_client_ssh": 150, "test_dotfiles_local": 25,
}
SPREAD = {"test_faults", "test_lifecycle", "test_mounts", "test_quota_e2e", "test_binder",
          "test_api_schema", "test_auth", "test_multikernel", "test_batch", "test_lifetime",
          "test_e2e", "test_session_tokens", "test_reflector"}


def _module(nodeid: str) -> str:
    return os.path.basename(nodeid.split("::", 1)[0])[:-3]


def pytest_collection_modifyitems(config, items):
    """Heaviest modules first (a stable sort: the order within a module is kept)."""
    items.sort(key=lambda item: -WEIGHT.get(_module(item.nodeid), 0))


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if _module(nodeid) in SPREAD else super()._split_scope(nodeid)

    if config.getvalue("dist") != "loadscope":
        return None
    config.option.loadscopereorder = False  # the order above, not by number of tests
    return Scheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Fails the run on an engine object of this run still there at the end."""
    if not _controller(session.config):
        return
    from . import engine_check

    engine_check.remove_agent_network()
    ours, others = engine_check.leftovers(getattr(session.config, "_engine_before", None))
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if others and tr:
        tr.write_line(f"engine: {len(others)} object(s) made meanwhile by others (not this "
                      f"run's, left alone): " + "; ".join(others[:10]))
    if ours:
        if tr:
            tr.write_line(f"engine: {len(ours)} object(s) of this run left behind:", red=True)
            for o in ours:
                tr.write_line("  " + o, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test says why in CI: the tail of each hub it made goes with its report."""
    outcome = yield
    rep = outcome.get_result()
    if call.when == "call" and rep.failed:
        from .hub import LIVE

        for hub in LIVE[-3:]:
            try:
                rep.sections.append((f"hub log {hub.dir}", hub.log()[-6000:]))
            except OSError:
                pass


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
