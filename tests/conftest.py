"""Fixtures: real services (PostgreSQL, Redis, etcd, Docker, CHP), databases, hubs.

Every test that takes ``db_url`` runs twice: on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
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
    _balance.on = _controller(config)
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
    if _balance.on:  # the controller (a worker's report is also the controller's)
        _balance.add(report)


def pytest_report_header(config):
    n = getattr(config.option, "numprocesses", None)
    return f"workers: {n or 0} (0: serial); run token {RUN}"


# -- parallel runs (pytest-xdist, scripts/test) ---------------------------------------------
#
# A module's tests stay on one worker, so that its module fixtures (hubs, servers, clients)
# start once; except the modules in SPREAD, whose tests share no fixture above function
# scope: each of their tests goes to whichever worker is free. Work goes out by weight,
# heaviest first (tests/weights.json: seconds per module, the table of 2026-11-27, less
# the SPREAD modules); a unit the file does not name goes first, and that includes every
# test of a SPREAD module (the file names modules, and those units are tests). That order ran the whole suite in
# 33-34 min (runs C and E, 2026-11-29). The strict longest-first order by the units'
# measured seconds (`BACKENDAI_TEST_WEIGHTS_OUT=<file> bash scripts/test` writes them;
# that file put in place of this one) took 46 min on the same machine (run D): the
# heaviest end-to-end modules all at once at the start, the CPU-bound ones after them
# 2-6x slower (docs/benchmarks.md, "Test suite").
SPREAD = {"test_faults", "test_lifecycle", "test_mounts", "test_quota_e2e", "test_binder",
          "test_api_schema", "test_auth", "test_multikernel", "test_batch", "test_lifetime",
          "test_e2e", "test_session_tokens", "test_reflector"}
WEIGHTS_FILE = os.path.join(os.path.dirname(__file__), "weights.json")


def _module(nodeid: str) -> str:
    return os.path.basename(nodeid.split("::", 1)[0])[:-3]


def _unit(nodeid: str) -> str:
    """The unit xdist hands to one worker: the module, or the test for SPREAD modules."""
    module = _module(nodeid)
    return nodeid if module in SPREAD else module


def _weights() -> dict[str, float]:
    try:
        with open(WEIGHTS_FILE) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def pytest_collection_modifyitems(config, items):
    """Heaviest units first (a stable sort: the order within a module is kept)."""
    weights = _weights()
    unknown = max(weights.values(), default=0) + 1
    items.sort(key=lambda item: -weights.get(_unit(item.nodeid), unknown))


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if _module(nodeid) in SPREAD else super()._split_scope(nodeid)

    if config.getvalue("dist") != "loadscope":
        return None
    config.option.loadscopereorder = False  # the order above, not by number of tests
    return Scheduling(config, log)


class _Balance:
    """What each unit and each worker took in this run (the controller's view: every
    setup, call and teardown a worker reported), said at the end of the run and, with
    BACKENDAI_TEST_WEIGHTS_OUT, written to that file (to compare an order with; the
    order kept is tests/weights.json's, see above)."""

    def __init__(self) -> None:
        self.on = False
        self.units: dict[str, float] = {}
        self.workers: dict[str, float] = {}

    def add(self, report) -> None:
        unit = _unit(report.nodeid)
        self.units[unit] = self.units.get(unit, 0.0) + report.duration
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else "main"
        self.workers[worker] = self.workers.get(worker, 0.0) + report.duration

    def summary(self, tr) -> None:
        if not self.units:
            return
        tr.write_sep("=", "heaviest units (each on one worker) and each worker's busy time")
        for unit, secs in sorted(self.units.items(), key=lambda kv: -kv[1])[:15]:
            tr.write_line(f"{secs:8.1f}s {unit}")
        tr.write_line("busy: " + ", ".join(f"{w} {s / 60:.1f} min"
                                           for w, s in sorted(self.workers.items())))
        out = os.environ.get("BACKENDAI_TEST_WEIGHTS_OUT")
        if out:
            with open(out, "w") as f:
                json.dump({u: round(s, 1) for u, s in sorted(self.units.items())}, f, indent=0)
                f.write("\n")
            tr.write_line(f"weights written to {out}")


_balance = _Balance()


def pytest_terminal_summary(terminalreporter):
    _balance.summary(terminalreporter)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Fails the run on an engine object of this run still there at the end."""
    if not _controller(session.config):
        return
    from . import engine_check

    engine_check.remove_agent_network()
    engine_check.remove_free_port_claims()
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
